//! The API's error type and the one table that maps it to status and code.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Serialize, Serializer};
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::RefOr;
use utoipa::ToSchema;

use crate::store::StoreError;

/// Every error a client can see. Messages say what to fix; internals stay in
/// the log.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("the X-API-Key header is missing: send your API key in it")]
    MissingApiKey,
    #[error("the API key is not valid: it is unknown, malformed or revoked")]
    InvalidApiKey,
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    RequestTimeout(String),
    #[error("{0}")]
    InvalidImage(String),
    #[error("rate limit exceeded: retry after {} s", retry_after_secs(*.retry_after))]
    RateLimited { retry_after: Duration },
    #[error("the service is temporarily unavailable; retry shortly")]
    ServiceUnavailable(String),
    /// 503 whose message is safe to show and says what to change.
    #[error("{0}")]
    Overloaded(String),
    #[error("an internal error occurred; it has been logged")]
    Internal(String),
    #[error("no such endpoint: {0}")]
    NotFound(String),
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
}

/// Whole seconds a client should wait, at least one.
pub fn retry_after_secs(wait: Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

/// The error table: every code a client can see, with its status. One
/// macro writes the enum, the list of all codes (which the OpenAPI document
/// offers as the `code` enum) and both mappings, so none can be forgotten.
macro_rules! error_codes {
    ($($variant:ident => $status:ident, $code:literal;)*) => {
        /// The machine-readable `error.code` of a response.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($variant,)*
        }

        impl ErrorCode {
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            pub const fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $code,)*
                }
            }

            pub const fn status(self) -> StatusCode {
                match self {
                    $(ErrorCode::$variant => StatusCode::$status,)*
                }
            }
        }
    };
}

error_codes! {
    MissingApiKey => UNAUTHORIZED, "missing_api_key";
    InvalidApiKey => UNAUTHORIZED, "invalid_api_key";
    InvalidRequest => BAD_REQUEST, "invalid_request";
    InvalidImage => BAD_REQUEST, "invalid_image";
    UnsupportedMediaType => UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type";
    PayloadTooLarge => PAYLOAD_TOO_LARGE, "payload_too_large";
    RequestTimeout => REQUEST_TIMEOUT, "request_timeout";
    RateLimited => TOO_MANY_REQUESTS, "rate_limit_exceeded";
    ServiceUnavailable => SERVICE_UNAVAILABLE, "service_unavailable";
    Internal => INTERNAL_SERVER_ERROR, "internal_error";
    NotFound => NOT_FOUND, "not_found";
    MethodNotAllowed => METHOD_NOT_ALLOWED, "method_not_allowed";
}

impl ErrorCode {
    /// Codes whose responses carry `Retry-After`.
    pub const fn has_retry_after(self) -> bool {
        matches!(self, ErrorCode::RateLimited | ErrorCode::ServiceUnavailable)
    }
}

/// The body of every error response: `{"error":{"code","message"}}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorObject,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorObject {
    pub code: ErrorCode,
    /// What to fix, naming the offending field (e.g. `input[3].base64`).
    pub message: String,
}

impl Serialize for ErrorCode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// Written from the table, so that the document lists exactly the codes sent.
impl utoipa::PartialSchema for ErrorCode {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(ErrorCode::ALL.iter().map(|c| c.as_str())))
            .description(Some(
                "Machine-readable; see the response's description for the codes of each status.",
            ))
            .build()
            .into()
    }
}

impl ToSchema for ErrorCode {
    fn name() -> std::borrow::Cow<'static, str> {
        "ErrorCode".into()
    }
}

impl ApiError {
    pub fn code(&self) -> ErrorCode {
        match self {
            ApiError::MissingApiKey => ErrorCode::MissingApiKey,
            ApiError::InvalidApiKey => ErrorCode::InvalidApiKey,
            ApiError::InvalidRequest(_) => ErrorCode::InvalidRequest,
            ApiError::UnsupportedMediaType(_) => ErrorCode::UnsupportedMediaType,
            ApiError::PayloadTooLarge(_) => ErrorCode::PayloadTooLarge,
            ApiError::RequestTimeout(_) => ErrorCode::RequestTimeout,
            ApiError::InvalidImage(_) => ErrorCode::InvalidImage,
            ApiError::RateLimited { .. } => ErrorCode::RateLimited,
            ApiError::ServiceUnavailable(_) | ApiError::Overloaded(_) => {
                ErrorCode::ServiceUnavailable
            }
            ApiError::Internal(_) => ErrorCode::Internal,
            ApiError::NotFound(_) => ErrorCode::NotFound,
            ApiError::MethodNotAllowed { .. } => ErrorCode::MethodNotAllowed,
        }
    }

    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        let code = self.code();
        (code.status(), code.as_str())
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> ApiError {
        match error {
            StoreError::Unavailable(detail) => {
                ApiError::ServiceUnavailable(format!("storage: {detail}"))
            }
            other => ApiError::Internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.code().status();
        match &self {
            ApiError::Internal(detail) => tracing::error!(detail, "internal error"),
            ApiError::ServiceUnavailable(detail) => tracing::warn!(detail, "service unavailable"),
            _ => {}
        }
        let body = ErrorBody {
            error: ErrorObject {
                code: self.code(),
                message: self.to_string(),
            },
        };
        let mut response = (status, axum::Json(body)).into_response();
        if let ApiError::RateLimited { retry_after } = &self {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(retry_after_secs(*retry_after)),
            );
        }
        if let ApiError::ServiceUnavailable(_) | ApiError::Overloaded(_) = &self {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::from_millis(5_100)), 6);
        assert_eq!(retry_after_secs(Duration::from_secs(6)), 6);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
    }

    #[test]
    fn internal_details_stay_out_of_the_message() {
        let error = ApiError::Internal("password=hunter2 at db.internal".into());
        assert!(!error.to_string().contains("hunter2"));
        let error: ApiError = StoreError::Unavailable("postgres://u:secret@h".into()).into();
        assert!(!error.to_string().contains("secret"));
    }
}

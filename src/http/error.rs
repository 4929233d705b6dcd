//! The API's error type and the one table that maps it to status and code,
//! rendered in the error dialect of the route that answers: Moderato's
//! `{"error":{"code","message"}}`, or OpenAI's
//! `{"error":{"message","type","param","code"}}` on `/v1/moderations`.
//!
//! The dialect is chosen once per route ([`Dialect::scope`], by the route's
//! layer) and read here when any error becomes a response, so that errors
//! from the layers inside the route (authentication, rate limits, the body
//! extractor's 408/413/415, a caught panic) speak it too, with no response
//! rewritten after the fact.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Serialize, Serializer};
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::RefOr;
use utoipa::ToSchema;

use crate::store::StoreError;

/// How an error body is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Dialect {
    /// `{"error":{"code","message"}}`.
    #[default]
    Moderato,
    /// OpenAI's `{"error":{"message","type","param","code"}}`, for its SDKs.
    OpenAi,
}

tokio::task_local! {
    static DIALECT: Dialect;
}

impl Dialect {
    /// Runs `future` (a route's handling) with every error rendered in `self`.
    pub async fn scope<F: std::future::Future>(self, future: F) -> F::Output {
        DIALECT.scope(self, future).await
    }

    /// The dialect of the route being answered (Moderato's outside any).
    pub fn current() -> Dialect {
        DIALECT.try_with(|d| *d).unwrap_or_default()
    }
}

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

impl ApiError {
    /// The body in `dialect`.
    fn body(&self, dialect: Dialect) -> ErrorJson {
        let code = self.code();
        match dialect {
            Dialect::Moderato => ErrorJson::Moderato(ErrorBody {
                error: ErrorObject {
                    code,
                    message: self.to_string(),
                },
            }),
            Dialect::OpenAi => ErrorJson::OpenAi(OpenAiErrorBody {
                error: OpenAiErrorObject {
                    message: self.openai_message(),
                    kind: openai_type(code.status()),
                    param: self.param().map(str::to_owned),
                    code,
                },
            }),
        }
    }

    /// OpenAI's clients send the key as a bearer token.
    fn openai_message(&self) -> String {
        match self {
            ApiError::MissingApiKey => "no API key was sent: send it in the Authorization header as `Bearer <key>` (or in X-API-Key)".into(),
            other => other.to_string(),
        }
    }

    /// The request field an error is about, when its message starts with
    /// one (`input[2].image_url.url: ...`): OpenAI's `param`.
    fn param(&self) -> Option<&str> {
        let message = match self {
            ApiError::InvalidRequest(m)
            | ApiError::PayloadTooLarge(m)
            | ApiError::InvalidImage(m) => m,
            _ => return None,
        };
        let (head, _) = message.split_once(':')?;
        let is_path = head.starts_with("input") || head == "model";
        (is_path && !head.contains(' ')).then_some(head)
    }
}

/// OpenAI's error `type` for a status: its SDKs branch on the status, people
/// read the type.
fn openai_type(status: StatusCode) -> OpenAiErrorType {
    match status.as_u16() {
        429 => OpenAiErrorType::RateLimitError,
        500.. => OpenAiErrorType::ServerError,
        _ => OpenAiErrorType::InvalidRequestError,
    }
}

/// An error body in one of the dialects, serialised as that body alone.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum ErrorJson {
    Moderato(ErrorBody),
    OpenAi(OpenAiErrorBody),
}

/// OpenAI's error body, on `/v1/moderations`.
#[derive(Debug, Serialize, ToSchema)]
pub struct OpenAiErrorBody {
    pub error: OpenAiErrorObject,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OpenAiErrorObject {
    /// What to fix.
    pub message: String,
    #[serde(rename = "type")]
    pub kind: OpenAiErrorType,
    /// The request field the error is about (`input[2].image_url.url`), if any.
    pub param: Option<String>,
    pub code: ErrorCode,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OpenAiErrorType {
    InvalidRequestError,
    RateLimitError,
    ServerError,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.code().status();
        match &self {
            ApiError::Internal(detail) => tracing::error!(detail, "internal error"),
            ApiError::ServiceUnavailable(detail) => tracing::warn!(detail, "service unavailable"),
            _ => {}
        }
        let body = self.body(Dialect::current());
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

    #[tokio::test]
    async fn the_route_dialect_shapes_every_error() {
        let error = || ApiError::InvalidRequest("input[2].image_url.url: not a data URL".into());
        let json = |body: ErrorJson| serde_json::to_value(body).unwrap();
        let moderato = json(error().body(Dialect::current()));
        assert_eq!(moderato["error"]["code"], "invalid_request");
        assert!(moderato["error"].get("type").is_none());

        let openai = Dialect::OpenAi
            .scope(async { json(error().body(Dialect::current())) })
            .await;
        assert_eq!(openai["error"]["type"], "invalid_request_error");
        assert_eq!(openai["error"]["code"], "invalid_request");
        assert_eq!(openai["error"]["param"], "input[2].image_url.url");
        assert_eq!(
            openai["error"]["message"],
            "input[2].image_url.url: not a data URL"
        );
        let limited = ApiError::RateLimited {
            retry_after: Duration::from_secs(3),
        };
        let body = json(limited.body(Dialect::OpenAi));
        assert_eq!(body["error"]["type"], "rate_limit_error");
        assert_eq!(body["error"]["param"], serde_json::Value::Null);
        let prose = ApiError::InvalidRequest("the request body is not valid JSON: x".into());
        assert_eq!(
            json(prose.body(Dialect::OpenAi))["error"]["param"],
            serde_json::Value::Null
        );
    }
}

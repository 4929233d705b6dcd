//! The API's error type and the one table that maps it to status and code.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

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

impl ApiError {
    pub fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::MissingApiKey => (StatusCode::UNAUTHORIZED, "missing_api_key"),
            ApiError::InvalidApiKey => (StatusCode::UNAUTHORIZED, "invalid_api_key"),
            ApiError::InvalidRequest(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            ApiError::UnsupportedMediaType(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            ApiError::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::RequestTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "request_timeout"),
            ApiError::InvalidImage(_) => (StatusCode::BAD_REQUEST, "invalid_image"),
            ApiError::RateLimited { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_exceeded"),
            ApiError::ServiceUnavailable(_) | ApiError::Overloaded(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable")
            }
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::MethodNotAllowed { .. } => {
                (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed")
            }
        }
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
        let (status, code) = self.status_and_code();
        match &self {
            ApiError::Internal(detail) => tracing::error!(detail, "internal error"),
            ApiError::ServiceUnavailable(detail) => tracing::warn!(detail, "service unavailable"),
            _ => {}
        }
        let body = json!({ "error": { "code": code, "message": self.to_string() } });
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

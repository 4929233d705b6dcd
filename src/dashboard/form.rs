//! The dashboard's form extractor: axum's `Form`, read under the body
//! bounds of every route, so that a form that is too large, encoded, or
//! late gets the API's own 413, 415 or 408 (JSON, like every refusal of a
//! request's shape) and never waits for a body without a deadline.

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::HeaderMap;
use serde::de::DeserializeOwned;

use crate::http::error::ApiError;
use crate::http::extract::{check_content_encoding, check_declared_length, read_body, BodyLimits};

/// The largest form body the dashboard reads. Its longest field is a
/// password of at most 1,024 characters, 12 KiB when every character is
/// four bytes, percent-encoded.
pub const MAX_FORM_BYTES: usize = 16 * 1024;

const FORM_TYPE: &str = "application/x-www-form-urlencoded";

/// `Form(value)`: an `application/x-www-form-urlencoded` body.
pub struct Form<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Form<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let limits = *request.extensions().get::<BodyLimits>().ok_or_else(|| {
            ApiError::Internal("the body layer is missing from the router".into())
        })?;
        check_form_type(request.headers())?;
        check_content_encoding(request.headers())?;
        check_declared_length(request.headers(), limits.max_bytes)?;
        let (parts, body) = request.into_parts();
        let bytes = read_body(body, limits).await?;
        let request = Request::from_parts(parts, Body::from(bytes));
        match axum::Form::<T>::from_request(request, state).await {
            Ok(axum::Form(value)) => Ok(Form(value)),
            Err(rejection) => Err(ApiError::InvalidRequest(format!(
                "the form could not be read: {}",
                rejection.body_text()
            ))),
        }
    }
}

fn check_form_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let content_type = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    if essence.eq_ignore_ascii_case(FORM_TYPE) {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType(format!(
            "Content-Type {essence:?} is not supported: send the form as {FORM_TYPE}"
        )))
    }
}

//! The outermost layer: signs every response the service sends (RFC 9421
//! over `@status`, `content-type`, `content-digest` and `x-request-id`).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::request_id::{RequestId, HEADER as REQUEST_ID};
use crate::signing::ResponseSigner;

/// Responses are JSON documents well below this; anything larger is a bug.
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

pub async fn sign(
    State(signer): State<Arc<ResponseSigner>>,
    request: Request,
    next: Next,
) -> Response {
    let response = next.run(request).await;
    let (mut parts, body) = response.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_RESPONSE_BYTES).await {
        Ok(bytes) => bytes,
        Err(error) => {
            let replacement = ApiError::Internal(format!(
                "response body could not be buffered for signing: {error}"
            ));
            let (new_parts, new_body) = replacement.into_response().into_parts();
            let request_id = parts.headers.get(REQUEST_ID).cloned();
            parts = new_parts;
            if let Some(id) = request_id {
                parts.headers.insert(REQUEST_ID, id);
            }
            axum::body::to_bytes(new_body, MAX_RESPONSE_BYTES)
                .await
                .unwrap_or_default()
        }
    };
    let headers = &mut parts.headers;
    if !headers.contains_key(header::CONTENT_TYPE) {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    if !headers.contains_key(REQUEST_ID) {
        if let Ok(value) = HeaderValue::from_str(&RequestId::generate().0) {
            headers.insert(REQUEST_ID, value);
        }
    }
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let signed = signer.sign_response(
        parts.status.as_u16(),
        &text(header::CONTENT_TYPE.as_str()),
        &text(REQUEST_ID),
        &bytes,
        chrono::Utc::now().timestamp(),
    );
    for (name, value) in [
        ("content-digest", signed.content_digest),
        ("signature-input", signed.signature_input),
        ("signature", signed.signature),
    ] {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
    Response::from_parts(parts, Body::from(bytes))
}

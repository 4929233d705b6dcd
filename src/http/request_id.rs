//! A unique id for every response (`X-Request-Id`, also the body's `id`),
//! and one log line per request carrying it.

use std::time::Instant;

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

pub const HEADER: &str = "x-request-id";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestId(pub String);

impl RequestId {
    pub fn generate() -> RequestId {
        RequestId(format!("modr_{}", uuid::Uuid::now_v7().simple()))
    }
}

pub async fn assign(mut request: Request, next: Next) -> Response {
    let id = RequestId::generate();
    let started = Instant::now();
    let span = tracing::info_span!("request", id = %id.0, method = %request.method(), path = %request.uri().path());
    request.extensions_mut().insert(id.clone());
    let mut response = next.run(request).instrument(span.clone()).await;
    if let Ok(value) = HeaderValue::from_str(&id.0) {
        response.headers_mut().insert(HEADER, value);
    }
    span.in_scope(|| {
        tracing::info!(
            status = response.status().as_u16(),
            latency_ms = started.elapsed().as_millis() as u64,
            "response"
        );
    });
    response
}

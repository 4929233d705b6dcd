//! The HTTP surface: routes, extractors, the error type and the layers.
//!
//! Layers, outermost first: signing (so every response is signed, errors
//! and 401s included), the body guard (`Connection: close` when a request's
//! body was left unread), request id, panic catcher; then, on `/v1/moderate`
//! only, authentication + rate limit + metering, and the handler's own panic
//! catcher (so that even a panicking request leaves its usage event).

pub mod auth;
pub mod error;
pub mod extract;
pub mod meta;
pub mod moderate;
pub mod request_id;
pub mod serve;
pub mod signing;
pub mod strict_json;

use std::ops::Deref;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::extract::Request;
use axum::http::header::CONNECTION;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{middleware, Extension, Router};
use tower_http::catch_panic::CatchPanicLayer;

use crate::config::{BudgetConfig, DashboardConfig, IpBlock, Limits, Plans};
use crate::keys::Pepper;
use crate::moderation::engine::Engine;
use crate::ratelimit::{FailedAuthLimiter, RateLimiter};
use crate::signing::ResponseSigner;
use crate::store::Store;
use crate::usage::UsageRecorder;
use error::ApiError;
use extract::BodyLimits;

/// What the handlers and layers share.
pub struct Shared {
    pub limits: Limits,
    pub budget: BudgetConfig,
    pub engine: Arc<Engine>,
    pub store: Arc<dyn Store>,
    pub keys: auth::KeyCache,
    pub pepper: Pepper,
    pub plans: Plans,
    pub limiter: RateLimiter,
    pub failed_auth: FailedAuthLimiter,
    pub usage: UsageRecorder,
    pub trusted_proxies: Vec<IpBlock>,
    pub body_read_timeout: Duration,
    pub signer: Arc<ResponseSigner>,
    pub dashboard: DashboardConfig,
}

#[derive(Clone)]
pub struct AppState(pub Arc<Shared>);

impl Deref for AppState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

pub fn router(state: AppState) -> Router {
    let signer = state.signer.clone();
    let moderate = post(moderate::moderate)
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ));
    let mut routes = Router::new();
    if state.dashboard.enabled {
        routes = routes.nest("/dashboard", crate::dashboard::router(state.clone()));
    }
    routes
        .route("/v1/moderate", moderate)
        .route("/v1/signing-keys", get(meta::signing_keys))
        .route("/v1/openapi.json", get(meta::openapi))
        .route("/health", get(meta::health))
        .route("/ready", get(meta::ready))
        .fallback(meta::not_found)
        .method_not_allowed_fallback(meta::method_not_allowed)
        .layer(Extension(BodyLimits {
            max_bytes: state.limits.max_body_bytes,
            read_timeout: state.body_read_timeout,
        }))
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(middleware::from_fn(request_id::assign))
        .layer(middleware::from_fn(close_unless_body_read))
        .layer(middleware::from_fn_with_state(signer, signing::sign))
        .with_state(state)
}

fn panic_response(_panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let mut response = ApiError::Internal("a request handler panicked".into()).into_response();
    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    response
}

/// A response sent before its request's body was read whole leaves the rest
/// of the body on the connection, which the server then closes: say so with
/// `Connection: close`, so that a keep-alive client does not send its next
/// request into a closed connection (most clients do not retry a POST).
async fn close_unless_body_read(request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let finished = Arc::new(AtomicBool::new(body.is_end_stream()));
    let body = Body::new(WatchedBody {
        inner: body,
        finished: finished.clone(),
    });
    let mut response = next.run(Request::from_parts(parts, body)).await;
    if !finished.load(Ordering::Acquire) {
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A body that records when it has been read to its end.
struct WatchedBody {
    inner: Body,
    finished: Arc<AtomicBool>,
}

impl HttpBody for WatchedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.finished.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

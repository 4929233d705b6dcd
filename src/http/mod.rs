//! The HTTP surface: routes, extractors, the error type and the layers.
//!
//! Layers, outermost first: signing (so every response is signed, errors
//! and 401s included), request id, panic catcher; then, on `/v1/moderate`
//! only, authentication + rate limit + metering, and the handler's own panic
//! catcher (so that even a panicking request leaves its usage event).

pub mod auth;
pub mod error;
pub mod extract;
pub mod meta;
pub mod moderate;
pub mod request_id;
pub mod signing;

use std::ops::Deref;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{middleware, Extension, Router};
use tower_http::catch_panic::CatchPanicLayer;

use crate::config::{BudgetConfig, Limits, Plans};
use crate::keys::Pepper;
use crate::moderation::engine::Engine;
use crate::ratelimit::{FailedAuthLimiter, RateLimiter};
use crate::signing::ResponseSigner;
use crate::store::Store;
use crate::usage::UsageRecorder;
use error::ApiError;
use extract::BodyLimit;

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
    pub trust_forwarded_for: bool,
    pub signer: Arc<ResponseSigner>,
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
    Router::new()
        .route("/v1/moderate", moderate)
        .route("/v1/signing-keys", get(meta::signing_keys))
        .route("/v1/openapi.json", get(meta::openapi))
        .route("/health", get(meta::health))
        .route("/ready", get(meta::ready))
        .fallback(meta::not_found)
        .method_not_allowed_fallback(meta::method_not_allowed)
        .layer(Extension(BodyLimit(state.limits.max_body_bytes)))
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(middleware::from_fn(request_id::assign))
        .layer(middleware::from_fn_with_state(signer, signing::sign))
        .with_state(state)
}

fn panic_response(_panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let mut response = ApiError::Internal("a request handler panicked".into()).into_response();
    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    response
}

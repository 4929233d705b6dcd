//! The HTTP surface: routes, extractors, the error type and the layers.
//!
//! Layers, outermost first: signing (so every response is signed, errors
//! and 401s included), the body bound (size and deadline of every body;
//! `Connection: close`, and a lingering close, when a request's body was
//! left unread), request id, panic catcher; then, on the moderation
//! routes (`/v1/moderate`, `/v1/moderations`) only, the route's endpoint and
//! error dialect, authentication + rate limit + metering, and the handler's
//! own panic catcher (so that even a panicking request leaves its usage event).

pub(crate) mod auth;
pub(crate) mod body;
pub mod error;
pub(crate) mod extract;
pub(crate) mod meta;
pub(crate) mod moderate;
pub(crate) mod openai;
pub mod openapi;
pub(crate) mod pipeline;
pub(crate) mod request_id;
pub(crate) mod serve;
pub(crate) mod sign_responses;
pub(crate) mod strict_json;

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::handler::Handler;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::{middleware, Router};
use tower_http::catch_panic::CatchPanicLayer;

use crate::access::keys::Pepper;
use crate::access::ratelimit::{FailedAuthLimiter, RateLimiter};
use crate::access::usage::UsageRecorder;
use crate::access::Endpoint;
use crate::config::{BudgetConfig, DashboardConfig, IpBlock, KeysPerAccount, Limits, Plans};
use crate::moderation::engine::Engine;
use crate::moderation::image::remote::RemoteImages;
use crate::signing::ResponseSigner;
use crate::store::Store;
use body::BodyLimits;
use error::{ApiError, Dialect};

/// What the handlers and layers share.
pub struct Shared {
    pub limits: Limits,
    pub budget: BudgetConfig,
    pub engine: Arc<Engine>,
    /// Whether and how `image_url` parts with http(s) URLs are fetched.
    pub remote_images: RemoteImages,
    pub store: Arc<dyn Store>,
    pub keys: crate::access::KeyCache,
    pub pepper: Pepper,
    pub plans: Plans,
    pub max_keys_per_account: KeysPerAccount,
    pub limiter: RateLimiter,
    /// Shared with its pruning timer.
    pub failed_auth: Arc<FailedAuthLimiter>,
    pub usage: UsageRecorder,
    pub trusted_proxies: Vec<IpBlock>,
    pub body_read_timeout: Duration,
    /// The rate a body must keep arriving at (after its grace).
    pub body_min_rate: Option<body::MinRate>,
    pub signer: Arc<ResponseSigner>,
    pub dashboard: DashboardConfig,
    /// Whether anyone may sign up, and the mailer that confirms them.
    pub sign_up: crate::dashboard::SignUpDoor,
    /// Dashboard sign-ins of one account or address, one at a time.
    pub sign_in_attempts: crate::dashboard::AttemptLocks,
    /// Sign-ups of one client address, and e-mails to one recipient, one
    /// at a time.
    pub sign_up_attempts: crate::dashboard::AttemptLocks,
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
    let body_limits = BodyLimits {
        max_bytes: state.limits.max_body_bytes,
        read_timeout: state.body_read_timeout,
        min_rate: state.body_min_rate,
    };
    let moderate = metered(&state, Endpoint::Moderate, moderate::moderate);
    let moderations = metered(&state, Endpoint::Moderations, openai::moderations);
    let mut routes = Router::new();
    if state.dashboard.enabled {
        routes = routes.nest("/dashboard", crate::dashboard::router(state.clone()));
    }
    routes
        .route("/v1/moderate", moderate)
        .route("/v1/moderations", moderations)
        .route("/v1/signing-keys", get(meta::signing_keys))
        .route("/v1/openapi.json", get(meta::openapi))
        .route("/health", get(meta::health))
        .route("/ready", get(meta::ready))
        .fallback(meta::not_found)
        .method_not_allowed_fallback(meta::method_not_allowed)
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(middleware::from_fn(request_id::assign))
        .layer(middleware::from_fn_with_state(
            body_limits,
            body::bound_body,
        ))
        .layer(middleware::from_fn_with_state(signer, sign_responses::sign))
        .layer(middleware::from_fn(count_requests))
        .with_state(state)
}

/// Requests by route and status, and their latency, for the metrics. The
/// route is the matched pattern (never the raw path, whose values are the
/// client's to choose), or `unmatched`.
async fn count_requests(request: Request, next: Next) -> Response {
    use crate::metrics::names;
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_str().to_owned();
    metrics::counter!(names::HTTP_REQUESTS, "route" => route.clone(), "status" => status)
        .increment(1);
    metrics::histogram!(names::HTTP_DURATION, "route" => route)
        .record(started.elapsed().as_secs_f64());
    response
}

/// A moderation route: its endpoint and dialect, then authentication, rate
/// limits and metering, then the handler behind its own panic catcher.
fn metered<H, T>(state: &AppState, endpoint: Endpoint, handler: H) -> MethodRouter<AppState>
where
    H: Handler<T, AppState>,
    T: 'static,
{
    post(handler)
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ))
        .layer(middleware::from_fn_with_state(endpoint, enter_endpoint))
}

/// Marks the request with its endpoint (for metering) and answers it in the
/// endpoint's error dialect, whichever layer inside refuses it.
async fn enter_endpoint(
    axum::extract::State(endpoint): axum::extract::State<Endpoint>,
    mut request: Request,
    next: Next,
) -> Response {
    request.extensions_mut().insert(endpoint);
    let dialect = match endpoint {
        Endpoint::Moderate => Dialect::Moderato,
        Endpoint::Moderations => Dialect::OpenAi,
    };
    dialect.scope(next.run(request)).await
}

fn panic_response(_panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let mut response = ApiError::Internal("a request handler panicked".into()).into_response();
    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    response
}

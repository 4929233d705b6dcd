//! The web dashboard, served under `/dashboard/` by the same process:
//! customers manage their keys and see their usage; admins manage accounts
//! and plans. Server-rendered HTML (askama templates checked at compile
//! time), one stylesheet and a few lines of script for the copy button.
//!
//! Handlers stay thin: accounts and sessions live in the store (so replicas
//! behind a load balancer share them), keys are made by [`crate::access::keys`]
//! exactly as the CLI makes them, and the API's own key path (cache,
//! revocation, plans) applies to them unchanged.

mod account;
mod admin;
mod attempts;
mod csrf;
mod error;
mod form;
mod housekeeping;
mod keys;
mod mail;
mod pages;
mod policies;
mod session;
mod signup;
mod usage;

pub use attempts::AttemptLocks;
pub use housekeeping::spawn_pruning;
pub use mail::SignUpDoor;

use axum::extract::Request;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

use crate::http::AppState;
pub use error::DashError;

/// Every dashboard route. Nested at `/dashboard` by [`crate::http::router`].
pub fn router(_state: AppState) -> Router<AppState> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/dashboard/keys") }))
        .route("/login", get(session::login_page).post(session::login))
        .route("/logout", axum::routing::post(session::logout))
        .route("/keys", get(keys::list).post(keys::create))
        .route(
            "/keys/{id}/revoke",
            get(keys::confirm_revoke).post(keys::revoke),
        )
        .route(
            "/keys/{id}/policy",
            axum::routing::post(policies::set_key_policy),
        )
        .route("/policies", get(policies::list).post(policies::create))
        .route("/policies/{id}", get(policies::show).post(policies::update))
        .route("/usage", get(usage::page))
        .route("/usage.csv", get(usage::csv))
        .route("/plan", get(keys::plan))
        .route("/account", get(account::page))
        .route(
            "/account/password",
            axum::routing::post(account::change_password),
        )
        .route(
            "/admin/accounts",
            get(admin::accounts).post(admin::create_account),
        )
        .route("/admin/accounts/{id}", get(admin::account))
        .route(
            "/admin/accounts/{id}/plan",
            axum::routing::post(admin::set_plan),
        )
        .route(
            "/admin/accounts/{id}/password",
            axum::routing::post(admin::reset_password),
        )
        .route(
            "/admin/accounts/{id}/disable",
            axum::routing::post(admin::disable),
        )
        .route(
            "/admin/accounts/{id}/keys",
            axum::routing::post(admin::create_key),
        )
        .route(
            "/admin/accounts/{id}/keys/{key}/revoke",
            get(admin::confirm_revoke_key).post(admin::revoke_key),
        )
        .route(
            "/set-password",
            get(admin::set_password_page).post(admin::set_password),
        )
        .route("/signup", get(signup::signup_page).post(signup::signup))
        .route("/static/style.css", get(stylesheet))
        .route("/static/copy.js", get(script))
        .fallback(|| async { DashError::NotFound })
        .layer(middleware::from_fn(csrf::same_origin_only))
        .layer(middleware::from_fn(security_headers))
        .layer(middleware::from_fn_with_state(
            form::MAX_FORM_BYTES,
            crate::http::body::narrow,
        ))
}

/// Headers on every dashboard response: no framing, no script or style
/// from elsewhere (nor inline), no MIME sniffing, no referrer leaving the site.
async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    for (name, value) in [
        (
            "content-security-policy",
            "default-src 'self'; frame-ancestors 'none'",
        ),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "same-origin"),
    ] {
        headers.insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    // Pages hold account data and one-time secrets: keep them out of caches.
    headers
        .entry(CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

async fn stylesheet() -> Response {
    (
        [
            (CONTENT_TYPE, "text/css; charset=utf-8"),
            (CACHE_CONTROL, "public, max-age=3600"),
        ],
        include_str!("static/style.css"),
    )
        .into_response()
}

async fn script() -> Response {
    (
        [
            (CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (CACHE_CONTROL, "public, max-age=3600"),
        ],
        include_str!("static/copy.js"),
    )
        .into_response()
}

//! Endpoints without an API key: liveness, readiness, signing keys, the
//! OpenAPI document, and the JSON answers for unknown paths and methods.

use axum::extract::{OriginalUri, State};
use axum::http::{header, Method};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use super::error::{ApiError, ErrorCode};
use super::AppState;
use crate::signing::Jwks;

/// What the public endpoints can answer besides their success.
pub const PUBLIC_ERRORS: &[ErrorCode] = &[ErrorCode::Internal];

/// `/ready` also reports a storage it cannot reach (503) or that fails (500).
pub const READY_ERRORS: &[ErrorCode] = &[ErrorCode::ServiceUnavailable, ErrorCode::Internal];

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    status: HealthStatus,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HealthStatus {
    Ok,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Readiness {
    status: ReadinessStatus,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReadinessStatus {
    Ready,
}

/// Liveness: the process answers.
#[utoipa::path(
    get,
    path = "/health",
    tag = "service",
    responses((status = 200, description = "The process is up", body = Health)),
)]
pub async fn health() -> Json<Health> {
    Json(Health {
        status: HealthStatus::Ok,
    })
}

/// Readiness: the storage answers too.
#[utoipa::path(
    get,
    path = "/ready",
    tag = "service",
    responses((status = 200, description = "Ready to serve: the storage answers", body = Readiness)),
)]
pub async fn ready(State(state): State<AppState>) -> Result<Json<Readiness>, ApiError> {
    state.store.ping().await?;
    Ok(Json(Readiness {
        status: ReadinessStatus::Ready,
    }))
}

/// The public keys that verify response signatures (JWKS, RFC 7517).
#[utoipa::path(
    get,
    path = "/v1/signing-keys",
    tag = "service",
    responses((status = 200, description = "The current key first, then keys kept for rotation", body = Jwks)),
)]
pub async fn signing_keys(State(state): State<AppState>) -> Response {
    Json(state.signer.jwks()).into_response()
}

/// This document.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "service",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API", body = Object)),
)]
pub async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        super::openapi::json(),
    )
        .into_response()
}

pub async fn not_found(OriginalUri(uri): OriginalUri) -> ApiError {
    ApiError::NotFound(uri.path().to_owned())
}

pub async fn method_not_allowed(method: Method, OriginalUri(uri): OriginalUri) -> ApiError {
    ApiError::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().to_owned(),
    }
}

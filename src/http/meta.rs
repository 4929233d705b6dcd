//! Endpoints without an API key: liveness, readiness, signing keys, the
//! OpenAPI document, and the JSON answers for unknown paths and methods.

use axum::extract::{OriginalUri, State};
use axum::http::{header, Method};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::error::ApiError;
use super::AppState;

const OPENAPI: &str = include_str!("openapi.json");

pub async fn health() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

pub async fn ready(State(state): State<AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    state.store.ping().await?;
    Ok(Json(json!({ "status": "ready" })))
}

pub async fn signing_keys(State(state): State<AppState>) -> Response {
    Json(state.signer.jwks()).into_response()
}

pub async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
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

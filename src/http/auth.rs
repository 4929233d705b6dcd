//! Authentication, rate limiting and metering of `/v1/moderate`, as one
//! layer: the three share the key, and every authenticated request must
//! leave exactly one usage event whatever its outcome.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::{retry_after_secs, ApiError};
use super::request_id::RequestId;
use super::AppState;
use crate::keys::PresentedKey;
use crate::ratelimit::Decision;
use crate::store::{ApiKeyRecord, KeyId, Store, StoreError, UsageEvent};
use crate::usage::UsageStats;

pub const API_KEY_HEADER: &str = "x-api-key";
const MAX_CACHED_KEYS: usize = 100_000;

/// Key look-ups cached for a short time (at most one second, so that a
/// revocation reaches every replica within a second). Unknown ids are cached
/// too, so that guessing does not reach the database every time.
pub struct KeyCache {
    ttl: Duration,
    entries: Mutex<HashMap<KeyId, (Instant, Option<ApiKeyRecord>)>>,
}

impl KeyCache {
    pub fn new(ttl: Duration) -> KeyCache {
        KeyCache {
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    pub async fn get(
        &self,
        store: &dyn Store,
        id: &KeyId,
    ) -> Result<Option<ApiKeyRecord>, StoreError> {
        if let Some(hit) = self.cached(id) {
            return Ok(hit);
        }
        let record = store.get_key(id).await?;
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= MAX_CACHED_KEYS {
            entries.clear();
        }
        entries.insert(id.clone(), (Instant::now(), record.clone()));
        Ok(record)
    }

    fn cached(&self, id: &KeyId) -> Option<Option<ApiKeyRecord>> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(id)
            .filter(|(at, _)| at.elapsed() < self.ttl)
            .map(|(_, record)| record.clone())
    }
}

/// The authenticated key, for handlers that want it.
#[derive(Clone, Debug)]
pub struct AuthenticatedKey(pub ApiKeyRecord);

pub async fn authenticate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let address = client_address(&request, state.trust_forwarded_for);
    if let Some(wait) = state.failed_auth.blocked(address) {
        return ApiError::RateLimited { retry_after: wait }.into_response();
    }
    let record = match identify(&state, request.headers()).await {
        Ok(record) => record,
        Err(error @ (ApiError::MissingApiKey | ApiError::InvalidApiKey)) => {
            return match state.failed_auth.record_failure(address) {
                Some(wait) => ApiError::RateLimited { retry_after: wait }.into_response(),
                None => error.into_response(),
            };
        }
        Err(other) => return other.into_response(),
    };
    // Reserve the usage event's place before doing anything billable.
    let Ok(permit) = state.usage.reserve() else {
        return ApiError::ServiceUnavailable("usage queue full".into()).into_response();
    };
    let request_id = request
        .extensions()
        .get::<RequestId>()
        .map(|r| r.0.clone())
        .unwrap_or_default();
    let rpm = record
        .custom_rpm
        .unwrap_or_else(|| state.plans.rpm(record.tier));
    let (decision, _backend) = state.limiter.check(record.id.as_str(), rpm).await;

    let mut response = if decision.allowed {
        let mut request = request;
        request
            .extensions_mut()
            .insert(AuthenticatedKey(record.clone()));
        next.run(request).await
    } else {
        ApiError::RateLimited {
            retry_after: decision.retry_after,
        }
        .into_response()
    };
    add_rate_limit_headers(response.headers_mut(), &decision);

    let stats = response
        .extensions()
        .get::<UsageStats>()
        .copied()
        .unwrap_or_default();
    let status = response.status().as_u16();
    let event = UsageEvent {
        request_id,
        key_id: record.id,
        at: chrono::Utc::now(),
        status,
        text_items: stats.text_items,
        text_chars: stats.text_chars,
        image_items: stats.image_items,
        image_bytes: stats.image_bytes,
        deep_analyses: stats.deep_analyses,
        flagged: stats.flagged,
        rate_limited: !decision.allowed || stats.rate_limited,
        billable: status == 200,
        latency_ms: u32::try_from(started.elapsed().as_millis()).unwrap_or(u32::MAX),
    };
    // The response leaves only once its usage event is on disk.
    if let Err(error) = permit.record(event).await {
        return ApiError::ServiceUnavailable(error.to_string()).into_response();
    }
    response
}

async fn identify(state: &AppState, headers: &HeaderMap) -> Result<ApiKeyRecord, ApiError> {
    let value = headers.get(API_KEY_HEADER).ok_or(ApiError::MissingApiKey)?;
    let text = value.to_str().map_err(|_| ApiError::InvalidApiKey)?.trim();
    let presented = PresentedKey::parse(text).ok_or(ApiError::InvalidApiKey)?;
    let record = state
        .keys
        .get(state.store.as_ref(), &presented.id)
        .await?
        .ok_or(ApiError::InvalidApiKey)?;
    if presented.verify(&record, &state.pepper) {
        Ok(record)
    } else {
        Err(ApiError::InvalidApiKey)
    }
}

fn client_address(request: &Request, trust_forwarded_for: bool) -> IpAddr {
    let forwarded = trust_forwarded_for
        .then(|| request.headers().get("x-forwarded-for"))
        .flatten()
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.trim().parse().ok());
    forwarded
        .or_else(|| {
            request
                .extensions()
                .get::<ConnectInfo<SocketAddr>>()
                .map(|c| c.0.ip())
        })
        .unwrap_or(IpAddr::from([0, 0, 0, 0]))
}

/// `X-RateLimit-*` and the IETF draft `RateLimit-Policy` / `RateLimit` fields.
fn add_rate_limit_headers(headers: &mut HeaderMap, decision: &Decision) {
    let reset_in = if decision.reset_after.is_zero() {
        0
    } else {
        retry_after_secs(decision.reset_after)
    };
    let reset_at = chrono::Utc::now().timestamp() as u64 + reset_in;
    let values = [
        ("x-ratelimit-limit", decision.limit.to_string()),
        ("x-ratelimit-remaining", decision.remaining.to_string()),
        ("x-ratelimit-reset", reset_at.to_string()),
        (
            "ratelimit-policy",
            format!("\"per-key\";q={};w=60", decision.limit),
        ),
        (
            "ratelimit",
            format!("\"per-key\";r={};t={}", decision.remaining, reset_in),
        ),
    ];
    for (name, value) in values {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
}

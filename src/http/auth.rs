//! Authentication, rate limiting and metering of the moderation routes
//! (`/v1/moderate` and `/v1/moderations`), as one layer: the three share the
//! key, and every authenticated request must leave exactly one usage event
//! whatever its outcome, marked with the route that served it.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::header::{AUTHORIZATION, EXPECT};
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;

use super::error::{retry_after_secs, ApiError};
use super::request_id::RequestId;
use super::AppState;
use crate::access::keys::PresentedKey;
use crate::access::ratelimit::Decision;
use crate::access::usage::UsageStats;
use crate::access::{Allowance, ApiKeyRecord, Endpoint, UsageEvent};
use crate::config::IpBlock;
use crate::metrics::names;

pub const API_KEY_HEADER: &str = "x-api-key";

/// The authenticated key and the buckets it draws on, for handlers.
#[derive(Clone, Debug)]
pub struct AuthenticatedKey(pub ApiKeyRecord, pub Allowance);

pub async fn authenticate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    // Both are construction bugs when missing: refuse rather than meter
    // under an empty id (which the store would drop) or share one bucket.
    let Some(request_id) = request.extensions().get::<RequestId>().map(|r| r.0.clone()) else {
        return ApiError::Internal("the request-id layer is missing from the router".into())
            .into_response();
    };
    let Some(peer) = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0)
    else {
        return ApiError::Internal(
            "ConnectInfo is missing: the server must provide the peer address".into(),
        )
        .into_response();
    };
    let Some(endpoint) = request.extensions().get::<Endpoint>().copied() else {
        return ApiError::Internal("the route does not say which endpoint it is".into())
            .into_response();
    };
    let address = client_address(peer.ip(), request.headers(), &state.trusted_proxies);
    let blocked = state.failed_auth.blocked(address);
    let presented = presented_key(request.headers(), endpoint);
    let record = match identify(&state, presented, blocked.is_some()).await {
        Ok(record) => record,
        Err(error @ (ApiError::MissingApiKey | ApiError::InvalidApiKey)) => {
            let refusal = match blocked.or_else(|| state.failed_auth.record_failure(address)) {
                Some(wait) => ApiError::RateLimited { retry_after: wait },
                None => error,
            };
            let reason = match refusal {
                ApiError::MissingApiKey => "missing",
                ApiError::InvalidApiKey => "invalid",
                _ => "blocked",
            };
            metrics::counter!(names::AUTH_FAILURES, "reason" => reason).increment(1);
            return refuse(request, refusal, &state).await;
        }
        Err(other) => return refuse(request, other, &state).await,
    };
    // Reserve the usage event's place before doing anything billable.
    let Ok(permit) = state.usage.reserve() else {
        let full = ApiError::ServiceUnavailable("usage queue full".into());
        return refuse(request, full, &state).await;
    };
    let allowance = Allowance::of(&record, &state.plans, &state.budget.chars_per_minute);
    let decision = state.limiter.check_requests(&allowance).await;

    let mut response = if decision.allowed {
        let mut request = request;
        request
            .extensions_mut()
            .insert(AuthenticatedKey(record.clone(), allowance));
        next.run(request).await
    } else {
        let limited = ApiError::RateLimited {
            retry_after: decision.retry_after,
        };
        refuse(request, limited, &state).await
    };
    add_rate_limit_headers(response.headers_mut(), &decision);

    let stats = response
        .extensions()
        .get::<UsageStats>()
        .copied()
        .unwrap_or_default();
    let limit = match (decision.allowed, stats.rate_limited) {
        (false, _) => Some("requests"),
        (true, true) => Some("characters"),
        (true, false) => None,
    };
    if let Some(limit) = limit {
        metrics::counter!(names::RATE_LIMITED, "tier" => record.tier.as_str(), "limit" => limit)
            .increment(1);
    }
    let status = response.status().as_u16();
    // The policy the key was under when it was read (its judgement's, for a 200).
    let policy_id = record.policy.as_ref().map(|p| p.id.clone());
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
        endpoint,
        policy_id,
    };
    // The response leaves only once its usage event is on disk.
    if let Err(error) = permit.record(event).await {
        return ApiError::ServiceUnavailable(error.to_string()).into_response();
    }
    response
}

/// How long a refused request's body may take to arrive before the refusal
/// is sent with `Connection: close` instead.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// Answers a request refused before its body was read. The body is read
/// and dropped first (bounded by the body limit and [`DRAIN_TIMEOUT`]), so
/// that the keep-alive connection stays usable for the client's next
/// request; if it cannot be, the body layer adds `Connection: close` and
/// the connection closes lingering (`body.rs`, `serve.rs`).
async fn refuse(request: Request, error: ApiError, state: &AppState) -> Response {
    let expects_continue = request
        .headers()
        .get(EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    // A client waiting for "100 Continue" has not sent its body: do not invite it.
    if !expects_continue {
        let limit = state.limits.max_body_bytes;
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, drain(request.into_body(), limit)).await;
    }
    error.into_response()
}

/// Reads and drops up to `limit` bytes of `body`.
async fn drain(mut body: Body, limit: usize) {
    let mut read = 0usize;
    while let Some(Ok(frame)) = body.frame().await {
        read += frame.data_ref().map_or(0, |d| d.len());
        if read > limit {
            return;
        }
    }
}

/// The key as sent: in `X-API-Key`, or, on `/v1/moderations` (OpenAI's
/// clients send it so), as `Authorization: Bearer <key>`. `X-API-Key` wins
/// when both are there. `Err(InvalidApiKey)` for a header that is there but
/// not a key, such as another authorization scheme.
fn presented_key(headers: &HeaderMap, endpoint: Endpoint) -> Result<&str, ApiError> {
    if let Some(value) = headers.get(API_KEY_HEADER) {
        return value
            .to_str()
            .map_err(|_| ApiError::InvalidApiKey)
            .map(str::trim);
    }
    let bearer = match endpoint {
        Endpoint::Moderations => headers.get(AUTHORIZATION),
        Endpoint::Moderate => None,
    };
    let value = bearer.ok_or(ApiError::MissingApiKey)?;
    let text = value.to_str().map_err(|_| ApiError::InvalidApiKey)?.trim();
    match text.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => Ok(token.trim()),
        _ => Err(ApiError::InvalidApiKey),
    }
}

/// The key's record if the presented key is valid. While `address_blocked`
/// (the address failed too often), a key that is not in the cache is looked
/// up only through the limiter's few look-up slots: a valid key is still
/// served, and guesses from that address cannot load the database.
async fn identify(
    state: &AppState,
    presented: Result<&str, ApiError>,
    address_blocked: bool,
) -> Result<ApiKeyRecord, ApiError> {
    let presented = PresentedKey::parse(presented?).ok_or(ApiError::InvalidApiKey)?;
    let cached = state.keys.cached(&presented.id);
    let record = match cached {
        Some(hit) => hit,
        None => {
            let _slot = match address_blocked {
                true => Some(state.failed_auth.lookup_slot().await),
                false => None,
            };
            state.keys.get(state.store.as_ref(), &presented.id).await?
        }
    }
    .ok_or(ApiError::InvalidApiKey)?;
    if presented.verify(&record, &state.pepper) {
        Ok(record)
    } else {
        Err(ApiError::InvalidApiKey)
    }
}

/// The client's address: the peer's, unless the peer is a trusted proxy.
/// Then `X-Forwarded-For` is walked from the right (each trusted hop
/// appended what it saw) to the first address that is not a trusted proxy;
/// entries to its left are the client's own words and could be anything.
pub fn client_address(peer: IpAddr, headers: &HeaderMap, trusted: &[IpBlock]) -> IpAddr {
    let is_trusted = |address: IpAddr| trusted.iter().any(|block| block.contains(address));
    let mut client = peer;
    if !is_trusted(peer) {
        return client;
    }
    for value in headers.get_all("x-forwarded-for").iter().rev() {
        let Ok(text) = value.to_str() else {
            return client;
        };
        for entry in text.rsplit(',') {
            let Some(address) = parse_forwarded_entry(entry) else {
                return client;
            };
            client = address;
            if !is_trusted(address) {
                return client;
            }
        }
    }
    client
}

/// `192.0.2.1`, `2001:db8::1`, or either with a port (`[2001:db8::1]:443`).
fn parse_forwarded_entry(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim();
    entry
        .parse::<IpAddr>()
        .ok()
        .or_else(|| entry.parse::<SocketAddr>().ok().map(|s| s.ip()))
}

/// `X-RateLimit-*` and the IETF draft `RateLimit-Policy` / `RateLimit`
/// fields, of the bucket that binds (see `RateLimiter::check_requests`): a
/// customer's key shows its account's allowance.
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
            format!("\"requests\";q={};w=60", decision.limit),
        ),
        (
            "ratelimit",
            format!("\"requests\";r={};t={}", decision.remaining, reset_in),
        ),
    ];
    for (name, value) in values {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append("x-forwarded-for", HeaderValue::from_str(v).unwrap());
        }
        map
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let trusted = vec![IpBlock::try_from("10.0.0.0/8".to_string()).unwrap()];
        let spoofed = headers(&["203.0.113.9"]);
        // Not a trusted peer: its header is the client's own claim.
        assert_eq!(
            client_address(ip("198.51.100.1"), &spoofed, &trusted),
            ip("198.51.100.1")
        );
        assert_eq!(
            client_address(ip("10.0.0.1"), &spoofed, &[]),
            ip("10.0.0.1")
        );
        // Through two trusted hops, the client prepending a fake entry.
        let chain = headers(&["1.2.3.4, 203.0.113.9", "10.0.0.7"]);
        assert_eq!(
            client_address(ip("10.0.0.1"), &chain, &trusted),
            ip("203.0.113.9")
        );
        let with_port = headers(&["[2001:db8::5]:443"]);
        assert_eq!(
            client_address(ip("10.0.0.1"), &with_port, &trusted),
            ip("2001:db8::5")
        );
        // Garbage or no header: the last trusted hop is all that is known.
        assert_eq!(
            client_address(ip("10.0.0.1"), &headers(&["nope"]), &trusted),
            ip("10.0.0.1")
        );
        assert_eq!(
            client_address(ip("10.0.0.1"), &HeaderMap::new(), &trusted),
            ip("10.0.0.1")
        );
    }
}

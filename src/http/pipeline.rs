//! What every moderation route does between its request's shape and its
//! response's shape: the limits on items and characters, the key's
//! character allowance, the engine, and the usage counts. `/v1/moderate`
//! and `/v1/moderations` each parse their own input into [`Item`]s and
//! write their own body; everything between is here, once.

use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use super::auth::AuthenticatedKey;
use super::error::ApiError;
use super::AppState;
use crate::access::ratelimit::Decision;
use crate::access::usage::UsageStats;
use crate::access::Bucket;
use crate::access::KeyOwner;
use crate::config::{BudgetConfig, Limits};
use crate::moderation::engine::{
    EngineError, Explain, Item, ItemOutcome, Moderation, OcrPayer, Requester,
};
use crate::moderation::fair::Tenant;
use crate::moderation::image::decode::ImageError;
use crate::moderation::image::remote::FetchError;
use crate::moderation::{Category, Speed};

/// The `policy` of a response: the policy the request was judged under;
/// `null` when the key's account has none for it, so the shipped
/// thresholds judged.
#[derive(Clone, Debug, Serialize, ToSchema)]
#[schema(as = Policy)]
pub struct PolicyBody {
    /// The policy's id (`moderato policies list`, or the dashboard's Policies page).
    id: String,
    name: String,
    /// 1 when made, one more at every change.
    #[schema(minimum = 1)]
    version: u32,
    /// The text path the policy chose: `accurate` (both encoders, the
    /// default) or `fast` (the first stage alone). The response's `model`
    /// names the path that judged.
    #[schema(value_type = String, example = "accurate")]
    speed: Speed,
}

impl PolicyBody {
    /// The body's `policy` for `key`.
    pub fn of(key: &AuthenticatedKey) -> Option<PolicyBody> {
        key.0.policy.as_ref().map(|p| PolicyBody {
            id: p.id.to_string(),
            name: p.name.clone(),
            version: p.version,
            speed: p.speed,
        })
    }
}

/// The text path `key` is judged on: its policy's speed, else the default.
pub fn key_speed(key: &AuthenticatedKey) -> Speed {
    key.0.policy.as_ref().map(|p| p.speed).unwrap_or_default()
}

/// How a route names the field an item came from, for error messages:
/// `input[3].text` on `/v1/moderate`, `input[3]` or
/// `input[3].image_url.url` on `/v1/moderations`.
pub type FieldName<'a> = &'a (dyn Fn(usize, ItemKind) -> String + Sync);

/// What an item is, without its content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemKind {
    Text,
    Image,
}

impl ItemKind {
    pub fn of(item: &Item) -> ItemKind {
        match item {
            Item::Text(_) => ItemKind::Text,
            Item::Image(_) => ItemKind::Image,
        }
    }
}

/// A request's items, moderated.
pub struct Scored {
    moderation: Moderation,
    stats: UsageStats,
    characters: Option<Decision>,
}

impl Scored {
    /// The route's body, written by `body` from the moderation, as the
    /// response, with the character allowance's headers and the counts the
    /// metering layer records.
    pub fn respond<B: Serialize>(self, body: impl FnOnce(Moderation) -> B) -> Response {
        let mut response = Json(body(self.moderation)).into_response();
        if let Some(decision) = self.characters {
            add_character_headers(&mut response, &decision);
        }
        response.extensions_mut().insert(self.stats);
        response
    }
}

/// Checks `items` against the limits and the key's character allowance,
/// then moderates them. `Ok(Err(response))` is a refusal (429) that is
/// already a response, carrying its usage counts.
pub async fn moderate(
    state: &AppState,
    key: &AuthenticatedKey,
    items: Vec<Item>,
    analyze_images: bool,
    explain: Explain,
    field: FieldName<'_>,
) -> Result<Result<Scored, Response>, ApiError> {
    let mut stats = validate(&items, field, &state.limits, &state.budget)?;
    let characters = match charge_characters(state, key, stats.text_chars).await? {
        Ok(decision) => decision,
        Err(refused) => {
            stats.rate_limited = true;
            let mut response = refused.into_response();
            response.extensions_mut().insert(stats);
            return Ok(Err(response));
        }
    };
    let kinds: Vec<ItemKind> = items.iter().map(ItemKind::of).collect();
    // Reading images is paid for from the character allowance before
    // each part of it is done (`ocr.charge_per_megapixel_*`), read or not.
    let payer = Arc::new(AllowancePayer {
        state: state.clone(),
        bucket: key.1.characters.clone(),
        last: std::sync::Mutex::default(),
    });
    let requester = Requester::new(tenant_of(key), payer.clone());
    // The key's policy as read with the key (at most the key cache's TTL
    // old), the same one the response names.
    let rules = key.0.policy.as_ref().map(|p| p.rules).unwrap_or_default();
    let speed = key_speed(key);
    let moderated = state
        .engine
        .moderate_with(items, analyze_images, &rules, speed, explain, &requester)
        .await;
    let moderation = moderated.map_err(|error| engine_error(error, &kinds, field))?;
    // Text read in images is known only once read: it counts as text
    // scored, and is charged to the allowance after the fact (the request
    // is answered; the next ones wait for it). The reading's work, paid
    // already, counts in the usage's characters too.
    let read = moderation.image_text_chars();
    let work = state
        .engine
        .ocr_charge(&requester.work())
        .unwrap_or_default();
    stats.text_chars += read + work;
    // The headers say what is left after the last charge.
    let characters = charge_read_characters(state, key, read)
        .await
        .or_else(|| payer.last())
        .or(characters);
    count_scored(&stats, &moderation);
    stats.flagged = moderation.flagged;
    stats.deep_analyses = moderation.deep_analyses;
    stats.image_bytes = moderation
        .items
        .iter()
        .map(|o| match o {
            ItemOutcome::Image { bytes, .. } => *bytes as u64,
            ItemOutcome::Text { .. } => 0,
        })
        .sum();
    Ok(Ok(Scored {
        moderation,
        stats,
        characters,
    }))
}

/// What was scored and what was flagged, for the metrics.
fn count_scored(stats: &UsageStats, moderation: &Moderation) {
    use crate::metrics::names;
    metrics::counter!(names::ITEMS_SCORED, "kind" => "text").increment(u64::from(stats.text_items));
    metrics::counter!(names::ITEMS_SCORED, "kind" => "image")
        .increment(u64::from(stats.image_items));
    metrics::counter!(names::CHARACTERS_SCORED).increment(stats.text_chars);
    for outcome in &moderation.items {
        let verdict = outcome.verdict();
        for category in Category::ALL {
            if verdict.categories[category.index()] {
                metrics::counter!(names::FLAGGED, "category" => category.as_str()).increment(1);
            }
        }
    }
}

/// Counts the request's text characters against the allowance per minute
/// its key draws on (its account's, for a customer's key), beside the
/// requests per minute the auth layer counts. `Err` is a request that can
/// never fit (413); `Ok(Err)` a 429 to answer now; `Ok(Ok(None))` a request
/// without text.
async fn charge_characters(
    state: &AppState,
    key: &AuthenticatedKey,
    chars: u64,
) -> Result<Result<Option<Decision>, ApiError>, ApiError> {
    if chars == 0 {
        return Ok(Ok(None));
    }
    let AuthenticatedKey(record, allowance) = key;
    let bucket = &allowance.characters;
    let per_minute = bucket.per_minute;
    if chars > u64::from(per_minute) {
        let whose = match record.owner {
            KeyOwner::Operator => "this key's",
            KeyOwner::Account { .. } => "this account's",
        };
        return Err(ApiError::PayloadTooLarge(format!(
            "input: {chars} characters of text is more than {whose} allowance of {per_minute} characters per minute ({} plan); send less text per request",
            record.tier
        )));
    }
    let decision = state
        .limiter
        .check_n(&bucket.name, per_minute, chars as u32)
        .await;
    Ok(if decision.allowed {
        Ok(Some(decision))
    } else {
        Err(ApiError::RateLimited {
            retry_after: decision.retry_after,
        })
    })
}

/// Whose turn a request's heavy jobs take in the lane: its account, or an
/// operator key itself.
fn tenant_of(key: &AuthenticatedKey) -> Tenant {
    match &key.0.owner {
        KeyOwner::Account { id, .. } => Tenant::new(format!("account:{id}")),
        KeyOwner::Operator => Tenant::new(format!("key:{}", key.0.id)),
    }
}

/// Pays for OCR work from a key's character allowance (its account's,
/// for a customer's key), through the rate limiter shared by replicas.
struct AllowancePayer {
    state: AppState,
    bucket: Bucket,
    /// The limiter's answer to the last payment, for the response's headers.
    last: std::sync::Mutex<Option<Decision>>,
}

impl AllowancePayer {
    fn last(&self) -> Option<Decision> {
        *self.last.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait::async_trait]
impl OcrPayer for AllowancePayer {
    async fn pay(&self, chars: u64) -> bool {
        let Ok(cost) = u32::try_from(chars) else {
            return false;
        };
        if cost > self.bucket.per_minute {
            return false;
        }
        let decision = self
            .state
            .limiter
            .check_n(&self.bucket.name, self.bucket.per_minute, cost)
            .await;
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(decision);
        decision.allowed
    }
}

/// Charges `chars` read from images to the key's character allowance. The
/// limiter takes no charge larger than the room left, so at most that room
/// is charged (the allowance is then empty). `None`: nothing read.
async fn charge_read_characters(
    state: &AppState,
    key: &AuthenticatedKey,
    chars: u64,
) -> Option<Decision> {
    if chars == 0 {
        return None;
    }
    let bucket = &key.1.characters;
    let cost = u32::try_from(chars)
        .unwrap_or(u32::MAX)
        .min(bucket.per_minute);
    let decision = state
        .limiter
        .check_n(&bucket.name, bucket.per_minute, cost)
        .await;
    if decision.allowed || decision.remaining == 0 {
        return Some(decision);
    }
    let rest = cost.min(decision.remaining);
    Some(
        state
            .limiter
            .check_n(&bucket.name, bucket.per_minute, rest)
            .await,
    )
}

/// The character allowance, beside the `X-RateLimit-*` request headers.
fn add_character_headers(response: &mut Response, decision: &Decision) {
    let headers = response.headers_mut();
    for (name, value) in [
        ("x-ratelimit-limit-characters", decision.limit),
        ("x-ratelimit-remaining-characters", decision.remaining),
    ] {
        headers.insert(name, axum::http::HeaderValue::from(value));
    }
}

/// The limits on items, per-item characters, images and the request's
/// characters in all; the counts for metering.
fn validate(
    items: &[Item],
    field: FieldName<'_>,
    limits: &Limits,
    budget: &BudgetConfig,
) -> Result<UsageStats, ApiError> {
    if items.is_empty() {
        return Err(ApiError::InvalidRequest(
            "input: must contain at least one item".into(),
        ));
    }
    if items.len() > limits.max_items {
        return Err(ApiError::PayloadTooLarge(format!(
            "input: {} items is more than the limit of {}",
            items.len(),
            limits.max_items
        )));
    }
    let mut stats = UsageStats::default();
    for (index, item) in items.iter().enumerate() {
        match item {
            Item::Text(text) => {
                let chars = text.chars().count();
                if chars > limits.max_text_chars {
                    return Err(ApiError::PayloadTooLarge(format!(
                        "{}: {chars} characters is more than the limit of {}",
                        field(index, ItemKind::Text),
                        limits.max_text_chars
                    )));
                }
                stats.text_items += 1;
                stats.text_chars += chars as u64;
                if stats.text_chars > budget.max_request_chars as u64 {
                    return Err(ApiError::PayloadTooLarge(format!(
                        "{}: the text items reach {} characters in all here, more than the limit of {} per request; split the text over several requests",
                        field(index, ItemKind::Text), stats.text_chars, budget.max_request_chars
                    )));
                }
            }
            Item::Image(_) => {
                stats.image_items += 1;
                if stats.image_items as usize > limits.max_images {
                    return Err(ApiError::PayloadTooLarge(format!(
                        "input[{index}]: more than the limit of {} image items",
                        limits.max_images
                    )));
                }
            }
        }
    }
    Ok(stats)
}

fn engine_error(error: EngineError, kinds: &[ItemKind], field: FieldName<'_>) -> ApiError {
    let name = |index: usize| match kinds.get(index) {
        Some(kind) => field(index, *kind),
        None => format!("input[{index}]"),
    };
    match error {
        EngineError::Image { index, error: ImageError::TooLarge(m) } => {
            ApiError::PayloadTooLarge(format!("{}: {m}", name(index)))
        }
        EngineError::Image { index, error: ImageError::Invalid(m) } => {
            ApiError::InvalidImage(format!("{}: {m}", name(index)))
        }
        EngineError::Fetch { index, error } => fetch_error(&name(index), error),
        EngineError::TooManyPixels { pixels, limit } => ApiError::PayloadTooLarge(format!(
            "input: the images have {pixels} pixels in all; the limit is {limit} pixels per request"
        )),
        EngineError::DeadlineExceeded(deadline) => ApiError::Overloaded(format!(
            "the request was not finished within its deadline of {} ms and was cancelled; send fewer or shorter items, or retry later",
            deadline.as_millis()
        )),
        EngineError::Busy(wait) => ApiError::Overloaded(format!(
            "no memory to decode the images became free within {} ms; retry shortly or send smaller images",
            wait.as_millis()
        )),
        EngineError::ImagesDisabled { index } => ApiError::InvalidRequest(format!(
            "input[{index}]: image items are not accepted because this server has no image classifier configured"
        )),
        EngineError::Classifier(e) => ApiError::Internal(format!("classifier: {e:#}")),
        // Try again when the allowance has refilled: a minute at most.
        EngineError::OcrAllowanceSpent { .. } => ApiError::RateLimited {
            retry_after: std::time::Duration::from_secs(60),
        },
    }
}

/// A remote image URL refused or not fetched, as the client sees it, named
/// by `field`. Off by the operator's choice stays the request error it was
/// before fetching existed (like image items with no image classifier);
/// over the size limit is 413 like an inline image over it; a full fetch
/// pool is ours to fix (503); everything else is about the image the client
/// pointed to (400 `invalid_image`): a host that is not allowed, not public,
/// slow, failing or serving something else. Never 5xx for those: retrying
/// the same URL would not help.
pub fn fetch_error(field: &str, error: FetchError) -> ApiError {
    let message = format!("{field}: {error}");
    match error {
        FetchError::Disabled => ApiError::InvalidRequest(message),
        FetchError::TooLarge { .. } => ApiError::PayloadTooLarge(message),
        FetchError::Busy { .. } => ApiError::Overloaded(message),
        _ => ApiError::InvalidImage(message),
    }
}

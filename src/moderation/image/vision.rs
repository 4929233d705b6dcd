//! The deep image analysis by a third-party vision model (OpenAI-compatible
//! Chat Completions).
//!
//! Every answer is untrusted: see [`answer`]. Every request is bounded: the
//! whole [`VisionClient::analyze`] call returns within `timeout_ms`, however
//! the provider behaves, and each image gets its own status.

mod answer;
mod breaker;
mod flights;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use bytes::Bytes;
use futures::future::FutureExt as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tokio::sync::Semaphore;
use tokio::time::{timeout_at, Instant};

use self::answer::{AnswerError, ProviderVerdict};
use self::breaker::Breaker;
use self::flights::{Digest, Flights, Lookup, Outcome};
use super::decode::ImageFormat;

/// Longest provider answer we read: a verdict is a few hundred bytes, and an
/// untrusted server must not make us buffer without bound.
const MAX_ANSWER_BYTES: usize = 1024 * 1024;

/// Of an error answer we only need the start, for the excerpt.
const MAX_ERROR_BODY_BYTES: usize = 4 * 1024;

/// Pause before a retry, so a briefly overloaded provider gets a breath.
const RETRY_BACKOFF: Duration = Duration::from_millis(100);

/// Upper bounds on the settings, against typos that would otherwise mean
/// "wait an hour" or "a million connections".
const MAX_TIMEOUT_MS: u64 = 600_000;
const MAX_CONCURRENCY: usize = 1024;
const MAX_RETRIES: u32 = 10;
const MAX_CACHE_ENTRIES: usize = 1_000_000;

/// Operator configuration of the provider. Absent base URL and model means
/// "no provider configured": images never leave the machine.
/// Its defaults are in `config/default.toml`, like every setting's.
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct VisionSettings {
    #[serde(default)]
    pub base_url: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    /// Secret: never logged, never serialised back out.
    #[serde(default, skip_serializing)]
    pub api_key: Option<String>,
    /// Send `response_format: json_schema` (strict). Some servers reject it.
    pub structured_output: bool,
    /// Bound on the whole deep analysis of one request.
    pub timeout_ms: u64,
    /// Provider calls in flight at once, across all requests.
    pub max_concurrency: usize,
    /// Extra attempts after a transient failure, while time remains.
    pub retries: u32,
    /// Consecutive failed calls that open the circuit; 0 disables it.
    pub breaker_failures: u32,
    /// How long an open circuit refuses calls before one trial.
    pub breaker_cooldown_ms: u64,
    /// How long a successful analysis is reused for identical image bytes.
    pub cache_ttl_ms: u64,
    /// Cached analyses kept (least recently used evicted); 0 disables the cache.
    pub cache_entries: usize,
}

impl VisionSettings {
    /// Everything the types cannot check; `Config::validate` calls it, so a
    /// bad setting stops the service at start-up with this message.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.provider().map(drop)
    }

    /// The provider's endpoint and model, or `None` when none is configured.
    fn provider(&self) -> anyhow::Result<Option<(reqwest::Url, &str)>> {
        let (base_url, model) = match (non_empty(&self.base_url), non_empty(&self.model)) {
            (None, None) => return Ok(None),
            (Some(base_url), Some(model)) => (base_url, model),
            _ => bail!(
                "vision: set both base_url and model to enable the deep image analysis, or neither"
            ),
        };
        validate_limits(self)?;
        let endpoint = endpoint(base_url)?;
        if let Some(key) = non_empty(&self.api_key) {
            if reqwest::header::HeaderValue::from_str(&format!("Bearer {key}")).is_err() {
                bail!("vision: api_key contains characters not allowed in an HTTP header");
            }
        }
        Ok(Some((endpoint, model)))
    }
}

/// By hand, so that the API key never reaches a log.
impl fmt::Debug for VisionSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VisionSettings")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .field("structured_output", &self.structured_output)
            .field("timeout_ms", &self.timeout_ms)
            .field("max_concurrency", &self.max_concurrency)
            .field("retries", &self.retries)
            .field("breaker_failures", &self.breaker_failures)
            .field("breaker_cooldown_ms", &self.breaker_cooldown_ms)
            .field("cache_ttl_ms", &self.cache_ttl_ms)
            .field("cache_entries", &self.cache_entries)
            .finish()
    }
}

/// Outcome of the deep analysis for one image item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AnalysisStatus {
    Completed,
    Failed,
    NotRequested,
    Unavailable,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AnalysisError {
    pub code: String,
    pub message: String,
}

/// The `image_analysis` object of an image result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ImageAnalysis {
    pub status: AnalysisStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Only the categories the provider evaluated, each in [0, 1].
    pub category_scores: BTreeMap<String, f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rationale: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<AnalysisError>,
}

impl ImageAnalysis {
    pub fn with_status(status: AnalysisStatus) -> ImageAnalysis {
        ImageAnalysis {
            status,
            model: None,
            category_scores: BTreeMap::new(),
            rationale: None,
            error: None,
        }
    }
}

/// One image to analyse.
#[derive(Clone, Debug)]
pub struct VisionImage {
    pub format: ImageFormat,
    pub bytes: Bytes,
}

/// Why the analysis of one image failed. The `Display` text is shown to API
/// clients, so it never carries the provider's body beyond a sanitised
/// excerpt, nor URLs or keys.
#[derive(Clone, Debug, thiserror::Error)]
enum Failure {
    #[error("the deep analysis did not finish within {0} ms")]
    Timeout(u64),
    #[error("the provider answered HTTP {status}{}", excerpt_suffix(.excerpt))]
    Provider { status: u16, excerpt: String },
    #[error("invalid answer from the provider: {0}")]
    InvalidResponse(#[from] AnswerError),
    #[error("could not connect to the provider")]
    Connection {
        /// For the log only: may name hosts and addresses.
        detail: String,
    },
    #[error("the provider is failing; calls are paused for a while")]
    CircuitOpen,
    /// Our fault, not the provider's (the analysis task panicked or was
    /// cancelled at shutdown): never retried, never counted by the breaker.
    #[error("the deep analysis failed inside the service")]
    Internal {
        /// For the log only.
        detail: String,
    },
}

fn excerpt_suffix(excerpt: &str) -> String {
    if excerpt.is_empty() {
        String::new()
    } else {
        format!(": {excerpt}")
    }
}

impl Failure {
    fn code(&self) -> &'static str {
        match self {
            Failure::Timeout(_) => "timeout",
            Failure::Provider { .. } => "provider_error",
            Failure::InvalidResponse(_) => "invalid_response",
            Failure::Connection { .. } => "connection_failed",
            Failure::CircuitOpen => "circuit_open",
            Failure::Internal { .. } => "internal_error",
        }
    }

    /// Worth another attempt: the same request may well succeed.
    fn is_transient(&self) -> bool {
        match self {
            Failure::Timeout(_) | Failure::Connection { .. } => true,
            Failure::Provider { status, .. } => *status >= 500 || *status == 429 || *status == 408,
            Failure::InvalidResponse(_) | Failure::CircuitOpen | Failure::Internal { .. } => false,
        }
    }

    /// Says the provider is down or refusing us. An answer we cannot use
    /// still shows the provider is up, so it does not trip the breaker.
    fn is_provider_fault(&self) -> bool {
        !matches!(
            self,
            Failure::InvalidResponse(_) | Failure::CircuitOpen | Failure::Internal { .. }
        )
    }
}

/// Client for the configured provider. Cheap to clone and shared by all
/// requests: the concurrency limit, breaker and cache are shared too.
#[derive(Clone)]
pub struct VisionClient {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    endpoint: reqwest::Url,
    model: String,
    api_key: Option<String>,
    structured_output: bool,
    timeout: Duration,
    retries: u32,
    permits: Semaphore,
    breaker: Breaker,
    flights: Flights,
}

impl fmt::Debug for VisionClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VisionClient")
            .field("endpoint", &self.inner.endpoint.as_str())
            .field("model", &self.inner.model)
            .finish_non_exhaustive()
    }
}

impl VisionClient {
    /// `Ok(None)` when no provider is configured (neither base URL nor
    /// model); an error when only one of them is set or a setting is out of
    /// range, so that a half-done configuration is noticed at startup.
    pub fn from_settings(settings: &VisionSettings) -> anyhow::Result<Option<VisionClient>> {
        let Some((endpoint, model)) = settings.provider()? else {
            return Ok(None);
        };
        let api_key = non_empty(&settings.api_key).map(str::to_owned);
        let timeout = Duration::from_millis(settings.timeout_ms);
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            // A redirect could carry the key and the image somewhere unplanned.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("moderato/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("vision: building the HTTP client")?;
        Ok(Some(VisionClient {
            inner: Arc::new(Inner {
                http,
                endpoint,
                model: model.to_owned(),
                api_key,
                structured_output: settings.structured_output,
                timeout,
                retries: settings.retries,
                permits: Semaphore::new(settings.max_concurrency),
                breaker: Breaker::new(
                    settings.breaker_failures,
                    Duration::from_millis(settings.breaker_cooldown_ms),
                ),
                flights: Flights::new(
                    settings.cache_entries,
                    Duration::from_millis(settings.cache_ttl_ms),
                ),
            }),
        }))
    }

    /// Analyses every image within the configured overall timeout. Never
    /// fails as a whole: each image gets its own status. Returns one entry per
    /// input, in order.
    pub async fn analyze(&self, images: Vec<VisionImage>) -> Vec<ImageAnalysis> {
        let deadline = Instant::now() + self.inner.timeout;
        futures::future::join_all(
            images
                .into_iter()
                .map(|image| self.analyze_one(image, deadline)),
        )
        .await
    }

    async fn analyze_one(&self, image: VisionImage, deadline: Instant) -> ImageAnalysis {
        let digest: Digest = Sha256::digest(&image.bytes).into();
        let outcome = match self
            .inner
            .flights
            .lookup_or_start(digest, || self.start_flight(digest, image))
        {
            Lookup::Cached(verdict) => Ok(verdict),
            Lookup::InFlight(pending) => match timeout_at(deadline, pending).await {
                Ok(outcome) => outcome,
                Err(_) => {
                    let failure = Failure::Timeout(self.inner.timeout.as_millis() as u64);
                    tracing::warn!(image = %short_hash(&digest), code = failure.code(), "vision analysis: {failure}");
                    Err(failure)
                }
            },
        };
        self.to_analysis(outcome)
    }

    /// Runs the provider calls for one image on their own task, so that the
    /// flight outlives a request that gives up on it: others may be waiting,
    /// and its result still fills the cache. The flight has its own
    /// `timeout_ms` budget, so it never outlives that either.
    fn start_flight(&self, digest: Digest, image: VisionImage) -> flights::Pending {
        let inner = Arc::clone(&self.inner);
        let task = tokio::spawn(async move {
            let outcome = std::panic::AssertUnwindSafe(inner.fly(digest, image))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    let failure = Failure::Internal {
                        detail: "the analysis task panicked".into(),
                    };
                    log_failure(&digest, 0, &failure);
                    Err(failure)
                });
            inner.flights.finish(digest, &outcome);
            outcome
        });
        task.map(|joined| {
            joined.unwrap_or_else(|_| {
                Err(Failure::Internal {
                    detail: "the analysis task was cancelled".into(),
                })
            })
        })
        .boxed()
        .shared()
    }

    fn to_analysis(&self, outcome: Outcome) -> ImageAnalysis {
        let label = match &outcome {
            Ok(_) => "completed",
            Err(failure) => failure.code(),
        };
        metrics::counter!(crate::metrics::names::VISION_CALLS, "outcome" => label).increment(1);
        let model = Some(self.inner.model.clone());
        match outcome {
            Ok(verdict) => ImageAnalysis {
                status: AnalysisStatus::Completed,
                model,
                category_scores: verdict.scores.clone(),
                rationale: verdict.rationale.clone(),
                error: None,
            },
            Err(failure) => ImageAnalysis {
                model,
                error: Some(AnalysisError {
                    code: failure.code().to_owned(),
                    message: failure.to_string(),
                }),
                ..ImageAnalysis::with_status(AnalysisStatus::Failed)
            },
        }
    }
}

impl Inner {
    /// All attempts for one image, within one `timeout_ms` budget.
    async fn fly(&self, digest: Digest, image: VisionImage) -> Outcome {
        let deadline = Instant::now() + self.timeout;
        let body = match serde_json::to_vec(&answer::request_body(
            &self.model,
            &image,
            self.structured_output,
        )) {
            Ok(body) => Bytes::from(body),
            Err(e) => {
                return Err(Failure::Internal {
                    detail: format!("serialising the request: {e}"),
                })
            }
        };
        drop(image);
        match timeout_at(deadline, self.attempts(&digest, body, deadline)).await {
            Ok(outcome) => outcome,
            Err(_) => {
                let failure = Failure::Timeout(self.timeout.as_millis() as u64);
                tracing::warn!(image = %short_hash(&digest), code = failure.code(), "vision analysis: {failure}");
                Err(failure)
            }
        }
    }

    async fn attempts(&self, digest: &Digest, body: Bytes, deadline: Instant) -> Outcome {
        let mut attempt = 0;
        loop {
            match self.attempt(body.clone()).await {
                Ok(verdict) => return Ok(Arc::new(verdict)),
                Err(failure) => {
                    log_failure(digest, attempt, &failure);
                    let time_left = deadline.saturating_duration_since(Instant::now());
                    if !failure.is_transient()
                        || attempt >= self.retries
                        || time_left <= RETRY_BACKOFF
                    {
                        return Err(failure);
                    }
                }
            }
            attempt += 1;
            tokio::time::sleep(RETRY_BACKOFF).await;
        }
    }

    /// One call to the provider, once a concurrency slot is free and the
    /// breaker allows it.
    async fn attempt(&self, body: Bytes) -> Result<ProviderVerdict, Failure> {
        // The semaphore is never closed, so this cannot fail.
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| Failure::CircuitOpen)?;
        let ticket = self.breaker.try_call().ok_or(Failure::CircuitOpen)?;
        let result = self.call(body).await;
        match &result {
            Err(failure) if failure.is_provider_fault() => ticket.failure(),
            _ => ticket.success(),
        }
        result
    }

    async fn call(&self, body: Bytes) -> Result<ProviderVerdict, Failure> {
        let mut request = self
            .http
            .post(self.endpoint.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let mut response = request
            .send()
            .await
            .map_err(|e| self.transport_failure(e))?;
        let status = response.status();
        if !status.is_success() {
            let start = read_capped(&mut response, MAX_ERROR_BODY_BYTES)
                .await
                .unwrap_or_default();
            let excerpt = answer::sanitize_excerpt(&start, self.api_key.as_deref());
            return Err(Failure::Provider {
                status: status.as_u16(),
                excerpt,
            });
        }
        let body = read_capped(&mut response, MAX_ANSWER_BYTES)
            .await
            .map_err(|e| self.transport_failure(e))?;
        if body.len() >= MAX_ANSWER_BYTES {
            return Err(Failure::InvalidResponse(AnswerError::TooLarge(
                MAX_ANSWER_BYTES,
            )));
        }
        Ok(answer::parse_completion(&body)?)
    }

    fn transport_failure(&self, error: reqwest::Error) -> Failure {
        if error.is_timeout() {
            return Failure::Timeout(self.timeout.as_millis() as u64);
        }
        // The URL may hold credentials (user info, a key in the query).
        Failure::Connection {
            detail: error_chain(&error.without_url()),
        }
    }
}

/// Up to `limit` bytes of the body; stops reading there.
async fn read_capped(
    response: &mut reqwest::Response,
    limit: usize,
) -> Result<Vec<u8>, reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = limit - body.len();
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= limit {
            break;
        }
    }
    Ok(body)
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn log_failure(digest: &Digest, attempt: u32, failure: &Failure) {
    let image = short_hash(digest);
    match failure {
        // Logged once, when the circuit opens, not once per refused image.
        Failure::CircuitOpen => {
            tracing::debug!(image = %image, "vision analysis skipped: circuit open")
        }
        Failure::Connection { detail } => {
            tracing::warn!(image = %image, attempt, code = failure.code(), "vision analysis: {failure}: {detail}")
        }
        Failure::Internal { detail } => {
            tracing::error!(image = %image, attempt, code = failure.code(), "vision analysis: {failure}: {detail}")
        }
        _ => {
            tracing::warn!(image = %image, attempt, code = failure.code(), "vision analysis: {failure}")
        }
    }
}

/// Enough of the image's SHA-256 to find it in logs; never the bytes.
fn short_hash(digest: &Digest) -> String {
    hex::encode(&digest[..6])
}

fn non_empty(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

fn endpoint(base_url: &str) -> anyhow::Result<reqwest::Url> {
    let url = reqwest::Url::parse(&format!(
        "{}/chat/completions",
        base_url.trim_end_matches('/')
    ))
    .context("vision: base_url is not a valid URL")?;
    if !matches!(url.scheme(), "http" | "https") {
        bail!("vision: base_url must be an http:// or https:// URL");
    }
    if url.query().is_some() || url.fragment().is_some() {
        bail!("vision: base_url must not have a query or fragment");
    }
    Ok(url)
}

fn validate_limits(settings: &VisionSettings) -> anyhow::Result<()> {
    if !(1..=MAX_TIMEOUT_MS).contains(&settings.timeout_ms) {
        bail!("vision: timeout_ms must be between 1 and {MAX_TIMEOUT_MS}");
    }
    if !(1..=MAX_CONCURRENCY).contains(&settings.max_concurrency) {
        bail!("vision: max_concurrency must be between 1 and {MAX_CONCURRENCY}");
    }
    if settings.retries > MAX_RETRIES {
        bail!("vision: retries must be at most {MAX_RETRIES}");
    }
    if settings.cache_entries > MAX_CACHE_ENTRIES {
        bail!("vision: cache_entries must be at most {MAX_CACHE_ENTRIES}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configured() -> VisionSettings {
        VisionSettings {
            base_url: Some("http://127.0.0.1:9/v1/".into()),
            model: Some("m".into()),
            ..crate::config::Config::embedded_defaults().vision
        }
    }

    #[test]
    fn no_provider_means_no_client() {
        assert!(
            VisionClient::from_settings(&crate::config::Config::embedded_defaults().vision)
                .unwrap()
                .is_none()
        );
        let blank = VisionSettings {
            base_url: Some(" ".into()),
            model: Some("".into()),
            ..crate::config::Config::embedded_defaults().vision
        };
        assert!(VisionClient::from_settings(&blank).unwrap().is_none());
    }

    #[test]
    fn half_configured_or_out_of_range_is_an_error() {
        let only_url = VisionSettings {
            model: None,
            ..configured()
        };
        assert!(VisionClient::from_settings(&only_url).is_err());
        assert!(VisionClient::from_settings(&VisionSettings {
            max_concurrency: 0,
            ..configured()
        })
        .is_err());
        assert!(VisionClient::from_settings(&VisionSettings {
            timeout_ms: 0,
            ..configured()
        })
        .is_err());
        let ftp = VisionSettings {
            base_url: Some("ftp://host/v1".into()),
            ..configured()
        };
        assert!(VisionClient::from_settings(&ftp).is_err());
        let bad_key = VisionSettings {
            api_key: Some("a\nb".into()),
            ..configured()
        };
        assert!(VisionClient::from_settings(&bad_key).is_err());
    }

    #[test]
    fn endpoint_tolerates_a_trailing_slash() {
        assert_eq!(
            endpoint("https://api.example.com/v1/").unwrap().as_str(),
            "https://api.example.com/v1/chat/completions"
        );
        assert_eq!(
            endpoint("https://api.example.com/v1").unwrap().as_str(),
            "https://api.example.com/v1/chat/completions"
        );
    }

    #[test]
    fn debug_redacts_the_key() {
        let settings = VisionSettings {
            api_key: Some("sk-very-secret".into()),
            ..configured()
        };
        let shown = format!("{settings:?}");
        assert!(!shown.contains("sk-very-secret"));
        assert!(shown.contains("[redacted]"));
        let client = VisionClient::from_settings(&settings).unwrap().unwrap();
        assert!(!format!("{client:?}").contains("sk-very-secret"));
    }

    #[test]
    fn failure_messages_and_codes() {
        let failure = Failure::Provider {
            status: 503,
            excerpt: "overloaded".into(),
        };
        assert_eq!(failure.code(), "provider_error");
        assert_eq!(
            failure.to_string(),
            "the provider answered HTTP 503: overloaded"
        );
        assert!(failure.is_transient());
        assert!(!Failure::Provider {
            status: 400,
            excerpt: String::new()
        }
        .is_transient());
        let connection = Failure::Connection {
            detail: "10.0.0.1 refused".into(),
        };
        assert!(!connection.to_string().contains("10.0.0.1"));
    }
}

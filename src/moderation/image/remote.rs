//! Remote image URLs (`https://...` on `/v1/moderations`): an image source
//! the operator opts into. Off by default, because a server that fetches
//! what any client names can be made to connect anywhere (server-side
//! request forgery).
//!
//! When on, a URL is fetched only if
//! - its scheme is https (or http, if the operator allows it) and it carries
//!   no user name or password,
//! - its host is on the operator's allow-list (checked before any DNS
//!   look-up or connection),
//! - every address the host resolves to is public ([`is_public`]); the
//!   connection goes only to the addresses that were checked (our own
//!   resolver hands them to the HTTP client, so a second, rebinding look-up
//!   never happens), and an IP-literal host is checked directly,
//! - and the same holds for each of at most [`MAX_REDIRECTS`] redirects.
//!
//! A fetch is bounded in time (`timeout_ms`, connection to last byte), in
//! size (`max_bytes`, refused by `Content-Length` before the body is read
//! and cut off while streaming) and in number (`max_concurrent_fetches` in
//! the process). The bytes then go through exactly the validation of an
//! inline image.

mod address;

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bytes::{Bytes, BytesMut};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::Url;
use serde::Deserialize;
use tokio::sync::Semaphore;

pub use address::is_public;

use super::decode::ImageLimits;

/// Redirects followed, each checked as the first URL was: enough for a CDN's
/// canonical-URL hop, too few to bounce around.
pub const MAX_REDIRECTS: usize = 3;

/// Upper bounds on the settings, against typos.
pub const MAX_TIMEOUT_MS: u64 = 60_000;
pub const MAX_CONCURRENT_FETCHES: usize = 1024;

/// The operator's `[remote_images]` settings (defaults in
/// `config/default.toml`, checked by `Config::validate`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteImageSettings {
    /// Off: every remote URL is refused with a 400 that says so.
    pub enabled: bool,
    /// Hosts images are fetched from; empty: none.
    pub allowed_hosts: Vec<AllowedHost>,
    /// Largest image fetched; unset: `limits.image.max_bytes`, which is also
    /// its ceiling.
    pub max_bytes: Option<usize>,
    /// Time for one whole fetch, from connecting to the last byte.
    pub timeout_ms: u64,
    /// Fetches in flight at once in the process.
    pub max_concurrent_fetches: usize,
    /// Whether plain-http URLs are fetched (https only when false).
    pub allow_http: bool,
}

/// An entry of `allowed_hosts`: a host name (or IP address) matched
/// exactly, or `*.example.com` for every subdomain of example.com (not
/// example.com itself).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum AllowedHost {
    Exact(String),
    Subdomains(String),
}

impl AllowedHost {
    fn matches(&self, host: &str) -> bool {
        match self {
            AllowedHost::Exact(name) => host == name,
            // `parent` keeps its leading dot: `.example.com`.
            AllowedHost::Subdomains(parent) => host
                .strip_suffix(parent.as_str())
                .is_some_and(|label| !label.is_empty()),
        }
    }
}

impl TryFrom<String> for AllowedHost {
    type Error = String;

    fn try_from(text: String) -> Result<AllowedHost, String> {
        let invalid = || {
            format!(
                "remote_images.allowed_hosts: {text:?} is not a host name or IP address (such as images.example.com, *.example.com or 203.0.113.7)"
            )
        };
        let lower = text.trim().to_ascii_lowercase();
        let (wildcard, name) = match lower.strip_prefix("*.") {
            Some(rest) => (true, normalise_host(rest)),
            None => (false, normalise_host(&lower)),
        };
        let host = match name.parse::<IpAddr>() {
            Ok(IpAddr::V6(v6)) => format!("[{v6}]"),
            Ok(IpAddr::V4(v4)) => v4.to_string(),
            // A path, a port, user info or a second wildcard: not a host.
            Err(_) if name.is_empty() || name.contains(['/', '\\', '@', ':', '?', '#', '*']) => {
                return Err(invalid())
            }
            Err(_) => name,
        };
        // The URL parser's own reading of it (punycode, IPv4 spelt out), so
        // that entries compare with what it makes of a client's URL.
        let parsed = Url::parse(&format!("https://{host}/")).map_err(|_| invalid())?;
        let parsed = parsed.host_str().map(normalise_host).ok_or_else(invalid)?;
        if wildcard && parsed.parse::<IpAddr>().is_ok() {
            return Err(invalid());
        }
        Ok(if wildcard {
            AllowedHost::Subdomains(format!(".{parsed}"))
        } else {
            AllowedHost::Exact(parsed)
        })
    }
}

/// A host as compared with the allow-list: without IPv6 brackets or a
/// trailing dot.
fn normalise_host(host: &str) -> String {
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.strip_suffix('.').unwrap_or(host).to_owned()
}

/// Why a remote image was not fetched. The text is shown to the client
/// after the field's name, so it names hosts at most: never a URL's path or
/// query (signed URLs carry secrets there), credentials or the addresses a
/// host resolved to.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error("remote image URLs are not fetched by this server; send the image inline as a data URL (data:image/png;base64,...), or ask the operator to enable fetching (remote_images.enabled)")]
    Disabled,
    #[error("not a valid URL ({0})")]
    InvalidUrl(String),
    #[error("{scheme} URLs are not fetched by this server; use an https URL or send the image inline as a data URL")]
    SchemeNotAllowed { scheme: String },
    #[error("URLs with a user name or password are refused; remove them from the URL or send the image inline as a data URL")]
    Credentials,
    #[error("the host {host} is not on this server's list of hosts it fetches images from; send the image inline as a data URL, or ask the operator to add the host to remote_images.allowed_hosts")]
    HostNotAllowed { host: String },
    #[error("the host {host} has an address that is not public (loopback, private, link-local or reserved); images are fetched only from public addresses")]
    NotPublic { host: String },
    #[error("the host {host} could not be resolved")]
    Unresolvable { host: String },
    #[error("could not connect to {host}")]
    Unreachable { host: String },
    #[error("the connection to {host} broke before the whole image arrived")]
    Interrupted { host: String },
    #[error("fetching the image did not finish within {ms} ms; use a faster host or send the image inline as a data URL")]
    TimedOut { ms: u64 },
    #[error("the image is larger than the limit of {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the image URL answered HTTP {status}; it must answer 2xx with the image")]
    Status { status: u16 },
    #[error("the image URL redirected more than {max} times", max = MAX_REDIRECTS)]
    TooManyRedirects,
    #[error("the image URL redirected to a URL that is refused: {0}")]
    Redirect(Box<FetchError>),
    #[error("no slot to fetch the image became free within {ms} ms; retry shortly or send the image inline as a data URL")]
    Busy { ms: u64 },
}

impl FetchError {
    /// The `outcome` label of the fetch metric.
    pub fn outcome(&self) -> &'static str {
        match self {
            FetchError::Disabled => "disabled",
            FetchError::InvalidUrl(_) => "invalid_url",
            FetchError::SchemeNotAllowed { .. } => "scheme_not_allowed",
            FetchError::Credentials => "credentials",
            FetchError::HostNotAllowed { .. } => "host_not_allowed",
            FetchError::NotPublic { .. } => "not_public",
            FetchError::Unresolvable { .. } => "unresolvable",
            FetchError::Unreachable { .. } => "unreachable",
            FetchError::Interrupted { .. } => "interrupted",
            FetchError::TimedOut { .. } => "timeout",
            FetchError::TooLarge { .. } => "too_large",
            FetchError::Status { .. } => "http_status",
            FetchError::TooManyRedirects => "too_many_redirects",
            FetchError::Redirect(inner) => inner.outcome(),
            FetchError::Busy { .. } => "busy",
        }
    }
}

/// Counts one remote image URL by what became of it.
fn record(outcome: &'static str) {
    metrics::counter!(crate::metrics::names::REMOTE_IMAGE_FETCHES, "outcome" => outcome)
        .increment(1);
}

/// Which addresses may be connected to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AddressPolicy {
    PublicOnly,
    /// The fetcher's own tests serve images from 127.0.0.1; no build the
    /// service runs from can ask for this.
    #[cfg(test)]
    LoopbackToo,
}

impl AddressPolicy {
    fn permits(self, address: IpAddr) -> bool {
        match self {
            AddressPolicy::PublicOnly => is_public(address),
            #[cfg(test)]
            AddressPolicy::LoopbackToo => is_public(address) || address.is_loopback(),
        }
    }
}

/// Remote image URLs as the operator configured them: refused, or checked
/// and fetched.
#[derive(Clone, Debug)]
pub enum RemoteImages {
    Disabled,
    Enabled(Fetcher),
}

impl RemoteImages {
    pub fn from_settings(
        settings: &RemoteImageSettings,
        image_limits: &ImageLimits,
    ) -> anyhow::Result<RemoteImages> {
        if !settings.enabled {
            return Ok(RemoteImages::Disabled);
        }
        let fetcher = Fetcher::new(settings, image_limits, AddressPolicy::PublicOnly)?;
        Ok(RemoteImages::Enabled(fetcher))
    }

    /// Checks a client's URL against the scheme, credentials, allow-list and
    /// (for an IP-literal host) address rules, with no DNS look-up and no
    /// connection: what may be fetched later, by [`RemoteImageUrl::fetch`].
    pub fn check(&self, url: &str) -> Result<RemoteImageUrl, FetchError> {
        let checked = match self {
            RemoteImages::Disabled => Err(FetchError::Disabled),
            RemoteImages::Enabled(fetcher) => fetcher.check(url),
        };
        if let Err(error) = &checked {
            record(error.outcome());
        }
        checked
    }
}

/// A URL that passed [`RemoteImages::check`], with the fetcher that checked
/// it: it can only be fetched under the rules it was checked against.
#[derive(Clone)]
pub struct RemoteImageUrl {
    url: Url,
    fetcher: Fetcher,
}

/// The host only: a path or query may carry a signature.
impl fmt::Debug for RemoteImageUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteImageUrl")
            .field("host", &host_of(&self.url))
            .finish_non_exhaustive()
    }
}

impl RemoteImageUrl {
    /// The image's bytes, within the time, size and concurrency limits.
    pub async fn fetch(&self) -> Result<Bytes, FetchError> {
        self.fetcher.fetch(&self.url).await
    }
}

/// Fetches checked URLs. Cheap to clone; clones share the client and the
/// concurrency bound.
#[derive(Clone)]
pub struct Fetcher {
    inner: Arc<FetcherInner>,
}

struct FetcherInner {
    http: reqwest::Client,
    rules: Arc<UrlRules>,
    max_bytes: usize,
    timeout: Duration,
    slots: Semaphore,
}

impl fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fetcher")
            .field("allowed_hosts", &self.inner.rules.allowed_hosts)
            .field("max_bytes", &self.inner.max_bytes)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

/// What a URL must satisfy: the first one and every redirect.
#[derive(Debug)]
struct UrlRules {
    allowed_hosts: Vec<AllowedHost>,
    allow_http: bool,
    addresses: AddressPolicy,
}

impl UrlRules {
    fn check(&self, url: &Url) -> Result<(), FetchError> {
        match url.scheme() {
            "https" => {}
            "http" if self.allow_http => {}
            other => {
                return Err(FetchError::SchemeNotAllowed {
                    scheme: other.to_owned(),
                })
            }
        }
        // Before anything that could echo the URL's host part.
        if !url.username().is_empty() || url.password().is_some() {
            return Err(FetchError::Credentials);
        }
        let host = host_of(url);
        if host.is_empty() {
            return Err(FetchError::InvalidUrl("it has no host".into()));
        }
        if !self
            .allowed_hosts
            .iter()
            .any(|allowed| allowed.matches(&host))
        {
            return Err(FetchError::HostNotAllowed { host });
        }
        // The resolver never sees an IP-literal host: judge it here. (The
        // URL parser has already turned 0x7f.1 or 2130706433 into 127.0.0.1.)
        if let Ok(address) = host.parse::<IpAddr>() {
            if !self.addresses.permits(address) {
                return Err(FetchError::NotPublic { host });
            }
        }
        Ok(())
    }
}

/// The URL's host as the allow-list compares it.
fn host_of(url: &Url) -> String {
    url.host_str().map(normalise_host).unwrap_or_default()
}

impl Fetcher {
    fn new(
        settings: &RemoteImageSettings,
        image_limits: &ImageLimits,
        addresses: AddressPolicy,
    ) -> anyhow::Result<Fetcher> {
        let rules = Arc::new(UrlRules {
            allowed_hosts: settings.allowed_hosts.clone(),
            allow_http: settings.allow_http,
            addresses,
        });
        let timeout = Duration::from_millis(settings.timeout_ms);
        let redirect_rules = Arc::clone(&rules);
        let redirects = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() > MAX_REDIRECTS {
                return attempt.error(FetchError::TooManyRedirects);
            }
            match redirect_rules.check(attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(refused) => attempt.error(FetchError::Redirect(Box::new(refused))),
            }
        });
        let http = reqwest::Client::builder()
            // An HTTP(S)_PROXY in the environment would connect for us, to
            // addresses we never checked.
            .no_proxy()
            .dns_resolver(Arc::new(CheckedResolver { addresses }))
            .redirect(redirects)
            .https_only(!settings.allow_http)
            // A redirect's Referer would hand the client's URL to another host.
            .referer(false)
            .connect_timeout(timeout)
            // No idle connections to client-named hosts: the concurrency
            // bound is then the bound on sockets.
            .pool_max_idle_per_host(0)
            .user_agent(concat!("moderato/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("remote_images: building the HTTP client")?;
        Ok(Fetcher {
            inner: Arc::new(FetcherInner {
                http,
                rules,
                max_bytes: effective_max_bytes(settings, image_limits),
                timeout,
                slots: Semaphore::new(settings.max_concurrent_fetches),
            }),
        })
    }

    fn check(&self, text: &str) -> Result<RemoteImageUrl, FetchError> {
        // The parser's messages never echo the input.
        let url = Url::parse(text).map_err(|e| FetchError::InvalidUrl(e.to_string()))?;
        self.inner.rules.check(&url)?;
        Ok(RemoteImageUrl {
            url,
            fetcher: self.clone(),
        })
    }

    async fn fetch(&self, url: &Url) -> Result<Bytes, FetchError> {
        let fetched = self.fetch_within_limits(url).await;
        match &fetched {
            Ok(_) => record("fetched"),
            Err(error) => {
                record(error.outcome());
                // Debug only: clients choose the URLs, so they could flood an
                // info log; the metric counts every outcome.
                tracing::debug!(host = %host_of(url), outcome = error.outcome(), "remote image not fetched");
            }
        }
        fetched
    }

    async fn fetch_within_limits(&self, url: &Url) -> Result<Bytes, FetchError> {
        let timeout = self.inner.timeout;
        let ms = timeout.as_millis() as u64;
        // The semaphore is never closed.
        let _slot = match tokio::time::timeout(timeout, self.inner.slots.acquire()).await {
            Ok(Ok(slot)) => slot,
            Ok(Err(_)) | Err(_) => return Err(FetchError::Busy { ms }),
        };
        tokio::time::timeout(timeout, self.get(url))
            .await
            .unwrap_or(Err(FetchError::TimedOut { ms }))
    }

    async fn get(&self, url: &Url) -> Result<Bytes, FetchError> {
        let max_bytes = self.inner.max_bytes;
        let failed = |error: reqwest::Error| classify(error, url);
        let mut response = self
            .inner
            .http
            .get(url.clone())
            .header(reqwest::header::ACCEPT, "image/*")
            .send()
            .await
            .map_err(failed)?;
        let status = response.status();
        if !status.is_success() {
            return Err(FetchError::Status {
                status: status.as_u16(),
            });
        }
        let too_large = FetchError::TooLarge { limit: max_bytes };
        let declared = response.content_length().unwrap_or(0);
        if declared > max_bytes as u64 {
            return Err(too_large);
        }
        let mut body = BytesMut::with_capacity(declared as usize);
        while let Some(chunk) = response.chunk().await.map_err(failed)? {
            if body.len() + chunk.len() > max_bytes {
                return Err(too_large);
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body.freeze())
    }
}

/// The remote cap: `max_bytes` when set, never above the inline images' limit.
fn effective_max_bytes(settings: &RemoteImageSettings, image_limits: &ImageLimits) -> usize {
    settings
        .max_bytes
        .unwrap_or(image_limits.max_bytes)
        .min(image_limits.max_bytes)
}

/// Our own refusals (from the resolver or the redirect policy) come back
/// wrapped in the client's error; anything else is said by kind, naming the
/// host only (the client's error text holds the whole URL).
fn classify(error: reqwest::Error, url: &Url) -> FetchError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&error);
    while let Some(current) = source {
        if let Some(ours) = current.downcast_ref::<FetchError>() {
            return ours.clone();
        }
        source = current.source();
    }
    let host = host_of(url);
    let broke_off = error.is_body() || error.is_decode();
    tracing::debug!(%host, error = %error.without_url(), "remote image fetch failed");
    if broke_off {
        FetchError::Interrupted { host }
    } else {
        FetchError::Unreachable { host }
    }
}

/// Resolves a host and hands the HTTP client its addresses only if every one
/// is permitted: the connection then goes to an address that was checked,
/// with no second look-up for a rebinding DNS server to answer differently.
struct CheckedResolver {
    addresses: AddressPolicy,
}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let checked = resolve_checked(normalise_host(name.as_str()), self.addresses);
        Box::pin(async move {
            checked
                .await
                .map(|found| Box::new(found.into_iter()) as Addrs)
                .map_err(|refused| -> Box<dyn std::error::Error + Send + Sync> {
                    Box::new(refused)
                })
        })
    }
}

/// Every address of `host`, if the policy permits every one.
async fn resolve_checked(
    host: String,
    policy: AddressPolicy,
) -> Result<Vec<SocketAddr>, FetchError> {
    let unresolvable = || FetchError::Unresolvable { host: host.clone() };
    let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
        .await
        .map_err(|_| unresolvable())?
        .collect();
    if found.is_empty() {
        return Err(unresolvable());
    }
    if found.iter().any(|address| !policy.permits(address.ip())) {
        return Err(FetchError::NotPublic { host });
    }
    Ok(found)
}

#[cfg(test)]
mod tests;

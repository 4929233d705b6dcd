//! Configuration: built-in defaults (`config/default.toml`), then an optional
//! TOML file, then `MODERATO_*` environment variables.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::providers::{Env, Format, Toml};
use figment::Figment;
use serde::Deserialize;

use crate::access::Tier;
use crate::moderation::image::decode::ImageLimits;
use crate::moderation::image::remote::{self, RemoteImageSettings};
use crate::moderation::image::vision::VisionSettings;
use crate::moderation::{Category, Speed, Thresholds};

const DEFAULTS: &str = include_str!("../config/default.toml");

/// Environment variables with the prefix that are not configuration keys.
/// Everything else with the prefix must be a configuration key: a misspelt
/// one is refused at start rather than silently doing nothing.
const NON_CONFIG_ENV: &[&str] = &[
    "config",
    "test_pg_url",
    "test_redis_url",
    "log",
    "bench_pg_url",
    "bench_classifier",
    "datasets",
];

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(#[from] Box<figment::Error>),
    #[error("configuration: {0}")]
    Invalid(String),
}

/// A string that must never reach a log line or an error message.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum TextClassifierKind {
    Minilm,
    Lexical,
    Null,
}

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ImageClassifierKind {
    Nsfwjs,
    None,
}

// Every section refuses unknown keys (`deny_unknown_fields`), so that a typo
// such as MODERATO_LIMITS__MAX_ITEM is an error naming the key.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub addr: SocketAddr,
    /// Where `GET /metrics` (Prometheus) is served; empty: nowhere. Never
    /// the API's listener.
    pub metrics_addr: String,
    /// May hold a password: never log it.
    pub database_url: Secret,
    pub redis_url: Option<Secret>,
    pub log_format: LogFormat,
    pub models_dir: PathBuf,
    pub text_classifier: TextClassifierKind,
    pub image_classifier: ImageClassifierKind,
    pub shutdown_grace_ms: u64,
    pub server: ServerConfig,
    pub limits: Limits,
    pub auth: AuthConfig,
    pub plans: Plans,
    /// The most keys (not revoked) a customer account may hold, by plan.
    pub max_keys_per_account: KeysPerAccount,
    pub dashboard: DashboardConfig,
    pub signing: SigningConfig,
    pub usage: UsageConfig,
    pub budget: BudgetConfig,
    pub thresholds: ThresholdOverrides,
    pub vision: VisionSettings,
    pub text_model: TextModelConfig,
    pub remote_images: RemoteImageSettings,
    pub ocr: OcrConfig,
    /// How the dashboard sends e-mail (the links of open sign-up); absent:
    /// it sends none, and open sign-up cannot be switched on.
    #[serde(default)]
    pub smtp: Option<SmtpSettings>,
}

/// `[ocr]`: reading the text inside image items.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OcrConfig {
    /// Read text in images (when the model files are there: without them
    /// the service starts with OCR off and a warning).
    pub enabled: bool,
    /// The detector sees the image scaled to at most this many pixels a side.
    pub max_side: u32,
    /// Text regions read per image, the most confident first.
    pub max_regions_per_image: usize,
    /// Characters read per image.
    pub max_chars_per_image: usize,
    /// Characters read from all the images of one request together.
    pub max_chars_per_request: usize,
    /// Text regions (lines) read from all the images of one request together.
    pub max_regions_per_request: usize,
    /// Whole reads kept per process, by account and image bytes (0: none).
    pub cache_entries: usize,
    /// Characters of the allowance charged per million pixels the detector
    /// looks at, text or not.
    pub charge_per_megapixel_detected: u64,
    /// Characters of the allowance charged per million pixels of lines given
    /// to the recogniser, read with confidence or not.
    pub charge_per_megapixel_read: u64,
    /// Threads each model run uses (ONNX Runtime's intra-op threads).
    pub threads: usize,
}

/// Bounds of `ocr.threads`.
pub const OCR_THREADS_RANGE: std::ops::RangeInclusive<usize> = 1..=64;

/// Bounds of `ocr.max_side`: the detector needs 32 pixels, and a larger
/// input costs time quadratically.
pub const OCR_SIDE_RANGE: std::ops::RangeInclusive<u32> = 32..=4096;

/// The text model's settings beyond the shipped heads.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextModelConfig {
    /// Window embeddings kept across requests (0: no cache).
    pub embedding_cache_entries: usize,
    /// The encoders' 8-bit kernel: the best the CPU has, or one by name.
    pub cpu_kernel: CpuKernel,
    /// The text path of the requests whose policy says nothing: accurate
    /// (texts the first stage finds suspect are read again by
    /// multilingual-e5-small) or fast (the first stage alone). With fast,
    /// the second encoder is not loaded and every request takes the fast
    /// path; with accurate, a policy may still choose fast.
    pub speed: Speed,
    /// The setting `speed` replaced (true: accurate, false: fast), still
    /// read so that an operator's configuration keeps its meaning; it wins
    /// over `speed` when given.
    #[serde(default)]
    pub second_stage: Option<bool>,
}

impl TextModelConfig {
    /// The operator's default text path: `second_stage` when given, else
    /// `speed`.
    pub fn speed(&self) -> Speed {
        match self.second_stage {
            Some(true) => Speed::Accurate,
            Some(false) => Speed::Fast,
            None => self.speed,
        }
    }
}

/// `text_model.cpu_kernel`: every kernel gives the same embeddings bit for
/// bit, so this changes speed only. `auto` picks the widest kernel the CPU
/// runs; a name forces that kernel (to measure what other machines run, or
/// to rule out an instruction set), and one the CPU lacks stops startup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuKernel {
    Auto,
    /// AMX tiles where the CPU has them and Linux grants the tile state
    /// (see docs/performance-kernels.md).
    Amx,
    Avx512vnni,
    Avxvnni,
    Avx2,
    Portable,
}

impl CpuKernel {
    pub fn choice(self) -> int8_matmul::KernelChoice {
        use int8_matmul::{Kernel, KernelChoice};
        match self {
            CpuKernel::Auto => KernelChoice::Auto,
            CpuKernel::Amx => KernelChoice::Force(Kernel::Amx),
            CpuKernel::Avx512vnni => KernelChoice::Force(Kernel::Avx512Vnni),
            CpuKernel::Avxvnni => KernelChoice::Force(Kernel::AvxVnni),
            CpuKernel::Avx2 => KernelChoice::Force(Kernel::Avx2),
            CpuKernel::Portable => KernelChoice::Force(Kernel::Portable),
        }
    }
}

/// About 1.6 KB an entry: the cap keeps a typo from claiming gigabytes.
pub const MAX_EMBEDDING_CACHE_ENTRIES: usize = 1_000_000;

/// How connections are served: the bounds that keep slow or idle clients
/// from holding the server.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Time to receive a complete request header after the connection opens
    /// or its previous response ends (so also the keep-alive idle timeout).
    pub header_read_timeout_ms: u64,
    /// Time to receive the whole request body.
    pub body_read_timeout_ms: u64,
    /// Connections served at once.
    pub max_connections: usize,
    /// After an answer sent before its request's body was read, how long
    /// the connection goes on reading and discarding what the client still
    /// sends before it is closed (0: closed at once).
    pub linger_time_ms: u64,
    /// ...ending sooner when the client sends nothing for this long.
    pub linger_idle_ms: u64,
    /// ...and how many bytes it discards at most.
    pub linger_max_bytes: u64,
    /// Lingering connections at most, as a percentage of `max_connections`
    /// (at least one): past it, the oldest lingering connection is closed.
    pub linger_share_percent: u8,
    /// Connections open at once from one client (an IPv4 address or an
    /// IPv6 /64); the one past it is refused with 503.
    pub max_connections_per_client: usize,
    /// Requests served on one keep-alive connection; the last answer says
    /// `Connection: close`.
    pub max_requests_per_connection: u32,
    /// Age of a connection after which it is closed once its request in
    /// flight (if any) is answered.
    pub max_connection_age_ms: u64,
    /// A body (or what a lingering close discards) must keep arriving at
    /// this rate, bytes per second, once `min_body_rate_grace_ms` have
    /// passed (0: no minimum rate).
    pub min_body_rate_bytes_per_sec: u64,
    pub min_body_rate_grace_ms: u64,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub max_items: usize,
    pub max_text_chars: usize,
    pub max_images: usize,
    pub image: ImageLimits,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    pub key_cache_ttl_ms: u64,
    pub failed_auth_per_minute: u32,
    /// Proxies whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<IpBlock>,
    pub pepper_file: PathBuf,
    pub pepper: Option<Secret>,
}

/// An address or a CIDR block (`10.0.0.0/8`, `2001:db8::/32`).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(try_from = "String")]
pub struct IpBlock {
    network: IpAddr,
    prefix: u8,
}

impl IpBlock {
    pub fn contains(&self, address: IpAddr) -> bool {
        // An IPv4 peer may arrive as an IPv4-mapped IPv6 address.
        let address = match address {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
            v4 => v4,
        };
        match (self.network, address) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(&n.octets(), &a.octets(), self.prefix),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(&n.octets(), &a.octets(), self.prefix),
            _ => false,
        }
    }
}

/// Whether the first `prefix` bits of `a` and `b` are equal.
fn prefix_eq(a: &[u8], b: &[u8], prefix: u8) -> bool {
    let (whole, rest) = (usize::from(prefix / 8), prefix % 8);
    if a[..whole] != b[..whole] {
        return false;
    }
    rest == 0 || {
        let mask = 0xFFu8 << (8 - rest);
        a[whole] & mask == b[whole] & mask
    }
}

impl TryFrom<String> for IpBlock {
    type Error = String;

    fn try_from(text: String) -> Result<IpBlock, String> {
        let invalid =
            || format!("{text:?} is not an IP address or CIDR block (such as 10.0.0.0/8)");
        let (address, prefix) = match text.trim().split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text.trim(), None),
        };
        let network: IpAddr = address.parse().map_err(|_| invalid())?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(invalid)?,
            None => max,
        };
        Ok(IpBlock { network, prefix })
    }
}

/// Requests per minute of each plan.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Plans {
    pub free: u32,
    pub basic: u32,
    pub pro: u32,
    pub enterprise: u32,
}

impl Plans {
    pub fn rpm(&self, tier: Tier) -> u32 {
        match tier {
            Tier::Free => self.free,
            Tier::Basic => self.basic,
            Tier::Pro => self.pro,
            Tier::Enterprise => self.enterprise,
        }
    }
}

/// Keys (not revoked) a customer account may hold, by plan. Keys of one
/// account share its allowance, so this bounds bookkeeping, not requests.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct KeysPerAccount {
    pub free: u32,
    pub basic: u32,
    pub pro: u32,
    pub enterprise: u32,
}

impl KeysPerAccount {
    pub fn of(&self, tier: Tier) -> u32 {
        match tier {
            Tier::Free => self.free,
            Tier::Basic => self.basic,
            Tier::Pro => self.pro,
            Tier::Enterprise => self.enterprise,
        }
    }
}

/// Who may create dashboard accounts.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Signup {
    /// Only admins create accounts.
    Closed,
    /// Anyone may sign up for a free account.
    Open,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DashboardConfig {
    pub enabled: bool,
    pub signup: Signup,
    /// A session ends after this many minutes without a request.
    pub session_idle_minutes: u32,
    /// A session ends this many hours after sign-in, however busy: a
    /// stolen session id is not good forever.
    pub session_max_lifetime_hours: u32,
    /// Whether the session cookie carries `Secure` (false only for
    /// plain-HTTP development).
    pub cookie_secure: bool,
    /// The address users reach the service at, such as
    /// `https://moderato.example.com`: links in e-mails start with it.
    /// Never taken from a request's `Host`, which the client chooses.
    #[serde(default)]
    pub public_url: Option<String>,
}

/// `[smtp]`: the mail server the dashboard hands its e-mails to.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmtpSettings {
    pub host: String,
    /// Default: 465 with `tls`, 587 with `starttls`, 25 with `none`.
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default)]
    pub security: SmtpSecurity,
    /// Sign in to the server when set (with `password`).
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub password: Option<Secret>,
    /// The sender, such as `Moderato <no-reply@example.com>`.
    pub from: String,
    /// Bound on one message's whole conversation with the server.
    #[serde(default = "default_smtp_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_smtp_timeout_ms() -> u64 {
    10_000
}

/// How the connection to the mail server is protected.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SmtpSecurity {
    /// TLS from the first byte (port 465).
    Tls,
    /// Plain, then upgraded with STARTTLS, refusing to go on without it.
    #[default]
    Starttls,
    /// No TLS at all: only for a relay on this machine or a test server.
    None,
}

impl SmtpSecurity {
    pub fn default_port(self) -> u16 {
        match self {
            SmtpSecurity::Tls => 465,
            SmtpSecurity::Starttls => 587,
            SmtpSecurity::None => 25,
        }
    }
}

/// What open sign-up needs to send its links.
pub struct SignUpMail<'a> {
    pub smtp: &'a SmtpSettings,
    pub public_url: reqwest::Url,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SigningConfig {
    pub key_file: PathBuf,
    pub private_key: Option<Secret>,
    pub extra_public_keys: Vec<PathBuf>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageConfig {
    pub buffer_capacity: usize,
    pub batch_size: usize,
    /// How long the writer gathers events before it writes a batch (unless
    /// the batch is full first). The events are already safe in the
    /// journal, so this only delays the database; gathering spares a
    /// transaction per request when traffic is light.
    pub flush_interval_ms: u64,
    /// The usage journal's folder (and quarantine of unreadable files).
    pub journal_dir: PathBuf,
    /// Raw usage events older than this many whole UTC days (before today)
    /// are dropped, a day at a time; 0 keeps them forever. The hourly
    /// rollups (bills, the usage page) are kept whatever this says.
    #[serde(default)]
    pub retention_days: u32,
    /// PostgreSQL: how many days after today get their partition made
    /// ahead (at start, then every hour).
    #[serde(default = "default_partitions_ahead_days")]
    pub partitions_ahead_days: u32,
}

fn default_partitions_ahead_days() -> u32 {
    7
}

/// What one request, and one key per minute, may ask of the CPU and memory.
#[derive(Clone, Debug, Deserialize)]
pub struct BudgetConfig {
    /// Characters of all text items of one request together.
    pub max_request_chars: usize,
    /// Decoded pixels of all image items of one request together.
    pub max_request_pixels: u64,
    /// Memory every request together may hold for decoding images.
    pub decode_memory_bytes: u64,
    /// How long a request waits for its share of `decode_memory_bytes`.
    pub decode_wait_ms: u64,
    /// After this, a request's remaining work is cancelled.
    pub request_deadline_ms: u64,
    /// CPU jobs up to this many characters run in the light lane.
    pub light_job_chars: usize,
    pub chars_per_minute: CharsPerMinute,
}

/// Text characters per minute of each plan.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct CharsPerMinute {
    pub free: u32,
    pub basic: u32,
    pub pro: u32,
    pub enterprise: u32,
}

impl CharsPerMinute {
    pub fn of(&self, tier: Tier) -> u32 {
        match tier {
            Tier::Free => self.free,
            Tier::Basic => self.basic,
            Tier::Pro => self.pro,
            Tier::Enterprise => self.enterprise,
        }
    }
}

/// Per-category threshold overrides, keyed by the API category name.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThresholdOverrides {
    #[serde(default)]
    pub text: BTreeMap<String, f32>,
    #[serde(default)]
    pub image: BTreeMap<String, f32>,
}

impl ThresholdOverrides {
    /// The shipped thresholds with the configured overrides applied.
    pub fn apply(overrides: &BTreeMap<String, f32>, shipped: Thresholds) -> Thresholds {
        let mut out = shipped;
        for (name, value) in overrides {
            // Names were checked by `Config::validate`.
            if let Some(category) = Category::parse(name) {
                out.set(category, *value);
            }
        }
        out
    }
}

impl Config {
    /// The metrics listener's address; `None` when metrics are off.
    pub fn metrics_addr(&self) -> Result<Option<SocketAddr>, ConfigError> {
        let text = self.metrics_addr.trim();
        if text.is_empty() {
            return Ok(None);
        }
        text.parse().map(Some).map_err(|_| {
            ConfigError::Invalid(format!(
                "metrics_addr {text:?} is not an address such as 127.0.0.1:9464 (empty turns metrics off)"
            ))
        })
    }

    /// The embedded defaults alone (`config/default.toml`), without a file
    /// or the environment: what tests and tools build their settings from.
    pub fn embedded_defaults() -> Config {
        Figment::from(Toml::string(DEFAULTS))
            .extract()
            .expect("config/default.toml is valid (checked by a unit test)")
    }

    /// Defaults, then `file` (if any), then the environment.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let mut figment = Figment::from(Toml::string(DEFAULTS));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError::Invalid(format!(
                    "config file {} does not exist",
                    path.display()
                )));
            }
            figment = figment.merge(Toml::file(path));
        }
        figment = figment.merge(environment());
        let config: Config = figment.extract().map_err(Box::new)?;
        config.validate()?;
        Ok(config)
    }

    /// What the engine needs of `[budget]`.
    pub fn engine_budget(&self) -> crate::moderation::engine::EngineBudget {
        let b = &self.budget;
        crate::moderation::engine::EngineBudget {
            max_request_pixels: b.max_request_pixels,
            decode_memory_bytes: b.decode_memory_bytes,
            decode_wait: Duration::from_millis(b.decode_wait_ms),
            deadline: Duration::from_millis(b.request_deadline_ms),
            light_job_chars: b.light_job_chars,
        }
    }

    /// Checks what the types cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        if let Some(metrics) = self.metrics_addr()? {
            if metrics == self.addr && metrics.port() != 0 {
                return invalid(
                    "metrics_addr must differ from addr: metrics are never served with the API"
                        .into(),
                );
            }
        }
        if self.auth.key_cache_ttl_ms > 1000 {
            return invalid("auth.key_cache_ttl_ms must be at most 1000 (revocations take effect within one second)".into());
        }
        for tier in Tier::ALL {
            if self.plans.rpm(tier) == 0 {
                return invalid(format!(
                    "plans.{tier} must be at least 1 request per minute"
                ));
            }
        }
        for tier in Tier::ALL {
            if self.max_keys_per_account.of(tier) == 0 {
                return invalid(format!(
                    "max_keys_per_account.{tier} must be at least 1 key"
                ));
            }
        }
        if self.dashboard.session_idle_minutes == 0 {
            return invalid("dashboard.session_idle_minutes must be at least 1".into());
        }
        if self.dashboard.session_max_lifetime_hours == 0 {
            return invalid("dashboard.session_max_lifetime_hours must be at least 1".into());
        }
        if self.auth.failed_auth_per_minute == 0 {
            return invalid("auth.failed_auth_per_minute must be at least 1".into());
        }
        let s = &self.server;
        if s.header_read_timeout_ms == 0 || s.body_read_timeout_ms == 0 || s.max_connections == 0 {
            return invalid("server.header_read_timeout_ms, body_read_timeout_ms and max_connections must be positive".into());
        }
        if s.max_connections_per_client == 0
            || s.max_requests_per_connection == 0
            || s.max_connection_age_ms == 0
        {
            return invalid("server.max_connections_per_client, max_requests_per_connection and max_connection_age_ms must be positive".into());
        }
        if !(1..=100).contains(&s.linger_share_percent) {
            return invalid("server.linger_share_percent must be between 1 and 100".into());
        }
        let l = &self.limits;
        if l.max_body_bytes == 0 || l.max_items == 0 || l.max_text_chars == 0 {
            return invalid(
                "limits.max_body_bytes, max_items and max_text_chars must be positive".into(),
            );
        }
        if self.text_model.embedding_cache_entries > MAX_EMBEDDING_CACHE_ENTRIES {
            return invalid(format!(
                "text_model.embedding_cache_entries must be at most {MAX_EMBEDDING_CACHE_ENTRIES} (about 1.6 KB each)"
            ));
        }
        if self.usage.buffer_capacity == 0 || self.usage.batch_size == 0 {
            return invalid("usage.buffer_capacity and usage.batch_size must be positive".into());
        }
        if self.usage.flush_interval_ms > 60_000 {
            return invalid("usage.flush_interval_ms must be at most 60000 (a minute)".into());
        }
        if self.usage.partitions_ahead_days > 366 {
            return invalid("usage.partitions_ahead_days must be at most 366".into());
        }
        self.validate_budget()?;
        self.validate_remote_images()?;
        self.validate_ocr()?;
        self.sign_up_mail()?;
        self.vision
            .validate()
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        for (section, map) in [
            ("text", &self.thresholds.text),
            ("image", &self.thresholds.image),
        ] {
            for (name, value) in map {
                if Category::parse(name).is_none() {
                    return invalid(format!("thresholds.{section}: unknown category {name:?}"));
                }
                if !(0.0..=1.0).contains(value) {
                    return invalid(format!(
                        "thresholds.{section}.{name:?} must be within [0, 1]"
                    ));
                }
            }
        }
        Ok(())
    }
}

impl Config {
    /// With `dashboard.signup = "open"`, the mail settings its links need,
    /// or an error naming the missing setting; `None` when sign-up is
    /// closed. Open sign-up without e-mail would let anyone take anyone's
    /// address.
    pub fn sign_up_mail(&self) -> Result<Option<SignUpMail<'_>>, ConfigError> {
        if self.dashboard.signup == Signup::Closed {
            return Ok(None);
        }
        let invalid = |m: &str| Err(ConfigError::Invalid(m.to_owned()));
        let Some(smtp) = &self.smtp else {
            return invalid(
                "dashboard.signup = \"open\" needs [smtp] (host and from at least; MODERATO_SMTP__HOST, MODERATO_SMTP__FROM): sign-ups are confirmed by an e-mailed link",
            );
        };
        if smtp.host.trim().is_empty() {
            return invalid("smtp.host must name the mail server");
        }
        if smtp.from.parse::<lettre::message::Mailbox>().is_err() {
            return invalid(
                "smtp.from must be an e-mail address, such as \"Moderato <no-reply@example.com>\"",
            );
        }
        if smtp.username.is_some() != smtp.password.is_some() {
            return invalid("smtp.username and smtp.password go together: set both or neither");
        }
        if !(1..=120_000).contains(&smtp.timeout_ms) {
            return invalid("smtp.timeout_ms must be between 1 and 120000");
        }
        let Some(public_url) = &self.dashboard.public_url else {
            return invalid(
                "dashboard.signup = \"open\" needs dashboard.public_url (such as \"https://moderato.example.com\"): the e-mailed links start with it",
            );
        };
        let public_url = reqwest::Url::parse(public_url)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
            .filter(|u| u.query().is_none() && u.fragment().is_none());
        let Some(public_url) = public_url else {
            return invalid(
                "dashboard.public_url must be an http:// or https:// URL without query, such as \"https://moderato.example.com\"",
            );
        };
        Ok(Some(SignUpMail { smtp, public_url }))
    }

    fn validate_remote_images(&self) -> Result<(), ConfigError> {
        let r = &self.remote_images;
        let ceiling = self.limits.image.max_bytes;
        if r.max_bytes.is_some_and(|max| max == 0 || max > ceiling) {
            return Err(ConfigError::Invalid(format!(
                "remote_images.max_bytes must be between 1 and limits.image.max_bytes ({ceiling}); leave it unset for that limit"
            )));
        }
        if !(1..=remote::MAX_TIMEOUT_MS).contains(&r.timeout_ms) {
            return Err(ConfigError::Invalid(format!(
                "remote_images.timeout_ms must be between 1 and {}",
                remote::MAX_TIMEOUT_MS
            )));
        }
        if !(1..=remote::MAX_CONCURRENT_FETCHES).contains(&r.max_concurrent_fetches) {
            return Err(ConfigError::Invalid(format!(
                "remote_images.max_concurrent_fetches must be between 1 and {}",
                remote::MAX_CONCURRENT_FETCHES
            )));
        }
        Ok(())
    }

    fn validate_ocr(&self) -> Result<(), ConfigError> {
        let o = &self.ocr;
        if !OCR_SIDE_RANGE.contains(&o.max_side) {
            return Err(ConfigError::Invalid(format!(
                "ocr.max_side must be between {} and {}",
                OCR_SIDE_RANGE.start(),
                OCR_SIDE_RANGE.end()
            )));
        }
        if !OCR_THREADS_RANGE.contains(&o.threads) {
            return Err(ConfigError::Invalid(format!(
                "ocr.threads must be between {} and {}",
                OCR_THREADS_RANGE.start(),
                OCR_THREADS_RANGE.end()
            )));
        }
        Ok(())
    }

    fn validate_budget(&self) -> Result<(), ConfigError> {
        let b = &self.budget;
        let positive = [
            ("max_request_chars", b.max_request_chars as u64),
            ("max_request_pixels", b.max_request_pixels),
            ("decode_memory_bytes", b.decode_memory_bytes),
            ("request_deadline_ms", b.request_deadline_ms),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(ConfigError::Invalid(format!(
                "budget.{name} must be positive"
            )));
        }
        if b.decode_memory_bytes / 1024 > u64::from(u32::MAX) {
            return Err(ConfigError::Invalid(
                "budget.decode_memory_bytes must be below 4 TiB".into(),
            ));
        }
        for tier in Tier::ALL {
            if b.chars_per_minute.of(tier) == 0 {
                return Err(ConfigError::Invalid(format!(
                    "budget.chars_per_minute.{tier} must be at least 1"
                )));
            }
        }
        Ok(())
    }
}

/// Where the model files are for the repository's own tests, benches,
/// examples and training tools: `MODERATO_MODELS_DIR`, else the checkout's
/// `models/` (filled by `scripts/setup.sh`). The service reads `models_dir`.
pub fn repository_models_dir() -> PathBuf {
    std::env::var_os("MODERATO_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("models"))
}

/// `MODERATO_SECTION__KEY` → `section.key`; the documented short forms
/// `MODERATO_VISION_BASE_URL`, `_MODEL` and `_API_KEY` → `vision.*`.
fn environment() -> Env {
    Env::prefixed("MODERATO_")
        .filter(|key| {
            !NON_CONFIG_ENV
                .iter()
                .any(|name| key.as_str().eq_ignore_ascii_case(name))
        })
        .map(|key| {
            let key = key.as_str().to_ascii_lowercase();
            let mapped = match key.strip_prefix("vision_") {
                Some(rest) if !rest.starts_with('_') => format!("vision.{rest}"),
                _ => key.replace("__", "."),
            };
            mapped.into()
        })
}

#[cfg(test)]
#[allow(clippy::result_large_err)] // figment::Jail's closures return its large error type
mod tests {
    use super::*;

    #[test]
    fn defaults_load_and_match_the_plan_table() {
        figment::Jail::expect_with(|_| {
            let config = Config::load(None).expect("defaults are valid");
            assert_eq!(config.plans.rpm(Tier::Free), 10);
            assert_eq!(config.plans.rpm(Tier::Basic), 60);
            assert_eq!(config.plans.rpm(Tier::Pro), 300);
            assert_eq!(config.max_keys_per_account.of(Tier::Free), 3);
            assert_eq!(config.limits.max_items, 64);
            assert!(config.redis_url.is_none());
            assert_eq!(
                config.metrics_addr().unwrap(),
                Some("127.0.0.1:9464".parse().unwrap())
            );
            Ok(())
        });
    }

    #[test]
    fn environment_overrides_nested_and_short_vision_forms() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("MODERATO_DATABASE_URL", "postgres://u:pw@h/db");
            jail.set_env("MODERATO_LIMITS__MAX_ITEMS", "3");
            jail.set_env("MODERATO_VISION_BASE_URL", "http://127.0.0.1:9/v1");
            jail.set_env("MODERATO_VISION_MODEL", "a-vision-model");
            jail.set_env("MODERATO_VISION_API_KEY", "sk-secret");
            jail.set_env("MODERATO_TEST_PG_URL", "ignored");
            let config = Config::load(None).expect("valid");
            assert_eq!(config.database_url.0, "postgres://u:pw@h/db");
            assert_eq!(config.limits.max_items, 3);
            assert_eq!(
                config.vision.base_url.as_deref(),
                Some("http://127.0.0.1:9/v1")
            );
            let debug = format!("{config:?}");
            assert!(
                !debug.contains("pw@"),
                "database password leaked into Debug"
            );
            assert!(!debug.contains("sk-secret"), "vision key leaked into Debug");
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_are_refused_with_their_name() {
        for (variable, name) in [
            ("MODERATO_LIMITS__MAX_ITEM", "max_item"),
            ("MODERATO_LIMITS__IMAGE__MAX_PIXEL", "max_pixel"),
            ("MODERATO_SERVER__IDLE", "idle"),
            ("MODERATO_VISION__TIMEOUT", "timeout"),
            ("MODERATO_DATABASE", "database"),
        ] {
            figment::Jail::expect_with(|jail| {
                jail.set_env(variable, "3");
                let err = Config::load(None).unwrap_err().to_string();
                assert!(err.contains(name), "{variable}: {err}");
                Ok(())
            });
        }
        figment::Jail::expect_with(|jail| {
            jail.create_file("extra.toml", "[auth]\ntrust_forwarded_for = true\n")?;
            let err = Config::load(Some(Path::new("extra.toml")))
                .unwrap_err()
                .to_string();
            assert!(err.contains("trust_forwarded_for"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn open_sign_up_refuses_to_start_without_its_mail_settings() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("MODERATO_DASHBOARD__SIGNUP", "open");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("[smtp]"), "{err}");
            jail.set_env("MODERATO_SMTP__HOST", "mail.example.com");
            jail.set_env("MODERATO_SMTP__FROM", "Moderato <no-reply@example.com>");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("dashboard.public_url"), "{err}");
            jail.set_env("MODERATO_DASHBOARD__PUBLIC_URL", "moderato.example.com");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("dashboard.public_url must be"), "{err}");
            jail.set_env(
                "MODERATO_DASHBOARD__PUBLIC_URL",
                "https://moderato.example.com",
            );
            let config = Config::load(None).expect("valid");
            let mail = config.sign_up_mail().unwrap().expect("open");
            assert_eq!(mail.smtp.security, SmtpSecurity::Starttls);
            assert_eq!(mail.smtp.security.default_port(), 587);
            jail.set_env("MODERATO_SMTP__FROM", "not an address");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("smtp.from"), "{err}");
            jail.set_env("MODERATO_SMTP__FROM", "no-reply@example.com");
            jail.set_env("MODERATO_SMTP__USERNAME", "moderato");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("smtp.username and smtp.password"), "{err}");
            Ok(())
        });
        // Closed sign-up needs none of it.
        figment::Jail::expect_with(|_| {
            assert!(Config::load(None)
                .unwrap()
                .sign_up_mail()
                .unwrap()
                .is_none());
            Ok(())
        });
    }

    #[test]
    fn the_embedded_defaults_are_valid() {
        Config::embedded_defaults()
            .validate()
            .expect("valid defaults");
    }

    #[test]
    fn vision_settings_take_the_files_defaults_and_never_serialise_the_key() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "vision.toml",
                "[vision]\nbase_url = \"http://x/v1\"\nmodel = \"m\"\napi_key = \"k\"\nretries = 3\n",
            )?;
            let config = Config::load(Some(Path::new("vision.toml"))).expect("valid");
            assert_eq!(config.vision.retries, 3);
            assert_eq!(config.vision.timeout_ms, 10_000);
            assert!(config.vision.structured_output);
            assert!(!serde_json::to_string(&config.vision)
                .unwrap()
                .contains("\"k\""));
            jail.create_file("half.toml", "[vision]\nbase_url = \"http://x/v1\"\n")?;
            let err = Config::load(Some(Path::new("half.toml")))
                .unwrap_err()
                .to_string();
            assert!(err.contains("set both base_url and model"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn a_partial_image_limits_section_keeps_the_other_defaults() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("limits.toml", "[limits.image]\nmax_bytes = 1024\n")?;
            let config = Config::load(Some(Path::new("limits.toml"))).expect("valid");
            assert_eq!(config.limits.image.max_bytes, 1024);
            let defaults = Config::embedded_defaults().limits.image;
            assert_eq!(config.limits.image.max_width, defaults.max_width);
            jail.create_file("typo.toml", "[limits.image]\nmax_byte = 1\n")?;
            let err = Config::load(Some(Path::new("typo.toml")))
                .unwrap_err()
                .to_string();
            assert!(err.contains("max_byte"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn trusted_proxies_are_addresses_or_cidr_blocks() {
        let block = |s: &str| IpBlock::try_from(s.to_string());
        let ten = block("10.0.0.0/8").unwrap();
        assert!(ten.contains("10.200.1.2".parse().unwrap()));
        assert!(ten.contains("::ffff:10.0.0.1".parse().unwrap()));
        assert!(!ten.contains("11.0.0.1".parse().unwrap()));
        let one = block("192.0.2.7").unwrap();
        assert!(one.contains("192.0.2.7".parse().unwrap()));
        assert!(!one.contains("192.0.2.8".parse().unwrap()));
        let v6 = block("2001:db8::/33").unwrap();
        assert!(v6.contains("2001:db8:7fff::1".parse().unwrap()));
        assert!(!v6.contains("2001:db8:8000::1".parse().unwrap()));
        assert!(block("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap()));
        for bad in ["10.0.0.0/33", "ten", "10.0.0.0/x", ""] {
            assert!(block(bad).is_err(), "{bad}");
        }
        figment::Jail::expect_with(|jail| {
            jail.set_env(
                "MODERATO_AUTH__TRUSTED_PROXIES",
                "[\"10.0.0.0/8\", \"fd00::/8\"]",
            );
            let config = Config::load(None).expect("valid");
            assert_eq!(config.auth.trusted_proxies.len(), 2);
            jail.set_env("MODERATO_AUTH__TRUSTED_PROXIES", "[\"10.0.0.0/40\"]");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("10.0.0.0/40"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn metrics_are_off_when_empty_and_never_on_the_api_address() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("MODERATO_METRICS_ADDR", "");
            assert_eq!(Config::load(None).unwrap().metrics_addr().unwrap(), None);
            jail.set_env("MODERATO_METRICS_ADDR", "127.0.0.1:8080");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("metrics_addr"), "{err}");
            jail.set_env("MODERATO_METRICS_ADDR", "nine");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("metrics_addr"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn remote_images_are_off_by_default_and_checked_when_configured() {
        use crate::moderation::image::remote::AllowedHost;
        figment::Jail::expect_with(|jail| {
            let config = Config::load(None).expect("defaults");
            assert!(!config.remote_images.enabled);
            assert!(config.remote_images.allowed_hosts.is_empty());
            assert!(!config.remote_images.allow_http);
            assert_eq!(config.remote_images.max_bytes, None);

            jail.set_env("MODERATO_REMOTE_IMAGES__ENABLED", "true");
            jail.set_env(
                "MODERATO_REMOTE_IMAGES__ALLOWED_HOSTS",
                "[\"Images.Example.com\", \"*.cdn.example.net\"]",
            );
            let config = Config::load(None).expect("valid");
            assert_eq!(
                config.remote_images.allowed_hosts,
                [
                    AllowedHost::Exact("images.example.com".into()),
                    AllowedHost::Subdomains(".cdn.example.net".into())
                ]
            );
            jail.set_env("MODERATO_REMOTE_IMAGES__MAX_BYTES", "4194305");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("remote_images.max_bytes"), "{err}");
            jail.set_env("MODERATO_LIMITS__IMAGE__MAX_BYTES", "8388608");
            assert_eq!(
                Config::load(None).unwrap().remote_images.max_bytes,
                Some(4194305),
                "the ceiling is the inline limit, whatever it is"
            );
            jail.set_env("MODERATO_REMOTE_IMAGES__TIMEOUT_MS", "0");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("remote_images.timeout_ms"), "{err}");
            jail.set_env("MODERATO_REMOTE_IMAGES__TIMEOUT_MS", "5000");
            jail.set_env("MODERATO_REMOTE_IMAGES__MAX_CONCURRENT_FETCHES", "0");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(
                err.contains("remote_images.max_concurrent_fetches"),
                "{err}"
            );
            jail.set_env("MODERATO_REMOTE_IMAGES__MAX_CONCURRENT_FETCHES", "16");
            jail.set_env(
                "MODERATO_REMOTE_IMAGES__ALLOWED_HOSTS",
                "[\"https://images.example.com/\"]",
            );
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("https://images.example.com/"), "{err}");
            Ok(())
        });
    }

    #[test]
    fn every_cpu_kernel_name_is_a_setting_and_others_are_refused() {
        use int8_matmul::{Kernel, KernelChoice};
        for (name, choice) in [
            ("auto", KernelChoice::Auto),
            ("amx", KernelChoice::Force(Kernel::Amx)),
            ("avx512vnni", KernelChoice::Force(Kernel::Avx512Vnni)),
            ("avxvnni", KernelChoice::Force(Kernel::AvxVnni)),
            ("avx2", KernelChoice::Force(Kernel::Avx2)),
            ("portable", KernelChoice::Force(Kernel::Portable)),
        ] {
            figment::Jail::expect_with(|jail| {
                jail.set_env("MODERATO_TEXT_MODEL__CPU_KERNEL", name);
                let config = Config::load(None).expect("a kernel's name is valid");
                assert_eq!(config.text_model.cpu_kernel.choice(), choice, "{name}");
                Ok(())
            });
        }
        figment::Jail::expect_with(|jail| {
            jail.set_env("MODERATO_TEXT_MODEL__CPU_KERNEL", "avx512");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.to_lowercase().contains("cpu_kernel"), "{err}");
            assert!(
                err.contains("avx512vnni"),
                "the error lists the names: {err}"
            );
            Ok(())
        });
    }

    #[test]
    fn invalid_values_are_refused_with_the_key_named() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("MODERATO_AUTH__KEY_CACHE_TTL_MS", "5000");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("key_cache_ttl_ms"), "{err}");
            Ok(())
        });
        figment::Jail::expect_with(|jail| {
            jail.set_env("MODERATO_THRESHOLDS__TEXT__VIOLENCES", "0.5");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("violences"), "{err}");
            Ok(())
        });
        for (key, value) in [
            ("MODERATO_OCR__THREADS", "0"),
            ("MODERATO_OCR__MAX_SIDE", "16"),
        ] {
            figment::Jail::expect_with(|jail| {
                jail.set_env(key, value);
                let err = Config::load(None).unwrap_err().to_string();
                let named = key.trim_start_matches("MODERATO_").replace("__", ".");
                assert!(err.contains(&named.to_lowercase()), "{err}");
                Ok(())
            });
        }
    }
}

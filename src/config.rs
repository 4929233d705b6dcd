//! Configuration: built-in defaults (`config/default.toml`), then an optional
//! TOML file, then `MODERATO_*` environment variables.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Toml};
use figment::Figment;
use serde::Deserialize;

use crate::moderation::image::ImageLimits;
use crate::moderation::vision::VisionSettings;
use crate::moderation::{Category, Thresholds};
use crate::store::Tier;

const DEFAULTS: &str = include_str!("../config/default.toml");

/// Environment variables with the prefix that are not configuration keys.
const NON_CONFIG_ENV: &[&str] = &["config", "test_pg_url", "test_redis_url", "log"];

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

#[derive(Clone, Debug, Deserialize)]
pub struct Config {
    pub addr: SocketAddr,
    /// May hold a password: never log it.
    pub database_url: Secret,
    pub redis_url: Option<Secret>,
    pub log_format: LogFormat,
    pub models_dir: PathBuf,
    pub text_classifier: TextClassifierKind,
    pub image_classifier: ImageClassifierKind,
    pub shutdown_grace_ms: u64,
    pub limits: Limits,
    pub auth: AuthConfig,
    pub plans: Plans,
    pub signing: SigningConfig,
    pub usage: UsageConfig,
    pub budget: BudgetConfig,
    pub thresholds: ThresholdOverrides,
    #[serde(default)]
    pub vision: VisionSettings,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub max_items: usize,
    pub max_text_chars: usize,
    pub max_images: usize,
    pub image: ImageLimits,
}

#[derive(Clone, Debug, Deserialize)]
pub struct AuthConfig {
    pub key_cache_ttl_ms: u64,
    pub failed_auth_per_minute: u32,
    pub trust_forwarded_for: bool,
    pub pepper_file: PathBuf,
    pub pepper: Option<Secret>,
}

/// Requests per minute of each plan.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
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

#[derive(Clone, Debug, Deserialize)]
pub struct SigningConfig {
    pub key_file: PathBuf,
    pub private_key: Option<Secret>,
    pub extra_public_keys: Vec<PathBuf>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct UsageConfig {
    pub buffer_capacity: usize,
    pub batch_size: usize,
    pub flush_interval_ms: u64,
    /// The usage journal's folder (and quarantine of unreadable files).
    pub journal_dir: PathBuf,
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

    /// Checks what the types cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
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
        if self.auth.failed_auth_per_minute == 0 {
            return invalid("auth.failed_auth_per_minute must be at least 1".into());
        }
        let l = &self.limits;
        if l.max_body_bytes == 0 || l.max_items == 0 || l.max_text_chars == 0 {
            return invalid(
                "limits.max_body_bytes, max_items and max_text_chars must be positive".into(),
            );
        }
        if self.usage.buffer_capacity == 0 || self.usage.batch_size == 0 {
            return invalid("usage.buffer_capacity and usage.batch_size must be positive".into());
        }
        self.validate_budget()?;
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

/// `MODERATO_SECTION__KEY` → `section.key`; the documented short forms
/// `MODERATO_VISION_BASE_URL`, `_MODEL` and `_API_KEY` → `vision.*`.
fn environment() -> Env {
    Env::prefixed("MODERATO_")
        .filter(|key| !NON_CONFIG_ENV.contains(&key.as_str()))
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
            assert_eq!(config.limits.max_items, 64);
            assert!(config.redis_url.is_none());
            Ok(())
        });
    }

    #[test]
    fn environment_overrides_nested_and_short_vision_forms() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("MODERATO_DATABASE_URL", "postgres://u:pw@h/db");
            jail.set_env("MODERATO_LIMITS__MAX_ITEMS", "3");
            jail.set_env("MODERATO_VISION_BASE_URL", "http://127.0.0.1:9/v1");
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
    }
}

//! Moderato: a self-hostable content moderation API.
//!
//! [`run`] builds the whole service from a [`config::Config`] and serves it
//! on a listener until a shutdown token is cancelled.

// The public surface is what the binary, the integration tests, the benches
// and the examples use; everything else is the crate's own, so that the
// compiler reports what nobody uses.
pub mod access;
pub mod cli;
pub mod config;
mod dashboard;
mod fsutil;
pub mod http;
mod metrics;
pub mod moderation;
mod signing;
pub mod store;
mod telemetry;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use config::{
    Config, ImageClassifierKind, TextClassifierKind, TextModelConfig, ThresholdOverrides,
};
use moderation::engine::{Engine, EngineParts};
use moderation::{ImageClassifier, Speed, TextClassifier};

/// Serves the service on `listener` until `shutdown` is cancelled, then
/// finishes the requests in flight (at most `shutdown_grace_ms`) and writes
/// every pending usage event before returning. No metrics listener: see
/// [`run_with_metrics`].
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    run_with_metrics(config, listener, None, shutdown).await
}

/// [`run`], and `GET /metrics` (Prometheus) on `metrics` when given.
pub async fn run_with_metrics(
    config: Config,
    listener: TcpListener,
    metrics: Option<TcpListener>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    if let Some(metrics_listener) = metrics {
        let handle = metrics::install()?;
        tracing::info!(address = %metrics_listener.local_addr()?, "metrics listening");
        let limits = http::serve::ConnectionLimits {
            listener: "metrics",
            max_connections: metrics::MAX_CONNECTIONS,
            max_per_client: metrics::MAX_CONNECTIONS_PER_CLIENT,
            ..connection_limits(&config)
        };
        tokio::spawn(metrics::serve(
            metrics_listener,
            handle,
            limits,
            shutdown.clone(),
        ));
    }
    let store = store::connect(&config.database_url.0)
        .await
        .context("opening the database")?;
    dashboard::spawn_pruning(store.clone(), shutdown.clone());
    access::usage::upkeep::spawn_upkeep(
        store.clone(),
        access::usage::upkeep::UsageUpkeep::new(
            config.usage.partitions_ahead_days,
            config.usage.retention_days,
        ),
        shutdown.clone(),
    );
    let pepper = load_pepper(&config)?;
    let signer = load_signer(&config)?;
    let engine = Arc::new(build_engine(&config)?);
    let remote_images = moderation::image::remote::RemoteImages::from_settings(
        &config.remote_images,
        &config.limits.image,
    )?;
    if config.remote_images.enabled {
        tracing::info!(
            hosts = config.remote_images.allowed_hosts.len(),
            "remote image URLs are fetched from the allowed hosts (public addresses only)"
        );
    }
    let limiter = match &config.redis_url {
        Some(url) => access::ratelimit::RateLimiter::with_redis(&url.0, "moderato:rl:")
            .map_err(anyhow::Error::msg)?,
        None => access::ratelimit::RateLimiter::local(),
    };
    let failed_auth = Arc::new(access::ratelimit::FailedAuthLimiter::new(
        config.auth.failed_auth_per_minute,
    ));
    access::ratelimit::FailedAuthLimiter::spawn_pruning(
        failed_auth.clone(),
        access::ratelimit::FAILED_AUTH_PRUNE_EVERY,
        shutdown.clone(),
    );
    let grace = Duration::from_millis(config.shutdown_grace_ms);
    let (recorder, writer) = access::usage::UsageRecorder::start(
        store.clone(),
        access::usage::UsageSettings {
            capacity: config.usage.buffer_capacity,
            batch_size: config.usage.batch_size,
            flush_interval: Duration::from_millis(config.usage.flush_interval_ms),
            journal_dir: config.usage.journal_dir.clone(),
            legacy_spill_dir: legacy_spill_dir(&config),
        },
    )
    .with_context(|| {
        format!(
            "opening the usage journal in {}",
            config.usage.journal_dir.display()
        )
    })?;
    let state = http::AppState(Arc::new(http::Shared {
        limits: config.limits.clone(),
        budget: config.budget.clone(),
        engine,
        remote_images,
        store,
        keys: access::KeyCache::new(Duration::from_millis(config.auth.key_cache_ttl_ms)),
        pepper,
        plans: config.plans.clone(),
        max_keys_per_account: config.max_keys_per_account.clone(),
        limiter,
        failed_auth,
        usage: recorder,
        trusted_proxies: config.auth.trusted_proxies.clone(),
        body_read_timeout: Duration::from_millis(config.server.body_read_timeout_ms),
        body_min_rate: min_body_rate(&config),
        signer,
        dashboard: config.dashboard.clone(),
        sign_up: dashboard::SignUpDoor::from_config(&config)?,
        sign_in_attempts: dashboard::AttemptLocks::default(),
        sign_up_attempts: dashboard::AttemptLocks::default(),
    }));
    let app = http::router(state);
    tracing::info!(address = %listener.local_addr()?, "moderato listening");

    let connection_limits = connection_limits(&config);
    let server = http::serve::serve(listener, app, connection_limits, shutdown.clone());
    let mut server = std::pin::pin!(server);
    tokio::select! {
        () = &mut server => {},
        () = shutdown.cancelled() => {
            if tokio::time::timeout(grace, &mut server).await.is_err() {
                tracing::warn!(grace_ms = config.shutdown_grace_ms, "requests still in flight after the grace period were cut off");
            }
        }
    }
    // The router (and with it every usage sender) is gone: drain the queue.
    writer.finish(grace).await;
    tracing::info!("moderato stopped");
    Ok(())
}

/// The API listener's connection bounds, from `[server]`.
fn connection_limits(config: &Config) -> http::serve::ConnectionLimits {
    let server = &config.server;
    let share = usize::from(server.linger_share_percent);
    http::serve::ConnectionLimits {
        listener: "api",
        header_read_timeout: Duration::from_millis(server.header_read_timeout_ms),
        max_connections: server.max_connections,
        max_per_client: server.max_connections_per_client,
        trusted_proxies: config.auth.trusted_proxies.clone().into(),
        max_requests: server.max_requests_per_connection,
        max_age: Duration::from_millis(server.max_connection_age_ms),
        linger: http::serve::LingerLimits {
            max_time: Duration::from_millis(server.linger_time_ms),
            max_idle: Duration::from_millis(server.linger_idle_ms),
            max_bytes: server.linger_max_bytes,
            max_connections: (server.max_connections * share / 100).max(1),
            min_rate: min_body_rate(config),
        },
    }
}

fn min_body_rate(config: &Config) -> Option<http::body::MinRate> {
    http::body::MinRate::new(
        config.server.min_body_rate_bytes_per_sec,
        Duration::from_millis(config.server.min_body_rate_grace_ms),
    )
}

/// Earlier versions spilled usage events beside the pepper file.
fn legacy_spill_dir(config: &Config) -> Option<PathBuf> {
    config.auth.pepper_file.parent().map(Path::to_path_buf)
}

pub fn load_pepper(config: &Config) -> anyhow::Result<access::keys::Pepper> {
    let configured = config.auth.pepper.as_ref().map(|s| s.0.as_str());
    let (pepper, created) =
        access::keys::Pepper::load_or_create(configured, &config.auth.pepper_file)?;
    if created {
        tracing::info!(path = %config.auth.pepper_file.display(), "created a new API-key pepper; every replica and the keys CLI must share it");
    }
    Ok(pepper)
}

fn load_signer(config: &Config) -> anyhow::Result<Arc<signing::ResponseSigner>> {
    let env_pem = config.signing.private_key.as_ref().map(|s| s.0.as_str());
    let (signer, source) = signing::ResponseSigner::load_or_create(
        env_pem,
        &config.signing.key_file,
        &config.signing.extra_public_keys,
    )?;
    match source {
        signing::KeySource::Created(path) => {
            tracing::warn!(path = %path.display(), kid = signer.kid(), "no signing key found: created a new one and kept it; back it up and share it across replicas")
        }
        signing::KeySource::File(path) => {
            tracing::info!(path = %path.display(), kid = signer.kid(), "signing key loaded")
        }
        signing::KeySource::Environment => tracing::info!(
            kid = signer.kid(),
            "signing key loaded from the environment"
        ),
    }
    Ok(Arc::new(signer))
}

/// Builds the moderation engine from configuration. Loaded models are kept
/// for the life of the process, so that several apps in one process (the
/// tests) share them.
pub fn build_engine(config: &Config) -> anyhow::Result<Engine> {
    choose_cpu_kernel(config.text_model.cpu_kernel)?;
    let paths = text_classifiers(
        config.text_classifier,
        &config.models_dir,
        &config.text_model,
    )?;
    let text = paths.default.clone();
    let image = match config.image_classifier {
        ImageClassifierKind::None => None,
        ImageClassifierKind::Nsfwjs => Some(image_classifier(&config.models_dir)?),
    };
    let text_thresholds =
        ThresholdOverrides::apply(&config.thresholds.text, text.default_thresholds());
    // The operator's overrides apply to both paths: they are the operator's
    // word on a category, whichever encoders read the text.
    let fast_text = paths.fast.map(|fast| moderation::engine::FastText {
        thresholds: ThresholdOverrides::apply(&config.thresholds.text, fast.default_thresholds()),
        classifier: fast,
    });
    tracing::info!(
        default = %config.text_model.speed(),
        models = %text.model_id(),
        "text path"
    );
    let image_thresholds = match &image {
        Some(i) => ThresholdOverrides::apply(&config.thresholds.image, i.default_thresholds()),
        None => moderation::Thresholds::uniform(0.5),
    };
    let ocr = match &image {
        Some(_) => ocr_parts(config)?,
        None => None,
    };
    let vision = moderation::image::vision::VisionClient::from_settings(&config.vision)?;
    if vision.is_some() {
        tracing::info!("deep image analysis provider configured: images are sent to it only for requests with analyze_images=true");
    }
    Ok(Engine::new(EngineParts {
        text,
        text_thresholds,
        fast_text,
        image,
        image_thresholds,
        image_limits: config.limits.image.clone(),
        vision,
        ocr,
        budget: config.engine_budget(),
    }))
}

/// The OCR model when `[ocr]` enables it. Missing model files turn OCR off
/// with a warning instead of failing: images are then judged by the image
/// models alone, as before OCR existed. A file that is there but wrong still
/// fails the start.
fn ocr_parts(config: &Config) -> anyhow::Result<Option<moderation::engine::OcrParts>> {
    use moderation::image::ocr::{Ocr, OcrError, ReadLimits};
    /// Loaded readers by models directory and threads: apps built in one
    /// process (the tests) share them.
    type Readers = HashMap<(PathBuf, usize), Arc<Ocr>>;
    static CACHE: OnceLock<Mutex<Readers>> = OnceLock::new();
    let o = &config.ocr;
    if !o.enabled {
        return Ok(None);
    }
    let cache = CACHE.get_or_init(Default::default);
    let key = (config.models_dir.clone(), o.threads);
    let cached = cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        .cloned();
    let reader = match cached {
        Some(reader) => reader,
        None => match Ocr::load(&key.0, o.threads) {
            Ok(reader) => {
                let reader = Arc::new(reader);
                cache
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, reader.clone());
                reader
            }
            Err(error @ (OcrError::Missing { .. } | OcrError::RuntimeMissing { .. })) => {
                tracing::warn!(%error, "OCR is off: text inside images is not read");
                return Ok(None);
            }
            Err(error) => return Err(error.into()),
        },
    };
    Ok(Some(moderation::engine::OcrParts {
        reader,
        limits: ReadLimits {
            max_side: o.max_side,
            max_regions: o.max_regions_per_image,
            max_chars: o.max_chars_per_image,
        },
        max_chars_per_request: o.max_chars_per_request,
        max_regions_per_request: o.max_regions_per_request,
        prices: moderation::image::ocr::OcrPrices {
            per_megapixel_detected: o.charge_per_megapixel_detected,
            per_megapixel_read: o.charge_per_megapixel_read,
        },
        cache: Arc::new(moderation::image::ocr::cache::ReadCache::new(
            o.cache_entries,
        )),
    }))
}

/// Applies `text_model.cpu_kernel` before the first model is quantised. The
/// choice is process-wide and made once; a second app in the same process
/// (the tests) asking for another keeps the first and says so. A kernel the
/// CPU cannot run is a startup error: silently running another would make
/// a measurement or an operator's rule a lie.
fn choose_cpu_kernel(kernel: config::CpuKernel) -> anyhow::Result<()> {
    match int8_matmul::choose_kernel(kernel.choice()) {
        Ok(_) => {}
        Err(int8_matmul::ChoiceError::AlreadyChosen { kept }) => tracing::warn!(
            requested = ?kernel,
            kept = kept.name(),
            "text_model.cpu_kernel: the kernels were already chosen in this process; keeping them"
        ),
        Err(e) => anyhow::bail!(
            "text_model.cpu_kernel = {:?}: {e}",
            format!("{kernel:?}").to_lowercase()
        ),
    }
    tracing::info!(
        kernel = int8_matmul::kernel_name(),
        "text encoder CPU kernel"
    );
    Ok(())
}

type TextCache = Mutex<HashMap<(String, PathBuf), TextPaths>>;
type ImageCache = Mutex<HashMap<PathBuf, Arc<dyn ImageClassifier>>>;

/// The text models of the two paths: `default` for requests whose policy
/// says nothing, `fast` for those that choose the fast path when the
/// default is not already it.
#[derive(Clone)]
struct TextPaths {
    default: Arc<dyn TextClassifier>,
    fast: Option<Arc<dyn TextClassifier>>,
}

fn text_classifiers(
    kind: TextClassifierKind,
    models_dir: &Path,
    settings: &TextModelConfig,
) -> anyhow::Result<TextPaths> {
    use moderation::text::model::{
        EmbeddingClassifier, SHIPPED_HEADS_JSON, SHIPPED_SECOND_STAGE_HEADS_JSON,
    };
    static CACHE: OnceLock<TextCache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let speed = settings.speed();
    let key = (
        format!("{kind:?} {speed} {}", settings.embedding_cache_entries),
        models_dir.to_path_buf(),
    );
    if let Some(found) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(found.clone());
    }
    let only = |default: Arc<dyn TextClassifier>| TextPaths {
        default,
        fast: None,
    };
    let loaded = match kind {
        TextClassifierKind::Null => only(Arc::new(moderation::text::null::NullClassifier)),
        TextClassifierKind::Lexical => only(Arc::new(moderation::LexicalClassifier::new())),
        TextClassifierKind::Minilm => {
            let context = "loading the text model (run scripts/setup.sh to fetch its files)";
            let first_heads = match speed {
                Speed::Accurate => SHIPPED_SECOND_STAGE_HEADS_JSON,
                Speed::Fast => SHIPPED_HEADS_JSON,
            };
            let default = EmbeddingClassifier::load_with_heads(models_dir, first_heads)
                .context(context)?
                .with_embedding_cache(settings.embedding_cache_entries);
            let fast = match speed {
                Speed::Fast => None,
                Speed::Accurate => Some(Arc::new(
                    default
                        .sibling(models_dir, SHIPPED_HEADS_JSON)
                        .context(context)?,
                ) as Arc<dyn TextClassifier>),
            };
            TextPaths {
                default: Arc::new(default),
                fast,
            }
        }
    };
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, loaded.clone());
    Ok(loaded)
}

fn image_classifier(models_dir: &Path) -> anyhow::Result<Arc<dyn ImageClassifier>> {
    static CACHE: OnceLock<ImageCache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(found) = cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(models_dir)
    {
        return Ok(found.clone());
    }
    let loaded: Arc<dyn ImageClassifier> =
        Arc::new(moderation::image::nsfw::NsfwClassifier::load(models_dir)?);
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(models_dir.to_path_buf(), loaded.clone());
    Ok(loaded)
}

#[cfg(test)]
mod tests {
    /// Forcing AMX: on a CPU (and Linux) with it the service starts on it;
    /// without, startup stops naming the setting, the kernel and what to
    /// use instead.
    #[test]
    fn a_cpu_kernel_that_cannot_run_stops_startup_and_says_why() {
        let forced = super::choose_cpu_kernel(crate::config::CpuKernel::Amx);
        if int8_matmul::Kernel::Amx.is_supported() {
            // Taken, or kept when another test of this process chose first
            // (auto picks AVX-512 VNNI on such a CPU: it measured faster).
            forced.expect("this CPU runs the AMX kernel");
            assert!(
                ["amx", "avx512vnni"].contains(&int8_matmul::kernel_name()),
                "{}",
                int8_matmul::kernel_name()
            );
            return;
        }
        let err = forced.unwrap_err().to_string();
        assert!(err.contains("cpu_kernel") && err.contains("amx"), "{err}");
        assert!(
            err.contains("\"auto\""),
            "it says what to use instead: {err}"
        );
    }
}

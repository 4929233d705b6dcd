//! Prometheus metrics: recorded with the `metrics` facade where things
//! happen, rendered by `metrics-exporter-prometheus`, and served on a
//! listener of their own (`metrics_addr`), never beside the API.
//!
//! The recorder is process-global: it is installed once, by the first
//! service started with metrics on, and every service in the process
//! records into it (tests run several). Without it, recording is a no-op.

use std::sync::OnceLock;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::http::serve::ConnectionLimits;

/// Every metric's name, in one place (the Grafana dashboard in
/// `docs/grafana-dashboard.json` uses them).
pub mod names {
    pub const HTTP_REQUESTS: &str = "moderato_http_requests_total";
    pub const HTTP_DURATION: &str = "moderato_http_request_duration_seconds";
    pub const MODEL_DURATION: &str = "moderato_model_duration_seconds";
    pub const ITEMS_SCORED: &str = "moderato_items_scored_total";
    pub const CHARACTERS_SCORED: &str = "moderato_text_characters_scored_total";
    pub const FLAGGED: &str = "moderato_flagged_results_total";
    pub const RATE_LIMITED: &str = "moderato_rate_limited_requests_total";
    pub const AUTH_FAILURES: &str = "moderato_auth_failures_total";
    pub const USAGE_QUEUE_DEPTH: &str = "moderato_usage_queue_depth_events";
    pub const USAGE_BATCHES: &str = "moderato_usage_batches_written_total";
    pub const USAGE_RETRIES: &str = "moderato_usage_write_retries_total";
    pub const USAGE_JOURNALED: &str = "moderato_usage_events_journaled_total";
    pub const USAGE_QUARANTINED: &str = "moderato_usage_events_quarantined_total";
    pub const VISION_CALLS: &str = "moderato_vision_calls_total";
    pub const VISION_CIRCUIT: &str = "moderato_vision_circuit_state";
    pub const CACHE_HITS: &str = "moderato_embedding_cache_hits_total";
    pub const CACHE_MISSES: &str = "moderato_embedding_cache_misses_total";
    pub const DATABASE_ERRORS: &str = "moderato_database_errors_total";
    pub const REMOTE_IMAGE_FETCHES: &str = "moderato_remote_image_fetches_total";
    pub const SECOND_STAGE_TEXTS: &str = "moderato_second_stage_texts_total";
    pub const CONNECTIONS_REFUSED: &str = "moderato_connections_refused_total";
    pub const LINGERING_EVICTED: &str = "moderato_lingering_connections_evicted_total";
}

/// Upper bounds of the latency buckets, in seconds: a short text is a few
/// milliseconds, a request at its deadline 20 s.
const SECONDS_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0,
];

/// How often histogram samples are folded into their buckets when nobody
/// scrapes, so that memory stays bounded.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process's recorder, installed on first use.
pub fn install() -> anyhow::Result<&'static PrometheusHandle> {
    if let Some(handle) = HANDLE.get() {
        return Ok(handle);
    }
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS_BUCKETS)?
        .build_recorder();
    let handle = recorder.handle();
    // Two services starting at once: the loser's recorder is dropped and
    // both use the winner's.
    if HANDLE.set(handle).is_ok() {
        metrics::set_global_recorder(recorder)
            .map_err(|e| anyhow::anyhow!("installing the metrics recorder: {e}"))?;
        describe();
    }
    Ok(HANDLE.get().expect("set above"))
}

/// Connections the metrics listener serves at once, and from one client: a
/// scraper needs one, and a client that holds more must not hold the
/// process's file descriptors.
pub const MAX_CONNECTIONS: usize = 8;
pub const MAX_CONNECTIONS_PER_CLIENT: usize = 4;

/// Serves `GET /metrics` on `listener` until `shutdown`, with the API's
/// connection bounds (`limits`: its header timeout, and the small caps
/// above).
pub async fn serve(
    listener: TcpListener,
    handle: &'static PrometheusHandle,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) {
    let upkeep = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            let mut every = tokio::time::interval(UPKEEP_INTERVAL);
            loop {
                tokio::select! {
                    _ = every.tick() => handle.run_upkeep(),
                    () = shutdown.cancelled() => return,
                }
            }
        }
    });
    let app = Router::new().route("/metrics", get(move || async move { handle.render() }));
    crate::http::serve::serve(listener, app, limits, shutdown).await;
    upkeep.abort();
}

fn describe() {
    use names::*;
    describe_counter!(
        HTTP_REQUESTS,
        Unit::Count,
        "HTTP requests answered, by route and status"
    );
    describe_histogram!(
        HTTP_DURATION,
        Unit::Seconds,
        "Time to answer a request, by route"
    );
    describe_histogram!(
        MODEL_DURATION,
        Unit::Seconds,
        "CPU time of one request's model job, by classifier (text, image)"
    );
    describe_counter!(
        ITEMS_SCORED,
        Unit::Count,
        "Items scored, by kind (text, image)"
    );
    describe_counter!(
        CHARACTERS_SCORED,
        Unit::Count,
        "Characters of text items scored"
    );
    describe_counter!(FLAGGED, Unit::Count, "Item results flagged, by category");
    describe_counter!(
        RATE_LIMITED,
        Unit::Count,
        "Requests refused by a key's limit, by tier and limit (requests, characters)"
    );
    describe_counter!(
        AUTH_FAILURES,
        Unit::Count,
        "Requests refused authentication, by reason (missing, invalid, blocked)"
    );
    describe_gauge!(
        USAGE_QUEUE_DEPTH,
        Unit::Count,
        "Usage events waiting to be written to the database"
    );
    describe_counter!(
        USAGE_BATCHES,
        Unit::Count,
        "Usage batches written to the database"
    );
    describe_counter!(
        USAGE_RETRIES,
        Unit::Count,
        "Usage batch writes retried after a database error"
    );
    describe_counter!(
        USAGE_JOURNALED,
        Unit::Count,
        "Usage events appended to the local journal"
    );
    describe_counter!(
        USAGE_QUARANTINED,
        Unit::Count,
        "Usage events the database refused, kept in quarantine"
    );
    describe_counter!(
        VISION_CALLS,
        Unit::Count,
        "Deep image analyses, by outcome (completed or the failure code)"
    );
    describe_gauge!(
        VISION_CIRCUIT,
        Unit::Count,
        "The vision provider's circuit breaker: 0 closed, 1 open, 2 half-open"
    );
    describe_counter!(
        CACHE_HITS,
        Unit::Count,
        "Text chunks whose embedding came from the cache"
    );
    describe_counter!(
        CACHE_MISSES,
        Unit::Count,
        "Text chunks that went through the encoder"
    );
    describe_counter!(
        REMOTE_IMAGE_FETCHES,
        Unit::Count,
        "Remote image URLs, by outcome (fetched, or why not: disabled, host_not_allowed, not_public, timeout, too_large, http_status, ...)"
    );
    describe_counter!(
        DATABASE_ERRORS,
        Unit::Count,
        "Database errors, by kind (unavailable, conflict, other)"
    );
    describe_counter!(
        CONNECTIONS_REFUSED,
        Unit::Count,
        "Connections refused at once, by listener and reason (per_client: over server.max_connections_per_client)"
    );
    describe_counter!(
        LINGERING_EVICTED,
        Unit::Count,
        "Lingering connections closed early to make room, by reason (budget: server.linger_share_percent full; slots: the server short of connection slots)"
    );
    describe_counter!(
        SECOND_STAGE_TEXTS,
        Unit::Count,
        "Texts the first stage found suspect and the second encoder read again (text_model.second_stage)"
    );
}

#[cfg(test)]
mod tests {
    use super::names::*;

    const ALL: [&str; 22] = [
        HTTP_REQUESTS,
        HTTP_DURATION,
        MODEL_DURATION,
        ITEMS_SCORED,
        CHARACTERS_SCORED,
        FLAGGED,
        RATE_LIMITED,
        AUTH_FAILURES,
        USAGE_QUEUE_DEPTH,
        USAGE_BATCHES,
        USAGE_RETRIES,
        USAGE_JOURNALED,
        USAGE_QUARANTINED,
        VISION_CALLS,
        VISION_CIRCUIT,
        CACHE_HITS,
        CACHE_MISSES,
        DATABASE_ERRORS,
        REMOTE_IMAGE_FETCHES,
        SECOND_STAGE_TEXTS,
        CONNECTIONS_REFUSED,
        LINGERING_EVICTED,
    ];

    /// The shipped dashboard queries only metrics the service exports, and
    /// shows every one of them.
    #[test]
    fn the_grafana_dashboard_uses_the_exported_names() {
        let dashboard = include_str!("../docs/grafana-dashboard.json");
        let _: serde_json::Value = serde_json::from_str(dashboard).expect("valid JSON");
        let mut used = std::collections::BTreeSet::new();
        for (start, _) in dashboard.match_indices("moderato_") {
            let name: String = dashboard[start..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            let base = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|b| b.ends_with("_seconds")))
                .unwrap_or(&name)
                .to_string();
            used.insert(base);
        }
        for name in &used {
            assert!(
                ALL.contains(&name.as_str()),
                "the dashboard queries {name}, which is not exported"
            );
        }
        for name in ALL {
            assert!(used.contains(name), "the dashboard does not show {name}");
        }
    }
}

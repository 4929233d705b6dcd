//! Sustained insert rate of usage events through the service's write path:
//! `Store::insert_usage` with batches of `usage.batch_size` (500 by
//! default), one batch at a time per writer as the usage writer task does
//! (`WRITERS` of them: one per replica), each batch adding its events to
//! the hourly rollups in the same statement.
//!
//! Needs the database made by `benches/usage_scale.sh setup new` (its keys
//! and policies); skipped when it is not there. Prints the rate of every
//! 30 seconds and of the whole run.
//!
//! ```text
//! EVENTS=3000000 WRITERS=1 nice -n 5 cargo bench --bench usage_insert
//! ```
//! Environment: `MODERATO_USAGE_BENCH_URL`
//! (postgres://postgres@127.0.0.1:5432/moderato_usage_bench_new), `EVENTS`
//! (3,000,000), `BATCH` (500), `WRITERS` (1).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{Days, Utc};
use moderato::access::{Endpoint, KeyId, PolicyId, UsageEvent};
use moderato::store::{PostgresStore, Store};

const REPORT_EVERY: Duration = Duration::from_secs(30);

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

/// The n-th event: the same mix as the set-based fill of
/// `benches/usage_scale.sh`, at the time it is made (so in today's
/// partition), with a request id like the service's.
fn event(n: u64, keys: &[(KeyId, Option<PolicyId>)]) -> UsageEvent {
    let (key_id, policy_id) = keys[(n.wrapping_mul(7919) % keys.len() as u64) as usize].clone();
    let billable = !n.is_multiple_of(50) && n % 100 != 1;
    UsageEvent {
        request_id: format!("modr_{}", uuid::Uuid::now_v7().simple()),
        key_id,
        at: Utc::now(),
        status: match (n % 50, n % 100) {
            (0, _) => 429,
            (_, 1) => 400,
            _ => 200,
        },
        text_items: 1 + (n % 4) as u32,
        text_chars: 60 + (n * 37) % 1900,
        image_items: u32::from(n.is_multiple_of(10)),
        image_bytes: if n.is_multiple_of(10) { 120_000 } else { 0 },
        deep_analyses: u32::from(n.is_multiple_of(20)),
        flagged: n.is_multiple_of(12),
        rate_limited: n.is_multiple_of(50),
        billable,
        latency_ms: 5 + (n % 45) as u32,
        endpoint: if n % 10 < 7 {
            Endpoint::Moderate
        } else {
            Endpoint::Moderations
        },
        policy_id,
    }
}

/// Prints the rate of each period: a sustained rate is one that does not
/// fall as the tables and their indexes grow.
async fn report_every(period: Duration, done: Arc<AtomicU64>, start: Instant) {
    let mut last = 0;
    let mut every = tokio::time::interval(period);
    every.tick().await;
    loop {
        every.tick().await;
        let total = done.load(Ordering::Relaxed);
        println!(
            "  {:>6.0} s {total:>10} events  last {}s: {:>7.0} events/s",
            start.elapsed().as_secs_f64(),
            period.as_secs(),
            (total - last) as f64 / period.as_secs_f64()
        );
        last = total;
    }
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; a filter that is not ours skips us.
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with('-') && !"usage_insert".contains(&a))
    {
        return;
    }
    let url = std::env::var("MODERATO_USAGE_BENCH_URL").unwrap_or_else(|_| {
        "postgres://postgres@127.0.0.1:5432/moderato_usage_bench_new".to_owned()
    });
    let events = env_number("EVENTS", 3_000_000);
    let batch = env_number("BATCH", 500).max(1) as usize;
    let writers = env_number("WRITERS", 1).max(1);
    let Ok(store) = PostgresStore::connect(&url).await else {
        eprintln!(
            "usage_insert: no database at {url} (run benches/usage_scale.sh setup new): skipped"
        );
        return;
    };
    let keys: Vec<(String, Option<String>)> = match sqlx::query_as(
        "SELECT key_id, policy_id FROM bench_keys ORDER BY n",
    )
    .fetch_all(store.pool())
    .await
    {
        Ok(keys) => keys,
        Err(_) => {
            eprintln!("usage_insert: {url} has no bench_keys (run benches/usage_scale.sh setup new): skipped");
            return;
        }
    };
    let keys: Arc<Vec<(KeyId, Option<PolicyId>)>> = Arc::new(
        keys.into_iter()
            .map(|(k, p)| {
                (
                    KeyId::parse(&k).expect("bench key id"),
                    p.map(|p| PolicyId::parse(&p).expect("bench policy id")),
                )
            })
            .collect(),
    );
    let today = Utc::now().date_naive();
    store
        .prepare_usage_days(today, today + Days::new(1))
        .await
        .expect("today's partition");
    let store: Arc<dyn Store> = Arc::new(store);
    println!("usage_insert: {events} events, batches of {batch}, {writers} writer(s), {url}");

    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let reporter = tokio::spawn(report_every(REPORT_EVERY, done.clone(), start));
    let mut tasks = Vec::new();
    for _ in 0..writers {
        let (store, keys, next, done) = (store.clone(), keys.clone(), next.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let first = next.fetch_add(batch as u64, Ordering::Relaxed);
                if first >= events {
                    return;
                }
                let last = (first + batch as u64).min(events);
                let batch: Vec<UsageEvent> = (first..last).map(|n| event(n, &keys)).collect();
                store.insert_usage(&batch).await.expect("insert_usage");
                done.fetch_add(last - first, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.expect("writer");
    }
    reporter.abort();
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "usage_insert: {events} events in {seconds:.1} s: {:.0} events/s sustained",
        events as f64 / seconds
    );
}

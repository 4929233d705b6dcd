//! Usage-writer cost: one `insert_usage` batch of 1, 100 and 500 events,
//! on SQLite (temp file) and on PostgreSQL (a scratch database on the server
//! named by `MODERATO_BENCH_PG_URL`, default the local one; `skip` or an
//! unreachable server skips it), plus a daily billing query over the rows
//! written.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use chrono::{TimeZone, Utc};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use moderato::access::{ApiKeyRecord, KeyId, Tier, UsageEvent};
use moderato::store::{self, Period, Store};
use sqlx::Connection;
use tokio::runtime::Runtime;

const BATCH_SIZES: [usize; 3] = [1, 100, 500];

static NEXT_REQUEST: AtomicU64 = AtomicU64::new(0);

fn key_id() -> KeyId {
    KeyId::parse("00000000000000be").expect("valid key id")
}

/// A batch of distinct, never-seen request ids, spread over a month.
fn batch(size: usize) -> Vec<UsageEvent> {
    let start = Utc
        .with_ymd_and_hms(2026, 1, 1, 0, 0, 0)
        .single()
        .expect("valid time");
    (0..size)
        .map(|_| {
            let n = NEXT_REQUEST.fetch_add(1, Ordering::Relaxed);
            UsageEvent {
                request_id: format!("bench-{n:012}"),
                key_id: key_id(),
                at: start + chrono::Duration::seconds((n % 2_592_000) as i64),
                status: if n.is_multiple_of(20) { 429 } else { 200 },
                text_items: 2,
                text_chars: 280,
                image_items: (n % 3) as u32,
                image_bytes: 150_000,
                deep_analyses: n.is_multiple_of(10) as u32,
                flagged: n.is_multiple_of(7),
                rate_limited: n.is_multiple_of(20),
                billable: !n.is_multiple_of(20),
                latency_ms: 35,
                endpoint: moderato::access::Endpoint::Moderate,
                policy_id: None,
            }
        })
        .collect()
}

async fn prepared(url: &str) -> Arc<dyn Store> {
    let store = store::connect(url).await.expect("connect");
    let key = ApiKeyRecord {
        id: key_id(),
        name: "bench".into(),
        tier: Tier::Pro,
        custom_rpm: None,
        owner: moderato::access::KeyOwner::Operator,
        secret_hash: vec![0; 32],
        created_at: Utc::now(),
        revoked_at: None,
        policy_id: None,
        policy: None,
    };
    store.insert_key(&key).await.expect("insert key");
    store
}

fn bench_backend(c: &mut Criterion, rt: &Runtime, name: &str, store: &Arc<dyn Store>) {
    let mut group = c.benchmark_group(format!("insert_usage/{name}"));
    for size in BATCH_SIZES {
        group.throughput(Throughput::Elements(size as u64));
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.to_async(rt).iter_batched(
                || batch(size),
                |events| async move { store.insert_usage(&events).await.expect("insert") },
                criterion::BatchSize::SmallInput,
            );
        });
    }
    group.finish();
    c.bench_function(&format!("billing_daily/{name}"), |b| {
        b.to_async(rt).iter(|| async {
            store
                .billing(Period::Day, None, None)
                .await
                .expect("billing")
        });
    });
}

/// A scratch PostgreSQL database and how to drop it, or `None` to skip.
fn postgres_scratch(rt: &Runtime) -> Option<(String, String, String)> {
    let admin = match std::env::var("MODERATO_BENCH_PG_URL") {
        Ok(v) if v == "skip" => return None,
        Ok(v) if !v.is_empty() => v,
        _ => "postgres://postgres@127.0.0.1:5432/postgres".to_owned(),
    };
    let db = format!("moderato_bench_{}", uuid::Uuid::new_v4().simple());
    rt.block_on(async {
        let mut conn = sqlx::PgConnection::connect(&admin).await.ok()?;
        sqlx::query(&format!("CREATE DATABASE {db}"))
            .execute(&mut conn)
            .await
            .ok()?;
        let _ = conn.close().await;
        Some(())
    })?;
    let (server, _) = admin.rsplit_once('/')?;
    let url = format!("{server}/{db}");
    Some((admin, db, url))
}

fn drop_postgres(rt: &Runtime, admin: &str, db: &str) {
    rt.block_on(async {
        if let Ok(mut conn) = sqlx::PgConnection::connect(admin).await {
            let drop = format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)");
            let _ = sqlx::query(&drop).execute(&mut conn).await;
            let _ = conn.close().await;
        }
    });
}

fn benches(c: &mut Criterion) {
    let rt = Runtime::new().expect("tokio runtime");

    let dir = tempfile::tempdir().expect("temp dir");
    let sqlite_url = format!("sqlite:{}", dir.path().join("bench.db").display());
    let sqlite = rt.block_on(prepared(&sqlite_url));
    bench_backend(c, &rt, "sqlite", &sqlite);

    match postgres_scratch(&rt) {
        Some((admin, db, url)) => {
            let pg = rt.block_on(prepared(&url));
            bench_backend(c, &rt, "postgres", &pg);
            drop(pg);
            drop_postgres(&rt, &admin, &db);
        }
        None => eprintln!("PostgreSQL not reachable (or MODERATO_BENCH_PG_URL=skip): skipped"),
    }
}

criterion_group! {
    name = store_benches;
    config = Criterion::default().sample_size(30);
    targets = benches
}
criterion_main!(store_benches);

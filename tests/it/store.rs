//! One behavioural suite for the `Store` trait, run against PostgreSQL and
//! SQLite. Each test gets a fresh database from `helpers::TestDb`: a new
//! PostgreSQL database on the server named by `MODERATO_TEST_PG_URL`
//! (default: the local one, trust auth), dropped afterwards, or a SQLite
//! file in a temp dir.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, TimeZone, Utc};
use moderato::access::{
    Account, AccountId, ApiKeyRecord, Email, Endpoint, KeyId, PasswordHash, Plan, PolicyDraft,
    PolicyId, Role, Tier, UsageEvent,
};
use moderato::moderation::{Category, CategoryRule, CategoryRules, Speed, Threshold};
use moderato::store::{
    self, BillingRow, NewAccountKey, NewSession, Period, PolicyUsageRow, PostgresStore, SessionUse,
    SignInFailures, SqliteStore, Store, StoreError,
};

use crate::helpers::{Backend, TestDb};
use crate::on_both_backends;

/// What a test body gets.
#[derive(Clone)]
struct Ctx {
    kind: Backend,
    url: String,
    store: Arc<dyn Store>,
}

/// Runs `body` on a fresh, migrated database of `backend`; the database is
/// dropped afterwards, even when the body panics.
async fn run<F, Fut>(backend: Backend, body: F)
where
    F: FnOnce(Ctx) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let db = TestDb::new(backend).await;
    let store = store::connect(&db.url)
        .await
        .unwrap_or_else(|e| panic!("connect to a fresh {backend:?} database: {e}"));
    let ctx = Ctx {
        kind: backend,
        url: db.url.clone(),
        store,
    };
    let outcome = tokio::spawn(body(ctx)).await;
    drop(db);
    if let Err(e) = outcome {
        if e.is_panic() {
            std::panic::resume_unwind(e.into_panic());
        }
        panic!("test task failed: {e}");
    }
}

on_both_backends!(with super::run:
    migrations_are_idempotent,
    ping_answers,
    keys_round_trip_and_list_oldest_first,
    revoking_keeps_the_first_time,
    set_tier_changes_plan_and_limit,
    duplicate_key_id_is_a_conflict,
    usage_batches_skip_stored_request_ids,
    usage_events_filter_by_key,
    usage_for_unknown_key_is_rejected_whole,
    billing_per_day,
    billing_per_month,
    billing_view_matches_daily_billing,
    thousand_event_batch_lands,
    concurrent_batches_all_land,
);

fn key_id(n: u64) -> KeyId {
    KeyId::parse(&format!("{n:016x}")).expect("valid key id")
}

fn at(y: i32, m: u32, d: u32, h: u32, min: u32, s: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, m, d, h, min, s)
        .single()
        .expect("valid time")
}

fn day(y: i32, m: u32, d: u32) -> NaiveDate {
    NaiveDate::from_ymd_opt(y, m, d).expect("valid date")
}

fn key(n: u64, created_at: DateTime<Utc>) -> ApiKeyRecord {
    ApiKeyRecord {
        id: key_id(n),
        name: format!("customer {n}"),
        tier: Tier::Free,
        custom_rpm: None,
        owner: moderato::access::KeyOwner::Operator,
        secret_hash: vec![n as u8; 32],
        created_at,
        revoked_at: None,
        policy_id: None,
        policy: None,
    }
}

/// A successful, billable request with one text item.
fn event(request_id: &str, key: &KeyId, at: DateTime<Utc>) -> UsageEvent {
    UsageEvent {
        request_id: request_id.to_owned(),
        key_id: key.clone(),
        at,
        status: 200,
        text_items: 1,
        text_chars: 10,
        image_items: 0,
        image_bytes: 0,
        deep_analyses: 0,
        flagged: false,
        rate_limited: false,
        billable: true,
        latency_ms: 12,
        endpoint: Endpoint::Moderate,
        policy_id: None,
    }
}

/// Refused by the rate limiter; its body's sizes are recorded but not billed.
fn refused(request_id: &str, key: &KeyId, at: DateTime<Utc>) -> UsageEvent {
    UsageEvent {
        status: 429,
        text_items: 4,
        text_chars: 400,
        image_items: 1,
        deep_analyses: 1,
        rate_limited: true,
        billable: false,
        latency_ms: 0,
        ..event(request_id, key, at)
    }
}

fn client_error(request_id: &str, key: &KeyId, at: DateTime<Utc>) -> UsageEvent {
    UsageEvent {
        status: 400,
        billable: false,
        ..event(request_id, key, at)
    }
}

async fn add_keys(store: &dyn Store, ids: &[u64]) {
    for &n in ids {
        store
            .insert_key(&key(n, at(2026, 1, 1, 0, 0, n as u32)))
            .await
            .expect("insert key");
    }
}

fn request_ids(events: &[UsageEvent]) -> Vec<&str> {
    events.iter().map(|e| e.request_id.as_str()).collect()
}

async fn migrations_are_idempotent(ctx: Ctx) {
    add_keys(ctx.store.as_ref(), &[1]).await;
    ctx.store
        .migrate()
        .await
        .expect("second migrate on the same pool");
    let again = store::connect(&ctx.url)
        .await
        .expect("connect (and migrate) again");
    again.migrate().await.expect("third migrate");
    let kept = again.get_key(&key_id(1)).await.expect("get key");
    assert_eq!(
        kept,
        Some(key(1, at(2026, 1, 1, 0, 0, 1))),
        "migrations must not touch data"
    );
}

async fn ping_answers(ctx: Ctx) {
    ctx.store.ping().await.expect("ping");
}

async fn keys_round_trip_and_list_oldest_first(ctx: Ctx) {
    let store = ctx.store.as_ref();
    let newest = ApiKeyRecord {
        tier: Tier::Enterprise,
        custom_rpm: Some(12_000),
        secret_hash: (0..=255).collect(),
        // Sub-second precision down to microseconds survives the round trip.
        created_at: at(2026, 3, 1, 12, 0, 0) + chrono::Duration::microseconds(123_456),
        revoked_at: Some(at(2026, 3, 2, 0, 0, 0)),
        ..key(0xabc, at(2026, 3, 1, 12, 0, 0))
    };
    let oldest = key(0xdef, at(2025, 12, 31, 23, 59, 59));
    let middle = ApiKeyRecord {
        tier: Tier::Pro,
        ..key(0x123, at(2026, 2, 1, 0, 0, 0))
    };
    for k in [&newest, &oldest, &middle] {
        store.insert_key(k).await.expect("insert key");
    }

    assert_eq!(
        store.get_key(&newest.id).await.expect("get"),
        Some(newest.clone())
    );
    assert_eq!(
        store.get_key(&key_id(0x999)).await.expect("get unknown"),
        None
    );
    let listed = store.list_keys().await.expect("list");
    assert_eq!(listed, vec![oldest, middle, newest]);
}

async fn revoking_keeps_the_first_time(ctx: Ctx) {
    let store = ctx.store.as_ref();
    add_keys(store, &[1, 2]).await;

    let before = Utc::now() - chrono::Duration::seconds(1);
    assert!(store.revoke_key(&key_id(1)).await.expect("revoke"));
    let after = Utc::now() + chrono::Duration::seconds(1);
    let first = store
        .get_key(&key_id(1))
        .await
        .expect("get")
        .expect("key exists");
    let revoked_at = first.revoked_at.expect("revoked_at set");
    assert!(
        before <= revoked_at && revoked_at <= after,
        "revoked_at {revoked_at} is now"
    );

    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        store.revoke_key(&key_id(1)).await.expect("revoke again"),
        "key still exists"
    );
    let second = store
        .get_key(&key_id(1))
        .await
        .expect("get")
        .expect("key exists");
    assert_eq!(
        second.revoked_at,
        Some(revoked_at),
        "second revoke keeps the first time"
    );

    assert!(!store
        .revoke_key(&key_id(0x77))
        .await
        .expect("revoke unknown"));
    let other = store
        .get_key(&key_id(2))
        .await
        .expect("get")
        .expect("key exists");
    assert_eq!(other.revoked_at, None, "only the named key is revoked");
}

async fn set_tier_changes_plan_and_limit(ctx: Ctx) {
    let store = ctx.store.as_ref();
    add_keys(store, &[1, 2]).await;

    assert!(store
        .set_tier(&key_id(1), Tier::Enterprise, Some(50_000))
        .await
        .expect("set"));
    let k = store
        .get_key(&key_id(1))
        .await
        .expect("get")
        .expect("exists");
    assert_eq!((k.tier, k.custom_rpm), (Tier::Enterprise, Some(50_000)));

    assert!(store
        .set_tier(&key_id(1), Tier::Basic, None)
        .await
        .expect("set"));
    let k = store
        .get_key(&key_id(1))
        .await
        .expect("get")
        .expect("exists");
    assert_eq!((k.tier, k.custom_rpm), (Tier::Basic, None));

    assert!(!store
        .set_tier(&key_id(0x55), Tier::Pro, None)
        .await
        .expect("set unknown"));
    let untouched = store
        .get_key(&key_id(2))
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(untouched.tier, Tier::Free);
}

async fn duplicate_key_id_is_a_conflict(ctx: Ctx) {
    let store = ctx.store.as_ref();
    let original = key(7, at(2026, 1, 1, 0, 0, 0));
    store.insert_key(&original).await.expect("insert");
    let clash = ApiKeyRecord {
        name: "impostor".into(),
        ..original.clone()
    };
    match store.insert_key(&clash).await {
        Err(StoreError::Conflict(_)) => {}
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert_eq!(
        store.get_key(&original.id).await.expect("get"),
        Some(original)
    );
}

async fn usage_batches_skip_stored_request_ids(ctx: Ctx) {
    let store = ctx.store.as_ref();
    add_keys(store, &[1]).await;
    let k = key_id(1);
    let first = vec![
        event("r1", &k, at(2026, 2, 1, 10, 0, 0)),
        event("r2", &k, at(2026, 2, 1, 10, 0, 1)),
        refused("r3", &k, at(2026, 2, 1, 10, 0, 2)),
    ];
    store.insert_usage(&first).await.expect("first batch");
    store.insert_usage(&[]).await.expect("empty batch");

    // A retried batch: two already stored (one with other data, which must
    // not overwrite), one new, and the new one twice.
    let changed_r1 = UsageEvent {
        text_chars: 9_999,
        ..first[0].clone()
    };
    let retry = vec![
        changed_r1,
        first[1].clone(),
        event("r4", &k, at(2026, 2, 1, 10, 0, 3)),
        event("r4", &k, at(2026, 2, 1, 10, 0, 3)),
    ];
    store.insert_usage(&retry).await.expect("retried batch");

    let stored = store.usage_events(None).await.expect("read");
    assert_eq!(request_ids(&stored), ["r1", "r2", "r3", "r4"]);
    assert_eq!(
        stored[..3],
        first[..],
        "stored events are kept as first written"
    );
}

async fn usage_events_filter_by_key(ctx: Ctx) {
    let store = ctx.store.as_ref();
    add_keys(store, &[1, 2]).await;
    let (a, b) = (key_id(1), key_id(2));
    let precise = at(2026, 2, 1, 9, 0, 0) + chrono::Duration::microseconds(654_321);
    let events = vec![
        event("b-late", &b, at(2026, 2, 2, 0, 0, 0)),
        UsageEvent {
            image_items: 2,
            image_bytes: 5_000_000_000,
            deep_analyses: 1,
            flagged: true,
            latency_ms: 4_000_000_000,
            endpoint: Endpoint::Moderations,
            ..event("a-2", &a, precise)
        },
        event("a-1", &a, at(2026, 1, 15, 0, 0, 0)),
        client_error("b-early", &b, at(2026, 1, 1, 0, 0, 0)),
    ];
    store.insert_usage(&events).await.expect("insert");

    let of_a = store.usage_events(Some(&a)).await.expect("read a");
    assert_eq!(
        of_a,
        vec![events[2].clone(), events[1].clone()],
        "a's events, oldest first"
    );
    let of_b = store.usage_events(Some(&b)).await.expect("read b");
    assert_eq!(request_ids(&of_b), ["b-early", "b-late"]);
    let all = store.usage_events(None).await.expect("read all");
    assert_eq!(request_ids(&all), ["b-early", "a-1", "a-2", "b-late"]);
    assert!(store
        .usage_events(Some(&key_id(3)))
        .await
        .expect("read none")
        .is_empty());
}

async fn usage_for_unknown_key_is_rejected_whole(ctx: Ctx) {
    let store = ctx.store.as_ref();
    add_keys(store, &[1]).await;
    let batch = vec![
        event("ok", &key_id(1), at(2026, 2, 1, 0, 0, 0)),
        event("orphan", &key_id(0xdead), at(2026, 2, 1, 0, 0, 0)),
    ];
    match store.insert_usage(&batch).await {
        Err(StoreError::Conflict(_)) => {}
        other => panic!("expected Conflict for an unknown key, got {other:?}"),
    }
    let stored = store.usage_events(None).await.expect("read");
    assert!(
        stored.is_empty(),
        "the batch is one transaction: {stored:?}"
    );
}

/// Key 1: a billable request late on Jan 31, three on Feb 1 (one with images
/// and a deep analysis) plus a refused one, one on Feb 15, and on Mar 1 only
/// a client error. Key 2: two billable requests on Feb 10.
async fn seed_billing(store: &dyn Store) -> (KeyId, KeyId) {
    add_keys(store, &[1, 2]).await;
    let (a, b) = (key_id(1), key_id(2));
    let events = vec![
        UsageEvent {
            text_items: 3,
            text_chars: 300,
            ..event("a1", &a, at(2026, 1, 31, 23, 59, 59))
        },
        event("a2", &a, at(2026, 2, 1, 0, 0, 0)),
        UsageEvent {
            text_items: 0,
            text_chars: 0,
            image_items: 2,
            image_bytes: 1_000,
            deep_analyses: 1,
            ..event("a3", &a, at(2026, 2, 1, 12, 0, 0))
        },
        event("a4", &a, at(2026, 2, 1, 23, 59, 59)),
        refused("a5", &a, at(2026, 2, 1, 13, 0, 0)),
        UsageEvent {
            text_items: 5,
            text_chars: 1_000,
            ..event("a6", &a, at(2026, 2, 15, 8, 0, 0))
        },
        client_error("a7", &a, at(2026, 3, 1, 8, 0, 0)),
        event("b1", &b, at(2026, 2, 10, 1, 0, 0)),
        event("b2", &b, at(2026, 2, 10, 2, 0, 0)),
    ];
    store.insert_usage(&events).await.expect("insert usage");
    (a, b)
}

#[allow(clippy::too_many_arguments)]
fn row(
    key_id: &KeyId,
    period: Period,
    start: NaiveDate,
    requests: u64,
    text_items: u64,
    text_chars: u64,
    image_items: u64,
    deep_analyses: u64,
    rate_limited: u64,
) -> BillingRow {
    BillingRow {
        key_id: key_id.clone(),
        period,
        period_start: start,
        requests,
        text_items,
        text_chars,
        image_items,
        deep_analyses,
        rate_limited,
    }
}

async fn billing_per_day(ctx: Ctx) {
    let store = ctx.store.as_ref();
    let (a, b) = seed_billing(store).await;
    let d = Period::Day;

    let all = store.billing(d, None, None).await.expect("billing");
    let expected = vec![
        row(&a, d, day(2026, 1, 31), 1, 3, 300, 0, 0, 0),
        row(&a, d, day(2026, 2, 1), 3, 2, 20, 2, 1, 1),
        row(&a, d, day(2026, 2, 15), 1, 5, 1_000, 0, 0, 0),
        row(&b, d, day(2026, 2, 10), 2, 2, 20, 0, 0, 0),
    ];
    assert_eq!(
        all, expected,
        "Mar 1 has no billable or refused request, so no row"
    );

    let since_feb = store
        .billing(d, None, Some(day(2026, 2, 1)))
        .await
        .expect("billing");
    assert_eq!(
        since_feb,
        expected[1..].to_vec(),
        "since is inclusive and cuts at UTC midnight"
    );

    let only_b = store.billing(d, Some(&b), None).await.expect("billing");
    assert_eq!(only_b, expected[3..].to_vec());

    let a_since = store
        .billing(d, Some(&a), Some(day(2026, 2, 2)))
        .await
        .expect("billing");
    assert_eq!(a_since, expected[2..3].to_vec());

    let none = store
        .billing(d, None, Some(day(2026, 4, 1)))
        .await
        .expect("billing");
    assert!(none.is_empty());
}

async fn billing_per_month(ctx: Ctx) {
    let store = ctx.store.as_ref();
    let (a, b) = seed_billing(store).await;
    let m = Period::Month;

    let all = store.billing(m, None, None).await.expect("billing");
    let expected = vec![
        row(&a, m, day(2026, 1, 1), 1, 3, 300, 0, 0, 0),
        row(&a, m, day(2026, 2, 1), 4, 7, 1_020, 2, 1, 1),
        row(&b, m, day(2026, 2, 1), 2, 2, 20, 0, 0, 0),
    ];
    assert_eq!(all, expected);

    // A `since` inside a month counts that month from that day on.
    let since = store
        .billing(m, Some(&a), Some(day(2026, 2, 2)))
        .await
        .expect("billing");
    assert_eq!(
        since,
        vec![row(&a, m, day(2026, 2, 1), 1, 5, 1_000, 0, 0, 0)]
    );
}

/// What a billing job does: read the view with plain SQL.
async fn billing_view_matches_daily_billing(ctx: Ctx) {
    let store = ctx.store.as_ref();
    seed_billing(store).await;
    let sql = match ctx.kind {
        Backend::Postgres => {
            "SELECT key_id, day::text AS day, requests, text_items, text_chars, \
                           image_items, deep_analyses, rate_limited \
                           FROM usage_billing_daily ORDER BY key_id, day"
        }
        Backend::Sqlite => {
            "SELECT key_id, day, requests, text_items, text_chars, \
                         image_items, deep_analyses, rate_limited \
                         FROM usage_billing_daily ORDER BY key_id, day"
        }
    };
    type ViewRow = (String, String, i64, i64, i64, i64, i64, i64);
    let from_view: Vec<ViewRow> = match ctx.kind {
        Backend::Postgres => {
            let pg = PostgresStore::connect(&ctx.url).await.expect("connect");
            sqlx::query_as(sql)
                .fetch_all(pg.pool())
                .await
                .expect("query view")
        }
        Backend::Sqlite => {
            let lite = SqliteStore::connect(&ctx.url).await.expect("connect");
            sqlx::query_as(sql)
                .fetch_all(lite.pool())
                .await
                .expect("query view")
        }
    };
    let from_store: Vec<ViewRow> = store
        .billing(Period::Day, None, None)
        .await
        .expect("billing")
        .into_iter()
        .map(|r| {
            (
                r.key_id.to_string(),
                r.period_start.format("%Y-%m-%d").to_string(),
                r.requests as i64,
                r.text_items as i64,
                r.text_chars as i64,
                r.image_items as i64,
                r.deep_analyses as i64,
                r.rate_limited as i64,
            )
        })
        .collect();
    assert_eq!(from_view.len(), 4);
    assert_eq!(from_view, from_store);
}

async fn thousand_event_batch_lands(ctx: Ctx) {
    let store = ctx.store.as_ref();
    add_keys(store, &[1]).await;
    let k = key_id(1);
    let start = at(2026, 5, 1, 0, 0, 0);
    let batch: Vec<UsageEvent> = (0..1_000)
        .map(|i| UsageEvent {
            text_chars: i,
            ..event(
                &format!("req-{i:04}"),
                &k,
                start + chrono::Duration::seconds(i as i64),
            )
        })
        .collect();
    store.insert_usage(&batch).await.expect("insert 1,000");
    store.insert_usage(&batch).await.expect("retry of 1,000");

    let stored = store.usage_events(Some(&k)).await.expect("read");
    assert_eq!(stored, batch);
    let billed = store
        .billing(Period::Month, None, None)
        .await
        .expect("billing");
    assert_eq!(billed.len(), 1);
    assert_eq!(billed[0].requests, 1_000);
    assert_eq!(billed[0].text_chars, (0..1_000).sum::<u64>());
}

async fn concurrent_batches_all_land(ctx: Ctx) {
    const TASKS: usize = 8;
    const BATCHES: usize = 10;
    const PER_BATCH: usize = 50;
    add_keys(ctx.store.as_ref(), &[1, 2]).await;
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..TASKS {
        let store = ctx.store.clone();
        tasks.spawn(async move {
            let k = key_id(1 + (t % 2) as u64);
            for b in 0..BATCHES {
                let batch: Vec<UsageEvent> = (0..PER_BATCH)
                    .map(|i| event(&format!("t{t}-b{b}-e{i}"), &k, at(2026, 6, 1, 0, 0, 0)))
                    .collect();
                store.insert_usage(&batch).await.expect("concurrent insert");
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.expect("task finished");
    }
    let stored = ctx.store.usage_events(None).await.expect("read");
    assert_eq!(stored.len(), TASKS * BATCHES * PER_BATCH);
    let billed = ctx
        .store
        .billing(Period::Day, None, None)
        .await
        .expect("billing");
    let per_key: Vec<u64> = billed.iter().map(|r| r.requests).collect();
    let half = (TASKS / 2 * BATCHES * PER_BATCH) as u64;
    assert_eq!(per_key, [half, half]);
}

#[tokio::test]
async fn unreachable_postgres_is_unavailable_not_a_hang() {
    let url = "postgres://postgres:hunter2@127.0.0.1:1/x";
    // A guard against hanging, not a speed check: connect gives up after
    // its ~3 s acquire timeout.
    let outcome = tokio::time::timeout(Duration::from_secs(30), store::connect(url))
        .await
        .expect("connect must give up on its own");
    match outcome {
        Err(StoreError::Unavailable(message)) => {
            assert!(!message.contains("hunter2"), "password leaked: {message}");
            assert!(message.contains("127.0.0.1:1"), "says where: {message}");
        }
        Err(other) => panic!("expected Unavailable, got {other:?}"),
        Ok(_) => panic!("connected to a closed port"),
    }
}

#[tokio::test]
async fn unknown_scheme_names_the_accepted_ones() {
    match store::connect("mysql://root:hunter2@localhost/db").await {
        Err(StoreError::Other(message)) => {
            assert!(
                message.contains("postgres://") && message.contains("sqlite:"),
                "{message}"
            );
            assert!(!message.contains("hunter2"), "password leaked: {message}");
        }
        Err(other) => panic!("expected Other, got {other:?}"),
        Ok(_) => panic!("mysql is not a backend"),
    }
}

#[tokio::test]
async fn sqlite_creates_missing_folders_and_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("nested").join("deeper").join("moderato.db");
    let url = format!("sqlite:{}", path.display());
    let store = store::connect(&url)
        .await
        .expect("connect creates the file");
    store.ping().await.expect("ping");
    assert!(
        path.is_file(),
        "database file created at {}",
        path.display()
    );
}

#[tokio::test]
async fn sqlite_file_is_shared_between_processes_opening_it() {
    // The server and the `moderato keys` CLI each open their own pool.
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite:{}", dir.path().join("shared.db").display());
    let server = store::connect(&url).await.expect("server connect");
    let cli = store::connect(&url).await.expect("cli connect");
    cli.insert_key(&key(9, at(2026, 1, 1, 0, 0, 0)))
        .await
        .expect("cli inserts");
    let seen = server.get_key(&key_id(9)).await.expect("server reads");
    assert_eq!(seen.map(|k| k.name), Some("customer 9".to_owned()));

    let lite = SqliteStore::connect(&url).await.expect("connect");
    let (mode,): (String,) = sqlx::query_as("PRAGMA journal_mode")
        .fetch_one(lite.pool())
        .await
        .expect("pragma");
    assert_eq!(mode.to_lowercase(), "wal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_first_start_by_several_processes_migrates_once() {
    // The server and a `moderato keys` command may both find no database.
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite:{}", dir.path().join("fresh.db").display());
    let opened = futures::future::join_all((0..4).map(|_| store::connect(&url))).await;
    for (i, outcome) in opened.into_iter().enumerate() {
        let store = outcome.unwrap_or_else(|e| panic!("opener {i} failed: {e}"));
        store.list_keys().await.expect("schema in place");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_in_memory_keeps_data_across_pooled_connections() {
    let store = store::connect("sqlite::memory:").await.expect("connect");
    add_keys(store.as_ref(), &[1, 2, 3]).await;
    // More concurrent readers than one connection: they must see one database.
    let reads = futures::future::join_all((0..6).map(|_| store.list_keys())).await;
    for keys in reads {
        assert_eq!(keys.expect("list").len(), 3);
    }
}

// Accounts, dashboard sessions and the sign-in lockout.

on_both_backends!(with super::run:
    accounts_round_trip_and_emails_are_unique,
    cli_keys_belong_to_the_operator_account,
    account_keys_take_the_accounts_plan_and_follow_its_changes,
    account_keys_are_capped_even_when_requested_at_once,
    disabling_an_account_refuses_its_keys_and_ends_its_sessions,
    only_the_owner_revokes_an_account_key,
    account_keys_report_their_last_use,
    sessions_expire_when_idle_and_are_extended_when_seen,
    sign_in_failures_are_counted_by_email_address_and_device,
    device_cookies_belong_to_one_account_and_expire,
    sign_ups_are_counted_by_address,
    unconfirmed_sign_ups_are_pruned_when_their_links_expire,
    password_tokens_are_single_use_and_expire,
    pruning_deletes_old_attempts_and_expired_credentials_only,
    policies_are_versioned_kept_apart_and_read_with_the_key,
    usage_is_counted_per_day_and_policy,
);

fn new_account(email: &str, role: Role, plan: Plan) -> Account {
    Account::new(Email::parse(email).expect("email"), role, plan, None)
}

fn free() -> Plan {
    Plan::new(Tier::Free, None).expect("plan")
}

fn account_key(n: u64) -> NewAccountKey {
    NewAccountKey {
        id: key_id(n),
        name: format!("dashboard key {n}"),
        key_rpm: None,
        secret_hash: vec![n as u8; 32],
        created_at: at(2026, 1, 1, 0, 0, n as u32),
        policy_id: None,
    }
}

async fn accounts_round_trip_and_emails_are_unique(ctx: Ctx) {
    let store = ctx.store.as_ref();
    let hash = PasswordHash::from_stored("$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA".into());
    let mut ada = new_account(
        "Ada@Example.com",
        Role::Admin,
        Plan::new(Tier::Enterprise, Some(5000)).unwrap(),
    );
    ada.password_hash = Some(hash.clone());
    store.insert_account(&ada).await.expect("insert");
    let stored = store.get_account(&ada.id).await.unwrap().expect("found");
    assert_eq!(stored.email.as_str(), "ada@example.com");
    assert_eq!(stored.role, Role::Admin);
    assert_eq!(
        stored.plan,
        Plan::new(Tier::Enterprise, Some(5000)).unwrap()
    );
    assert_eq!(stored.password_hash, Some(hash));
    assert!(stored.disabled_at.is_none());
    let by_email = store
        .account_by_email(&Email::parse("ADA@example.com").unwrap())
        .await
        .unwrap()
        .expect("found by e-mail in any case");
    assert_eq!(by_email.id, ada.id);

    let twin = new_account("ada@example.com", Role::Customer, free());
    match store.insert_account(&twin).await {
        Err(StoreError::Conflict(_)) => {}
        other => panic!("expected a conflict, got {other:?}"),
    }
    let listed: Vec<String> = store
        .list_accounts()
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.account.email.to_string())
        .collect();
    assert_eq!(listed, ["operator@localhost", "ada@example.com"]);
}

async fn cli_keys_belong_to_the_operator_account(ctx: Ctx) {
    let store = ctx.store.as_ref();
    add_keys(store, &[1]).await;
    let operator = store
        .get_account(&AccountId::operator())
        .await
        .unwrap()
        .expect("the migration creates the operator account");
    assert!(operator.password_hash.is_none(), "nobody signs in as it");
    let keys = store.account_keys(&operator.id).await.unwrap();
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0].key.id, key_id(1));
    assert!(store.get_key(&key_id(1)).await.unwrap().is_some());
    // Its keys keep their own plans: the operator account has none to give.
    assert!(!store
        .set_account_plan(&operator.id, Plan::new(Tier::Pro, None).unwrap())
        .await
        .unwrap());
    assert_eq!(
        store.get_key(&key_id(1)).await.unwrap().unwrap().tier,
        Tier::Free
    );
}

async fn account_keys_take_the_accounts_plan_and_follow_its_changes(ctx: Ctx) {
    let store = ctx.store.as_ref();
    let acct = new_account(
        "b@example.com",
        Role::Customer,
        Plan::new(Tier::Basic, None).unwrap(),
    );
    store.insert_account(&acct).await.unwrap();
    store
        .insert_account_key(&acct.id, &account_key(1), 100)
        .await
        .unwrap();
    store
        .insert_account_key(&acct.id, &account_key(2), 100)
        .await
        .unwrap();
    add_keys(store, &[3]).await;
    let key = store.get_key(&key_id(1)).await.unwrap().unwrap();
    assert_eq!((key.tier, key.custom_rpm), (Tier::Basic, None));

    let enterprise = Plan::new(Tier::Enterprise, Some(4321)).unwrap();
    assert!(store.set_account_plan(&acct.id, enterprise).await.unwrap());
    for n in [1, 2] {
        let key = store.get_key(&key_id(n)).await.unwrap().unwrap();
        assert_eq!((key.tier, key.custom_rpm), (Tier::Enterprise, Some(4321)));
    }
    let other = store.get_key(&key_id(3)).await.unwrap().unwrap();
    assert_eq!(other.tier, Tier::Free, "another account's key is untouched");
    assert_eq!(
        store.get_account(&acct.id).await.unwrap().unwrap().plan,
        enterprise
    );
    // A key made after the change takes the new plan.
    store
        .insert_account_key(&acct.id, &account_key(4), 100)
        .await
        .unwrap();
    assert_eq!(
        store.get_key(&key_id(4)).await.unwrap().unwrap().custom_rpm,
        Some(4321)
    );
    match store
        .insert_account_key(&AccountId::new_random(), &account_key(5), 100)
        .await
    {
        Err(StoreError::Conflict(_)) => {}
        other => panic!("a key for no account must fail, got {other:?}"),
    }
    assert!(!store
        .set_account_plan(&AccountId::new_random(), free())
        .await
        .unwrap());
}

/// Twelve keys requested at once for an account that may hold three: three
/// are made, on both backends, and a revoked key makes room for one more.
async fn account_keys_are_capped_even_when_requested_at_once(ctx: Ctx) {
    use moderato::access::KeyOwner;
    use moderato::store::AccountKeyInsert;
    let acct = new_account("cap@example.com", Role::Customer, free());
    ctx.store.insert_account(&acct).await.unwrap();
    let attempts = (1..=12).map(|n| {
        let store = ctx.store.clone();
        let id = acct.id.clone();
        async move {
            let key = NewAccountKey {
                key_rpm: Some(4),
                ..account_key(n)
            };
            store.insert_account_key(&id, &key, 3).await.unwrap()
        }
    });
    let outcomes = futures::future::join_all(attempts).await;
    let created = outcomes
        .iter()
        .filter(|o| **o == AccountKeyInsert::Created)
        .count();
    assert_eq!(created, 3, "{outcomes:?}");
    let keys = ctx.store.account_keys(&acct.id).await.unwrap();
    assert_eq!(keys.len(), 3);
    let key = &keys[0].key;
    assert_eq!(
        key.owner,
        KeyOwner::Account {
            id: acct.id.clone(),
            key_rpm: Some(4)
        },
        "the key's own limit is kept apart from its account's plan"
    );
    assert_eq!((key.tier, key.custom_rpm), (Tier::Free, None));

    assert!(ctx
        .store
        .revoke_account_key(&acct.id, &key.id)
        .await
        .unwrap());
    assert_eq!(
        ctx.store
            .insert_account_key(&acct.id, &account_key(20), 3)
            .await
            .unwrap(),
        AccountKeyInsert::Created
    );
    assert_eq!(
        ctx.store
            .insert_account_key(&acct.id, &account_key(21), 3)
            .await
            .unwrap(),
        AccountKeyInsert::AccountFull
    );
}

async fn disabling_an_account_refuses_its_keys_and_ends_its_sessions(ctx: Ctx) {
    let store = ctx.store.as_ref();
    let acct = new_account("c@example.com", Role::Customer, free());
    store.insert_account(&acct).await.unwrap();
    store
        .insert_account_key(&acct.id, &account_key(1), 100)
        .await
        .unwrap();
    add_keys(store, &[2]).await;
    let now = Utc::now();
    store
        .insert_session(&NewSession {
            id_hash: vec![7; 32],
            account_id: acct.id.clone(),
            csrf_token: "t".into(),
            created_at: now,
            expires_at: now + chrono::Duration::hours(1),
        })
        .await
        .unwrap();
    assert!(store
        .get_key(&key_id(1))
        .await
        .unwrap()
        .unwrap()
        .revoked_at
        .is_none());

    assert!(store.disable_account(&acct.id).await.unwrap());
    let key = store.get_key(&key_id(1)).await.unwrap().unwrap();
    assert!(
        key.revoked_at.is_some(),
        "a disabled account's key is refused"
    );
    assert!(store
        .get_key(&key_id(2))
        .await
        .unwrap()
        .unwrap()
        .revoked_at
        .is_none());
    assert!(store
        .touch_session(&[7; 32], &used(now, now + chrono::Duration::hours(1)))
        .await
        .unwrap()
        .is_none());
    let disabled = store.get_account(&acct.id).await.unwrap().unwrap();
    assert!(disabled.disabled_at.is_some());
    assert!(!store
        .disable_account(&AccountId::new_random())
        .await
        .unwrap());
}

async fn only_the_owner_revokes_an_account_key(ctx: Ctx) {
    let store = ctx.store.as_ref();
    let owner = new_account("d@example.com", Role::Customer, free());
    let other = new_account("e@example.com", Role::Customer, free());
    store.insert_account(&owner).await.unwrap();
    store.insert_account(&other).await.unwrap();
    store
        .insert_account_key(&owner.id, &account_key(1), 100)
        .await
        .unwrap();
    assert!(!store
        .revoke_account_key(&other.id, &key_id(1))
        .await
        .unwrap());
    assert!(store
        .get_key(&key_id(1))
        .await
        .unwrap()
        .unwrap()
        .revoked_at
        .is_none());
    assert!(store.account_keys(&other.id).await.unwrap().is_empty());
    assert!(store
        .revoke_account_key(&owner.id, &key_id(1))
        .await
        .unwrap());
    assert!(store
        .get_key(&key_id(1))
        .await
        .unwrap()
        .unwrap()
        .revoked_at
        .is_some());
}

async fn account_keys_report_their_last_use(ctx: Ctx) {
    let store = ctx.store.as_ref();
    let acct = new_account("f@example.com", Role::Customer, free());
    store.insert_account(&acct).await.unwrap();
    store
        .insert_account_key(&acct.id, &account_key(1), 100)
        .await
        .unwrap();
    store
        .insert_account_key(&acct.id, &account_key(2), 100)
        .await
        .unwrap();
    store
        .insert_usage(&[
            event("r1", &key_id(1), at(2026, 3, 1, 10, 0, 0)),
            refused("r2", &key_id(1), at(2026, 3, 2, 11, 30, 0)),
        ])
        .await
        .unwrap();
    let keys = store.account_keys(&acct.id).await.unwrap();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0].key.id, key_id(1));
    assert_eq!(keys[0].last_used, Some(at(2026, 3, 2, 11, 30, 0)));
    assert_eq!(keys[1].last_used, None);
    let listing = store.list_accounts().await.unwrap();
    let mine = listing.iter().find(|l| l.account.id == acct.id).unwrap();
    assert_eq!(mine.last_activity, Some(at(2026, 3, 2, 11, 30, 0)));
}

async fn sessions_expire_when_idle_and_are_extended_when_seen(ctx: Ctx) {
    let store = ctx.store.as_ref();
    let acct = new_account("g@example.com", Role::Customer, free());
    store.insert_account(&acct).await.unwrap();
    let t0 = at(2026, 5, 1, 12, 0, 0);
    let minutes = |m: i64| chrono::Duration::minutes(m);
    store
        .insert_session(&NewSession {
            id_hash: vec![1; 32],
            account_id: acct.id.clone(),
            csrf_token: "csrf-1".into(),
            created_at: t0,
            expires_at: t0 + minutes(10),
        })
        .await
        .unwrap();
    let seen = store
        .touch_session(&[1; 32], &used(t0 + minutes(9), t0 + minutes(19)))
        .await
        .unwrap()
        .expect("alive at 9 minutes");
    assert_eq!(seen.account_id, acct.id);
    assert_eq!(seen.csrf_token, "csrf-1");
    assert_eq!(seen.expires_at, t0 + minutes(19));
    // Extended: alive at 18 minutes, past the first expiry.
    assert!(store
        .touch_session(&[1; 32], &used(t0 + minutes(18), t0 + minutes(28)))
        .await
        .unwrap()
        .is_some());
    // Idle past its expiry: gone.
    assert!(store
        .touch_session(&[1; 32], &used(t0 + minutes(40), t0 + minutes(50)))
        .await
        .unwrap()
        .is_none());
    assert!(store
        .touch_session(&[2; 32], &used(t0, t0 + minutes(10)))
        .await
        .unwrap()
        .is_none());
    // Busy, but signed in before the absolute lifetime's bound: gone.
    store
        .insert_session(&NewSession {
            id_hash: vec![3; 32],
            account_id: acct.id.clone(),
            csrf_token: "csrf-3".into(),
            created_at: t0,
            expires_at: t0 + minutes(10),
        })
        .await
        .unwrap();
    let at_5 = |created_after| SessionUse {
        now: t0 + minutes(5),
        expires_at: t0 + minutes(15),
        created_after,
    };
    assert!(store
        .touch_session(&[3; 32], &at_5(t0 - minutes(1)))
        .await
        .unwrap()
        .is_some());
    assert!(store
        .touch_session(&[3; 32], &at_5(t0 + minutes(1)))
        .await
        .unwrap()
        .is_none());
    store.delete_session(&[1; 32]).await.unwrap();
}

/// A use of a session at `now` that extends it to `expires_at`, well within
/// any absolute lifetime.
fn used(now: DateTime<Utc>, expires_at: DateTime<Utc>) -> SessionUse {
    SessionUse {
        now,
        expires_at,
        created_after: now - chrono::Duration::days(365),
    }
}

async fn sign_in_failures_are_counted_by_email_address_and_device(ctx: Ctx) {
    let store = ctx.store.as_ref();
    let t0 = at(2026, 6, 1, 8, 0, 0);
    let minutes = |m: i64| t0 + chrono::Duration::minutes(m);
    let device = [7u8; 32];
    for (email, address, dev, m) in [
        ("a@x.org", "10.0.0.1", None, 0),
        ("a@x.org", "10.0.0.1", None, 5),
        ("a@x.org", "10.0.0.2", None, 6),
        ("b@x.org", "10.0.0.1", None, 7),
        // Made with a device cookie of a@x.org: the device's, not the account's.
        ("a@x.org", "10.0.0.3", Some(&device[..]), 8),
    ] {
        store
            .record_sign_in_failure(email, address, dev, minutes(m))
            .await
            .unwrap();
    }
    let counts = store
        .sign_in_failures("a@x.org", "10.0.0.1", None, minutes(-1))
        .await
        .unwrap();
    assert_eq!(
        (
            counts.by_email.count,
            counts.by_address.count,
            counts.by_device.count
        ),
        (3, 3, 0)
    );
    assert_eq!(counts.by_email.oldest, Some(minutes(0)));
    assert_eq!(counts.by_address.oldest, Some(minutes(0)));
    let with_device = store
        .sign_in_failures("a@x.org", "10.0.0.3", Some(&device[..]), minutes(-1))
        .await
        .unwrap();
    assert_eq!(with_device.by_device.count, 1);
    assert_eq!(with_device.by_device.oldest, Some(minutes(8)));
    assert_eq!(with_device.by_address.count, 1);
    assert_eq!(
        with_device.by_email.count, 3,
        "device failures are not the account's"
    );
    // Older failures fall out of the window.
    let later = store
        .sign_in_failures("a@x.org", "10.0.0.1", None, minutes(5))
        .await
        .unwrap();
    assert_eq!((later.by_email.count, later.by_address.count), (2, 2));
    assert_eq!(later.by_email.oldest, Some(minutes(5)));
    let none = store
        .sign_in_failures("c@x.org", "10.0.0.9", Some(&[9u8; 32][..]), minutes(-1))
        .await
        .unwrap();
    assert_eq!(none, SignInFailures::default());
}

async fn device_cookies_belong_to_one_account_and_expire(ctx: Ctx) {
    let store = ctx.store.as_ref();
    let acct = new_account("d@example.com", Role::Customer, free());
    store.insert_account(&acct).await.unwrap();
    let now = Utc::now();
    let later = now + chrono::Duration::days(1);
    store
        .insert_device(&[3; 32], &acct.id, now, later)
        .await
        .unwrap();
    assert_eq!(
        store.device_account(&[3; 32], now).await.unwrap(),
        Some(acct.id.clone())
    );
    assert_eq!(store.device_account(&[4; 32], now).await.unwrap(), None);
    assert_eq!(
        store.device_account(&[3; 32], later).await.unwrap(),
        None,
        "expired"
    );
}

async fn sign_ups_are_counted_by_address(ctx: Ctx) {
    let store = ctx.store.as_ref();
    let t0 = at(2026, 6, 1, 8, 0, 0);
    let minutes = |m: i64| t0 + chrono::Duration::minutes(m);
    for (address, m) in [("10.0.0.1", 0), ("10.0.0.1", 30), ("10.0.0.2", 31)] {
        store.record_sign_up(address, minutes(m)).await.unwrap();
    }
    let all = store.sign_ups("10.0.0.1", minutes(-1)).await.unwrap();
    assert_eq!((all.count, all.oldest), (2, Some(minutes(0))));
    let recent = store.sign_ups("10.0.0.1", minutes(1)).await.unwrap();
    assert_eq!((recent.count, recent.oldest), (1, Some(minutes(30))));
    assert_eq!(
        store.sign_ups("10.0.0.9", minutes(-1)).await.unwrap().count,
        0
    );
}

async fn password_tokens_are_single_use_and_expire(ctx: Ctx) {
    let store = ctx.store.as_ref();
    let acct = new_account("h@example.com", Role::Customer, free());
    store.insert_account(&acct).await.unwrap();
    let now = Utc::now();
    let day_later = now + chrono::Duration::hours(24);
    store
        .insert_password_token(&[1; 32], &acct.id, day_later)
        .await
        .unwrap();
    store
        .insert_password_token(&[2; 32], &acct.id, now - chrono::Duration::seconds(1))
        .await
        .unwrap();
    assert_eq!(
        store.take_password_token(&[1; 32], now).await.unwrap(),
        Some(acct.id.clone())
    );
    assert_eq!(
        store.take_password_token(&[1; 32], now).await.unwrap(),
        None
    );
    assert_eq!(
        store.take_password_token(&[2; 32], now).await.unwrap(),
        None
    );
    // A used link ends the account's other links.
    for id in [10u8, 11] {
        store
            .insert_password_token(&[id; 32], &acct.id, day_later)
            .await
            .unwrap();
    }
    assert!(store
        .take_password_token(&[10; 32], now)
        .await
        .unwrap()
        .is_some());
    assert_eq!(
        store.take_password_token(&[11; 32], now).await.unwrap(),
        None
    );
    let hash = PasswordHash::from_stored("$argon2id$v=19$x".into());
    let now = Utc::now();
    for id in [4u8, 5] {
        store
            .insert_session(&NewSession {
                id_hash: vec![id; 32],
                account_id: acct.id.clone(),
                csrf_token: format!("csrf-{id}"),
                created_at: now,
                expires_at: now + chrono::Duration::hours(1),
            })
            .await
            .unwrap();
    }
    let alive = |id: u8| async move {
        store
            .touch_session(&[id; 32], &used(now, now + chrono::Duration::hours(1)))
            .await
            .unwrap()
            .is_some()
    };
    // A change keeps the session that made it and ends the others.
    assert!(store
        .set_account_password(&acct.id, Some(&hash), Some(&[4; 32]))
        .await
        .unwrap());
    assert!(alive(4).await && !alive(5).await);
    assert_eq!(
        store
            .get_account(&acct.id)
            .await
            .unwrap()
            .unwrap()
            .password_hash,
        Some(hash.clone())
    );
    // A reset to no password keeps no session, and ends a link still out.
    store
        .insert_password_token(&[12; 32], &acct.id, day_later)
        .await
        .unwrap();
    assert!(store
        .set_account_password(&acct.id, None, None)
        .await
        .unwrap());
    assert_eq!(
        store.password_token_account(&[12; 32], now).await.unwrap(),
        None
    );
    assert!(!alive(4).await);
    assert_eq!(
        store
            .get_account(&acct.id)
            .await
            .unwrap()
            .unwrap()
            .password_hash,
        None
    );
    assert!(!store
        .set_account_password(&AccountId::operator(), Some(&hash), None)
        .await
        .unwrap());
}

async fn pruning_deletes_old_attempts_and_expired_credentials_only(ctx: Ctx) {
    let store = ctx.store.as_ref();
    let acct = new_account("p@example.com", Role::Customer, free());
    store.insert_account(&acct).await.unwrap();
    let now = Utc::now();
    let hours = |h: i64| now + chrono::Duration::hours(h);
    for at in [hours(-30), hours(-2)] {
        store
            .record_sign_in_failure("p@example.com", "10.0.0.1", None, at)
            .await
            .unwrap();
        store.record_sign_up("10.0.0.1", at).await.unwrap();
    }
    store
        .insert_device(&[1; 32], &acct.id, hours(-50), hours(-1))
        .await
        .unwrap();
    store
        .insert_device(&[2; 32], &acct.id, hours(-50), hours(24))
        .await
        .unwrap();
    store
        .insert_password_token(&[5; 32], &acct.id, hours(-1))
        .await
        .unwrap();
    store
        .insert_password_token(&[6; 32], &acct.id, hours(1))
        .await
        .unwrap();

    let deleted = store
        .prune_dashboard_records(hours(-24), now)
        .await
        .unwrap();
    // One old failure, one old sign-up, one expired device, one expired link.
    assert_eq!(deleted, 4);
    let failures = store
        .sign_in_failures("p@example.com", "10.0.0.1", None, hours(-100))
        .await
        .unwrap();
    assert_eq!(failures.by_email.count, 1, "the recent failure is kept");
    assert_eq!(
        store.sign_ups("10.0.0.1", hours(-100)).await.unwrap().count,
        1
    );
    assert_eq!(
        store.device_account(&[2; 32], now).await.unwrap(),
        Some(acct.id.clone())
    );
    assert!(store
        .password_token_account(&[6; 32], now)
        .await
        .unwrap()
        .is_some());
    assert_eq!(
        store
            .prune_dashboard_records(hours(-24), now)
            .await
            .unwrap(),
        0,
        "nothing left to prune"
    );
}

/// An unconfirmed sign-up whose links have all expired is pruned with
/// them; one with a live link, and a confirmed account of the same age,
/// are kept.
async fn unconfirmed_sign_ups_are_pruned_when_their_links_expire(ctx: Ctx) {
    let store = ctx.store.as_ref();
    let now = Utc::now();
    let days_ago = |email: &str, confirmed: bool| {
        let email = Email::parse(email).unwrap();
        let mut account = if confirmed {
            new_account(email.as_str(), Role::Customer, free())
        } else {
            Account::signed_up(email, free())
        };
        account.created_at = now - chrono::Duration::days(3);
        account
    };
    let expired = days_ago("old@example.com", false);
    let live = days_ago("fresh@example.com", false);
    let confirmed = days_ago("kept@example.com", true);
    for account in [&expired, &live, &confirmed] {
        store.insert_account(account).await.unwrap();
    }
    store
        .insert_password_token(&[7; 32], &expired.id, now - chrono::Duration::days(2))
        .await
        .unwrap();
    store
        .insert_password_token(&[8; 32], &live.id, now + chrono::Duration::hours(23))
        .await
        .unwrap();
    let deleted = store
        .prune_dashboard_records(now - chrono::Duration::days(1), now)
        .await
        .unwrap();
    assert_eq!(deleted, 2, "the expired link and its account");
    assert!(store.get_account(&expired.id).await.unwrap().is_none());
    assert!(store.get_account(&live.id).await.unwrap().is_some());
    assert!(store.get_account(&confirmed.id).await.unwrap().is_some());
}

fn draft(name: &str, off: &[Category], by: &str) -> PolicyDraft {
    let mut rules = CategoryRules::default();
    for c in off {
        rules.set(*c, Some(CategoryRule::Off));
    }
    PolicyDraft {
        name: name.into(),
        rules,
        speed: Speed::default(),
        changed_by: by.into(),
    }
}

async fn policies_are_versioned_kept_apart_and_read_with_the_key(ctx: Ctx) {
    let store = ctx.store.as_ref();
    let a = new_account("a@example.com", Role::Customer, free());
    let b = new_account("b@example.com", Role::Customer, free());
    store.insert_account(&a).await.unwrap();
    store.insert_account(&b).await.unwrap();
    let (pa, pa2, pb) = (
        PolicyId::new_random(),
        PolicyId::new_random(),
        PolicyId::new_random(),
    );
    let t1 = at(2026, 5, 1, 10, 0, 0);
    let strict = draft("strict", &[Category::Hate], "a@example.com");
    store
        .insert_policy(&a.id, &pa, &strict, false, t1)
        .await
        .unwrap();
    match store
        .insert_policy(&a.id, &PolicyId::new_random(), &strict, false, t1)
        .await
    {
        Err(StoreError::Conflict(_)) => {}
        other => panic!("a second policy of the same name: {other:?}"),
    }
    store
        .insert_policy(
            &a.id,
            &pa2,
            &draft("lenient", &[], "cli"),
            false,
            t1 + chrono::Duration::minutes(1),
        )
        .await
        .unwrap();
    store
        .insert_policy(&b.id, &pb, &draft("strict", &[], "cli"), true, t1)
        .await
        .expect("names are per account");

    store
        .insert_account_key(&a.id, &account_key(1), 3)
        .await
        .unwrap();
    let key = store.get_key(&key_id(1)).await.unwrap().unwrap();
    assert_eq!(key.policy, None, "no default, no policy of its own");

    // Defaults and a key's own policy: the account's policies only.
    assert!(!store.set_default_policy(&a.id, Some(&pb)).await.unwrap());
    assert!(store.set_default_policy(&a.id, Some(&pa)).await.unwrap());
    let applied = store
        .get_key(&key_id(1))
        .await
        .unwrap()
        .unwrap()
        .policy
        .unwrap();
    assert_eq!(
        (applied.id.clone(), applied.name.as_str(), applied.version),
        (pa.clone(), "strict", 1)
    );
    assert_eq!(applied.rules.get(Category::Hate), Some(CategoryRule::Off));
    assert!(!store
        .set_key_policy(&a.id, &key_id(1), Some(&pb))
        .await
        .unwrap());
    assert!(!store.set_key_policy(&b.id, &key_id(1), None).await.unwrap());
    assert!(store
        .set_key_policy(&a.id, &key_id(1), Some(&pa2))
        .await
        .unwrap());
    let key = store.get_key(&key_id(1)).await.unwrap().unwrap();
    assert_eq!(key.policy_id, Some(pa2.clone()));
    assert_eq!(key.policy.unwrap().id, pa2);
    assert!(store.set_key_policy(&a.id, &key_id(1), None).await.unwrap());
    let key = store.get_key(&key_id(1)).await.unwrap().unwrap();
    assert_eq!((key.policy_id, key.policy.unwrap().id), (None, pa.clone()));

    // A change is the next version, kept with who and when; never through
    // another account.
    let t2 = at(2026, 5, 2, 11, 30, 0);
    let mut changed = draft("strict", &[Category::Hate, Category::Violence], "cli");
    changed.speed = Speed::Fast;
    changed.rules.set(
        Category::Sexual,
        Some(CategoryRule::Threshold(Threshold::new(0.25).unwrap())),
    );
    assert_eq!(
        store.update_policy(&b.id, &pa, &changed, t2).await.unwrap(),
        None
    );
    assert_eq!(
        store.update_policy(&a.id, &pa, &changed, t2).await.unwrap(),
        Some(2)
    );
    let applied = store
        .get_key(&key_id(1))
        .await
        .unwrap()
        .unwrap()
        .policy
        .unwrap();
    assert_eq!(applied.version, 2);
    assert_eq!(applied.rules, changed.rules);
    assert_eq!(
        applied.speed,
        Speed::Fast,
        "the key reads the policy's speed"
    );
    let history = store.policy_history(&a.id, &pa).await.unwrap();
    let seen: Vec<(u32, &str, DateTime<Utc>)> = history
        .iter()
        .map(|v| (v.version, v.changed_by.as_str(), v.changed_at))
        .collect();
    assert_eq!(seen, [(2, "cli", t2), (1, "a@example.com", t1)]);
    assert_eq!(history[1].rules, strict.rules);
    assert_eq!(
        (history[0].speed, history[1].speed),
        (Speed::Fast, Speed::Accurate),
        "each version keeps the speed it had"
    );
    assert!(store.policy_history(&b.id, &pa).await.unwrap().is_empty());
    assert!(store.get_policy(&b.id, &pa).await.unwrap().is_none());
    let listed = store.account_policies(&a.id).await.unwrap();
    let listed: Vec<(&str, u32, bool)> = listed
        .iter()
        .map(|p| (p.name.as_str(), p.version, p.is_default))
        .collect();
    assert_eq!(listed, [("strict", 2, true), ("lenient", 1, false)]);
    // No default: the shipped thresholds again.
    assert!(store.set_default_policy(&a.id, None).await.unwrap());
    assert_eq!(
        store.get_key(&key_id(1)).await.unwrap().unwrap().policy,
        None
    );
}

async fn usage_is_counted_per_day_and_policy(ctx: Ctx) {
    let store = ctx.store.as_ref();
    add_keys(store, &[1]).await;
    let k = key_id(1);
    let p = PolicyId::new_random();
    let day = at(2026, 6, 1, 9, 0, 0);
    let with = |id: &str, at: DateTime<Utc>, policy: Option<&PolicyId>| UsageEvent {
        policy_id: policy.cloned(),
        ..event(id, &k, at)
    };
    store
        .insert_usage(&[
            with("u1", day, None),
            with("u2", day, Some(&p)),
            with("u3", day + chrono::Duration::hours(1), Some(&p)),
            with("u4", day + chrono::Duration::days(1), Some(&p)),
            UsageEvent {
                policy_id: Some(p.clone()),
                ..refused("u5", &k, day)
            },
        ])
        .await
        .unwrap();
    let stored = store.usage_events(Some(&k)).await.unwrap();
    assert_eq!(
        stored
            .iter()
            .filter(|e| e.policy_id.as_ref() == Some(&p))
            .count(),
        4
    );
    let rows = store
        .policy_usage(&k, NaiveDate::from_ymd_opt(2026, 6, 1).unwrap())
        .await
        .unwrap();
    let first = NaiveDate::from_ymd_opt(2026, 6, 1).unwrap();
    let second = NaiveDate::from_ymd_opt(2026, 6, 2).unwrap();
    let row = |day, policy: Option<&PolicyId>, requests, rate_limited| PolicyUsageRow {
        day,
        policy_id: policy.cloned(),
        requests,
        items: requests,
        rate_limited,
    };
    assert_eq!(
        rows,
        [
            row(first, None, 1, 0),
            row(first, Some(&p), 2, 1),
            row(second, Some(&p), 1, 0),
        ]
    );
    assert!(store
        .policy_usage(&k, NaiveDate::from_ymd_opt(2026, 6, 3).unwrap())
        .await
        .unwrap()
        .is_empty());
}

// Usage at scale: hourly rollups that billing, the usage page and its CSV
// read, day partitions and retention (PostgreSQL; SQLite has the rollups
// and the retention, over one table).
on_both_backends!(with super::run:
    rollups_match_raw_counts_after_concurrent_and_retried_batches,
    retention_drops_expired_days_and_keeps_the_rest,
    making_a_day_partition_moves_its_rows_out_of_the_default,
    migration_keeps_an_existing_deployments_rows,
);

/// Billing as it was computed before the rollups: straight from the raw
/// events (read back from the database), by key then period.
fn billing_from_raw(events: &[UsageEvent], period: Period) -> Vec<BillingRow> {
    use chrono::Datelike;
    let mut rows: std::collections::BTreeMap<(String, NaiveDate), BillingRow> =
        std::collections::BTreeMap::new();
    for e in events.iter().filter(|e| e.billable || e.rate_limited) {
        let d = e.at.date_naive();
        let start = match period {
            Period::Day => d,
            Period::Month => d - chrono::Days::new(u64::from(d.day0())),
        };
        let row = rows
            .entry((e.key_id.to_string(), start))
            .or_insert_with(|| BillingRow {
                key_id: e.key_id.clone(),
                period,
                period_start: start,
                requests: 0,
                text_items: 0,
                text_chars: 0,
                image_items: 0,
                deep_analyses: 0,
                rate_limited: 0,
            });
        if e.billable {
            row.requests += 1;
            row.text_items += u64::from(e.text_items);
            row.text_chars += e.text_chars;
            row.image_items += u64::from(e.image_items);
            row.deep_analyses += u64::from(e.deep_analyses);
        }
        if e.rate_limited {
            row.rate_limited += 1;
        }
    }
    rows.into_values().collect()
}

/// The usage CSV's rows of one key as computed from the raw events.
fn policy_usage_from_raw(events: &[UsageEvent], key: &KeyId) -> Vec<PolicyUsageRow> {
    let mut rows: std::collections::BTreeMap<(NaiveDate, Option<String>), PolicyUsageRow> =
        std::collections::BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| e.key_id == *key && (e.billable || e.rate_limited))
    {
        let policy = e.policy_id.as_ref().map(|p| p.as_str().to_owned());
        let row = rows
            .entry((e.at.date_naive(), policy))
            .or_insert_with(|| PolicyUsageRow {
                day: e.at.date_naive(),
                policy_id: e.policy_id.clone(),
                requests: 0,
                items: 0,
                rate_limited: 0,
            });
        if e.billable {
            row.requests += 1;
            row.items += u64::from(e.text_items) + u64::from(e.image_items);
        }
        if e.rate_limited {
            row.rate_limited += 1;
        }
    }
    rows.into_values().collect()
}

/// Every figure the rollups give equals the same figure counted over the
/// raw events: bills per day and month, all keys and one, from a day on,
/// the CSV's rows per policy, and "last used".
async fn assert_rollups_match_raw(store: &dyn Store, keys: &[KeyId]) {
    let raw = store.usage_events(None).await.expect("raw events");
    for period in [Period::Day, Period::Month] {
        assert_eq!(
            store.billing(period, None, None).await.expect("billing"),
            billing_from_raw(&raw, period),
            "{period:?} bills of all keys"
        );
    }
    let since = day(2026, 7, 2);
    let raw_since: Vec<UsageEvent> = raw
        .iter()
        .filter(|e| e.at.date_naive() >= since)
        .cloned()
        .collect();
    for key in keys {
        let of_key: Vec<UsageEvent> = raw_since
            .iter()
            .filter(|e| e.key_id == *key)
            .cloned()
            .collect();
        assert_eq!(
            store
                .billing(Period::Day, Some(key), Some(since))
                .await
                .expect("billing"),
            billing_from_raw(&of_key, Period::Day),
            "daily bill of {key} since {since}"
        );
        assert_eq!(
            store.policy_usage(key, since).await.expect("policy usage"),
            policy_usage_from_raw(&raw_since, key),
            "usage CSV rows of {key}"
        );
    }
    let last_used: Vec<Option<DateTime<Utc>>> = store
        .account_keys(&AccountId::operator())
        .await
        .expect("keys")
        .iter()
        .map(|k| k.last_used)
        .collect();
    let raw_last: Vec<Option<DateTime<Utc>>> = keys
        .iter()
        .map(|k| raw.iter().filter(|e| e.key_id == *k).map(|e| e.at).max())
        .collect();
    assert_eq!(last_used, raw_last, "last used of each key");
}

fn policy(n: u8) -> PolicyId {
    PolicyId::parse(&format!("00000000-0000-4000-8000-0000000000{n:02}")).expect("policy id")
}

/// The `i`-th event of a mixed batch: three days, several hours, two keys,
/// three policies (none among them), billable, refused and failed requests,
/// text and images.
fn mixed_event(request_id: String, i: usize) -> UsageEvent {
    let k = key_id(1 + (i % 2) as u64);
    let when = at(
        2026,
        7,
        1 + (i % 3) as u32,
        (i * 7 % 24) as u32,
        (i % 60) as u32,
        0,
    ) + chrono::Duration::microseconds(i as i64);
    let base = UsageEvent {
        text_items: 1 + (i % 3) as u32,
        text_chars: 10 * i as u64,
        image_items: u32::from(i.is_multiple_of(4)),
        image_bytes: if i.is_multiple_of(4) { 5_000 } else { 0 },
        deep_analyses: u32::from(i.is_multiple_of(5)),
        flagged: i.is_multiple_of(6),
        policy_id: match i % 3 {
            0 => None,
            n => Some(policy(n as u8)),
        },
        ..event(&request_id, &k, when)
    };
    match i % 10 {
        0 => refused(&request_id, &k, when),
        1 => client_error(&request_id, &k, when),
        _ => base,
    }
}

async fn rollups_match_raw_counts_after_concurrent_and_retried_batches(ctx: Ctx) {
    const TASKS: usize = 6;
    const BATCHES: usize = 8;
    const PER_BATCH: usize = 40;
    let store = ctx.store.as_ref();
    add_keys(store, &[1, 2]).await;
    // The first two days get their partitions (PostgreSQL); the third's
    // rows go to the default partition until it is made below.
    store
        .prepare_usage_days(day(2026, 7, 1), day(2026, 7, 2))
        .await
        .expect("partitions");
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..TASKS {
        let store = ctx.store.clone();
        tasks.spawn(async move {
            for b in 0..BATCHES {
                // Pairs of tasks write the same batches at the same time (a
                // journal replayed while the live writer runs), and each
                // batch is retried once after it was stored.
                let batch: Vec<UsageEvent> = (0..PER_BATCH)
                    .map(|i| mixed_event(format!("t{}-b{b}-e{i}", t / 2), b * PER_BATCH + i))
                    .collect();
                store.insert_usage(&batch).await.expect("insert");
                store.insert_usage(&batch).await.expect("retry");
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.expect("task finished");
    }
    // A retried batch that also holds new events: only those count.
    let overlap: Vec<UsageEvent> = (0..PER_BATCH * 2)
        .map(|i| mixed_event(format!("t0-b0-e{i}"), i))
        .collect();
    store
        .insert_usage(&overlap)
        .await
        .expect("overlapping retry");

    let raw = store.usage_events(None).await.expect("raw");
    assert_eq!(raw.len(), TASKS / 2 * BATCHES * PER_BATCH + PER_BATCH);
    let keys = [key_id(1), key_id(2)];
    assert_rollups_match_raw(store, &keys).await;

    store
        .prepare_usage_days(day(2026, 7, 3), day(2026, 7, 3))
        .await
        .expect("the third day's partition");
    assert_eq!(store.usage_events(None).await.expect("raw"), raw);
    assert_rollups_match_raw(store, &keys).await;
}

/// Counts of a backend's raw rows per table, by plain SQL.
async fn count(ctx: &Ctx, sql: &str) -> i64 {
    match ctx.kind {
        Backend::Postgres => {
            let pg = PostgresStore::connect(&ctx.url).await.expect("connect");
            sqlx::query_scalar(sql)
                .fetch_one(pg.pool())
                .await
                .expect(sql)
        }
        Backend::Sqlite => {
            let lite = SqliteStore::connect(&ctx.url).await.expect("connect");
            sqlx::query_scalar(sql)
                .fetch_one(lite.pool())
                .await
                .expect(sql)
        }
    }
}

async fn retention_drops_expired_days_and_keeps_the_rest(ctx: Ctx) {
    let store = ctx.store.as_ref();
    add_keys(store, &[1]).await;
    let k = key_id(1);
    let made = store
        .prepare_usage_days(day(2026, 3, 1), day(2026, 3, 3))
        .await
        .expect("partitions");
    let again = store
        .prepare_usage_days(day(2026, 3, 1), day(2026, 3, 3))
        .await
        .expect("partitions again");
    match ctx.kind {
        Backend::Postgres => assert_eq!((made, again), (3, 0)),
        Backend::Sqlite => assert_eq!((made, again), (0, 0)),
    }
    // 28 February has no partition: its row is in the default one.
    let events = vec![
        event("feb28", &k, at(2026, 2, 28, 23, 59, 59)),
        event("mar1-a", &k, at(2026, 3, 1, 0, 0, 0)),
        refused("mar1-b", &k, at(2026, 3, 1, 23, 0, 0)),
        event("mar2", &k, at(2026, 3, 2, 0, 0, 0)),
        event("mar3", &k, at(2026, 3, 3, 12, 0, 0)),
    ];
    store.insert_usage(&events).await.expect("insert");
    let bills = store.billing(Period::Day, None, None).await.expect("bills");

    let pruned = store
        .drop_usage_before(day(2026, 3, 2))
        .await
        .expect("retention");
    match ctx.kind {
        Backend::Postgres => {
            assert_eq!((pruned.partitions, pruned.rows), (1, 1));
            assert_eq!(
                count(
                    &ctx,
                    "SELECT COUNT(*) FROM pg_class WHERE relname IN \
                     ('usage_events_p20260301', 'usage_events_p20260302', 'usage_events_p20260303')"
                )
                .await,
                2,
                "1 March's partition is gone, the later ones stay"
            );
        }
        Backend::Sqlite => assert_eq!((pruned.partitions, pruned.rows), (0, 3)),
    }
    let kept = store.usage_events(None).await.expect("raw");
    assert_eq!(request_ids(&kept), ["mar2", "mar3"]);
    assert_eq!(
        store.billing(Period::Day, None, None).await.expect("bills"),
        bills,
        "bills of dropped days are kept (they read the rollups)"
    );
    // Dropping again finds nothing more to drop.
    let twice = store
        .drop_usage_before(day(2026, 3, 2))
        .await
        .expect("retention again");
    assert_eq!((twice.partitions, twice.rows), (0, 0));
    store
        .insert_usage(&[event("mar3-late", &k, at(2026, 3, 3, 13, 0, 0))])
        .await
        .expect("the kept days still take rows");
    assert_eq!(store.usage_events(None).await.expect("raw").len(), 3);
}

async fn making_a_day_partition_moves_its_rows_out_of_the_default(ctx: Ctx) {
    let store = ctx.store.as_ref();
    add_keys(store, &[1]).await;
    let k = key_id(1);
    let events = vec![
        event("apr1-a", &k, at(2026, 4, 1, 0, 0, 0)),
        event("apr1-b", &k, at(2026, 4, 1, 23, 59, 59)),
        event("apr2", &k, at(2026, 4, 2, 0, 0, 0)),
    ];
    store.insert_usage(&events).await.expect("insert");
    store
        .prepare_usage_days(day(2026, 4, 1), day(2026, 4, 1))
        .await
        .expect("partition");
    assert_eq!(store.usage_events(None).await.expect("raw"), events);
    // A retry after the move is still recognised as one.
    store.insert_usage(&events).await.expect("retry");
    assert_eq!(store.usage_events(None).await.expect("raw"), events);
    assert_eq!(
        store.billing(Period::Day, None, None).await.expect("bills")[0].requests,
        2
    );
    if ctx.kind == Backend::Postgres {
        assert_eq!(
            count(&ctx, "SELECT COUNT(*) FROM usage_events_p20260401").await,
            2
        );
        assert_eq!(
            count(&ctx, "SELECT COUNT(*) FROM usage_events_default").await,
            1,
            "2 April has no partition yet"
        );
    }
}

/// Runs migration files as plain SQL, each in one implicit transaction (a
/// multi-statement simple query), as a deployment's history did.
async fn apply_migrations(kind: Backend, url: &str, files: &[std::path::PathBuf]) {
    for f in files {
        let sql = std::fs::read_to_string(f).expect("read migration");
        match kind {
            Backend::Postgres => {
                let pool = sqlx::PgPool::connect(url).await.expect("connect");
                sqlx::raw_sql(&sql).execute(&pool).await.expect("migrate");
            }
            Backend::Sqlite => {
                let options = url
                    .parse::<sqlx::sqlite::SqliteConnectOptions>()
                    .expect("SQLite URL")
                    .create_if_missing(true);
                let pool = sqlx::SqlitePool::connect_with(options)
                    .await
                    .expect("connect");
                sqlx::raw_sql(&sql).execute(&pool).await.expect("migrate");
            }
        }
    }
}

/// An existing deployment's rows, written under the schema before the
/// rollups, survive the migration and its bills do not change.
async fn migration_keeps_an_existing_deployments_rows(ctx: Ctx) {
    // A database of its own, migrated by hand up to 0007.
    let db = TestDb::new(ctx.kind).await;
    let dir = match ctx.kind {
        Backend::Postgres => "migrations/postgres",
        Backend::Sqlite => "migrations/sqlite",
    };
    let mut files: Vec<std::path::PathBuf> =
        std::fs::read_dir(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir))
            .expect("migrations")
            .map(|e| e.expect("entry").path())
            .collect();
    files.sort();
    let (before, after): (Vec<_>, Vec<_>) = files
        .into_iter()
        .partition(|f| f.file_name().and_then(|n| n.to_str()).expect("name") < "0008");
    apply_migrations(ctx.kind, &db.url, &before).await;
    let insert = "INSERT INTO api_keys (id, name, tier, secret_hash, created_at) \
                  VALUES ('0000000000000001', 'k', 'pro', x'00', '2026-01-01T00:00:00.000000Z'); \
                  INSERT INTO usage_events (request_id, key_id, at, status, text_items, text_chars, \
                  image_items, image_bytes, deep_analyses, flagged, rate_limited, billable, latency_ms, \
                  endpoint, policy_id) VALUES \
                  ('r1', '0000000000000001', '2026-01-05T10:00:00.000000Z', 200, 2, 20, 0, 0, 0, 0, 0, 1, 5, 'moderate', NULL), \
                  ('r2', '0000000000000001', '2026-01-05T10:30:00.000000Z', 429, 1, 5, 0, 0, 0, 0, 1, 0, 5, 'moderate', NULL), \
                  ('r3', '0000000000000001', '2026-01-06T00:00:00.000000Z', 200, 1, 7, 1, 900, 1, 1, 0, 1, 5, 'moderations', '00000000-0000-4000-8000-000000000001')";
    match ctx.kind {
        Backend::Postgres => {
            let pool = sqlx::PgPool::connect(&db.url).await.expect("connect");
            let pg = insert
                .replace("x'00'", "'\\x00'")
                .replace(", 0, 0, 1, 5,", ", false, false, true, 5,")
                .replace(", 0, 1, 0, 5,", ", false, true, false, 5,")
                .replace(", 1, 0, 1, 5,", ", true, false, true, 5,");
            sqlx::raw_sql(&pg).execute(&pool).await.expect("old rows");
        }
        Backend::Sqlite => {
            let pool = sqlx::SqlitePool::connect(&db.url).await.expect("connect");
            sqlx::raw_sql(insert)
                .execute(&pool)
                .await
                .expect("old rows");
        }
    }
    apply_migrations(ctx.kind, &db.url, &after).await;
    let store: Arc<dyn Store> = match ctx.kind {
        Backend::Postgres => Arc::new(PostgresStore::connect(&db.url).await.expect("connect")),
        Backend::Sqlite => Arc::new(SqliteStore::connect(&db.url).await.expect("connect")),
    };
    let raw = store.usage_events(None).await.expect("raw");
    assert_eq!(request_ids(&raw), ["r1", "r2", "r3"]);
    let bills = store.billing(Period::Day, None, None).await.expect("bills");
    assert_eq!(bills, billing_from_raw(&raw, Period::Day));
    assert_eq!(
        bills
            .iter()
            .map(|r| (r.requests, r.text_chars, r.image_items, r.rate_limited))
            .collect::<Vec<_>>(),
        [(1, 20, 0, 1), (1, 7, 1, 0)]
    );
    // Rows written after the migration land with the old ones.
    store
        .insert_usage(&[event("r4", &key_id(1), at(2026, 1, 6, 1, 0, 0))])
        .await
        .expect("insert after migrating");
    let raw = store.usage_events(None).await.expect("raw");
    assert_eq!(
        store
            .billing(Period::Month, None, None)
            .await
            .expect("bills"),
        billing_from_raw(&raw, Period::Month)
    );
    drop(store);
    drop(db);
}

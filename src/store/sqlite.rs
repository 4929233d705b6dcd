//! SQLite backend: one file shared by the server and the `moderato keys`
//! CLI, so WAL mode (readers never block the writer) and a busy timeout
//! (writers wait for each other instead of failing).

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, NaiveTime, SecondsFormat, Utc};
use sqlx::migrate::MigrateError;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{QueryBuilder, Row, Sqlite};

use super::common::{
    custom_rpm_to_sql, from_stored, is_sqlite_busy, map_migrate, map_sqlx, parse_key_id,
    redact_error, UsageRow, ACQUIRE_TIMEOUT,
};
use super::{ApiKeyRecord, BillingRow, KeyId, Period, Store, StoreError, Tier, UsageEvent};

/// Readers run in parallel under WAL; writers queue on the file lock.
const MAX_CONNECTIONS: u32 = 8;
/// How long a writer waits for another process's write to finish.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// SQLite's bind-parameter limit (SQLITE_MAX_VARIABLE_NUMBER of the bundled
/// library, 3.32 and later).
const MAX_BINDS: usize = 32_766;
const USAGE_COLUMN_COUNT: usize = 14;
const ROWS_PER_INSERT: usize = MAX_BINDS / USAGE_COLUMN_COUNT;

/// How long opening and migrating a database keeps retrying while another
/// process holds it (creating or migrating the same new file): SQLite
/// answers BUSY at once, without waiting, when a transaction that has read
/// must write after another one committed, so the busy timeout alone does
/// not cover start-up races.
const OPEN_RETRY_WINDOW: Duration = Duration::from_secs(10);
/// First delay between retries; it doubles up to [`MAX_RETRY_DELAY`].
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(50);
const MAX_RETRY_DELAY: Duration = Duration::from_millis(800);

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

const KEY_COLUMNS: &str = "id, name, tier, custom_rpm, secret_hash, created_at, revoked_at";
const USAGE_COLUMNS: &str = "request_id, key_id, at, status, text_items, text_chars, \
     image_items, image_bytes, deep_analyses, flagged, rate_limited, billable, latency_ms, endpoint";

/// Storage in a SQLite file.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating when missing, with its folder) the database file of
    /// a `sqlite:` URL such as `sqlite:data/moderato.db` or
    /// `sqlite:///var/lib/moderato/moderato.db`. Does not run migrations
    /// (see [`Store::migrate`]).
    pub async fn connect(url: &str) -> Result<SqliteStore, StoreError> {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| redact_error(StoreError::Other(format!("invalid SQLite URL: {e}")), url))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true);
        let in_memory = is_in_memory(options.get_filename());
        if !in_memory {
            create_parent_dir(options.get_filename())?;
        }
        let mut pool_options = SqlitePoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT);
        if in_memory {
            // An in-memory database lives as long as one connection to it.
            pool_options = pool_options
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None);
        }
        let mut retry = StartupRetry::new();
        let pool = loop {
            match pool_options.clone().connect_with(options.clone()).await {
                Ok(pool) => break pool,
                Err(e) if is_busy(&e) && retry.wait().await => {}
                Err(e) => return Err(redact_error(map_sqlx(e), url)),
            }
        };
        Ok(SqliteStore { pool })
    }

    /// The underlying pool, for tests and tools that need plain SQL.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

/// Bounded back-off for the start-up races of several processes opening
/// one new database file.
struct StartupRetry {
    deadline: tokio::time::Instant,
    delay: Duration,
}

impl StartupRetry {
    fn new() -> StartupRetry {
        StartupRetry {
            deadline: tokio::time::Instant::now() + OPEN_RETRY_WINDOW,
            delay: FIRST_RETRY_DELAY,
        }
    }

    /// Sleeps before the next attempt; false when the window is spent.
    async fn wait(&mut self) -> bool {
        if tokio::time::Instant::now() + self.delay > self.deadline {
            return false;
        }
        tokio::time::sleep(self.delay).await;
        self.delay = (self.delay * 2).min(MAX_RETRY_DELAY);
        true
    }
}

/// SQLITE_BUSY or SQLITE_LOCKED, extended codes included.
fn is_busy(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => is_sqlite_busy(db.code().as_deref()),
        _ => false,
    }
}

/// sqlx names in-memory databases `:memory:` or `file:sqlx-in-memory-N`.
fn is_in_memory(filename: &Path) -> bool {
    let name = filename.to_string_lossy();
    name == ":memory:" || name.starts_with("file:")
}

fn create_parent_dir(filename: &Path) -> Result<(), StoreError> {
    match filename.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => std::fs::create_dir_all(dir).map_err(|e| {
            StoreError::Unavailable(format!("cannot create folder {}: {e}", dir.display()))
        }),
        _ => Ok(()),
    }
}

/// Timestamps are stored in one fixed form so that text order is time
/// order: `2026-11-22T19:30:00.000000Z`.
fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

fn parse_timestamp(s: &str) -> Result<DateTime<Utc>, StoreError> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| StoreError::Other(format!("stored timestamp {s:?} is malformed: {e}")))
}

fn parse_day(s: &str) -> Result<NaiveDate, StoreError> {
    NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .map_err(|e| StoreError::Other(format!("stored day {s:?} is malformed: {e}")))
}

#[async_trait]
impl Store for SqliteStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        // sqlx takes no lock around SQLite migrations: when two processes
        // open a new file at once, the loser fails ("table already exists",
        // or BUSY) once the winner commits. Each migration is one
        // transaction, so a rerun then finds it applied.
        let mut retry = StartupRetry::new();
        loop {
            match MIGRATOR.run(&self.pool).await {
                Ok(()) => return Ok(()),
                Err(MigrateError::Execute(_) | MigrateError::ExecuteMigration(..))
                    if retry.wait().await => {}
                Err(e) => return Err(map_migrate(e)),
            }
        }
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(map_sqlx)?;
        Ok(())
    }

    async fn insert_key(&self, key: &ApiKeyRecord) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO api_keys (id, name, tier, custom_rpm, secret_hash, created_at, revoked_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(key.id.as_str())
        .bind(&key.name)
        .bind(key.tier.as_str())
        .bind(custom_rpm_to_sql(key.custom_rpm)?)
        .bind(&key.secret_hash)
        .bind(timestamp(key.created_at))
        .bind(key.revoked_at.map(timestamp))
        .execute(&self.pool)
        .await
        .map_err(map_sqlx)?;
        Ok(())
    }

    async fn get_key(&self, id: &KeyId) -> Result<Option<ApiKeyRecord>, StoreError> {
        let sql = format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = ?");
        let row = sqlx::query(&sql)
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(map_sqlx)?;
        row.map(|r| key_from_row(&r)).transpose()
    }

    async fn list_keys(&self) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let sql = format!("SELECT {KEY_COLUMNS} FROM api_keys ORDER BY created_at, id");
        let rows = sqlx::query(&sql)
            .fetch_all(&self.pool)
            .await
            .map_err(map_sqlx)?;
        rows.iter().map(key_from_row).collect()
    }

    async fn revoke_key(&self, id: &KeyId) -> Result<bool, StoreError> {
        let done =
            sqlx::query("UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?")
                .bind(timestamp(Utc::now()))
                .bind(id.as_str())
                .execute(&self.pool)
                .await
                .map_err(map_sqlx)?;
        Ok(done.rows_affected() > 0)
    }

    async fn set_tier(
        &self,
        id: &KeyId,
        tier: Tier,
        custom_rpm: Option<u32>,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query("UPDATE api_keys SET tier = ?, custom_rpm = ? WHERE id = ?")
            .bind(tier.as_str())
            .bind(custom_rpm_to_sql(custom_rpm)?)
            .bind(id.as_str())
            .execute(&self.pool)
            .await
            .map_err(map_sqlx)?;
        Ok(done.rows_affected() > 0)
    }

    async fn insert_usage(&self, events: &[UsageEvent]) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let rows = events
            .iter()
            .map(UsageRow::from_event)
            .collect::<Result<Vec<_>, _>>()?;
        // IMMEDIATE takes the write lock up front, so a busy file makes us
        // wait (busy timeout) instead of failing halfway on lock upgrade.
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(map_sqlx)?;
        for chunk in rows.chunks(ROWS_PER_INSERT) {
            // Not kept in the statement cache: batch sizes vary, and each
            // size would be another cached statement.
            insert_usage_chunk(chunk)
                .build()
                .persistent(false)
                .execute(&mut *tx)
                .await
                .map_err(map_sqlx)?;
        }
        tx.commit().await.map_err(map_sqlx)
    }

    async fn usage_events(&self, key: Option<&KeyId>) -> Result<Vec<UsageEvent>, StoreError> {
        let mut query =
            QueryBuilder::<Sqlite>::new(format!("SELECT {USAGE_COLUMNS} FROM usage_events"));
        if let Some(key) = key {
            query.push(" WHERE key_id = ").push_bind(key.as_str());
        }
        query.push(" ORDER BY at, request_id");
        let rows = query
            .build()
            .fetch_all(&self.pool)
            .await
            .map_err(map_sqlx)?;
        rows.iter().map(usage_from_row).collect()
    }

    async fn billing(
        &self,
        period: Period,
        key: Option<&KeyId>,
        since: Option<NaiveDate>,
    ) -> Result<Vec<BillingRow>, StoreError> {
        let period_start = match period {
            Period::Day => "date(at)",
            Period::Month => "date(at, 'start of month')",
        };
        // Same aggregation as the view `usage_billing_daily`, but on the
        // table so that the `since` bound can use the indexes on `at`.
        let mut query = QueryBuilder::<Sqlite>::new(format!(
            "SELECT key_id, {period_start} AS period_start, \
                 SUM(billable) AS requests, \
                 SUM(CASE WHEN billable = 1 THEN text_items ELSE 0 END) AS text_items, \
                 SUM(CASE WHEN billable = 1 THEN text_chars ELSE 0 END) AS text_chars, \
                 SUM(CASE WHEN billable = 1 THEN image_items ELSE 0 END) AS image_items, \
                 SUM(CASE WHEN billable = 1 THEN deep_analyses ELSE 0 END) AS deep_analyses, \
                 SUM(rate_limited) AS rate_limited \
             FROM usage_events WHERE (billable = 1 OR rate_limited = 1)"
        ));
        if let Some(key) = key {
            query.push(" AND key_id = ").push_bind(key.as_str());
        }
        if let Some(since) = since {
            let start = since.and_time(NaiveTime::MIN).and_utc();
            query.push(" AND at >= ").push_bind(timestamp(start));
        }
        query.push(" GROUP BY key_id, period_start ORDER BY key_id, period_start");
        let rows = query
            .build()
            .fetch_all(&self.pool)
            .await
            .map_err(map_sqlx)?;
        rows.iter().map(|r| billing_from_row(r, period)).collect()
    }
}

/// One multi-row INSERT that skips request ids already stored.
fn insert_usage_chunk<'a>(rows: &'a [UsageRow<'a>]) -> QueryBuilder<'a, Sqlite> {
    let mut query =
        QueryBuilder::<Sqlite>::new(format!("INSERT INTO usage_events ({USAGE_COLUMNS}) "));
    query.push_values(rows, |mut b, r| {
        b.push_bind(r.request_id)
            .push_bind(r.key_id)
            .push_bind(timestamp(r.at))
            .push_bind(r.status)
            .push_bind(r.text_items)
            .push_bind(r.text_chars)
            .push_bind(r.image_items)
            .push_bind(r.image_bytes)
            .push_bind(r.deep_analyses)
            .push_bind(r.flagged)
            .push_bind(r.rate_limited)
            .push_bind(r.billable)
            .push_bind(r.latency_ms)
            .push_bind(r.endpoint);
    });
    query.push(" ON CONFLICT (request_id) DO NOTHING");
    query
}

fn key_from_row(row: &SqliteRow) -> Result<ApiKeyRecord, StoreError> {
    let id: &str = row.try_get("id").map_err(map_sqlx)?;
    let tier: &str = row.try_get("tier").map_err(map_sqlx)?;
    let custom_rpm: Option<i64> = row.try_get("custom_rpm").map_err(map_sqlx)?;
    let created_at: &str = row.try_get("created_at").map_err(map_sqlx)?;
    let revoked_at: Option<&str> = row.try_get("revoked_at").map_err(map_sqlx)?;
    Ok(ApiKeyRecord {
        id: parse_key_id(id)?,
        name: row.try_get("name").map_err(map_sqlx)?,
        tier: Tier::from_str(tier).map_err(StoreError::Other)?,
        custom_rpm: custom_rpm
            .map(|v| from_stored(v, "custom_rpm"))
            .transpose()?,
        secret_hash: row.try_get("secret_hash").map_err(map_sqlx)?,
        created_at: parse_timestamp(created_at)?,
        revoked_at: revoked_at.map(parse_timestamp).transpose()?,
    })
}

fn usage_from_row(row: &SqliteRow) -> Result<UsageEvent, StoreError> {
    let get_i64 = |column: &str| row.try_get::<i64, _>(column).map_err(map_sqlx);
    let get_bool = |column: &str| row.try_get::<bool, _>(column).map_err(map_sqlx);
    let at: &str = row.try_get("at").map_err(map_sqlx)?;
    UsageRow {
        request_id: row.try_get("request_id").map_err(map_sqlx)?,
        key_id: row.try_get("key_id").map_err(map_sqlx)?,
        at: parse_timestamp(at)?,
        status: row.try_get("status").map_err(map_sqlx)?,
        text_items: get_i64("text_items")?,
        text_chars: get_i64("text_chars")?,
        image_items: get_i64("image_items")?,
        image_bytes: get_i64("image_bytes")?,
        deep_analyses: get_i64("deep_analyses")?,
        flagged: get_bool("flagged")?,
        rate_limited: get_bool("rate_limited")?,
        billable: get_bool("billable")?,
        latency_ms: get_i64("latency_ms")?,
        endpoint: row.try_get("endpoint").map_err(map_sqlx)?,
    }
    .into_event()
}

fn billing_from_row(row: &SqliteRow, period: Period) -> Result<BillingRow, StoreError> {
    let count = |column: &str| -> Result<u64, StoreError> {
        let v: i64 = row.try_get(column).map_err(map_sqlx)?;
        from_stored(v, column)
    };
    let key_id: &str = row.try_get("key_id").map_err(map_sqlx)?;
    let period_start: &str = row.try_get("period_start").map_err(map_sqlx)?;
    Ok(BillingRow {
        key_id: parse_key_id(key_id)?,
        period,
        period_start: parse_day(period_start)?,
        requests: count("requests")?,
        text_items: count("text_items")?,
        text_chars: count("text_chars")?,
        image_items: count("image_items")?,
        deep_analyses: count("deep_analyses")?,
        rate_limited: count("rate_limited")?,
    })
}

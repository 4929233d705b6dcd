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
    applied_policy, custom_rpm_to_sql, from_stored, is_sqlite_busy, key_owner, map_migrate,
    map_sqlx, operator_key_only, parse_account_id, parse_email, parse_key_id, parse_policy_id,
    redact_error, stored_plan, UsageRow, ACQUIRE_TIMEOUT, KEY_SELECT, POLICY_COLUMNS,
};
use super::{
    AccountKey, AccountKeyInsert, AccountListing, Attempts, BillingRow, NewAccountKey, NewSession,
    Period, PolicyUsageRow, Session, SessionUse, SignInFailures, Store, StoreError, UsagePruned,
};
use crate::access::policy::{policy_from_json, policy_to_json};
use crate::access::{
    Account, AccountId, ApiKeyRecord, Email, KeyId, PasswordHash, Plan, Policy, PolicyDraft,
    PolicyId, PolicyVersion, Tier, UsageEvent,
};

/// Readers run in parallel under WAL; writers queue on the file lock.
const MAX_CONNECTIONS: u32 = 8;
/// How long a writer waits for another process's write to finish.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// SQLite's bind-parameter limit (SQLITE_MAX_VARIABLE_NUMBER of the bundled
/// library, 3.32 and later).
const MAX_BINDS: usize = 32_766;
const USAGE_COLUMN_COUNT: usize = 15;
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

const ACCOUNT_COLUMNS: &str =
    "id, email, password_hash, role, tier, custom_rpm, disabled_at, created_at, \
     awaiting_confirmation";
const USAGE_COLUMNS: &str = "request_id, key_id, at, status, text_items, text_chars, \
     image_items, image_bytes, deep_analyses, flagged, rate_limited, billable, latency_ms, endpoint, \
     policy_id";

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
        operator_key_only(key)?;
        sqlx::query(
            "INSERT INTO api_keys \
             (id, name, tier, custom_rpm, secret_hash, created_at, revoked_at, policy_id) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(key.id.as_str())
        .bind(&key.name)
        .bind(key.tier.as_str())
        .bind(custom_rpm_to_sql(key.custom_rpm)?)
        .bind(&key.secret_hash)
        .bind(timestamp(key.created_at))
        .bind(key.revoked_at.map(timestamp))
        .bind(key.policy_id.as_ref().map(PolicyId::as_str))
        .execute(&self.pool)
        .await
        .map_err(map_sqlx)?;
        Ok(())
    }

    async fn get_key(&self, id: &KeyId) -> Result<Option<ApiKeyRecord>, StoreError> {
        let sql = format!("{KEY_SELECT} WHERE k.id = ?");
        let row = sqlx::query(&sql)
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(map_sqlx)?;
        row.map(|r| key_from_row(&r)).transpose()
    }

    async fn list_keys(&self) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let sql = format!("{KEY_SELECT} ORDER BY k.created_at, k.id");
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
        let done = sqlx::query(
            "UPDATE api_keys SET tier = ?, custom_rpm = ? WHERE id = ? AND account_id = ?",
        )
        .bind(tier.as_str())
        .bind(custom_rpm_to_sql(custom_rpm)?)
        .bind(id.as_str())
        .bind(AccountId::OPERATOR)
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
            Period::Day => "date(hour)",
            Period::Month => "date(hour, 'start of month')",
        };
        // The rollups hold the sums `usage_billing_daily` used to take
        // from the events; a period appears only with billable or
        // rate-limited requests, as it did.
        let mut query = QueryBuilder::<Sqlite>::new(format!(
            "SELECT key_id, {period_start} AS period_start, \
                 SUM(requests) AS requests, SUM(text_items) AS text_items, \
                 SUM(text_chars) AS text_chars, SUM(image_items) AS image_items, \
                 SUM(deep_analyses) AS deep_analyses, SUM(rate_limited) AS rate_limited \
             FROM usage_hourly WHERE 1"
        ));
        if let Some(key) = key {
            query.push(" AND key_id = ").push_bind(key.as_str());
        }
        if let Some(since) = since {
            let start = since.and_time(NaiveTime::MIN).and_utc();
            query.push(" AND hour >= ").push_bind(timestamp(start));
        }
        query.push(
            " GROUP BY key_id, period_start HAVING SUM(requests) > 0 OR SUM(rate_limited) > 0 \
             ORDER BY key_id, period_start",
        );
        let rows = query
            .build()
            .fetch_all(&self.pool)
            .await
            .map_err(map_sqlx)?;
        rows.iter().map(|r| billing_from_row(r, period)).collect()
    }

    async fn prepare_usage_days(
        &self,
        _first: NaiveDate,
        _last: NaiveDate,
    ) -> Result<u32, StoreError> {
        // One table: nothing to prepare.
        Ok(0)
    }

    async fn drop_usage_before(&self, day: NaiveDate) -> Result<UsagePruned, StoreError> {
        let start = day.and_time(NaiveTime::MIN).and_utc();
        let done = sqlx::query("DELETE FROM usage_events WHERE at < ?")
            .bind(timestamp(start))
            .execute(&self.pool)
            .await
            .map_err(map_sqlx)?;
        Ok(UsagePruned {
            partitions: 0,
            rows: done.rows_affected(),
        })
    }

    async fn insert_account(&self, account: &Account) -> Result<(), StoreError> {
        sqlx::query(&format!(
            "INSERT INTO accounts ({ACCOUNT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        ))
        .bind(account.id.as_str())
        .bind(account.email.as_str())
        .bind(account.password_hash.as_ref().map(PasswordHash::as_str))
        .bind(account.role.as_str())
        .bind(account.plan.tier().as_str())
        .bind(custom_rpm_to_sql(account.plan.custom_rpm())?)
        .bind(account.disabled_at.map(timestamp))
        .bind(timestamp(account.created_at))
        .bind(account.awaiting_confirmation)
        .execute(&self.pool)
        .await
        .map_err(map_sqlx)?;
        Ok(())
    }

    async fn get_account(&self, id: &AccountId) -> Result<Option<Account>, StoreError> {
        let sql = format!("SELECT {ACCOUNT_COLUMNS} FROM accounts WHERE id = ?");
        let row = sqlx::query(&sql)
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(map_sqlx)?;
        row.map(|r| account_from_row(&r)).transpose()
    }

    async fn account_by_email(&self, email: &Email) -> Result<Option<Account>, StoreError> {
        let sql = format!("SELECT {ACCOUNT_COLUMNS} FROM accounts WHERE email = ?");
        let row = sqlx::query(&sql)
            .bind(email.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(map_sqlx)?;
        row.map(|r| account_from_row(&r)).transpose()
    }

    async fn list_accounts(&self) -> Result<Vec<AccountListing>, StoreError> {
        // Timestamps are text in one fixed form, so MAX is the latest; SQLite's
        // two-argument MAX is NULL if either is, hence the COALESCEs.
        let sql = format!(
            "SELECT {ACCOUNT_COLUMNS}, \
                 (SELECT MAX(s.last_seen) FROM dashboard_sessions s WHERE s.account_id = accounts.id) \
                     AS seen, \
                 (SELECT h.last_at FROM usage_hourly h WHERE h.account_id = accounts.id \
                  ORDER BY h.hour DESC, h.last_at DESC LIMIT 1) AS used \
             FROM accounts ORDER BY created_at, id"
        );
        let rows = sqlx::query(&sql)
            .fetch_all(&self.pool)
            .await
            .map_err(map_sqlx)?;
        rows.iter()
            .map(|r| {
                let seen: Option<&str> = r.try_get("seen").map_err(map_sqlx)?;
                let used: Option<&str> = r.try_get("used").map_err(map_sqlx)?;
                let seen = seen.map(parse_timestamp).transpose()?;
                let used = used.map(parse_timestamp).transpose()?;
                Ok(AccountListing {
                    account: account_from_row(r)?,
                    last_activity: seen.max(used),
                })
            })
            .collect()
    }

    async fn set_account_password(
        &self,
        id: &AccountId,
        hash: Option<&PasswordHash>,
        keep_session: Option<&[u8]>,
    ) -> Result<bool, StoreError> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(map_sqlx)?;
        let done = sqlx::query(
            "UPDATE accounts SET password_hash = ?1, \
             awaiting_confirmation = awaiting_confirmation AND ?1 IS NULL \
             WHERE id = ?2 AND id <> ?3",
        )
        .bind(hash.map(PasswordHash::as_str))
        .bind(id.as_str())
        .bind(AccountId::OPERATOR)
        .execute(&mut *tx)
        .await
        .map_err(map_sqlx)?;
        // Whatever links were out (a first-password link, a sign-up's)
        // were for the password that is now replaced.
        sqlx::query("DELETE FROM password_tokens WHERE account_id = ?")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await
            .map_err(map_sqlx)?;
        // `IS NOT`: with no session to keep, every session ends.
        sqlx::query("DELETE FROM dashboard_sessions WHERE account_id = ? AND id_hash IS NOT ?")
            .bind(id.as_str())
            .bind(keep_session)
            .execute(&mut *tx)
            .await
            .map_err(map_sqlx)?;
        tx.commit().await.map_err(map_sqlx)?;
        Ok(done.rows_affected() > 0)
    }

    async fn set_account_plan(&self, id: &AccountId, plan: Plan) -> Result<bool, StoreError> {
        if id.is_operator() {
            return Ok(false);
        }
        let tier = plan.tier().as_str();
        let rpm = custom_rpm_to_sql(plan.custom_rpm())?;
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(map_sqlx)?;
        let done = sqlx::query("UPDATE accounts SET tier = ?, custom_rpm = ? WHERE id = ?")
            .bind(tier)
            .bind(rpm)
            .bind(id.as_str())
            .execute(&mut *tx)
            .await
            .map_err(map_sqlx)?;
        if done.rows_affected() == 0 {
            return Ok(false);
        }
        // The tier column of its keys is informational only (keys read
        // their plan from the account): kept in step for people reading SQL.
        sqlx::query("UPDATE api_keys SET tier = ? WHERE account_id = ?")
            .bind(tier)
            .bind(id.as_str())
            .execute(&mut *tx)
            .await
            .map_err(map_sqlx)?;
        tx.commit().await.map_err(map_sqlx)?;
        Ok(true)
    }

    async fn disable_account(&self, id: &AccountId) -> Result<bool, StoreError> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(map_sqlx)?;
        let done =
            sqlx::query("UPDATE accounts SET disabled_at = COALESCE(disabled_at, ?) WHERE id = ?")
                .bind(timestamp(Utc::now()))
                .bind(id.as_str())
                .execute(&mut *tx)
                .await
                .map_err(map_sqlx)?;
        sqlx::query("DELETE FROM dashboard_sessions WHERE account_id = ?")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await
            .map_err(map_sqlx)?;
        tx.commit().await.map_err(map_sqlx)?;
        Ok(done.rows_affected() > 0)
    }

    async fn insert_account_key(
        &self,
        account: &AccountId,
        key: &NewAccountKey,
        max_keys: u32,
    ) -> Result<AccountKeyInsert, StoreError> {
        // One statement counts and inserts; SQLite runs one writer at a
        // time, so two requests cannot both see room for one more key.
        let done = sqlx::query(
            "INSERT INTO api_keys \
             (id, name, tier, custom_rpm, secret_hash, created_at, account_id, policy_id) \
             SELECT ?1, ?2, tier, ?3, ?4, ?5, id, ?8 FROM accounts WHERE id = ?6 \
             AND (SELECT COUNT(*) FROM api_keys WHERE account_id = ?6 AND revoked_at IS NULL) < ?7",
        )
        .bind(key.id.as_str())
        .bind(&key.name)
        .bind(custom_rpm_to_sql(key.key_rpm)?)
        .bind(&key.secret_hash)
        .bind(timestamp(key.created_at))
        .bind(account.as_str())
        .bind(i64::from(max_keys))
        .bind(key.policy_id.as_ref().map(PolicyId::as_str))
        .execute(&self.pool)
        .await
        .map_err(map_sqlx)?;
        if done.rows_affected() > 0 {
            return Ok(AccountKeyInsert::Created);
        }
        match self.get_account(account).await? {
            Some(_) => Ok(AccountKeyInsert::AccountFull),
            None => Err(StoreError::Conflict(format!("no account {account}"))),
        }
    }

    async fn account_keys(&self, account: &AccountId) -> Result<Vec<AccountKey>, StoreError> {
        let sql = format!(
            "SELECT keys.*, (SELECT h.last_at FROM usage_hourly h WHERE h.key_id = keys.id \
                 ORDER BY h.hour DESC, h.last_at DESC LIMIT 1) AS last_used \
             FROM ({KEY_SELECT} WHERE k.account_id = ?) keys ORDER BY created_at, id"
        );
        let rows = sqlx::query(&sql)
            .bind(account.as_str())
            .fetch_all(&self.pool)
            .await
            .map_err(map_sqlx)?;
        rows.iter()
            .map(|r| {
                let last_used: Option<&str> = r.try_get("last_used").map_err(map_sqlx)?;
                Ok(AccountKey {
                    key: key_from_row(r)?,
                    last_used: last_used.map(parse_timestamp).transpose()?,
                })
            })
            .collect()
    }

    async fn revoke_account_key(
        &self,
        account: &AccountId,
        id: &KeyId,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) \
             WHERE id = ? AND account_id = ?",
        )
        .bind(timestamp(Utc::now()))
        .bind(id.as_str())
        .bind(account.as_str())
        .execute(&self.pool)
        .await
        .map_err(map_sqlx)?;
        Ok(done.rows_affected() > 0)
    }

    async fn insert_session(&self, session: &NewSession) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO dashboard_sessions \
             (id_hash, account_id, csrf_token, created_at, last_seen, expires_at) \
             VALUES (?1, ?2, ?3, ?4, ?4, ?5)",
        )
        .bind(&session.id_hash)
        .bind(session.account_id.as_str())
        .bind(&session.csrf_token)
        .bind(timestamp(session.created_at))
        .bind(timestamp(session.expires_at))
        .execute(&self.pool)
        .await
        .map_err(map_sqlx)?;
        Ok(())
    }

    async fn touch_session(
        &self,
        id_hash: &[u8],
        used: &SessionUse,
    ) -> Result<Option<Session>, StoreError> {
        let row = sqlx::query(
            "UPDATE dashboard_sessions SET last_seen = ?2, expires_at = ?3 \
             WHERE id_hash = ?1 AND expires_at > ?2 AND created_at > ?4 \
             RETURNING account_id, csrf_token, expires_at",
        )
        .bind(id_hash)
        .bind(timestamp(used.now))
        .bind(timestamp(used.expires_at))
        .bind(timestamp(used.created_after))
        .fetch_optional(&self.pool)
        .await
        .map_err(map_sqlx)?;
        row.map(|r| {
            let account: &str = r.try_get("account_id").map_err(map_sqlx)?;
            let expires_at: &str = r.try_get("expires_at").map_err(map_sqlx)?;
            Ok(Session {
                account_id: parse_account_id(account)?,
                csrf_token: r.try_get("csrf_token").map_err(map_sqlx)?,
                expires_at: parse_timestamp(expires_at)?,
            })
        })
        .transpose()
    }

    async fn delete_session(&self, id_hash: &[u8]) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM dashboard_sessions WHERE id_hash = ?")
            .bind(id_hash)
            .execute(&self.pool)
            .await
            .map_err(map_sqlx)?;
        Ok(())
    }

    async fn record_sign_in_failure(
        &self,
        email: &str,
        address: &str,
        device: Option<&[u8]>,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO sign_in_failures (email, address, device_hash, at) VALUES (?1, ?2, ?3, ?4)",
        )
        .bind(email)
        .bind(address)
        .bind(device)
        .bind(timestamp(at))
        .execute(&self.pool)
        .await
        .map_err(map_sqlx)?;
        Ok(())
    }

    async fn sign_in_failures(
        &self,
        email: &str,
        address: &str,
        device: Option<&[u8]>,
        since: DateTime<Utc>,
    ) -> Result<SignInFailures, StoreError> {
        let row = sqlx::query(
            "SELECT \
               (SELECT COUNT(*) FROM sign_in_failures \
                 WHERE email = ?1 AND device_hash IS NULL AND at >= ?4) AS by_email, \
               (SELECT MIN(at) FROM sign_in_failures \
                 WHERE email = ?1 AND device_hash IS NULL AND at >= ?4) AS oldest_by_email, \
               (SELECT COUNT(*) FROM sign_in_failures WHERE address = ?2 AND at >= ?4) AS by_address, \
               (SELECT MIN(at) FROM sign_in_failures WHERE address = ?2 AND at >= ?4) AS oldest_by_address, \
               (SELECT COUNT(*) FROM sign_in_failures WHERE device_hash = ?3 AND at >= ?4) AS by_device, \
               (SELECT MIN(at) FROM sign_in_failures WHERE device_hash = ?3 AND at >= ?4) AS oldest_by_device",
        )
        .bind(email)
        .bind(address)
        .bind(device)
        .bind(timestamp(since))
        .fetch_one(&self.pool)
        .await
        .map_err(map_sqlx)?;
        Ok(SignInFailures {
            by_email: attempts(&row, "by_email", "oldest_by_email")?,
            by_address: attempts(&row, "by_address", "oldest_by_address")?,
            by_device: attempts(&row, "by_device", "oldest_by_device")?,
        })
    }

    async fn insert_device(
        &self,
        token_hash: &[u8],
        account: &AccountId,
        created_at: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO dashboard_devices (token_hash, account_id, created_at, expires_at) \
             VALUES (?1, ?2, ?3, ?4)",
        )
        .bind(token_hash)
        .bind(account.as_str())
        .bind(timestamp(created_at))
        .bind(timestamp(expires_at))
        .execute(&self.pool)
        .await
        .map_err(map_sqlx)?;
        Ok(())
    }

    async fn device_account(
        &self,
        token_hash: &[u8],
        now: DateTime<Utc>,
    ) -> Result<Option<AccountId>, StoreError> {
        let row = sqlx::query(
            "SELECT account_id FROM dashboard_devices WHERE token_hash = ?1 AND expires_at > ?2",
        )
        .bind(token_hash)
        .bind(timestamp(now))
        .fetch_optional(&self.pool)
        .await
        .map_err(map_sqlx)?;
        row.map(|r| {
            let account: String = r.try_get("account_id").map_err(map_sqlx)?;
            parse_account_id(&account)
        })
        .transpose()
    }

    async fn record_sign_up(&self, address: &str, at: DateTime<Utc>) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO sign_ups (address, at) VALUES (?1, ?2)")
            .bind(address)
            .bind(timestamp(at))
            .execute(&self.pool)
            .await
            .map_err(map_sqlx)?;
        Ok(())
    }

    async fn sign_ups(&self, address: &str, since: DateTime<Utc>) -> Result<Attempts, StoreError> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS n, MIN(at) AS oldest FROM sign_ups WHERE address = ?1 AND at >= ?2",
        )
        .bind(address)
        .bind(timestamp(since))
        .fetch_one(&self.pool)
        .await
        .map_err(map_sqlx)?;
        attempts(&row, "n", "oldest")
    }

    async fn prune_dashboard_records(
        &self,
        attempts_before: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(map_sqlx)?;
        let mut deleted = 0;
        for (sql, cutoff) in [
            (
                "DELETE FROM sign_in_failures WHERE at < ?1",
                attempts_before,
            ),
            ("DELETE FROM sign_ups WHERE at < ?1", attempts_before),
            ("DELETE FROM dashboard_sessions WHERE expires_at < ?1", now),
            ("DELETE FROM dashboard_devices WHERE expires_at < ?1", now),
            ("DELETE FROM password_tokens WHERE expires_at < ?1", now),
            // After the expired links: an unconfirmed sign-up whose every
            // link has expired is dropped (it never had a password, key or
            // session), so a flood of sign-ups does not stay in the table.
            (
                "DELETE FROM accounts WHERE awaiting_confirmation = 1 AND created_at < ?1 \
                 AND NOT EXISTS (SELECT 1 FROM password_tokens t WHERE t.account_id = accounts.id)",
                attempts_before,
            ),
        ] {
            deleted += sqlx::query(sql)
                .bind(timestamp(cutoff))
                .execute(&mut *tx)
                .await
                .map_err(map_sqlx)?
                .rows_affected();
        }
        tx.commit().await.map_err(map_sqlx)?;
        Ok(deleted)
    }

    async fn insert_policy(
        &self,
        account: &AccountId,
        id: &PolicyId,
        draft: &PolicyDraft,
        make_default: bool,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let rules = policy_to_json(&draft.rules, draft.speed).to_string();
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(map_sqlx)?;
        sqlx::query(
            "INSERT INTO policies (id, account_id, name, version, rules, created_at, updated_at) \
             VALUES (?1, ?2, ?3, 1, ?4, ?5, ?5)",
        )
        .bind(id.as_str())
        .bind(account.as_str())
        .bind(&draft.name)
        .bind(&rules)
        .bind(timestamp(at))
        .execute(&mut *tx)
        .await
        .map_err(map_sqlx)?;
        insert_version(&mut tx, id, 1, draft, &rules, at).await?;
        if make_default {
            sqlx::query("UPDATE accounts SET default_policy_id = ? WHERE id = ?")
                .bind(id.as_str())
                .bind(account.as_str())
                .execute(&mut *tx)
                .await
                .map_err(map_sqlx)?;
        }
        tx.commit().await.map_err(map_sqlx)
    }

    async fn update_policy(
        &self,
        account: &AccountId,
        id: &PolicyId,
        draft: &PolicyDraft,
        at: DateTime<Utc>,
    ) -> Result<Option<u32>, StoreError> {
        let rules = policy_to_json(&draft.rules, draft.speed).to_string();
        // IMMEDIATE: one writer at a time, so each change gets its own version.
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(map_sqlx)?;
        let version: Option<i64> = sqlx::query_scalar(
            "UPDATE policies SET name = ?1, rules = ?2, version = version + 1, updated_at = ?3 \
             WHERE id = ?4 AND account_id = ?5 RETURNING version",
        )
        .bind(&draft.name)
        .bind(&rules)
        .bind(timestamp(at))
        .bind(id.as_str())
        .bind(account.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_sqlx)?;
        let Some(version) = version else {
            return Ok(None);
        };
        let version: u32 = from_stored(version, "policy version")?;
        insert_version(&mut tx, id, version, draft, &rules, at).await?;
        tx.commit().await.map_err(map_sqlx)?;
        Ok(Some(version))
    }

    async fn set_default_policy(
        &self,
        account: &AccountId,
        id: Option<&PolicyId>,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE accounts SET default_policy_id = ?1 WHERE id = ?2 \
             AND (?1 IS NULL OR EXISTS (SELECT 1 FROM policies WHERE id = ?1 AND account_id = ?2))",
        )
        .bind(id.map(PolicyId::as_str))
        .bind(account.as_str())
        .execute(&self.pool)
        .await
        .map_err(map_sqlx)?;
        Ok(done.rows_affected() > 0)
    }

    async fn account_policies(&self, account: &AccountId) -> Result<Vec<Policy>, StoreError> {
        let sql = format!("{POLICY_COLUMNS} WHERE p.account_id = ? ORDER BY p.created_at, p.id");
        let rows = sqlx::query(&sql)
            .bind(account.as_str())
            .fetch_all(&self.pool)
            .await
            .map_err(map_sqlx)?;
        rows.iter().map(policy_from_row).collect()
    }

    async fn get_policy(
        &self,
        account: &AccountId,
        id: &PolicyId,
    ) -> Result<Option<Policy>, StoreError> {
        let sql = format!("{POLICY_COLUMNS} WHERE p.account_id = ? AND p.id = ?");
        let row = sqlx::query(&sql)
            .bind(account.as_str())
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(map_sqlx)?;
        row.map(|r| policy_from_row(&r)).transpose()
    }

    async fn policy_history(
        &self,
        account: &AccountId,
        id: &PolicyId,
    ) -> Result<Vec<PolicyVersion>, StoreError> {
        let rows = sqlx::query(
            "SELECT v.version, v.name, v.rules, v.changed_by, v.changed_at \
             FROM policy_versions v JOIN policies p ON p.id = v.policy_id \
             WHERE p.account_id = ? AND p.id = ? ORDER BY v.version DESC",
        )
        .bind(account.as_str())
        .bind(id.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(map_sqlx)?;
        rows.iter()
            .map(|r| {
                let version: i64 = r.try_get("version").map_err(map_sqlx)?;
                let rules: &str = r.try_get("rules").map_err(map_sqlx)?;
                let (rules, speed) = policy_from_json(rules).map_err(StoreError::Other)?;
                let changed_at: &str = r.try_get("changed_at").map_err(map_sqlx)?;
                Ok(PolicyVersion {
                    version: from_stored(version, "policy version")?,
                    name: r.try_get("name").map_err(map_sqlx)?,
                    rules,
                    speed,
                    changed_by: r.try_get("changed_by").map_err(map_sqlx)?,
                    changed_at: parse_timestamp(changed_at)?,
                })
            })
            .collect()
    }

    async fn set_key_policy(
        &self,
        account: &AccountId,
        key: &KeyId,
        policy: Option<&PolicyId>,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE api_keys SET policy_id = ?1 WHERE id = ?2 AND account_id = ?3 \
             AND (?1 IS NULL OR EXISTS (SELECT 1 FROM policies WHERE id = ?1 AND account_id = ?3))",
        )
        .bind(policy.map(PolicyId::as_str))
        .bind(key.as_str())
        .bind(account.as_str())
        .execute(&self.pool)
        .await
        .map_err(map_sqlx)?;
        Ok(done.rows_affected() > 0)
    }

    async fn policy_usage(
        &self,
        key: &KeyId,
        since: NaiveDate,
    ) -> Result<Vec<PolicyUsageRow>, StoreError> {
        let start = since.and_time(NaiveTime::MIN).and_utc();
        let rows = sqlx::query(
            "SELECT date(hour) AS day, NULLIF(policy_id, '') AS policy_id, \
                 SUM(requests) AS requests, SUM(text_items + image_items) AS items, \
                 SUM(rate_limited) AS rate_limited \
             FROM usage_hourly WHERE key_id = ? AND hour >= ? \
             GROUP BY day, usage_hourly.policy_id \
             HAVING SUM(requests) > 0 OR SUM(rate_limited) > 0 \
             ORDER BY day, usage_hourly.policy_id",
        )
        .bind(key.as_str())
        .bind(timestamp(start))
        .fetch_all(&self.pool)
        .await
        .map_err(map_sqlx)?;
        rows.iter()
            .map(|r| {
                let count = |column: &str| -> Result<u64, StoreError> {
                    let v: i64 = r.try_get(column).map_err(map_sqlx)?;
                    from_stored(v, column)
                };
                let day: &str = r.try_get("day").map_err(map_sqlx)?;
                let policy: Option<&str> = r.try_get("policy_id").map_err(map_sqlx)?;
                Ok(PolicyUsageRow {
                    day: parse_day(day)?,
                    policy_id: policy.map(parse_policy_id).transpose()?,
                    requests: count("requests")?,
                    items: count("items")?,
                    rate_limited: count("rate_limited")?,
                })
            })
            .collect()
    }

    async fn insert_password_token(
        &self,
        token_hash: &[u8],
        account: &AccountId,
        expires_at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO password_tokens (token_hash, account_id, expires_at) VALUES (?, ?, ?)",
        )
        .bind(token_hash)
        .bind(account.as_str())
        .bind(timestamp(expires_at))
        .execute(&self.pool)
        .await
        .map_err(map_sqlx)?;
        Ok(())
    }

    async fn password_token_account(
        &self,
        token_hash: &[u8],
        now: DateTime<Utc>,
    ) -> Result<Option<AccountId>, StoreError> {
        let row =
            sqlx::query("SELECT account_id, expires_at FROM password_tokens WHERE token_hash = ?")
                .bind(token_hash)
                .fetch_optional(&self.pool)
                .await
                .map_err(map_sqlx)?;
        let Some(row) = row else { return Ok(None) };
        let expires_at: &str = row.try_get("expires_at").map_err(map_sqlx)?;
        if parse_timestamp(expires_at)? <= now {
            return Ok(None);
        }
        let account: &str = row.try_get("account_id").map_err(map_sqlx)?;
        parse_account_id(account).map(Some)
    }

    async fn take_password_token(
        &self,
        token_hash: &[u8],
        now: DateTime<Utc>,
    ) -> Result<Option<AccountId>, StoreError> {
        let row = sqlx::query(
            "DELETE FROM password_tokens WHERE token_hash = ? RETURNING account_id, expires_at",
        )
        .bind(token_hash)
        .fetch_optional(&self.pool)
        .await
        .map_err(map_sqlx)?;
        let Some(row) = row else { return Ok(None) };
        let expires_at: &str = row.try_get("expires_at").map_err(map_sqlx)?;
        if parse_timestamp(expires_at)? <= now {
            return Ok(None);
        }
        let account: &str = row.try_get("account_id").map_err(map_sqlx)?;
        let account = parse_account_id(account)?;
        // A link used ends the account's other links: a sign-up sent
        // several, a reset may follow an unused first-password link.
        sqlx::query("DELETE FROM password_tokens WHERE account_id = ?")
            .bind(account.as_str())
            .execute(&self.pool)
            .await
            .map_err(map_sqlx)?;
        Ok(Some(account))
    }
}

fn account_from_row(row: &SqliteRow) -> Result<Account, StoreError> {
    let id: &str = row.try_get("id").map_err(map_sqlx)?;
    let email: &str = row.try_get("email").map_err(map_sqlx)?;
    let role: &str = row.try_get("role").map_err(map_sqlx)?;
    let tier: &str = row.try_get("tier").map_err(map_sqlx)?;
    let custom_rpm: Option<i64> = row.try_get("custom_rpm").map_err(map_sqlx)?;
    let password_hash: Option<String> = row.try_get("password_hash").map_err(map_sqlx)?;
    let disabled_at: Option<&str> = row.try_get("disabled_at").map_err(map_sqlx)?;
    let created_at: &str = row.try_get("created_at").map_err(map_sqlx)?;
    Ok(Account {
        id: parse_account_id(id)?,
        email: parse_email(email)?,
        password_hash: password_hash.map(PasswordHash::from_stored),
        role: role.parse().map_err(StoreError::Other)?,
        plan: stored_plan(tier, custom_rpm)?,
        disabled_at: disabled_at.map(parse_timestamp).transpose()?,
        created_at: parse_timestamp(created_at)?,
        awaiting_confirmation: row.try_get("awaiting_confirmation").map_err(map_sqlx)?,
    })
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
            .push_bind(r.endpoint)
            .push_bind(r.policy_id);
    });
    query.push(" ON CONFLICT (request_id) DO NOTHING");
    query
}

fn key_from_row(row: &SqliteRow) -> Result<ApiKeyRecord, StoreError> {
    let id: &str = row.try_get("id").map_err(map_sqlx)?;
    let tier: &str = row.try_get("tier").map_err(map_sqlx)?;
    let custom_rpm: Option<i64> = row.try_get("custom_rpm").map_err(map_sqlx)?;
    let account_id: &str = row.try_get("account_id").map_err(map_sqlx)?;
    let key_rpm: Option<i64> = row.try_get("key_rpm").map_err(map_sqlx)?;
    let key_rpm = key_rpm.map(|v| from_stored(v, "custom_rpm")).transpose()?;
    let created_at: &str = row.try_get("created_at").map_err(map_sqlx)?;
    let revoked_at: Option<&str> = row.try_get("revoked_at").map_err(map_sqlx)?;
    Ok(ApiKeyRecord {
        id: parse_key_id(id)?,
        name: row.try_get("name").map_err(map_sqlx)?,
        tier: Tier::from_str(tier).map_err(StoreError::Other)?,
        custom_rpm: custom_rpm
            .map(|v| from_stored(v, "custom_rpm"))
            .transpose()?,
        owner: key_owner(account_id, key_rpm)?,
        secret_hash: row.try_get("secret_hash").map_err(map_sqlx)?,
        created_at: parse_timestamp(created_at)?,
        revoked_at: revoked_at.map(parse_timestamp).transpose()?,
        policy_id: row
            .try_get::<Option<&str>, _>("own_policy_id")
            .map_err(map_sqlx)?
            .map(parse_policy_id)
            .transpose()?,
        policy: applied_policy(
            row.try_get("policy_id").map_err(map_sqlx)?,
            row.try_get("policy_name").map_err(map_sqlx)?,
            row.try_get("policy_version").map_err(map_sqlx)?,
            row.try_get("policy_rules").map_err(map_sqlx)?,
        )?,
    })
}

fn policy_from_row(row: &SqliteRow) -> Result<Policy, StoreError> {
    let id: &str = row.try_get("id").map_err(map_sqlx)?;
    let account: &str = row.try_get("account_id").map_err(map_sqlx)?;
    let version: i64 = row.try_get("version").map_err(map_sqlx)?;
    let rules: &str = row.try_get("rules").map_err(map_sqlx)?;
    let (rules, speed) = policy_from_json(rules).map_err(StoreError::Other)?;
    let created_at: &str = row.try_get("created_at").map_err(map_sqlx)?;
    let updated_at: &str = row.try_get("updated_at").map_err(map_sqlx)?;
    Ok(Policy {
        id: parse_policy_id(id)?,
        account_id: parse_account_id(account)?,
        name: row.try_get("name").map_err(map_sqlx)?,
        version: from_stored(version, "policy version")?,
        rules,
        speed,
        is_default: row.try_get("is_default").map_err(map_sqlx)?,
        created_at: parse_timestamp(created_at)?,
        updated_at: parse_timestamp(updated_at)?,
    })
}

/// One row of a policy's history.
async fn insert_version(
    tx: &mut sqlx::Transaction<'_, Sqlite>,
    id: &PolicyId,
    version: u32,
    draft: &PolicyDraft,
    rules: &str,
    at: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO policy_versions (policy_id, version, name, rules, changed_by, changed_at) \
         VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(id.as_str())
    .bind(i64::from(version))
    .bind(&draft.name)
    .bind(rules)
    .bind(&draft.changed_by)
    .bind(timestamp(at))
    .execute(&mut **tx)
    .await
    .map_err(map_sqlx)?;
    Ok(())
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
        policy_id: row.try_get("policy_id").map_err(map_sqlx)?,
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

/// A count and the oldest time of a row of counts (`COUNT(*)`, `MIN(at)`).
fn attempts(row: &SqliteRow, count: &str, oldest: &str) -> Result<Attempts, StoreError> {
    let n: i64 = row.try_get(count).map_err(map_sqlx)?;
    let oldest: Option<&str> = row.try_get(oldest).map_err(map_sqlx)?;
    Ok(Attempts {
        count: u32::try_from(n).unwrap_or(u32::MAX),
        oldest: oldest.map(parse_timestamp).transpose()?,
    })
}

//! PostgreSQL backend.

use std::str::FromStr;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, NaiveTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{Postgres, QueryBuilder, Row};

use super::common::{
    applied_policy, custom_rpm_to_sql, from_stored, key_owner, map_migrate, map_sqlx,
    operator_key_only, parse_account_id, parse_email, parse_key_id, parse_policy_id, redact_error,
    stored_plan, UsageRow, ACQUIRE_TIMEOUT, KEY_SELECT, POLICY_COLUMNS,
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

/// Connections per process: the server's handlers plus the usage writer.
const MAX_CONNECTIONS: u32 = 16;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

const ACCOUNT_COLUMNS: &str =
    "id, email, password_hash, role, tier, custom_rpm, disabled_at, created_at, \
     awaiting_confirmation";
const USAGE_COLUMNS: &str = "request_id, key_id, at, status, text_items, text_chars, \
     image_items, image_bytes, deep_analyses, flagged, rate_limited, billable, latency_ms, endpoint, \
     policy_id";

/// Adds the rows of a CTE `stored` (events just inserted) to the hourly
/// rollups. Sorted so that concurrent writers (several replicas) lock the
/// rollup rows they share in the same order and do not deadlock.
const ROLLUP_UPSERT: &str = "\
    INSERT INTO usage_hourly AS h (key_id, account_id, hour, policy_id, events, requests, \
        text_items, text_chars, image_items, image_bytes, deep_analyses, rate_limited, flagged, \
        last_at) \
    SELECT s.key_id, k.account_id, date_trunc('hour', s.at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC', \
        COALESCE(s.policy_id, ''), COUNT(*), COUNT(*) FILTER (WHERE s.billable), \
        COALESCE(SUM(s.text_items) FILTER (WHERE s.billable), 0), \
        COALESCE(SUM(s.text_chars) FILTER (WHERE s.billable), 0), \
        COALESCE(SUM(s.image_items) FILTER (WHERE s.billable), 0), \
        COALESCE(SUM(s.image_bytes) FILTER (WHERE s.billable), 0), \
        COALESCE(SUM(s.deep_analyses) FILTER (WHERE s.billable), 0), \
        COUNT(*) FILTER (WHERE s.rate_limited), COUNT(*) FILTER (WHERE s.flagged), MAX(s.at) \
    FROM stored s JOIN api_keys k ON k.id = s.key_id \
    GROUP BY 1, 2, 3, 4 ORDER BY 1, 3, 4 \
    ON CONFLICT (key_id, hour, policy_id) DO UPDATE SET \
        events = h.events + excluded.events, requests = h.requests + excluded.requests, \
        text_items = h.text_items + excluded.text_items, \
        text_chars = h.text_chars + excluded.text_chars, \
        image_items = h.image_items + excluded.image_items, \
        image_bytes = h.image_bytes + excluded.image_bytes, \
        deep_analyses = h.deep_analyses + excluded.deep_analyses, \
        rate_limited = h.rate_limited + excluded.rate_limited, \
        flagged = h.flagged + excluded.flagged, last_at = GREATEST(h.last_at, excluded.last_at)";

/// Storage in PostgreSQL.
#[derive(Clone, Debug)]
pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    /// Opens a pool and one connection to check the URL. An unreachable
    /// server gives `StoreError::Unavailable` after about 3 seconds. Does
    /// not run migrations (see [`Store::migrate`]).
    pub async fn connect(url: &str) -> Result<PostgresStore, StoreError> {
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| {
                redact_error(
                    StoreError::Other(format!("invalid PostgreSQL URL: {e}")),
                    url,
                )
            })?
            .application_name("moderato");
        let endpoint = format!("{}:{}", options.get_host(), options.get_port());
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(|e| redact_error(describe_connect_error(map_sqlx(e), &endpoint), url))?;
        Ok(PostgresStore { pool })
    }

    /// The underlying pool, for tests and tools that need plain SQL.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// Says where we tried to connect: "pool timed out" alone does not tell an
/// operator which setting is wrong.
fn describe_connect_error(err: StoreError, endpoint: &str) -> StoreError {
    match err {
        StoreError::Unavailable(m) => {
            StoreError::Unavailable(format!("cannot reach PostgreSQL at {endpoint}: {m}"))
        }
        other => other,
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await.map_err(map_migrate)
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
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(key.id.as_str())
        .bind(&key.name)
        .bind(key.tier.as_str())
        .bind(custom_rpm_to_sql(key.custom_rpm)?)
        .bind(&key.secret_hash)
        .bind(key.created_at)
        .bind(key.revoked_at)
        .bind(key.policy_id.as_ref().map(PolicyId::as_str))
        .execute(&self.pool)
        .await
        .map_err(map_sqlx)?;
        Ok(())
    }

    async fn get_key(&self, id: &KeyId) -> Result<Option<ApiKeyRecord>, StoreError> {
        let sql = format!("{KEY_SELECT} WHERE k.id = $1");
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
            sqlx::query("UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $2) WHERE id = $1")
                .bind(id.as_str())
                .bind(Utc::now())
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
            "UPDATE api_keys SET tier = $2, custom_rpm = $3 WHERE id = $1 AND account_id = $4",
        )
        .bind(id.as_str())
        .bind(tier.as_str())
        .bind(custom_rpm_to_sql(custom_rpm)?)
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
        let columns = UsageColumns::from_events(events)?;
        // One statement whatever the batch size: arrays keep the SQL text
        // constant (so it is prepared once per connection) and stay far
        // below the 65,535 bind-parameter limit. The rollups add what the
        // insert returns, the rows actually stored: a retried batch's
        // events already stored are skipped by both, in one statement, so
        // events and rollups never disagree.
        let sql = format!(
            "WITH stored AS ( \
                 INSERT INTO usage_events ({USAGE_COLUMNS}) \
                 SELECT * FROM UNNEST($1::text[], $2::text[], $3::timestamptz[], $4::int[], \
                     $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[], \
                     $10::bool[], $11::bool[], $12::bool[], $13::bigint[], $14::text[], $15::text[]) \
                 ON CONFLICT (request_id, at) DO NOTHING \
                 RETURNING key_id, at, policy_id, billable, rate_limited, flagged, \
                     text_items, text_chars, image_items, image_bytes, deep_analyses) \
             {ROLLUP_UPSERT}"
        );
        sqlx::query(&sql)
            .bind(columns.request_id)
            .bind(columns.key_id)
            .bind(columns.at)
            .bind(columns.status)
            .bind(columns.text_items)
            .bind(columns.text_chars)
            .bind(columns.image_items)
            .bind(columns.image_bytes)
            .bind(columns.deep_analyses)
            .bind(columns.flagged)
            .bind(columns.rate_limited)
            .bind(columns.billable)
            .bind(columns.latency_ms)
            .bind(columns.endpoint)
            .bind(columns.policy_id)
            .execute(&self.pool)
            .await
            .map_err(map_sqlx)?;
        Ok(())
    }

    async fn usage_events(&self, key: Option<&KeyId>) -> Result<Vec<UsageEvent>, StoreError> {
        let mut query =
            QueryBuilder::<Postgres>::new(format!("SELECT {USAGE_COLUMNS} FROM usage_events"));
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
            Period::Day => "(hour AT TIME ZONE 'UTC')::date",
            Period::Month => "date_trunc('month', hour AT TIME ZONE 'UTC')::date",
        };
        // The rollups hold the sums `usage_billing_daily` used to take
        // from the events; a period appears only with billable or
        // rate-limited requests, as it did.
        let mut query = QueryBuilder::<Postgres>::new(format!(
            "SELECT key_id, {period_start} AS period_start, \
                 SUM(requests)::BIGINT AS requests, SUM(text_items)::BIGINT AS text_items, \
                 SUM(text_chars)::BIGINT AS text_chars, SUM(image_items)::BIGINT AS image_items, \
                 SUM(deep_analyses)::BIGINT AS deep_analyses, \
                 SUM(rate_limited)::BIGINT AS rate_limited \
             FROM usage_hourly WHERE TRUE"
        ));
        if let Some(key) = key {
            query.push(" AND key_id = ").push_bind(key.as_str());
        }
        if let Some(since) = since {
            query.push(" AND hour >= ").push_bind(start_of_day(since));
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
        first: NaiveDate,
        last: NaiveDate,
    ) -> Result<u32, StoreError> {
        let made: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FILTER (WHERE moderato_usage_partition(day::date)) \
             FROM generate_series($1::date, $2::date, interval '1 day') AS day",
        )
        .bind(first)
        .bind(last)
        .fetch_one(&self.pool)
        .await
        .map_err(map_sqlx)?;
        Ok(u32::try_from(made).unwrap_or(u32::MAX))
    }

    async fn drop_usage_before(&self, day: NaiveDate) -> Result<UsagePruned, StoreError> {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             WHERE i.inhparent = 'usage_events'::regclass ORDER BY 1",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(map_sqlx)?;
        let mut pruned = UsagePruned::default();
        for name in names {
            // Only names this service made, whose day is in the name:
            // `usage_events_pYYYYMMDD` (so the name is safe to quote as is).
            let Some(partition_day) = partition_day(&name) else {
                continue;
            };
            if partition_day < day {
                // Dropping a partition locks the whole table for a moment;
                // should a long read hold it, give up rather than stall
                // every insert behind the wait (the next round retries).
                let mut tx = self.pool.begin().await.map_err(map_sqlx)?;
                sqlx::query("SET LOCAL lock_timeout = '2s'")
                    .execute(&mut *tx)
                    .await
                    .map_err(map_sqlx)?;
                sqlx::query(&format!("DROP TABLE IF EXISTS \"{name}\""))
                    .execute(&mut *tx)
                    .await
                    .map_err(map_sqlx)?;
                tx.commit().await.map_err(map_sqlx)?;
                pruned.partitions += 1;
            }
        }
        let done = sqlx::query("DELETE FROM usage_events_default WHERE at < $1")
            .bind(start_of_day(day))
            .execute(&self.pool)
            .await
            .map_err(map_sqlx)?;
        pruned.rows = done.rows_affected();
        Ok(pruned)
    }

    async fn insert_account(&self, account: &Account) -> Result<(), StoreError> {
        sqlx::query(&format!(
            "INSERT INTO accounts ({ACCOUNT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
        ))
        .bind(account.id.as_str())
        .bind(account.email.as_str())
        .bind(account.password_hash.as_ref().map(PasswordHash::as_str))
        .bind(account.role.as_str())
        .bind(account.plan.tier().as_str())
        .bind(custom_rpm_to_sql(account.plan.custom_rpm())?)
        .bind(account.disabled_at)
        .bind(account.created_at)
        .bind(account.awaiting_confirmation)
        .execute(&self.pool)
        .await
        .map_err(map_sqlx)?;
        Ok(())
    }

    async fn get_account(&self, id: &AccountId) -> Result<Option<Account>, StoreError> {
        let sql = format!("SELECT {ACCOUNT_COLUMNS} FROM accounts WHERE id = $1");
        let row = sqlx::query(&sql)
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(map_sqlx)?;
        row.map(|r| account_from_row(&r)).transpose()
    }

    async fn account_by_email(&self, email: &Email) -> Result<Option<Account>, StoreError> {
        let sql = format!("SELECT {ACCOUNT_COLUMNS} FROM accounts WHERE email = $1");
        let row = sqlx::query(&sql)
            .bind(email.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(map_sqlx)?;
        row.map(|r| account_from_row(&r)).transpose()
    }

    async fn list_accounts(&self) -> Result<Vec<AccountListing>, StoreError> {
        let sql = format!(
            "SELECT {ACCOUNT_COLUMNS}, GREATEST( \
                 (SELECT MAX(s.last_seen) FROM dashboard_sessions s WHERE s.account_id = accounts.id), \
                 (SELECT h.last_at FROM usage_hourly h WHERE h.account_id = accounts.id \
                  ORDER BY h.hour DESC, h.last_at DESC LIMIT 1)) AS last_activity \
             FROM accounts ORDER BY created_at, id"
        );
        let rows = sqlx::query(&sql)
            .fetch_all(&self.pool)
            .await
            .map_err(map_sqlx)?;
        rows.iter()
            .map(|r| {
                Ok(AccountListing {
                    account: account_from_row(r)?,
                    last_activity: r.try_get("last_activity").map_err(map_sqlx)?,
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
        let mut tx = self.pool.begin().await.map_err(map_sqlx)?;
        let done = sqlx::query(
            "UPDATE accounts SET password_hash = $2, \
             awaiting_confirmation = awaiting_confirmation AND $2 IS NULL \
             WHERE id = $1 AND id <> $3",
        )
        .bind(id.as_str())
        .bind(hash.map(PasswordHash::as_str))
        .bind(AccountId::OPERATOR)
        .execute(&mut *tx)
        .await
        .map_err(map_sqlx)?;
        // Whatever links were out (a first-password link, a sign-up's)
        // were for the password that is now replaced.
        sqlx::query("DELETE FROM password_tokens WHERE account_id = $1")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await
            .map_err(map_sqlx)?;
        // `IS DISTINCT FROM`: with no session to keep, every session ends.
        sqlx::query(
            "DELETE FROM dashboard_sessions WHERE account_id = $1 AND id_hash IS DISTINCT FROM $2",
        )
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
        let mut tx = self.pool.begin().await.map_err(map_sqlx)?;
        let done = sqlx::query("UPDATE accounts SET tier = $2, custom_rpm = $3 WHERE id = $1")
            .bind(id.as_str())
            .bind(tier)
            .bind(rpm)
            .execute(&mut *tx)
            .await
            .map_err(map_sqlx)?;
        if done.rows_affected() == 0 {
            return Ok(false);
        }
        // The tier column of its keys is informational only (keys read
        // their plan from the account): kept in step for people reading SQL.
        sqlx::query("UPDATE api_keys SET tier = $2 WHERE account_id = $1")
            .bind(id.as_str())
            .bind(tier)
            .execute(&mut *tx)
            .await
            .map_err(map_sqlx)?;
        tx.commit().await.map_err(map_sqlx)?;
        Ok(true)
    }

    async fn disable_account(&self, id: &AccountId) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await.map_err(map_sqlx)?;
        let done = sqlx::query(
            "UPDATE accounts SET disabled_at = COALESCE(disabled_at, $2) WHERE id = $1",
        )
        .bind(id.as_str())
        .bind(Utc::now())
        .execute(&mut *tx)
        .await
        .map_err(map_sqlx)?;
        sqlx::query("DELETE FROM dashboard_sessions WHERE account_id = $1")
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
        let mut tx = self.pool.begin().await.map_err(map_sqlx)?;
        // The account's row, locked until commit: concurrent key requests
        // of one account count one after the other, so they cannot pass
        // the cap together (under READ COMMITTED a bare count would let them).
        let tier: Option<String> =
            sqlx::query_scalar("SELECT tier FROM accounts WHERE id = $1 FOR UPDATE")
                .bind(account.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(map_sqlx)?;
        let Some(tier) = tier else {
            return Err(StoreError::Conflict(format!("no account {account}")));
        };
        let active: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM api_keys WHERE account_id = $1 AND revoked_at IS NULL",
        )
        .bind(account.as_str())
        .fetch_one(&mut *tx)
        .await
        .map_err(map_sqlx)?;
        if active >= i64::from(max_keys) {
            return Ok(AccountKeyInsert::AccountFull);
        }
        sqlx::query(
            "INSERT INTO api_keys \
             (id, name, tier, custom_rpm, secret_hash, created_at, account_id, policy_id) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(key.id.as_str())
        .bind(&key.name)
        .bind(tier)
        .bind(custom_rpm_to_sql(key.key_rpm)?)
        .bind(&key.secret_hash)
        .bind(key.created_at)
        .bind(account.as_str())
        .bind(key.policy_id.as_ref().map(PolicyId::as_str))
        .execute(&mut *tx)
        .await
        .map_err(map_sqlx)?;
        tx.commit().await.map_err(map_sqlx)?;
        Ok(AccountKeyInsert::Created)
    }

    async fn account_keys(&self, account: &AccountId) -> Result<Vec<AccountKey>, StoreError> {
        let sql = format!(
            "SELECT * FROM ({KEY_SELECT} WHERE k.account_id = $1) keys, \
             LATERAL (SELECT MAX(h.last_at) AS last_used FROM (SELECT last_at FROM usage_hourly \
                 WHERE key_id = keys.id ORDER BY hour DESC, last_at DESC LIMIT 1) h) used \
             ORDER BY created_at, id"
        );
        let rows = sqlx::query(&sql)
            .bind(account.as_str())
            .fetch_all(&self.pool)
            .await
            .map_err(map_sqlx)?;
        rows.iter()
            .map(|r| {
                Ok(AccountKey {
                    key: key_from_row(r)?,
                    last_used: r.try_get("last_used").map_err(map_sqlx)?,
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
            "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $3) \
             WHERE id = $1 AND account_id = $2",
        )
        .bind(id.as_str())
        .bind(account.as_str())
        .bind(Utc::now())
        .execute(&self.pool)
        .await
        .map_err(map_sqlx)?;
        Ok(done.rows_affected() > 0)
    }

    async fn insert_session(&self, session: &NewSession) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO dashboard_sessions \
             (id_hash, account_id, csrf_token, created_at, last_seen, expires_at) \
             VALUES ($1, $2, $3, $4, $4, $5)",
        )
        .bind(&session.id_hash)
        .bind(session.account_id.as_str())
        .bind(&session.csrf_token)
        .bind(session.created_at)
        .bind(session.expires_at)
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
            "UPDATE dashboard_sessions SET last_seen = $2, expires_at = $3 \
             WHERE id_hash = $1 AND expires_at > $2 AND created_at > $4 \
             RETURNING account_id, csrf_token, expires_at",
        )
        .bind(id_hash)
        .bind(used.now)
        .bind(used.expires_at)
        .bind(used.created_after)
        .fetch_optional(&self.pool)
        .await
        .map_err(map_sqlx)?;
        row.map(|r| {
            let account: String = r.try_get("account_id").map_err(map_sqlx)?;
            Ok(Session {
                account_id: parse_account_id(&account)?,
                csrf_token: r.try_get("csrf_token").map_err(map_sqlx)?,
                expires_at: r.try_get("expires_at").map_err(map_sqlx)?,
            })
        })
        .transpose()
    }

    async fn delete_session(&self, id_hash: &[u8]) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM dashboard_sessions WHERE id_hash = $1")
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
            "INSERT INTO sign_in_failures (email, address, device_hash, at) VALUES ($1, $2, $3, $4)",
        )
        .bind(email)
        .bind(address)
        .bind(device)
        .bind(at)
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
                 WHERE email = $1 AND device_hash IS NULL AND at >= $4) AS by_email, \
               (SELECT MIN(at) FROM sign_in_failures \
                 WHERE email = $1 AND device_hash IS NULL AND at >= $4) AS oldest_by_email, \
               (SELECT COUNT(*) FROM sign_in_failures WHERE address = $2 AND at >= $4) AS by_address, \
               (SELECT MIN(at) FROM sign_in_failures WHERE address = $2 AND at >= $4) AS oldest_by_address, \
               (SELECT COUNT(*) FROM sign_in_failures WHERE device_hash = $3 AND at >= $4) AS by_device, \
               (SELECT MIN(at) FROM sign_in_failures WHERE device_hash = $3 AND at >= $4) AS oldest_by_device",
        )
        .bind(email)
        .bind(address)
        .bind(device)
        .bind(since)
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
             VALUES ($1, $2, $3, $4)",
        )
        .bind(token_hash)
        .bind(account.as_str())
        .bind(created_at)
        .bind(expires_at)
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
            "SELECT account_id FROM dashboard_devices WHERE token_hash = $1 AND expires_at > $2",
        )
        .bind(token_hash)
        .bind(now)
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
        sqlx::query("INSERT INTO sign_ups (address, at) VALUES ($1, $2)")
            .bind(address)
            .bind(at)
            .execute(&self.pool)
            .await
            .map_err(map_sqlx)?;
        Ok(())
    }

    async fn sign_ups(&self, address: &str, since: DateTime<Utc>) -> Result<Attempts, StoreError> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS n, MIN(at) AS oldest FROM sign_ups WHERE address = $1 AND at >= $2",
        )
        .bind(address)
        .bind(since)
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
        let mut tx = self.pool.begin().await.map_err(map_sqlx)?;
        let mut deleted = 0;
        for (sql, cutoff) in [
            (
                "DELETE FROM sign_in_failures WHERE at < $1",
                attempts_before,
            ),
            ("DELETE FROM sign_ups WHERE at < $1", attempts_before),
            ("DELETE FROM dashboard_sessions WHERE expires_at < $1", now),
            ("DELETE FROM dashboard_devices WHERE expires_at < $1", now),
            ("DELETE FROM password_tokens WHERE expires_at < $1", now),
            // After the expired links: an unconfirmed sign-up whose every
            // link has expired is dropped (it never had a password, key or
            // session), so a flood of sign-ups does not stay in the table.
            (
                "DELETE FROM accounts WHERE awaiting_confirmation AND created_at < $1 \
                 AND NOT EXISTS (SELECT 1 FROM password_tokens t WHERE t.account_id = accounts.id)",
                attempts_before,
            ),
        ] {
            deleted += sqlx::query(sql)
                .bind(cutoff)
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
        let mut tx = self.pool.begin().await.map_err(map_sqlx)?;
        sqlx::query(
            "INSERT INTO policies (id, account_id, name, version, rules, created_at, updated_at) \
             VALUES ($1, $2, $3, 1, $4, $5, $5)",
        )
        .bind(id.as_str())
        .bind(account.as_str())
        .bind(&draft.name)
        .bind(&rules)
        .bind(at)
        .execute(&mut *tx)
        .await
        .map_err(map_sqlx)?;
        insert_version(&mut tx, id, 1, draft, &rules, at).await?;
        if make_default {
            sqlx::query("UPDATE accounts SET default_policy_id = $1 WHERE id = $2")
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
        let mut tx = self.pool.begin().await.map_err(map_sqlx)?;
        // The row lock of the UPDATE orders concurrent changes: each gets
        // its own version.
        let version: Option<i32> = sqlx::query_scalar(
            "UPDATE policies SET name = $1, rules = $2, version = version + 1, updated_at = $3 \
             WHERE id = $4 AND account_id = $5 RETURNING version",
        )
        .bind(&draft.name)
        .bind(&rules)
        .bind(at)
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
            "UPDATE accounts SET default_policy_id = $1 WHERE id = $2 \
             AND ($1::text IS NULL OR EXISTS \
                 (SELECT 1 FROM policies WHERE id = $1 AND account_id = $2))",
        )
        .bind(id.map(PolicyId::as_str))
        .bind(account.as_str())
        .execute(&self.pool)
        .await
        .map_err(map_sqlx)?;
        Ok(done.rows_affected() > 0)
    }

    async fn account_policies(&self, account: &AccountId) -> Result<Vec<Policy>, StoreError> {
        let sql = format!("{POLICY_COLUMNS} WHERE p.account_id = $1 ORDER BY p.created_at, p.id");
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
        let sql = format!("{POLICY_COLUMNS} WHERE p.account_id = $1 AND p.id = $2");
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
             WHERE p.account_id = $1 AND p.id = $2 ORDER BY v.version DESC",
        )
        .bind(account.as_str())
        .bind(id.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(map_sqlx)?;
        rows.iter()
            .map(|r| {
                let version: i32 = r.try_get("version").map_err(map_sqlx)?;
                let rules: &str = r.try_get("rules").map_err(map_sqlx)?;
                let (rules, speed) = policy_from_json(rules).map_err(StoreError::Other)?;
                Ok(PolicyVersion {
                    version: from_stored(version, "policy version")?,
                    name: r.try_get("name").map_err(map_sqlx)?,
                    rules,
                    speed,
                    changed_by: r.try_get("changed_by").map_err(map_sqlx)?,
                    changed_at: r.try_get("changed_at").map_err(map_sqlx)?,
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
            "UPDATE api_keys SET policy_id = $1 WHERE id = $2 AND account_id = $3 \
             AND ($1::text IS NULL OR EXISTS \
                 (SELECT 1 FROM policies WHERE id = $1 AND account_id = $3))",
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
        let rows = sqlx::query(
            "SELECT (hour AT TIME ZONE 'UTC')::date AS day, NULLIF(policy_id, '') AS policy_id, \
                 SUM(requests)::BIGINT AS requests, \
                 SUM(text_items + image_items)::BIGINT AS items, \
                 SUM(rate_limited)::BIGINT AS rate_limited \
             FROM usage_hourly WHERE key_id = $1 AND hour >= $2 \
             GROUP BY day, usage_hourly.policy_id \
             HAVING SUM(requests) > 0 OR SUM(rate_limited) > 0 \
             ORDER BY day, usage_hourly.policy_id",
        )
        .bind(key.as_str())
        .bind(start_of_day(since))
        .fetch_all(&self.pool)
        .await
        .map_err(map_sqlx)?;
        rows.iter()
            .map(|r| {
                let count = |column: &str| -> Result<u64, StoreError> {
                    let v: i64 = r.try_get(column).map_err(map_sqlx)?;
                    from_stored(v, column)
                };
                let policy: Option<&str> = r.try_get("policy_id").map_err(map_sqlx)?;
                Ok(PolicyUsageRow {
                    day: r.try_get("day").map_err(map_sqlx)?,
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
            "INSERT INTO password_tokens (token_hash, account_id, expires_at) VALUES ($1, $2, $3)",
        )
        .bind(token_hash)
        .bind(account.as_str())
        .bind(expires_at)
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
            sqlx::query("SELECT account_id, expires_at FROM password_tokens WHERE token_hash = $1")
                .bind(token_hash)
                .fetch_optional(&self.pool)
                .await
                .map_err(map_sqlx)?;
        let Some(row) = row else { return Ok(None) };
        let expires_at: DateTime<Utc> = row.try_get("expires_at").map_err(map_sqlx)?;
        if expires_at <= now {
            return Ok(None);
        }
        let account: String = row.try_get("account_id").map_err(map_sqlx)?;
        parse_account_id(&account).map(Some)
    }

    async fn take_password_token(
        &self,
        token_hash: &[u8],
        now: DateTime<Utc>,
    ) -> Result<Option<AccountId>, StoreError> {
        let row = sqlx::query(
            "DELETE FROM password_tokens WHERE token_hash = $1 RETURNING account_id, expires_at",
        )
        .bind(token_hash)
        .fetch_optional(&self.pool)
        .await
        .map_err(map_sqlx)?;
        let Some(row) = row else { return Ok(None) };
        let expires_at: DateTime<Utc> = row.try_get("expires_at").map_err(map_sqlx)?;
        if expires_at <= now {
            return Ok(None);
        }
        let account: String = row.try_get("account_id").map_err(map_sqlx)?;
        let account = parse_account_id(&account)?;
        // A link used ends the account's other links: a sign-up sent
        // several, a reset may follow an unused first-password link.
        sqlx::query("DELETE FROM password_tokens WHERE account_id = $1")
            .bind(account.as_str())
            .execute(&self.pool)
            .await
            .map_err(map_sqlx)?;
        Ok(Some(account))
    }
}

fn account_from_row(row: &PgRow) -> Result<Account, StoreError> {
    let id: String = row.try_get("id").map_err(map_sqlx)?;
    let email: String = row.try_get("email").map_err(map_sqlx)?;
    let role: String = row.try_get("role").map_err(map_sqlx)?;
    let tier: String = row.try_get("tier").map_err(map_sqlx)?;
    let custom_rpm: Option<i32> = row.try_get("custom_rpm").map_err(map_sqlx)?;
    let password_hash: Option<String> = row.try_get("password_hash").map_err(map_sqlx)?;
    Ok(Account {
        id: parse_account_id(&id)?,
        email: parse_email(&email)?,
        password_hash: password_hash.map(PasswordHash::from_stored),
        role: role.parse().map_err(StoreError::Other)?,
        plan: stored_plan(&tier, custom_rpm.map(i64::from))?,
        disabled_at: row.try_get("disabled_at").map_err(map_sqlx)?,
        created_at: row.try_get("created_at").map_err(map_sqlx)?,
        awaiting_confirmation: row.try_get("awaiting_confirmation").map_err(map_sqlx)?,
    })
}

/// The day of a partition named `usage_events_pYYYYMMDD`; `None` for any
/// other name (the default partition, or a table someone attached).
fn partition_day(name: &str) -> Option<NaiveDate> {
    let digits = name.strip_prefix("usage_events_p")?;
    if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    NaiveDate::parse_from_str(digits, "%Y%m%d").ok()
}

fn start_of_day(day: NaiveDate) -> DateTime<Utc> {
    day.and_time(NaiveTime::MIN).and_utc()
}

/// A batch as one array per column, for `UNNEST`.
#[derive(Default)]
struct UsageColumns {
    request_id: Vec<String>,
    key_id: Vec<String>,
    at: Vec<DateTime<Utc>>,
    status: Vec<i32>,
    text_items: Vec<i64>,
    text_chars: Vec<i64>,
    image_items: Vec<i64>,
    image_bytes: Vec<i64>,
    deep_analyses: Vec<i64>,
    flagged: Vec<bool>,
    rate_limited: Vec<bool>,
    billable: Vec<bool>,
    latency_ms: Vec<i64>,
    endpoint: Vec<&'static str>,
    policy_id: Vec<Option<String>>,
}

impl UsageColumns {
    fn from_events(events: &[UsageEvent]) -> Result<UsageColumns, StoreError> {
        let mut c = UsageColumns::default();
        for event in events {
            let r = UsageRow::from_event(event)?;
            c.request_id.push(r.request_id.to_owned());
            c.key_id.push(r.key_id.to_owned());
            c.at.push(r.at);
            c.status.push(r.status);
            c.text_items.push(r.text_items);
            c.text_chars.push(r.text_chars);
            c.image_items.push(r.image_items);
            c.image_bytes.push(r.image_bytes);
            c.deep_analyses.push(r.deep_analyses);
            c.flagged.push(r.flagged);
            c.rate_limited.push(r.rate_limited);
            c.billable.push(r.billable);
            c.latency_ms.push(r.latency_ms);
            c.endpoint.push(event.endpoint.as_str());
            c.policy_id.push(r.policy_id.map(str::to_owned));
        }
        Ok(c)
    }
}

fn key_from_row(row: &PgRow) -> Result<ApiKeyRecord, StoreError> {
    let id: String = row.try_get("id").map_err(map_sqlx)?;
    let tier: String = row.try_get("tier").map_err(map_sqlx)?;
    let custom_rpm: Option<i32> = row.try_get("custom_rpm").map_err(map_sqlx)?;
    let account_id: String = row.try_get("account_id").map_err(map_sqlx)?;
    let key_rpm: Option<i32> = row.try_get("key_rpm").map_err(map_sqlx)?;
    let key_rpm = key_rpm.map(|v| from_stored(v, "custom_rpm")).transpose()?;
    Ok(ApiKeyRecord {
        id: parse_key_id(&id)?,
        name: row.try_get("name").map_err(map_sqlx)?,
        tier: Tier::from_str(&tier).map_err(StoreError::Other)?,
        custom_rpm: custom_rpm
            .map(|v| from_stored(v, "custom_rpm"))
            .transpose()?,
        owner: key_owner(&account_id, key_rpm)?,
        secret_hash: row.try_get("secret_hash").map_err(map_sqlx)?,
        created_at: row.try_get("created_at").map_err(map_sqlx)?,
        revoked_at: row.try_get("revoked_at").map_err(map_sqlx)?,
        policy_id: row
            .try_get::<Option<&str>, _>("own_policy_id")
            .map_err(map_sqlx)?
            .map(parse_policy_id)
            .transpose()?,
        policy: applied_policy(
            row.try_get("policy_id").map_err(map_sqlx)?,
            row.try_get("policy_name").map_err(map_sqlx)?,
            row.try_get::<Option<i32>, _>("policy_version")
                .map_err(map_sqlx)?
                .map(i64::from),
            row.try_get("policy_rules").map_err(map_sqlx)?,
        )?,
    })
}

fn policy_from_row(row: &PgRow) -> Result<Policy, StoreError> {
    let id: &str = row.try_get("id").map_err(map_sqlx)?;
    let account: &str = row.try_get("account_id").map_err(map_sqlx)?;
    let version: i32 = row.try_get("version").map_err(map_sqlx)?;
    let rules: &str = row.try_get("rules").map_err(map_sqlx)?;
    let (rules, speed) = policy_from_json(rules).map_err(StoreError::Other)?;
    Ok(Policy {
        id: parse_policy_id(id)?,
        account_id: parse_account_id(account)?,
        name: row.try_get("name").map_err(map_sqlx)?,
        version: from_stored(version, "policy version")?,
        rules,
        speed,
        is_default: row.try_get("is_default").map_err(map_sqlx)?,
        created_at: row.try_get("created_at").map_err(map_sqlx)?,
        updated_at: row.try_get("updated_at").map_err(map_sqlx)?,
    })
}

fn usage_from_row(row: &PgRow) -> Result<UsageEvent, StoreError> {
    let get_i64 = |column: &str| row.try_get::<i64, _>(column).map_err(map_sqlx);
    let get_bool = |column: &str| row.try_get::<bool, _>(column).map_err(map_sqlx);
    UsageRow {
        request_id: row.try_get("request_id").map_err(map_sqlx)?,
        key_id: row.try_get("key_id").map_err(map_sqlx)?,
        at: row.try_get("at").map_err(map_sqlx)?,
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

fn billing_from_row(row: &PgRow, period: Period) -> Result<BillingRow, StoreError> {
    let count = |column: &str| -> Result<u64, StoreError> {
        let v: i64 = row.try_get(column).map_err(map_sqlx)?;
        from_stored(v, column)
    };
    let key_id: String = row.try_get("key_id").map_err(map_sqlx)?;
    Ok(BillingRow {
        key_id: parse_key_id(&key_id)?,
        period,
        period_start: row.try_get("period_start").map_err(map_sqlx)?,
        requests: count("requests")?,
        text_items: count("text_items")?,
        text_chars: count("text_chars")?,
        image_items: count("image_items")?,
        deep_analyses: count("deep_analyses")?,
        rate_limited: count("rate_limited")?,
    })
}

/// A count and the oldest time of a row of counts (`COUNT(*)`, `MIN(at)`).
fn attempts(row: &PgRow, count: &str, oldest: &str) -> Result<Attempts, StoreError> {
    let n: i64 = row.try_get(count).map_err(map_sqlx)?;
    Ok(Attempts {
        count: u32::try_from(n).unwrap_or(u32::MAX),
        oldest: row.try_get(oldest).map_err(map_sqlx)?,
    })
}

/// One row of a policy's history.
async fn insert_version(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    id: &PolicyId,
    version: u32,
    draft: &PolicyDraft,
    rules: &str,
    at: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO policy_versions (policy_id, version, name, rules, changed_by, changed_at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(id.as_str())
    .bind(
        i32::try_from(version)
            .map_err(|_| StoreError::Other(format!("policy version {version} is too large")))?,
    )
    .bind(&draft.name)
    .bind(rules)
    .bind(&draft.changed_by)
    .bind(at)
    .execute(&mut **tx)
    .await
    .map_err(map_sqlx)?;
    Ok(())
}

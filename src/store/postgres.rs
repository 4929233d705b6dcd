//! PostgreSQL backend.

use std::str::FromStr;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, NaiveTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{Postgres, QueryBuilder, Row};

use super::common::{
    custom_rpm_to_sql, from_stored, map_migrate, map_sqlx, parse_key_id, redact_error, UsageRow,
    ACQUIRE_TIMEOUT,
};
use super::{ApiKeyRecord, BillingRow, KeyId, Period, Store, StoreError, Tier, UsageEvent};

/// Connections per process: the server's handlers plus the usage writer.
const MAX_CONNECTIONS: u32 = 16;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

const KEY_COLUMNS: &str = "id, name, tier, custom_rpm, secret_hash, created_at, revoked_at";
const USAGE_COLUMNS: &str = "request_id, key_id, at, status, text_items, text_chars, \
     image_items, image_bytes, deep_analyses, flagged, rate_limited, billable, latency_ms, endpoint";

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
        sqlx::query(
            "INSERT INTO api_keys (id, name, tier, custom_rpm, secret_hash, created_at, revoked_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(key.id.as_str())
        .bind(&key.name)
        .bind(key.tier.as_str())
        .bind(custom_rpm_to_sql(key.custom_rpm)?)
        .bind(&key.secret_hash)
        .bind(key.created_at)
        .bind(key.revoked_at)
        .execute(&self.pool)
        .await
        .map_err(map_sqlx)?;
        Ok(())
    }

    async fn get_key(&self, id: &KeyId) -> Result<Option<ApiKeyRecord>, StoreError> {
        let sql = format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = $1");
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
        let done = sqlx::query("UPDATE api_keys SET tier = $2, custom_rpm = $3 WHERE id = $1")
            .bind(id.as_str())
            .bind(tier.as_str())
            .bind(custom_rpm_to_sql(custom_rpm)?)
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
        // below the 65,535 bind-parameter limit.
        let sql = format!(
            "INSERT INTO usage_events ({USAGE_COLUMNS}) \
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::timestamptz[], $4::int[], \
                 $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[], \
                 $10::bool[], $11::bool[], $12::bool[], $13::bigint[], $14::text[]) \
             ON CONFLICT (request_id) DO NOTHING"
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
            Period::Day => "(at AT TIME ZONE 'UTC')::date",
            Period::Month => "date_trunc('month', at AT TIME ZONE 'UTC')::date",
        };
        // Same aggregation as the view `usage_billing_daily`, but on the
        // table so that the `since` bound can use the indexes on `at`.
        let mut query = QueryBuilder::<Postgres>::new(format!(
            "SELECT key_id, {period_start} AS period_start, \
                 COUNT(*) FILTER (WHERE billable) AS requests, \
                 COALESCE(SUM(text_items) FILTER (WHERE billable), 0)::BIGINT AS text_items, \
                 COALESCE(SUM(text_chars) FILTER (WHERE billable), 0)::BIGINT AS text_chars, \
                 COALESCE(SUM(image_items) FILTER (WHERE billable), 0)::BIGINT AS image_items, \
                 COALESCE(SUM(deep_analyses) FILTER (WHERE billable), 0)::BIGINT AS deep_analyses, \
                 COUNT(*) FILTER (WHERE rate_limited) AS rate_limited \
             FROM usage_events WHERE (billable OR rate_limited)"
        ));
        if let Some(key) = key {
            query.push(" AND key_id = ").push_bind(key.as_str());
        }
        if let Some(since) = since {
            query.push(" AND at >= ").push_bind(start_of_day(since));
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
        }
        Ok(c)
    }
}

fn key_from_row(row: &PgRow) -> Result<ApiKeyRecord, StoreError> {
    let id: String = row.try_get("id").map_err(map_sqlx)?;
    let tier: String = row.try_get("tier").map_err(map_sqlx)?;
    let custom_rpm: Option<i32> = row.try_get("custom_rpm").map_err(map_sqlx)?;
    Ok(ApiKeyRecord {
        id: parse_key_id(&id)?,
        name: row.try_get("name").map_err(map_sqlx)?,
        tier: Tier::from_str(&tier).map_err(StoreError::Other)?,
        custom_rpm: custom_rpm
            .map(|v| from_stored(v, "custom_rpm"))
            .transpose()?,
        secret_hash: row.try_get("secret_hash").map_err(map_sqlx)?,
        created_at: row.try_get("created_at").map_err(map_sqlx)?,
        revoked_at: row.try_get("revoked_at").map_err(map_sqlx)?,
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

//! What both SQL backends share: error mapping, URL redaction and the
//! conversions between the contract's unsigned types and SQL's signed ones.

use std::time::Duration;

use chrono::{DateTime, Utc};

use std::str::FromStr;

use super::StoreError;
use crate::access::policy::{policy_from_json, AppliedPolicy, PolicyId};
use crate::access::{
    AccountId, ApiKeyRecord, Email, Endpoint, KeyId, KeyOwner, Plan, Tier, UsageEvent,
};

/// A key's columns. The policy columns are the policy the key is judged
/// by: its own, else its account's default, and only ever one of its own
/// account's (the join says so, whatever the columns hold). Read with the
/// key, so a policy change reaches every replica as fast as a revocation.
/// `revoked_at` stands for "refused since": the key's own
/// revocation, else its account's disabling. A customer's key reads its
/// plan from its account (`tier`, `custom_rpm`), and its own `custom_rpm`
/// is a lower limit (`key_rpm`); an operator key's columns are its own plan.
pub(super) const KEY_SELECT: &str = "SELECT k.id, k.name, k.account_id, \
     CASE WHEN k.account_id = '00000000-0000-0000-0000-000000000000' THEN k.tier ELSE a.tier END AS tier, \
     CASE WHEN k.account_id = '00000000-0000-0000-0000-000000000000' THEN k.custom_rpm ELSE a.custom_rpm END AS custom_rpm, \
     CASE WHEN k.account_id = '00000000-0000-0000-0000-000000000000' THEN NULL ELSE k.custom_rpm END AS key_rpm, \
     k.secret_hash, k.created_at, COALESCE(k.revoked_at, a.disabled_at) AS revoked_at, \
     k.policy_id AS own_policy_id, p.id AS policy_id, p.name AS policy_name, \
     p.version AS policy_version, p.rules AS policy_rules \
     FROM api_keys k JOIN accounts a ON a.id = k.account_id \
     LEFT JOIN policies p ON p.id = COALESCE(k.policy_id, a.default_policy_id) \
         AND p.account_id = k.account_id";

/// A policy's columns, with whether it is its account's default.
pub(super) const POLICY_COLUMNS: &str = "SELECT p.id, p.account_id, p.name, p.version, p.rules, \
     p.created_at, p.updated_at, (a.default_policy_id IS NOT NULL AND a.default_policy_id = p.id) \
     AS is_default FROM policies p JOIN accounts a ON a.id = p.account_id";

/// Whose allowance a stored key draws on.
pub(super) fn key_owner(account_id: &str, key_rpm: Option<u32>) -> Result<KeyOwner, StoreError> {
    let id = parse_account_id(account_id)?;
    Ok(if id.is_operator() {
        KeyOwner::Operator
    } else {
        KeyOwner::Account { id, key_rpm }
    })
}

/// `insert_key` stores operator keys only: a customer's key must go through
/// `insert_account_key`, which counts it against its account's cap.
pub(super) fn operator_key_only(key: &ApiKeyRecord) -> Result<(), StoreError> {
    match key.owner {
        KeyOwner::Operator => Ok(()),
        KeyOwner::Account { .. } => Err(StoreError::Other(format!(
            "key {} belongs to an account: store it with insert_account_key",
            key.id
        ))),
    }
}

/// How long a caller waits for a pooled connection (or for the database to
/// answer when connecting) before getting `StoreError::Unavailable`.
pub(super) const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// Maps a driver error onto the contract's three kinds.
pub(super) fn map_sqlx(err: sqlx::Error) -> StoreError {
    let mapped = classify_sqlx(err);
    let kind = match &mapped {
        StoreError::Unavailable(_) => "unavailable",
        StoreError::Conflict(_) => "conflict",
        StoreError::Other(_) => "other",
    };
    metrics::counter!(crate::metrics::names::DATABASE_ERRORS, "kind" => kind).increment(1);
    mapped
}

fn classify_sqlx(err: sqlx::Error) -> StoreError {
    use sqlx::Error as E;
    match err {
        // A protocol error is a connection cut or garbled on the way (a
        // proxy in front of a dead server accepts, then hangs up): transient.
        E::PoolTimedOut
        | E::PoolClosed
        | E::Io(_)
        | E::Tls(_)
        | E::WorkerCrashed
        | E::Protocol(_) => StoreError::Unavailable(err.to_string()),
        E::Database(db) => map_database_error(db.as_ref()),
        other => StoreError::Other(other.to_string()),
    }
}

fn map_database_error(db: &dyn sqlx::error::DatabaseError) -> StoreError {
    use sqlx::error::ErrorKind as K;
    let message = db.message().to_owned();
    match db.kind() {
        K::UniqueViolation | K::ForeignKeyViolation | K::CheckViolation => {
            StoreError::Conflict(message)
        }
        _ if is_unavailable_code(db.code().as_deref()) => StoreError::Unavailable(message),
        _ => StoreError::Other(message),
    }
}

/// Database error codes that mean "cannot serve now" rather than "bad
/// request": PostgreSQL connection exceptions (08), insufficient resources
/// (53) and operator intervention such as shutdown (57P); SQLite BUSY (5),
/// LOCKED (6) and CANTOPEN (14), whose extended codes keep the primary code
/// in the low byte.
fn is_unavailable_code(code: Option<&str>) -> bool {
    let Some(code) = code else { return false };
    if code.starts_with("08") || code.starts_with("53") || code.starts_with("57P") {
        return true;
    }
    is_sqlite_busy(Some(code)) || sqlite_primary_code(code) == Some(14)
}

/// SQLite BUSY (5) or LOCKED (6): another connection holds the file.
pub(super) fn is_sqlite_busy(code: Option<&str>) -> bool {
    code.and_then(sqlite_primary_code)
        .is_some_and(|n| matches!(n, 5 | 6))
}

/// The primary result code of a SQLite (possibly extended) error code.
fn sqlite_primary_code(code: &str) -> Option<u32> {
    code.parse::<u32>().ok().map(|n| n & 0xff)
}

pub(super) fn map_migrate(err: sqlx::migrate::MigrateError) -> StoreError {
    use sqlx::migrate::MigrateError as M;
    match err {
        M::Execute(e) => map_sqlx(e),
        M::ExecuteMigration(e, version) => match map_sqlx(e) {
            StoreError::Unavailable(m) => StoreError::Unavailable(m),
            StoreError::Conflict(m) | StoreError::Other(m) => {
                StoreError::Other(format!("migration {version} failed: {m}"))
            }
        },
        other => StoreError::Other(format!("migrations: {other}")),
    }
}

/// Removes the password of `url` from `message`: driver messages may quote
/// the connection string, and they end up in logs and HTTP 503 bodies.
pub(super) fn redact(message: String, url: &str) -> String {
    match url_password(url) {
        Some(password) if !password.is_empty() => message.replace(password, "***"),
        _ => message,
    }
}

fn url_password(url: &str) -> Option<&str> {
    let rest = &url[url.find("://")? + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let userinfo = &authority[..authority.rfind('@')?];
    Some(&userinfo[userinfo.find(':')? + 1..])
}

/// Applies `redact` to whichever variant the error is.
pub(super) fn redact_error(err: StoreError, url: &str) -> StoreError {
    match err {
        StoreError::Unavailable(m) => StoreError::Unavailable(redact(m, url)),
        StoreError::Conflict(m) => StoreError::Conflict(redact(m, url)),
        StoreError::Other(m) => StoreError::Other(redact(m, url)),
    }
}

/// A usage event in SQL's signed integer types, converted before any
/// statement is built so that a value out of range fails the batch cleanly.
pub(super) struct UsageRow<'a> {
    pub request_id: &'a str,
    pub key_id: &'a str,
    pub at: DateTime<Utc>,
    pub status: i32,
    pub text_items: i64,
    pub text_chars: i64,
    pub image_items: i64,
    pub image_bytes: i64,
    pub deep_analyses: i64,
    pub flagged: bool,
    pub rate_limited: bool,
    pub billable: bool,
    pub latency_ms: i64,
    pub endpoint: &'a str,
    pub policy_id: Option<&'a str>,
}

impl<'a> UsageRow<'a> {
    pub(super) fn from_event(e: &'a UsageEvent) -> Result<UsageRow<'a>, StoreError> {
        Ok(UsageRow {
            request_id: &e.request_id,
            key_id: e.key_id.as_str(),
            at: e.at,
            status: i32::from(e.status),
            text_items: i64::from(e.text_items),
            text_chars: u64_to_i64(e.text_chars, "text_chars")?,
            image_items: i64::from(e.image_items),
            image_bytes: u64_to_i64(e.image_bytes, "image_bytes")?,
            deep_analyses: i64::from(e.deep_analyses),
            flagged: e.flagged,
            rate_limited: e.rate_limited,
            billable: e.billable,
            latency_ms: i64::from(e.latency_ms),
            endpoint: e.endpoint.as_str(),
            policy_id: e.policy_id.as_ref().map(PolicyId::as_str),
        })
    }

    /// Back to the contract type, checking every stored value's range.
    pub(super) fn into_event(self) -> Result<UsageEvent, StoreError> {
        Ok(UsageEvent {
            request_id: self.request_id.to_owned(),
            key_id: parse_key_id(self.key_id)?,
            at: self.at,
            status: from_stored(self.status, "status")?,
            text_items: from_stored(self.text_items, "text_items")?,
            text_chars: from_stored(self.text_chars, "text_chars")?,
            image_items: from_stored(self.image_items, "image_items")?,
            image_bytes: from_stored(self.image_bytes, "image_bytes")?,
            deep_analyses: from_stored(self.deep_analyses, "deep_analyses")?,
            flagged: self.flagged,
            rate_limited: self.rate_limited,
            billable: self.billable,
            latency_ms: from_stored(self.latency_ms, "latency_ms")?,
            endpoint: Endpoint::from_str(self.endpoint).map_err(StoreError::Other)?,
            policy_id: self.policy_id.map(parse_policy_id).transpose()?,
        })
    }
}

fn u64_to_i64(v: u64, column: &str) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Other(format!("{column} {v} is too large to store")))
}

/// Converts a stored signed value into the contract's unsigned type.
pub(super) fn from_stored<S, T>(v: S, column: &str) -> Result<T, StoreError>
where
    S: Copy + std::fmt::Display,
    T: TryFrom<S>,
{
    T::try_from(v).map_err(|_| StoreError::Other(format!("stored {column} {v} is out of range")))
}

pub(super) fn parse_key_id(s: &str) -> Result<KeyId, StoreError> {
    KeyId::parse(s).ok_or_else(|| StoreError::Other(format!("stored key id {s:?} is malformed")))
}

pub(super) fn parse_policy_id(s: &str) -> Result<PolicyId, StoreError> {
    PolicyId::parse(s)
        .ok_or_else(|| StoreError::Other(format!("stored policy id {s:?} is malformed")))
}

/// The policy columns of [`KEY_SELECT`], all NULL when the key has none.
pub(super) fn applied_policy(
    id: Option<&str>,
    name: Option<String>,
    version: Option<i64>,
    rules: Option<&str>,
) -> Result<Option<AppliedPolicy>, StoreError> {
    let (Some(id), Some(name), Some(version), Some(rules)) = (id, name, version, rules) else {
        return Ok(None);
    };
    let (rules, speed) = policy_from_json(rules).map_err(StoreError::Other)?;
    Ok(Some(AppliedPolicy {
        id: parse_policy_id(id)?,
        name,
        version: from_stored(version, "policy version")?,
        rules,
        speed,
    }))
}

pub(super) fn parse_account_id(s: &str) -> Result<AccountId, StoreError> {
    AccountId::parse(s)
        .ok_or_else(|| StoreError::Other(format!("stored account id {s:?} is malformed")))
}

pub(super) fn parse_email(s: &str) -> Result<Email, StoreError> {
    Email::parse(s).map_err(|e| StoreError::Other(format!("stored {e}")))
}

/// An account's stored tier and limit, checked as a [`Plan`].
pub(super) fn stored_plan(tier: &str, custom_rpm: Option<i64>) -> Result<Plan, StoreError> {
    let tier = Tier::from_str(tier).map_err(StoreError::Other)?;
    let rpm = custom_rpm
        .map(|v| from_stored::<i64, u32>(v, "custom_rpm"))
        .transpose()?;
    Plan::new(tier, rpm).map_err(|e| StoreError::Other(format!("stored plan: {e}")))
}

/// `custom_rpm` is an SQL INTEGER (32-bit in PostgreSQL).
pub(super) fn custom_rpm_to_sql(rpm: Option<u32>) -> Result<Option<i32>, StoreError> {
    rpm.map(|v| {
        i32::try_from(v).map_err(|_| StoreError::Conflict(format!("custom_rpm {v} is too large")))
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_removes_the_password_only() {
        let url = "postgres://app:s3cr%3At@db.example:5432/moderato";
        let msg = "failed for postgres://app:s3cr%3At@db.example:5432/moderato".to_owned();
        let out = redact(msg, url);
        assert!(!out.contains("s3cr%3At"), "{out}");
        assert!(out.contains("app:***@db.example"), "{out}");
    }

    #[test]
    fn redact_leaves_urls_without_password_alone() {
        for url in ["postgres://app@db/x", "sqlite:data/m.db", "postgres://db/x"] {
            assert_eq!(redact("boom".to_owned(), url), "boom");
        }
    }

    #[test]
    fn password_may_contain_at_and_slash_free_chars() {
        assert_eq!(url_password("postgres://u:p@ss@h/db"), Some("p@ss"));
        assert_eq!(url_password("postgres://u:@h/db"), Some(""));
    }

    #[test]
    fn busy_and_connection_codes_are_unavailable() {
        for code in ["08006", "53300", "57P01", "5", "517", "6", "14"] {
            assert!(is_unavailable_code(Some(code)), "{code}");
        }
        for code in ["23505", "42P01", "19", "2067", "1"] {
            assert!(!is_unavailable_code(Some(code)), "{code}");
        }
        assert!(!is_unavailable_code(None));
    }
}

//! Storage: API keys and usage events behind one trait, with a PostgreSQL
//! and a SQLite implementation (each with its own migrations).

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use serde::{Deserialize, Serialize};

use crate::access::{
    Account, AccountId, ApiKeyRecord, Email, KeyId, PasswordHash, Plan, Policy, PolicyDraft,
    PolicyId, PolicyVersion, Tier, UsageEvent,
};

mod common;
pub mod postgres;
pub mod sqlite;

pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;

/// Errors from a storage backend.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be reached or timed out: maps to 503.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// A write broke a constraint (for example a duplicate key id).
    #[error("storage conflict: {0}")]
    Conflict(String),
    /// Anything else: maps to 500.
    #[error("storage error: {0}")]
    Other(String),
}

/// Granularity of a billing summary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    Day,
    Month,
}

/// Billable usage of one key over one day or month.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BillingRow {
    pub key_id: KeyId,
    pub period: Period,
    /// First day of the period (UTC).
    pub period_start: NaiveDate,
    /// Billable requests (status 200).
    pub requests: u64,
    pub text_items: u64,
    pub text_chars: u64,
    pub image_items: u64,
    pub deep_analyses: u64,
    /// Requests refused by the rate limiter (not billed; for reporting).
    pub rate_limited: u64,
}

/// A key for a customer account (made in the dashboard, or by the CLI with
/// `--account`): its plan is its account's, read from the account's row.
#[derive(Clone, Debug)]
pub struct NewAccountKey {
    pub id: KeyId,
    pub name: String,
    /// A lower limit of the key's own (checked against the plan by the caller).
    pub key_rpm: Option<u32>,
    pub secret_hash: Vec<u8>,
    pub created_at: DateTime<Utc>,
    /// A policy of the account's own (checked by the caller with
    /// [`Store::get_policy`]); `None`: the account's default.
    pub policy_id: Option<PolicyId>,
}

/// One day's usage of a key under one policy, for the usage CSV.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyUsageRow {
    pub day: NaiveDate,
    /// `None`: judged by the shipped thresholds.
    pub policy_id: Option<PolicyId>,
    /// Billable requests.
    pub requests: u64,
    /// Text and image items of billable requests.
    pub items: u64,
    pub rate_limited: u64,
}

/// What [`Store::drop_usage_before`] removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsagePruned {
    /// Whole day partitions dropped (PostgreSQL).
    pub partitions: u32,
    /// Rows deleted one by one (SQLite; PostgreSQL's default partition).
    pub rows: u64,
}

/// What became of a new account key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccountKeyInsert {
    Created,
    /// The account already holds the most keys (not revoked) it may:
    /// nothing was stored.
    AccountFull,
}

/// A key as its owner sees it: the record and when it was last used (the
/// latest usage event, as billing sees it).
#[derive(Clone, Debug, PartialEq)]
pub struct AccountKey {
    pub key: ApiKeyRecord,
    pub last_used: Option<DateTime<Utc>>,
}

/// An account in the admin's list, with its latest sign-in or API use.
#[derive(Clone, Debug, PartialEq)]
pub struct AccountListing {
    pub account: Account,
    pub last_activity: Option<DateTime<Utc>>,
}

/// A dashboard session to store. `id_hash` is a SHA-256 of the session id
/// the browser holds.
#[derive(Clone, Debug)]
pub struct NewSession {
    pub id_hash: Vec<u8>,
    pub account_id: AccountId,
    pub csrf_token: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// One use of a dashboard session. The session is alive if it is not past
/// its (idle) expiry and was created after `created_after` (its absolute
/// lifetime, which use does not move); it is then marked seen at `now` and
/// extended to `expires_at`.
#[derive(Clone, Copy, Debug)]
pub struct SessionUse {
    pub now: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub created_after: DateTime<Utc>,
}

/// A live dashboard session.
#[derive(Clone, Debug, PartialEq)]
pub struct Session {
    pub account_id: AccountId,
    pub csrf_token: String,
    pub expires_at: DateTime<Utc>,
}

/// How many attempts of one kind were counted since some time, and when the
/// oldest of them was (it leaves the window first).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Attempts {
    pub count: u32,
    pub oldest: Option<DateTime<Utc>>,
}

/// Failed sign-ins since some time, for the lockout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SignInFailures {
    /// For this e-mail address, made without a device cookie of its account
    /// (from "untrusted" clients): what locks the account.
    pub by_email: Attempts,
    /// From this client address, for any e-mail address.
    pub by_address: Attempts,
    /// Made with this device cookie (zero when none was given).
    pub by_device: Attempts,
}

/// What every backend provides. All methods are safe to call concurrently.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Runs the backend's migrations (idempotent).
    async fn migrate(&self) -> Result<(), StoreError>;
    /// Cheap round trip, for `/ready`.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Stores an operator key (`KeyOwner::Operator`, with its own plan);
    /// a customer's key goes through [`Store::insert_account_key`], which
    /// counts it against the account's cap.
    async fn insert_key(&self, key: &ApiKeyRecord) -> Result<(), StoreError>;
    async fn get_key(&self, id: &KeyId) -> Result<Option<ApiKeyRecord>, StoreError>;
    /// All keys, revoked ones included, oldest first.
    async fn list_keys(&self) -> Result<Vec<ApiKeyRecord>, StoreError>;
    /// Marks the key revoked now. `Ok(false)` if there is no such key;
    /// revoking twice keeps the first time.
    async fn revoke_key(&self, id: &KeyId) -> Result<bool, StoreError>;
    /// Changes an operator key's plan and custom limit. `Ok(false)` if
    /// there is no such operator key (a customer's key has its account's plan).
    async fn set_tier(
        &self,
        id: &KeyId,
        tier: Tier,
        custom_rpm: Option<u32>,
    ) -> Result<bool, StoreError>;

    /// Inserts a batch in one transaction; events whose `request_id` is
    /// already stored are skipped (idempotent retries).
    async fn insert_usage(&self, events: &[UsageEvent]) -> Result<(), StoreError>;
    /// Events of one key (all keys when `None`), oldest first.
    async fn usage_events(&self, key: Option<&KeyId>) -> Result<Vec<UsageEvent>, StoreError>;
    /// Billable usage per key and period, from `since` (inclusive, UTC day)
    /// on, ordered by key then period start.
    async fn billing(
        &self,
        period: Period,
        key: Option<&KeyId>,
        since: Option<NaiveDate>,
    ) -> Result<Vec<BillingRow>, StoreError>;

    /// Makes ready the storage of raw usage events of the UTC days
    /// `first..=last`: on PostgreSQL their day partitions (moving any rows
    /// of those days out of the default partition); nothing on SQLite.
    /// Returns how many partitions were made. Idempotent, and safe from
    /// several replicas at once.
    async fn prepare_usage_days(
        &self,
        first: NaiveDate,
        last: NaiveDate,
    ) -> Result<u32, StoreError>;
    /// Deletes the raw usage events of UTC days before `day`: PostgreSQL
    /// drops their whole day partitions (and deletes such rows from the
    /// default partition), SQLite deletes the rows. The hourly rollups stay:
    /// bills, the usage page and "last used" of those days are unchanged.
    async fn drop_usage_before(&self, day: NaiveDate) -> Result<UsagePruned, StoreError>;

    // Accounts. `get_key` reports the keys of a disabled account as revoked
    // (since the account was disabled): the API refuses them through its
    // usual key path, and enabling the account again would restore them.

    /// `StoreError::Conflict` if the e-mail address is taken.
    async fn insert_account(&self, account: &Account) -> Result<(), StoreError>;
    async fn get_account(&self, id: &AccountId) -> Result<Option<Account>, StoreError>;
    async fn account_by_email(&self, email: &Email) -> Result<Option<Account>, StoreError>;
    /// All accounts, oldest first, with their latest activity.
    async fn list_accounts(&self) -> Result<Vec<AccountListing>, StoreError>;
    /// Sets the account's password (`None`: no password, so no sign-in,
    /// until a one-time link sets one) and, in the same transaction, ends
    /// every session of the account but `keep_session` (the id hash of the
    /// session that made the change, if any): whoever held the old password
    /// or a session taken with it is out. Its one-time password links end
    /// too. `Ok(false)` if there is no such account, or it is the operator
    /// account.
    async fn set_account_password(
        &self,
        id: &AccountId,
        hash: Option<&PasswordHash>,
        keep_session: Option<&[u8]>,
    ) -> Result<bool, StoreError>;
    /// Sets the account's plan, which every key it owns reads from it.
    /// `Ok(false)` if there is no such account or it is the operator
    /// account (whose CLI keys each keep their own plan).
    async fn set_account_plan(&self, id: &AccountId, plan: Plan) -> Result<bool, StoreError>;
    /// Disables the account (keeping the first time) and ends its sessions.
    /// `Ok(false)` if there is no such account.
    async fn disable_account(&self, id: &AccountId) -> Result<bool, StoreError>;

    /// Stores a key owned by `account` unless the account already holds
    /// `max_keys` keys that are not revoked (counted and inserted
    /// atomically, so concurrent requests cannot pass the cap together).
    /// `StoreError::Conflict` if the account does not exist.
    async fn insert_account_key(
        &self,
        account: &AccountId,
        key: &NewAccountKey,
        max_keys: u32,
    ) -> Result<AccountKeyInsert, StoreError>;
    /// The account's keys, oldest first.
    async fn account_keys(&self, account: &AccountId) -> Result<Vec<AccountKey>, StoreError>;
    /// Revokes a key only if `account` owns it; `Ok(false)` otherwise.
    async fn revoke_account_key(&self, account: &AccountId, id: &KeyId)
        -> Result<bool, StoreError>;

    async fn insert_session(&self, session: &NewSession) -> Result<(), StoreError>;
    /// The live session whose id hashes to `id_hash` (see [`SessionUse`]),
    /// marked seen and extended; `None` if missing, idle past its expiry or
    /// past its absolute lifetime.
    async fn touch_session(
        &self,
        id_hash: &[u8],
        used: &SessionUse,
    ) -> Result<Option<Session>, StoreError>;
    async fn delete_session(&self, id_hash: &[u8]) -> Result<(), StoreError>;

    /// One failed sign-in; `device` is the SHA-256 of a device cookie valid
    /// for the account tried, when the request carried one.
    async fn record_sign_in_failure(
        &self,
        email: &str,
        address: &str,
        device: Option<&[u8]>,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError>;
    /// Failures at or after `since`.
    async fn sign_in_failures(
        &self,
        email: &str,
        address: &str,
        device: Option<&[u8]>,
        since: DateTime<Utc>,
    ) -> Result<SignInFailures, StoreError>;

    /// Stores a device cookie (its SHA-256) given to a browser that signed
    /// in to `account`.
    async fn insert_device(
        &self,
        token_hash: &[u8],
        account: &AccountId,
        created_at: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Result<(), StoreError>;
    /// The account of an unexpired device cookie; `None` if unknown or expired.
    async fn device_account(
        &self,
        token_hash: &[u8],
        now: DateTime<Utc>,
    ) -> Result<Option<AccountId>, StoreError>;

    /// One sign-up attempt from a client address (new or taken e-mail alike).
    async fn record_sign_up(&self, address: &str, at: DateTime<Utc>) -> Result<(), StoreError>;
    /// Sign-up attempts from the address at or after `since`.
    async fn sign_ups(&self, address: &str, since: DateTime<Utc>) -> Result<Attempts, StoreError>;

    /// Deletes what the dashboard no longer needs: sign-in failures and
    /// sign-up attempts before `attempts_before`, sessions, device cookies
    /// and password tokens expired by `now`, and accounts made by sign-up
    /// before `attempts_before` that were never confirmed and have no link
    /// left. Returns the rows
    /// deleted. Without it these tables grow with every guess and visit.
    async fn prune_dashboard_records(
        &self,
        attempts_before: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<u64, StoreError>;

    // Policies. Every method takes the account, and finds nothing of
    // another account: the dashboard's 404 and the CLI's refusal follow.

    /// Stores a new policy (version 1, with its first history row) of
    /// `account`, and makes it the account's default when `make_default`.
    /// `StoreError::Conflict` if the account has a policy of that name.
    async fn insert_policy(
        &self,
        account: &AccountId,
        id: &PolicyId,
        draft: &PolicyDraft,
        make_default: bool,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError>;
    /// Replaces the name and rules of the account's policy `id` as its next
    /// version (kept in its history); the new version, or `None` if the
    /// account has no such policy.
    async fn update_policy(
        &self,
        account: &AccountId,
        id: &PolicyId,
        draft: &PolicyDraft,
        at: DateTime<Utc>,
    ) -> Result<Option<u32>, StoreError>;
    /// Makes the account's policy `id` its default (`None`: no default,
    /// the shipped thresholds). `Ok(false)` if the account has no such policy.
    async fn set_default_policy(
        &self,
        account: &AccountId,
        id: Option<&PolicyId>,
    ) -> Result<bool, StoreError>;
    /// The account's policies, oldest first.
    async fn account_policies(&self, account: &AccountId) -> Result<Vec<Policy>, StoreError>;
    async fn get_policy(
        &self,
        account: &AccountId,
        id: &PolicyId,
    ) -> Result<Option<Policy>, StoreError>;
    /// Every version of the account's policy `id`, newest first (empty if
    /// the account has no such policy).
    async fn policy_history(
        &self,
        account: &AccountId,
        id: &PolicyId,
    ) -> Result<Vec<PolicyVersion>, StoreError>;
    /// Sets the policy a key of `account` names (`None`: the account's
    /// default). `Ok(false)` if the key or the policy is not the account's.
    async fn set_key_policy(
        &self,
        account: &AccountId,
        key: &KeyId,
        policy: Option<&PolicyId>,
    ) -> Result<bool, StoreError>;
    /// A key's usage per UTC day and policy from `since` on, days and
    /// policies with billable or rate-limited requests only.
    async fn policy_usage(
        &self,
        key: &KeyId,
        since: NaiveDate,
    ) -> Result<Vec<PolicyUsageRow>, StoreError>;

    /// Stores a one-time password-setting token (its SHA-256).
    async fn insert_password_token(
        &self,
        token_hash: &[u8],
        account: &AccountId,
        expires_at: DateTime<Utc>,
    ) -> Result<(), StoreError>;
    /// The token's account if it exists and has not expired, without
    /// consuming it (the form is shown only for a link that still works).
    async fn password_token_account(
        &self,
        token_hash: &[u8],
        now: DateTime<Utc>,
    ) -> Result<Option<AccountId>, StoreError>;
    /// Consumes the token: its account if it existed and had not expired.
    /// The account's other tokens go with it.
    async fn take_password_token(
        &self,
        token_hash: &[u8],
        now: DateTime<Utc>,
    ) -> Result<Option<AccountId>, StoreError>;
}

/// Opens the backend named by the URL's scheme (`postgres://`,
/// `postgresql://` or `sqlite:`), creating a SQLite file and its folder when
/// missing, and runs its migrations.
pub async fn connect(database_url: &str) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    let store: std::sync::Arc<dyn Store> = match DatabaseKind::of(database_url)? {
        DatabaseKind::Postgres => std::sync::Arc::new(PostgresStore::connect(database_url).await?),
        DatabaseKind::Sqlite => std::sync::Arc::new(SqliteStore::connect(database_url).await?),
    };
    store.migrate().await?;
    Ok(store)
}

/// The database a URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatabaseKind {
    Postgres,
    Sqlite,
}

impl DatabaseKind {
    /// Picks the backend from the URL's scheme.
    pub fn of(database_url: &str) -> Result<DatabaseKind, StoreError> {
        let scheme = database_url
            .split_once(':')
            .map(|(scheme, _)| scheme.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("postgres" | "postgresql") => Ok(DatabaseKind::Postgres),
            Some("sqlite") => Ok(DatabaseKind::Sqlite),
            // Only the scheme is quoted: the rest may hold a password.
            _ => Err(StoreError::Other(format!(
                "unsupported database URL scheme {:?}: expected postgres://, postgresql:// or sqlite:",
                scheme.unwrap_or_default()
            ))),
        }
    }
}

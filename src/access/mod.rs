//! Who may call the service, how often, and what it costs: accounts and
//! their plans, API keys, rate limits (per key, per character and for failed
//! sign-ins), policies (per-category thresholds) and usage metering. The storage layer depends on this module
//! for its vocabulary, never the other way round; `http/auth.rs` is the glue
//! that applies it to a request.

pub mod accounts;
pub mod allowance;
pub(crate) mod client;
pub(crate) mod key_cache;
pub mod keys;
pub mod plan;
pub mod policy;
pub(crate) mod ratelimit;
pub(crate) mod usage;

pub use accounts::{Account, AccountId, Email, Password, PasswordHash, Role};
pub use allowance::{Allowance, Bucket, KeyRequestError};
pub(crate) use key_cache::KeyCache;
pub use keys::{ApiKeyRecord, KeyId, KeyOwner};
pub use plan::{Plan, PlanError, Tier};
pub use policy::{AppliedPolicy, Policy, PolicyDraft, PolicyError, PolicyId, PolicyVersion};
pub use usage::{Endpoint, UsageEvent};

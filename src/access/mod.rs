//! Who may use the service and how much: accounts and their plans.
//!
//! Issue #14 gathers keys, plans, limits and metering here; accounts come
//! first because the dashboard needs them.

pub mod accounts;
pub mod plan;

pub use accounts::{Account, AccountId, Email, Password, PasswordHash, Role};
pub use plan::{Plan, PlanError};

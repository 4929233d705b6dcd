//! The page templates (`templates/dashboard/`) and the plain view models
//! they show: handlers turn store records into these, templates only print.

use askama::Template;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};

/// Renders a page; a template error (a bug) becomes a logged 500.
pub fn render(page: &impl Template) -> Response {
    match page.render() {
        Ok(html) => Html(html).into_response(),
        Err(error) => {
            tracing::error!(%error, "rendering a dashboard page failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "internal error").into_response()
        }
    }
}

/// The header of a signed-in page.
pub struct Nav {
    pub email: String,
    pub is_admin: bool,
    pub csrf_token: String,
}

pub struct KeyRow {
    pub id: String,
    pub name: String,
    /// The policy the key names itself (empty: its account's default).
    pub policy_id: String,
    /// What it is judged by, as shown: a policy's name and version, or
    /// "shipped thresholds".
    pub policy: String,
    pub plan: String,
    pub rpm: u32,
    pub created: String,
    pub last_used: String,
    pub active: bool,
}

impl KeyRow {
    pub fn status(&self) -> &'static str {
        if self.active {
            "active"
        } else {
            "revoked"
        }
    }
}

/// A key shown once, right after it was made.
pub struct NewKeyView {
    pub id: String,
    pub secret: String,
}

pub struct UsageDay {
    pub day: String,
    pub requests: u64,
    pub items: u64,
    pub rate_limited: u64,
}

/// The chart and table of 30 days, shared by the usage and account pages.
pub struct UsageView {
    pub chart_svg: String,
    pub days: Vec<UsageDay>,
    pub total_requests: u64,
    pub total_items: u64,
    pub total_rate_limited: u64,
}

pub struct KeyChoice {
    pub href: String,
    pub label: String,
    pub current: bool,
}

pub struct AccountRow {
    pub id: String,
    pub email: String,
    pub role: String,
    pub plan: String,
    pub rpm: u32,
    pub last_activity: String,
    pub status: &'static str,
}

pub struct TierOption {
    pub value: &'static str,
    pub selected: bool,
}

#[derive(Template)]
#[template(path = "dashboard/error.html")]
pub struct ErrorPage {
    pub nav: Option<Nav>,
    pub title: String,
    pub message: String,
}

#[derive(Template)]
#[template(path = "dashboard/login.html")]
pub struct LoginPage {
    pub nav: Option<Nav>,
    pub csrf_token: String,
    pub email: String,
    pub error: Option<String>,
    pub signup_open: bool,
}

/// A choice in a key's policy menu.
pub struct PolicyChoice {
    pub id: String,
    pub name: String,
}

#[derive(Template)]
#[template(path = "dashboard/keys.html")]
pub struct KeysPage {
    pub nav: Option<Nav>,
    pub csrf_token: String,
    pub keys: Vec<KeyRow>,
    /// The account's policies, for each key's menu.
    pub policies: Vec<PolicyChoice>,
    /// Where the rows' revoke links go (see `keys::keys_base`).
    pub revoke_base: Option<String>,
    pub new_key: Option<NewKeyView>,
    pub error: Option<String>,
}

#[derive(Template)]
#[template(path = "dashboard/revoke.html")]
pub struct RevokePage {
    pub nav: Option<Nav>,
    pub csrf_token: String,
    pub key: KeyRow,
    /// Where the form posts.
    pub action: String,
    /// Where "Cancel" goes.
    pub back: String,
    /// The account's e-mail when an admin revokes another account's key.
    pub owner: Option<String>,
}

#[derive(Template)]
#[template(path = "dashboard/usage.html")]
pub struct UsagePage {
    pub nav: Option<Nav>,
    pub usage: UsageView,
    pub choices: Vec<KeyChoice>,
    pub csv_href: String,
}

#[derive(Template)]
#[template(path = "dashboard/plan.html")]
pub struct PlanPage {
    pub nav: Option<Nav>,
    pub tier: String,
    pub rpm: u32,
    pub custom_rpm: bool,
    pub chars_per_minute: u32,
    /// Keys (not revoked) the account may hold.
    pub max_keys: u32,
}

#[derive(Template)]
#[template(path = "dashboard/admin_accounts.html")]
pub struct AccountsPage {
    pub nav: Option<Nav>,
    pub csrf_token: String,
    pub rows: Vec<AccountRow>,
    pub tiers: Vec<TierOption>,
    pub error: Option<String>,
    pub rpm_value: String,
    pub created_email: Option<String>,
    pub password_link: Option<String>,
}

#[derive(Template)]
#[template(path = "dashboard/admin_account.html")]
pub struct AccountPage {
    pub nav: Option<Nav>,
    pub csrf_token: String,
    pub account: AccountRow,
    pub keys: Vec<KeyRow>,
    pub revoke_base: Option<String>,
    /// A key just made for the account, shown this once.
    pub new_key: Option<NewKeyView>,
    /// Whether the admin may make keys here (not for the operator account,
    /// nor a disabled one).
    pub can_create_key: bool,
    pub key_error: Option<String>,
    pub usage: UsageView,
    pub tiers: Vec<TierOption>,
    pub rpm_value: String,
    pub is_operator: bool,
    pub disabled: bool,
    pub error: Option<String>,
    /// A password reset just made.
    pub password_reset: Option<PasswordResetView>,
    pub password_error: Option<String>,
}

/// A password reset by an admin, shown once: with the one-time link when
/// no new password was given.
pub struct PasswordResetView {
    pub link: Option<String>,
}

#[derive(Template)]
#[template(path = "dashboard/account.html")]
pub struct OwnAccountPage {
    pub nav: Option<Nav>,
    pub csrf_token: String,
    pub email: String,
    pub role: String,
    pub changed: bool,
    pub error: Option<String>,
}

#[derive(Template)]
#[template(path = "dashboard/set_password.html")]
pub struct SetPasswordPage {
    pub nav: Option<Nav>,
    pub token: String,
    pub csrf_token: String,
    pub error: Option<String>,
}

#[derive(Template)]
#[template(path = "dashboard/signup.html")]
pub struct SignupPage {
    pub nav: Option<Nav>,
    pub csrf_token: String,
    pub email: String,
    pub error: Option<String>,
    /// After a sign-up: the address the link went to, and no form.
    pub sent_to: Option<String>,
    pub link_hours: i64,
}

pub struct PolicyRow {
    pub id: String,
    pub name: String,
    pub version: u32,
    pub is_default: bool,
    /// The rules in one line.
    pub summary: String,
    pub updated: String,
}

/// One category's row of the policy form.
pub struct RuleField {
    pub category: &'static str,
    /// The shipped threshold, shown beside it.
    pub shipped: String,
    /// `shipped`, `off` or `threshold`.
    pub mode: String,
    pub value: String,
}

pub struct VersionRow {
    pub version: u32,
    pub name: String,
    pub summary: String,
    pub changed_by: String,
    pub changed_at: String,
}

#[derive(Template)]
#[template(path = "dashboard/policies.html")]
pub struct PoliciesPage {
    pub nav: Option<Nav>,
    pub csrf_token: String,
    pub policies: Vec<PolicyRow>,
    pub fields: Vec<RuleField>,
    pub name: String,
    /// The speed the form's select shows: `accurate` or `fast`.
    pub speed: String,
    /// Whether the form's "default" box is ticked.
    pub default_checked: bool,
    pub error: Option<String>,
}

#[derive(Template)]
#[template(path = "dashboard/policy.html")]
pub struct PolicyPage {
    pub nav: Option<Nav>,
    pub csrf_token: String,
    pub policy: PolicyRow,
    pub name: String,
    pub fields: Vec<RuleField>,
    /// The speed the form's select shows: `accurate` or `fast`.
    pub speed: String,
    /// Whether the form's "default" box is ticked: the policy is the
    /// account's default (or the refused form said so).
    pub default_checked: bool,
    pub history: Vec<VersionRow>,
    pub error: Option<String>,
}

//! Admin pages: accounts, plans and the keys of any account; and the
//! first-password link.

use super::form::Form;
use axum::extract::{Path, Query, State};
use axum::http::header::SET_COOKIE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use chrono::Utc;
use serde::Deserialize;

use super::error::DashError;
use super::keys::{
    account_key, create_key_for, key_rows, keys_base, revoke_key_of, revoke_page, when,
    CreateKeyForm, KeyRefused, RevokeTarget,
};
use super::pages::{
    render, AccountPage, AccountRow, AccountsPage, NewKeyView, PasswordResetView, SetPasswordPage,
    TierOption,
};
use super::session::{check_form_token, new_form_token, random_token, token_hash, Admin, CsrfForm};
use super::usage::{daily_usage, usage_view};
use crate::access::{Account, AccountId, Email, Password, PasswordHash, Plan, Role, Tier};
use crate::http::AppState;
use crate::store::{AccountListing, StoreError};

/// How long a first-password link stays valid.
pub(super) const PASSWORD_LINK_HOURS: i64 = 24;

fn account_row(listing: &AccountListing, state: &AppState) -> AccountRow {
    let a = &listing.account;
    AccountRow {
        id: a.id.to_string(),
        email: a.email.to_string(),
        role: a.role.to_string(),
        plan: a.plan.tier().to_string(),
        rpm: a.plan.rpm(&state.plans),
        last_activity: listing
            .last_activity
            .map_or_else(|| "never".to_owned(), when),
        status: if a.is_disabled() {
            "disabled"
        } else if a.awaiting_confirmation {
            "unconfirmed"
        } else {
            "active"
        },
    }
}

fn tier_options(selected: Tier) -> Vec<TierOption> {
    Tier::ALL
        .into_iter()
        .map(|t| TierOption {
            value: t.as_str(),
            selected: t == selected,
        })
        .collect()
}

/// A plan from a form's `tier` and optional `rpm`, with a message naming
/// what to fix.
fn plan_from_form(tier: &str, rpm: &str) -> Result<Plan, String> {
    let tier: Tier = tier.parse()?;
    let rpm = match rpm.trim() {
        "" => None,
        text => Some(
            text.parse::<u32>()
                .map_err(|_| format!("requests per minute must be a whole number, not {text:?}"))?,
        ),
    };
    Plan::new(tier, rpm).map_err(|e| e.to_string())
}

struct Created {
    email: String,
    password_link: Option<String>,
}

async fn accounts_page(
    state: &AppState,
    admin: &Admin,
    status: StatusCode,
    error: Option<String>,
    created: Option<Created>,
) -> Result<Response, DashError> {
    let listings = state.store.list_accounts().await?;
    let (created_email, password_link) = match created {
        Some(c) => (Some(c.email), c.password_link),
        None => (None, None),
    };
    let page = AccountsPage {
        nav: admin.0.nav(),
        csrf_token: admin.0.csrf_token.clone(),
        rows: listings.iter().map(|l| account_row(l, state)).collect(),
        tiers: tier_options(Tier::Free),
        rpm_value: String::new(),
        error,
        created_email,
        password_link,
    };
    Ok((status, render(&page)).into_response())
}

pub async fn accounts(State(state): State<AppState>, admin: Admin) -> Result<Response, DashError> {
    accounts_page(&state, &admin, StatusCode::OK, None, None).await
}

#[derive(Deserialize)]
pub struct CreateAccountForm {
    #[serde(default)]
    email: String,
    #[serde(default)]
    role: String,
    #[serde(default)]
    tier: String,
    #[serde(default)]
    rpm: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    csrf_token: String,
}

struct NewAccountInput {
    email: Email,
    role: Role,
    plan: Plan,
    password: Option<Password>,
}

fn parse_new_account(form: CreateAccountForm) -> Result<NewAccountInput, String> {
    let email = Email::parse(&form.email).map_err(|e| e.to_string())?;
    let role: Role = form.role.parse()?;
    let plan = plan_from_form(&form.tier, &form.rpm)?;
    let password = match form.password.is_empty() {
        true => None,
        false => Some(Password::new(form.password).map_err(|e| e.to_string())?),
    };
    Ok(NewAccountInput {
        email,
        role,
        plan,
        password,
    })
}

/// Stores a new account; `Ok(Err(message))` when the address is taken.
pub(super) async fn insert_new_account(
    state: &AppState,
    email: Email,
    role: Role,
    plan: Plan,
    password: Option<Password>,
) -> Result<Result<Account, String>, DashError> {
    let hash = match password {
        Some(p) => Some(hash_password(p).await?),
        None => None,
    };
    let account = Account::new(email, role, plan, hash);
    match state.store.insert_account(&account).await {
        Ok(()) => Ok(Ok(account)),
        Err(StoreError::Conflict(_)) => Ok(Err(format!(
            "An account with e-mail {} already exists.",
            account.email
        ))),
        Err(other) => Err(other.into()),
    }
}

pub async fn create_account(
    State(state): State<AppState>,
    admin: Admin,
    Form(form): Form<CreateAccountForm>,
) -> Result<Response, DashError> {
    admin.0.check_csrf(&form.csrf_token)?;
    let input = match parse_new_account(form) {
        Ok(input) => input,
        Err(message) => {
            return accounts_page(&state, &admin, StatusCode::BAD_REQUEST, Some(message), None)
                .await
        }
    };
    let wants_link = input.password.is_none();
    let account =
        match insert_new_account(&state, input.email, input.role, input.plan, input.password)
            .await?
        {
            Ok(account) => account,
            Err(message) => {
                return accounts_page(&state, &admin, StatusCode::CONFLICT, Some(message), None)
                    .await
            }
        };
    tracing::info!(admin = %admin.0.account.id, account = %account.id, "account created in the dashboard");
    let password_link = if wants_link {
        Some(issue_password_link(&state, &account.id).await?)
    } else {
        None
    };
    let created = Created {
        email: account.email.to_string(),
        password_link,
    };
    accounts_page(&state, &admin, StatusCode::OK, None, Some(created)).await
}

/// A new one-time link that sets the account's password.
pub(super) async fn issue_password_link(
    state: &AppState,
    account: &AccountId,
) -> Result<String, DashError> {
    let token = random_token();
    let expires = Utc::now() + chrono::Duration::hours(PASSWORD_LINK_HOURS);
    state
        .store
        .insert_password_token(&token_hash(&token), account, expires)
        .await?;
    Ok(format!("/dashboard/set-password?token={token}"))
}

/// The argon2id hash of a password, off the async threads.
pub(super) async fn hash_password(password: Password) -> Result<PasswordHash, DashError> {
    tokio::task::spawn_blocking(move || password.hash())
        .await
        .map_err(|e| DashError::Internal(format!("password hash: {e}")))
}

async fn target_account(state: &AppState, id: &str) -> Result<AccountListing, DashError> {
    let id = AccountId::parse(id).ok_or(DashError::NotFound)?;
    state
        .store
        .list_accounts()
        .await?
        .into_iter()
        .find(|l| l.account.id == id)
        .ok_or(DashError::NotFound)
}

/// What the account page shows besides the account: an error of the plan
/// form, or of the key form, or a key just made.
#[derive(Default)]
struct AccountPageExtras {
    error: Option<String>,
    key_error: Option<String>,
    new_key: Option<NewKeyView>,
    password_reset: Option<PasswordResetView>,
    password_error: Option<String>,
}

async fn account_page(
    state: &AppState,
    admin: &Admin,
    listing: &AccountListing,
    status: StatusCode,
    extras: AccountPageExtras,
) -> Result<Response, DashError> {
    let account = &listing.account;
    let days = daily_usage(state, &account.id, None).await?;
    let page = AccountPage {
        nav: admin.0.nav(),
        csrf_token: admin.0.csrf_token.clone(),
        keys: key_rows(state, &account.id).await?,
        revoke_base: Some(keys_base(Some(&account.id))),
        new_key: extras.new_key,
        can_create_key: key_creation_refusal(account).is_none(),
        key_error: extras.key_error,
        usage: usage_view(days),
        tiers: tier_options(account.plan.tier()),
        rpm_value: account
            .plan
            .custom_rpm()
            .map(|r| r.to_string())
            .unwrap_or_default(),
        is_operator: account.id.is_operator(),
        disabled: account.is_disabled(),
        error: extras.error,
        password_reset: extras.password_reset,
        password_error: extras.password_error,
        account: account_row(listing, state),
    };
    Ok((status, render(&page)).into_response())
}

pub async fn account(
    State(state): State<AppState>,
    admin: Admin,
    Path(id): Path<String>,
) -> Result<Response, DashError> {
    let listing = target_account(&state, &id).await?;
    account_page(
        &state,
        &admin,
        &listing,
        StatusCode::OK,
        AccountPageExtras::default(),
    )
    .await
}

/// Why an admin may not make a key for `account`, if they may not. The
/// operator account's keys are made with `moderato keys create`, which
/// gives each its own plan: a key made here would silently get the operator
/// row's placeholder plan. A disabled account's keys would not work.
fn key_creation_refusal(account: &Account) -> Option<&'static str> {
    if account.id.is_operator() {
        Some("Keys of the operator account are made with `moderato keys create`, which sets each key's plan.")
    } else if account.is_disabled() {
        Some("The account is disabled: a key made for it would be refused by the API.")
    } else {
        None
    }
}

/// Makes a key for the account (as its owner would on the keys page) and
/// shows it this once on the account page.
pub async fn create_key(
    State(state): State<AppState>,
    admin: Admin,
    Path(id): Path<String>,
    Form(form): Form<CreateKeyForm>,
) -> Result<Response, DashError> {
    admin.0.check_csrf(&form.csrf_token)?;
    let listing = target_account(&state, &id).await?;
    let account = &listing.account;
    let created = match key_creation_refusal(account) {
        Some(refusal) => Err(KeyRefused {
            status: StatusCode::BAD_REQUEST,
            message: refusal.to_owned(),
        }),
        None => create_key_for(&state, account, &form).await?,
    };
    let (status, extras) = match created {
        Ok(new_key) => {
            tracing::info!(admin = %admin.0.account.id, account = %account.id, key = %new_key.id, "key created by an admin");
            let extras = AccountPageExtras {
                new_key: Some(new_key),
                ..AccountPageExtras::default()
            };
            (StatusCode::OK, extras)
        }
        Err(refused) => {
            let extras = AccountPageExtras {
                key_error: Some(refused.message),
                ..AccountPageExtras::default()
            };
            (refused.status, extras)
        }
    };
    account_page(&state, &admin, &listing, status, extras).await
}

pub async fn confirm_revoke_key(
    State(state): State<AppState>,
    admin: Admin,
    Path((id, key_id)): Path<(String, String)>,
) -> Result<Response, DashError> {
    let listing = target_account(&state, &id).await?;
    let account = &listing.account;
    let key = account_key(&state, &account.id, &key_id).await?;
    let target = RevokeTarget {
        base: keys_base(Some(&account.id)),
        back: format!("/dashboard/admin/accounts/{}", account.id),
        owner: Some(account.email.to_string()),
    };
    Ok(revoke_page(&admin.0, key, target))
}

pub async fn revoke_key(
    State(state): State<AppState>,
    admin: Admin,
    Path((id, key_id)): Path<(String, String)>,
    Form(form): Form<CsrfForm>,
) -> Result<Response, DashError> {
    admin.0.check_csrf(&form.csrf_token)?;
    let account = AccountId::parse(&id).ok_or(DashError::NotFound)?;
    revoke_key_of(&state, &account, &key_id).await?;
    tracing::info!(admin = %admin.0.account.id, account = %account, key = %key_id, "key revoked by an admin");
    Ok(Redirect::to(&format!("/dashboard/admin/accounts/{account}")).into_response())
}

#[derive(Deserialize)]
pub struct PlanForm {
    #[serde(default)]
    tier: String,
    #[serde(default)]
    rpm: String,
    #[serde(default)]
    csrf_token: String,
}

pub async fn set_plan(
    State(state): State<AppState>,
    admin: Admin,
    Path(id): Path<String>,
    Form(form): Form<PlanForm>,
) -> Result<Response, DashError> {
    admin.0.check_csrf(&form.csrf_token)?;
    let account_id = AccountId::parse(&id).ok_or(DashError::NotFound)?;
    let plan = match plan_from_form(&form.tier, &form.rpm) {
        Ok(plan) => plan,
        Err(message) => {
            let listing = target_account(&state, &id).await?;
            let extras = AccountPageExtras {
                error: Some(message),
                ..AccountPageExtras::default()
            };
            return account_page(&state, &admin, &listing, StatusCode::BAD_REQUEST, extras).await;
        }
    };
    if !state.store.set_account_plan(&account_id, plan).await? {
        return Err(DashError::NotFound);
    }
    tracing::info!(admin = %admin.0.account.id, account = %account_id, tier = %plan.tier(), "plan set in the dashboard");
    Ok(Redirect::to(&format!("/dashboard/admin/accounts/{account_id}")).into_response())
}

pub async fn disable(
    State(state): State<AppState>,
    admin: Admin,
    Path(id): Path<String>,
    Form(form): Form<CsrfForm>,
) -> Result<Response, DashError> {
    admin.0.check_csrf(&form.csrf_token)?;
    let account_id = AccountId::parse(&id).ok_or(DashError::NotFound)?;
    if account_id.is_operator() || !state.store.disable_account(&account_id).await? {
        return Err(DashError::NotFound);
    }
    tracing::info!(admin = %admin.0.account.id, account = %account_id, "account disabled in the dashboard");
    Ok(Redirect::to(&format!("/dashboard/admin/accounts/{account_id}")).into_response())
}

#[derive(Deserialize)]
pub struct ResetPasswordForm {
    #[serde(default)]
    password: String,
    #[serde(default)]
    csrf_token: String,
}

/// Resets the account's password: to the one given, or (none given) to
/// none, with a one-time link to set the next. Either way every session
/// of the account ends, so whoever knew the old password, or holds a
/// session taken with it, is out.
pub async fn reset_password(
    State(state): State<AppState>,
    admin: Admin,
    Path(id): Path<String>,
    Form(form): Form<ResetPasswordForm>,
) -> Result<Response, DashError> {
    admin.0.check_csrf(&form.csrf_token)?;
    let listing = target_account(&state, &id).await?;
    let account = &listing.account;
    if account.id.is_operator() {
        return Err(DashError::NotFound);
    }
    let password = match form.password.is_empty() {
        true => None,
        false => match Password::new(form.password) {
            Ok(p) => Some(p),
            Err(e) => {
                let extras = AccountPageExtras {
                    password_error: Some(e.to_string()),
                    ..AccountPageExtras::default()
                };
                return account_page(&state, &admin, &listing, StatusCode::BAD_REQUEST, extras)
                    .await;
            }
        },
    };
    let hash = match password {
        Some(p) => Some(hash_password(p).await?),
        None => None,
    };
    // An admin resetting their own password keeps the session doing it.
    let keep = (account.id == admin.0.account.id).then_some(admin.0.session_hash.as_slice());
    if !state
        .store
        .set_account_password(&account.id, hash.as_ref(), keep)
        .await?
    {
        return Err(DashError::NotFound);
    }
    let link = match hash {
        Some(_) => None,
        None => Some(issue_password_link(&state, &account.id).await?),
    };
    tracing::info!(admin = %admin.0.account.id, account = %account.id, link = link.is_some(), "password reset by an admin");
    let extras = AccountPageExtras {
        password_reset: Some(PasswordResetView { link }),
        ..AccountPageExtras::default()
    };
    account_page(&state, &admin, &listing, StatusCode::OK, extras).await
}

#[derive(Deserialize)]
pub struct TokenQuery {
    #[serde(default)]
    token: String,
}

fn set_password_form(
    state: &AppState,
    status: StatusCode,
    token: String,
    error: Option<String>,
) -> Response {
    let (csrf_token, cookie) = new_form_token(state);
    let page = SetPasswordPage {
        nav: None,
        token,
        csrf_token,
        error,
    };
    (status, [(SET_COOKIE, cookie)], render(&page)).into_response()
}

pub async fn set_password_page(
    State(state): State<AppState>,
    Query(query): Query<TokenQuery>,
) -> Result<Response, DashError> {
    let valid = state
        .store
        .password_token_account(&token_hash(&query.token), Utc::now())
        .await?
        .is_some();
    if !valid {
        return Ok(invalid_link_page(&state));
    }
    Ok(set_password_form(&state, StatusCode::OK, query.token, None))
}

/// A used, expired or unknown link: the message, and no form to fill in.
fn invalid_link_page(state: &AppState) -> Response {
    set_password_form(
        state,
        StatusCode::BAD_REQUEST,
        String::new(),
        Some(
            "This link is not valid: it has expired or was used already. Ask for a new one.".into(),
        ),
    )
}

#[derive(Deserialize)]
pub struct SetPasswordForm {
    #[serde(default)]
    token: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    csrf_token: String,
}

pub async fn set_password(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(query): Query<TokenQuery>,
    Form(mut form): Form<SetPasswordForm>,
) -> Result<Response, DashError> {
    check_form_token(&state, &headers, &form.csrf_token)?;
    // The page's form carries the token in a hidden field; a client that
    // posts back to the link itself carries it in the query.
    if form.token.is_empty() {
        form.token = query.token;
    }
    // Checked before the token is used up, so a short password costs nothing.
    let password = match Password::new(form.password) {
        Ok(p) => p,
        Err(e) => {
            return Ok(set_password_form(
                &state,
                StatusCode::BAD_REQUEST,
                form.token,
                Some(e.to_string()),
            ))
        }
    };
    let account = state
        .store
        .take_password_token(&token_hash(&form.token), Utc::now())
        .await?;
    let Some(account) = account else {
        return Ok(invalid_link_page(&state));
    };
    let hash = hash_password(password).await?;
    // Whoever held a session of the account (before a reset, say) is out.
    state
        .store
        .set_account_password(&account, Some(&hash), None)
        .await?;
    tracing::info!(account = %account, "password set through a one-time link");
    Ok(Redirect::to("/dashboard/login").into_response())
}

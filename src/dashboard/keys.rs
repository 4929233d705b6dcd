//! A customer's own keys and plan.

use super::form::Form;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::error::DashError;
use super::pages::{render, KeyRow, KeysPage, NewKeyView, PlanPage, PolicyChoice, RevokePage};
use super::session::{CsrfForm, SignedIn};
use crate::access::allowance::check_own_rpm;
use crate::access::{Account, AccountId, KeyId, KeyRequestError, PolicyError, PolicyId};
use crate::config::Plans;
use crate::http::AppState;
use crate::store::{AccountKey, AccountKeyInsert, NewAccountKey};

const MAX_KEY_NAME_CHARS: usize = 100;

/// How the pages print a time: to the minute, UTC.
pub fn when(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M UTC").to_string()
}

pub fn key_row(key: &AccountKey, plans: &Plans) -> KeyRow {
    let k = &key.key;
    KeyRow {
        id: k.id.to_string(),
        name: k.name.clone(),
        policy_id: k
            .policy_id
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        policy: match &k.policy {
            Some(p) => format!("{} (v{})", p.name, p.version),
            None => "shipped thresholds".to_owned(),
        },
        plan: k.tier.to_string(),
        rpm: k.effective_rpm(plans),
        created: when(k.created_at),
        last_used: key.last_used.map_or_else(|| "never".to_owned(), when),
        active: k.revoked_at.is_none(),
    }
}

pub async fn key_rows(state: &AppState, account: &AccountId) -> Result<Vec<KeyRow>, DashError> {
    let keys = state.store.account_keys(account).await?;
    Ok(keys.iter().map(|k| key_row(k, &state.plans)).collect())
}

/// Where a list of an account's keys sends its revoke links: the owner's
/// own pages, or the admin's page of that account.
pub fn keys_base(admin_of: Option<&AccountId>) -> String {
    match admin_of {
        None => "/dashboard/keys".to_owned(),
        Some(account) => format!("/dashboard/admin/accounts/{account}/keys"),
    }
}

async fn keys_page(
    state: &AppState,
    user: &SignedIn,
    status: StatusCode,
    new_key: Option<NewKeyView>,
    error: Option<String>,
) -> Result<Response, DashError> {
    let policies = state.store.account_policies(&user.account.id).await?;
    let page = KeysPage {
        nav: user.nav(),
        csrf_token: user.csrf_token.clone(),
        keys: key_rows(state, &user.account.id).await?,
        policies: policies
            .iter()
            .map(|p| PolicyChoice {
                id: p.id.to_string(),
                name: p.name.clone(),
            })
            .collect(),
        revoke_base: Some(keys_base(None)),
        new_key,
        error,
    };
    Ok((status, render(&page)).into_response())
}

pub async fn list(State(state): State<AppState>, user: SignedIn) -> Result<Response, DashError> {
    keys_page(&state, &user, StatusCode::OK, None, None).await
}

#[derive(Deserialize)]
pub struct CreateKeyForm {
    #[serde(default)]
    pub name: String,
    /// A lower limit of the key's own (empty: the plan's).
    #[serde(default)]
    pub rpm: String,
    /// One of the account's policies (empty: the account's default).
    #[serde(default)]
    pub policy: String,
    #[serde(default)]
    pub csrf_token: String,
}

/// Why a key was not made: what the form said (400), or the account's cap
/// (409). The message is shown on the page.
pub struct KeyRefused {
    pub status: StatusCode,
    pub message: String,
}

impl KeyRefused {
    fn invalid(message: String) -> KeyRefused {
        KeyRefused {
            status: StatusCode::BAD_REQUEST,
            message,
        }
    }
}

/// Makes a key for `account`, owned by it and drawing on its plan's
/// allowance (with the form's lower limit of its own, if any), and returns
/// its secret to show this once. `Ok(Err(_))` when the form is not
/// acceptable or the account holds as many keys as its plan allows.
pub async fn create_key_for(
    state: &AppState,
    account: &Account,
    form: &CreateKeyForm,
) -> Result<Result<NewKeyView, KeyRefused>, DashError> {
    let name = form.name.trim();
    if name.is_empty() || name.chars().count() > MAX_KEY_NAME_CHARS {
        return Ok(Err(KeyRefused::invalid(format!(
            "Give the key a name of 1 to {MAX_KEY_NAME_CHARS} characters."
        ))));
    }
    let plan = account.plan;
    let own_rpm = match form.rpm.trim() {
        "" => None,
        text => match text.parse::<u32>() {
            Ok(rpm) => Some(rpm),
            Err(_) => {
                let error = KeyRequestError::OwnLimitTooHigh {
                    plan_rpm: plan.rpm(&state.plans),
                    tier: plan.tier(),
                };
                return Ok(Err(KeyRefused::invalid(error.to_string())));
            }
        },
    };
    let key_rpm = match check_own_rpm(own_rpm, plan.tier(), plan.custom_rpm(), &state.plans) {
        Ok(rpm) => rpm,
        Err(error) => return Ok(Err(KeyRefused::invalid(error.to_string()))),
    };
    let policy_id = match form.policy.trim() {
        "" => None,
        text => {
            let mine = match PolicyId::parse(text) {
                Some(id) => state.store.get_policy(&account.id, &id).await?,
                None => None,
            };
            match mine {
                Some(policy) => Some(policy.id),
                None => {
                    let error = PolicyError::NotInAccount {
                        field: "policy".into(),
                        id: text.to_owned(),
                    };
                    return Ok(Err(KeyRefused::invalid(error.to_string())));
                }
            }
        }
    };
    let new = crate::access::keys::generate(&state.pepper);
    let max_keys = state.max_keys_per_account.of(plan.tier());
    let key = NewAccountKey {
        id: new.id.clone(),
        name: name.to_owned(),
        key_rpm,
        secret_hash: new.secret_hash,
        created_at: Utc::now(),
        policy_id,
    };
    match state
        .store
        .insert_account_key(&account.id, &key, max_keys)
        .await?
    {
        AccountKeyInsert::Created => {}
        AccountKeyInsert::AccountFull => {
            let error = KeyRequestError::TooManyKeys {
                max: max_keys,
                tier: plan.tier(),
            };
            return Ok(Err(KeyRefused {
                status: StatusCode::CONFLICT,
                message: error.to_string(),
            }));
        }
    }
    tracing::info!(account = %account.id, key = %new.id, "key created in the dashboard");
    Ok(Ok(NewKeyView {
        id: new.id.to_string(),
        secret: new.full_key,
    }))
}

pub async fn create(
    State(state): State<AppState>,
    user: SignedIn,
    Form(form): Form<CreateKeyForm>,
) -> Result<Response, DashError> {
    user.check_csrf(&form.csrf_token)?;
    match create_key_for(&state, &user.account, &form).await? {
        Ok(shown) => keys_page(&state, &user, StatusCode::OK, Some(shown), None).await,
        Err(refused) => keys_page(&state, &user, refused.status, None, Some(refused.message)).await,
    }
}

/// The key `id` of `account`, or 404 (also for another account's key).
pub async fn account_key(
    state: &AppState,
    account: &AccountId,
    id: &str,
) -> Result<KeyRow, DashError> {
    let id = KeyId::parse(id).ok_or(DashError::NotFound)?;
    state
        .store
        .account_keys(account)
        .await?
        .iter()
        .find(|k| k.key.id == id)
        .map(|k| key_row(k, &state.plans))
        .ok_or(DashError::NotFound)
}

/// Revokes the key `id` of `account` (the API refuses it within a second,
/// through its key cache); 404 if the account has no such key.
pub async fn revoke_key_of(
    state: &AppState,
    account: &AccountId,
    id: &str,
) -> Result<(), DashError> {
    let id = KeyId::parse(id).ok_or(DashError::NotFound)?;
    if !state.store.revoke_account_key(account, &id).await? {
        return Err(DashError::NotFound);
    }
    tracing::info!(account = %account, key = %id, "key revoked in the dashboard");
    Ok(())
}

/// Where a revoke confirmation posts and returns to, and whose key it
/// names (for an admin's page).
pub struct RevokeTarget {
    /// The list the key is under (see [`keys_base`]).
    pub base: String,
    /// Where "Cancel" goes.
    pub back: String,
    pub owner: Option<String>,
}

/// The confirmation page before revoking a key.
pub fn revoke_page(user: &SignedIn, key: KeyRow, target: RevokeTarget) -> Response {
    let page = RevokePage {
        nav: user.nav(),
        csrf_token: user.csrf_token.clone(),
        action: format!("{}/{}/revoke", target.base, key.id),
        back: target.back,
        owner: target.owner,
        key,
    };
    render(&page)
}

pub async fn confirm_revoke(
    State(state): State<AppState>,
    user: SignedIn,
    Path(id): Path<String>,
) -> Result<Response, DashError> {
    let key = account_key(&state, &user.account.id, &id).await?;
    let target = RevokeTarget {
        base: keys_base(None),
        back: keys_base(None),
        owner: None,
    };
    Ok(revoke_page(&user, key, target))
}

pub async fn revoke(
    State(state): State<AppState>,
    user: SignedIn,
    Path(id): Path<String>,
    Form(form): Form<CsrfForm>,
) -> Result<Response, DashError> {
    user.check_csrf(&form.csrf_token)?;
    revoke_key_of(&state, &user.account.id, &id).await?;
    Ok(Redirect::to("/dashboard/keys").into_response())
}

pub async fn plan(State(state): State<AppState>, user: SignedIn) -> Result<Response, DashError> {
    let plan = user.account.plan;
    let page = PlanPage {
        nav: user.nav(),
        tier: plan.tier().to_string(),
        rpm: plan.rpm(&state.plans),
        custom_rpm: plan.custom_rpm().is_some(),
        chars_per_minute: state.budget.chars_per_minute.of(plan.tier()),
        max_keys: state.max_keys_per_account.of(plan.tier()),
    };
    Ok(render(&page))
}

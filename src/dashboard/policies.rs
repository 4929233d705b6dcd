//! An account's policies: the list, a form of the 11 categories (each
//! "shipped", "off" or a threshold, with the shipped value beside it) to
//! make one or change one, its history, and the choice of a key's policy.
//! Every look-up is scoped to the signed-in account: another account's
//! policy or key answers 404, as everywhere in the dashboard.

use std::collections::HashMap;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use chrono::Utc;

use super::error::DashError;
use super::form::Form;
use super::keys::when;
use super::pages::{render, PoliciesPage, PolicyPage, PolicyRow, RuleField, VersionRow};
use super::session::SignedIn;
use crate::access::policy::{category, policy_name, threshold};
use crate::access::{AccountId, KeyId, Policy, PolicyDraft, PolicyError, PolicyId};
use crate::http::AppState;
use crate::moderation::{Category, CategoryRule, CategoryRules, Speed, Thresholds};

/// Who a change by the dashboard is recorded as: the signed-in e-mail.
fn author(user: &SignedIn) -> String {
    user.account.email.to_string()
}

/// How a rule reads in a table: `shipped`, `off` or the threshold.
pub fn rule_text(rule: Option<CategoryRule>) -> String {
    match rule {
        None => "shipped".into(),
        Some(CategoryRule::Off) => "off".into(),
        Some(CategoryRule::Threshold(t)) => t.to_string(),
    }
}

/// The rules in one line: only the categories with a rule, then the
/// speed when it is not the default.
pub fn rules_summary(rules: &CategoryRules, speed: Speed) -> String {
    let mut parts: Vec<String> = rules
        .iter()
        .map(|(c, rule)| format!("{} {}", c.as_str(), rule_text(Some(rule))))
        .collect();
    if parts.is_empty() {
        parts.push("all shipped".into());
    }
    if speed != Speed::default() {
        parts.push(format!("speed {speed}"));
    }
    parts.join(", ")
}

/// The speed a posted form chose (`accurate` when it says none).
fn speed_from_form(form: &HashMap<String, String>) -> Result<Speed, PolicyError> {
    Ok(match form.get("speed") {
        None => Speed::default(),
        Some(text) => text.parse()?,
    })
}

/// The speed the form shows: what was sent after a refused post, else the
/// policy's.
fn form_speed(speed: Speed, sent: Option<&HashMap<String, String>>) -> String {
    sent.and_then(|f| f.get("speed").cloned())
        .unwrap_or_else(|| speed.as_str().to_owned())
}

/// The form's 11 rows, filled from `rules` (or, after a refused post, from
/// what was sent, so nothing typed is lost).
fn rule_fields(
    shipped: &Thresholds,
    rules: &CategoryRules,
    sent: Option<&HashMap<String, String>>,
) -> Vec<RuleField> {
    Category::ALL
        .into_iter()
        .map(|c| {
            let (mode, value) = match sent {
                Some(form) => (
                    form.get(&format!("rule.{c}"))
                        .cloned()
                        .unwrap_or_else(|| "shipped".into()),
                    form.get(&format!("threshold.{c}"))
                        .cloned()
                        .unwrap_or_default(),
                ),
                None => match rules.get(c) {
                    None => ("shipped".into(), String::new()),
                    Some(CategoryRule::Off) => ("off".into(), String::new()),
                    Some(CategoryRule::Threshold(t)) => ("threshold".into(), t.to_string()),
                },
            };
            RuleField {
                category: c.as_str(),
                shipped: format!("{:.2}", shipped.get(c)),
                mode,
                value,
            }
        })
        .collect()
}

/// The rules of a posted form: `rule.CATEGORY` is `shipped`, `off` or
/// `threshold`, with `threshold.CATEGORY` the value. Errors name the field.
fn rules_from_form(form: &HashMap<String, String>) -> Result<CategoryRules, PolicyError> {
    let mut rules = CategoryRules::default();
    for (field, mode) in form {
        let Some(name) = field.strip_prefix("rule.") else {
            if let Some(name) = field.strip_prefix("threshold.") {
                category(field, name)?;
            }
            continue;
        };
        let c = category(field, name)?;
        let rule = match mode.as_str() {
            "shipped" => None,
            "off" => Some(CategoryRule::Off),
            "threshold" => {
                let value_field = format!("threshold.{c}");
                let value = form.get(&value_field).map(String::as_str).unwrap_or("");
                Some(CategoryRule::Threshold(threshold(&value_field, value)?))
            }
            other => {
                return Err(PolicyError::UnknownCategory {
                    field: field.clone(),
                    name: other.to_owned(),
                })
            }
        };
        rules.set(c, rule);
    }
    Ok(rules)
}

fn policy_row(p: &Policy) -> PolicyRow {
    PolicyRow {
        id: p.id.to_string(),
        name: p.name.clone(),
        version: p.version,
        is_default: p.is_default,
        summary: rules_summary(&p.rules, p.speed),
        updated: when(p.updated_at),
    }
}

/// The account's policy `id`, or 404 (also for another account's).
async fn own_policy(state: &AppState, account: &AccountId, id: &str) -> Result<Policy, DashError> {
    let id = PolicyId::parse(id).ok_or(DashError::NotFound)?;
    state
        .store
        .get_policy(account, &id)
        .await?
        .ok_or(DashError::NotFound)
}

async fn list_page(
    state: &AppState,
    user: &SignedIn,
    status: StatusCode,
    sent: Option<&HashMap<String, String>>,
    error: Option<String>,
) -> Result<Response, DashError> {
    let policies = state.store.account_policies(&user.account.id).await?;
    let page = PoliciesPage {
        nav: user.nav(),
        csrf_token: user.csrf_token.clone(),
        policies: policies.iter().map(policy_row).collect(),
        fields: rule_fields(
            &state.engine.shipped_text_thresholds(),
            &CategoryRules::default(),
            sent,
        ),
        name: sent
            .and_then(|f| f.get("name").cloned())
            .unwrap_or_default(),
        speed: form_speed(Speed::default(), sent),
        default_checked: sent.is_some_and(wants_default),
        error,
    };
    Ok((status, render(&page)).into_response())
}

pub async fn list(State(state): State<AppState>, user: SignedIn) -> Result<Response, DashError> {
    list_page(&state, &user, StatusCode::OK, None, None).await
}

/// The draft a posted form describes, or the message naming what is wrong.
fn draft_of(user: &SignedIn, form: &HashMap<String, String>) -> Result<PolicyDraft, PolicyError> {
    Ok(PolicyDraft {
        name: policy_name(form.get("name").map(String::as_str).unwrap_or(""))?,
        rules: rules_from_form(form)?,
        speed: speed_from_form(form)?,
        changed_by: author(user),
    })
}

/// Whether the form's "default" box was ticked.
fn wants_default(form: &HashMap<String, String>) -> bool {
    form.get("default").is_some_and(|v| v == "on")
}

fn csrf_of(user: &SignedIn, form: &HashMap<String, String>) -> Result<(), DashError> {
    user.check_csrf(form.get("csrf_token").map(String::as_str).unwrap_or(""))
}

fn taken(name: &str) -> String {
    format!("name: you already have a policy named {name:?}")
}

pub async fn create(
    State(state): State<AppState>,
    user: SignedIn,
    Form(form): Form<HashMap<String, String>>,
) -> Result<Response, DashError> {
    csrf_of(&user, &form)?;
    let draft = match draft_of(&user, &form) {
        Ok(draft) => draft,
        Err(error) => {
            let message = Some(error.to_string());
            return list_page(&state, &user, StatusCode::BAD_REQUEST, Some(&form), message).await;
        }
    };
    let id = PolicyId::new_random();
    let make_default = wants_default(&form);
    match state
        .store
        .insert_policy(&user.account.id, &id, &draft, make_default, Utc::now())
        .await
    {
        Ok(()) => {}
        Err(crate::store::StoreError::Conflict(_)) => {
            let message = Some(taken(&draft.name));
            return list_page(&state, &user, StatusCode::CONFLICT, Some(&form), message).await;
        }
        Err(other) => return Err(other.into()),
    }
    tracing::info!(account = %user.account.id, policy = %id, "policy created in the dashboard");
    Ok(Redirect::to(&format!("/dashboard/policies/{id}")).into_response())
}

async fn policy_page(
    state: &AppState,
    user: &SignedIn,
    policy: &Policy,
    status: StatusCode,
    sent: Option<&HashMap<String, String>>,
    error: Option<String>,
) -> Result<Response, DashError> {
    let history = state
        .store
        .policy_history(&user.account.id, &policy.id)
        .await?;
    let page = PolicyPage {
        nav: user.nav(),
        csrf_token: user.csrf_token.clone(),
        policy: policy_row(policy),
        name: sent
            .and_then(|f| f.get("name").cloned())
            .unwrap_or_else(|| policy.name.clone()),
        default_checked: sent.map_or(policy.is_default, wants_default),
        fields: rule_fields(&state.engine.shipped_text_thresholds(), &policy.rules, sent),
        speed: form_speed(policy.speed, sent),
        history: history
            .iter()
            .map(|v| VersionRow {
                version: v.version,
                name: v.name.clone(),
                summary: rules_summary(&v.rules, v.speed),
                changed_by: v.changed_by.clone(),
                changed_at: when(v.changed_at),
            })
            .collect(),
        error,
    };
    Ok((status, render(&page)).into_response())
}

pub async fn show(
    State(state): State<AppState>,
    user: SignedIn,
    Path(id): Path<String>,
) -> Result<Response, DashError> {
    let policy = own_policy(&state, &user.account.id, &id).await?;
    policy_page(&state, &user, &policy, StatusCode::OK, None, None).await
}

/// A change: the policy's next version, applied by the API within the key
/// cache's TTL (the policy is read with the key).
pub async fn update(
    State(state): State<AppState>,
    user: SignedIn,
    Path(id): Path<String>,
    Form(form): Form<HashMap<String, String>>,
) -> Result<Response, DashError> {
    csrf_of(&user, &form)?;
    let policy = own_policy(&state, &user.account.id, &id).await?;
    let draft = match draft_of(&user, &form) {
        Ok(draft) => draft,
        Err(error) => {
            let message = Some(error.to_string());
            let status = StatusCode::BAD_REQUEST;
            return policy_page(&state, &user, &policy, status, Some(&form), message).await;
        }
    };
    let account = &user.account.id;
    match state
        .store
        .update_policy(account, &policy.id, &draft, Utc::now())
        .await
    {
        Ok(Some(_)) => {}
        Ok(None) => return Err(DashError::NotFound),
        Err(crate::store::StoreError::Conflict(_)) => {
            let message = Some(taken(&draft.name));
            let status = StatusCode::CONFLICT;
            return policy_page(&state, &user, &policy, status, Some(&form), message).await;
        }
        Err(other) => return Err(other.into()),
    }
    // The box shows whether the policy is the default: ticking it makes
    // it so, clearing it leaves the account without one (shipped thresholds).
    let wanted = wants_default(&form);
    if wanted != policy.is_default {
        let default = wanted.then_some(&policy.id);
        state.store.set_default_policy(account, default).await?;
    }
    tracing::info!(account = %account, policy = %policy.id, "policy changed in the dashboard");
    Ok(Redirect::to(&format!("/dashboard/policies/{}", policy.id)).into_response())
}

/// The policy a key names: `policy` empty for the account's default, else
/// one of the account's own. Another account's key or policy: 404.
pub async fn set_key_policy(
    State(state): State<AppState>,
    user: SignedIn,
    Path(key): Path<String>,
    Form(form): Form<HashMap<String, String>>,
) -> Result<Response, DashError> {
    csrf_of(&user, &form)?;
    let key = KeyId::parse(&key).ok_or(DashError::NotFound)?;
    let policy = match form.get("policy").map(String::as_str).unwrap_or("") {
        "" => None,
        id => Some(own_policy(&state, &user.account.id, id).await?.id),
    };
    if !state
        .store
        .set_key_policy(&user.account.id, &key, policy.as_ref())
        .await?
    {
        return Err(DashError::NotFound);
    }
    tracing::info!(account = %user.account.id, key = %key, "key policy set in the dashboard");
    Ok(Redirect::to("/dashboard/keys").into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_form_reads_shipped_off_and_thresholds_and_names_bad_fields() {
        let rules = rules_from_form(&form(&[
            ("rule.hate", "threshold"),
            ("threshold.hate", "0.25"),
            ("rule.violence", "off"),
            ("rule.sexual", "shipped"),
            ("threshold.sexual", "ignored"),
        ]))
        .unwrap();
        assert_eq!(rule_text(rules.get(Category::Violence)), "off");
        assert_eq!(rule_text(rules.get(Category::Hate)), "0.25");
        assert_eq!(rules.get(Category::Sexual), None);

        let bad = rules_from_form(&form(&[
            ("rule.hate", "threshold"),
            ("threshold.hate", "2"),
        ]));
        assert!(bad.unwrap_err().to_string().starts_with("threshold.hate: "));
        let unknown = rules_from_form(&form(&[("rule.hat", "off")])).unwrap_err();
        assert!(unknown
            .to_string()
            .starts_with("rule.hat: unknown category"));
    }
}

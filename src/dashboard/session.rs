//! Signing in and out, sessions, CSRF tokens and the sign-in lockout.
//!
//! A session id is 32 random bytes held by the browser in an `HttpOnly`,
//! `SameSite=Strict` cookie scoped to `/dashboard`; the database keeps only
//! its SHA-256, with the account, the session's CSRF token and its expiry
//! (extended on every request: idle expiry). Forms shown before sign-in
//! (sign-in, sign-up, set-password) carry a token that must equal the one
//! in a short-lived pre-session cookie (double submit), which another site
//! can neither read nor set.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{ConnectInfo, FromRequestParts, State};
use axum::http::header::{COOKIE, RETRY_AFTER, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::{DateTime, Utc};
use rand::RngCore;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::DashError;
use super::pages::{render, LoginPage, Nav};
use crate::access::{Account, Email, Password, Role};
use crate::http::auth::client_address;
use crate::http::AppState;
use crate::store::NewSession;

pub const SESSION_COOKIE: &str = "moderato_session";
/// The pre-session CSRF cookie of the forms shown before sign-in.
pub const FORM_COOKIE: &str = "moderato_form";
/// How long a pre-session form stays valid.
const FORM_COOKIE_SECONDS: u32 = 3600;

/// Failed sign-ins counted per account and per address, and over what time.
pub const MAX_FAILURES: u32 = 10;
pub const FAILURE_WINDOW: Duration = Duration::from_secs(15 * 60);

/// The one message for every failed sign-in: an unknown e-mail, a wrong
/// password and a disabled account look the same.
const SIGN_IN_FAILED: &str = "The e-mail address or the password is not correct.";

/// 32 random bytes, URL-safe base64.
pub fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// What the database keeps of a session id or a one-time token.
pub fn token_hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// Constant-time equality of two tokens; empty never matches.
pub fn tokens_match(expected: &str, given: &str) -> bool {
    !expected.is_empty() && bool::from(expected.as_bytes().ct_eq(given.as_bytes()))
}

/// The value of cookie `name`, if the request sent it.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, value)| value)
}

/// A `Set-Cookie` value scoped to the dashboard. `max_age` 0 deletes it.
fn cookie_header(state: &AppState, name: &str, value: &str, max_age: Option<u32>) -> HeaderValue {
    let mut text = format!("{name}={value}; Path=/dashboard; HttpOnly; SameSite=Strict");
    if let Some(seconds) = max_age {
        text.push_str(&format!("; Max-Age={seconds}"));
    }
    if state.dashboard.cookie_secure {
        text.push_str("; Secure");
    }
    HeaderValue::from_str(&text).expect("cookie values are base64url")
}

/// A fresh pre-session form token and the cookie that carries it.
pub fn new_form_token(state: &AppState) -> (String, HeaderValue) {
    let token = random_token();
    let header = cookie_header(state, FORM_COOKIE, &token, Some(FORM_COOKIE_SECONDS));
    (token, header)
}

/// Checks a pre-session form's token against its cookie (403 otherwise).
pub fn check_form_token(headers: &HeaderMap, given: &str) -> Result<(), DashError> {
    match cookie(headers, FORM_COOKIE) {
        Some(expected) if tokens_match(expected, given) => Ok(()),
        _ => Err(DashError::Forbidden),
    }
}

/// The signed-in account of a request, from its session cookie. Handlers
/// that take it are for signed-in users only (others are sent to sign in).
pub struct SignedIn {
    pub account: Account,
    pub csrf_token: String,
}

impl SignedIn {
    /// The form's token must be this session's (403 otherwise).
    pub fn check_csrf(&self, given: &str) -> Result<(), DashError> {
        if tokens_match(&self.csrf_token, given) {
            Ok(())
        } else {
            Err(DashError::Forbidden)
        }
    }

    pub fn nav(&self) -> Option<Nav> {
        Some(Nav {
            email: self.account.email.to_string(),
            is_admin: self.account.role == Role::Admin,
            csrf_token: self.csrf_token.clone(),
        })
    }
}

impl FromRequestParts<AppState> for SignedIn {
    type Rejection = DashError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, DashError> {
        let id = cookie(&parts.headers, SESSION_COOKIE).ok_or(DashError::SignInRequired)?;
        let now = Utc::now();
        let session = state
            .store
            .touch_session(&token_hash(id), now, idle_expiry(state, now))
            .await?
            .ok_or(DashError::SignInRequired)?;
        let account = state
            .store
            .get_account(&session.account_id)
            .await?
            .filter(|a| !a.is_disabled())
            .ok_or(DashError::SignInRequired)?;
        Ok(SignedIn {
            account,
            csrf_token: session.csrf_token,
        })
    }
}

/// A signed-in admin; anyone else gets 404 (admin pages do not exist for them).
pub struct Admin(pub SignedIn);

impl FromRequestParts<AppState> for Admin {
    type Rejection = DashError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, DashError> {
        let user = SignedIn::from_request_parts(parts, state).await?;
        if user.account.role == Role::Admin {
            Ok(Admin(user))
        } else {
            Err(DashError::NotFound)
        }
    }
}

fn idle_expiry(state: &AppState, now: DateTime<Utc>) -> DateTime<Utc> {
    now + chrono::Duration::minutes(i64::from(state.dashboard.session_idle_minutes))
}

pub async fn login_page(State(state): State<AppState>) -> Response {
    login_form(&state, StatusCode::OK, String::new(), None, None)
}

/// The sign-in page with a fresh form token, optionally with an error.
fn login_form(
    state: &AppState,
    status: StatusCode,
    email: String,
    error: Option<&str>,
    retry_after: Option<u64>,
) -> Response {
    let (token, cookie) = new_form_token(state);
    let page = LoginPage {
        nav: None,
        csrf_token: token,
        email,
        error: error.map(str::to_owned),
        signup_open: state.dashboard.signup == crate::config::Signup::Open,
    };
    let mut response = (status, [(SET_COOKIE, cookie)], render(&page)).into_response();
    if let Some(seconds) = retry_after {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

#[derive(Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    email: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    csrf_token: String,
}

pub async fn login(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Result<Response, DashError> {
    check_form_token(&headers, &form.csrf_token)?;
    let address = client_address(peer.ip(), &headers, &state.trusted_proxies).to_string();
    // Failures are keyed by the address as typed (lower-cased), so that
    // unknown addresses are locked out like known ones.
    let email_key = form.email.trim().to_lowercase();
    let now = Utc::now();
    let window = chrono::Duration::from_std(FAILURE_WINDOW).expect("15 minutes");
    let failures = state
        .store
        .sign_in_failures(&email_key, &address, now - window)
        .await?;
    let retry_after = |oldest: Option<DateTime<Utc>>| {
        let until = oldest.unwrap_or(now) + window;
        u64::try_from((until - now).num_seconds())
            .unwrap_or(0)
            .max(1)
    };
    let locked = |seconds| {
        login_form(
            &state,
            StatusCode::TOO_MANY_REQUESTS,
            String::new(),
            Some("Too many failed sign-ins: wait a few minutes and try again."),
            Some(seconds),
        )
    };
    // An address that failed too often is refused before any password check.
    if failures.by_address >= MAX_FAILURES {
        return Ok(locked(retry_after(failures.oldest_by_address)));
    }
    let account = match Email::parse(&form.email) {
        Ok(email) => state.store.account_by_email(&email).await?,
        Err(_) => None,
    };
    let correct = verify(account.as_ref(), form.password).await?;
    // An account under attack stays open to its owner: a correct password
    // from an address that has not failed on it still signs in.
    if failures.by_email >= MAX_FAILURES && !(correct && failures.by_pair == 0) {
        if !correct {
            state
                .store
                .record_sign_in_failure(&email_key, &address, now)
                .await?;
        }
        return Ok(locked(retry_after(failures.oldest_by_email)));
    }
    let Some(account) = account.filter(|_| correct) else {
        state
            .store
            .record_sign_in_failure(&email_key, &address, now)
            .await?;
        return Ok(login_form(
            &state,
            StatusCode::UNAUTHORIZED,
            form.email,
            Some(SIGN_IN_FAILED),
            None,
        ));
    };
    // A new session id at every sign-in; the one the browser held (if any)
    // ends, so a planted session id is worth nothing.
    if let Some(old) = cookie(&headers, SESSION_COOKIE) {
        state.store.delete_session(&token_hash(old)).await?;
    }
    let session_id = random_token();
    state
        .store
        .insert_session(&NewSession {
            id_hash: token_hash(&session_id),
            account_id: account.id.clone(),
            csrf_token: random_token(),
            created_at: now,
            expires_at: idle_expiry(&state, now),
        })
        .await?;
    tracing::info!(account = %account.id, "dashboard sign-in");
    let mut response = Redirect::to("/dashboard/keys").into_response();
    let headers = response.headers_mut();
    headers.append(
        SET_COOKIE,
        cookie_header(&state, SESSION_COOKIE, &session_id, None),
    );
    headers.append(SET_COOKIE, cookie_header(&state, FORM_COOKIE, "", Some(0)));
    Ok(response)
}

/// Whether `password` is the account's (enabled, with a password). Costs
/// one argon2 verification whatever the case, off the async threads.
async fn verify(account: Option<&Account>, password: String) -> Result<bool, DashError> {
    let hash = account
        .filter(|a| !a.is_disabled())
        .and_then(|a| a.password_hash.clone());
    tokio::task::spawn_blocking(move || {
        // Too long or too short cannot be right; still spend the time.
        let password = Password::new(password)
            .unwrap_or_else(|_| Password::new("x".repeat(Password::MIN_CHARS)).expect("12 chars"));
        match hash {
            Some(hash) => password.verify(&hash),
            None => {
                password.verify_against_nothing();
                false
            }
        }
    })
    .await
    .map_err(|e| DashError::Internal(format!("password check: {e}")))
}

#[derive(Deserialize)]
pub struct CsrfForm {
    #[serde(default)]
    pub csrf_token: String,
}

pub async fn logout(
    State(state): State<AppState>,
    user: SignedIn,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Result<Response, DashError> {
    user.check_csrf(&form.csrf_token)?;
    if let Some(id) = cookie(&headers, SESSION_COOKIE) {
        state.store.delete_session(&token_hash(id)).await?;
    }
    let mut response = Redirect::to("/dashboard/login").into_response();
    response.headers_mut().append(
        SET_COOKIE,
        cookie_header(&state, SESSION_COOKIE, "", Some(0)),
    );
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_found_by_exact_name() {
        let mut headers = HeaderMap::new();
        headers.append(
            COOKIE,
            HeaderValue::from_static("a=1; moderato_session_x=2; moderato_session=abc"),
        );
        assert_eq!(cookie(&headers, SESSION_COOKIE), Some("abc"));
        assert_eq!(cookie(&headers, "b"), None);
    }

    #[test]
    fn tokens_match_only_themselves_and_never_empty() {
        let t = random_token();
        assert!(tokens_match(&t, &t.clone()));
        assert!(!tokens_match(&t, &random_token()));
        assert!(!tokens_match("", ""));
        assert_eq!(token_hash(&t).len(), 32);
    }
}

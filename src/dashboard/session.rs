//! Signing in and out, sessions, CSRF tokens, device cookies and the
//! sign-in lockout.
//!
//! A session id is 32 random bytes held by the browser in an `HttpOnly`,
//! `SameSite=Strict` cookie scoped to `/dashboard`; the database keeps only
//! its SHA-256, with the account, the session's CSRF token and its expiry
//! (extended on every request: idle expiry). Forms shown before sign-in
//! (sign-in, sign-up, set-password) carry a token that must equal the one
//! in a short-lived pre-session cookie (double submit) and be one the
//! server signed within the hour (see `csrf`). With `cookie_secure` every
//! cookie is named `__Host-…` (so `Path=/`, `Secure`, no `Domain`): a
//! sibling subdomain cannot plant one.
//!
//! The lockout follows OWASP's "Slow Down Online Guessing Attacks with
//! Device Cookies": a successful sign-in leaves a long-lived device cookie
//! (random, stored as its SHA-256 with its account and expiry). After
//! [`MAX_FAILURES`] failures for an account within [`FAILURE_WINDOW`] from
//! clients without such a cookie, only a browser holding a valid device
//! cookie of that account may try a password; every other request gets 429
//! without a password check, whatever its address. A device's own failures
//! count against that device (and lock it out at the same bound), not
//! against the account. An address with too many failures is refused
//! unless it presents a device cookie of the account it tries.

use std::net::SocketAddr;
use std::time::Duration;

use super::form::Form;
use axum::extract::{ConnectInfo, FromRequestParts, State};
use axum::http::header::{COOKIE, RETRY_AFTER, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::{DateTime, Utc};
use rand::RngCore;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::csrf::FormTokenKey;
use super::error::DashError;
use super::pages::{render, LoginPage, Nav};
use crate::access::client::client_key;
use crate::access::{Account, Email, Password, Role};
use crate::http::auth::client_address;
use crate::http::AppState;
use crate::store::{Attempts, NewSession, SessionUse, SignInFailures};

/// The dashboard's cookies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CookieName {
    Session,
    /// The pre-session CSRF cookie of the forms shown before sign-in.
    Form,
    /// The device cookie a browser gets at sign-in.
    Device,
}

impl CookieName {
    /// The name a browser holds it under: `__Host-` when cookies are
    /// `Secure` (browsers refuse the prefix otherwise).
    pub fn name(self, secure: bool) -> &'static str {
        match (self, secure) {
            (CookieName::Session, true) => "__Host-moderato_session",
            (CookieName::Session, false) => "moderato_session",
            (CookieName::Form, true) => "__Host-moderato_form",
            (CookieName::Form, false) => "moderato_form",
            (CookieName::Device, true) => "__Host-moderato_device",
            (CookieName::Device, false) => "moderato_device",
        }
    }
}

/// How long a pre-session form stays valid.
const FORM_COOKIE_SECONDS: u32 = super::csrf::FORM_TOKEN_SECONDS as u32;
/// How long a device cookie lasts.
const DEVICE_COOKIE_DAYS: u32 = 180;

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

/// Seconds until the oldest of some attempts leaves a sliding window of
/// `window` (at least 1): what `Retry-After` says when they reached a bound.
pub fn retry_after(attempts: &Attempts, window: chrono::Duration, now: DateTime<Utc>) -> u64 {
    let until = attempts.oldest.unwrap_or(now) + window;
    u64::try_from((until - now).num_seconds())
        .unwrap_or(0)
        .max(1)
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

/// The request's cookie `which`, under its configured name.
pub fn dashboard_cookie<'a>(
    state: &AppState,
    headers: &'a HeaderMap,
    which: CookieName,
) -> Option<&'a str> {
    cookie(headers, which.name(state.dashboard.cookie_secure))
}

/// A `Set-Cookie` value for the dashboard. `max_age` 0 deletes it. A
/// `__Host-` cookie must have `Path=/`; without the prefix, the cookie
/// stays on `/dashboard`.
fn cookie_header(
    state: &AppState,
    which: CookieName,
    value: &str,
    max_age: Option<u32>,
) -> HeaderValue {
    let secure = state.dashboard.cookie_secure;
    let path = if secure { "/" } else { "/dashboard" };
    let name = which.name(secure);
    let mut text = format!("{name}={value}; Path={path}; HttpOnly; SameSite=Strict");
    if let Some(seconds) = max_age {
        text.push_str(&format!("; Max-Age={seconds}"));
    }
    if secure {
        text.push_str("; Secure");
    }
    HeaderValue::from_str(&text).expect("cookie values are base64url")
}

fn form_token_key(state: &AppState) -> FormTokenKey {
    FormTokenKey::new(&state.pepper)
}

/// A fresh pre-session form token, signed by the server, and the cookie
/// that carries it.
pub fn new_form_token(state: &AppState) -> (String, HeaderValue) {
    let token = form_token_key(state).issue(Utc::now().timestamp());
    let header = cookie_header(state, CookieName::Form, &token, Some(FORM_COOKIE_SECONDS));
    (token, header)
}

/// Checks a pre-session form's token: equal to its cookie's, and signed by
/// the server within the hour (403 otherwise).
pub fn check_form_token(
    state: &AppState,
    headers: &HeaderMap,
    given: &str,
) -> Result<(), DashError> {
    let signed = form_token_key(state).is_valid(given, Utc::now().timestamp());
    match dashboard_cookie(state, headers, CookieName::Form) {
        Some(expected) if signed && tokens_match(expected, given) => Ok(()),
        _ => Err(DashError::Forbidden),
    }
}

/// The signed-in account of a request, from its session cookie. Handlers
/// that take it are for signed-in users only (others are sent to sign in).
pub struct SignedIn {
    pub account: Account,
    pub csrf_token: String,
    /// What the store keeps of this session's id: the session a password
    /// change by its owner keeps, when it ends all others.
    pub session_hash: Vec<u8>,
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
        let id = dashboard_cookie(state, &parts.headers, CookieName::Session)
            .ok_or(DashError::SignInRequired)?;
        let session_hash = token_hash(id);
        let session = state
            .store
            .touch_session(&session_hash, &session_use(state, Utc::now()))
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
            session_hash,
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

/// A use of a session now: alive if used within the idle time and signed in
/// within the maximum lifetime (which, unlike the idle expiry, use does not
/// move).
fn session_use(state: &AppState, now: DateTime<Utc>) -> SessionUse {
    let lifetime = chrono::Duration::hours(i64::from(state.dashboard.session_max_lifetime_hours));
    SessionUse {
        now,
        expires_at: idle_expiry(state, now),
        created_after: now - lifetime,
    }
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
        signup_open: state.sign_up.is_open(),
    };
    let mut response = (status, [(SET_COOKIE, cookie)], render(&page)).into_response();
    if let Some(seconds) = retry_after {
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// The sign-in and the sign-up form: the same three fields.
#[derive(Deserialize)]
pub struct CredentialsForm {
    #[serde(default)]
    pub(super) email: String,
    #[serde(default)]
    pub(super) password: String,
    #[serde(default)]
    pub(super) csrf_token: String,
}

pub async fn login(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Form(form): Form<CredentialsForm>,
) -> Result<Response, DashError> {
    check_form_token(&state, &headers, &form.csrf_token)?;
    let address =
        client_key(client_address(peer.ip(), &headers, &state.trusted_proxies)).to_string();
    // Failures are keyed by the address as typed (lower-cased), so that
    // unknown addresses are locked out like known ones.
    let email_key = form.email.trim().to_lowercase();
    // One attempt at a time per account, then per address (always in this
    // order, so two attempts never wait for each other crosswise): the
    // failure count read below includes every earlier attempt's.
    let _turns = state
        .sign_in_attempts
        .account_then_address(&email_key, &address)
        .await;
    let now = Utc::now();
    let window = chrono::Duration::from_std(FAILURE_WINDOW).expect("15 minutes");
    let account = match Email::parse(&form.email) {
        Ok(email) => state.store.account_by_email(&email).await?,
        Err(_) => None,
    };
    let device = trusted_device(&state, &headers, account.as_ref(), now).await?;
    let failures = state
        .store
        .sign_in_failures(&email_key, &address, device.as_deref(), now - window)
        .await?;
    // Refused before any password check: a locked-out client learns nothing.
    if let Some(seconds) = lockout(&failures, device.is_some(), window, now) {
        return Ok(login_form(
            &state,
            StatusCode::TOO_MANY_REQUESTS,
            String::new(),
            Some("Too many failed sign-ins: wait a few minutes and try again."),
            Some(seconds),
        ));
    }
    let correct = verify(account.as_ref(), form.password).await?;
    let Some(account) = account.filter(|_| correct) else {
        state
            .store
            .record_sign_in_failure(&email_key, &address, device.as_deref(), now)
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
    if let Some(old) = dashboard_cookie(&state, &headers, CookieName::Session) {
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
    // A browser that already holds this account's device cookie keeps it.
    let new_device = match device {
        Some(_) => None,
        None => Some(issue_device(&state, &account, now).await?),
    };
    tracing::info!(account = %account.id, "dashboard sign-in");
    let mut response = Redirect::to("/dashboard/keys").into_response();
    let headers = response.headers_mut();
    headers.append(
        SET_COOKIE,
        cookie_header(&state, CookieName::Session, &session_id, None),
    );
    headers.append(
        SET_COOKIE,
        cookie_header(&state, CookieName::Form, "", Some(0)),
    );
    if let Some(device_cookie) = new_device {
        headers.append(SET_COOKIE, device_cookie);
    }
    Ok(response)
}

/// The SHA-256 of the request's device cookie when it is a valid one of
/// `account` (this browser signed in to it before); `None` otherwise, also
/// for a cookie of another account or one nobody issued.
pub(super) async fn trusted_device(
    state: &AppState,
    headers: &HeaderMap,
    account: Option<&Account>,
    now: DateTime<Utc>,
) -> Result<Option<Vec<u8>>, DashError> {
    let device = dashboard_cookie(state, headers, CookieName::Device);
    let (Some(token), Some(account)) = (device, account) else {
        return Ok(None);
    };
    let hash = token_hash(token);
    let owner = state.store.device_account(&hash, now).await?;
    Ok((owner.as_ref() == Some(&account.id)).then_some(hash))
}

/// Whether an attempt is refused, and for how many seconds. A trusted device
/// answers only for its own failures; any other client for its address's
/// and for the account's failures made without a device cookie.
pub(super) fn lockout(
    failures: &SignInFailures,
    trusted_device: bool,
    window: chrono::Duration,
    now: DateTime<Utc>,
) -> Option<u64> {
    let over = |attempts: &Attempts| {
        (attempts.count >= MAX_FAILURES).then(|| retry_after(attempts, window, now))
    };
    if trusted_device {
        over(&failures.by_device)
    } else {
        over(&failures.by_address).or_else(|| over(&failures.by_email))
    }
}

/// Stores a new device cookie for `account` and returns its `Set-Cookie`.
/// It replaces the browser's device cookie of another account, if any: a
/// browser is trusted for the account that signed in on it last.
async fn issue_device(
    state: &AppState,
    account: &Account,
    now: DateTime<Utc>,
) -> Result<HeaderValue, DashError> {
    let token = random_token();
    let expires = now + chrono::Duration::days(i64::from(DEVICE_COOKIE_DAYS));
    state
        .store
        .insert_device(&token_hash(&token), &account.id, now, expires)
        .await?;
    Ok(cookie_header(
        state,
        CookieName::Device,
        &token,
        Some(DEVICE_COOKIE_DAYS * 24 * 3600),
    ))
}

/// Whether `password` is the account's (enabled, with a password). Costs
/// one argon2 verification whatever the case, off the async threads.
pub(super) async fn verify(account: Option<&Account>, password: String) -> Result<bool, DashError> {
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
    if let Some(id) = dashboard_cookie(&state, &headers, CookieName::Session) {
        state.store.delete_session(&token_hash(id)).await?;
    }
    let mut response = Redirect::to("/dashboard/login").into_response();
    response.headers_mut().append(
        SET_COOKIE,
        cookie_header(&state, CookieName::Session, "", Some(0)),
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
        assert_eq!(cookie(&headers, "moderato_session"), Some("abc"));
        assert_eq!(cookie(&headers, "b"), None);
    }

    #[test]
    fn tokens_match_only_themselves_and_never_empty() {
        let t = random_token();
        assert!(tokens_match(&t, &t));
        assert!(!tokens_match(&t, &random_token()));
        assert!(!tokens_match("", ""));
        assert_eq!(token_hash(&t).len(), 32);
    }

    fn attempts(count: u32, minutes_ago: i64, now: DateTime<Utc>) -> Attempts {
        Attempts {
            count,
            oldest: Some(now - chrono::Duration::minutes(minutes_ago)),
        }
    }

    #[test]
    fn a_trusted_device_answers_only_for_its_own_failures() {
        let now = Utc::now();
        let window = chrono::Duration::minutes(15);
        let account_locked = SignInFailures {
            by_email: attempts(MAX_FAILURES, 5, now),
            by_address: attempts(MAX_FAILURES, 5, now),
            by_device: attempts(0, 0, now),
        };
        assert_eq!(lockout(&account_locked, true, window, now), None);
        assert_eq!(lockout(&account_locked, false, window, now), Some(600));
        let device_locked = SignInFailures {
            by_device: attempts(MAX_FAILURES, 14, now),
            ..SignInFailures::default()
        };
        assert_eq!(lockout(&device_locked, true, window, now), Some(60));
        assert_eq!(lockout(&device_locked, false, window, now), None);
    }
}

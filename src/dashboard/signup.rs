//! Open sign-up (`dashboard.signup = "open"`): anyone can make a free
//! customer account.
//!
//! It must not tell which e-mail addresses have accounts: a taken address
//! gets the same answer as a new one (the same redirect, after the same
//! password hashing and the same attempted insert), and nothing is created
//! or changed for it. It must not let one client make accounts in bulk
//! either: [`MAX_SIGN_UPS`] attempts per client address (IPv6: per /64) per
//! [`SIGN_UP_WINDOW`], new and taken addresses alike, then 429 with
//! `Retry-After` before any hashing.
//!
//! The attempts have their own table rather than rows in the sign-in
//! failures: those are counted per address for any e-mail, so sign-ups
//! there would lock the address out of signing in, and the two bounds
//! differ (5 an hour against 10 failures in 15 minutes). The counting is
//! the same (a sliding window, `Retry-After` from the oldest attempt).

use std::net::SocketAddr;

use super::form::Form;
use axum::extract::{ConnectInfo, State};
use axum::http::header::{RETRY_AFTER, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use chrono::Utc;

use super::admin::insert_new_account;
use super::error::DashError;
use super::pages::{render, SignupPage};
use super::session::{check_form_token, new_form_token, retry_after, CredentialsForm};
use crate::access::client::client_key;

use crate::access::{Email, Password, Plan, Role, Tier};
use crate::config::Signup;
use crate::http::auth::client_address;
use crate::http::AppState;

/// Sign-up attempts allowed per client address within [`SIGN_UP_WINDOW`].
pub const MAX_SIGN_UPS: u32 = 5;
pub const SIGN_UP_WINDOW: std::time::Duration = std::time::Duration::from_secs(3600);

fn signup_form(
    state: &AppState,
    status: StatusCode,
    email: String,
    error: Option<String>,
) -> Response {
    let (csrf_token, cookie) = new_form_token(state);
    let page = SignupPage {
        nav: None,
        csrf_token,
        email,
        error,
    };
    (status, [(SET_COOKIE, cookie)], render(&page)).into_response()
}

fn signup_open(state: &AppState) -> Result<(), DashError> {
    match state.dashboard.signup {
        Signup::Open => Ok(()),
        Signup::Closed => Err(DashError::NotFound),
    }
}

pub async fn signup_page(State(state): State<AppState>) -> Result<Response, DashError> {
    signup_open(&state)?;
    Ok(signup_form(&state, StatusCode::OK, String::new(), None))
}

/// Creates a customer account on the free plan, then sends to sign-in. A
/// taken address gets exactly that answer too, and nothing changes for it.
pub async fn signup(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Form(form): Form<CredentialsForm>,
) -> Result<Response, DashError> {
    signup_open(&state)?;
    check_form_token(&state, &headers, &form.csrf_token)?;
    let address =
        client_key(client_address(peer.ip(), &headers, &state.trusted_proxies)).to_string();
    let now = Utc::now();
    let window = chrono::Duration::from_std(SIGN_UP_WINDOW).expect("one hour");
    let earlier = state.store.sign_ups(&address, now - window).await?;
    if earlier.count >= MAX_SIGN_UPS {
        let mut response = signup_form(
            &state,
            StatusCode::TOO_MANY_REQUESTS,
            form.email,
            Some("Too many sign-ups from your network: try again later.".to_owned()),
        );
        response.headers_mut().insert(
            RETRY_AFTER,
            HeaderValue::from(retry_after(&earlier, window, now)),
        );
        return Ok(response);
    }
    let parsed = Email::parse(&form.email)
        .map_err(|e| e.to_string())
        .and_then(|email| {
            Password::new(form.password)
                .map(|p| (email, p))
                .map_err(|e| e.to_string())
        });
    let (email, password) = match parsed {
        Ok(v) => v,
        Err(message) => {
            return Ok(signup_form(
                &state,
                StatusCode::BAD_REQUEST,
                form.email,
                Some(message),
            ))
        }
    };
    state.store.record_sign_up(&address, now).await?;
    let plan = Plan::new(Tier::Free, None).expect("the free plan needs no limit");
    // Hashes the password and tries the insert whether or not the address
    // is taken, so that both take about as long.
    match insert_new_account(&state, email, Role::Customer, plan, Some(password)).await? {
        Ok(account) => tracing::info!(account = %account.id, "account created by sign-up"),
        Err(_taken) => tracing::info!("sign-up for a taken e-mail address: nothing changed"),
    }
    Ok(Redirect::to("/dashboard/login").into_response())
}

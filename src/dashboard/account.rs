//! The owner's account page: the account, and a password change that ends
//! every other session of the account.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, State};
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Form;
use chrono::Utc;
use serde::Deserialize;

use super::admin::hash_password;
use super::error::DashError;
use super::pages::{render, OwnAccountPage};
use super::session::{lockout, trusted_device, verify, SignedIn, FAILURE_WINDOW};
use crate::access::client::client_key;
use crate::access::Password;
use crate::http::auth::client_address;
use crate::http::AppState;

/// What the page says after a request.
enum Outcome {
    Shown,
    Changed,
    Refused(String),
}

fn account_page(user: &SignedIn, status: StatusCode, outcome: Outcome) -> Response {
    let (changed, error) = match outcome {
        Outcome::Shown => (false, None),
        Outcome::Changed => (true, None),
        Outcome::Refused(message) => (false, Some(message)),
    };
    let page = OwnAccountPage {
        nav: user.nav(),
        csrf_token: user.csrf_token.clone(),
        email: user.account.email.to_string(),
        role: user.account.role.to_string(),
        changed,
        error,
    };
    (status, render(&page)).into_response()
}

pub async fn page(user: SignedIn) -> Response {
    account_page(&user, StatusCode::OK, Outcome::Shown)
}

#[derive(Deserialize)]
pub struct ChangePasswordForm {
    #[serde(default)]
    current_password: String,
    #[serde(default)]
    new_password: String,
    #[serde(default)]
    csrf_token: String,
}

/// Sets a new password when the current one is given, and ends every other
/// session of the account (this one goes on). Wrong current passwords count
/// as failed sign-ins, under the sign-in's lockout, so that a stolen session
/// is no way around it to guess the password.
pub async fn change_password(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    user: SignedIn,
    headers: HeaderMap,
    Form(form): Form<ChangePasswordForm>,
) -> Result<Response, DashError> {
    user.check_csrf(&form.csrf_token)?;
    let new_password = match Password::new(form.new_password) {
        Ok(p) => p,
        Err(e) => {
            let refused = Outcome::Refused(format!("New password: {e}"));
            return Ok(account_page(&user, StatusCode::BAD_REQUEST, refused));
        }
    };
    let address =
        client_key(client_address(peer.ip(), &headers, &state.trusted_proxies)).to_string();
    let email_key = user.account.email.to_string();
    // In turn with sign-ins of the account and the address.
    let _turns = state
        .sign_in_attempts
        .account_then_address(&email_key, &address)
        .await;
    let now = Utc::now();
    let window = chrono::Duration::from_std(FAILURE_WINDOW).expect("15 minutes");
    let device = trusted_device(&state, &headers, Some(&user.account), now).await?;
    let failures = state
        .store
        .sign_in_failures(&email_key, &address, device.as_deref(), now - window)
        .await?;
    if let Some(seconds) = lockout(&failures, device.is_some(), window, now) {
        let refused = Outcome::Refused(
            "Too many wrong passwords: wait a few minutes and try again.".to_owned(),
        );
        let mut response = account_page(&user, StatusCode::TOO_MANY_REQUESTS, refused);
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(seconds));
        return Ok(response);
    }
    if !verify(Some(&user.account), form.current_password).await? {
        state
            .store
            .record_sign_in_failure(&email_key, &address, device.as_deref(), now)
            .await?;
        let refused = Outcome::Refused("The current password is not correct.".to_owned());
        return Ok(account_page(&user, StatusCode::BAD_REQUEST, refused));
    }
    let hash = hash_password(new_password).await?;
    state
        .store
        .set_account_password(&user.account.id, Some(&hash), Some(&user.session_hash))
        .await?;
    tracing::info!(account = %user.account.id, "password changed by its owner; other sessions ended");
    Ok(account_page(&user, StatusCode::OK, Outcome::Changed))
}

//! Open sign-up (`dashboard.signup = "open"`): anyone can ask for a free
//! customer account, and gets it by following a one-time link sent to the
//! address they gave, where they choose its password.
//!
//! The address is confirmed before anything is usable: until the link is
//! followed the account has no password (nobody can sign in) and a new
//! sign-up for the address sends a new link rather than being refused, so
//! a stranger who typed someone else's address first neither gets in nor
//! locks the owner out. The password is chosen only after the link, so
//! nobody but the mailbox's reader ever knows it.
//!
//! It must not tell which e-mail addresses have accounts: a taken address
//! gets the same page as a new one, after the same work (an attempted
//! insert and one e-mail: the link, or to an existing account's owner a
//! note that someone tried), and nothing changes for it. It must not let
//! one client make accounts or send mail in bulk either: [`MAX_SIGN_UPS`]
//! attempts per client address (IPv6: per /64) per [`SIGN_UP_WINDOW`], new
//! and taken addresses alike, then 429 with `Retry-After`.
//!
//! Counting an attempt and recording it are one step per client address:
//! sign-ups from one address run one at a time in this process (the
//! [`AttemptLocks`](super::AttemptLocks) sign-in uses), so a burst sent
//! together cannot all read the count before any is recorded (issue #58, C:
//! 100 held-back requests released at once made 100 accounts). One
//! recipient gets at most [`MAX_MAILS_PER_RECIPIENT`] sign-up e-mails per
//! [`SIGN_UP_WINDOW`], whoever asks: past it the page is the same, and no
//! mail is sent, so nobody can flood a stranger's mailbox from many
//! addresses.
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
use axum::response::{IntoResponse, Response};
use chrono::Utc;

use serde::Deserialize;

use super::admin::{issue_password_link, PASSWORD_LINK_HOURS};
use super::error::DashError;
use super::mail::{Mailer, SignUpDoor};
use super::pages::{render, SignupPage};
use super::session::{check_form_token, new_form_token, retry_after};
use crate::access::client::client_key;
use crate::access::{Account, AccountId, Email, Plan, Tier};
use crate::http::auth::client_address;
use crate::http::AppState;
use crate::store::StoreError;

/// Sign-up attempts allowed per client address within [`SIGN_UP_WINDOW`].
pub const MAX_SIGN_UPS: u32 = 5;
pub const SIGN_UP_WINDOW: std::time::Duration = std::time::Duration::from_secs(3600);
/// Sign-up e-mails (links or notes) one recipient gets within
/// [`SIGN_UP_WINDOW`]: room for a stranger's sign-up and then the owner's
/// own, and a retry.
pub const MAX_MAILS_PER_RECIPIENT: u32 = 3;

/// The key a recipient's sign-up e-mails are counted under, in the same
/// table as the client addresses' attempts (which never start with `to:`).
fn recipient_key(email: &Email) -> String {
    format!("to:{email}")
}

/// The sign-up page: the form, or (`sent_to`) what to do next.
fn signup_page_with(
    state: &AppState,
    status: StatusCode,
    email: String,
    error: Option<String>,
    sent_to: Option<String>,
) -> Response {
    let (csrf_token, cookie) = new_form_token(state);
    let page = SignupPage {
        nav: None,
        csrf_token,
        email,
        error,
        sent_to,
        link_hours: PASSWORD_LINK_HOURS,
    };
    (status, [(SET_COOKIE, cookie)], render(&page)).into_response()
}

fn signup_form(state: &AppState, status: StatusCode, email: String, error: String) -> Response {
    signup_page_with(state, status, email, Some(error), None)
}

fn open_door(state: &AppState) -> Result<&Mailer, DashError> {
    match &state.sign_up {
        SignUpDoor::Open(mailer) => Ok(mailer),
        SignUpDoor::Closed => Err(DashError::NotFound),
    }
}

pub async fn signup_page(State(state): State<AppState>) -> Result<Response, DashError> {
    open_door(&state)?;
    Ok(signup_page_with(
        &state,
        StatusCode::OK,
        String::new(),
        None,
        None,
    ))
}

#[derive(Deserialize)]
pub struct SignupForm {
    #[serde(default)]
    email: String,
    #[serde(default)]
    csrf_token: String,
}

/// What a sign-up found at its address.
enum Applicant {
    /// A new account, or one still waiting for its link: gets a link.
    Unconfirmed(AccountId),
    /// An account in use (or disabled, or made by an admin): its owner
    /// gets a note, and nothing changes.
    Existing,
}

/// Makes the account waiting for confirmation, or finds what holds the
/// address already.
async fn applicant(state: &AppState, email: &Email) -> Result<Applicant, DashError> {
    let plan = Plan::new(Tier::Free, None).expect("the free plan needs no limit");
    let account = Account::signed_up(email.clone(), plan);
    match state.store.insert_account(&account).await {
        Ok(()) => {
            tracing::info!(account = %account.id, "account created by sign-up, awaiting confirmation");
            return Ok(Applicant::Unconfirmed(account.id));
        }
        Err(StoreError::Conflict(_)) => {}
        Err(other) => return Err(other.into()),
    }
    Ok(match state.store.account_by_email(email).await? {
        Some(a) if a.awaiting_confirmation && !a.is_disabled() => Applicant::Unconfirmed(a.id),
        // Gone between the insert and the read (pruned): nothing to say.
        _ => Applicant::Existing,
    })
}

/// Sends the link to a new or unconfirmed account, or the note to an
/// existing one; then the same page either way.
pub async fn signup(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Form(form): Form<SignupForm>,
) -> Result<Response, DashError> {
    let mailer = open_door(&state)?;
    check_form_token(&state, &headers, &form.csrf_token)?;
    let address =
        client_key(client_address(peer.ip(), &headers, &state.trusted_proxies)).to_string();
    let window = chrono::Duration::from_std(SIGN_UP_WINDOW).expect("one hour");
    let (email, now) = {
        // Counted and recorded as one step for this address: the attempts
        // sent together wait here, each seeing the ones before it.
        let _turn = state
            .sign_up_attempts
            .lock(format!("sign-up address:{address}"))
            .await;
        let now = Utc::now();
        let earlier = state.store.sign_ups(&address, now - window).await?;
        if earlier.count >= MAX_SIGN_UPS {
            let mut response = signup_form(
                &state,
                StatusCode::TOO_MANY_REQUESTS,
                form.email,
                "Too many sign-ups from your network: try again later.".to_owned(),
            );
            response.headers_mut().insert(
                RETRY_AFTER,
                HeaderValue::from(retry_after(&earlier, window, now)),
            );
            return Ok(response);
        }
        let email = match Email::parse(&form.email) {
            Ok(email) => email,
            Err(e) => {
                return Ok(signup_form(
                    &state,
                    StatusCode::BAD_REQUEST,
                    form.email,
                    e.to_string(),
                ))
            }
        };
        state.store.record_sign_up(&address, now).await?;
        (email, now)
    };
    // The same for the recipient (always after the address's turn, so two
    // sign-ups never wait for each other crosswise).
    let recipient = recipient_key(&email);
    let _turn = state
        .sign_up_attempts
        .lock(format!("sign-up {recipient}"))
        .await;
    let mailed = state.store.sign_ups(&recipient, now - window).await?;
    if mailed.count >= MAX_MAILS_PER_RECIPIENT {
        // The page a sent e-mail gets: the bound says nothing about the
        // address, and the mailbox already has this hour's links.
        tracing::info!("sign-up e-mail not sent: the recipient's bound for the hour is reached");
        return Ok(sent_page(&state, &email));
    }
    state.store.record_sign_up(&recipient, now).await?;
    let sent = match applicant(&state, &email).await? {
        Applicant::Unconfirmed(account) => {
            let link = issue_password_link(&state, &account).await?;
            mailer
                .send_sign_up_link(&email, &link, PASSWORD_LINK_HOURS)
                .await
        }
        Applicant::Existing => mailer.send_already_registered(&email).await,
    };
    if let Err(e) = sent {
        // The error never holds the link: lettre reports the server's
        // answer, not the message.
        tracing::warn!(error = %e, "sign-up e-mail not sent");
        return Ok(signup_form(
            &state,
            StatusCode::SERVICE_UNAVAILABLE,
            form.email,
            "We could not send the e-mail just now: try again in a few minutes.".to_owned(),
        ));
    }
    Ok(sent_page(&state, &email))
}

/// What to do next, after the e-mail to `email`.
fn sent_page(state: &AppState, email: &Email) -> Response {
    signup_page_with(
        state,
        StatusCode::OK,
        String::new(),
        None,
        Some(email.to_string()),
    )
}

//! The dashboard's contract over real HTTP, on both backends: sign-in and
//! its cookie, sessions, the lockout, CSRF, the security headers, keys made
//! and revoked in the dashboard as the API sees them, accounts kept apart,
//! usage figures equal to the billing table's, the admin pages, and the
//! `moderato accounts` command.

use std::time::Duration;

use chrono::Utc;
use moderato::access::KeyId;
use moderato::config::{ImageClassifierKind, IpBlock, TextClassifierKind};
use moderato::store::Period;
use serde_json::Value;

use crate::dash_client::*;
use crate::helpers::*;
use crate::on_both_backends;

/// The service with the cheap classifiers: these tests are about the
/// dashboard, and every API call they make should be quick.
fn quick(config: &mut moderato::config::Config) {
    config.text_classifier = TextClassifierKind::Lexical;
    config.image_classifier = ImageClassifierKind::None;
}

async fn dashboard_app(backend: Backend) -> TestApp {
    spawn_app_with(backend, quick).await
}

/// The app behind a trusted proxy (this test process at 127.0.0.1), so
/// that `X-Forwarded-For` names the client address.
async fn app_behind_proxy(backend: Backend) -> TestApp {
    spawn_app_with(backend, |c| {
        quick(c);
        c.auth.trusted_proxies = vec![IpBlock::try_from("127.0.0.1".to_string()).unwrap()];
    })
    .await
}

/// The app with `toml` layered over the defaults, as an operator's
/// `--config` file is.
async fn app_from_toml(backend: Backend, toml: &str) -> TestApp {
    let db = TestDb::new(backend).await;
    let dir = std::sync::Arc::new(tempfile::tempdir().expect("temp dir"));
    let file = dir.path().join("moderato.toml");
    std::fs::write(&file, toml).expect("write config");
    let mut config = moderato::config::Config::load(Some(&file)).expect("config file");
    let test = test_config(&db, &dir);
    config.database_url = test.database_url;
    config.signing = test.signing;
    config.auth = test.auth;
    config.usage = test.usage;
    config.models_dir = test.models_dir;
    config.shutdown_grace_ms = test.shutdown_grace_ms;
    quick(&mut config);
    spawn_with_config(db, dir, config).await
}

/// The cookie names with `dashboard.cookie_secure` on (the default).
const SESSION_COOKIE: &str = "__Host-moderato_session";
const DEVICE_COOKIE: &str = "__Host-moderato_device";

fn customer(app: &TestApp, email: &str) -> Value {
    create_account(app, email, "customer", &["--tier", "free"])
}

/// The session cookie a successful sign-in sets: the `Set-Cookie` of the 303
/// scoped to `/dashboard` and HttpOnly.
fn session_cookie(page: &Page) -> SetCookie {
    let cookies: Vec<SetCookie> = page
        .set_cookies()
        .iter()
        .map(|c| SetCookie::parse(c))
        .collect();
    let mut sessions = cookies
        .into_iter()
        .filter(|c| c.has("httponly") && !c.value.is_empty());
    sessions
        .next()
        .unwrap_or_else(|| panic!("no HttpOnly cookie set at sign-in: {:?}", page.headers))
}

/// What a signed-out user gets for a page that needs a session: sent to the
/// login page (or a plain 401), never the page.
fn assert_signed_out(page: &Page) {
    match page.status {
        302 | 303 | 307 => assert!(
            page.location().contains("/dashboard/login"),
            "redirected to {:?}, not the login page",
            page.location()
        ),
        401 => {}
        other => panic!("a signed-out request got {other}:\n{}", page.body),
    }
}

async fn login_form_and_strict_session_cookie(backend: Backend) {
    let app = dashboard_app(backend).await;
    customer(&app, "alice@example.com");
    let mut session = Session::new(&app);

    let login = session.get("/dashboard/login").await;
    assert_eq!(login.status, 200);
    assert!(login.body.contains(r#"action="/dashboard/login""#));
    assert!(login.body.contains(r#"name="email""#));
    assert!(login.body.contains(r#"name="password""#));
    assert!(login.has_testid("sign-in"));
    assert!(!login.csrf().is_empty(), "the login form has a CSRF token");

    let signed_in = session.sign_in("alice@example.com", PASSWORD).await;
    signed_in.assert_see_other("/dashboard/keys");
    let cookie = session_cookie(&signed_in);
    assert!(cookie.has("HttpOnly"), "{cookie:?}");
    assert_eq!(cookie.get("SameSite"), Some("Strict"), "{cookie:?}");
    assert!(cookie.has("Secure"), "Secure by default: {cookie:?}");
    // `__Host-`: only this host, over HTTPS, can have set it (no sibling
    // subdomain), which the browser enforces with `Path=/` and no `Domain`.
    assert_eq!(cookie.name, SESSION_COOKIE, "{cookie:?}");
    assert_eq!(cookie.get("Path"), Some("/"), "{cookie:?}");
    assert!(!cookie.has("Domain"), "{cookie:?}");

    let keys = session.get("/dashboard/keys").await;
    assert_eq!(keys.status, 200, "{}", keys.body);
    assert!(keys.has_testid("create-key"));
    assert!(keys.has_testid("sign-out"));
}

async fn cookie_is_not_secure_when_configured_for_plain_http(backend: Backend) {
    let app = app_from_toml(backend, "[dashboard]\ncookie_secure = false\n").await;
    customer(&app, "alice@example.com");
    let mut session = Session::new(&app);
    let signed_in = session.sign_in("alice@example.com", PASSWORD).await;
    signed_in.assert_see_other("/dashboard/keys");
    let cookie = session_cookie(&signed_in);
    assert!(!cookie.has("Secure"), "{cookie:?}");
    // A `__Host-` cookie without `Secure` would be refused by browsers.
    assert_eq!(cookie.name, "moderato_session", "{cookie:?}");
    assert_eq!(cookie.get("Path"), Some("/dashboard"), "{cookie:?}");
    assert!(cookie.has("HttpOnly"), "{cookie:?}");
    assert_eq!(cookie.get("SameSite"), Some("Strict"), "{cookie:?}");
}

async fn session_id_is_rotated_at_sign_in(backend: Backend) {
    let app = dashboard_app(backend).await;
    customer(&app, "alice@example.com");
    let mut session = Session::new(&app);
    session.get("/dashboard/login").await;
    let before: Vec<String> = session.cookies.values().cloned().collect();

    let first = session.sign_in("alice@example.com", PASSWORD).await;
    let first_id = session_cookie(&first).value;
    assert!(
        !before.contains(&first_id),
        "a cookie held before sign-in became the session id"
    );

    // Signing in again while holding a session: a new id, not the old one
    // (an id planted before sign-in never becomes a signed-in session).
    let second = session.sign_in("alice@example.com", PASSWORD).await;
    second.assert_see_other("/dashboard/keys");
    let second_id = session_cookie(&second).value;
    assert_ne!(first_id, second_id);
    assert!(
        second_id.len() >= 22,
        "a session id of {} characters is guessable",
        second_id.len()
    );
}

async fn sign_out_ends_the_session(backend: Backend) {
    let app = dashboard_app(backend).await;
    customer(&app, "alice@example.com");
    let mut session = Session::signed_in(&app, "alice@example.com", PASSWORD).await;
    let held = session.cookies.clone();
    let csrf = session.csrf("/dashboard/keys").await;

    let out = session
        .post("/dashboard/logout", &[("csrf_token", csrf.as_str())])
        .await;
    out.assert_see_other("/dashboard/login");

    // The browser forgets the cookie; an attacker who copied it keeps it.
    let mut copy = Session::new(&app);
    copy.cookies = held;
    assert_signed_out(&copy.get("/dashboard/keys").await);
    assert_signed_out(&session.get("/dashboard/keys").await);
}

async fn idle_session_expires(backend: Backend) {
    let app = dashboard_app(backend).await;
    customer(&app, "alice@example.com");
    let mut session = Session::signed_in(&app, "alice@example.com", PASSWORD).await;
    assert_eq!(session.get("/dashboard/keys").await.status, 200);

    // Thirteen hours without a request (the default idle time is 12 hours).
    let idle_since = Utc::now() - chrono::Duration::hours(13);
    age_sessions(&app, idle_since).await;
    assert_signed_out(&session.get("/dashboard/keys").await);
}

/// Moves every stored session's last use (and the expiry it implies) back
/// to `at`, as if nobody had used it since.
async fn age_sessions(app: &TestApp, at: chrono::DateTime<Utc>) {
    // The default idle time (dashboard.session_idle_minutes = 720).
    let expires = at + chrono::Duration::minutes(720);
    let sql = "UPDATE dashboard_sessions SET last_seen = $1, expires_at = $2";
    if app.db.url.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(&app.db.url).await.expect("pg");
        let done = sqlx::query(sql)
            .bind(at)
            .bind(expires)
            .execute(&pool)
            .await
            .expect("age sessions");
        assert!(done.rows_affected() > 0);
    } else {
        let pool = sqlx::SqlitePool::connect(&app.db.url)
            .await
            .expect("sqlite");
        let done = sqlx::query(&sql.replace('$', "?"))
            .bind(at)
            .bind(expires)
            .execute(&pool)
            .await
            .expect("age sessions");
        assert!(done.rows_affected() > 0);
    }
}

/// Moves every stored session's sign-in time back to `at`, leaving its last
/// use and its idle expiry as they are.
async fn age_session_sign_ins(app: &TestApp, at: chrono::DateTime<Utc>) {
    let sql = "UPDATE dashboard_sessions SET created_at = $1";
    let affected = if app.db.url.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(&app.db.url).await.expect("pg");
        sqlx::query(sql)
            .bind(at)
            .execute(&pool)
            .await
            .expect("age")
            .rows_affected()
    } else {
        let pool = sqlx::SqlitePool::connect(&app.db.url)
            .await
            .expect("sqlite");
        sqlx::query(&sql.replace('$', "?"))
            .bind(at)
            .execute(&pool)
            .await
            .expect("age")
            .rows_affected()
    };
    assert!(affected > 0);
}

/// Issue 26, finding 4: a session in constant use still ends 7 days (the
/// default `dashboard.session_max_lifetime_hours`) after its sign-in.
async fn a_busy_session_ends_at_its_max_lifetime(backend: Backend) {
    let app = dashboard_app(backend).await;
    customer(&app, "alice@example.com");
    let mut session = Session::signed_in(&app, "alice@example.com", PASSWORD).await;

    age_session_sign_ins(&app, Utc::now() - chrono::Duration::days(6)).await;
    assert_eq!(
        session.get("/dashboard/keys").await.status,
        200,
        "6 days old"
    );

    // Used a moment ago (so not idle), but signed in 7 days and a minute ago.
    let signed_in = Utc::now() - chrono::Duration::days(7) - chrono::Duration::minutes(1);
    age_session_sign_ins(&app, signed_in).await;
    assert_signed_out(&session.get("/dashboard/keys").await);
    // Signing in again gives a fresh week.
    let mut again = Session::signed_in(&app, "alice@example.com", PASSWORD).await;
    assert_eq!(again.get("/dashboard/keys").await.status, 200);
}

/// Changes the password on the account page; returns the answer.
async fn change_password(session: &mut Session, current: &str, new: &str) -> Page {
    let page = session.get("/dashboard/account").await;
    assert_eq!(page.status, 200, "the account page: {}", page.body);
    assert!(page.has_testid("change-password"), "{}", page.body);
    let csrf = page.csrf();
    session
        .post(
            "/dashboard/account/password",
            &[
                ("current_password", current),
                ("new_password", new),
                ("csrf_token", csrf.as_str()),
            ],
        )
        .await
}

/// Issue 26, finding 4: the owner changes the password on the account page
/// (the current password required); every other session ends, this one
/// stays; the old password no longer signs in.
async fn a_password_change_ends_every_other_session(backend: Backend) {
    let app = dashboard_app(backend).await;
    customer(&app, "alice@example.com");
    customer(&app, "bob@example.com");
    let mut here = Session::signed_in(&app, "alice@example.com", PASSWORD).await;
    let mut elsewhere = Session::signed_in(&app, "alice@example.com", PASSWORD).await;
    let mut bob = Session::signed_in(&app, "bob@example.com", PASSWORD).await;
    let new_password = "a brand new passphrase";

    let wrong = change_password(&mut here, "not the password at all", new_password).await;
    assert_eq!(wrong.status, 400, "{}", wrong.body);
    assert!(
        wrong
            .testid_text("error")
            .unwrap_or_default()
            .contains("current password"),
        "{}",
        wrong.body
    );
    let short = change_password(&mut here, PASSWORD, "short").await;
    assert_eq!(short.status, 400, "{}", short.body);
    assert!(short
        .testid_text("error")
        .unwrap_or_default()
        .contains("12"));
    assert_eq!(
        elsewhere.get("/dashboard/keys").await.status,
        200,
        "nothing changed yet"
    );

    let changed = change_password(&mut here, PASSWORD, new_password).await;
    assert_eq!(changed.status, 200, "{}", changed.body);
    assert!(changed.has_testid("password-changed"), "{}", changed.body);
    assert_eq!(
        here.get("/dashboard/keys").await.status,
        200,
        "this session stays"
    );
    assert_signed_out(&elsewhere.get("/dashboard/keys").await);
    assert_eq!(
        bob.get("/dashboard/keys").await.status,
        200,
        "another account's"
    );

    let old = Session::new(&app)
        .sign_in("alice@example.com", PASSWORD)
        .await;
    assert_eq!(old.status, 401, "the old password still signs in");
    Session::signed_in(&app, "alice@example.com", new_password).await;

    // The form needs its token, like every form.
    let page = here
        .post(
            "/dashboard/account/password",
            &[
                ("current_password", new_password),
                ("new_password", PASSWORD),
            ],
        )
        .await;
    assert_eq!(page.status, 403);
}

/// Issue 26, finding 4: an admin's password reset ends every session of the
/// account, with a new password or (none given) a one-time link, after which
/// the old password is refused.
async fn an_admin_password_reset_ends_every_session(backend: Backend) {
    let app = dashboard_app(backend).await;
    create_account(&app, "root@example.com", "admin", &[]);
    customer(&app, "alice@example.com");
    let alice_id = account_id(&app, "alice@example.com");
    let mut root = Session::signed_in(&app, "root@example.com", PASSWORD).await;
    let mut alice = Session::signed_in(&app, "alice@example.com", PASSWORD).await;
    let account_path = format!("/dashboard/admin/accounts/{alice_id}");
    let reset_path = format!("{account_path}/password");

    let page = root.get(&account_path).await;
    assert!(page.has_testid("reset-password"), "{}", page.body);
    let csrf = page.csrf();
    let new_password = "chosen by the support desk";
    let reset = root
        .post(
            &reset_path,
            &[("password", new_password), ("csrf_token", csrf.as_str())],
        )
        .await;
    assert_eq!(reset.status, 200, "{}", reset.body);
    assert!(reset.has_testid("password-reset"), "{}", reset.body);
    assert_signed_out(&alice.get("/dashboard/keys").await);
    assert_eq!(root.get(&account_path).await.status, 200, "the admin stays");
    assert_eq!(
        Session::new(&app)
            .sign_in("alice@example.com", PASSWORD)
            .await
            .status,
        401
    );
    let mut alice = Session::signed_in(&app, "alice@example.com", new_password).await;

    // Without a password: the old one stops working, a one-time link sets
    // the next.
    let reset = root
        .post(&reset_path, &[("csrf_token", csrf.as_str())])
        .await;
    assert_eq!(reset.status, 200, "{}", reset.body);
    assert_signed_out(&alice.get("/dashboard/keys").await);
    assert_eq!(
        Session::new(&app)
            .sign_in("alice@example.com", new_password)
            .await
            .status,
        401
    );
    let link = reset
        .testid_text("password-link")
        .unwrap_or_else(|| panic!("no link:\n{}", reset.body));
    let mut owner = Session::new(&app);
    let form = owner.get(&link).await;
    assert_eq!(form.status, 200, "{}", form.body);
    let token = input_value(&form.body, "token").expect("token field");
    let set = owner
        .post(
            "/dashboard/set-password",
            &[
                ("token", token.as_str()),
                ("password", PASSWORD),
                ("csrf_token", form.csrf().as_str()),
            ],
        )
        .await;
    set.assert_see_other("/dashboard/login");
    Session::signed_in(&app, "alice@example.com", PASSWORD).await;

    // A customer cannot reset anyone's password; the operator account has none.
    let mut alice = Session::signed_in(&app, "alice@example.com", PASSWORD).await;
    let csrf = alice.csrf("/dashboard/keys").await;
    let root_id = account_id(&app, "root@example.com");
    let page = alice
        .post(
            &format!("/dashboard/admin/accounts/{root_id}/password"),
            &[("password", new_password), ("csrf_token", csrf.as_str())],
        )
        .await;
    assert_eq!(page.status, 404);
    let operator = moderato::access::AccountId::operator();
    let csrf = root.csrf("/dashboard/admin/accounts").await;
    let page = root
        .post(
            &format!("/dashboard/admin/accounts/{operator}/password"),
            &[("password", new_password), ("csrf_token", csrf.as_str())],
        )
        .await;
    assert_eq!(page.status, 404);
}

async fn unknown_email_and_wrong_password_look_the_same(backend: Backend) {
    let app = dashboard_app(backend).await;
    customer(&app, "alice@example.com");

    let mut guesser = Session::new(&app);
    let wrong_password = guesser
        .sign_in("alice@example.com", "not the password at all")
        .await;
    assert_signed_out(&guesser.get("/dashboard/keys").await);
    let mut stranger = Session::new(&app);
    let unknown_email = stranger
        .sign_in("nobody@example.com", "not the password at all")
        .await;
    assert_signed_out(&stranger.get("/dashboard/keys").await);
    for page in [&wrong_password, &unknown_email] {
        assert!(
            page.status == 401 || page.status == 200,
            "a failed sign-in shows the login page again, got {}",
            page.status
        );
        assert!(page.body.contains(r#"action="/dashboard/login""#));
    }
    assert_eq!(wrong_password.status, unknown_email.status);
    let message = wrong_password
        .testid_text("error")
        .expect("an error element");
    assert!(!message.is_empty());
    assert_eq!(
        Some(message.clone()),
        unknown_email.testid_text("error"),
        "the same message for an unknown email and a wrong password"
    );
    assert!(!message.to_lowercase().contains("unknown"), "{message}");
    assert!(!message.to_lowercase().contains("no account"), "{message}");
}

/// The Retry-After of a lockout: whole seconds, at most the 15-minute window.
fn assert_locked_out(page: &Page) {
    assert_eq!(page.status, 429, "expected a lockout:\n{}", page.body);
    let retry: u64 = page
        .header("retry-after")
        .expect("Retry-After on 429")
        .parse()
        .expect("Retry-After in seconds");
    assert!((1..=900).contains(&retry), "Retry-After {retry}");
}

async fn ten_failures_from_one_address_lock_that_address_only(backend: Backend) {
    let app = app_behind_proxy(backend).await;
    customer(&app, "alice@example.com");
    customer(&app, "bob@example.com");

    // Guessing passwords of many accounts from one address.
    for i in 0..10 {
        let page = Session::from_address(&app, "203.0.113.7")
            .sign_in(&format!("guess{i}@example.com"), "wrong password here")
            .await;
        assert_ne!(page.status, 429, "locked out after only {i} failures");
    }
    // Even a right password is refused from there now.
    let locked = Session::from_address(&app, "203.0.113.7")
        .sign_in("alice@example.com", PASSWORD)
        .await;
    assert_locked_out(&locked);

    // Alice, from her own address, signs in.
    let mut alice = Session::from_address(&app, "198.51.100.20");
    alice
        .sign_in("alice@example.com", PASSWORD)
        .await
        .assert_see_other("/dashboard/keys");
}

/// An IPv6 host holds a whole /64: guesses from ten of its addresses lock
/// the /64, while a neighbouring /64 still signs in.
async fn ipv6_guesses_are_counted_per_64(backend: Backend) {
    let app = app_behind_proxy(backend).await;
    customer(&app, "alice@example.com");
    for i in 0..10 {
        let page = Session::from_address(&app, &format!("2001:db8:1:2::{:x}", 0x10 + i))
            .sign_in(&format!("guess{i}@example.com"), "wrong password here")
            .await;
        assert_ne!(page.status, 429, "locked out after only {i} failures");
    }
    let same_64 = Session::from_address(&app, "2001:db8:1:2:ffff::1")
        .sign_in("alice@example.com", PASSWORD)
        .await;
    assert_locked_out(&same_64);
    Session::from_address(&app, "2001:db8:1:3::1")
        .sign_in("alice@example.com", PASSWORD)
        .await
        .assert_see_other("/dashboard/keys");
}

/// Thirty guesses sent together, for one account from thirty addresses and
/// for thirty accounts from one address: at most ten of each get their
/// password checked (401); the rest are refused before (429). Without the
/// attempts taking turns, all thirty read "no failures yet" and are checked.
async fn guesses_sent_together_still_stop_at_ten(backend: Backend) {
    let app = app_behind_proxy(backend).await;
    customer(&app, "alice@example.com");
    let statuses = |pages: Vec<Page>| {
        let checked = pages.iter().filter(|p| p.status == 401).count();
        let refused = pages.iter().filter(|p| p.status == 429).count();
        assert_eq!(checked + refused, pages.len(), "only 401 and 429 expected");
        (checked, refused)
    };

    let one_account = futures::future::join_all((0..30).map(|i| {
        let mut session = Session::from_address(&app, &format!("203.0.113.{}", 100 + i));
        async move {
            session
                .sign_in("alice@example.com", "wrong password here")
                .await
        }
    }))
    .await;
    assert_eq!(
        statuses(one_account),
        (10, 20),
        "one account, many addresses"
    );

    let one_address = futures::future::join_all((0..30).map(|i| {
        let mut session = Session::from_address(&app, "198.51.100.77");
        async move {
            session
                .sign_in(&format!("guess{i}@example.com"), "wrong password here")
                .await
        }
    }))
    .await;
    assert_eq!(
        statuses(one_address),
        (10, 20),
        "many accounts, one address"
    );
}

/// Ten wrong passwords for `email`, each from its own fresh client and
/// address (a distributed guess); the next fresh client is locked out.
async fn lock_account_from_many_addresses(app: &TestApp, email: &str) {
    for i in 0..10 {
        let page = Session::from_address(app, &format!("203.0.113.{}", 10 + i))
            .sign_in(email, "wrong password here")
            .await;
        assert_ne!(page.status, 429, "locked out after only {i} failures");
    }
    let next_guess = Session::from_address(app, "203.0.113.99")
        .sign_in(email, "another wrong password")
        .await;
    assert_locked_out(&next_guess);
}

/// A fresh client (no device cookie) from an address that never failed,
/// with the right password: refused while the account is locked.
async fn assert_fresh_client_locked_out(app: &TestApp, email: &str) {
    let mut fresh = Session::from_address(app, "198.51.100.50");
    let page = fresh.sign_in(email, PASSWORD).await;
    assert_locked_out(&page);
    assert!(
        !page.body.contains(r#"data-testid="sign-out""#),
        "a locked-out client got a session"
    );
    assert_signed_out(&fresh.get("/dashboard/keys").await);
}

async fn ten_failures_for_one_account_lock_that_account(backend: Backend) {
    let app = app_behind_proxy(backend).await;
    customer(&app, "alice@example.com");
    customer(&app, "bob@example.com");
    // Alice's usual browser signed in before, and holds a device cookie.
    let mut alices_browser = Session::from_address(&app, "198.51.100.20");
    alices_browser
        .sign_in("alice@example.com", PASSWORD)
        .await
        .assert_see_other("/dashboard/keys");

    lock_account_from_many_addresses(&app, "alice@example.com").await;

    // A fresh client from a clean address gets nothing, even with the
    // right password.
    assert_fresh_client_locked_out(&app, "alice@example.com").await;

    // Alice's browser, from yet another address that never failed, still
    // signs in.
    alices_browser.forwarded_for = Some("198.51.100.21".to_string());
    alices_browser
        .sign_in("alice@example.com", PASSWORD)
        .await
        .assert_see_other("/dashboard/keys");
    assert_eq!(alices_browser.get("/dashboard/keys").await.status, 200);
    // Other accounts are not affected, from any of those addresses.
    Session::from_address(&app, "203.0.113.10")
        .sign_in("bob@example.com", PASSWORD)
        .await
        .assert_see_other("/dashboard/keys");
}

/// The device cookie a successful sign-in sets, with its attributes.
fn device_cookie(page: &Page) -> SetCookie {
    page.set_cookies()
        .iter()
        .map(|c| SetCookie::parse(c))
        .find(|c| c.name.ends_with("moderato_device"))
        .unwrap_or_else(|| panic!("no device cookie set at sign-in: {:?}", page.headers))
}

/// Rows of `SELECT token_hash FROM dashboard_devices`, hex.
async fn stored_device_hashes(app: &TestApp) -> Vec<String> {
    let sql = "SELECT token_hash FROM dashboard_devices";
    let rows: Vec<Vec<u8>> = if app.db.url.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(&app.db.url).await.expect("pg");
        sqlx::query_scalar(sql)
            .fetch_all(&pool)
            .await
            .expect("devices")
    } else {
        let pool = sqlx::SqlitePool::connect(&app.db.url)
            .await
            .expect("sqlite");
        sqlx::query_scalar(sql)
            .fetch_all(&pool)
            .await
            .expect("devices")
    };
    rows.iter().map(hex::encode).collect()
}

async fn sign_in_sets_a_long_lived_strict_device_cookie(backend: Backend) {
    let app = dashboard_app(backend).await;
    customer(&app, "alice@example.com");
    let mut session = Session::new(&app);
    let signed_in = session.sign_in("alice@example.com", PASSWORD).await;
    signed_in.assert_see_other("/dashboard/keys");
    let device = device_cookie(&signed_in);
    assert!(device.value.len() >= 43, "{device:?}");
    assert!(device.has("HttpOnly"), "{device:?}");
    assert_eq!(device.get("SameSite"), Some("Strict"), "{device:?}");
    assert!(device.has("Secure"), "{device:?}");
    assert_eq!(device.name, DEVICE_COOKIE, "{device:?}");
    assert_eq!(device.get("Path"), Some("/"), "{device:?}");
    let max_age: u64 = device
        .get("Max-Age")
        .expect("a lasting cookie")
        .parse()
        .expect("seconds");
    assert!(max_age >= 30 * 24 * 3600, "Max-Age {max_age}");

    // Stored only as its SHA-256.
    let stored = stored_device_hashes(&app).await;
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
        device.value.as_bytes(),
    ));
    assert_eq!(stored, vec![digest]);
    assert!(!stored.contains(&hex::encode(device.value.as_bytes())));

    // Signing in again from the same browser keeps its device cookie.
    let again = session.sign_in("alice@example.com", PASSWORD).await;
    again.assert_see_other("/dashboard/keys");
    assert!(
        !again
            .set_cookies()
            .iter()
            .any(|c| c.starts_with(&format!("{DEVICE_COOKIE}="))),
        "a new device cookie for a browser that holds a valid one"
    );
    // Signing out does not forget the device.
    let csrf = session.csrf("/dashboard/keys").await;
    session
        .post("/dashboard/logout", &[("csrf_token", csrf.as_str())])
        .await
        .assert_see_other("/dashboard/login");
    assert_eq!(session.cookies.get(DEVICE_COOKIE), Some(&device.value));

    let plain = app_from_toml(backend, "[dashboard]\ncookie_secure = false\n").await;
    customer(&plain, "alice@example.com");
    let page = Session::new(&plain)
        .sign_in("alice@example.com", PASSWORD)
        .await;
    assert!(!device_cookie(&page).has("Secure"));
}

async fn a_device_cookie_of_another_account_does_not_help(backend: Backend) {
    let app = app_behind_proxy(backend).await;
    customer(&app, "alice@example.com");
    customer(&app, "bob@example.com");
    // Mallory has an account of her own (Bob's), and its device cookie.
    let mut mallory = Session::from_address(&app, "198.51.100.30");
    mallory
        .sign_in("bob@example.com", PASSWORD)
        .await
        .assert_see_other("/dashboard/keys");
    assert!(mallory.cookies.contains_key(DEVICE_COOKIE));
    lock_account_from_many_addresses(&app, "alice@example.com").await;

    let page = mallory.sign_in("alice@example.com", PASSWORD).await;
    assert_locked_out(&page);
    // Her device cookie still works for Bob's account.
    mallory
        .sign_in("bob@example.com", PASSWORD)
        .await
        .assert_see_other("/dashboard/keys");
}

async fn a_forged_device_cookie_does_not_help(backend: Backend) {
    let app = app_behind_proxy(backend).await;
    customer(&app, "alice@example.com");
    // Alice's real browser, for the cookie's shape.
    let mut alices_browser = Session::from_address(&app, "198.51.100.20");
    alices_browser
        .sign_in("alice@example.com", PASSWORD)
        .await
        .assert_see_other("/dashboard/keys");
    let real = alices_browser.cookies[DEVICE_COOKIE].clone();
    lock_account_from_many_addresses(&app, "alice@example.com").await;

    // Made up, of the right length and alphabet; and empty.
    let forged: String = real
        .chars()
        .map(|c| if c == 'A' { 'B' } else { 'A' })
        .collect();
    for value in [forged.as_str(), ""] {
        let mut attacker = Session::from_address(&app, "198.51.100.31");
        attacker
            .cookies
            .insert(DEVICE_COOKIE.to_string(), value.to_string());
        let page = attacker.sign_in("alice@example.com", PASSWORD).await;
        assert_locked_out(&page);
    }
    // The real one still works.
    alices_browser
        .sign_in("alice@example.com", PASSWORD)
        .await
        .assert_see_other("/dashboard/keys");
}

async fn a_device_that_fails_ten_times_is_locked_out(backend: Backend) {
    let app = app_behind_proxy(backend).await;
    customer(&app, "alice@example.com");
    let mut browser = Session::from_address(&app, "198.51.100.20");
    browser
        .sign_in("alice@example.com", PASSWORD)
        .await
        .assert_see_other("/dashboard/keys");
    // Someone at that browser guesses, moving address every time.
    for i in 0..10 {
        browser.forwarded_for = Some(format!("198.51.100.{}", 100 + i));
        let page = browser
            .sign_in("alice@example.com", "wrong password here")
            .await;
        assert_eq!(page.status, 401, "failure {i}");
    }
    browser.forwarded_for = Some("198.51.100.200".to_string());
    assert_locked_out(&browser.sign_in("alice@example.com", PASSWORD).await);
    // Those were the device's failures, not the account's: Alice signs in
    // from another client.
    Session::from_address(&app, "198.51.100.201")
        .sign_in("alice@example.com", PASSWORD)
        .await
        .assert_see_other("/dashboard/keys");
}

/// Moves every stored sign-in failure back by `minutes`.
async fn age_sign_in_failures(app: &TestApp, minutes: i64) {
    let at = Utc::now() - chrono::Duration::minutes(minutes);
    if app.db.url.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(&app.db.url).await.expect("pg");
        sqlx::query("UPDATE sign_in_failures SET at = $1")
            .bind(at)
            .execute(&pool)
            .await
            .expect("age failures");
    } else {
        let pool = sqlx::SqlitePool::connect(&app.db.url)
            .await
            .expect("sqlite");
        // The format the SQLite store writes (compared as text).
        let text = at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        sqlx::query("UPDATE sign_in_failures SET at = ?")
            .bind(text)
            .execute(&pool)
            .await
            .expect("age failures");
    }
}

async fn the_account_lock_ends_with_its_window(backend: Backend) {
    let app = app_behind_proxy(backend).await;
    customer(&app, "alice@example.com");
    lock_account_from_many_addresses(&app, "alice@example.com").await;
    assert_fresh_client_locked_out(&app, "alice@example.com").await;

    // Fourteen minutes later, still locked; sixteen, open again.
    age_sign_in_failures(&app, 14).await;
    assert_fresh_client_locked_out(&app, "alice@example.com").await;
    age_sign_in_failures(&app, 16).await;
    Session::from_address(&app, "198.51.100.50")
        .sign_in("alice@example.com", PASSWORD)
        .await
        .assert_see_other("/dashboard/keys");
}

/// One state-changing form, sent with a missing and with a wrong token.
async fn assert_refused_without_token(session: &mut Session, path: &str, fields: &[(&str, &str)]) {
    let missing = session.post(path, fields).await;
    assert_eq!(missing.status, 403, "POST {path} without a token");
    let mut with_wrong: Vec<(&str, &str)> = fields.to_vec();
    let wrong = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    with_wrong.push(("csrf_token", wrong));
    let wrong = session.post(path, &with_wrong).await;
    assert_eq!(wrong.status, 403, "POST {path} with a wrong token");
}

async fn every_form_needs_its_csrf_token(backend: Backend) {
    let app = dashboard_app(backend).await;
    customer(&app, "alice@example.com");
    let admin = create_account(&app, "root@example.com", "admin", &[]);
    let mut alice = Session::signed_in(&app, "alice@example.com", PASSWORD).await;
    let (key_id, key) = alice.create_key("ci").await;
    let alice_id = account_id(&app, "alice@example.com");

    // Sign-in: a right password without a token does not sign in.
    let mut stranger = Session::new(&app);
    stranger.get("/dashboard/login").await;
    assert_refused_without_token(
        &mut stranger,
        "/dashboard/login",
        &[("email", "alice@example.com"), ("password", PASSWORD)],
    )
    .await;
    assert_signed_out(&stranger.get("/dashboard/keys").await);

    // Alice's own forms.
    let keys_before = app.store.list_keys().await.unwrap().len();
    assert_refused_without_token(&mut alice, "/dashboard/keys", &[("name", "evil")]).await;
    assert_eq!(app.store.list_keys().await.unwrap().len(), keys_before);
    assert_refused_without_token(&mut alice, &format!("/dashboard/keys/{key_id}/revoke"), &[])
        .await;
    assert_refused_without_token(&mut alice, "/dashboard/logout", &[]).await;
    assert_eq!(
        alice.get("/dashboard/keys").await.status,
        200,
        "still signed in"
    );

    // A token of another session is a wrong token.
    let mut other = Session::signed_in(&app, "alice@example.com", PASSWORD).await;
    let others_token = other.csrf("/dashboard/keys").await;
    let page = alice
        .post(
            "/dashboard/keys",
            &[("name", "x"), ("csrf_token", others_token.as_str())],
        )
        .await;
    assert_eq!(page.status, 403, "another session's token");

    // The admin's forms.
    let mut root = Session::signed_in(&app, "root@example.com", PASSWORD).await;
    assert_eq!(admin["role"], "admin");
    let accounts_before = list_accounts(&app).len();
    assert_refused_without_token(
        &mut root,
        "/dashboard/admin/accounts",
        &[
            ("email", "mallory@example.com"),
            ("role", "admin"),
            ("tier", "free"),
            ("password", PASSWORD),
        ],
    )
    .await;
    assert_eq!(list_accounts(&app).len(), accounts_before);
    assert_refused_without_token(
        &mut root,
        &format!("/dashboard/admin/accounts/{alice_id}/plan"),
        &[("tier", "pro")],
    )
    .await;
    assert_refused_without_token(
        &mut root,
        &format!("/dashboard/admin/accounts/{alice_id}/disable"),
        &[],
    )
    .await;
    let keys_before = app.store.list_keys().await.unwrap().len();
    assert_refused_without_token(
        &mut root,
        &format!("/dashboard/admin/accounts/{alice_id}/keys"),
        &[("name", "planted")],
    )
    .await;
    assert_eq!(
        app.store.list_keys().await.unwrap().len(),
        keys_before,
        "a key made for Alice without a token"
    );
    assert_refused_without_token(
        &mut root,
        &format!("/dashboard/admin/accounts/{alice_id}/keys/{key_id}/revoke"),
        &[],
    )
    .await;

    // Nothing changed: the key is active, on the free plan, and works.
    let stored = app
        .store
        .get_key(&KeyId::parse(&key_id).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(stored.revoked_at.is_none());
    tokio::time::sleep(Duration::from_millis(600)).await;
    let response = app.moderate_text(&key, "hello").await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-ratelimit-limit"], "10");
}

/// Issue 26, finding 5: login CSRF by cookie tossing. Mallory holds a
/// genuine sign-in form (its token and its cookie's value) and plants the
/// cookie in Alice's browser from a sibling subdomain, which can set a
/// cookie for the dashboard's host unless its name is `__Host-`; then her
/// page posts the form with her own credentials, so that Alice works in
/// Mallory's account. Refused, as is a cookie whose value she made up.
async fn a_tossed_form_cookie_does_not_sign_a_browser_in(backend: Backend) {
    let app = dashboard_app(backend).await;
    customer(&app, "mallory@example.com");
    let mut mallory = Session::new(&app);
    let token = mallory.get("/dashboard/login").await.csrf();
    let genuine = mallory
        .cookies
        .iter()
        .find(|(name, _)| name.ends_with("moderato_form"))
        .map(|(_, value)| value.clone())
        .expect("the login page sets a form cookie");
    let credentials = [
        ("email", "mallory@example.com"),
        ("password", PASSWORD),
        ("csrf_token", token.as_str()),
    ];

    let mut alice = Session::new(&app);
    alice
        .cookies
        .insert("moderato_form".into(), genuine.clone());
    let page = alice.post("/dashboard/login", &credentials).await;
    assert_eq!(
        page.status, 403,
        "a tossed cookie signed in:\n{}",
        page.body
    );
    assert!(alice
        .cookies
        .keys()
        .all(|name| !name.ends_with("moderato_session")));
    assert_signed_out(&alice.get("/dashboard/keys").await);

    // Without `cookie_secure` there is no `__Host-` prefix: the token must
    // then at least be one the server made.
    let plain = app_from_toml(backend, "[dashboard]\ncookie_secure = false\n").await;
    customer(&plain, "mallory@example.com");
    let made_up = "mallorys-own-token-AAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    let mut alice = Session::new(&plain);
    alice.cookies.insert("moderato_form".into(), made_up.into());
    let page = alice
        .post(
            "/dashboard/login",
            &[
                ("email", "mallory@example.com"),
                ("password", PASSWORD),
                ("csrf_token", made_up),
            ],
        )
        .await;
    assert_eq!(
        page.status, 403,
        "a made-up token signed in:\n{}",
        page.body
    );
    assert_signed_out(&alice.get("/dashboard/keys").await);
    // The server's own pair still works there.
    Session::signed_in(&plain, "mallory@example.com", PASSWORD).await;
}

/// Issue 26, finding 5: a form posted from another origin is refused with
/// 403 whatever its token, by `Origin` or by `Sec-Fetch-Site`.
async fn forms_from_other_origins_are_refused(backend: Backend) {
    let app = dashboard_app(backend).await;
    customer(&app, "alice@example.com");
    let sign_in_with = |headers: Vec<(&'static str, String)>| {
        let app = &app;
        async move {
            let mut browser = Session::new(app);
            let token = browser.get("/dashboard/login").await.csrf();
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
            let page = browser
                .post_with_headers(
                    "/dashboard/login",
                    &[
                        ("email", "alice@example.com"),
                        ("password", PASSWORD),
                        ("csrf_token", token.as_str()),
                    ],
                    &headers,
                )
                .await;
            (page, browser)
        }
    };
    let port = app.base.rsplit(':').next().expect("port").to_string();
    let refused = [
        vec![("origin", "https://evil.example".to_string())],
        vec![("origin", "null".to_string())],
        // Another port of the same host: same site, another origin.
        vec![(
            "origin",
            format!("http://127.0.0.1:{}", port.parse::<u16>().unwrap() + 1),
        )],
        vec![("sec-fetch-site", "cross-site".to_string())],
        vec![("sec-fetch-site", "same-site".to_string())],
        vec![
            ("origin", app.base.clone()),
            ("sec-fetch-site", "cross-site".to_string()),
        ],
    ];
    for headers in refused {
        let (page, mut browser) = sign_in_with(headers.clone()).await;
        assert_eq!(page.status, 403, "{headers:?}:\n{}", page.body);
        assert_signed_out(&browser.get("/dashboard/keys").await);
    }
    let allowed = [
        vec![],
        vec![("origin", app.base.clone())],
        vec![
            ("origin", app.base.clone()),
            ("sec-fetch-site", "same-origin".to_string()),
        ],
    ];
    for headers in allowed {
        let (page, _) = sign_in_with(headers.clone()).await;
        page.assert_see_other("/dashboard/keys");
    }

    // A signed-in form too: no key is made from another site.
    let mut alice = Session::signed_in(&app, "alice@example.com", PASSWORD).await;
    let csrf = alice.csrf("/dashboard/keys").await;
    let keys_before = app.store.list_keys().await.unwrap().len();
    let page = alice
        .post_with_headers(
            "/dashboard/keys",
            &[("name", "planted"), ("csrf_token", csrf.as_str())],
            &[("origin", "https://evil.example")],
        )
        .await;
    assert_eq!(page.status, 403, "{}", page.body);
    assert_eq!(app.store.list_keys().await.unwrap().len(), keys_before);
}

async fn every_page_sends_the_security_headers(backend: Backend) {
    let app = dashboard_app(backend).await;
    customer(&app, "alice@example.com");
    create_account(&app, "root@example.com", "admin", &[]);
    let alice_id = account_id(&app, "alice@example.com");

    let mut anonymous = Session::new(&app);
    assert_security_headers("login", &anonymous.get("/dashboard/login").await);
    let failed = anonymous
        .sign_in("alice@example.com", "wrong password here")
        .await;
    assert_security_headers("failed sign-in", &failed);
    assert_security_headers(
        "signed-out keys",
        &Session::new(&app).get("/dashboard/keys").await,
    );
    assert_security_headers(
        "stylesheet",
        &anonymous.get("/dashboard/static/style.css").await,
    );

    let mut alice = Session::signed_in(&app, "alice@example.com", PASSWORD).await;
    let csrf = alice.csrf("/dashboard/keys").await;
    let created = alice
        .post(
            "/dashboard/keys",
            &[("name", "ci"), ("csrf_token", csrf.as_str())],
        )
        .await;
    assert_security_headers("new key", &created);
    let id = key_id_of(&created.testid_text("new-key").expect("new key"));
    for path in [
        "/dashboard/keys".to_string(),
        format!("/dashboard/keys/{id}/revoke"),
        "/dashboard/usage".to_string(),
        format!("/dashboard/usage?key={id}"),
        "/dashboard/usage.csv".to_string(),
        "/dashboard/plan".to_string(),
        "/dashboard/admin/accounts".to_string(),
        "/dashboard/no-such-page".to_string(),
    ] {
        assert_security_headers(&path, &alice.get(&path).await);
    }

    let mut root = Session::signed_in(&app, "root@example.com", PASSWORD).await;
    for path in [
        "/dashboard/admin/accounts".to_string(),
        format!("/dashboard/admin/accounts/{alice_id}"),
    ] {
        let page = root.get(&path).await;
        assert_eq!(page.status, 200, "{path}");
        assert_security_headers(&path, &page);
    }
}

async fn a_new_key_is_shown_once_works_and_dies_when_revoked(backend: Backend) {
    let app = dashboard_app(backend).await;
    customer(&app, "alice@example.com");
    let mut alice = Session::signed_in(&app, "alice@example.com", PASSWORD).await;

    let csrf = alice.csrf("/dashboard/keys").await;
    let created = alice
        .post(
            "/dashboard/keys",
            &[("name", "ci"), ("csrf_token", csrf.as_str())],
        )
        .await;
    assert_eq!(
        created.status, 200,
        "the secret is on the answer itself, not after a redirect"
    );
    let secret = created.testid_text("new-key").expect("new-key element");
    assert!(secret.starts_with("mdr_"), "{secret:?}");
    assert!(created.has_testid("copy-key"));
    assert!(
        created.body.to_lowercase().contains("again"),
        "a warning that the key cannot be shown again"
    );
    let id = key_id_of(&secret);
    let row = key_rows(&created.body)
        .remove(&id)
        .expect("the new key's row");
    assert_eq!(cell(&row, "name"), "ci");
    assert_eq!(cell(&row, "id"), id);
    assert_eq!(cell(&row, "plan"), "free");
    assert_eq!(number_cell(&row, "rpm"), 10);
    assert_eq!(cell(&row, "status"), "active");
    assert!(row.contains(r#"data-testid="revoke-key""#));

    // Shown once: a reload does not show the secret.
    let reloaded = alice.get("/dashboard/keys").await;
    assert!(!reloaded.has_testid("new-key"));
    let secret_part = key_secret_of(&secret);
    assert!(
        !reloaded.body.contains(&secret_part),
        "the secret is shown again"
    );

    // The key works on the API, with the account's plan.
    let response = app.moderate_text(&secret, "hello").await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-ratelimit-limit"], "10");

    // Revoked through the confirmation page: refused within a second.
    let confirm = alice.get(&format!("/dashboard/keys/{id}/revoke")).await;
    assert_eq!(confirm.status, 200);
    assert!(confirm.has_testid("confirm-revoke"));
    assert!(confirm
        .body
        .contains(&format!(r#"action="/dashboard/keys/{id}/revoke""#)));
    let csrf = confirm.csrf();
    let revoked = alice
        .post(
            &format!("/dashboard/keys/{id}/revoke"),
            &[("csrf_token", csrf.as_str())],
        )
        .await;
    revoked.assert_see_other("/dashboard/keys");
    until_api_answers(&app, &secret, 401, Duration::from_secs(1)).await;

    let listed = alice.get("/dashboard/keys").await;
    let row = key_rows(&listed.body).remove(&id).expect("row");
    assert_eq!(cell(&row, "status"), "revoked");
    assert!(!row.contains(r#"data-testid="revoke-key""#));
    let last_used = cell(&row, "last_used");
    assert!(
        last_used.contains(&Utc::now().format("%Y-%m-%d").to_string()),
        "last used today: {last_used:?}"
    );
}

async fn another_accounts_key_is_not_found(backend: Backend) {
    let app = dashboard_app(backend).await;
    customer(&app, "alice@example.com");
    customer(&app, "bob@example.com");
    let mut alice = Session::signed_in(&app, "alice@example.com", PASSWORD).await;
    let (alice_key_id, alice_key) = alice.create_key("alice's").await;

    let mut bob = Session::signed_in(&app, "bob@example.com", PASSWORD).await;
    let keys = bob.get("/dashboard/keys").await;
    assert!(!keys.body.contains(&alice_key_id), "Bob sees Alice's key");
    let view = bob
        .get(&format!("/dashboard/keys/{alice_key_id}/revoke"))
        .await;
    assert_eq!(view.status, 404);
    assert!(!view.body.contains("alice's"));
    let csrf = bob.csrf("/dashboard/keys").await;
    let revoke = bob
        .post(
            &format!("/dashboard/keys/{alice_key_id}/revoke"),
            &[("csrf_token", csrf.as_str())],
        )
        .await;
    assert_eq!(revoke.status, 404);
    let usage = bob
        .get(&format!("/dashboard/usage?key={alice_key_id}"))
        .await;
    assert_eq!(usage.status, 404, "another account's usage");
    let csv = bob
        .get(&format!("/dashboard/usage.csv?key={alice_key_id}"))
        .await;
    assert_eq!(csv.status, 404, "another account's usage CSV");

    // Past the key cache's lifetime, Alice's key still works.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(app.moderate_text(&alice_key, "hello").await.status(), 200);
}

async fn admin_pages_are_not_found_for_customers(backend: Backend) {
    let app = dashboard_app(backend).await;
    customer(&app, "alice@example.com");
    let bob = customer(&app, "bob@example.com");
    let bob_id = bob["id"].as_str().unwrap();
    let mut alice = Session::signed_in(&app, "alice@example.com", PASSWORD).await;
    let csrf = alice.csrf("/dashboard/keys").await;

    for path in [
        "/dashboard/admin/accounts".to_string(),
        format!("/dashboard/admin/accounts/{bob_id}"),
    ] {
        let page = alice.get(&path).await;
        assert_eq!(page.status, 404, "{path}");
        assert!(!page.body.contains("bob@example.com"), "{path}");
    }
    let accounts_before = list_accounts(&app).len();
    let create = alice
        .post(
            "/dashboard/admin/accounts",
            &[
                ("email", "mallory@example.com"),
                ("role", "admin"),
                ("tier", "free"),
                ("password", PASSWORD),
                ("csrf_token", csrf.as_str()),
            ],
        )
        .await;
    assert_eq!(create.status, 404);
    assert_eq!(list_accounts(&app).len(), accounts_before);
    let plan = alice
        .post(
            &format!("/dashboard/admin/accounts/{bob_id}/plan"),
            &[("tier", "pro"), ("csrf_token", csrf.as_str())],
        )
        .await;
    assert_eq!(plan.status, 404);
    let disable = alice
        .post(
            &format!("/dashboard/admin/accounts/{bob_id}/disable"),
            &[("csrf_token", csrf.as_str())],
        )
        .await;
    assert_eq!(disable.status, 404);
    // Nor can she make or revoke Bob's keys through the admin's routes.
    let mut bob_session = Session::signed_in(&app, "bob@example.com", PASSWORD).await;
    let (bob_key_id, bob_key) = bob_session.create_key("bob's").await;
    let keys_before = app.store.list_keys().await.unwrap().len();
    let create_key = alice
        .post(
            &format!("/dashboard/admin/accounts/{bob_id}/keys"),
            &[("name", "mallory's"), ("csrf_token", csrf.as_str())],
        )
        .await;
    assert_eq!(create_key.status, 404);
    assert!(!create_key.has_testid("new-key"));
    assert_eq!(app.store.list_keys().await.unwrap().len(), keys_before);
    let revoke_path = format!("/dashboard/admin/accounts/{bob_id}/keys/{bob_key_id}/revoke");
    let confirm = alice.get(&revoke_path).await;
    assert_eq!(confirm.status, 404);
    assert!(!confirm.body.contains("bob's"));
    let revoke = alice
        .post(&revoke_path, &[("csrf_token", csrf.as_str())])
        .await;
    assert_eq!(revoke.status, 404);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(app.moderate_text(&bob_key, "hello").await.status(), 200);

    let listed = list_accounts(&app);
    let bob_now = listed
        .iter()
        .find(|a| a["email"] == "bob@example.com")
        .expect("bob listed");
    assert_ne!(bob_now["tier"], "pro", "{bob_now}");
    Session::signed_in(&app, "bob@example.com", PASSWORD).await;
}

async fn admin_creates_and_revokes_a_customers_key(backend: Backend) {
    let app = dashboard_app(backend).await;
    customer(&app, "alice@example.com");
    customer(&app, "bob@example.com");
    create_account(&app, "root@example.com", "admin", &[]);
    let alice_id = account_id(&app, "alice@example.com");
    let account_path = format!("/dashboard/admin/accounts/{alice_id}");
    let mut root = Session::signed_in(&app, "root@example.com", PASSWORD).await;

    let page = root.get(&account_path).await;
    assert_eq!(page.status, 200);
    assert!(page
        .body
        .contains(&format!(r#"action="{account_path}/keys""#)));
    let csrf = page.csrf();
    let created = root
        .post(
            &format!("{account_path}/keys"),
            &[("name", "made by support"), ("csrf_token", csrf.as_str())],
        )
        .await;
    assert_eq!(created.status, 200, "{}", created.body);
    let secret = created.testid_text("new-key").expect("new-key element");
    assert!(secret.starts_with("mdr_"), "{secret:?}");
    assert!(created.has_testid("copy-key"));
    assert!(created
        .body
        .to_lowercase()
        .contains("cannot be shown again"));
    let id = key_id_of(&secret);
    let row = key_rows(&created.body)
        .remove(&id)
        .expect("the new key's row");
    assert_eq!(cell(&row, "name"), "made by support");
    assert_eq!(cell(&row, "plan"), "free", "the account's plan");
    assert!(row.contains(&format!(r#"href="{account_path}/keys/{id}/revoke""#)));

    // Shown once.
    let reloaded = root.get(&account_path).await;
    assert!(!reloaded.has_testid("new-key"));
    assert!(!reloaded.body.contains(&key_secret_of(&secret)));

    // It works on the API with Alice's plan, and it is on her own keys page.
    let response = app.moderate_text(&secret, "hello").await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-ratelimit-limit"], "10");
    let mut alice = Session::signed_in(&app, "alice@example.com", PASSWORD).await;
    let hers = alice.get("/dashboard/keys").await;
    let row = key_rows(&hers.body).remove(&id).expect("on Alice's page");
    assert_eq!(cell(&row, "name"), "made by support");
    assert_eq!(cell(&row, "status"), "active");

    // A name is required, as on the customer's page.
    let keys_before = app.store.list_keys().await.unwrap().len();
    let nameless = root
        .post(
            &format!("{account_path}/keys"),
            &[("name", "  "), ("csrf_token", csrf.as_str())],
        )
        .await;
    assert_eq!(nameless.status, 400);
    assert!(nameless
        .testid_text("key-error")
        .is_some_and(|m| m.contains("name")));
    assert_eq!(app.store.list_keys().await.unwrap().len(), keys_before);

    // Another account's key under Alice's page, and unknown ids: 404.
    let mut bob = Session::signed_in(&app, "bob@example.com", PASSWORD).await;
    let (bob_key_id, bob_key) = bob.create_key("bob's").await;
    for path in [
        format!("{account_path}/keys/{bob_key_id}/revoke"),
        format!("{account_path}/keys/0123456789abcdef/revoke"),
        format!("{account_path}/keys/not-a-key/revoke"),
    ] {
        assert_eq!(root.get(&path).await.status, 404, "GET {path}");
        let posted = root.post(&path, &[("csrf_token", csrf.as_str())]).await;
        assert_eq!(posted.status, 404, "POST {path}");
    }
    let unknown_account = root
        .post(
            "/dashboard/admin/accounts/6f1c2a9e-0000-4000-8000-000000000000/keys",
            &[("name", "x"), ("csrf_token", csrf.as_str())],
        )
        .await;
    assert_eq!(unknown_account.status, 404);
    assert_eq!(app.store.list_keys().await.unwrap().len(), keys_before + 1);

    // Revoked after a confirmation: refused by the API within a second.
    let confirm_path = format!("{account_path}/keys/{id}/revoke");
    let confirm = root.get(&confirm_path).await;
    assert_eq!(confirm.status, 200);
    assert!(confirm.has_testid("confirm-revoke"));
    assert!(confirm
        .body
        .contains(&format!(r#"action="{confirm_path}""#)));
    assert!(confirm.body.contains(&format!(r#"href="{account_path}""#)));
    assert_eq!(
        confirm.testid_text("key-owner").as_deref(),
        Some("alice@example.com")
    );
    let revoked = root
        .post(&confirm_path, &[("csrf_token", confirm.csrf().as_str())])
        .await;
    revoked.assert_see_other(&account_path);
    let took = until_api_answers(&app, &secret, 401, Duration::from_secs(1)).await;
    eprintln!("revoked by an admin: the API refused the key after {took:?}");
    let hers = alice.get("/dashboard/keys").await;
    let row = key_rows(&hers.body).remove(&id).expect("on Alice's page");
    assert_eq!(cell(&row, "status"), "revoked");
    // Bob's key was not touched.
    assert_eq!(app.moderate_text(&bob_key, "hello").await.status(), 200);
}

async fn operator_keys_are_revoked_but_not_made_in_the_dashboard(backend: Backend) {
    let app = dashboard_app(backend).await;
    create_account(&app, "root@example.com", "admin", &[]);
    let (cli_id, cli_key) = app.create_key(moderato::access::Tier::Pro, None).await;
    let operator = format!(
        "/dashboard/admin/accounts/{}",
        moderato::access::AccountId::OPERATOR
    );
    let mut root = Session::signed_in(&app, "root@example.com", PASSWORD).await;
    let page = root.get(&operator).await;
    assert_eq!(page.status, 200);
    assert!(!page.body.contains(&format!(r#"action="{operator}/keys""#)));
    let csrf = page.csrf();
    let keys_before = app.store.list_keys().await.unwrap().len();
    let refused = root
        .post(
            &format!("{operator}/keys"),
            &[("name", "x"), ("csrf_token", csrf.as_str())],
        )
        .await;
    assert_eq!(refused.status, 400);
    assert!(refused
        .testid_text("key-error")
        .is_some_and(|m| m.contains("moderato keys create")));
    assert_eq!(app.store.list_keys().await.unwrap().len(), keys_before);

    assert_eq!(app.moderate_text(&cli_key, "hello").await.status(), 200);
    root.post(
        &format!("{operator}/keys/{cli_id}/revoke"),
        &[("csrf_token", csrf.as_str())],
    )
    .await
    .assert_see_other(&operator);
    until_api_answers(&app, &cli_key, 401, Duration::from_secs(1)).await;
}

/// Usage figures of one key or the account, as the billing table has them.
async fn billing_today(app: &TestApp, keys: &[&str]) -> [u64; 3] {
    let today = Utc::now().date_naive();
    let mut sum = [0u64; 3];
    for key in keys {
        let id = KeyId::parse(key).unwrap();
        for row in app
            .store
            .billing(Period::Day, Some(&id), Some(today))
            .await
            .unwrap()
        {
            sum[0] += row.requests;
            sum[1] += row.text_items + row.image_items;
            sum[2] += row.rate_limited;
        }
    }
    sum
}

async fn usage_page_and_csv_show_the_billing_figures(backend: Backend) {
    let app = dashboard_app(backend).await;
    customer(&app, "alice@example.com");
    let mut alice = Session::signed_in(&app, "alice@example.com", PASSWORD).await;
    let (first_id, first) = alice.create_key("first").await;
    let (second_id, second) = alice.create_key("second").await;

    // The keys share the account's 10 requests a minute (free plan). Second
    // key: two requests. First key: one request of three items, seven of
    // one, then over the account's allowance four times.
    for _ in 0..2 {
        assert_eq!(app.moderate_text(&second, "hi").await.status(), 200);
    }
    let three = serde_json::json!({"input": [
        {"type": "text", "text": "one"},
        {"type": "text", "text": "two"},
        {"type": "text", "text": "three"},
    ]});
    assert_eq!(app.moderate(&first, &three).await.status(), 200);
    let mut statuses = Vec::new();
    for _ in 0..11 {
        statuses.push(app.moderate_text(&first, "hello").await.status().as_u16());
    }
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 7);
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 4);
    app.usage_events(14).await;

    let expected_first = billing_today(&app, &[first_id.as_str()]).await;
    let expected_second = billing_today(&app, &[second_id.as_str()]).await;
    let expected_all = billing_today(&app, &[first_id.as_str(), second_id.as_str()]).await;
    assert_eq!(expected_first, [8, 10, 4], "billing table of the first key");
    assert_eq!(expected_second, [2, 2, 0]);

    // The CLI's report says the same as the store.
    let report = moderato(&app, &["usage", "--json"], "");
    assert!(report.success, "{}", report.stderr);
    let report: Value = serde_json::from_str(report.stdout.trim()).unwrap();
    let cli_requests: u64 = report
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["key_id"] == first_id.as_str() || r["key_id"] == second_id.as_str())
        .map(|r| r["requests"].as_u64().unwrap())
        .sum();
    assert_eq!(cli_requests, expected_all[0]);

    let today = Utc::now().format("%Y-%m-%d").to_string();
    for (query, expected) in [
        (String::new(), expected_all),
        (format!("?key={first_id}"), expected_first),
        (format!("?key={second_id}"), expected_second),
    ] {
        let page = alice.get(&format!("/dashboard/usage{query}")).await;
        assert_eq!(page.status, 200, "usage{query}");
        assert!(
            page.body.contains(r#"data-testid="usage-chart""#)
                && page.body.contains(r#"role="img""#)
                && page.body.contains("aria-label="),
            "usage{query}: an accessible chart"
        );
        let table = usage_rows(&page.body);
        assert_eq!(table.get(&today), Some(&expected), "usage{query} today");
        assert!(
            table
                .iter()
                .all(|(day, f)| *day == today || *f == [0, 0, 0]),
            "usage{query}: only today has traffic: {table:?}"
        );
        assert!(
            page.body.contains(&format!(
                r#"href="/dashboard/usage.csv{}""#,
                query.replace('&', "&amp;")
            )) || page.has_testid("usage-csv")
        );

        let csv = alice.get(&format!("/dashboard/usage.csv{query}")).await;
        assert_eq!(csv.status, 200);
        assert!(csv
            .header("content-type")
            .is_some_and(|t| t.starts_with("text/csv")));
        assert!(csv
            .header("content-disposition")
            .is_some_and(|d| d.starts_with("attachment")));
        let mut lines = csv.body.lines();
        // The last column is the policy the requests were judged under
        // (empty: none, the shipped thresholds).
        assert_eq!(lines.next(), Some("day,requests,items,rate_limited,policy"));
        let today_line = format!("{today},{},{},{},", expected[0], expected[1], expected[2]);
        assert!(
            csv.body.lines().any(|l| l == today_line),
            "usage.csv{query} has {today_line:?}:\n{}",
            csv.body
        );
    }
}

async fn admin_creates_an_account_sets_its_plan_and_disables_it(backend: Backend) {
    let app = dashboard_app(backend).await;
    create_account(&app, "root@example.com", "admin", &[]);
    let mut root = Session::signed_in(&app, "root@example.com", PASSWORD).await;

    // Create Carol with a password.
    let csrf = root.csrf("/dashboard/admin/accounts").await;
    let created = root
        .post(
            "/dashboard/admin/accounts",
            &[
                ("email", "Carol@Example.com"),
                ("role", "customer"),
                ("tier", "basic"),
                ("rpm", ""),
                ("password", PASSWORD),
                ("csrf_token", csrf.as_str()),
            ],
        )
        .await;
    assert!(
        created.status == 200 || created.status == 303,
        "create account: {} {}",
        created.status,
        created.body
    );
    let accounts = root.get("/dashboard/admin/accounts").await;
    let row = rows(&accounts.body, "data-account-email")
        .remove("carol@example.com")
        .expect("Carol's row, e-mail lower-cased");
    let carol_id = account_id(&app, "carol@example.com");
    assert!(row.contains(&format!("/dashboard/admin/accounts/{carol_id}")));
    assert!(text_of(&row).contains("basic"), "{row}");

    let mut carol = Session::signed_in(&app, "carol@example.com", PASSWORD).await;
    let (carol_key_id, carol_key) = carol.create_key("carol's").await;
    let first = app.moderate_text(&carol_key, "hello").await;
    assert_eq!(first.headers()["x-ratelimit-limit"], "60");

    // The admin sees her keys on her page and moves her to enterprise.
    let page = root
        .get(&format!("/dashboard/admin/accounts/{carol_id}"))
        .await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains(&carol_key_id), "her keys on her page");
    assert!(page.has_testid("set-plan") && page.has_testid("disable-account"));
    let csrf = page.csrf();
    let plan_path = format!("/dashboard/admin/accounts/{carol_id}/plan");
    let no_rpm = root
        .post(
            &plan_path,
            &[
                ("tier", "enterprise"),
                ("rpm", ""),
                ("csrf_token", csrf.as_str()),
            ],
        )
        .await;
    assert!(
        (400..500).contains(&no_rpm.status)
            || no_rpm.body.to_lowercase().contains("rpm")
            || no_rpm.body.to_lowercase().contains("requests per minute"),
        "enterprise without a limit is refused with a reason: {} {}",
        no_rpm.status,
        no_rpm.body
    );
    let set = root
        .post(
            &plan_path,
            &[
                ("tier", "enterprise"),
                ("rpm", "1234"),
                ("csrf_token", csrf.as_str()),
            ],
        )
        .await;
    set.assert_see_other(&format!("/dashboard/admin/accounts/{carol_id}"));
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    loop {
        let response = app.moderate_text(&carol_key, "hello").await;
        if response.headers()["x-ratelimit-limit"] == "1234" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the new plan did not reach the API within a second"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let plan = carol.get("/dashboard/plan").await;
    assert_eq!(plan.status, 200);
    let plan_text = text_of(&plan.body);
    assert!(plan_text.contains("enterprise"), "{plan_text}");
    assert!(
        plan_text.contains("1234") || plan_text.contains("1,234"),
        "{plan_text}"
    );

    // Disabled: her keys are refused within a second.
    let disabled = root
        .post(
            &format!("/dashboard/admin/accounts/{carol_id}/disable"),
            &[("csrf_token", csrf.as_str())],
        )
        .await;
    disabled.assert_see_other(&format!("/dashboard/admin/accounts/{carol_id}"));
    until_api_answers(&app, &carol_key, 401, Duration::from_secs(1)).await;

    // No new keys for a disabled account: they would not work.
    let keys_before = app.store.list_keys().await.unwrap().len();
    let refused = root
        .post(
            &format!("/dashboard/admin/accounts/{carol_id}/keys"),
            &[("name", "after"), ("csrf_token", csrf.as_str())],
        )
        .await;
    assert_eq!(refused.status, 400);
    assert!(refused
        .testid_text("key-error")
        .is_some_and(|m| m.contains("disabled")));
    assert!(!refused.has_testid("new-key"));
    assert_eq!(app.store.list_keys().await.unwrap().len(), keys_before);
}

async fn first_password_link_lets_a_new_account_sign_in(backend: Backend) {
    let app = dashboard_app(backend).await;
    create_account(&app, "root@example.com", "admin", &[]);
    let mut root = Session::signed_in(&app, "root@example.com", PASSWORD).await;
    let csrf = root.csrf("/dashboard/admin/accounts").await;
    let created = root
        .post(
            "/dashboard/admin/accounts",
            &[
                ("email", "dave@example.com"),
                ("role", "customer"),
                ("tier", "free"),
                ("rpm", ""),
                ("password", ""),
                ("csrf_token", csrf.as_str()),
            ],
        )
        .await;
    assert_eq!(created.status, 200, "{}", created.body);
    let link = created
        .testid_text("password-link")
        .expect("a first-password link");
    let path = &link[link
        .find("/dashboard/set-password?token=")
        .expect("link path")..];

    let mut dave = Session::new(&app);
    let form = dave.get(path).await;
    assert_eq!(form.status, 200, "{}", form.body);
    assert_security_headers("set-password", &form);
    let short = dave
        .post(
            path,
            &[
                ("password", "short pass"),
                ("csrf_token", form.csrf().as_str()),
            ],
        )
        .await;
    assert!(
        (400..500).contains(&short.status) || short.status == 200,
        "{}",
        short.status
    );
    assert!(text_of(&short.body).contains("12"), "the rule is named");
    let form = dave.get(path).await;
    let set = dave
        .post(
            path,
            &[("password", PASSWORD), ("csrf_token", form.csrf().as_str())],
        )
        .await;
    assert!(set.status < 400, "{} {}", set.status, set.body);
    Session::signed_in(&app, "dave@example.com", PASSWORD).await;

    // The link is used up.
    let again = Session::new(&app).get(path).await;
    assert!(
        again.status >= 400 || !again.body.contains(r#"name="password""#),
        "a used link still offers to set the password: {}",
        again.status
    );
}

async fn the_api_ignores_dashboard_cookies(backend: Backend) {
    let app = dashboard_app(backend).await;
    customer(&app, "alice@example.com");
    let mut alice = Session::signed_in(&app, "alice@example.com", PASSWORD).await;
    alice.create_key("ci").await;
    let cookie = alice
        .cookies
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("; ");
    let response = app
        .client
        .post(format!("{}/v1/moderate", app.base))
        .header("cookie", cookie)
        .json(&serde_json::json!({"input": [{"type": "text", "text": "hello"}]}))
        .send()
        .await
        .unwrap();
    let (status, _, body) = parts(response).await;
    assert_eq!(status, 401);
    error_message(&body, "missing_api_key");
}

async fn short_passwords_are_refused_with_the_rule(backend: Backend) {
    let app = dashboard_app(backend).await;
    let out = moderato(
        &app,
        &[
            "accounts",
            "create",
            "--email",
            "eve@example.com",
            "--role",
            "customer",
            "--password-stdin",
        ],
        "elevenchars\n",
    );
    assert!(!out.success, "an 11-character password was accepted");
    assert!(
        out.stderr.contains("12"),
        "the message names the rule: {}",
        out.stderr
    );
    assert!(!out.stderr.contains("elevenchars"), "never echo a password");

    create_account(&app, "root@example.com", "admin", &[]);
    let mut root = Session::signed_in(&app, "root@example.com", PASSWORD).await;
    let csrf = root.csrf("/dashboard/admin/accounts").await;
    let page = root
        .post(
            "/dashboard/admin/accounts",
            &[
                ("email", "eve@example.com"),
                ("role", "customer"),
                ("tier", "free"),
                ("rpm", ""),
                ("password", "elevenchars"),
                ("csrf_token", csrf.as_str()),
            ],
        )
        .await;
    assert!(page.status < 500 && page.status != 303, "{}", page.status);
    assert!(
        text_of(&page.body).contains("12"),
        "the message names the rule"
    );
    assert!(
        !list_accounts(&app)
            .iter()
            .any(|a| a["email"] == "eve@example.com"),
        "no account with a short password"
    );
}

/// `moderato accounts list --json`.
fn list_accounts(app: &TestApp) -> Vec<Value> {
    let out = moderato(app, &["accounts", "list", "--json"], "");
    assert!(out.success, "{}", out.stderr);
    serde_json::from_str::<Value>(out.stdout.trim())
        .unwrap_or_else(|_| panic!("accounts list --json printed {:?}", out.stdout))
        .as_array()
        .expect("a JSON array")
        .clone()
}

fn account_id(app: &TestApp, email: &str) -> String {
    list_accounts(app)
        .into_iter()
        .find(|a| a["email"] == email)
        .and_then(|a| a["id"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("no account {email}"))
}

async fn cli_creates_and_lists_accounts(backend: Backend) {
    let app = dashboard_app(backend).await;
    let out = moderato(
        &app,
        &[
            "accounts",
            "create",
            "--email",
            "Frank@Example.COM",
            "--role",
            "customer",
            "--tier",
            "pro",
            "--password-stdin",
            "--json",
        ],
        &format!("{PASSWORD}\n"),
    );
    assert!(out.success, "{}", out.stderr);
    let created: Value = serde_json::from_str(out.stdout.trim()).expect("JSON");
    let fields: Vec<&String> = created.as_object().unwrap().keys().collect();
    assert_eq!(fields, ["email", "id", "role"]);
    assert_eq!(created["email"], "frank@example.com");
    assert_eq!(created["role"], "customer");
    assert!(!out.stdout.contains(PASSWORD) && !out.stderr.contains(PASSWORD));

    let listed = list_accounts(&app);
    let frank = listed
        .iter()
        .find(|a| a["id"] == created["id"])
        .expect("listed");
    assert_eq!(frank["email"], "frank@example.com");
    assert_eq!(frank["role"], "customer");
    assert!(!listed.iter().any(|a| a.to_string().contains(PASSWORD)));

    let dup = moderato(
        &app,
        &[
            "accounts",
            "create",
            "--email",
            "frank@example.com",
            "--role",
            "customer",
            "--password-stdin",
        ],
        &format!("{PASSWORD}\n"),
    );
    assert!(!dup.success, "a second account with the same e-mail");

    // The password read from standard input signs in, and the plan applies.
    let mut frank = Session::signed_in(&app, "Frank@example.com", PASSWORD).await;
    let (_, key) = frank.create_key("ci").await;
    let response = app.moderate_text(&key, "hello").await;
    assert_eq!(response.headers()["x-ratelimit-limit"], "300");
}

on_both_backends!(
    a_busy_session_ends_at_its_max_lifetime,
    a_password_change_ends_every_other_session,
    an_admin_password_reset_ends_every_session,
    a_tossed_form_cookie_does_not_sign_a_browser_in,
    forms_from_other_origins_are_refused,
    guesses_sent_together_still_stop_at_ten,
    ipv6_guesses_are_counted_per_64,
    login_form_and_strict_session_cookie,
    cookie_is_not_secure_when_configured_for_plain_http,
    session_id_is_rotated_at_sign_in,
    sign_out_ends_the_session,
    idle_session_expires,
    unknown_email_and_wrong_password_look_the_same,
    ten_failures_from_one_address_lock_that_address_only,
    ten_failures_for_one_account_lock_that_account,
    sign_in_sets_a_long_lived_strict_device_cookie,
    a_device_cookie_of_another_account_does_not_help,
    a_forged_device_cookie_does_not_help,
    a_device_that_fails_ten_times_is_locked_out,
    the_account_lock_ends_with_its_window,
    every_form_needs_its_csrf_token,
    every_page_sends_the_security_headers,
    a_new_key_is_shown_once_works_and_dies_when_revoked,
    another_accounts_key_is_not_found,
    admin_pages_are_not_found_for_customers,
    admin_creates_and_revokes_a_customers_key,
    operator_keys_are_revoked_but_not_made_in_the_dashboard,
    usage_page_and_csv_show_the_billing_figures,
    admin_creates_an_account_sets_its_plan_and_disables_it,
    first_password_link_lets_a_new_account_sign_in,
    the_api_ignores_dashboard_cookies,
    short_passwords_are_refused_with_the_rule,
    cli_creates_and_lists_accounts,
);

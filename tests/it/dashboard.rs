//! The dashboard's contract over real HTTP, on both backends: sign-in and
//! its cookie, sessions, the lockout, CSRF, the security headers, keys made
//! and revoked in the dashboard as the API sees them, accounts kept apart,
//! usage figures equal to the billing table's, the admin pages, and the
//! `moderato accounts` command.

use std::time::Duration;

use chrono::Utc;
use moderato::config::{ImageClassifierKind, IpBlock, TextClassifierKind};
use moderato::store::{KeyId, Period};
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
    assert_eq!(cookie.get("Path"), Some("/dashboard"), "{cookie:?}");

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

async fn ten_failures_for_one_account_lock_that_account(backend: Backend) {
    let app = app_behind_proxy(backend).await;
    customer(&app, "alice@example.com");
    customer(&app, "bob@example.com");

    // A distributed guess at Alice's password: one try per address.
    for i in 0..10 {
        let page = Session::from_address(&app, &format!("203.0.113.{}", 10 + i))
            .sign_in("alice@example.com", "wrong password here")
            .await;
        assert_ne!(page.status, 429, "locked out after only {i} failures");
    }
    let next_guess = Session::from_address(&app, "203.0.113.99")
        .sign_in("alice@example.com", "another wrong password")
        .await;
    assert_locked_out(&next_guess);

    // Alice herself, from an address that never failed, still signs in.
    Session::from_address(&app, "198.51.100.20")
        .sign_in("alice@example.com", PASSWORD)
        .await
        .assert_see_other("/dashboard/keys");
    // Other accounts are not affected, from any of those addresses.
    Session::from_address(&app, "203.0.113.10")
        .sign_in("bob@example.com", PASSWORD)
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
    let secret_part = secret.rsplit('_').next().unwrap();
    assert!(
        !reloaded.body.contains(secret_part),
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
    let listed = list_accounts(&app);
    let bob_now = listed
        .iter()
        .find(|a| a["email"] == "bob@example.com")
        .expect("bob listed");
    assert_ne!(bob_now["tier"], "pro", "{bob_now}");
    Session::signed_in(&app, "bob@example.com", PASSWORD).await;
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

    // First key: one request of three items, ten of one, then over its
    // 10 requests a minute (free plan) twice. Second key: two requests.
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
    for _ in 0..2 {
        assert_eq!(app.moderate_text(&second, "hi").await.status(), 200);
    }
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 9);
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 2);
    app.usage_events(14).await;

    let expected_first = billing_today(&app, &[first_id.as_str()]).await;
    let expected_second = billing_today(&app, &[second_id.as_str()]).await;
    let expected_all = billing_today(&app, &[first_id.as_str(), second_id.as_str()]).await;
    assert_eq!(
        expected_first,
        [10, 12, 2],
        "billing table of the first key"
    );
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
        assert_eq!(lines.next(), Some("day,requests,items,rate_limited"));
        let today_line = format!("{today},{},{},{}", expected[0], expected[1], expected[2]);
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
    login_form_and_strict_session_cookie,
    cookie_is_not_secure_when_configured_for_plain_http,
    session_id_is_rotated_at_sign_in,
    sign_out_ends_the_session,
    idle_session_expires,
    unknown_email_and_wrong_password_look_the_same,
    ten_failures_from_one_address_lock_that_address_only,
    ten_failures_for_one_account_lock_that_account,
    every_form_needs_its_csrf_token,
    every_page_sends_the_security_headers,
    a_new_key_is_shown_once_works_and_dies_when_revoked,
    another_accounts_key_is_not_found,
    admin_pages_are_not_found_for_customers,
    usage_page_and_csv_show_the_billing_figures,
    admin_creates_an_account_sets_its_plan_and_disables_it,
    first_password_link_lets_a_new_account_sign_in,
    the_api_ignores_dashboard_cookies,
    short_passwords_are_refused_with_the_rule,
    cli_creates_and_lists_accounts,
);

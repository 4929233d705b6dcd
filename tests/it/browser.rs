//! The dashboard in headless Chromium, as its users see it: a customer signs
//! in, makes a key, uses it, finds the request in the usage chart and table,
//! and revokes the key; an admin changes a customer's plan, then makes a key
//! for the customer and revokes it. Every page is
//! saved as a screenshot (see `webdriver::screenshot_dir`).

use std::time::{Duration, Instant};

use chrono::Utc;
use moderato::config::{ImageClassifierKind, TextClassifierKind};

use crate::dash_client::*;
use crate::helpers::*;
use crate::webdriver::Browser;
use axum::response::IntoResponse;

fn quick(config: &mut moderato::config::Config) {
    config.text_classifier = TextClassifierKind::Lexical;
    config.image_classifier = ImageClassifierKind::None;
}

async fn sign_in(browser: &Browser, email: &str, password: &str) {
    browser.goto("/dashboard/login").await;
    browser.fill(r#"input[name="email"]"#, email).await;
    browser.fill(r#"input[name="password"]"#, password).await;
    browser.submit(r#"[data-testid="sign-in"]"#).await;
    browser.wait_for_path("/dashboard/keys").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn customer_makes_uses_watches_and_revokes_a_key() {
    let app = spawn_app_with(Backend::Sqlite, quick).await;
    create_account(&app, "alice@example.com", "customer", &["--tier", "basic"]);
    let browser = Browser::start(&app.base).await;

    browser.goto("/dashboard/login").await;
    browser.screenshot("login").await;
    sign_in(&browser, "alice@example.com", PASSWORD).await;

    // A new key, shown once.
    browser.fill(r#"input[name="name"]"#, "production").await;
    browser.submit(r#"[data-testid="create-key"]"#).await;
    let secret = browser.text(r#"[data-testid="new-key"]"#).await;
    assert!(secret.starts_with("mdr_"), "new key shown as {secret:?}");
    assert!(browser.exists(r#"[data-testid="copy-key"]"#).await);
    let id = key_id_of(&secret);
    let row = format!(r#"tr[data-key-id="{id}"]"#);
    assert_eq!(
        browser.text(&format!(r#"{row} [data-col="status"]"#)).await,
        "active"
    );
    assert_eq!(
        browser.text(&format!(r#"{row} [data-col="plan"]"#)).await,
        "basic"
    );
    browser.screenshot("keys-new-key").await;

    // The key works on the API.
    let response = app
        .moderate_text(&secret, "hello from the browser test")
        .await;
    assert_eq!(response.status(), 200);

    // The request appears in the usage chart and table once stored.
    let today = Utc::now().format("%Y-%m-%d").to_string();
    let requests_today =
        format!(r#"[data-testid="usage-table"] tr[data-day="{today}"] [data-col="requests"]"#);
    browser.goto("/dashboard/usage").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if browser.exists(&requests_today).await && browser.text(&requests_today).await == "1" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the request did not show in the usage table within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
        browser.client.refresh().await.expect("reload");
    }
    let chart = browser.find(r#"svg[data-testid="usage-chart"]"#).await;
    let label = chart
        .attr("aria-label")
        .await
        .expect("aria-label")
        .unwrap_or_default();
    assert!(
        !label.is_empty(),
        "the chart is labelled for screen readers"
    );
    // The chart draws something for today's request (a bar or point).
    let marks = browser
        .client
        .find_all(fantoccini::Locator::Css(
            r#"svg[data-testid="usage-chart"] rect, svg[data-testid="usage-chart"] path, svg[data-testid="usage-chart"] circle, svg[data-testid="usage-chart"] polyline"#,
        ))
        .await
        .expect("chart marks");
    assert!(!marks.is_empty(), "an empty chart");
    browser.screenshot("usage").await;

    browser.goto("/dashboard/plan").await;
    let plan = browser.text("body").await;
    assert!(
        plan.contains("basic") && plan.contains("60"),
        "plan page: {plan}"
    );
    browser.screenshot("plan").await;

    // Revoke through the confirmation page.
    browser.goto("/dashboard/keys").await;
    browser
        .submit(&format!(r#"{row} [data-testid="revoke-key"]"#))
        .await;
    browser
        .wait_for_path(&format!("/dashboard/keys/{id}/revoke"))
        .await;
    browser.find(r#"[data-testid="confirm-revoke"]"#).await;
    browser.screenshot("revoke-confirm").await;
    browser.submit(r#"[data-testid="confirm-revoke"]"#).await;
    browser.wait_for_path("/dashboard/keys").await;
    until_api_answers(&app, &secret, 401, Duration::from_secs(1)).await;
    assert_eq!(
        browser.text(&format!(r#"{row} [data-col="status"]"#)).await,
        "revoked"
    );
    browser.screenshot("keys-revoked").await;

    // Signed out, the pages are closed.
    browser.submit(r#"[data-testid="sign-out"]"#).await;
    browser.wait_for_path("/dashboard/login").await;
    browser.goto("/dashboard/keys").await;
    assert!(
        browser.path().await.starts_with("/dashboard/login")
            || browser.exists(r#"input[name="password"]"#).await,
        "the keys page after signing out"
    );
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_changes_a_customers_plan() {
    let app = spawn_app_with(Backend::Postgres, quick).await;
    create_account(&app, "root@example.com", "admin", &[]);
    let customer = create_account(&app, "bob@example.com", "customer", &["--tier", "free"]);
    let customer_id = customer["id"].as_str().expect("id").to_string();
    let mut bob = Session::signed_in(&app, "bob@example.com", PASSWORD).await;
    let (_, bob_key) = bob.create_key("bob's").await;
    let before = app.moderate_text(&bob_key, "hello").await;
    assert_eq!(before.headers()["x-ratelimit-limit"], "10");

    let browser = Browser::start(&app.base).await;
    sign_in(&browser, "root@example.com", PASSWORD).await;
    browser.goto("/dashboard/admin/accounts").await;
    let row = r#"tr[data-account-email="bob@example.com"]"#;
    browser.find(row).await;
    browser.screenshot("admin-accounts").await;
    browser
        .click(&format!(
            r#"{row} a[href="/dashboard/admin/accounts/{customer_id}"]"#
        ))
        .await;
    let account_path = format!("/dashboard/admin/accounts/{customer_id}");
    browser.wait_for_path(&account_path).await;
    browser.screenshot("admin-account").await;

    let tier = browser.find(r#"select[name="tier"]"#).await;
    tier.select_by_value("pro").await.expect("choose pro");
    browser.submit(r#"[data-testid="set-plan"]"#).await;
    browser.wait_for_path(&account_path).await;

    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let response = app.moderate_text(&bob_key, "hello").await;
        if response.headers()["x-ratelimit-limit"] == "300" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the customer's key still answers with limit {:?} a second after the change",
            response.headers()["x-ratelimit-limit"]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The admin makes a key for Bob: shown once, on Bob's plan, working.
    browser
        .fill(r#"input[name="name"]"#, "made by support")
        .await;
    browser.submit(r#"[data-testid="create-key"]"#).await;
    browser.wait_for_path(&format!("{account_path}/keys")).await;
    let secret = browser.text(r#"[data-testid="new-key"]"#).await;
    assert!(secret.starts_with("mdr_"), "new key shown as {secret:?}");
    assert!(browser.exists(r#"[data-testid="copy-key"]"#).await);
    let id = key_id_of(&secret);
    let key_row = format!(r#"tr[data-key-id="{id}"]"#);
    assert_eq!(
        browser
            .text(&format!(r#"{key_row} [data-col="plan"]"#))
            .await,
        "pro"
    );
    browser.screenshot("admin-account-new-key").await;
    let response = app.moderate_text(&secret, "hello").await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-ratelimit-limit"], "300");
    let bobs_page = bob.get("/dashboard/keys").await;
    assert!(key_rows(&bobs_page.body).contains_key(&id), "on Bob's page");

    // And revokes it after the confirmation page.
    browser.goto(&account_path).await;
    browser
        .submit(&format!(r#"{key_row} [data-testid="revoke-key"]"#))
        .await;
    browser
        .wait_for_path(&format!("{account_path}/keys/{id}/revoke"))
        .await;
    browser.find(r#"[data-testid="confirm-revoke"]"#).await;
    browser.screenshot("admin-revoke-confirm").await;
    browser.submit(r#"[data-testid="confirm-revoke"]"#).await;
    browser.wait_for_path(&account_path).await;
    until_api_answers(&app, &secret, 401, Duration::from_secs(1)).await;
    assert_eq!(
        browser
            .text(&format!(r#"{key_row} [data-col="status"]"#))
            .await,
        "revoked"
    );
    browser.close().await;
}

/// A page of Mallory's on another port of the dashboard's host: the same
/// site, another origin (as a sibling subdomain would be). It plants the
/// cookie of a genuine sign-in form of hers (a page there can set cookies
/// for the host, unless their name is `__Host-` over HTTPS) and posts the
/// form with her credentials, to sign the visitor in to her account.
async fn serve_mallorys_page(app: &TestApp) -> String {
    let mut mallory = Session::new(app);
    let token = mallory.get("/dashboard/login").await.csrf();
    let cookie = mallory
        .cookies
        .iter()
        .find(|(name, _)| name.ends_with("moderato_form"))
        .map(|(_, value)| value.clone())
        .expect("a form cookie");
    let html = format!(
        r#"<!DOCTYPE html><title>Win a prize</title>
<form method="post" action="{base}/dashboard/login">
<input type="hidden" name="email" value="mallory@example.com">
<input type="hidden" name="password" value="{PASSWORD}">
<input type="hidden" name="csrf_token" value="{token}">
<button type="submit" data-testid="claim">Claim your prize</button>
</form>"#,
        base = app.base
    );
    let cookies = [
        format!("moderato_form={cookie}; Path=/dashboard; SameSite=Strict"),
        format!("__Host-moderato_form={cookie}; Path=/; Secure; SameSite=Strict"),
    ];
    let page = axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let (html, cookies) = (html.clone(), cookies.clone());
            async move {
                let mut response = axum::response::Html(html).into_response();
                for cookie in cookies {
                    response.headers_mut().append(
                        axum::http::header::SET_COOKIE,
                        cookie.parse().expect("cookie header"),
                    );
                }
                response
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, page).await });
    url
}

/// Issue 26, finding 5, in Chromium: the cookies have `__Host-` names, and
/// a form posted from another origin does not sign the browser in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookies_are_host_only_and_other_origins_cannot_post() {
    let app = spawn_app_with(Backend::Sqlite, quick).await;
    create_account(&app, "alice@example.com", "customer", &["--tier", "free"]);
    create_account(&app, "mallory@example.com", "customer", &["--tier", "free"]);
    let browser = Browser::start(&app.base).await;

    sign_in(&browser, "alice@example.com", PASSWORD).await;
    let cookies = browser.client.get_all_cookies().await.expect("cookies");
    let names: Vec<String> = cookies.iter().map(|c| c.name().to_string()).collect();
    for name in ["__Host-moderato_session", "__Host-moderato_device"] {
        assert!(names.iter().any(|n| n == name), "{name} not in {names:?}");
    }
    assert!(
        names.iter().all(|n| n.starts_with("__Host-")),
        "cookies without the prefix: {names:?}"
    );
    browser.submit(r#"[data-testid="sign-out"]"#).await;
    browser.wait_for_path("/dashboard/login").await;

    let page = serve_mallorys_page(&app).await;
    browser.client.goto(&page).await.expect("Mallory's page");
    browser.submit(r#"[data-testid="claim"]"#).await;
    browser.wait_for_path("/dashboard/login").await;
    let said = browser.text("main").await;
    assert!(
        said.contains("another site"),
        "the refusal says why: {said:?}"
    );
    browser.screenshot("cross-origin-refused").await;
    browser.goto("/dashboard/keys").await;
    assert!(
        browser.path().await.starts_with("/dashboard/login"),
        "signed in to Mallory's account from her page: at {}",
        browser.path().await
    );
    browser.close().await;
}

/// Issue 26, finding 4, in Chromium: the owner changes the password on the
/// account page; the other browser signed in to the account is signed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_changes_the_password_and_other_browsers_are_signed_out() {
    let app = spawn_app_with(Backend::Postgres, quick).await;
    create_account(&app, "root@example.com", "admin", &[]);
    let alice = create_account(&app, "alice@example.com", "customer", &["--tier", "free"]);
    let mut other_browser = Session::signed_in(&app, "alice@example.com", PASSWORD).await;
    let browser = Browser::start(&app.base).await;
    sign_in(&browser, "alice@example.com", PASSWORD).await;

    browser
        .click(r#"header a[href="/dashboard/account"]"#)
        .await;
    browser.wait_for_path("/dashboard/account").await;
    browser.screenshot("account").await;
    let new_password = "a brand new passphrase";
    browser
        .fill(r#"input[name="current_password"]"#, PASSWORD)
        .await;
    browser
        .fill(r#"input[name="new_password"]"#, new_password)
        .await;
    browser.submit(r#"[data-testid="change-password"]"#).await;
    browser.wait_for_path("/dashboard/account/password").await;
    let notice = browser.text(r#"[data-testid="password-changed"]"#).await;
    assert!(notice.contains("changed"), "{notice:?}");
    browser.screenshot("account-password-changed").await;

    let page = other_browser.get("/dashboard/keys").await;
    assert_eq!(page.status, 303, "the other browser is still signed in");
    browser.goto("/dashboard/keys").await;
    assert_eq!(
        browser.path().await,
        "/dashboard/keys",
        "this browser stays"
    );

    // An admin resets it without a new one: a one-time link, and Alice's
    // sessions end.
    let mut alice_again = Session::signed_in(&app, "alice@example.com", new_password).await;
    browser.submit(r#"[data-testid="sign-out"]"#).await;
    browser.wait_for_path("/dashboard/login").await;
    sign_in(&browser, "root@example.com", PASSWORD).await;
    let alice_id = alice["id"].as_str().expect("id");
    browser
        .goto(&format!("/dashboard/admin/accounts/{alice_id}"))
        .await;
    browser.submit(r#"[data-testid="reset-password"]"#).await;
    browser
        .wait_for_path(&format!("/dashboard/admin/accounts/{alice_id}/password"))
        .await;
    let link = browser.text(r#"[data-testid="password-link"]"#).await;
    assert!(
        link.starts_with("/dashboard/set-password?token="),
        "{link:?}"
    );
    browser.screenshot("admin-password-reset").await;
    assert_eq!(alice_again.get("/dashboard/keys").await.status, 303);
    browser.close().await;
}

/// A newcomer signs up with an address, reads the link in the e-mail the
/// real SMTP server received, chooses a password there and signs in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_signs_up_through_the_emailed_link() {
    let mut mail = crate::signup::MailServer::start(false).await;
    let app = crate::signup::app_with_open_signup(Backend::Sqlite, &mail).await;
    let browser = Browser::start(&app.base).await;

    browser.goto("/dashboard/login").await;
    browser.click(r#"a[href="/dashboard/signup"]"#).await;
    browser.wait_for_path("/dashboard/signup").await;
    assert!(!browser.exists(r#"input[name="password"]"#).await);
    browser.screenshot("signup").await;
    browser
        .fill(r#"input[name="email"]"#, "erin@example.com")
        .await;
    browser.submit(r#"[data-testid="sign-up"]"#).await;
    let sent = browser.text(r#"[data-testid="sent"]"#).await;
    assert!(sent.contains("erin@example.com"), "{sent}");
    browser.screenshot("signup-sent").await;

    let message = mail.next().await;
    assert_eq!(message.to, vec!["erin@example.com".to_string()]);
    browser.goto(&message.link_path()).await;
    browser.fill(r#"input[name="password"]"#, PASSWORD).await;
    browser.screenshot("signup-set-password").await;
    browser.submit(r#"[data-testid="set-password"]"#).await;
    browser.wait_for_path("/dashboard/login").await;
    sign_in(&browser, "erin@example.com", PASSWORD).await;
    browser.close().await;
}

//! A plan's allowance belongs to its account (issue 26, finding 1): every
//! key of an account draws on the account's requests and characters per
//! minute, in process and through Redis, and the keys an account may hold
//! are capped by its plan.

use std::collections::HashMap;
use std::time::Duration;

use futures::future::join_all;
use serde_json::json;

use crate::dash_client::{create_account, moderato, Session, PASSWORD};
use crate::helpers::*;
use crate::on_both_backends;

fn header(headers: &reqwest::header::HeaderMap, name: &str) -> u64 {
    headers[name].to_str().unwrap().parse().unwrap()
}

/// A free customer account with `keys` keys made in the dashboard; returns
/// the signed-in session and the keys' secrets.
async fn free_account_with_keys(app: &TestApp, email: &str, keys: usize) -> (Session, Vec<String>) {
    create_account(app, email, "customer", &[]);
    let mut session = Session::signed_in(app, email, PASSWORD).await;
    let mut secrets = Vec::new();
    for n in 0..keys {
        secrets.push(session.create_key(&format!("key {n}")).await.1);
    }
    (session, secrets)
}

/// Sends `per_key` requests on each key at once, against `bases` in turn;
/// returns (status, headers) of each.
async fn burst_across(
    app: &TestApp,
    bases: &[String],
    keys: &[String],
    per_key: usize,
) -> Vec<(u16, reqwest::header::HeaderMap)> {
    let calls = (0..per_key).flat_map(|i| {
        keys.iter().enumerate().map(move |(k, key)| {
            let base = bases[(i + k) % bases.len()].clone();
            let client = app.client.clone();
            let key = key.clone();
            async move {
                let response = client
                    .post(format!("{base}/v1/moderate"))
                    .header("x-api-key", key)
                    .json(&json!({"input": [{"type": "text", "text": format!("message {i}")}]}))
                    .send()
                    .await
                    .unwrap();
                (response.status().as_u16(), response.headers().clone())
            }
        })
    });
    join_all(calls).await
}

fn statuses(results: &[(u16, reqwest::header::HeaderMap)]) -> HashMap<u16, usize> {
    let mut counts = HashMap::new();
    for (status, _) in results {
        *counts.entry(*status).or_default() += 1;
    }
    counts
}

/// The reproduction: 3 keys of a free account, 12 requests on each
/// at once. The plan allows 10 a minute, so 10 are accepted in all, and
/// every answer shows the account's numbers.
async fn keys_of_an_account_share_its_requests(app: TestApp, bases: Vec<String>) {
    let (_, keys) = free_account_with_keys(&app, "ada@example.com", 3).await;
    let results = burst_across(&app, &bases, &keys, 12).await;
    let counts = statuses(&results);
    assert_eq!(counts.get(&200), Some(&10), "{counts:?}");
    assert_eq!(counts.get(&429), Some(&26), "{counts:?}");
    let mut remaining: Vec<u64> = results
        .iter()
        .filter(|(status, _)| *status == 200)
        .map(|(_, h)| header(h, "x-ratelimit-remaining"))
        .collect();
    remaining.sort_unstable();
    assert_eq!(
        remaining,
        (0..10).collect::<Vec<u64>>(),
        "one count for the account"
    );
    assert!(results
        .iter()
        .all(|(_, h)| header(h, "x-ratelimit-limit") == 10));
}

async fn keys_share_requests_in_process(backend: Backend) {
    let app = spawn_app(backend).await;
    let bases = vec![app.base.clone()];
    keys_of_an_account_share_its_requests(app, bases).await;
}

async fn keys_share_requests_through_redis(backend: Backend) {
    let app = spawn_app_with(backend, |c| {
        c.redis_url = Some(moderato::config::Secret(redis_url()))
    })
    .await;
    let bases = vec![app.base.clone()];
    keys_of_an_account_share_its_requests(app, bases).await;
}

/// The characters of a request count against the account too: what one key
/// spent, another key of the account no longer has.
async fn keys_of_an_account_share_its_characters(backend: Backend, redis: bool) {
    let app = spawn_app_with(backend, |c| {
        c.budget.chars_per_minute.free = 1000;
        if redis {
            c.redis_url = Some(moderato::config::Secret(redis_url()));
        }
    })
    .await;
    let (_, keys) = free_account_with_keys(&app, "grace@example.com", 2).await;
    let (status, headers, _) = parts(app.moderate_text(&keys[0], &"a".repeat(600)).await).await;
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "x-ratelimit-remaining-characters"), 400);
    let (status, _, body) = parts(app.moderate_text(&keys[1], &"b".repeat(600)).await).await;
    assert_eq!(status, 429, "{body}");
    error_message(&body, "rate_limit_exceeded");
    let (status, headers, _) = parts(app.moderate_text(&keys[1], &"c".repeat(300)).await).await;
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "x-ratelimit-limit-characters"), 1000);
    assert!(header(&headers, "x-ratelimit-remaining-characters") < 200);
}

async fn keys_share_characters_in_process(backend: Backend) {
    keys_of_an_account_share_its_characters(backend, false).await;
}

async fn keys_share_characters_through_redis(backend: Backend) {
    keys_of_an_account_share_its_characters(backend, true).await;
}

/// A key may carry a lower limit of its own; never more than its account's.
async fn a_key_may_have_a_lower_limit_of_its_own(backend: Backend, redis: bool) {
    let app = spawn_app_with(backend, |c| {
        if redis {
            c.redis_url = Some(moderato::config::Secret(redis_url()));
        }
    })
    .await;
    let (mut session, keys) = free_account_with_keys(&app, "lin@example.com", 1).await;
    let csrf = session.csrf("/dashboard/keys").await;
    let too_high = session
        .post(
            "/dashboard/keys",
            &[
                ("name", "fast"),
                ("rpm", "11"),
                ("csrf_token", csrf.as_str()),
            ],
        )
        .await;
    assert_eq!(too_high.status, 400, "{}", too_high.body);
    let message = too_high.testid_text("error").expect("an error message");
    assert!(message.contains("10"), "{message}");

    let csrf = session.csrf("/dashboard/keys").await;
    let page = session
        .post(
            "/dashboard/keys",
            &[
                ("name", "slow"),
                ("rpm", "3"),
                ("csrf_token", csrf.as_str()),
            ],
        )
        .await;
    assert_eq!(page.status, 200, "{}", page.body);
    let slow = page.testid_text("new-key").expect("the new key");
    let mut admitted = 0;
    for _ in 0..5 {
        let response = app.moderate_text(&slow, "hello").await;
        if response.status() == 200 {
            admitted += 1;
            assert_eq!(header(response.headers(), "x-ratelimit-limit"), 3);
        }
    }
    assert_eq!(admitted, 3);
    // The account's other key still has what the slow key did not use.
    let response = app.moderate_text(&keys[0], "hello").await;
    assert_eq!(response.status(), 200);
    assert_eq!(header(response.headers(), "x-ratelimit-limit"), 10);
    assert_eq!(header(response.headers(), "x-ratelimit-remaining"), 6);
}

async fn own_lower_limit_in_process(backend: Backend) {
    a_key_may_have_a_lower_limit_of_its_own(backend, false).await;
}

async fn own_lower_limit_through_redis(backend: Backend) {
    a_key_may_have_a_lower_limit_of_its_own(backend, true).await;
}

/// Keys per account are capped by plan: the owner, an admin and the CLI are
/// all refused one more, with the limit named.
async fn keys_per_account_are_capped_by_plan(backend: Backend) {
    // The free plan's default: 3 keys.
    let app = spawn_app(backend).await;
    let (mut owner, _) = free_account_with_keys(&app, "kim@example.com", 3).await;
    let csrf = owner.csrf("/dashboard/keys").await;
    let page = owner
        .post(
            "/dashboard/keys",
            &[("name", "fourth"), ("csrf_token", csrf.as_str())],
        )
        .await;
    assert_eq!(page.status, 409, "{}", page.body);
    let message = page.testid_text("error").expect("an error message");
    assert!(
        message.contains("3 keys") && message.contains("free"),
        "{message}"
    );

    let admin = create_account(&app, "root@example.com", "admin", &[]);
    assert_eq!(admin["role"], "admin");
    let kim = app
        .store
        .account_by_email(&moderato::access::Email::parse("kim@example.com").unwrap())
        .await
        .unwrap()
        .unwrap();
    let mut root = Session::signed_in(&app, "root@example.com", PASSWORD).await;
    let path = format!("/dashboard/admin/accounts/{}", kim.id);
    let csrf = root.csrf(&path).await;
    let page = root
        .post(
            &format!("{path}/keys"),
            &[("name", "planted"), ("csrf_token", csrf.as_str())],
        )
        .await;
    assert_eq!(page.status, 409, "{}", page.body);
    let message = page.testid_text("key-error").expect("an error message");
    assert!(message.contains("3 keys"), "{message}");

    let out = moderato(
        &app,
        &[
            "keys",
            "create",
            "--name",
            "cli",
            "--account",
            "kim@example.com",
        ],
        "",
    );
    assert!(!out.success, "{}", out.stdout);
    assert!(out.stderr.contains("3 keys"), "{}", out.stderr);
    assert_eq!(app.store.account_keys(&kim.id).await.unwrap().len(), 3);

    // Revoking one makes room again.
    let id = app.store.account_keys(&kim.id).await.unwrap()[0]
        .key
        .id
        .clone();
    assert!(app.store.revoke_account_key(&kim.id, &id).await.unwrap());
    let out = moderato(
        &app,
        &[
            "keys",
            "create",
            "--name",
            "cli",
            "--account",
            "kim@example.com",
            "--json",
        ],
        "",
    );
    assert!(out.success, "{}", out.stderr);
    let created: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(created["tier"], "free");
    assert_eq!(created["rpm"], 10);
    let key = created["key"].as_str().unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(app.moderate_text(key, "hello").await.status(), 200);
}

on_both_backends!(
    keys_share_requests_in_process,
    keys_share_requests_through_redis,
    keys_share_characters_in_process,
    keys_share_characters_through_redis,
    own_lower_limit_in_process,
    own_lower_limit_through_redis,
    keys_per_account_are_capped_by_plan,
);

/// Two replicas sharing a database and Redis: an account's keys spread over
/// both still get one allowance between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_an_account_share_its_requests_across_replicas() {
    let first = spawn_app_with(Backend::Postgres, |c| {
        c.redis_url = Some(moderato::config::Secret(redis_url()))
    })
    .await;
    let (second, shutdown) = spawn_second_replica(&first).await;
    let bases = vec![first.base.clone(), second];
    keys_of_an_account_share_its_requests(first, bases).await;
    shutdown.cancel();
}

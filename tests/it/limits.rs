//! Plans and rate limits over real HTTP, in process and through Redis.

use std::collections::HashMap;
use std::time::Duration;

use futures::future::join_all;
use serde_json::json;

use crate::helpers::*;
use crate::on_both_backends;
use moderato::access::Tier;

/// Fires `n` requests at once; returns (status, headers) of each.
async fn burst(app: &TestApp, key: &str, n: usize) -> Vec<(u16, reqwest::header::HeaderMap)> {
    let calls = (0..n).map(|i| async move {
        let response = app.moderate_text(key, &format!("message number {i}")).await;
        (response.status().as_u16(), response.headers().clone())
    });
    join_all(calls).await
}

fn count(results: &[(u16, reqwest::header::HeaderMap)]) -> HashMap<u16, usize> {
    let mut counts = HashMap::new();
    for (status, _) in results {
        *counts.entry(*status).or_default() += 1;
    }
    counts
}

fn header(headers: &reqwest::header::HeaderMap, name: &str) -> u64 {
    headers[name].to_str().unwrap().parse().unwrap()
}

async fn free_plan_admits_exactly_its_burst_then_refills(backend: Backend) {
    let app = spawn_app(backend).await;
    let (_, key) = app.create_key(Tier::Free, None).await;
    let results = burst(&app, &key, 100).await;
    let counts = count(&results);
    assert_eq!(counts.get(&200), Some(&10), "{counts:?}");
    assert_eq!(counts.get(&429), Some(&90), "{counts:?}");
    let now = chrono::Utc::now().timestamp() as u64;
    for (status, headers) in &results {
        assert_eq!(header(headers, "x-ratelimit-limit"), 10);
        let reset = header(headers, "x-ratelimit-reset");
        assert!(
            reset >= now && reset <= now + 61,
            "reset {reset} vs now {now}"
        );
        if *status == 429 {
            assert_eq!(header(headers, "x-ratelimit-remaining"), 0);
            let retry = header(headers, "retry-after");
            assert!((1..=6).contains(&retry), "retry-after {retry}");
        }
    }
    let remaining: Vec<u64> = results
        .iter()
        .filter(|(s, _)| *s == 200)
        .map(|(_, h)| header(h, "x-ratelimit-remaining"))
        .collect();
    let mut sorted = remaining.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..10).collect::<Vec<u64>>(),
        "each admitted request sees one less remaining"
    );

    // One request every six seconds after that.
    tokio::time::sleep(Duration::from_millis(6_100)).await;
    assert_eq!(
        app.moderate_text(&key, "after the wait").await.status(),
        200
    );
    assert_eq!(app.moderate_text(&key, "too soon").await.status(), 429);
}

async fn enterprise_custom_limit_and_tier_change(backend: Backend) {
    let app = spawn_app(backend).await;
    let (_, enterprise) = app.create_key(Tier::Enterprise, Some(25)).await;
    let counts = count(&burst(&app, &enterprise, 40).await);
    assert_eq!(counts.get(&200), Some(&25), "{counts:?}");

    let (id, key) = app.create_key(Tier::Free, None).await;
    let counts = count(&burst(&app, &key, 15).await);
    assert_eq!(counts.get(&200), Some(&10), "{counts:?}");
    assert!(app.store.set_tier(&id, Tier::Basic, None).await.unwrap());
    tokio::time::sleep(Duration::from_millis(600)).await; // past the key cache
    let response = app.moderate_text(&key, "now on basic").await;
    assert_eq!(response.status(), 200);
    assert_eq!(header(response.headers(), "x-ratelimit-limit"), 60);
}

async fn error_responses_carry_rate_limit_headers(backend: Backend) {
    let app = spawn_app(backend).await;
    let (_, key) = app.create_key(Tier::Free, None).await;
    let (status, headers, _) = parts(app.moderate(&key, &json!({"input": []})).await).await;
    assert_eq!(status, 400);
    assert_eq!(header(&headers, "x-ratelimit-limit"), 10);
    assert_eq!(header(&headers, "x-ratelimit-remaining"), 9);
    assert!(headers.contains_key("ratelimit-policy") && headers.contains_key("ratelimit"));
}

async fn failed_authentication_is_limited_per_address(backend: Backend) {
    let app = spawn_app_with(backend, |c| c.auth.failed_auth_per_minute = 5).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(
            app.moderate_text(
                "mdr_0123456789abcdef_wrongwrongwrongwrongwrongwrongwrongwrong123",
                "x",
            )
            .await
            .status()
            .as_u16(),
        );
    }
    assert_eq!(&statuses[..5], &[401; 5]);
    assert!(statuses[5..].iter().all(|s| *s == 429), "{statuses:?}");
    // The failing address is refused with Retry-After...
    let wrong = "mdr_0123456789abcdef_wrongwrongwrongwrongwrongwrongwrongwrong123";
    let (status, headers, body) = parts(app.moderate_text(wrong, "x").await).await;
    assert_eq!(status, 429);
    error_message(&body, "rate_limit_exceeded");
    assert!(headers.contains_key("retry-after"));
    // ...but a valid key from the same address is not (issue 13, item 6).
    assert_eq!(app.moderate_text(&key, "x").await.status(), 200);
}

/// One host rotating through the addresses of its IPv6 /64 is one client
/// to the failed-key limiter (issue 26, finding 3), as it is to the
/// dashboard's sign-in lockout.
async fn failed_authentication_counts_an_ipv6_64_as_one_client(backend: Backend) {
    let app = spawn_app_with(backend, |c| {
        c.auth.failed_auth_per_minute = 5;
        c.auth.trusted_proxies =
            vec![moderato::config::IpBlock::try_from("127.0.0.1".to_string()).unwrap()];
    })
    .await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let wrong = "mdr_0123456789abcdef_wrongwrongwrongwrongwrongwrongwrongwrong123";
    let from = |key: &str, address: &str| {
        app.client
            .post(format!("{}/v1/moderate", app.base))
            .header("x-api-key", key.to_string())
            .header("x-forwarded-for", address.to_string())
            .json(&json!({"input": [{"type": "text", "text": "x"}]}))
            .send()
    };
    let mut statuses = Vec::new();
    for n in 1..=8 {
        let address = format!("2001:db8:1:2:{n:x}:{n:x}:{n:x}:{n:x}");
        statuses.push(from(wrong, &address).await.unwrap().status().as_u16());
    }
    assert_eq!(&statuses[..5], &[401; 5], "{statuses:?}");
    assert!(statuses[5..].iter().all(|s| *s == 429), "{statuses:?}");
    // Another /64 is another client; a valid key from the blocked one is served.
    let other = from(wrong, "2001:db8:1:3::1").await.unwrap();
    assert_eq!(other.status(), 401);
    let valid = from(&key, "2001:db8:1:2::abcd").await.unwrap();
    assert_eq!(valid.status(), 200);
}

on_both_backends!(
    failed_authentication_counts_an_ipv6_64_as_one_client,
    free_plan_admits_exactly_its_burst_then_refills,
    enterprise_custom_limit_and_tier_change,
    error_responses_carry_rate_limit_headers,
    failed_authentication_is_limited_per_address,
);

/// Two replicas sharing Redis and a database admit one allowance between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_sharing_redis_admit_one_allowance() {
    let first = spawn_app_with(Backend::Postgres, |c| {
        c.redis_url = Some(moderato::config::Secret(redis_url()))
    })
    .await;
    let (second_base, shutdown) = spawn_second_replica(&first).await;

    let (_, key) = first.create_key(Tier::Free, None).await;
    let calls = (0..40).map(|i| {
        let base = if i % 2 == 0 {
            first.base.clone()
        } else {
            second_base.clone()
        };
        let client = first.client.clone();
        let key = key.clone();
        async move {
            client
                .post(format!("{base}/v1/moderate"))
                .header("x-api-key", key)
                .json(&json!({"input": [{"type": "text", "text": "hello"}]}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    });
    let statuses = join_all(calls).await;
    shutdown.cancel();
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        10,
        "{statuses:?}"
    );
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 30);
}

/// Redis configured but unreachable: the service serves, limited in process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_redis_falls_back_to_the_local_limiter() {
    let app = spawn_app_with(Backend::Sqlite, |c| {
        c.redis_url = Some(moderato::config::Secret("redis://127.0.0.1:1".into()));
    })
    .await;
    let (_, key) = app.create_key(Tier::Free, None).await;
    let counts = count(&burst(&app, &key, 15).await);
    assert_eq!(counts.get(&200), Some(&10), "{counts:?}");
    assert_eq!(counts.get(&429), Some(&5), "{counts:?}");
}

//! Usage metering: one row per authenticated response, nothing lost under
//! concurrency, a database outage or a SIGTERM in the middle of a load.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use futures::future::join_all;
use serde_json::{json, Value};

use crate::child::enterprise_key;
use crate::dash_client::{create_account, usage_rows, Session, PASSWORD};
use crate::helpers::*;
use crate::on_both_backends;
use moderato::access::{KeyId, PolicyId, Tier, UsageEvent};
use moderato::store::Period;

async fn rows_equal_responses_after_a_concurrent_burst(backend: Backend) {
    let app = spawn_app(backend).await;
    let (id, key) = app.create_key(Tier::Free, None).await;
    let calls = (0..60).map(|i| {
        let key = key.clone();
        let app = &app;
        async move {
            let body = if i % 7 == 0 {
                json!({"input": []}) // a client error: metered, not billable
            } else {
                json!({"input": [{"type": "text", "text": "héllo"}, {"type": "text", "text": "world"}]})
            };
            let response = app.moderate(&key, &body).await;
            (response.status().as_u16(), response.headers()["x-request-id"].to_str().unwrap().to_string())
        }
    });
    let responses = join_all(calls).await;
    let events = app.usage_events(responses.len()).await;
    assert_eq!(events.len(), responses.len());
    let response_ids: BTreeSet<&str> = responses.iter().map(|(_, id)| id.as_str()).collect();
    let event_ids: BTreeSet<&str> = events.iter().map(|e| e.request_id.as_str()).collect();
    assert_eq!(response_ids, event_ids, "exactly one row per response");
    for event in &events {
        let status = responses
            .iter()
            .find(|(_, id)| *id == event.request_id)
            .unwrap()
            .0;
        assert_eq!(event.status, status);
        assert_eq!(event.key_id, id);
        assert_eq!(event.billable, status == 200);
        assert_eq!(event.rate_limited, status == 429);
        if status == 200 {
            assert_eq!(
                (event.text_items, event.text_chars, event.image_items),
                (2, 10, 0)
            );
        }
    }
    let admitted = responses.iter().filter(|(s, _)| *s != 429).count();
    assert_eq!(
        admitted, 10,
        "client errors count against the allowance too"
    );
}

async fn billing_query_counts_billable_units(backend: Backend) {
    let app = spawn_app(backend).await;
    let (id, key) = app.create_key(Tier::Pro, None).await;
    let (_, other) = app.create_key(Tier::Pro, None).await;
    for _ in 0..3 {
        assert_eq!(
            app.moderate(
                &key,
                &json!({"input": [{"type": "text", "text": "abc"}, {"type": "text", "text": "de"}]})
            )
            .await
            .status(),
            200
        );
    }
    assert_eq!(
        app.moderate(&key, &json!({"input": []})).await.status(),
        400
    );
    assert_eq!(app.moderate_text(&other, "x").await.status(), 200);
    app.usage_events(5).await;

    let rows = app
        .store
        .billing(Period::Day, Some(&id), None)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(row.period_start, chrono::Utc::now().date_naive());
    assert_eq!((row.requests, row.text_items, row.text_chars), (3, 6, 15));
    let month = app.store.billing(Period::Month, None, None).await.unwrap();
    assert_eq!(month.iter().map(|r| r.requests).sum::<u64>(), 4);
    let tomorrow = chrono::Utc::now().date_naive() + chrono::Days::new(1);
    assert!(app
        .store
        .billing(Period::Day, None, Some(tomorrow))
        .await
        .unwrap()
        .is_empty());

    // The CLI prints the same.
    let output = Command::new(env!("CARGO_BIN_EXE_moderato"))
        .args(["usage", "--key", id.as_str(), "--json"])
        .env("MODERATO_DATABASE_URL", &app.db.url)
        .env("MODERATO_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(printed[0]["requests"], 3);
    assert_eq!(printed[0]["text_items"], 6);
}

/// The real binary under load gets SIGTERM: every response that reached a
/// client has its row, and the process exits cleanly.
async fn sigterm_in_the_middle_of_a_load_loses_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(&db, &dir);
    let new = enterprise_key(&config, &db.url, "load", 1_000_000).await;
    let store = moderato::store::connect(&db.url).await.unwrap();

    let mut child = Command::new(env!("CARGO_BIN_EXE_moderato"))
        .arg("serve")
        .env("MODERATO_ADDR", "127.0.0.1:0")
        .env("MODERATO_METRICS_ADDR", "")
        .env("MODERATO_DATABASE_URL", &db.url)
        .env("MODERATO_AUTH__PEPPER_FILE", &config.auth.pepper_file)
        .env("MODERATO_SIGNING__KEY_FILE", &config.signing.key_file)
        .env("MODERATO_USAGE__JOURNAL_DIR", &config.usage.journal_dir)
        .env("MODERATO_MODELS_DIR", &config.models_dir)
        .env("MODERATO_LOG_FORMAT", "json")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let address = loop {
        let line = lines
            .next()
            .expect("server exited before listening")
            .unwrap();
        if let Ok(record) = serde_json::from_str::<Value>(&line) {
            if record["message"] == "moderato listening" {
                break record["address"].as_str().unwrap().to_string();
            }
        }
    };
    let log_tail = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<String>>());

    let client = reqwest::Client::new();
    let url = format!("http://{address}/v1/moderate");
    let workers = (0..8).map(|_| {
        let (client, url, key) = (client.clone(), url.clone(), new.full_key.clone());
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..400 {
                let sent = client
                    .post(&url)
                    .header("x-api-key", &key)
                    .json(&json!({"input": [{"type": "text", "text": format!("load {i}")}]}))
                    .send()
                    .await;
                match sent {
                    Ok(response) => ids.push(
                        response.headers()["x-request-id"]
                            .to_str()
                            .unwrap()
                            .to_string(),
                    ),
                    Err(_) => break, // the server has stopped accepting
                }
            }
            ids
        })
    });
    let workers: Vec<_> = workers.collect();
    tokio::time::sleep(Duration::from_millis(700)).await;
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let mut answered = BTreeSet::new();
    for worker in workers {
        answered.extend(worker.await.unwrap());
    }
    let exit = child.wait().unwrap();
    assert!(exit.success(), "clean exit after SIGTERM: {exit:?}");
    let log = log_tail.join().unwrap();
    assert!(
        log.iter().any(|l| l.contains("moderato stopped")),
        "{log:?}"
    );
    assert!(!answered.is_empty(), "the load ran before the signal");

    let events = store
        .usage_events(Some(&KeyId::parse(new.id.as_str()).unwrap()))
        .await
        .unwrap();
    let stored: BTreeSet<String> = events.into_iter().map(|e| e.request_id).collect();
    assert_eq!(
        stored, answered,
        "every answered request has exactly its row"
    );
}

on_both_backends!(
    rows_equal_responses_after_a_concurrent_burst,
    billing_query_counts_billable_units,
    sigterm_in_the_middle_of_a_load_loses_nothing,
    usage_page_csv_and_bills_count_what_the_raw_events_hold,
);

/// Figures of the usage page per day ([billable requests, items,
/// rate-limited]) and of the CSV per day and policy, counted over the raw
/// events of some keys, over the page's 30 days.
type PageFigures = BTreeMap<String, [u64; 3]>;
type CsvFigures = BTreeMap<(String, String), [u64; 3]>;

fn figures_from_raw(events: &[UsageEvent], keys: &[KeyId]) -> (PageFigures, CsvFigures) {
    let today = chrono::Utc::now().date_naive();
    let first = today - chrono::Days::new(29);
    let mut page: PageFigures = (0..30)
        .map(|i| ((first + chrono::Days::new(i)).to_string(), [0; 3]))
        .collect();
    let mut csv = CsvFigures::new();
    for e in events
        .iter()
        .filter(|e| keys.contains(&e.key_id) && e.at.date_naive() >= first)
    {
        let add = [
            u64::from(e.billable),
            if e.billable {
                u64::from(e.text_items + e.image_items)
            } else {
                0
            },
            u64::from(e.rate_limited),
        ];
        let day = e.at.date_naive().to_string();
        let policy = e
            .policy_id
            .as_ref()
            .map(|p| p.to_string())
            .unwrap_or_default();
        if e.billable || e.rate_limited {
            let row = csv.entry((day.clone(), policy)).or_default();
            for (sum, n) in row.iter_mut().zip(add) {
                *sum += n;
            }
        }
        let row = page.get_mut(&day).expect("a day of the page");
        for (sum, n) in row.iter_mut().zip(add) {
            *sum += n;
        }
    }
    // A day without traffic is one row of zeros in the CSV.
    for day in page.keys() {
        if !csv.keys().any(|(d, _)| d == day) {
            csv.insert((day.clone(), String::new()), [0; 3]);
        }
    }
    (page, csv)
}

fn csv_figures(body: &str) -> CsvFigures {
    let mut lines = body.lines();
    assert_eq!(lines.next(), Some("day,requests,items,rate_limited,policy"));
    lines
        .map(|line| {
            let f: Vec<&str> = line.split(',').collect();
            let n = |i: usize| f[i].parse::<u64>().expect("a count");
            ((f[0].to_owned(), f[4].to_owned()), [n(1), n(2), n(3)])
        })
        .collect()
}

/// The dashboard's usage page and CSV and the billing query read the hourly
/// rollups; each must give what counting the raw events gives, for a month
/// of mixed traffic (older days too, outside the page), several policies,
/// and today's requests through the API.
async fn usage_page_csv_and_bills_count_what_the_raw_events_hold(backend: Backend) {
    let app = spawn_app(backend).await;
    create_account(&app, "ada@example.com", "customer", &["--tier", "pro"]);
    let mut ada = Session::signed_in(&app, "ada@example.com", PASSWORD).await;
    let (first_id, first) = ada.create_key("first").await;
    let (second_id, _) = ada.create_key("second").await;
    let keys = [
        KeyId::parse(&first_id).unwrap(),
        KeyId::parse(&second_id).unwrap(),
    ];
    let policies = [
        None,
        PolicyId::parse("00000000-0000-4000-8000-000000000001"),
        PolicyId::parse("00000000-0000-4000-8000-000000000002"),
    ];
    let today = chrono::Utc::now().date_naive();
    let start = (today - chrono::Days::new(40))
        .and_hms_opt(0, 0, 0)
        .unwrap()
        .and_utc();
    let events: Vec<UsageEvent> = (0..600u32)
        .map(|i| {
            let billable = i % 9 != 0 && i % 13 != 0;
            UsageEvent {
                request_id: format!("seed-{i}"),
                key_id: keys[(i % 2) as usize].clone(),
                // Every 100 minutes over 41 days: the page's 30 and older ones.
                at: start + chrono::Duration::minutes(i64::from(i) * 98),
                status: if i % 9 == 0 {
                    429
                } else if i % 13 == 0 {
                    400
                } else {
                    200
                },
                text_items: 1 + i % 3,
                text_chars: u64::from(i) * 3,
                image_items: u32::from(i % 4 == 0),
                image_bytes: 0,
                deep_analyses: 0,
                flagged: i % 5 == 0,
                rate_limited: i % 9 == 0,
                billable,
                latency_ms: 10,
                endpoint: moderato::access::Endpoint::Moderate,
                policy_id: policies[(i % 3) as usize].clone(),
            }
        })
        .filter(|e| e.at < chrono::Utc::now())
        .collect();
    app.store.insert_usage(&events).await.unwrap();
    // Retried, as the writer does after a lost answer: counted once.
    app.store.insert_usage(&events[..100]).await.unwrap();
    for _ in 0..3 {
        assert_eq!(app.moderate_text(&first, "hello").await.status(), 200);
    }
    let raw = app.usage_events(events.len() + 3).await;

    for (query, keys) in [
        (String::new(), &keys[..]),
        (format!("?key={first_id}"), &keys[..1]),
        (format!("?key={second_id}"), &keys[1..]),
    ] {
        let (page, csv) = figures_from_raw(&raw, keys);
        let shown = ada.get(&format!("/dashboard/usage{query}")).await;
        assert_eq!(shown.status, 200);
        assert_eq!(usage_rows(&shown.body), page, "usage page{query}");
        let file = ada.get(&format!("/dashboard/usage.csv{query}")).await;
        assert_eq!(file.status, 200);
        assert_eq!(csv_figures(&file.body), csv, "usage.csv{query}");
    }
    for key in &keys {
        let of_key: Vec<UsageEvent> = raw.iter().filter(|e| e.key_id == *key).cloned().collect();
        for period in [Period::Day, Period::Month] {
            let bills = app.store.billing(period, Some(key), None).await.unwrap();
            let billable: Vec<&UsageEvent> = of_key.iter().filter(|e| e.billable).collect();
            assert_eq!(
                bills.iter().map(|b| b.requests).sum::<u64>(),
                billable.len() as u64
            );
            assert_eq!(
                bills.iter().map(|b| b.text_chars).sum::<u64>(),
                billable.iter().map(|e| e.text_chars).sum::<u64>()
            );
            assert_eq!(
                bills.iter().map(|b| b.rate_limited).sum::<u64>(),
                of_key.iter().filter(|e| e.rate_limited).count() as u64
            );
        }
    }
}

/// The database goes away for a while: responses keep coming (keys cached),
/// their rows are retried and all land once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_rows_survive_a_brief_database_outage() {
    let db = TestDb::new(Backend::Postgres).await;
    let proxy = Proxy::start("127.0.0.1:5432").await;
    let direct = db.url.clone();
    let dir = std::sync::Arc::new(tempfile::tempdir().unwrap());
    let mut config = test_config(&db, &dir);
    config.database_url = moderato::config::Secret(
        direct.replace("127.0.0.1:5432", &format!("127.0.0.1:{}", proxy.port)),
    );
    config.auth.key_cache_ttl_ms = 1000;
    let app = spawn_with_config(db, dir, config).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    assert_eq!(
        app.moderate_text(&key, "warm the key cache").await.status(),
        200
    );

    proxy.cut_off();
    let mut ok_ids = Vec::new();
    for i in 0..5 {
        let response = app
            .moderate_text(&key, &format!("during the outage {i}"))
            .await;
        if response.status() == 200 {
            ok_ids.push(
                response.headers()["x-request-id"]
                    .to_str()
                    .unwrap()
                    .to_string(),
            );
        }
    }
    assert!(
        !ok_ids.is_empty(),
        "cached keys keep serving while the database is away"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.restore();

    let direct_store = moderato::store::connect(&direct).await.unwrap();
    let mut stored = BTreeSet::new();
    for _ in 0..200 {
        stored = direct_store
            .usage_events(None)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.request_id)
            .collect();
        if ok_ids.iter().all(|id| stored.contains(id)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for id in &ok_ids {
        assert!(stored.contains(id), "row of {id} written after the outage");
    }
}

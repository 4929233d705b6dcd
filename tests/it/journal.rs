//! Issue 13, item 9: a response leaves only once its usage event is durable,
//! so a SIGKILL under load loses no answered request from billing.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::child::{enterprise_key, env_for, ChildServer};
use crate::helpers::*;
use crate::on_both_backends;
use moderato::access::KeyId;

async fn sigkill_under_load_loses_no_answered_request(backend: Backend) {
    let db = TestDb::new(backend).await;
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(&db, &dir);
    let mut env = env_for(&config, dir.path());
    env.push(("MODERATO_TEXT_CLASSIFIER".into(), "lexical".into()));
    let new = enterprise_key(&config, &db.url, "load", 10_000_000).await;
    let store = moderato::store::connect(&db.url).await.unwrap();

    let mut server = ChildServer::start(&env);
    let client = reqwest::Client::new();
    let url = server.url("/v1/moderate");
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let (client, url, key, stop) = (
                client.clone(),
                url.clone(),
                new.full_key.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                let mut answered = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let sent = client
                        .post(&url)
                        .header("x-api-key", &key)
                        .json(
                            &json!({"input": [{"type": "text", "text": format!("load {w} {i}")}]}),
                        )
                        .send()
                        .await;
                    match sent {
                        Ok(response) => answered.push((
                            response.status().as_u16(),
                            response.headers()["x-request-id"]
                                .to_str()
                                .unwrap()
                                .to_string(),
                        )),
                        Err(_) => break, // the server is gone
                    }
                }
                answered
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.kill_hard();
    stop.store(true, Ordering::Relaxed);
    let mut answered = BTreeSet::new();
    for worker in workers {
        for (status, id) in worker.await.unwrap() {
            assert_eq!(status, 200);
            answered.insert(id);
        }
    }
    assert!(
        answered.len() > 50,
        "the load ran: {} answered",
        answered.len()
    );

    // Restart on the same journal: what the database missed is stored now.
    let _restarted = ChildServer::start(&env);
    let key = KeyId::parse(new.id.as_str()).unwrap();
    let mut stored = BTreeSet::new();
    for _ in 0..300 {
        stored = store
            .usage_events(Some(&key))
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.request_id)
            .collect();
        if answered.is_subset(&stored) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let missing: Vec<_> = answered.difference(&stored).collect();
    assert!(
        missing.is_empty(),
        "{} of {} answered requests have no usage row: {missing:?}",
        missing.len(),
        answered.len()
    );
}

on_both_backends!(sigkill_under_load_loses_no_answered_request);

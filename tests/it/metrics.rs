//! Prometheus metrics on their own listener: the text format parses, and
//! the counters move when requests are made. The recorder is process-wide
//! and other tests' apps record into it too, so every check is a delta
//! between two scrapes that is at least what this test caused.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::helpers::*;
use crate::on_both_backends;
use moderato::access::Tier;
use moderato::moderation::Speed;

/// One scrape: each series (`name{a="x",b="y"}`, labels sorted) to its value.
pub(crate) struct Scrape(BTreeMap<String, f64>);

impl Scrape {
    pub(crate) async fn take(client: &reqwest::Client, metrics_base: &str) -> Scrape {
        let response = client
            .get(format!("{metrics_base}/metrics"))
            .send()
            .await
            .expect("scrape");
        assert_eq!(response.status(), 200);
        Scrape::parse(&response.text().await.expect("text"))
    }

    /// The Prometheus text format: `# HELP`/`# TYPE` comments, then one
    /// `name{labels} value` a line. Panics on a line that is neither.
    fn parse(text: &str) -> Scrape {
        let mut series = BTreeMap::new();
        for line in text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let (key, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad line {line:?}"));
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                other => other
                    .parse()
                    .unwrap_or_else(|_| panic!("bad value in {line:?}")),
            };
            let (name, labels) = match key.split_once('{') {
                Some((name, rest)) => {
                    let inner = rest
                        .strip_suffix('}')
                        .unwrap_or_else(|| panic!("bad labels in {line:?}"));
                    let mut labels: Vec<&str> = split_labels(inner);
                    labels.sort();
                    (name, labels.join(","))
                }
                None => (key, String::new()),
            };
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
                "bad metric name in {line:?}"
            );
            series.insert(format!("{name}{{{labels}}}"), value);
        }
        Scrape(series)
    }

    /// The sum over the series of `name` that carry every label of `labels`.
    pub(crate) fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let wanted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
        self.0
            .iter()
            .filter(|(key, _)| {
                let Some((series, rest)) = key.split_once('{') else {
                    return false;
                };
                let have: Vec<&str> = split_labels(rest.trim_end_matches('}'));
                series == name && wanted.iter().all(|w| have.contains(&w.as_str()))
            })
            .map(|(_, v)| v)
            .sum()
    }

    fn has(&self, name: &str) -> bool {
        self.0
            .keys()
            .any(|k| k.split_once('{').is_some_and(|(n, _)| n == name))
    }
}

/// `a="x",b="y,z"` into its pairs (values may hold commas).
fn split_labels(inner: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in inner.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < inner.len() {
        out.push(&inner[start..]);
    }
    out
}

async fn counters_move_when_requests_are_made(backend: Backend) {
    let (app, metrics) = spawn_app_with_metrics(backend, |_| {}).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let (_, limited) = app.create_key(Tier::Free, Some(1)).await;
    let before = Scrape::take(&app.client, &metrics).await;

    let threat = "I will kill you and your whole family";
    // The text model and its embedding cache are shared by every app in the
    // process: a text of its own makes this test's misses its own, and its
    // second sending a hit.
    let unique = format!("note {}", uuid::Uuid::new_v4().simple());
    let mut flagged_categories = 0;
    for _ in 0..2 {
        let items =
            json!({"input": [{"type": "text", "text": threat}, {"type": "text", "text": unique}]});
        let (status, _, body) = parts(app.moderate(&key, &items).await).await;
        assert_eq!(status, 200, "{body}");
        flagged_categories += body["results"][0]["categories"]
            .as_object()
            .unwrap()
            .values()
            .filter(|v| **v == Value::Bool(true))
            .count();
    }
    assert!(flagged_categories > 0, "the threat is flagged");
    let response = app
        .client
        .post(format!("{}/v1/moderations", app.base))
        .bearer_auth(&key)
        .json(&json!({"input": ["abc", "de"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let no_key = app
        .client
        .post(format!("{}/v1/moderate", app.base))
        .json(&json!({"input": [{"type": "text", "text": "x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(no_key.status(), 401);
    assert_eq!(app.moderate_text("mdr_nope", "x").await.status(), 401);
    assert_eq!(app.moderate_text(&limited, "x").await.status(), 200);
    assert_eq!(app.moderate_text(&limited, "x").await.status(), 429);
    app.usage_events(5).await;

    let after = Scrape::take(&app.client, &metrics).await;
    let moved =
        |name: &str, labels: &[(&str, &str)]| after.sum(name, labels) - before.sum(name, labels);
    let at_least = |name: &str, labels: &[(&str, &str)], expected: f64| {
        let delta = moved(name, labels);
        assert!(
            delta >= expected,
            "{name} {labels:?} moved by {delta}, expected at least {expected}"
        );
    };
    at_least(
        "moderato_http_requests_total",
        &[("route", "/v1/moderate"), ("status", "200")],
        3.0,
    );
    at_least(
        "moderato_http_requests_total",
        &[("route", "/v1/moderations"), ("status", "200")],
        1.0,
    );
    at_least(
        "moderato_http_requests_total",
        &[("route", "/v1/moderate"), ("status", "401")],
        2.0,
    );
    at_least(
        "moderato_http_requests_total",
        &[("route", "/v1/moderate"), ("status", "429")],
        1.0,
    );
    at_least(
        "moderato_http_request_duration_seconds_count",
        &[("route", "/v1/moderate")],
        6.0,
    );
    at_least(
        "moderato_http_request_duration_seconds_bucket",
        &[("route", "/v1/moderate"), ("le", "+Inf")],
        6.0,
    );
    at_least(
        "moderato_model_duration_seconds_count",
        &[("classifier", "text")],
        4.0,
    );
    at_least("moderato_items_scored_total", &[("kind", "text")], 7.0);
    at_least(
        "moderato_text_characters_scored_total",
        &[],
        (2 * (threat.chars().count() + unique.chars().count()) + 5 + 1) as f64,
    );
    at_least(
        "moderato_flagged_results_total",
        &[],
        flagged_categories as f64,
    );
    at_least(
        "moderato_rate_limited_requests_total",
        &[("tier", "free"), ("limit", "requests")],
        1.0,
    );
    at_least(
        "moderato_auth_failures_total",
        &[("reason", "missing")],
        1.0,
    );
    at_least(
        "moderato_auth_failures_total",
        &[("reason", "invalid")],
        1.0,
    );
    at_least("moderato_usage_events_journaled_total", &[], 5.0);
    at_least("moderato_usage_batches_written_total", &[], 1.0);
    // The same text twice: its chunks come from the cache the second time.
    let minilm = [("encoder", "minilm")];
    at_least("moderato_embedding_cache_hits_total", &minilm, 1.0);
    at_least("moderato_embedding_cache_misses_total", &minilm, 1.0);
    assert!(after.has("moderato_usage_queue_depth_events"));

    // Never on the API's listener.
    let (status, _, body) = parts(
        app.client
            .get(format!("{}/metrics", app.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 404, "{body}");
}

/// With the second stage on, a suspect text is counted as read again, and
/// the same text sent again comes from the second encoder's cache (the
/// recorder is shared by the tests running beside this one, so only the
/// least each counter moved is known).
async fn the_second_stage_counts_what_it_reads_again(backend: Backend) {
    let (app, metrics) =
        spawn_app_with_metrics(backend, |c| c.text_model.speed = Speed::Accurate).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let before = Scrape::take(&app.client, &metrics).await;
    // Never sent before in this process, so its first reading is encoded.
    let insult = format!(
        "kill yourself you worthless loser {}",
        uuid::Uuid::new_v4().simple()
    );
    for text in [
        insult.as_str(),
        "Can you recommend a good recipe for banana bread?",
        insult.as_str(),
    ] {
        let response = app.moderate_text(&key, text).await;
        assert_eq!(response.status(), 200);
    }
    let after = Scrape::take(&app.client, &metrics).await;
    let moved =
        |name: &str, labels: &[(&str, &str)]| after.sum(name, labels) - before.sum(name, labels);
    let name = "moderato_second_stage_texts_total";
    assert!(
        moved(name, &[]) >= 2.0,
        "{name} moved by {}",
        moved(name, &[])
    );
    let e5 = [("encoder", "e5")];
    for name in [
        "moderato_embedding_cache_misses_total",
        "moderato_embedding_cache_hits_total",
    ] {
        assert!(
            moved(name, &e5) >= 1.0,
            "{name}{{encoder=\"e5\"}} moved by {}",
            moved(name, &e5)
        );
    }
}

on_both_backends!(
    counters_move_when_requests_are_made,
    the_second_stage_counts_what_it_reads_again
);

#[test]
fn the_parser_reads_labels_with_commas_and_rejects_garbage() {
    let scrape = Scrape::parse("# TYPE x counter\nx{b=\"1,2\",a=\"y\"} 3\nx{a=\"y\"} 4\nplain 5\n");
    assert_eq!(scrape.sum("x", &[("a", "y")]), 7.0);
    assert_eq!(scrape.sum("x", &[("b", "1,2")]), 3.0);
    assert_eq!(scrape.sum("plain", &[]), 5.0);
    assert!(std::panic::catch_unwind(|| Scrape::parse("nonsense")).is_err());
}

//! `POST /v1/moderations`, OpenAI's shape over Moderato's pipeline: the
//! three input shapes give the same scores as `/v1/moderate` for the same
//! content, errors (the layers' included) come in OpenAI's error shape, the
//! usage row names its endpoint, responses are signed, and the real `openai`
//! Python SDK works against it unmodified.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::*;
use crate::images::{data_uri, png};
use crate::on_both_backends;
use moderato::access::{Endpoint, Tier};
use moderato::config::TextClassifierKind;
use moderato::store::Period;

const CATEGORIES: [&str; 11] = [
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
];
const NOT_EVALUATED: [&str; 2] = ["illicit", "illicit/violent"];

async fn moderations(app: &TestApp, key: &str, body: &Value) -> reqwest::Response {
    app.client
        .post(format!("{}/v1/moderations", app.base))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .expect("request")
}

/// Asserts OpenAI's error shape and returns `(type, code, param, message)`.
fn openai_error(body: &Value) -> (String, String, Value, String) {
    let error = body["error"]
        .as_object()
        .unwrap_or_else(|| panic!("{body}"));
    let mut keys: Vec<&str> = error.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["code", "message", "param", "type"], "{body}");
    let message = error["message"].as_str().expect("message").to_string();
    assert!(!message.is_empty());
    (
        error["type"].as_str().expect("type").to_string(),
        error["code"].as_str().expect("code").to_string(),
        error["param"].clone(),
        message,
    )
}

/// A result has all 13 categories with the right types; the two Moderato
/// does not judge are false, 0 and applied to no input type.
fn assert_result_shape(result: &Value, applied_text: bool) {
    for name in CATEGORIES {
        assert!(result["categories"][name].is_boolean(), "{name}: {result}");
        let score = result["category_scores"][name].as_f64().expect("score");
        assert!((0.0..=1.0).contains(&score), "{name}: {score}");
        let applied = result["category_applied_input_types"][name]
            .as_array()
            .expect("applied types");
        assert_eq!(applied.contains(&json!("text")), applied_text, "{name}");
    }
    for name in NOT_EVALUATED {
        assert_eq!(result["categories"][name], false, "{name}");
        assert_eq!(result["category_scores"][name], 0.0, "{name}");
        assert_eq!(result["category_applied_input_types"][name], json!([]));
    }
    assert_eq!(result["categories"].as_object().unwrap().len(), 13);
    assert_eq!(result["category_scores"].as_object().unwrap().len(), 13);
    let any_flag = CATEGORIES.iter().any(|c| result["categories"][c] == true);
    assert_eq!(result["flagged"], any_flag, "{result}");
}

/// Per category, the highest of `scores` (JSON maps of /v1/moderate).
fn max_scores(scores: &[&Value]) -> Vec<f64> {
    CATEGORIES
        .iter()
        .map(|c| {
            scores
                .iter()
                .map(|s| s[c].as_f64().unwrap())
                .fold(0.0, f64::max)
        })
        .collect()
}

fn scores_of(result: &Value) -> Vec<f64> {
    CATEGORIES
        .iter()
        .map(|c| result["category_scores"][c].as_f64().unwrap())
        .collect()
}

async fn the_three_input_shapes_score_as_moderate_does(backend: Backend) {
    let app = spawn_app_with(backend, |c| c.text_classifier = TextClassifierKind::Lexical).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let texts = [
        "I will kill you",
        "a lovely afternoon for a walk",
        "you worthless idiot",
    ];

    // One string.
    let (status, headers, body) = parts(
        moderations(
            &app,
            &key,
            &json!({"model": "omni-moderation-latest", "input": texts[0]}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["id"], headers["x-request-id"].to_str().unwrap());
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 1);
    assert_result_shape(&results[0], true);
    assert!(headers.contains_key("x-ratelimit-remaining"));
    assert!(headers.contains_key("x-ratelimit-remaining-characters"));

    // The same texts on /v1/moderate: same model, same scores per item.
    let native_items: Vec<Value> = texts
        .iter()
        .map(|t| json!({"type": "text", "text": t}))
        .collect();
    let (_, _, native) = parts(app.moderate(&key, &json!({"input": native_items})).await).await;
    assert_eq!(
        body["model"], native["model"],
        "the model is Moderato's own"
    );
    assert_eq!(
        scores_of(&results[0]),
        max_scores(&[&native["results"][0]["category_scores"]])
    );

    // An array of strings: one result each, in order. Unknown fields pass.
    let (status, _, body) = parts(
        moderations(
            &app,
            &key,
            &json!({"input": texts, "model": "x", "user": "u-1", "dimensions": {"a": 1}}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    for (i, result) in results.iter().enumerate() {
        assert_result_shape(result, true);
        assert_eq!(
            scores_of(result),
            max_scores(&[&native["results"][i]["category_scores"]]),
            "result {i} is item {i}'s"
        );
        assert_eq!(
            result["flagged"], native["results"][i]["flagged"],
            "result {i}"
        );
    }
    assert_eq!(results[0]["flagged"], true, "a plain threat is flagged");
    assert_eq!(results[1]["flagged"], false, "a harmless text is not");

    // Content parts: one result for the whole, over the texts, their
    // combination and the image.
    let picture = data_uri("image/png", &png(40, 30));
    let (status, _, body) = parts(
        moderations(
            &app,
            &key,
            &json!({"input": [
                {"type": "text", "text": "I will"},
                {"type": "image_url", "image_url": {"url": picture, "detail": "low"}},
                {"type": "text", "text": "kill you"}]}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 1, "one result for all the parts");
    assert_result_shape(&results[0], true);
    let applied = &results[0]["category_applied_input_types"];
    assert_eq!(
        applied["sexual"],
        json!(["text", "image"]),
        "the image model judges sexual"
    );
    assert_eq!(applied["violence"], json!(["text"]));
    let (_, _, native) = parts(
        app.moderate(
            &key,
            &json!({"input": [
                {"type": "text", "text": "I will"},
                {"type": "image", "base64": picture},
                {"type": "text", "text": "kill you"}]}),
        )
        .await,
    )
    .await;
    let native_scores = [
        &native["results"][0]["category_scores"],
        &native["results"][1]["category_scores"],
        &native["results"][2]["category_scores"],
        &native["combined_text"]["category_scores"],
    ];
    assert_eq!(scores_of(&results[0]), max_scores(&native_scores));
    assert_eq!(results[0]["flagged"], native["flagged"]);
}

/// Sends `body` as is (any content type) and returns status and body.
async fn post_raw(app: &TestApp, key: &str, content_type: &str, body: &str) -> (u16, Value) {
    let response = app
        .client
        .post(format!("{}/v1/moderations", app.base))
        .bearer_auth(key)
        .header("content-type", content_type)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let (status, _, body) = parts(response).await;
    (status, body)
}

async fn errors_come_in_openai_shape_with_the_same_statuses(backend: Backend) {
    let app = spawn_app_with(backend, |c| {
        c.text_classifier = TextClassifierKind::Lexical;
        c.limits.max_items = 4;
        c.limits.max_body_bytes = 4096;
    })
    .await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let url = format!("{}/v1/moderations", app.base);

    // The auth layer's refusals.
    let (status, _, body) = parts(
        app.client
            .post(&url)
            .json(&json!({"input": "hi"}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 401);
    let (kind, code, param, message) = openai_error(&body);
    assert_eq!(
        (kind.as_str(), code.as_str(), param),
        ("invalid_request_error", "missing_api_key", Value::Null)
    );
    assert!(message.contains("Authorization"), "{message}");
    let (status, _, body) =
        parts(moderations(&app, "mdr_nope", &json!({"input": "hi"})).await).await;
    assert_eq!(status, 401);
    assert_eq!(openai_error(&body).1, "invalid_api_key");
    let (status, _, body) = parts(
        app.client
            .post(&url)
            .header("authorization", format!("Basic {key}"))
            .json(&json!({"input": "hi"}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 401, "only the Bearer scheme carries a key");
    assert_eq!(openai_error(&body).1, "invalid_api_key");
    // X-API-Key works here too.
    let response = app
        .client
        .post(&url)
        .header("x-api-key", &key)
        .json(&json!({"input": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);

    // The extractor's and the pipeline's refusals, with the field as `param`.
    let cases: Vec<(Value, u16, &str, Value)> = vec![
        (
            json!({"input": [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}),
            400,
            "invalid_request",
            json!("input[0].image_url.url"),
        ),
        (
            json!({"input": ["a", {"type": "text", "text": "b"}]}),
            400,
            "invalid_request",
            json!("input"),
        ),
        (json!({"input": []}), 400, "invalid_request", json!("input")),
        (
            json!({"input": ["a", 5]}),
            400,
            "invalid_request",
            json!("input[1]"),
        ),
        (
            json!({"input": [{"type": "video", "url": "x"}]}),
            400,
            "invalid_request",
            json!("input[0].type"),
        ),
        (
            json!({"input": ["a", "b", "c", "d", "e"]}),
            413,
            "payload_too_large",
            json!("input"),
        ),
        (
            json!({"input": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,!!!"}}]}),
            400,
            "invalid_image",
            json!("input[0].image_url.url"),
        ),
    ];
    for (request, expected_status, expected_code, expected_param) in cases {
        let (status, _, body) = parts(moderations(&app, &key, &request).await).await;
        assert_eq!(status, expected_status, "{request}: {body}");
        let (kind, code, param, message) = openai_error(&body);
        assert_eq!(kind, "invalid_request_error", "{request}");
        assert_eq!(code, expected_code, "{request}");
        assert_eq!(param, expected_param, "{request}: {message}");
    }
    let (status, body) = post_raw(&app, &key, "text/plain", r#"{"input":"a"}"#).await;
    assert_eq!(
        (status, openai_error(&body).1.as_str()),
        (415, "unsupported_media_type")
    );
    let (status, body) = post_raw(
        &app,
        &key,
        "application/json",
        r#"{"input":"a","input":"b"}"#,
    )
    .await;
    assert_eq!(status, 400, "duplicate keys are refused here too");
    assert!(openai_error(&body).3.contains("duplicate key"));
    let big = json!({"input": "x".repeat(5_000)}).to_string();
    let (status, body) = post_raw(&app, &key, "application/json", &big).await;
    assert_eq!(
        (status, openai_error(&body).1.as_str()),
        (413, "payload_too_large")
    );

    // /v1/moderate keeps its own error shape.
    let (status, _, body) = parts(app.moderate(&key, &json!({"input": []})).await).await;
    assert_eq!(status, 400);
    error_message(&body, "invalid_request");
    assert!(body["error"].get("type").is_none(), "{body}");
}

async fn rate_limits_and_metering_name_the_endpoint(backend: Backend) {
    let app = spawn_app_with(backend, |c| c.text_classifier = TextClassifierKind::Lexical).await;
    let (id, key) = app.create_key(Tier::Free, Some(2)).await;
    assert_eq!(
        moderations(&app, &key, &json!({"input": ["ab", "cde"]}))
            .await
            .status(),
        200
    );
    assert_eq!(app.moderate_text(&key, "fgh").await.status(), 200);
    let response = moderations(&app, &key, &json!({"input": "ij"})).await;
    let retry_after = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .to_string();
    let (status, headers, body) = parts(response).await;
    assert_eq!(status, 429);
    assert!(retry_after.parse::<u64>().unwrap() >= 1);
    assert_eq!(headers["x-ratelimit-remaining"], "0");
    let (kind, code, _, _) = openai_error(&body);
    assert_eq!(
        (kind.as_str(), code.as_str()),
        ("rate_limit_error", "rate_limit_exceeded")
    );

    let mut events = app.usage_events(3).await;
    events.sort_by_key(|e| e.at);
    let summary: Vec<(Endpoint, u16, u32, u64, bool)> = events
        .iter()
        .map(|e| (e.endpoint, e.status, e.text_items, e.text_chars, e.billable))
        .collect();
    assert_eq!(
        summary,
        [
            (Endpoint::Moderations, 200, 2, 5, true),
            (Endpoint::Moderate, 200, 1, 3, true),
            (Endpoint::Moderations, 429, 0, 0, false),
        ]
    );
    // Billing counts both routes.
    let billing = app
        .store
        .billing(Period::Day, Some(&id), None)
        .await
        .unwrap();
    assert_eq!(
        (
            billing[0].requests,
            billing[0].text_items,
            billing[0].rate_limited
        ),
        (2, 3, 1)
    );
}

async fn responses_are_signed(backend: Backend) {
    let app = spawn_app_with(backend, |c| c.text_classifier = TextClassifierKind::Lexical).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let jwks: Value = app
        .client
        .get(format!("{}/v1/signing-keys", app.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for (key, expected) in [(key.as_str(), 200), ("mdr_nope", 401)] {
        let sent = json!({"input": "hello"});
        let request = SentRequest::post_json("/v1/moderations", &sent);
        let response = moderations(&app, key, &sent).await;
        let status = response.status().as_u16();
        assert_eq!(status, expected);
        let headers = response.headers().clone();
        let body = response.bytes().await.unwrap();
        verify_signature(&jwks, status, &headers, &body, &request)
            .unwrap_or_else(|e| panic!("{status}: {e}"));
        let mut changed = body.to_vec();
        changed.push(b' ');
        assert!(verify_signature(&jwks, status, &headers, &changed, &request).is_err());
    }
}

on_both_backends!(
    the_three_input_shapes_score_as_moderate_does,
    errors_come_in_openai_shape_with_the_same_statuses,
    rate_limits_and_metering_name_the_endpoint,
    responses_are_signed,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_never_arrives_gets_408_in_openai_shape() {
    let app = spawn_app_with(Backend::Sqlite, |c| c.server.body_read_timeout_ms = 1_000).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let address = app.base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST /v1/moderations HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"input\":"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut raw))
        .await
        .expect("answered and closed")
        .unwrap();
    let text = String::from_utf8(raw).unwrap();
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    let body: Value = serde_json::from_str(&text[text.find("\r\n\r\n").unwrap() + 4..]).unwrap();
    assert_eq!(openai_error(&body).1, "request_timeout");
}

/// A plain-HTTP image host on 127.0.0.1 that counts the connections it is
/// offered and would serve a PNG to any: the service must never connect.
async fn local_image_host() -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let image = png(8, 8);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: {}\r\n\r\n",
                image.len()
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(&image).await;
        }
    });
    (port, connections)
}

fn image_part(url: &str) -> Value {
    json!({"input": [{"type": "image_url", "image_url": {"url": url}}]})
}

/// Remote URLs while fetching is off (the default): the 400 says how to
/// send the image instead, and nothing is fetched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_image_urls_are_refused_while_fetching_is_off() {
    let app = spawn_app_with(Backend::Sqlite, |c| {
        c.text_classifier = TextClassifierKind::Lexical
    })
    .await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let (port, connections) = local_image_host().await;
    let url = format!("http://127.0.0.1:{port}/cat.png");
    let (status, _, body) = parts(moderations(&app, &key, &image_part(&url)).await).await;
    assert_eq!(status, 400, "{body}");
    let (_, code, param, message) = openai_error(&body);
    assert_eq!(
        (code.as_str(), param),
        ("invalid_request", json!("input[0].image_url.url"))
    );
    assert!(
        message.contains("send the image inline as a data URL"),
        "{message}"
    );
    assert!(message.contains("remote_images.enabled"), "{message}");
    assert_eq!(connections.load(Ordering::SeqCst), 0);
}

/// Fetching on, with loopback on the allow-list: the address rule still
/// refuses it, by name and by literal, before any connection; a host off
/// the list is refused before it is even looked up; credentials in a URL
/// are refused and never repeated; and the metric counts each by outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_image_urls_never_reach_private_addresses() {
    let (app, metrics) = spawn_app_with_metrics(Backend::Sqlite, |c| {
        c.text_classifier = TextClassifierKind::Lexical;
        c.remote_images.enabled = true;
        c.remote_images.allow_http = true;
        c.remote_images.allowed_hosts = ["127.0.0.1", "localhost"]
            .map(|h| h.to_string().try_into().unwrap())
            .to_vec();
    })
    .await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let (port, connections) = local_image_host().await;
    let scrape = || async {
        let text = app
            .client
            .get(format!("{metrics}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let count = |outcome: &str| -> f64 {
            let series = format!("moderato_remote_image_fetches_total{{outcome=\"{outcome}\"}} ");
            text.lines()
                .find_map(|line| line.strip_prefix(&series))
                .map_or(0.0, |value| value.parse().unwrap())
        };
        (
            count("not_public"),
            count("host_not_allowed"),
            count("credentials"),
        )
    };
    let before = scrape().await;

    let refused = |url: String| {
        let app = &app;
        let key = &key;
        async move {
            let (status, _, body) = parts(moderations(app, key, &image_part(&url)).await).await;
            let (kind, code, param, message) = openai_error(&body);
            assert_eq!(kind, "invalid_request_error");
            assert_eq!(param, json!("input[0].image_url.url"), "{url}");
            (status, code, message, body.to_string())
        }
    };
    for host in ["127.0.0.1", "localhost"] {
        let (status, code, message, _) = refused(format!("http://{host}:{port}/cat.png")).await;
        assert_eq!(
            (status, code.as_str()),
            (400, "invalid_image"),
            "{host}: {message}"
        );
        assert!(message.contains("not public"), "{host}: {message}");
        assert!(
            !message.contains("127.0.0.1") || host == "127.0.0.1",
            "no resolved address is told: {message}"
        );
    }

    // Not on the list: refused as such, not as unresolvable, so no look-up
    // was made (this name resolves nowhere).
    let (status, code, message, _) =
        refused("https://images.moderato-test.invalid/cat.png".into()).await;
    assert_eq!((status, code.as_str()), (400, "invalid_image"));
    assert!(
        message.contains("images.moderato-test.invalid is not on this server's list"),
        "{message}"
    );

    let (status, code, message, body) =
        refused(format!("http://admin:hunter2@localhost:{port}/cat.png")).await;
    assert_eq!((status, code.as_str()), (400, "invalid_image"));
    assert!(message.contains("user name or password"), "{message}");
    assert!(
        !body.contains("hunter2") && !body.contains("admin"),
        "{body}"
    );

    assert_eq!(
        connections.load(Ordering::SeqCst),
        0,
        "the local host saw a connection"
    );
    let after = scrape().await;
    assert!(
        after.0 - before.0 >= 2.0,
        "not_public: {before:?} -> {after:?}"
    );
    assert!(
        after.1 - before.1 >= 1.0,
        "host_not_allowed: {before:?} -> {after:?}"
    );
    assert!(
        after.2 - before.2 >= 1.0,
        "credentials: {before:?} -> {after:?}"
    );
}

/// The real `openai` package (see .ci/run for the pinned version), unmodified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_python_sdk_works_unmodified() {
    let app = spawn_app(Backend::Sqlite).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let (_, limited) = app.create_key(Tier::Free, Some(1)).await;
    let input = json!({
        "base_url": format!("{}/v1", app.base),
        "key": key,
        "bad_key": format!("mdr_{}_{}", "0".repeat(16), "a".repeat(43)),
        "limited_key": limited,
        "png_data_url": data_uri("image/png", &png(48, 32)),
    });
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_client.py");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let mut child = tokio::process::Command::new(python)
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 with the openai package (see README)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .await
        .unwrap();
    let output = tokio::time::timeout(Duration::from_secs(300), child.wait_with_output())
        .await
        .expect("the SDK run finished")
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let out: Value = serde_json::from_slice(&output.stdout).unwrap();

    let (_, _, native) = parts(
        app.moderate_text(&key, "I will find you and hurt you")
            .await,
    )
    .await;
    let single = &out["single"];
    assert_eq!(single["model"], native["model"]);
    assert!(single["id"].as_str().unwrap().starts_with("modr_"));
    assert_eq!(single["results"].as_array().unwrap().len(), 1);
    assert_result_shape(&single["results"][0], true);
    assert_eq!(
        scores_of(&single["results"][0]),
        max_scores(&[&native["results"][0]["category_scores"]])
    );
    assert_eq!(
        single["results"][0]["flagged"],
        native["results"][0]["flagged"]
    );
    assert_eq!(
        single["typed_first"]["violence_score"],
        native["results"][0]["category_scores"]["violence"],
        "the SDK's typed fields read our names"
    );

    let strings = out["strings"]["results"].as_array().unwrap();
    assert_eq!(strings.len(), 3, "one result per string");
    // In order: the first is the single text's (batched with others, the
    // encoder may differ in the last bits).
    assert_eq!(strings[0]["flagged"], single["results"][0]["flagged"]);
    for (a, b) in scores_of(&strings[0])
        .iter()
        .zip(scores_of(&single["results"][0]))
    {
        assert!((a - b).abs() < 1e-3, "{a} vs {b}");
    }
    assert_eq!(strings[1]["flagged"], false, "{}", strings[1]);

    let parts_results = out["parts"]["results"].as_array().unwrap();
    assert_eq!(parts_results.len(), 1, "one result for the parts");
    assert_eq!(
        out["parts"]["typed_first"]["sexual_applied"],
        json!(["text", "image"])
    );

    assert_eq!(out["remote_image"]["raised"], "BadRequestError");
    assert_eq!(out["remote_image"]["status"], 400);

    assert_eq!(out["bad_key"]["raised"], "AuthenticationError");
    assert_eq!(out["bad_key"]["code"], "invalid_api_key");

    assert_eq!(out["limited_first"]["raised"], Value::Null);
    assert_eq!(out["limited_second"]["raised"], "RateLimitError");
    assert_eq!(out["limited_second"]["code"], "rate_limit_exceeded");
    assert!(out["limited_second"]["retry_after"].is_string());
}

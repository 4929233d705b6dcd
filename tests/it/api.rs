//! The API contract over real HTTP: the response shape, every row of the
//! error table, the limits, and the endpoints without a key.

use serde_json::{json, Value};

use crate::helpers::*;
use crate::on_both_backends;
use moderato::access::Tier;

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

/// Every category present, booleans and scores in [0, 1].
pub fn assert_verdict_shape(verdict: &Value) {
    let categories = verdict["categories"]
        .as_object()
        .expect("categories object");
    let scores = verdict["category_scores"]
        .as_object()
        .expect("category_scores object");
    assert_eq!(categories.len(), 11, "{verdict}");
    assert_eq!(scores.len(), 11, "{verdict}");
    for name in CATEGORIES {
        assert!(categories[name].is_boolean(), "{name} in {verdict}");
        let score = scores[name].as_f64().expect("score is a number");
        assert!((0.0..=1.0).contains(&score), "{name} = {score}");
    }
    let any = categories.values().any(|v| v.as_bool() == Some(true));
    assert_eq!(
        verdict["flagged"].as_bool(),
        Some(any),
        "flagged must be true exactly when a category is: {verdict}"
    );
}

async fn success_response_has_the_documented_shape(backend: Backend) {
    let app = spawn_app(backend).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let body = json!({"input": [
        {"type": "text", "text": "Have a lovely day!"},
        {"type": "text", "text": "See you at the meeting tomorrow."}
    ]});
    let (status, headers, body) = parts(app.moderate(&key, &body).await).await;
    assert_eq!(status, 200, "{body}");
    let id = body["id"].as_str().expect("id");
    assert!(id.starts_with("modr_"));
    assert_eq!(headers["x-request-id"].to_str().unwrap(), id);
    assert!(!body["model"].as_str().unwrap().is_empty());
    let results = body["results"].as_array().expect("results");
    assert_eq!(results.len(), 2);
    for (i, result) in results.iter().enumerate() {
        assert_eq!(result["index"], i);
        assert_eq!(result["type"], "text");
        assert_verdict_shape(result);
    }
    assert_verdict_shape(&body["combined_text"]);
    assert_eq!(body["combined_text"]["items"], 2);
    let any =
        results.iter().any(|r| r["flagged"] == true) || body["combined_text"]["flagged"] == true;
    assert_eq!(body["flagged"].as_bool(), Some(any));

    // Unique per response.
    let (_, _, again) = parts(app.moderate_text(&key, "Have a lovely day!").await).await;
    assert_ne!(again["id"], body["id"]);
}

async fn authentication_errors(backend: Backend) {
    let app = spawn_app(backend).await;
    let (id, key) = app.create_key(Tier::Pro, None).await;
    let text = json!({"input": [{"type": "text", "text": "hello"}]});

    let response = app
        .client
        .post(format!("{}/v1/moderate", app.base))
        .json(&text)
        .send()
        .await
        .unwrap();
    let (status, _, body) = parts(response).await;
    assert_eq!(status, 401);
    assert!(error_message(&body, "missing_api_key").contains("X-API-Key"));

    let wrong_secret = format!("mdr_{id}_{}", "A".repeat(43));
    let unknown_id = key.replacen(id.as_str(), "0123456789abcdef", 1);
    for bad in [
        "not-a-key",
        "mdr_zz",
        unknown_id.as_str(),
        wrong_secret.as_str(),
    ] {
        let (status, _, body) = parts(app.moderate(bad, &text).await).await;
        assert_eq!(status, 401, "{bad}");
        let message = error_message(&body, "invalid_api_key");
        assert!(
            !message.contains(bad),
            "the presented key must not be echoed"
        );
    }
    let (status, _, _) = parts(app.moderate(&key, &text).await).await;
    assert_eq!(status, 200);
}

async fn request_errors_name_what_to_fix(backend: Backend) {
    let app = spawn_app(backend).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let post_raw = |body: &'static [u8], content_type: Option<&'static str>| {
        let mut request = app
            .client
            .post(format!("{}/v1/moderate", app.base))
            .header("x-api-key", &key)
            .body(body);
        if let Some(ct) = content_type {
            request = request.header("content-type", ct);
        }
        request.send()
    };

    let (status, _, body) = parts(
        post_raw(b"{not json", Some("application/json"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 400);
    assert!(error_message(&body, "invalid_request").contains("not valid JSON"));

    // Faults inside an item's string keep the parser's words and the item.
    for (raw, says) in [
        (
            &b"{\"input\":[{\"type\":\"text\",\"text\":\"\xff\xfe\"}]}"[..],
            "UTF-8",
        ),
        (
            &br#"{"input":[{"type":"text","text":"\ud800"}]}"#[..],
            "escape",
        ),
    ] {
        let (status, _, body) = parts(post_raw(raw, Some("application/json")).await.unwrap()).await;
        assert_eq!(status, 400, "{body}");
        let message = error_message(&body, "invalid_request");
        assert!(
            message.contains("input[0]") && message.contains(says),
            "{message}"
        );
    }

    let (status, _, body) = parts(
        post_raw(br#"{"input":[]}"#, Some("text/plain"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 415);
    assert!(error_message(&body, "unsupported_media_type").contains("application/json"));
    let (status, _, _) = parts(post_raw(br#"{"input":[]}"#, None).await.unwrap()).await;
    assert_eq!(status, 415);

    let cases: Vec<(Value, &str)> = vec![
        (json!({}), "input"),
        (json!({"input": "hello"}), "input"),
        (json!({"input": []}), "input"),
        (
            json!({"input": [{"type": "video", "url": "x"}]}),
            "input[0]",
        ),
        (json!({"input": [{"type": "text"}]}), "input[0]"),
        (
            json!({"input": [{"type": "text", "text": "a"}, {"type": "text", "text": 5}]}),
            "input[1].text",
        ),
        (
            json!({"input": [{"type": "text", "text": "a"}], "analyze_images": "yes"}),
            "analyze_images",
        ),
        (
            json!({"input": [{"type": "text", "text": "a"}], "analyse_images": true}),
            "analyse_images",
        ),
        (json!([1, 2]), "JSON object"),
    ];
    for (request, names) in cases {
        let (status, _, body) = parts(app.moderate(&key, &request).await).await;
        assert_eq!(status, 400, "{request} → {body}");
        let message = error_message(&body, "invalid_request");
        assert!(
            message.contains(names),
            "{request}: message {message:?} should name {names}"
        );
    }

    let (status, _, body) =
        parts(app.moderate(&key, &json!({"input": [{"type": "text", "text": "a"}, {"type": "image", "base64": "not a data uri"}]})).await)
            .await;
    assert_eq!(status, 400, "{body}");
    assert!(error_message(&body, "invalid_image").contains("input[1].base64"));
}

async fn limits_give_payload_too_large(backend: Backend) {
    let app = spawn_app_with(backend, |c| c.limits.max_body_bytes = 200_000).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;

    let big = "a".repeat(250_000);
    let (status, _, body) = parts(app.moderate_text(&key, &big).await).await;
    assert_eq!(status, 413);
    assert!(error_message(&body, "payload_too_large").contains("200000 bytes"));

    let long = "word ".repeat(6_401); // 32,005 characters
    let (status, _, body) = parts(app.moderate_text(&key, &long).await).await;
    assert_eq!(status, 413);
    assert!(error_message(&body, "payload_too_large").contains("input[0].text"));

    let many: Vec<Value> = (0..65)
        .map(|_| json!({"type": "text", "text": "hi"}))
        .collect();
    let (status, _, body) = parts(app.moderate(&key, &json!({ "input": many })).await).await;
    assert_eq!(status, 413);
    assert!(error_message(&body, "payload_too_large").contains("64"));

    let images: Vec<Value> = (0..9)
        .map(|_| json!({"type": "image", "base64": "data:image/png;base64,AAAA"}))
        .collect();
    let (status, _, body) = parts(app.moderate(&key, &json!({ "input": images })).await).await;
    assert_eq!(status, 413);
    assert!(error_message(&body, "payload_too_large").contains("input[8]"));

    // Exactly at the limits is fine.
    let at_limit = "a".repeat(32_000);
    let (status, _, _) = parts(app.moderate_text(&key, &at_limit).await).await;
    assert_eq!(status, 200);
}

async fn unknown_paths_and_methods(backend: Backend) {
    let app = spawn_app(backend).await;
    let (status, _, body) = parts(
        app.client
            .get(format!("{}/v2/nothing", app.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 404);
    assert!(error_message(&body, "not_found").contains("/v2/nothing"));
    let (status, _, body) = parts(
        app.client
            .get(format!("{}/v1/moderate", app.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 405);
    assert!(error_message(&body, "method_not_allowed").contains("GET"));
}

async fn health_ready_keys_and_openapi(backend: Backend) {
    let app = spawn_app(backend).await;
    let (status, _, body) = parts(
        app.client
            .get(format!("{}/health", app.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, body["status"].as_str()), (200, Some("ok")));
    let (status, _, _) = parts(
        app.client
            .get(format!("{}/ready", app.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200);

    let (status, _, jwks) = parts(
        app.client
            .get(format!("{}/v1/signing-keys", app.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    let key = &jwks["keys"][0];
    assert_eq!(
        (key["kty"].as_str(), key["crv"].as_str()),
        (Some("OKP"), Some("Ed25519"))
    );
    assert_eq!(key["x"].as_str().unwrap().len(), 43, "32 bytes, base64url");

    let (status, _, doc) = parts(
        app.client
            .get(format!("{}/v1/openapi.json", app.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let operation = &doc["paths"]["/v1/moderate"]["post"];
    assert!(operation.is_object());
    for code in ["200", "400", "401", "413", "415", "429", "503"] {
        assert!(
            operation["responses"][code].is_object(),
            "OpenAPI documents {code}"
        );
    }
}

async fn internal_errors_hide_internals(backend: Backend) {
    let app = spawn_app(backend).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    // Something unexpected: the tables are gone.
    match backend {
        Backend::Sqlite => {
            let pool = sqlx::SqlitePool::connect(&app.db.url).await.unwrap();
            sqlx::raw_sql("DROP VIEW IF EXISTS usage_billing_daily; DROP TABLE usage_events; DROP TABLE api_keys")
                .execute(&pool)
                .await
                .unwrap();
        }
        Backend::Postgres => {
            let pool = sqlx::PgPool::connect(&app.db.url).await.unwrap();
            sqlx::raw_sql("DROP TABLE usage_events CASCADE; DROP TABLE api_keys CASCADE")
                .execute(&pool)
                .await
                .unwrap();
        }
    }
    tokio::time::sleep(std::time::Duration::from_millis(600)).await; // past the key cache
    let (status, _, body) = parts(app.moderate_text(&key, "hello").await).await;
    assert_eq!(status, 500, "{body}");
    let message = error_message(&body, "internal_error");
    for internal in ["api_keys", "relation", "table", "sql", "postgres"] {
        assert!(!message.to_lowercase().contains(internal), "{message}");
    }
}

on_both_backends!(
    success_response_has_the_documented_shape,
    authentication_errors,
    request_errors_name_what_to_fix,
    limits_give_payload_too_large,
    unknown_paths_and_methods,
    health_ready_keys_and_openapi,
    internal_errors_hide_internals,
);

/// PostgreSQL behind a proxy that the test cuts off: 503, then recovery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_unreachable_is_503_then_recovers() {
    let db = TestDb::new(Backend::Postgres).await;
    let proxy = Proxy::start("127.0.0.1:5432").await;
    let proxied = db
        .url
        .replace("127.0.0.1:5432", &format!("127.0.0.1:{}", proxy.port));
    let dir = std::sync::Arc::new(tempfile::tempdir().unwrap());
    let mut config = test_config(&db, &dir);
    config.database_url = moderato::config::Secret(proxied);
    let app = spawn_with_config(db, dir, config).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let (status, _, _) = parts(app.moderate_text(&key, "hello").await).await;
    assert_eq!(status, 200);

    proxy.cut_off();
    tokio::time::sleep(std::time::Duration::from_millis(600)).await; // past the key cache
    let (status, headers, body) = parts(app.moderate_text(&key, "hello").await).await;
    assert_eq!(status, 503, "{body}");
    let message = error_message(&body, "service_unavailable");
    assert!(!message.contains("postgres"), "{message}");
    assert!(headers.contains_key("retry-after"));
    let (status, _, _) = parts(
        app.client
            .get(format!("{}/ready", app.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 503);

    proxy.restore();
    let mut recovered = false;
    for _ in 0..100 {
        if app.moderate_text(&key, "hello").await.status() == 200 {
            recovered = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(recovered, "the service recovers once the database is back");
}

/// The text model over HTTP: a threat split across items (even inside a
/// word) is caught by `combined_text`; the parts alone are harmless; an
/// alarming word in a harmless question is not flagged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn combined_text_catches_what_only_shows_across_items() {
    let app = spawn_app(Backend::Sqlite).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let threat_categories = ["violence", "harassment/threatening", "harassment"];
    let flagged_threat = |verdict: &Value| {
        threat_categories
            .iter()
            .any(|c| verdict["categories"][c] == true)
    };

    // Neither fragment threatens anyone on its own ("I know where you live"
    // would: it is intimidation by itself, and the model flags it).
    let split = json!({"input": [
        {"type": "text", "text": "After the meeting tonight I am going to ki"},
        {"type": "text", "text": "ll you"},
    ]});
    let (status, _, body) = parts(app.moderate(&key, &split).await).await;
    assert_eq!(status, 200);
    assert!(flagged_threat(&body["combined_text"]), "{body}");
    assert_eq!(
        body["combined_text"]["categories"]["harassment/threatening"], true,
        "{body}"
    );
    assert_eq!(body["flagged"], true);
    for part in 0..2 {
        assert!(
            !flagged_threat(&body["results"][part]),
            "the threat shows only across items: {body}"
        );
    }

    let (_, _, body) = parts(
        app.moderate_text(&key, "How do I kill a Python process that hangs?")
            .await,
    )
    .await;
    assert_eq!(body["flagged"], false, "{body}");
}

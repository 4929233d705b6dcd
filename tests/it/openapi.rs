//! The OpenAPI document against the service: the committed copy is the
//! generated one, and real responses (successes and every error a route can
//! give) have a documented status, content type, schema and headers.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::*;
use crate::images::{data_uri, png};
use crate::on_both_backends;
use moderato::access::Tier;

const COMMITTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json");

/// A reviewer sees API changes in the diff of `docs/openapi.json`.
/// `MODERATO_BLESS=1` rewrites the copy instead of failing.
#[test]
fn the_committed_copy_is_the_generated_document() {
    let generated = format!("{}\n", moderato::http::openapi::json());
    if std::env::var_os("MODERATO_BLESS").is_some() {
        std::fs::write(COMMITTED, &generated).expect("write docs/openapi.json");
        return;
    }
    let committed = std::fs::read_to_string(COMMITTED).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/openapi.json differs from the document the code generates; review the change and run \
         `MODERATO_BLESS=1 cargo test --test it openapi::the_committed_copy` to update it"
    );
}

/// Every error code the routes declare is a code of the error table with
/// its status documented, and the error object's `code` enum is the table.
#[test]
fn every_declared_error_is_documented_with_its_status() {
    let doc = document();
    let codes: Vec<&str> = doc["components"]["schemas"]["ErrorCode"]["enum"]
        .as_array()
        .expect("ErrorCode enum")
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    let table: Vec<&str> = moderato::http::error::ErrorCode::ALL
        .iter()
        .map(|c| c.as_str())
        .collect();
    assert_eq!(codes, table);
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            for code in moderato::http::openapi::route_errors(method, path) {
                let response = &operation["responses"][code.status().as_str()];
                let description = response["description"].as_str().unwrap_or_default();
                assert!(
                    description.contains(&format!("`{}`", code.as_str())),
                    "{method} {path}: {} is not documented: {response}",
                    code.as_str()
                );
                assert_eq!(
                    response["content"]["application/json"]["schema"]["$ref"],
                    format!(
                        "#/components/schemas/{}",
                        moderato::http::openapi::error_schema(path)
                    )
                );
            }
        }
    }
}

/// What one request got, as the conformance check needs it.
struct Seen {
    method: &'static str,
    path: &'static str,
    status: u16,
    headers: Vec<(String, String)>,
    body: Value,
}

impl Seen {
    async fn of(method: &'static str, path: &'static str, response: reqwest::Response) -> Seen {
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
            .collect();
        let bytes = response.bytes().await.expect("body");
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| panic!("{method} {path} {status}: body is not JSON: {bytes:?}"));
        Seen {
            method,
            path,
            status,
            headers,
            body,
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The headers the service adds on purpose: each must be documented on the
/// response that carries it (transport headers such as `date` are not).
const API_HEADERS: &[&str] = &[
    "x-request-id",
    "content-digest",
    "signature-input",
    "signature",
    "x-client-nonce",
    "retry-after",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "x-ratelimit-limit-characters",
    "x-ratelimit-remaining-characters",
    "ratelimit-policy",
    "ratelimit",
];

/// Asserts `seen` is what the document promises for its operation and
/// status, and returns the status for the coverage check.
fn assert_documented(doc: &Value, seen: &Seen) -> u16 {
    let what = format!("{} {} {}", seen.method, seen.path, seen.status);
    let operation = &doc["paths"][seen.path][seen.method];
    assert!(operation.is_object(), "{what}: no such operation");
    let response = &operation["responses"][seen.status.to_string()];
    assert!(
        response.is_object(),
        "{what}: status not documented; body {}",
        seen.body
    );
    let content_type = seen.header("content-type").expect("content-type");
    let schema = &response["content"][content_type]["schema"];
    assert!(
        schema.is_object(),
        "{what}: content type {content_type} not documented"
    );
    if let Err(problem) = validate(doc, schema, &seen.body, "body") {
        panic!("{what}: {problem}\nbody: {}", seen.body);
    }
    let documented = response["headers"].as_object().cloned().unwrap_or_default();
    for &name in API_HEADERS {
        let Some(value) = seen.header(name) else {
            continue;
        };
        let header = documented
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, h)| h)
            .unwrap_or_else(|| panic!("{what}: header {name} is sent but not documented"));
        if header["schema"]["type"] == "integer" {
            assert!(value.parse::<u64>().is_ok(), "{what}: {name}: {value}");
        }
    }
    seen.status
}

fn document() -> Value {
    serde_json::from_str(moderato::http::openapi::json()).expect("the document is JSON")
}

async fn get(app: &TestApp, path: &'static str) -> Seen {
    let response = app
        .client
        .get(format!("{}{path}", app.base))
        .send()
        .await
        .expect("request");
    Seen::of("get", path, response).await
}

async fn moderate(app: &TestApp, key: Option<&str>, body: &Value) -> Seen {
    let mut request = app.client.post(format!("{}/v1/moderate", app.base));
    if let Some(key) = key {
        request = request.header("x-api-key", key);
    }
    let response = request.json(body).send().await.expect("request");
    Seen::of("post", "/v1/moderate", response).await
}

async fn moderations(app: &TestApp, key: Option<&str>, body: &Value) -> Seen {
    let mut request = app.client.post(format!("{}/v1/moderations", app.base));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.json(body).send().await.expect("request");
    Seen::of("post", "/v1/moderations", response).await
}

async fn moderate_raw(app: &TestApp, key: &str, content_type: &str, body: &'static str) -> Seen {
    let response = app
        .client
        .post(format!("{}/v1/moderate", app.base))
        .header("x-api-key", key)
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .expect("request");
    Seen::of("post", "/v1/moderate", response).await
}

/// A request whose body stops arriving: answered 408 once the body's
/// deadline passes. Raw TCP, since an HTTP client sends whole bodies.
async fn stalled_body(app: &TestApp, key: &str) -> Seen {
    let address = app.base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST /v1/moderate HTTP/1.1\r\nHost: test\r\nX-API-Key: {key}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"input\":"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut raw))
        .await
        .expect("answered and closed")
        .expect("read");
    let text = String::from_utf8(raw).expect("UTF-8 response");
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Seen {
        method: "post",
        path: "/v1/moderate",
        status,
        headers,
        body: serde_json::from_str(body).expect("JSON body"),
    }
}

/// Drives every route to each answer it can give without breaking the
/// storage, then with the storage broken (500), and checks each response
/// against the document. For `/v1/moderate` the statuses seen must be
/// exactly the documented ones (503 is the Postgres-only test below).
async fn every_answer_conforms_to_the_document(backend: Backend) {
    let app = spawn_app_with(backend, |c| c.server.body_read_timeout_ms = 1_000).await;
    let doc = document();
    let served = get(&app, "/v1/openapi.json").await;
    assert_eq!(served.body, doc, "the served document is the generated one");
    let (_, key) = app.create_key(Tier::Enterprise, Some(10_000)).await;
    let (_, slow_key) = app.create_key(Tier::Enterprise, Some(1)).await;
    let image = data_uri("image/png", &png(32, 32));
    let many: Vec<Value> = (0..=app.config.limits.max_items)
        .map(|_| json!({"type": "text", "text": "hi"}))
        .collect();

    let mut seen = vec![
        get(&app, "/health").await,
        get(&app, "/ready").await,
        get(&app, "/v1/signing-keys").await,
        served,
        moderate(
            &app,
            Some(&key),
            &json!({"input": [{"type": "text", "text": "hello"}]}),
        )
        .await,
        moderate(
            &app,
            Some(&key),
            &json!({"input": [
                {"type": "text", "text": "I will hurt you"},
                {"type": "text", "text": "see you"},
                {"type": "image", "base64": image},
            ], "analyze_images": true}),
        )
        .await,
        // Explanations, on items, on the combined text and split across items.
        moderate(
            &app,
            Some(&key),
            &json!({"input": [
                {"type": "text", "text": "After the meeting tonight I am going to ki"},
                {"type": "text", "text": "ll you"},
                {"type": "text", "text": "I will m*rder you"},
                {"type": "image", "base64": image},
            ], "explain": true}),
        )
        .await,
        moderate(&app, None, &json!({"input": []})).await,
        moderate(&app, Some("mk_nope"), &json!({"input": []})).await,
        moderate(&app, Some(&key), &json!({"input": []})).await,
        moderate(
            &app,
            Some(&key),
            &json!({"input": [{"type": "image", "base64": "AAAA"}]}),
        )
        .await,
        moderate(&app, Some(&key), &json!({ "input": many })).await,
        moderate_raw(&app, &key, "text/plain", "{}").await,
        moderate_raw(&app, &key, "application/json", "{nope").await,
        stalled_body(&app, &key).await,
        moderations(
            &app,
            Some(&key),
            &json!({"input": "hello", "model": "omni-moderation-latest"}),
        )
        .await,
        moderations(&app, Some(&key), &json!({"input": ["a", "b"]})).await,
        moderations(
            &app,
            Some(&key),
            &json!({"input": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": image}},
            ]}),
        )
        .await,
        moderations(&app, None, &json!({"input": "x"})).await,
        moderations(&app, Some(&key), &json!({"input": []})).await,
        moderate(
            &app,
            Some(&slow_key),
            &json!({"input": [{"type": "text", "text": "a"}]}),
        )
        .await,
        moderate(
            &app,
            Some(&slow_key),
            &json!({"input": [{"type": "text", "text": "b"}]}),
        )
        .await,
    ];
    let combined = &seen[5].body;
    assert!(combined["combined_text"].is_object(), "{combined}");
    assert!(
        combined["results"][2]["image_analysis"].is_object(),
        "{combined}"
    );

    break_storage(&app, backend).await;
    tokio::time::sleep(Duration::from_millis(600)).await; // past the key cache
    seen.push(
        moderate(
            &app,
            Some(&key),
            &json!({"input": [{"type": "text", "text": "x"}]}),
        )
        .await,
    );

    let mut statuses = BTreeSet::new();
    for response in &seen {
        let status = assert_documented(&doc, response);
        if response.path == "/v1/moderate" {
            statuses.insert(status.to_string());
        }
    }
    let documented: BTreeSet<String> = doc["paths"]["/v1/moderate"]["post"]["responses"]
        .as_object()
        .unwrap()
        .keys()
        .filter(|s| s.as_str() != "503")
        .cloned()
        .collect();
    assert_eq!(statuses, documented, "statuses seen vs documented");
}

async fn break_storage(app: &TestApp, backend: Backend) {
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
}

on_both_backends!(every_answer_conforms_to_the_document);

/// The storage out of reach: `/v1/moderate` and `/ready` answer 503 as
/// documented, with `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_unreachable_answers_conform_to_the_document() {
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
    proxy.cut_off();
    tokio::time::sleep(Duration::from_millis(600)).await; // past the key cache
    let doc = document();
    for seen in [
        moderate(
            &app,
            Some(&key),
            &json!({"input": [{"type": "text", "text": "x"}]}),
        )
        .await,
        get(&app, "/ready").await,
    ] {
        assert_eq!(assert_documented(&doc, &seen), 503, "{}", seen.body);
        assert!(seen.header("retry-after").is_some());
    }
    proxy.restore();
}

// --- a JSON Schema check of the subset the document uses ---------------------

/// Checks `value` against `schema`, resolving `$ref`s in `doc`. Keywords it
/// does not know fail the check rather than pass unseen.
fn validate(doc: &Value, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    let object = schema
        .as_object()
        .ok_or_else(|| format!("{at}: schema is not an object"))?;
    for (keyword, rule) in object {
        match keyword.as_str() {
            "$ref" => {
                let name = rule
                    .as_str()
                    .and_then(|r| r.strip_prefix("#/components/schemas/"))
                    .ok_or_else(|| format!("{at}: unsupported $ref {rule}"))?;
                validate(doc, &doc["components"]["schemas"][name], value, at)?;
            }
            "type" => {
                let types: Vec<&str> = match rule {
                    Value::String(t) => vec![t.as_str()],
                    Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
                    _ => return Err(format!("{at}: bad type {rule}")),
                };
                if !types.iter().any(|t| has_type(value, t)) {
                    return Err(format!("{at}: {value} is not of type {rule}"));
                }
            }
            "enum" => {
                if !rule.as_array().is_some_and(|values| values.contains(value)) {
                    return Err(format!("{at}: {value} is not one of {rule}"));
                }
            }
            "required" => {
                for name in rule.as_array().into_iter().flatten() {
                    let name = name.as_str().unwrap_or_default();
                    if value.as_object().is_some_and(|o| !o.contains_key(name)) {
                        return Err(format!("{at}: required property {name} is missing"));
                    }
                }
            }
            "properties" => {
                let Some(fields) = value.as_object() else {
                    continue;
                };
                for (name, field) in fields {
                    if let Some(property) = rule.get(name) {
                        validate(doc, property, field, &format!("{at}.{name}"))?;
                    }
                }
            }
            "additionalProperties" => {
                let Some(fields) = value.as_object() else {
                    continue;
                };
                let known = object.get("properties");
                for (name, field) in fields {
                    if known.is_some_and(|p| p.get(name).is_some()) {
                        continue;
                    }
                    match rule {
                        Value::Bool(true) => {}
                        Value::Bool(false) => {
                            return Err(format!("{at}: property {name} is not documented"))
                        }
                        schema => validate(doc, schema, field, &format!("{at}.{name}"))?,
                    }
                }
            }
            "propertyNames" => {
                for name in value.as_object().into_iter().flatten().map(|(k, _)| k) {
                    validate(
                        doc,
                        rule,
                        &Value::String(name.clone()),
                        &format!("{at} key {name}"),
                    )?;
                }
            }
            "items" => {
                for (i, item) in value.as_array().into_iter().flatten().enumerate() {
                    validate(doc, rule, item, &format!("{at}[{i}]"))?;
                }
            }
            "minimum" | "maximum" => {
                let (Some(number), Some(bound)) = (value.as_f64(), rule.as_f64()) else {
                    continue;
                };
                let outside = if keyword == "minimum" {
                    number < bound
                } else {
                    number > bound
                };
                if outside {
                    return Err(format!("{at}: {number} is beyond the {keyword} {bound}"));
                }
            }
            "minItems" => {
                let length = value.as_array().map_or(usize::MAX, Vec::len);
                if (length as u64) < rule.as_u64().unwrap_or(0) {
                    return Err(format!("{at}: fewer than {rule} items"));
                }
            }
            "oneOf" => {
                let matching = rule
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|s| validate(doc, s, value, at).is_ok())
                    .count();
                if matching != 1 {
                    return Err(format!("{at}: {value} matches {matching} of oneOf {rule}"));
                }
            }
            "description" | "example" | "examples" | "title" | "default" | "format" => {}
            other => return Err(format!("{at}: the check does not know the keyword {other}")),
        }
    }
    Ok(())
}

fn has_type(value: &Value, name: &str) -> bool {
    match name {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        "number" => value.is_number(),
        "integer" => value.is_i64() || value.is_u64(),
        _ => false,
    }
}

#[test]
fn the_schema_check_refuses_what_it_should() {
    let doc = document();
    let error = json!({"$ref": "#/components/schemas/ErrorBody"});
    let good = json!({"error": {"code": "not_found", "message": "no such endpoint: /x"}});
    assert_eq!(validate(&doc, &error, &good, "body"), Ok(()));
    for bad in [
        json!({"error": {"code": "no_such_code", "message": "m"}}),
        json!({"error": {"code": "not_found"}}),
        json!({"error": {"code": "not_found", "message": 5}}),
        json!({"error": "text"}),
    ] {
        assert!(validate(&doc, &error, &bad, "body").is_err(), "{bad}");
    }
    let scores = json!({"$ref": "#/components/schemas/CategoryScores"});
    let mut all: serde_json::Map<String, Value> = moderato::moderation::Category::ALL
        .iter()
        .map(|c| (c.as_str().to_owned(), json!(0.5)))
        .collect();
    assert_eq!(
        validate(&doc, &scores, &Value::Object(all.clone()), "s"),
        Ok(())
    );
    all.insert("illicit".into(), json!(0.0));
    assert!(validate(&doc, &scores, &Value::Object(all.clone()), "s").is_err());
    all.remove("illicit");
    all.insert("hate".into(), json!(1.5));
    assert!(validate(&doc, &scores, &Value::Object(all), "s").is_err());
}

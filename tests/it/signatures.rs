//! Every response is signed; an independent verifier (Python's
//! `cryptography`) accepts them and refuses a changed body or status.

use serde_json::{json, Value};

use crate::helpers::*;
use crate::on_both_backends;
use moderato::access::Tier;

async fn jwks(app: &TestApp) -> Value {
    app.client
        .get(format!("{}/v1/signing-keys", app.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// A request `body` to `/v1/moderate` with `key`, and the request as its
/// verifier knows it.
async fn moderate(app: &TestApp, key: &str, body: Value) -> (reqwest::Response, SentRequest) {
    let response = app.moderate(key, &body).await;
    (response, SentRequest::post_json("/v1/moderate", &body))
}

async fn get(app: &TestApp, path: &str) -> (reqwest::Response, SentRequest) {
    let response = app
        .client
        .get(format!("{}{path}", app.base))
        .send()
        .await
        .unwrap();
    (response, SentRequest::get(path))
}

fn text_input(text: &str) -> Value {
    json!({"input": [{"type": "text", "text": text}]})
}

async fn success_and_error_responses_verify(backend: Backend) {
    let app = spawn_app(backend).await;
    let jwks = jwks(&app).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let requests = vec![
        moderate(&app, &key, text_input("hello there")).await, // 200
        moderate(&app, "mdr_nope", text_input("hello")).await, // 401
        moderate(&app, &key, json!({"input": []})).await,      // 400
        get(&app, "/nowhere").await,                           // 404
        get(&app, "/v1/signing-keys").await,                   // 200, no key
    ];
    for (response, request) in requests {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.bytes().await.unwrap();
        for name in [
            "signature",
            "signature-input",
            "content-digest",
            "x-request-id",
        ] {
            assert!(headers.contains_key(name), "{status}: {name} missing");
        }
        verify_signature(&jwks, status, &headers, &body, &request)
            .unwrap_or_else(|e| panic!("{status}: {e}"));

        let mut changed = body.to_vec();
        changed.push(b' ');
        assert!(
            verify_signature(&jwks, status, &headers, &changed, &request).is_err(),
            "a changed body must fail"
        );
        assert!(
            verify_signature(
                &jwks,
                if status == 200 { 201 } else { 200 },
                &headers,
                &body,
                &request
            )
            .is_err(),
            "a changed status must fail"
        );
    }
}

/// Issue 26, finding 2: a genuine `flagged: false` answer to a harmless
/// request, kept by someone on the path, does not verify as the answer to a
/// harmful request, nor to the same body sent elsewhere, nor to a request
/// with another nonce.
async fn a_response_answers_only_its_own_request(backend: Backend) {
    let app = spawn_app_with(backend, |c| {
        c.text_classifier = moderato::config::TextClassifierKind::Lexical;
    })
    .await;
    let jwks = jwks(&app).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let harmless = text_input("have a lovely day");
    let response = app
        .client
        .post(format!("{}/v1/moderate", app.base))
        .header("x-api-key", &key)
        .header("x-client-nonce", "nonce-1")
        .json(&harmless)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-client-nonce"], "nonce-1");
    let headers = response.headers().clone();
    let body = response.bytes().await.unwrap();
    let verdict: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(verdict["flagged"], false, "{verdict}");

    let asked = SentRequest::post_json("/v1/moderate", &harmless).with_nonce("nonce-1");
    verify_signature(&jwks, 200, &headers, &body, &asked).expect("the genuine answer verifies");

    let harmful = text_input("I will kill you");
    let (real, _) = moderate(&app, &key, harmful.clone()).await;
    let real: Value = real.json().await.unwrap();
    assert_eq!(real["flagged"], true, "{real}");
    let replayed = [
        (
            "another body",
            SentRequest::post_json("/v1/moderate", &harmful).with_nonce("nonce-1"),
        ),
        (
            "another path",
            SentRequest::post_json("/v1/moderations", &harmless).with_nonce("nonce-1"),
        ),
        (
            "another nonce",
            SentRequest::post_json("/v1/moderate", &harmless).with_nonce("nonce-2"),
        ),
        ("another method", {
            let mut other = asked.clone();
            other.method = "PUT";
            other
        }),
    ];
    for (what, request) in replayed {
        assert!(
            verify_signature(&jwks, 200, &headers, &body, &request).is_err(),
            "{what}: a kept answer verified for another request"
        );
    }
}

/// A request refused by its declared `Content-Length` is answered before its
/// body is read: the answer carries no verdict, and its signature covers
/// the request's method and path but no digest of a body never read.
async fn an_answer_before_the_body_is_read_is_signed_without_its_digest(backend: Backend) {
    let app = spawn_app_with(backend, |c| c.limits.max_body_bytes = 1024).await;
    let jwks = jwks(&app).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let big = text_input(&"a".repeat(2048));
    let (response, request) = moderate(&app, &key, big).await;
    assert_eq!(response.status(), 413);
    let headers = response.headers().clone();
    let body = response.bytes().await.unwrap();
    let input = headers["signature-input"].to_str().unwrap();
    assert!(input.contains("\"@method\";req \"@path\";req"), "{input}");
    assert!(!input.contains("\"content-digest\";req"), "{input}");
    verify_signature(&jwks, 413, &headers, &body, &request).expect("the 413 verifies");
    let mut elsewhere = request.clone();
    elsewhere.path = "/v1/moderations".into();
    assert!(verify_signature(&jwks, 413, &headers, &body, &elsewhere).is_err());
}

async fn the_key_survives_a_restart(backend: Backend) {
    let mut app = spawn_app(backend).await;
    let before = jwks(&app).await;
    app.stop().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    tokio::spawn(moderato::run(
        app.config.clone(),
        listener,
        shutdown.clone(),
    ));
    let mut after = Value::Null;
    for _ in 0..200 {
        if let Ok(r) = app
            .client
            .get(format!("http://{addr}/v1/signing-keys"))
            .send()
            .await
        {
            after = r.json().await.unwrap();
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    shutdown.cancel();
    assert_eq!(before, after, "the signing key is kept across restarts");
}

on_both_backends!(
    success_and_error_responses_verify,
    a_response_answers_only_its_own_request,
    an_answer_before_the_body_is_read_is_signed_without_its_digest,
    the_key_survives_a_restart
);

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

async fn success_and_error_responses_verify(backend: Backend) {
    let app = spawn_app(backend).await;
    let jwks = jwks(&app).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let requests = vec![
        app.moderate_text(&key, "hello there").await,    // 200
        app.moderate_text("mdr_nope", "hello").await,    // 401
        app.moderate(&key, &json!({"input": []})).await, // 400
        app.client
            .get(format!("{}/nowhere", app.base))
            .send()
            .await
            .unwrap(), // 404
        app.client
            .get(format!("{}/v1/signing-keys", app.base))
            .send()
            .await
            .unwrap(), // 200, no key
    ];
    for response in requests {
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
        verify_signature(&jwks, status, &headers, &body)
            .unwrap_or_else(|e| panic!("{status}: {e}"));

        let mut changed = body.to_vec();
        changed.push(b' ');
        assert!(
            verify_signature(&jwks, status, &headers, &changed).is_err(),
            "a changed body must fail"
        );
        assert!(
            verify_signature(
                &jwks,
                if status == 200 { 201 } else { 200 },
                &headers,
                &body
            )
            .is_err(),
            "a changed status must fail"
        );
    }
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
    the_key_survives_a_restart
);

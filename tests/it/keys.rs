//! The key life cycle through the real `moderato keys` command.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::*;
use crate::on_both_backends;

fn cli(app: &TestApp, args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_moderato"))
        .args(args)
        .env("MODERATO_DATABASE_URL", &app.db.url)
        .env("MODERATO_AUTH__PEPPER_FILE", &app.config.auth.pepper_file)
        .env("MODERATO_LOG", "warn")
        .output()
        .expect("run moderato");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

async fn create_use_revoke_refuse(backend: Backend) {
    let app = spawn_app(backend).await;
    let (ok, out, err) = cli(
        &app,
        &[
            "keys", "create", "--name", "acme", "--tier", "basic", "--json",
        ],
    );
    assert!(ok, "{err}");
    let created: Value = serde_json::from_str(out.trim()).expect("JSON");
    let (id, key) = (
        created["id"].as_str().unwrap().to_string(),
        created["key"].as_str().unwrap().to_string(),
    );
    assert_eq!(created["tier"], "basic");
    assert_eq!(created["rpm"], 60);
    assert!(key.starts_with("mdr_"));

    let (status, headers, _) = parts(app.moderate_text(&key, "hello").await).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-ratelimit-limit"], "60");

    let (ok, out, _) = cli(&app, &["keys", "list", "--json"]);
    assert!(ok);
    assert!(
        !out.contains(&key[key.len() - 20..]),
        "list never shows secrets"
    );
    let listed: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(listed[0]["id"], id.as_str());
    assert_eq!(listed[0]["revoked_at"], Value::Null);

    // The stored hash is not the key.
    let stored = app
        .store
        .get_key(&moderato::access::KeyId::parse(&id).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_ne!(stored.secret_hash, key.as_bytes());
    assert_eq!(stored.secret_hash.len(), 32);

    let (ok, _, err) = cli(&app, &["keys", "revoke", &id]);
    assert!(ok, "{err}");
    let revoked_at = Instant::now();
    // Refused by the running service within one second of the command returning.
    tokio::time::sleep(Duration::from_secs(1).saturating_sub(revoked_at.elapsed())).await;
    let (status, _, body) = parts(app.moderate_text(&key, "hello").await).await;
    assert_eq!(status, 401);
    error_message(&body, "invalid_api_key");

    let (ok, out, _) = cli(&app, &["keys", "list", "--json"]);
    assert!(ok);
    let listed: Value = serde_json::from_str(out.trim()).unwrap();
    assert!(listed[0]["revoked_at"].is_string());

    let (ok, _, err) = cli(&app, &["keys", "revoke", "0123456789abcdef"]);
    assert!(!ok && err.contains("no key"), "{err}");
    let (ok, _, err) = cli(
        &app,
        &["keys", "create", "--name", "x", "--tier", "enterprise"],
    );
    assert!(!ok && err.contains("--rpm"), "{err}");
    let (ok, _, err) = cli(&app, &["keys", "create", "--name", "x", "--tier", "gold"]);
    assert!(!ok && err.contains("gold"), "{err}");
}

on_both_backends!(create_use_revoke_refuse);

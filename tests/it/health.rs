//! `moderato health`: the container image's HEALTHCHECK, run as the image
//! runs it (the service's own configuration, from the environment).

use std::process::Command;

use crate::helpers::*;

/// Runs `moderato health` for a service on `addr`; (exit success, stderr).
fn health(addr: &str) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_moderato"))
        .arg("health")
        .env("MODERATO_ADDR", addr)
        .env("MODERATO_LOG", "warn")
        .output()
        .expect("run moderato");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_service_is_healthy_and_a_stopped_one_is_not() {
    let mut app = spawn_app(Backend::Sqlite).await;
    let addr = app.base.trim_start_matches("http://").to_string();
    // The image listens on the wildcard address; the probe goes to loopback.
    let port = addr.rsplit(':').next().expect("port").to_string();
    let (ok, err) = health(&format!("0.0.0.0:{port}"));
    assert!(ok, "a ready service failed its health check: {err}");

    app.stop().await;
    let (ok, err) = health(&addr);
    assert!(!ok, "a stopped service passed its health check");
    assert!(err.contains("no answer from"), "{err}");
}

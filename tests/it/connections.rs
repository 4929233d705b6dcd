//! How connections end (issue 25): one body deadline and size limit on
//! every route, the dashboard's forms included, and a lingering close after
//! an answer sent before the body was read, so that a client that writes
//! its whole body before reading still reads the answer. Raw TCP, because
//! the point is what happens on the connection.

use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::child::{enterprise_key, env_for, ChildServer};
use crate::dash_client::{create_account, Session, PASSWORD};
use crate::edge::{post_head, Conn, RawResponse, BOUND};
use crate::helpers::*;
use crate::on_both_backends;
use moderato::access::Tier;
use moderato::config::{Config, ImageClassifierKind, TextClassifierKind};

/// The body of the reports: over the default 10 MiB limit.
const TWELVE_MB: usize = 12_000_000;

fn quick(config: &mut Config) {
    config.text_classifier = TextClassifierKind::Lexical;
    config.image_classifier = ImageClassifierKind::None;
}

/// Writes `head` and then `length` bytes of body without reading anything,
/// as Python's `http.client` does, and only then reads the answer. Panics
/// if writing fails: the server reset the connection, and a real client
/// would never see the answer.
async fn write_everything_then_read(conn: &mut Conn, head: &str, length: usize) -> RawResponse {
    conn.send(head.as_bytes())
        .await
        .expect("the head is written");
    let chunk = vec![b'x'; 64 * 1024];
    let mut sent = 0;
    while sent < length {
        let n = (length - sent).min(chunk.len());
        if let Err(error) = conn.send(&chunk[..n]).await {
            panic!("writing the body failed after {sent} of {length} bytes: {error}");
        }
        sent += n;
    }
    conn.response_within(BOUND)
        .await
        .expect("the answer is there after the whole body was written")
}

/// Whether the server closes the connection within `bound`. Our side
/// sees its half-close (the end of the answer) at once; that it closed the
/// socket shows only when a byte sent gets a reset, so one is sent every
/// 100 ms (which keeps a lingering connection from going idle, not from
/// reaching its total time).
async fn closed_for_writing_within(conn: &mut Conn, bound: Duration) -> bool {
    let probe = async {
        while conn.send(b"x").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(bound, probe).await.is_ok()
}

/// One request of `length` body bytes written whole before reading, on a
/// fresh connection; asserts it is refused with `code` and `Connection: close`.
async fn refused_after_writing_everything(app: &TestApp, key: &str, code: &str) -> RawResponse {
    let mut conn = Conn::open(app).await;
    let response =
        write_everything_then_read(&mut conn, &post_head(key, TWELVE_MB, ""), TWELVE_MB).await;
    error_message(&response.body, code);
    assert_eq!(response.header("connection"), Some("close"), "{code}");
    response
}

async fn a_client_that_writes_everything_first_reads_413_401_and_429(backend: Backend) {
    let app = spawn_app_with(backend, |c| {
        quick(c);
        c.auth.failed_auth_per_minute = 20;
    })
    .await;
    let (_, key) = app.create_key(Tier::Enterprise, Some(1_000)).await;
    for _ in 0..20 {
        let response = refused_after_writing_everything(&app, &key, "payload_too_large").await;
        assert_eq!(response.status, 413);
    }
    // A wrong key is refused before the body is read; twenty of them, then
    // the address is refused for a while.
    let wrong = "mdr_0123456789abcdef_wrongwrongwrongwrongwrongwrongwrongwrong123";
    for _ in 0..20 {
        let response = refused_after_writing_everything(&app, wrong, "invalid_api_key").await;
        assert_eq!(response.status, 401);
    }
    for _ in 0..20 {
        let response = refused_after_writing_everything(&app, wrong, "rate_limit_exceeded").await;
        assert_eq!(response.status, 429);
        assert!(response.header("retry-after").is_some());
    }
}

/// A chunked body says nothing of its length up front: it is refused once
/// the limit is passed, and the rest is discarded just the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_body_over_the_limit_gets_413_after_writing_everything() {
    let app = spawn_app_with(Backend::Sqlite, quick).await;
    let (_, key) = app.create_key(Tier::Enterprise, Some(1_000)).await;
    let chunk = vec![b'x'; 64 * 1024];
    let framed = [format!("{:x}\r\n", chunk.len()).as_bytes(), &chunk, b"\r\n"].concat();
    for _ in 0..3 {
        let mut conn = Conn::open(&app).await;
        let head = format!(
            "POST /v1/moderate HTTP/1.1\r\nHost: test\r\nX-API-Key: {key}\r\n\
             Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        conn.send(head.as_bytes()).await.unwrap();
        // Longer than the socket buffers hold: the server must take the rest.
        for _ in 0..(32 << 20) / chunk.len() {
            conn.send(&framed)
                .await
                .expect("the server let the body be written");
        }
        conn.send(b"0\r\n\r\n").await.expect("the end is written");
        let response = conn.response_within(BOUND).await.expect("answered");
        assert_eq!(response.status, 413);
        let message = error_message(&response.body, "payload_too_large");
        assert!(message.contains("limit"), "{message}");
        assert_eq!(response.header("connection"), Some("close"));
    }
}

/// The client of the reports, unmodified: Python's `http.client`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pythons_http_client_reads_the_413_twenty_times_in_a_row() {
    let app = spawn_app_with(Backend::Sqlite, quick).await;
    let (_, key) = app.create_key(Tier::Enterprise, Some(1_000)).await;
    let script = r#"
import http.client, json, sys
host, port, key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
body = b"x" * 12_000_000
for _ in range(20):
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.request("POST", "/v1/moderate", body=body,
                 headers={"X-API-Key": key, "Content-Type": "application/json"})
    response = conn.getresponse()
    print(response.status, json.loads(response.read())["error"]["code"], flush=True)
    conn.close()
"#;
    let (host, port) = app
        .base
        .trim_start_matches("http://")
        .rsplit_once(':')
        .unwrap();
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let output = tokio::process::Command::new(python)
        .args(["-c", script, host, port, &key])
        .output()
        .await
        .expect("python3 (see README)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "python failed after {} answers: {}",
        stdout.lines().count(),
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines, vec!["413 payload_too_large"; 20]);
}

/// Lingering is bounded in time: a client that sends a little now and
/// then (never enough to finish, never closing) is closed at
/// `server.linger_time_ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_keeps_trickling_is_closed_at_the_linger_time() {
    let app = spawn_app_with(Backend::Sqlite, |c| {
        quick(c);
        c.server.linger_time_ms = 1_000;
    })
    .await;
    let (_, key) = app.create_key(Tier::Enterprise, Some(1_000)).await;
    let mut conn = Conn::open(&app).await;
    conn.send(post_head(&key, TWELVE_MB, "").as_bytes())
        .await
        .unwrap();
    conn.send(&vec![b'x'; 1 << 20]).await.unwrap();
    let response = conn.response_within(BOUND).await.expect("answered");
    assert_eq!(response.status, 413);
    // What the client still sends is taken (and dropped) a while...
    conn.send(&vec![b'x'; 1 << 20])
        .await
        .expect("still read while lingering");
    // ...and then the connection is closed, trickle or not.
    assert!(
        closed_for_writing_within(&mut conn, BOUND).await,
        "a client that did not finish its body kept its lingering connection"
    );
}

/// A client that stops sending after the answer (and never closes) is
/// closed once it has been quiet for `server.linger_idle_ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_sending_is_closed_at_the_idle_bound() {
    let app = spawn_app_with(Backend::Sqlite, |c| {
        quick(c);
        c.server.linger_time_ms = 600_000;
        c.server.linger_idle_ms = 300;
    })
    .await;
    let (_, key) = app.create_key(Tier::Enterprise, Some(1_000)).await;
    let mut conn = Conn::open(&app).await;
    conn.send(post_head(&key, TWELVE_MB, "").as_bytes())
        .await
        .unwrap();
    assert_eq!(conn.response_within(BOUND).await.expect("413").status, 413);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        closed_for_writing_within(&mut conn, BOUND).await,
        "a silent client kept its lingering connection past the idle bound"
    );
}

/// Discarding is bounded in bytes too: past `server.linger_max_bytes`, the
/// connection is closed however fast the client sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lingering_stops_at_its_byte_bound() {
    let app = spawn_app_with(Backend::Sqlite, |c| {
        quick(c);
        c.server.linger_max_bytes = 1 << 20;
        c.server.linger_time_ms = 600_000;
    })
    .await;
    let (_, key) = app.create_key(Tier::Enterprise, Some(1_000)).await;
    let mut conn = Conn::open(&app).await;
    conn.send(post_head(&key, 1 << 30, "").as_bytes())
        .await
        .unwrap();
    assert_eq!(
        conn.response_within(BOUND).await.expect("answered").status,
        413
    );
    let chunk = vec![b'x'; 64 * 1024];
    let sent_until_closed = async {
        let mut sent = 0usize;
        while conn.send(&chunk).await.is_ok() {
            sent += chunk.len();
            assert!(sent < 1 << 30, "a whole GiB was taken with a 1 MiB bound");
        }
    };
    assert!(
        tokio::time::timeout(BOUND, sent_until_closed).await.is_ok(),
        "the lingering connection was not closed at its byte bound"
    );
}

/// Shutting down does not wait for lingering connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_lingering_at_once() {
    let mut app = spawn_app_with(Backend::Sqlite, |c| {
        quick(c);
        c.server.linger_time_ms = 600_000;
        c.server.linger_idle_ms = 600_000;
        c.shutdown_grace_ms = 600_000;
    })
    .await;
    let (_, key) = app.create_key(Tier::Enterprise, Some(1_000)).await;
    let mut conn = Conn::open(&app).await;
    conn.send(post_head(&key, TWELVE_MB, "").as_bytes())
        .await
        .unwrap();
    assert_eq!(conn.response_within(BOUND).await.expect("413").status, 413);
    assert!(
        tokio::time::timeout(BOUND, app.stop()).await.is_ok(),
        "the server waited for a lingering connection to end"
    );
    assert!(closed_for_writing_within(&mut conn, BOUND).await);
}

/// The real binary discards 256 MB for four clients at once through its
/// small buffers: its peak memory does not grow with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discarding_does_not_grow_the_servers_memory() {
    const BODY: usize = 64 << 20;
    let db = TestDb::new(Backend::Sqlite).await;
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(&db, &dir);
    let mut env = env_for(&config, dir.path());
    env.push(("MODERATO_TEXT_CLASSIFIER".into(), "lexical".into()));
    env.push(("MODERATO_IMAGE_CLASSIFIER".into(), "none".into()));
    env.push((
        "MODERATO_SERVER__LINGER_MAX_BYTES".into(),
        (1u64 << 30).to_string(),
    ));
    let server = ChildServer::start(&env);
    let new = enterprise_key(&config, &db.url, "linger", 1000).await;
    let address = server.address.clone();
    let small = b"{\"input\":[{\"type\":\"text\",\"text\":\"hello\"}]}";
    let mut warm = Conn::to(&address).await;
    warm.send(post_head(&new.full_key, small.len(), "").as_bytes())
        .await
        .unwrap();
    warm.send(small).await.unwrap();
    assert_eq!(warm.response_within(BOUND).await.expect("warm").status, 200);
    let baseline_kb = server.status_kb("VmRSS");

    let clients = (0..4).map(|_| {
        let (address, key) = (address.clone(), new.full_key.clone());
        tokio::spawn(async move {
            let mut conn = Conn::to(&address).await;
            write_everything_then_read(&mut conn, &post_head(&key, BODY, ""), BODY)
                .await
                .status
        })
    });
    for client in clients {
        assert_eq!(client.await.unwrap(), 413);
    }
    let peak_kb = server.status_kb("VmHWM");
    let grown_mb = peak_kb.saturating_sub(baseline_kb) / 1024;
    eprintln!(
        "lingering: discarded {} MB; baseline {} MB, peak {} MB",
        (4 * BODY) >> 20,
        baseline_kb / 1024,
        peak_kb / 1024
    );
    assert!(
        grown_mb < 32,
        "the peak resident memory grew by {grown_mb} MB while discarding {} MB",
        (4 * BODY) >> 20
    );
}

// --- the dashboard's forms ---------------------------------------------------

/// Every POST route of the dashboard (ids need not exist: the body is read
/// before anything is looked up).
const DASHBOARD_FORMS: &[&str] = &[
    "/dashboard/login",
    "/dashboard/signup",
    "/dashboard/set-password?token=x",
    "/dashboard/logout",
    "/dashboard/keys",
    "/dashboard/keys/x/revoke",
    "/dashboard/admin/accounts",
    "/dashboard/admin/accounts/x/plan",
    "/dashboard/admin/accounts/x/disable",
    "/dashboard/admin/accounts/x/keys",
    "/dashboard/admin/accounts/x/keys/y/revoke",
];

fn form_head(path: &str, cookie: &str, length: usize) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: test\r\nCookie: {cookie}\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {length}\r\n\r\n"
    )
}

/// An admin's session cookie, so that every form's body is read.
async fn admin_cookie(app: &TestApp) -> String {
    create_account(app, "root@example.com", "admin", &[]);
    let session = Session::signed_in(app, "root@example.com", PASSWORD).await;
    session
        .cookies
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Posts a form whose body trickles in a byte every 300 ms and never ends,
/// until the server closes the connection; returns what it answered.
async fn trickled_form(address: String, path: &'static str, cookie: String) -> RawResponse {
    let stream = TcpStream::connect(&address).await.expect("connect");
    let (mut reader, mut writer) = stream.into_split();
    let head = form_head(path, &cookie, 1_000);
    writer.write_all(head.as_bytes()).await.unwrap();
    let trickle = tokio::spawn(async move {
        while writer.write_all(b"a").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(BOUND, reader.read_to_end(&mut answer)).await;
    trickle.abort();
    parse_response(&answer).unwrap_or_else(|| panic!("{path}: no answer"))
}

/// One whole response in `bytes`.
fn parse_response(bytes: &[u8]) -> Option<RawResponse> {
    let head_end = bytes.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&bytes[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect();
    let body = serde_json::from_slice(&bytes[head_end + 4..]).unwrap_or(Value::Null);
    Some(RawResponse {
        status,
        headers,
        body,
    })
}

async fn slow_bodies_to_every_dashboard_form_get_408_while_others_are_served(backend: Backend) {
    const BODY_TIMEOUT_MS: u64 = 1_500;
    let mut app = spawn_app_with(backend, |c| {
        quick(c);
        c.server.body_read_timeout_ms = BODY_TIMEOUT_MS;
        c.server.max_connections = DASHBOARD_FORMS.len();
    })
    .await;
    let cookie = admin_cookie(&app).await;
    // The readiness probe's pooled connection holds a slot: let it go.
    app.client = reqwest::Client::new();
    let address = app.base.trim_start_matches("http://").to_string();
    // Every slot: one trickled form per route.
    let slow: Vec<_> = DASHBOARD_FORMS
        .iter()
        .map(|path| tokio::spawn(trickled_form(address.clone(), path, cookie.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let mut other = Conn::open(&app).await;
    other
        .send(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    let served = other
        .response_within(Duration::from_millis(BODY_TIMEOUT_MS) + BOUND)
        .await
        .expect("another client is served once the slow bodies time out");
    assert_eq!(served.status, 200);
    eprintln!(
        "another client served after {:?} (body timeout {BODY_TIMEOUT_MS} ms)",
        started.elapsed()
    );
    for (path, answer) in DASHBOARD_FORMS.iter().zip(slow) {
        let answer = answer.await.unwrap();
        assert_eq!(answer.status, 408, "{path}: {}", answer.body);
        error_message(&answer.body, "request_timeout");
        assert_eq!(answer.header("connection"), Some("close"), "{path}");
    }
}

/// The attack of the report: a form declaring 100,000 bytes is refused
/// before any is read, on a route that needs no session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dashboard_form_over_its_limit_is_refused_at_once() {
    let app = spawn_app_with(Backend::Sqlite, quick).await;
    for path in ["/dashboard/login", "/dashboard/signup"] {
        let mut conn = Conn::open(&app).await;
        conn.send(form_head(path, "", 100_000).as_bytes())
            .await
            .unwrap();
        let response = conn.response_within(BOUND).await.expect("answered at once");
        assert_eq!(response.status, 413, "{path}");
        let message = error_message(&response.body, "payload_too_large");
        assert!(message.contains("16384"), "{message}");
        assert_eq!(response.header("connection"), Some("close"));
    }
    // A form of ordinary size still works (and a form must be a form).
    let mut session = Session::new(&app);
    assert_eq!(session.get("/dashboard/login").await.status, 200);
    let json = app
        .client
        .post(format!("{}/dashboard/login", app.base))
        .json(&serde_json::json!({"email": "a@example.com"}))
        .send()
        .await
        .unwrap();
    let (status, _, body) = parts(json).await;
    assert_eq!(status, 415, "{body}");
    error_message(&body, "unsupported_media_type");
}

on_both_backends!(
    a_client_that_writes_everything_first_reads_413_401_and_429,
    slow_bodies_to_every_dashboard_form_get_408_while_others_are_served,
);

//! The HTTP edge under hostile clients (issue 13): connection timeouts and
//! the connection cap, the immediate 413, keep-alive across refusals, the
//! failed-authentication limiter behind a NAT or a proxy, strict JSON,
//! encodings and charsets, and truncated JPEGs. Raw TCP where the point is
//! what happens on the connection itself.

use std::io::Cursor;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::*;
use crate::images::data_uri;
use crate::on_both_backends;
use moderato::access::Tier;
use moderato::config::{IpBlock, TextClassifierKind};

/// Generous: these bounds say "closed / answered at all", not "fast".
pub(crate) const BOUND: Duration = Duration::from_secs(20);

/// One raw HTTP/1.1 connection.
pub(crate) struct Conn {
    pub(crate) stream: TcpStream,
    buffer: Vec<u8>,
}

pub(crate) struct RawResponse {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Value,
}

impl RawResponse {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl Conn {
    pub(crate) async fn open(app: &TestApp) -> Conn {
        Conn::to(app.base.trim_start_matches("http://")).await
    }

    /// A connection to the app from the local address `source` (any of
    /// 127.0.0.0/8 reaches the app's 127.0.0.1): another client.
    pub(crate) async fn open_from(
        app: &TestApp,
        source: std::net::IpAddr,
    ) -> std::io::Result<Conn> {
        let address = app
            .base
            .trim_start_matches("http://")
            .parse()
            .expect("address");
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(std::net::SocketAddr::new(source, 0))?;
        Ok(Conn {
            stream: socket.connect(address).await?,
            buffer: Vec::new(),
        })
    }

    /// A connection to `address` (`host:port`).
    pub(crate) async fn to(address: &str) -> Conn {
        Conn {
            stream: TcpStream::connect(address).await.expect("connect"),
            buffer: Vec::new(),
        }
    }

    pub(crate) async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes).await
    }

    /// Reads one response (with a Content-Length); `None` if the server
    /// closed the connection first.
    pub(crate) async fn response(&mut self) -> Option<RawResponse> {
        let head_end = loop {
            if let Some(at) = find(&self.buffer, b"\r\n\r\n") {
                break at;
            }
            if !self.fill().await {
                return None;
            }
        };
        let head = String::from_utf8(self.buffer[..head_end].to_vec()).expect("head");
        let mut lines = head.split("\r\n");
        let status = lines.next().unwrap().split(' ').nth(1).unwrap();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
            .collect();
        let length: usize = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .map(|(_, v)| v.parse().unwrap())
            .expect("responses carry a Content-Length");
        while self.buffer.len() < head_end + 4 + length {
            if !self.fill().await {
                return None;
            }
        }
        let body = self.buffer[head_end + 4..head_end + 4 + length].to_vec();
        self.buffer.drain(..head_end + 4 + length);
        Some(RawResponse {
            status: status.parse().unwrap(),
            headers,
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        })
    }

    pub(crate) async fn response_within(&mut self, bound: Duration) -> Option<RawResponse> {
        tokio::time::timeout(bound, self.response())
            .await
            .ok()
            .flatten()
    }

    /// False when the peer closed the connection (or reset it).
    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 8192];
        match self.stream.read(&mut chunk).await {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buffer.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// Whether the server closes the connection within `bound`, reading and
    /// discarding whatever it sends before.
    pub(crate) async fn closed_within(&mut self, bound: Duration) -> bool {
        tokio::time::timeout(bound, async { while self.fill().await {} })
            .await
            .is_ok()
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

pub(crate) fn post_head(key: &str, length: usize, extra: &str) -> String {
    format!(
        "POST /v1/moderate HTTP/1.1\r\nHost: test\r\nX-API-Key: {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {length}\r\n{extra}\r\n"
    )
}

fn text_body(text: &str) -> Vec<u8> {
    json!({"input": [{"type": "text", "text": text}]})
        .to_string()
        .into_bytes()
}

// --- item 3: slow clients, idle connections, the connection cap -------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_sent_byte_by_byte_is_cut_off() {
    let app = spawn_app_with(Backend::Sqlite, |c| c.server.header_read_timeout_ms = 1_000).await;
    let mut conn = Conn::open(&app).await;
    conn.send(b"POST /v1/moderate HTTP/1.1\r\n").await.unwrap();
    // A header line every 300 ms: always something, never the end.
    let trickle = async {
        for i in 0.. {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let line = format!("X-Slow-{i}: y\r\n");
            if conn.stream.write_all(line.as_bytes()).await.is_err() {
                return;
            }
            let mut probe = [0u8; 1024];
            // A closed connection reads as 0 bytes (or a response, then 0).
            if let Ok(Ok(0)) =
                tokio::time::timeout(Duration::from_millis(1), conn.stream.read(&mut probe)).await
            {
                return;
            }
        }
    };
    assert!(
        tokio::time::timeout(BOUND, trickle).await.is_ok(),
        "a header trickled byte by byte kept its connection open"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_half_sent_connections_are_closed() {
    let app = spawn_app_with(Backend::Sqlite, |c| c.server.header_read_timeout_ms = 1_000).await;
    let mut idle = Conn::open(&app).await;
    idle.send(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(
        idle.response_within(BOUND).await.expect("answered").status,
        200
    );
    let mut half = Conn::open(&app).await;
    half.send(b"POST /v1/moderate HTTP/1.1\r\nHost: te")
        .await
        .unwrap();
    let mut silent = Conn::open(&app).await;
    assert!(
        idle.closed_within(BOUND).await,
        "idle keep-alive connection kept open"
    );
    assert!(
        half.closed_within(BOUND).await,
        "half-sent header kept open"
    );
    assert!(
        silent.closed_within(BOUND).await,
        "silent connection kept open"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_wait_for_a_free_slot() {
    let mut app = spawn_app_with(Backend::Sqlite, |c| c.server.max_connections = 2).await;
    // The readiness probe's pooled connection holds a slot: let it go.
    app.client = reqwest::Client::new();
    let health = b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n";
    let mut first = Conn::open(&app).await;
    first.send(health).await.unwrap();
    assert_eq!(
        first.response_within(BOUND).await.expect("first").status,
        200
    );
    let mut second = Conn::open(&app).await;
    second.send(health).await.unwrap();
    assert_eq!(
        second.response_within(BOUND).await.expect("second").status,
        200
    );
    // Both keep-alive connections stay open: a third is not served...
    let mut third = Conn::open(&app).await;
    third.send(health).await.unwrap();
    assert!(
        third
            .response_within(Duration::from_secs(1))
            .await
            .is_none(),
        "a third connection was served past a cap of two"
    );
    // ...until one of them closes.
    drop(first);
    assert_eq!(
        third.response_within(BOUND).await.expect("third").status,
        200
    );
}

// --- item 4: a declared body over the limit ---------------------------------

async fn a_declared_length_over_the_limit_gets_413_before_the_body(backend: Backend) {
    let app = spawn_app_with(backend, |c| c.server.body_read_timeout_ms = 120_000).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let mut conn = Conn::open(&app).await;
    let length = app.config.limits.max_body_bytes + 1;
    conn.send(post_head(&key, length, "").as_bytes())
        .await
        .unwrap();
    let response = conn.response_within(BOUND).await.expect("answered at once");
    assert_eq!(response.status, 413);
    error_message(&response.body, "payload_too_large");
    // The body is left unread, so the connection cannot be reused: say so.
    assert_eq!(response.header("connection"), Some("close"));
    assert_eq!(app.usage_events(1).await[0].status, 413);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_never_arrives_gets_408() {
    let app = spawn_app_with(Backend::Sqlite, |c| c.server.body_read_timeout_ms = 1_000).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let mut conn = Conn::open(&app).await;
    conn.send(post_head(&key, 100, "").as_bytes())
        .await
        .unwrap();
    conn.send(b"{\"input\":").await.unwrap();
    let response = conn.response_within(BOUND).await.expect("answered");
    assert_eq!(response.status, 408);
    error_message(&response.body, "request_timeout");
    assert_eq!(response.header("connection"), Some("close"));
}

// --- item 5: keep-alive across 401 and 429 -----------------------------------

/// Sends one request whose body follows its header a moment later, as a
/// client on a slow link does, and reads the answer.
async fn slow_body_request(conn: &mut Conn, key: &str, text: &str) -> RawResponse {
    let body = text_body(text);
    conn.send(post_head(key, body.len(), "").as_bytes())
        .await
        .expect("the connection is still open");
    tokio::time::sleep(Duration::from_millis(150)).await;
    conn.send(&body)
        .await
        .expect("the connection is still open");
    conn.response_within(BOUND)
        .await
        .expect("answered on the same connection")
}

async fn one_keep_alive_connection_survives_429_and_401(backend: Backend) {
    let app = spawn_app_with(backend, |c| c.text_classifier = TextClassifierKind::Lexical).await;
    let (_, key) = app.create_key(Tier::Free, None).await;
    let mut conn = Conn::open(&app).await;
    let mut statuses = Vec::new();
    for i in 0..13 {
        let response = slow_body_request(&mut conn, &key, &format!("message {i}")).await;
        assert_ne!(response.header("connection"), Some("close"), "request {i}");
        statuses.push(response.status);
    }
    assert_eq!(statuses[..10], [200; 10], "{statuses:?}");
    assert_eq!(statuses[10..], [429; 3], "{statuses:?}");
    let wrong = "mdr_0123456789abcdef_wrongwrongwrongwrongwrongwrongwrongwrong123";
    for _ in 0..2 {
        let response = slow_body_request(&mut conn, wrong, "hello").await;
        assert_eq!(response.status, 401);
        assert_ne!(response.header("connection"), Some("close"));
    }
    assert_eq!(
        slow_body_request(&mut conn, &key, "again").await.status,
        429
    );
}

// --- item 6: a NAT, a proxy ---------------------------------------------------

async fn a_valid_key_is_served_from_an_address_that_failed(backend: Backend) {
    let app = spawn_app_with(backend, |c| c.auth.failed_auth_per_minute = 5).await;
    let wrong = "mdr_0123456789abcdef_wrongwrongwrongwrongwrongwrongwrongwrong123";
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(app.moderate_text(wrong, "x").await.status().as_u16());
    }
    assert_eq!(statuses, [401, 401, 401, 401, 401, 429, 429, 429]);
    // Someone else behind the same address, with a key never seen before.
    let (_, key) = app.create_key(Tier::Free, None).await;
    let (status, _, body) = parts(app.moderate_text(&key, "hello").await).await;
    assert_eq!(status, 200, "{body}");
    // The failing client is still refused, with or without a key.
    assert_eq!(app.moderate_text(wrong, "x").await.status(), 429);
    let no_key = app
        .client
        .post(format!("{}/v1/moderate", app.base))
        .json(&json!({"input": [{"type": "text", "text": "x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(no_key.status(), 429);
}

async fn post_via_proxy(app: &TestApp, forwarded_for: &str) -> u16 {
    let wrong = "mdr_0123456789abcdef_wrongwrongwrongwrongwrongwrongwrongwrong123";
    app.client
        .post(format!("{}/v1/moderate", app.base))
        .header("x-api-key", wrong)
        .header("x-forwarded-for", forwarded_for)
        .json(&json!({"input": [{"type": "text", "text": "x"}]}))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_each_client_has_its_own_allowance() {
    let app = spawn_app_with(Backend::Sqlite, |c| {
        c.auth.failed_auth_per_minute = 3;
        c.auth.trusted_proxies = vec![IpBlock::try_from("127.0.0.0/8".to_string()).unwrap()];
    })
    .await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(post_via_proxy(&app, "203.0.113.7").await);
    }
    assert_eq!(statuses, [401, 401, 401, 429]);
    // Another client behind the same proxy is not blocked...
    assert_eq!(post_via_proxy(&app, "203.0.113.8").await, 401);
    // ...and the blocked one cannot escape by prepending an address.
    assert_eq!(post_via_proxy(&app, "198.51.100.1, 203.0.113.7").await, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_trusted_proxies_forwarded_for_is_ignored() {
    let app = spawn_app_with(Backend::Sqlite, |c| c.auth.failed_auth_per_minute = 3).await;
    let statuses = [
        post_via_proxy(&app, "203.0.113.1").await,
        post_via_proxy(&app, "203.0.113.2").await,
        post_via_proxy(&app, "203.0.113.3").await,
        post_via_proxy(&app, "203.0.113.4").await,
    ];
    assert_eq!(statuses, [401, 401, 401, 429]);
}

// --- item 7: duplicate keys ---------------------------------------------------

async fn post_raw(
    app: &TestApp,
    key: &str,
    content_type: &str,
    body: Vec<u8>,
) -> reqwest::Response {
    app.client
        .post(format!("{}/v1/moderate", app.base))
        .header("x-api-key", key)
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_keys_are_refused_everywhere() {
    let app = spawn_app(Backend::Sqlite).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    for (body, path) in [
        (
            r#"{"input":[{"type":"text","text":"I will kill you","text":"hello"}]}"#,
            "input[0].text",
        ),
        (
            r#"{"input":[{"type":"text","text":"a"},{"type":"image","type":"text","text":"b"}]}"#,
            "input[1].type",
        ),
        (
            r#"{"input":[{"type":"text","text":"a"}],"analyze_images":false,"analyze_images":true}"#,
            "analyze_images",
        ),
    ] {
        let response = post_raw(&app, &key, "application/json", body.into()).await;
        let (status, _, body) = parts(response).await;
        assert_eq!(status, 400, "{body}");
        let message = error_message(&body, "invalid_request");
        assert!(
            message.contains(path) && message.contains("duplicate"),
            "{message}"
        );
    }
}

// --- item 8: encodings, charsets, truncated JPEGs -------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encodings_and_charsets_not_decoded_get_415() {
    let app = spawn_app_with(Backend::Sqlite, |c| {
        c.text_classifier = TextClassifierKind::Lexical
    })
    .await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let send = |encoding: Option<&'static str>, content_type: &'static str, body: Vec<u8>| {
        let mut request = app
            .client
            .post(format!("{}/v1/moderate", app.base))
            .header("x-api-key", &key)
            .header("content-type", content_type)
            .body(body);
        if let Some(encoding) = encoding {
            request = request.header("content-encoding", encoding);
        }
        async move { parts(request.send().await.unwrap()).await }
    };
    let plain = text_body("hello");
    // A gzip stream's first bytes: whatever follows, it is not read as JSON.
    let gzip_like = [&[0x1f, 0x8b, 0x08, 0x00][..], &plain].concat();
    for (encoding, content_type, body, fragment) in [
        (Some("gzip"), "application/json", gzip_like, "gzip"),
        (Some("br"), "application/json", plain.clone(), "br"),
        (
            None,
            "application/json; charset=utf-16",
            plain.clone(),
            "utf-16",
        ),
    ] {
        let (status, _, answer) = send(encoding, content_type, body).await;
        assert_eq!(status, 415, "{answer}");
        let message = error_message(&answer, "unsupported_media_type");
        assert!(message.contains(fragment), "{message}");
    }
    for (encoding, content_type) in [
        (Some("identity"), "application/json"),
        (None, "application/json; charset=UTF-8"),
    ] {
        let (status, _, answer) = send(encoding, content_type, plain.clone()).await;
        assert_eq!(status, 200, "{answer}");
    }
}

fn jpeg(width: u32, height: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([
            (x * 7 % 256) as u8,
            (y * 13 % 256) as u8,
            ((x ^ y) % 256) as u8,
        ])
    });
    let mut out = Vec::new();
    image::DynamicImage::ImageRgb8(img)
        .write_to(&mut Cursor::new(&mut out), image::ImageFormat::Jpeg)
        .unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_jpeg_is_refused() {
    let app = spawn_app_with(Backend::Sqlite, |c| {
        c.text_classifier = TextClassifierKind::Lexical
    })
    .await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let whole = jpeg(96, 64);
    let image_request = |bytes: &[u8]| json!({"input": [{"type": "image", "base64": data_uri("image/jpeg", bytes)}]});
    let (status, _, body) = parts(app.moderate(&key, &image_request(&whole)).await).await;
    assert_eq!(status, 200, "{body}");
    // Trailing bytes after the end-of-image marker are not truncation.
    let padded = [&whole[..], &[0u8; 16][..]].concat();
    let (status, _, body) = parts(app.moderate(&key, &image_request(&padded)).await).await;
    assert_eq!(status, 200, "{body}");
    for cut in [whole.len() / 2, whole.len() - 2, 300] {
        let (status, _, body) =
            parts(app.moderate(&key, &image_request(&whole[..cut])).await).await;
        assert_eq!(status, 400, "cut at {cut}: {body}");
        let message = error_message(&body, "invalid_image");
        assert!(
            message.contains("input[0].base64") && message.contains("truncated"),
            "{message}"
        );
    }
}

on_both_backends!(
    a_declared_length_over_the_limit_gets_413_before_the_body,
    one_keep_alive_connection_survives_429_and_401,
    a_valid_key_is_served_from_an_address_that_failed,
);

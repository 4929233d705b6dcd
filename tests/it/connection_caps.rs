//! What one client can hold at the connection level (issue 58): a cap on
//! its open connections, keep-alive connections that end after a number of
//! requests and at an age, lingering that yields (its own budget, the
//! oldest closed when slots run short, a minimum rate), the metrics
//! listener under the same bounds, and framing refused where hyper is
//! lenient. Two loopback addresses are two clients: 127.0.0.2 attacks,
//! 127.0.0.1 must still be served.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::edge::{post_head, Conn, RawResponse, BOUND};
use crate::helpers::*;
use crate::metrics::Scrape;
use moderato::access::Tier;
use moderato::config::{Config, ImageClassifierKind, TextClassifierKind};

const ATTACKER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n";

/// What the issue asks of a healthy client's request during an attack.
const PROMPTLY: Duration = Duration::from_secs(1);

fn quick(config: &mut Config) {
    config.text_classifier = TextClassifierKind::Lexical;
    config.image_classifier = ImageClassifierKind::None;
}

/// The shipped cap (the test helpers lift it: see `test_config`).
fn default_cap(config: &mut Config) {
    let shipped = Config::load(None).expect("default config");
    config.server.max_connections_per_client = shipped.server.max_connections_per_client;
}

async fn health(conn: &mut Conn) -> Option<RawResponse> {
    conn.send(HEALTH).await.ok()?;
    conn.response_within(BOUND).await
}

/// A form to the sign-in page declaring 100,000 bytes (over its 16 KiB
/// limit: answered 413 at once, then the connection lingers).
fn oversized_form_head() -> &'static [u8] {
    b"POST /dashboard/login HTTP/1.1\r\nHost: test\r\n\
      Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100000\r\n\r\n"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_past_its_connection_cap_gets_503_at_once_and_others_are_served() {
    let (app, metrics) = spawn_app_with_metrics(Backend::Sqlite, |c| {
        quick(c);
        c.server.max_connections_per_client = 3;
    })
    .await;
    let before = Scrape::take(&app.client, &metrics).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut conn = Conn::open_from(&app, ATTACKER).await.expect("connect");
        assert_eq!(health(&mut conn).await.expect("served").status, 200);
        held.push(conn);
    }
    let mut over = Conn::open_from(&app, ATTACKER).await.expect("connect");
    let refused = over
        .response_within(BOUND)
        .await
        .expect("a 503 without sending anything");
    assert_eq!(refused.status, 503);
    error_message(&refused.body, "service_unavailable");
    assert_eq!(refused.header("retry-after"), Some("5"));
    assert!(
        over.closed_within(BOUND).await,
        "the refused connection stays open"
    );
    // Another client is served meanwhile...
    let mut other = Conn::open(&app).await;
    assert_eq!(health(&mut other).await.expect("served").status, 200);
    // ...and the capped one again once it closes a connection.
    drop(held.pop());
    let served = async {
        loop {
            let mut again = Conn::open_from(&app, ATTACKER).await.expect("connect");
            if let Some(response) = health(&mut again).await {
                if response.status == 200 {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(BOUND, served)
        .await
        .expect("a place freed by a closed connection is given again");
    let after = Scrape::take(&app.client, &metrics).await;
    let refused = [("listener", "api"), ("reason", "per_client")];
    let name = "moderato_connections_refused_total";
    assert!(after.sum(name, &refused) - before.sum(name, &refused) >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_connection_closes_after_its_request_count() {
    let app = spawn_app_with(Backend::Sqlite, |c| {
        quick(c);
        c.server.max_requests_per_connection = 3;
    })
    .await;
    let mut conn = Conn::open(&app).await;
    for _ in 0..2 {
        let response = health(&mut conn).await.expect("served");
        assert_eq!(response.status, 200);
        assert_ne!(response.header("connection"), Some("close"));
    }
    let last = health(&mut conn).await.expect("the third is served");
    assert_eq!(last.status, 200);
    assert_eq!(last.header("connection"), Some("close"));
    assert!(
        conn.closed_within(BOUND).await,
        "kept open past its requests"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_connection_closes_at_its_age_however_busy() {
    let app = spawn_app_with(Backend::Sqlite, |c| {
        quick(c);
        c.server.max_connection_age_ms = 1_000;
    })
    .await;
    let mut conn = Conn::open(&app).await;
    // A request every 200 ms: never idle, never at its request count.
    let ended = async {
        loop {
            match health(&mut conn).await {
                Some(response) if response.header("connection") == Some("close") => return,
                Some(response) => assert_eq!(response.status, 200),
                None => return,
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    assert!(
        tokio::time::timeout(BOUND, ended).await.is_ok(),
        "a busy keep-alive connection outlived its maximum age"
    );
}

/// Sends the oversized form, reads its 413, and waits for the server to
/// shut its side: the connection now lingers. The 413 alone is not enough:
/// the server registers a connection as lingering after the answer is
/// flushed, so a busy server could register the next client's connection
/// first and take it for the older one. It shuts its side only once
/// registered.
async fn lingering(app: &TestApp, source: IpAddr) -> Conn {
    let mut conn = Conn::open_from(app, source).await.expect("connect");
    conn.send(oversized_form_head()).await.unwrap();
    assert_eq!(conn.response_within(BOUND).await.expect("413").status, 413);
    assert!(
        conn.closed_within(BOUND).await,
        "the server did not shut its side after the 413"
    );
    conn
}

/// Whether the server closed the connection within `bound`: a byte every
/// 100 ms (which keeps lingering from going idle) until one is refused.
async fn closed_for_writing_within(conn: &mut Conn, bound: Duration) -> bool {
    let probe = async {
        while conn.send(b"x").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(bound, probe).await.is_ok()
}

fn lingering_long(config: &mut Config) {
    quick(config);
    config.server.linger_time_ms = 600_000;
    config.server.linger_idle_ms = 600_000;
    config.server.min_body_rate_bytes_per_sec = 0;
}

/// With its one slot held by a lingering connection, the next client is
/// served at once and the lingering one is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lingering_connection_yields_its_slot_to_a_waiting_client() {
    let mut app = spawn_app_with(Backend::Sqlite, |c| {
        lingering_long(c);
        c.server.max_connections = 1;
    })
    .await;
    // The readiness probe's pooled connection holds the slot: let it go.
    app.client = reqwest::Client::new();
    let mut lingerer = lingering(&app, ATTACKER).await;
    let mut next = Conn::open(&app).await;
    assert_eq!(health(&mut next).await.expect("served").status, 200);
    assert!(
        closed_for_writing_within(&mut lingerer, BOUND).await,
        "the lingering connection kept its slot"
    );
}

/// Lingering connections have a budget of their own (25 % of the slots):
/// the fifth of 16 slots closes the oldest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_lingering_budget_the_oldest_is_closed() {
    let app = spawn_app_with(Backend::Sqlite, |c| {
        lingering_long(c);
        c.server.max_connections = 16;
        c.server.linger_share_percent = 25;
    })
    .await;
    let mut oldest = lingering(&app, ATTACKER).await;
    let mut others = Vec::new();
    for _ in 0..3 {
        others.push(lingering(&app, ATTACKER).await);
    }
    let fifth = lingering(&app, ATTACKER).await;
    assert!(
        closed_for_writing_within(&mut oldest, BOUND).await,
        "five connections lingered on a budget of four"
    );
    drop(fifth);
}

/// A byte every 300 ms never leaves lingering idle for long; the minimum
/// rate ends it after its grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickle_under_the_minimum_rate_ends_lingering() {
    let app = spawn_app_with(Backend::Sqlite, |c| {
        lingering_long(c);
        c.server.linger_idle_ms = 5_000;
        c.server.min_body_rate_bytes_per_sec = 500;
        c.server.min_body_rate_grace_ms = 1_000;
    })
    .await;
    let mut conn = lingering(&app, ATTACKER).await;
    let trickle = async {
        while conn.send(b"a").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    assert!(
        tokio::time::timeout(BOUND, trickle).await.is_ok(),
        "a trickle under the minimum rate kept its lingering connection"
    );
}

/// A body sent a byte at a time, within every idle bound, is refused 408
/// once it falls under the minimum rate, long before the body deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_trickled_under_the_minimum_rate_gets_408() {
    let app = spawn_app_with(Backend::Sqlite, |c| {
        quick(c);
        c.server.body_read_timeout_ms = 600_000;
        c.server.min_body_rate_bytes_per_sec = 500;
        c.server.min_body_rate_grace_ms = 1_000;
    })
    .await;
    let (_, key) = app.create_key(Tier::Enterprise, Some(1_000)).await;
    let conn = Conn::open(&app).await;
    let (mut reader, mut writer) = conn.stream.into_split();
    writer
        .write_all(post_head(&key, 1_000, "").as_bytes())
        .await
        .unwrap();
    let trickle = tokio::spawn(async move {
        while writer.write_all(b" ").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let mut answer = Vec::new();
    let read = tokio::time::timeout(BOUND, reader.read_to_end(&mut answer)).await;
    trickle.abort();
    assert!(read.is_ok(), "no answer to a trickled body");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(
        answer.contains("request_timeout") && answer.contains("500 bytes a second"),
        "{answer}"
    );
}

/// RFC 9112 lets a server refuse `chunked` applied twice and codings it
/// does not know; hyper frames by the last coding alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ambiguous_transfer_encodings_are_refused() {
    let app = spawn_app_with(Backend::Sqlite, quick).await;
    let (_, key) = app.create_key(Tier::Enterprise, Some(1_000)).await;
    let body = br#"{"input":[{"type":"text","text":"hello"}]}"#;
    let chunked = [
        format!("{:x}\r\n", body.len()).as_bytes(),
        body,
        b"\r\n0\r\n\r\n",
    ]
    .concat();
    let send = |codings: &'static str| {
        let (key, chunked) = (key.clone(), chunked.clone());
        let app = &app;
        async move {
            let mut conn = Conn::open(app).await;
            let head = format!(
                "POST /v1/moderate HTTP/1.1\r\nHost: test\r\nX-API-Key: {key}\r\n\
                 Content-Type: application/json\r\n{codings}\r\n"
            );
            conn.send(&[head.as_bytes(), &chunked].concat())
                .await
                .unwrap();
            conn.response_within(BOUND).await.expect("answered")
        }
    };
    // The same body, framed once, is served.
    assert_eq!(send("Transfer-Encoding: chunked\r\n").await.status, 200);
    for codings in [
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: chunked, chunked\r\n",
        "Transfer-Encoding: gzip, chunked\r\n",
    ] {
        let response = send(codings).await;
        assert_eq!(response.status, 400, "{codings}");
        let message = error_message(&response.body, "invalid_request");
        assert!(message.contains("Transfer-Encoding"), "{message}");
        assert_eq!(response.header("connection"), Some("close"), "{codings}");
    }
}

/// The metrics listener has the API's header timeout and a small cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_listener_closes_half_sent_headers_and_caps_connections() {
    let (_app, metrics) =
        spawn_app_with_metrics(Backend::Sqlite, |c| c.server.header_read_timeout_ms = 1_000).await;
    let address = metrics.trim_start_matches("http://").to_string();
    let mut half = Conn::to(&address).await;
    half.send(b"GET /metrics HTTP/1.1\r\nHost: te")
        .await
        .unwrap();
    assert!(
        half.closed_within(BOUND).await,
        "a half-sent header kept a metrics connection open"
    );
    // Four held connections from one address, then the fifth is refused.
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut conn = Conn::to(&address).await;
        conn.send(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n")
            .await
            .unwrap();
        let mut head = [0u8; 12];
        conn.stream.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
        held.push(conn);
    }
    let mut fifth = Conn::to(&address).await;
    let refused = fifth.response_within(BOUND).await.expect("503");
    assert_eq!(refused.status, 503);
}

/// Opens a connection from `source` and posts the oversized form, then
/// sends a byte a second until the server closes it or `stop`.
async fn trickle_from(app_address: std::net::SocketAddr, source: IpAddr, stop: CancellationToken) {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(std::net::SocketAddr::new(source, 0))
        .expect("bind");
    let Ok(mut stream) = socket.connect(app_address).await else {
        return;
    };
    if stream.write_all(oversized_form_head()).await.is_err() {
        return;
    }
    let trickle = async {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if stream.write_all(b"a").await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = trickle => {},
        () = stop.cancelled() => {},
    }
}

/// One request of a healthy client on a fresh connection; its time.
async fn timed(app: &TestApp, request: &[u8]) -> (u16, Duration) {
    let started = Instant::now();
    let mut conn = Conn::open(app).await;
    conn.send(request).await.expect("sent");
    let response = conn.response_within(BOUND).await.expect("answered");
    (response.status, started.elapsed())
}

/// Raises this process's soft limit on open files to what the attack needs
/// (a thousand sockets here and their other ends in the same process).
fn enough_open_files(needed: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write `limit`.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        if limit.rlim_cur < needed {
            assert!(
                limit.rlim_max >= needed,
                "this test needs {needed} open files; the hard limit is {}",
                limit.rlim_max
            );
            limit.rlim_cur = needed;
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
        }
    }
}

/// The acceptance test of issue 58: with 16 slots and the default cap per
/// client, 16 and then 1,000 sockets from one address, each posting an
/// oversized form and trickling a byte a second after its 413, leave
/// another address's `/health` and keyed `/v1/moderate` answering within a
/// second (before: `/health` did not answer within 20 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_trickling_sockets_from_one_address_leave_others_served() {
    enough_open_files(4_096);
    let mut app = spawn_app_with(Backend::Sqlite, |c| {
        quick(c);
        default_cap(c);
        c.server.max_connections = 16;
    })
    .await;
    // The readiness probe's pooled connection holds a slot: let it go.
    app.client = reqwest::Client::new();
    let (_, key) = app.create_key(Tier::Enterprise, Some(100_000)).await;
    let text = br#"{"input":[{"type":"text","text":"hello there"}]}"#;
    let moderate = [post_head(&key, text.len(), "").as_bytes(), text].concat();
    let address = app.base.trim_start_matches("http://").parse().unwrap();
    let stop = CancellationToken::new();
    let attack = |count: usize| {
        (0..count)
            .map(|_| tokio::spawn(trickle_from(address, ATTACKER, stop.clone())))
            .collect::<Vec<_>>()
    };
    let check = |phase: &'static str| {
        let app = &app;
        let moderate = &moderate;
        async move {
            for (what, request) in [("/health", HEALTH), ("/v1/moderate", moderate.as_slice())] {
                let (status, took) = timed(app, request).await;
                eprintln!("{phase}: {what} {status} in {took:?}");
                assert_eq!(status, 200, "{phase}: {what}");
                assert!(took < PROMPTLY, "{phase}: {what} took {took:?}");
            }
        }
    };
    let mut attackers = attack(16);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    check("16 trickling sockets").await;
    attackers.extend(attack(1_000));
    for round in 0..6 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        check(["1,000 more: 0.5 s", "1 s", "1.5 s", "2 s", "2.5 s", "3 s"][round]).await;
    }
    stop.cancel();
    for attacker in attackers {
        attacker.await.unwrap();
    }
}

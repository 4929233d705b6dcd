//! Serving connections with bounds: at most `max_connections` at once (more
//! wait in the listen backlog), at most `max_per_client` of them from one
//! client (the one past it is answered 503 at once and closed), and a
//! connection that does not deliver a complete request header within
//! `header_read_timeout` of opening or of its previous response is closed,
//! so slow, half-sent and idle connections cannot pile up. A keep-alive
//! connection serves at most `max_requests` requests and lives at most
//! `max_age`. (The body's own size, deadline and rate are the router's:
//! [`super::body`].)
//!
//! A connection whose last answer went out before its request's body was
//! read closes lingering, as nginx and Go's server do: our side is shut
//! for writing, and what the client still sends is read and discarded
//! (bounded in bytes, in time, and in time without a byte) before the
//! socket is closed. Closing at once
//! would make the kernel answer the unread bytes with a reset, and a client
//! that writes its whole body before reading (Python's `http.client`)
//! fails with a broken pipe instead of reading our 413. Lingering yields:
//! it has a budget of its own, ends a client that sends under a minimum
//! rate, and the oldest lingering connection is closed at once when the
//! budget is full or the server runs short of slots ([`lingering`]).
//!
//! Requests whose framing RFC 9112 lets a server refuse, and hyper does
//! not, are refused here ([`ambiguous_framing`]).
//!
//! HTTP/1.1 only: every bound here is an HTTP/1 one, and the API is served
//! behind ordinary clients and proxies that speak it.

mod clients;
mod lingering;

use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request};
use axum::http::header::{CONNECTION, TRANSFER_ENCODING};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use super::body::MinRate;
use super::error::{ApiError, ErrorBody, ErrorCode, ErrorObject};
use crate::access::client::client_key;
use crate::config::IpBlock;
use crate::metrics::names;
use clients::{ClientSlot, ClientSlots};
use lingering::{LingerTicket, Lingering};

/// The connection-level bounds.
#[derive(Clone, Debug)]
pub struct ConnectionLimits {
    /// Names the listener in metrics and logs (`api`, `metrics`).
    pub listener: &'static str,
    pub header_read_timeout: Duration,
    pub max_connections: usize,
    /// Connections open at once from one client key.
    pub max_per_client: usize,
    /// Peers not capped per client: proxies, whose clients are known only
    /// from a request's header (they must cap per client themselves).
    pub trusted_proxies: Arc<[IpBlock]>,
    /// Requests answered on one connection; the last says `Connection: close`.
    pub max_requests: u32,
    /// After this long a connection is closed once its request in flight
    /// is answered (at once when idle).
    pub max_age: Duration,
    pub linger: LingerLimits,
}

/// How long, and how much, a lingering close reads and discards.
#[derive(Clone, Copy, Debug)]
pub struct LingerLimits {
    /// In all (nginx's `lingering_time`).
    pub max_time: Duration,
    /// Without a byte from the client (nginx's `lingering_timeout`).
    pub max_idle: Duration,
    pub max_bytes: u64,
    /// Connections lingering at once; past it the oldest is closed.
    pub max_connections: usize,
    /// What the client still sends must keep up with this rate.
    pub min_rate: Option<MinRate>,
}

/// A connection's request to close lingering, set by the HTTP layer (as a
/// request extension) when it answers before the request's body was read.
#[derive(Clone, Debug, Default)]
pub struct Linger(Arc<AtomicBool>);

impl Linger {
    pub fn request(&self) {
        self.0.store(true, Ordering::Release);
    }

    fn requested(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// What every connection of one listener shares.
struct Shared {
    limits: ConnectionLimits,
    clients: Arc<ClientSlots>,
    lingering: Arc<Lingering>,
}

/// Serves `router` on `listener` until `shutdown` is cancelled, then lets
/// every open connection finish its request in flight and returns once all
/// are closed.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let shared = Arc::new(Shared {
        clients: ClientSlots::new(limits.max_per_client),
        lingering: Arc::default(),
        limits,
    });
    let headroom = near_full_headroom(shared.limits.max_connections);
    let connections = TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: do not spin.
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        // Past its client's cap a connection needs no slot: it is refused.
        let client = match admit(&shared, peer) {
            Admission::Counted(slot) => Some(slot),
            Admission::TrustedProxy => None,
            Admission::OverClientCap => {
                refuse_over_client_cap(&shared, stream, peer);
                continue;
            }
        };
        // Then a slot; while there is none, the next client waits here and
        // the ones behind it in the kernel's backlog, costing no task.
        let Some(permit) = slot_for_next(&slots, &shared.lingering, &shutdown).await else {
            break;
        };
        // Short of slots, lingering yields before anyone has to wait.
        if slots.available_permits() < headroom {
            shared.lingering.evict_oldest();
        }
        let router = router.clone();
        let shutdown = shutdown.clone();
        let shared = shared.clone();
        // The slots are held until the socket is closed, lingering included.
        connections.spawn(async move {
            serve_connection(stream, peer, router, &shared, shutdown).await;
            drop(client);
            drop(permit);
        });
    }
    connections.close();
    connections.wait().await;
}

/// A connection slot for a client that is waiting (accepted): while every
/// slot is taken, lingering connections yield theirs, oldest first (a
/// lingering client has its answer, the waiting one has not). `None` when
/// the server shuts down first.
async fn slot_for_next(
    slots: &Arc<Semaphore>,
    lingering: &Lingering,
    shutdown: &CancellationToken,
) -> Option<OwnedSemaphorePermit> {
    loop {
        if let Ok(permit) = slots.clone().try_acquire_owned() {
            return Some(permit);
        }
        // Listening before evicting: a connection that starts lingering
        // after this is heard, one before is in the registry.
        let entered = lingering.entered();
        tokio::pin!(entered);
        entered.as_mut().enable();
        lingering.evict_oldest();
        tokio::select! {
            permit = slots.clone().acquire_owned() => {
                return Some(permit.expect("the semaphore is never closed"));
            }
            // A connection began lingering meanwhile: it yields too.
            () = entered => {}
            () = shutdown.cancelled() => return None,
        }
    }
}

/// Free slots under which a new connection makes the oldest lingering one
/// close: a thirty-second of the slots, at least one.
fn near_full_headroom(max_connections: usize) -> usize {
    (max_connections / 32).max(1)
}

/// Whether a new connection is served, by its client's open connections.
enum Admission {
    /// One of the client's places, held while the connection is open.
    Counted(ClientSlot),
    /// A trusted proxy's: not capped here.
    TrustedProxy,
    OverClientCap,
}

fn admit(shared: &Arc<Shared>, peer: SocketAddr) -> Admission {
    let trusted = &shared.limits.trusted_proxies;
    if trusted.iter().any(|block| block.contains(peer.ip())) {
        return Admission::TrustedProxy;
    }
    match shared.clients.try_take(client_key(peer.ip())) {
        Some(slot) => Admission::Counted(slot),
        None => Admission::OverClientCap,
    }
}

/// Answers a connection past its client's cap without reading it: one
/// write of a prepared 503 that the socket's buffer takes at once (or not
/// at all), then the socket is closed. Its slot was never used.
fn refuse_over_client_cap(shared: &Shared, stream: TcpStream, peer: SocketAddr) {
    let limits = &shared.limits;
    metrics::counter!(names::CONNECTIONS_REFUSED, "listener" => limits.listener, "reason" => "per_client")
        .increment(1);
    let client = client_key(peer.ip());
    if shared.clients.should_log(client, Instant::now()) {
        tracing::warn!(
            %client,
            listener = limits.listener,
            max_per_client = limits.max_per_client,
            "refusing connections of a client over its connection cap (logged once a minute)"
        );
    }
    let _ = stream.try_write(over_client_cap_response());
}

/// Seconds a refused client is asked to wait.
const OVER_CAP_RETRY_AFTER_SECS: u64 = 5;

/// The 503 of a connection past its client's cap, in the API's words.
fn over_client_cap_response() -> &'static [u8] {
    static RESPONSE: OnceLock<Vec<u8>> = OnceLock::new();
    RESPONSE.get_or_init(|| {
        let body = ErrorBody {
            error: ErrorObject {
                code: ErrorCode::ServiceUnavailable,
                message: "too many connections from your address: close some, reuse keep-alive connections, and retry".into(),
            },
        };
        let body = serde_json::to_vec(&body).expect("an error body serialises");
        let head = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
             retry-after: {OVER_CAP_RETRY_AFTER_SECS}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        [head.into_bytes(), body].concat()
    })
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    shared: &Shared,
    shutdown: CancellationToken,
) {
    let limits = &shared.limits;
    let _ = stream.set_nodelay(true);
    let linger = Linger::default();
    let request_linger = linger.clone();
    let served = AtomicU32::new(0);
    let max_requests = limits.max_requests;
    // Boxed futures: hyper hands the socket back (for the lingering close)
    // only from a connection whose service and futures are `Unpin`.
    let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        request.extensions_mut().insert(request_linger.clone());
        let last = served.fetch_add(1, Ordering::Relaxed) + 1 >= max_requests;
        let refused = ambiguous_framing(request.headers());
        let close = last || refused.is_some();
        let router = router.clone();
        Box::pin(async move {
            let mut response = match refused {
                Some(error) => error.into_response(),
                None => router.oneshot(request).await?,
            };
            if close {
                // hyper closes the connection after a response that says so.
                response
                    .headers_mut()
                    .insert(CONNECTION, HeaderValue::from_static("close"));
            }
            Ok::<Response, std::convert::Infallible>(response)
        })
    });
    let mut connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), service);
    let result = tokio::select! {
        result = poll_fn(|cx| connection.poll_without_shutdown(cx)) => result,
        () = stop_serving(&shutdown, limits.max_age) => {
            // The request in flight is answered (`Connection: close`), an
            // idle connection is closed at once.
            std::pin::Pin::new(&mut connection).graceful_shutdown();
            poll_fn(|cx| connection.poll_without_shutdown(cx)).await
        }
    };
    if let Err(error) = result {
        // Timeouts, resets and malformed requests: the client's doing.
        tracing::debug!(%error, %peer, "connection ended with an error");
        return;
    }
    // Every response is written and flushed: the socket is ours again.
    let parts = connection.into_parts();
    let mut stream = parts.io.into_inner();
    if linger.requested() && !shutdown.is_cancelled() {
        let already_read = parts.read_buf.len() as u64;
        let ticket = shared.lingering.enter(limits.linger.max_connections);
        linger_close(stream, limits.linger, already_read, &shutdown, ticket).await;
    } else {
        let _ = stream.shutdown().await;
    }
}

/// Resolves when the server shuts down or the connection reaches its age.
async fn stop_serving(shutdown: &CancellationToken, max_age: Duration) {
    tokio::select! {
        () = shutdown.cancelled() => {},
        () = tokio::time::sleep(max_age) => {},
    }
}

/// Why a request's framing is refused, where hyper accepts it: RFC 9112
/// (6.1) forbids applying `chunked` more than once, and a server that
/// receives a transfer coding it does not understand should refuse it;
/// hyper reads only whether the last coding is `chunked`. A proxy in front
/// that reads the header differently would frame the body differently (a
/// smuggling risk), so such a request is answered 400 and the connection
/// closed.
fn ambiguous_framing(headers: &HeaderMap) -> Option<ApiError> {
    let mut codings = 0usize;
    let mut chunked = 0usize;
    for value in headers.get_all(TRANSFER_ENCODING) {
        let Ok(text) = value.to_str() else {
            return Some(framing_error());
        };
        for coding in text.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            codings += 1;
            chunked += usize::from(coding.eq_ignore_ascii_case("chunked"));
        }
    }
    (codings > 0 && !(codings == 1 && chunked == 1)).then(framing_error)
}

fn framing_error() -> ApiError {
    ApiError::InvalidRequest(
        "Transfer-Encoding must be `chunked`, once, or absent (send Content-Length instead)".into(),
    )
}

/// Shuts our side for writing (the client sees the answer end), then reads
/// and discards what the client still sends, through one small buffer,
/// until it closes its side, goes quiet for `max_idle`, falls under the
/// minimum rate, or `limits`, the server's shutdown or the connection's
/// eviction (to make room) end it.
async fn linger_close(
    mut stream: TcpStream,
    limits: LingerLimits,
    already_read: u64,
    shutdown: &CancellationToken,
    ticket: LingerTicket,
) {
    if stream.shutdown().await.is_err() {
        return;
    }
    let budget = limits.max_bytes.saturating_sub(already_read);
    tokio::select! {
        () = discard(&mut stream, budget, limits.max_idle, limits.min_rate) => {},
        () = tokio::time::sleep(limits.max_time) => {},
        () = shutdown.cancelled() => {},
        () = ticket.evicted.cancelled() => {},
    }
}

/// Reads and drops up to `budget` bytes, each read within `max_idle` and
/// all of them at `min_rate` at least.
async fn discard(
    stream: &mut TcpStream,
    budget: u64,
    max_idle: Duration,
    min_rate: Option<MinRate>,
) {
    let mut buffer = vec![0u8; DISCARD_BUFFER];
    let start = tokio::time::Instant::now();
    let mut left = budget;
    while left > 0 {
        let discarded = budget - left;
        let wait = match min_rate {
            Some(rate) => max_idle.min(
                (start + rate.allowance(discarded))
                    .saturating_duration_since(tokio::time::Instant::now()),
            ),
            None => max_idle,
        };
        match tokio::time::timeout(wait, stream.read(&mut buffer)).await {
            Ok(Ok(read)) if read > 0 => left = left.saturating_sub(read as u64),
            // The client closed its side, reset, went quiet or fell behind.
            _ => return,
        }
    }
}

/// What a lingering connection costs beyond its socket.
const DISCARD_BUFFER: usize = 8 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    fn framing(values: &[&str]) -> bool {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(TRANSFER_ENCODING, HeaderValue::from_str(value).unwrap());
        }
        ambiguous_framing(&headers).is_some()
    }

    #[test]
    fn only_a_single_chunked_coding_is_accepted() {
        assert!(!framing(&[]));
        assert!(!framing(&["chunked"]));
        assert!(!framing(&["Chunked"]));
        assert!(framing(&["chunked", "chunked"]));
        assert!(framing(&["chunked, chunked"]));
        assert!(framing(&["gzip, chunked"]));
        assert!(framing(&["identity"]));
        assert!(!framing(&["chunked", ""]));
    }

    #[test]
    fn the_over_cap_answer_is_a_whole_503_with_the_error_body() {
        let response = String::from_utf8(over_client_cap_response().to_vec()).unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "));
        assert!(head.contains("retry-after: 5"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["error"]["code"], "service_unavailable");
    }

    #[test]
    fn lingering_yields_when_few_slots_are_free() {
        assert_eq!(near_full_headroom(16), 1);
        assert_eq!(near_full_headroom(1024), 32);
    }
}

//! Serving connections with bounds: at most `max_connections` at once (more
//! wait in the listen backlog), and a connection that does not deliver a
//! complete request header within `header_read_timeout` of opening or of
//! its previous response is closed, so slow, half-sent and idle connections
//! cannot pile up. (The body's own size and deadline are the router's:
//! [`super::body`].)
//!
//! A connection whose last answer went out before its request's body was
//! read closes lingering, as nginx and Go's server do: our side is shut
//! for writing, and what the client still sends is read and discarded
//! (bounded in bytes, in time, and in time without a byte) before the
//! socket is closed. Closing at once
//! would make the kernel answer the unread bytes with a reset, and a client
//! that writes its whole body before reading (Python's `http.client`)
//! fails with a broken pipe instead of reading our 413.
//!
//! HTTP/1.1 only: every bound here is an HTTP/1 one, and the API is served
//! behind ordinary clients and proxies that speak it.

use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, Request};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// The connection-level bounds.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    pub header_read_timeout: Duration,
    pub max_connections: usize,
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
    let connections = TaskTracker::new();
    loop {
        // A slot first, then the connection: past the cap, clients wait in
        // the kernel's backlog instead of costing a task each.
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            () = shutdown.cancelled() => break,
        };
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
        let router = router.clone();
        let shutdown = shutdown.clone();
        // The slot is held until the socket is closed, lingering included.
        connections.spawn(async move {
            serve_connection(stream, peer, router, limits, shutdown).await;
            drop(permit);
        });
    }
    connections.close();
    connections.wait().await;
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    let linger = Linger::default();
    let request_linger = linger.clone();
    // Boxed futures: hyper hands the socket back (for the lingering close)
    // only from a connection whose service and futures are `Unpin`.
    let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        request.extensions_mut().insert(request_linger.clone());
        Box::pin(router.clone().oneshot(request))
    });
    let mut connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), service);
    let result = tokio::select! {
        result = poll_fn(|cx| connection.poll_without_shutdown(cx)) => result,
        () = shutdown.cancelled() => {
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
        linger_close(stream, limits.linger, already_read, &shutdown).await;
    } else {
        let _ = stream.shutdown().await;
    }
}

/// Shuts our side for writing (the client sees the answer end), then reads
/// and discards what the client still sends, through one small buffer,
/// until it closes its side, goes quiet for `max_idle`, or `limits` or the
/// server's shutdown end it.
async fn linger_close(
    mut stream: TcpStream,
    limits: LingerLimits,
    already_read: u64,
    shutdown: &CancellationToken,
) {
    if stream.shutdown().await.is_err() {
        return;
    }
    let budget = limits.max_bytes.saturating_sub(already_read);
    tokio::select! {
        () = discard(&mut stream, budget, limits.max_idle) => {},
        () = tokio::time::sleep(limits.max_time) => {},
        () = shutdown.cancelled() => {},
    }
}

/// Reads and drops up to `budget` bytes, each read within `max_idle`.
async fn discard(stream: &mut TcpStream, budget: u64, max_idle: Duration) {
    let mut buffer = vec![0u8; DISCARD_BUFFER];
    let mut left = budget;
    while left > 0 {
        match tokio::time::timeout(max_idle, stream.read(&mut buffer)).await {
            Ok(Ok(read)) if read > 0 => left = left.saturating_sub(read as u64),
            // The client closed its side, reset, or went quiet.
            _ => return,
        }
    }
}

/// What a lingering connection costs beyond its socket.
const DISCARD_BUFFER: usize = 8 * 1024;

//! Serving connections with bounds: at most `max_connections` at once (more
//! wait in the listen backlog), and a connection that does not deliver a
//! complete request header within `header_read_timeout` of opening or of
//! its previous response is closed, so slow, half-sent and idle connections
//! cannot pile up. (The body's own deadline is the extractor's.)
//!
//! HTTP/1.1 only: every bound here is an HTTP/1 one, and the API is served
//! behind ordinary clients and proxies that speak it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, Request};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
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
    let service = router.map_request(move |mut request: Request<Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        request
    });
    let service = TowerToHyperService::new(service);
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), service);
    let mut connection = std::pin::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        () = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = result {
        // Timeouts, resets and malformed requests: the client's doing.
        tracing::debug!(%error, %peer, "connection ended with an error");
    }
}

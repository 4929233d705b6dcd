//! One bound on every request body, whatever route or extractor reads it:
//! at most `max_bytes`, all of it within `read_timeout` of the request's
//! header. The outermost layer ([`bound_body`]) applies the service's
//! limits; a part of the router with smaller bodies (the dashboard's forms)
//! narrows the size with [`narrow`].
//!
//! The bound is in the body itself, so an extractor that knows nothing of
//! it (axum's `Form`, `Bytes`) still stops at the deadline; extractors that
//! answer for themselves find the reason with [`BodyError::of`] and say 408
//! or 413 in the API's words (see `extract::read_body`).
//!
//! The same layer watches whether the body was read to its end. A response
//! sent before that (413 on the declared length, 401 or 429 before reading,
//! 415, 408) says `Connection: close`; except after a 408, it also asks the
//! connection to linger ([`super::serve::Linger`]): to read and discard what
//! the client still sends before closing, so that a client that writes its
//! whole body before reading gets to read the answer instead of a reset.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::extract::{Request, State};
use axum::http::header::CONNECTION;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::body::{Frame, SizeHint};
use tokio::time::Sleep;

use super::error::ApiError;
use super::serve::Linger;

/// The largest body a route reads and how long it may take to arrive; set
/// as a request extension by [`bound_body`] (and [`narrow`]) for the
/// extractors that check a declared length before reading.
#[derive(Clone, Copy, Debug)]
pub struct BodyLimits {
    pub max_bytes: usize,
    /// A client that announces a body and never sends it must not hold a
    /// connection and its task for longer.
    pub read_timeout: Duration,
}

/// Why a bounded body stopped early.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("the request body did not arrive within {} ms; send it whole and promptly", .0.as_millis())]
    TimedOut(Duration),
    #[error("the request body is larger than the limit of {0} bytes")]
    TooLarge(usize),
}

impl BodyError {
    /// The bound behind a body read's error, however many layers wrapped it.
    pub fn of(error: &(dyn std::error::Error + 'static)) -> Option<BodyError> {
        std::iter::successors(Some(error), |e| e.source())
            .find_map(|e| e.downcast_ref::<BodyError>())
            .copied()
    }
}

/// What a request's handling did with its body, seen by [`bound_body`].
#[derive(Default)]
struct BodyWatch {
    finished: AtomicBool,
    timed_out: AtomicBool,
}

/// The outermost body layer: bounds the body by `limits`, and decides how
/// the connection ends when the response goes out before the body was read.
pub async fn bound_body(
    State(limits): State<BodyLimits>,
    request: Request,
    next: Next,
) -> Response {
    let (mut parts, body) = request.into_parts();
    let watch = Arc::new(BodyWatch::default());
    let body = BoundedBody::new(
        body,
        limits.max_bytes,
        Some(limits.read_timeout),
        watch.clone(),
    );
    parts.extensions.insert(limits);
    let linger = parts.extensions.get::<Linger>().cloned();
    let mut response = next.run(Request::from_parts(parts, Body::new(body))).await;
    if !watch.finished.load(Ordering::Acquire) {
        // The rest of the body is still on the connection, which cannot
        // carry another request: say so, so that a keep-alive client does
        // not send its next request into a closed connection.
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        // A client too slow to send its body in time would hold its slot
        // for the linger too (nginx does not linger after a body timeout
        // either): it is closed at once, which frees the slot.
        if !watch.timed_out.load(Ordering::Acquire) {
            if let Some(linger) = linger {
                linger.request();
            }
        }
    }
    response
}

/// Narrows the body of the requests of one part of the router to
/// `max_bytes` (within the deadline the outer [`bound_body`] set).
pub async fn narrow(State(max_bytes): State<usize>, mut request: Request, next: Next) -> Response {
    let Some(outer) = request.extensions().get::<BodyLimits>().copied() else {
        // Without the outer layer there is no deadline either: a
        // construction bug, refused rather than read unbounded.
        return ApiError::Internal("the body layer is missing from the router".into())
            .into_response();
    };
    let limits = BodyLimits {
        max_bytes: max_bytes.min(outer.max_bytes),
        ..outer
    };
    request.extensions_mut().insert(limits);
    let request = request.map(|body| {
        Body::new(BoundedBody::new(
            body,
            limits.max_bytes,
            None,
            Arc::default(),
        ))
    });
    next.run(request).await
}

/// A body that fails with [`BodyError`] past its size or its deadline, and
/// records in its watch when it was read to the end or timed out.
struct BoundedBody {
    inner: Body,
    limit: usize,
    read: usize,
    /// The deadline, and the timeout it was set from (for the message).
    deadline: Option<(Pin<Box<Sleep>>, Duration)>,
    watch: Arc<BodyWatch>,
}

impl BoundedBody {
    /// `read_timeout`, when given, runs from now.
    fn new(
        inner: Body,
        limit: usize,
        read_timeout: Option<Duration>,
        watch: Arc<BodyWatch>,
    ) -> BoundedBody {
        if inner.is_end_stream() {
            watch.finished.store(true, Ordering::Release);
        }
        BoundedBody {
            inner,
            limit,
            read: 0,
            deadline: read_timeout.map(|timeout| (Box::pin(tokio::time::sleep(timeout)), timeout)),
            watch,
        }
    }
}

impl HttpBody for BoundedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if polled.is_pending() {
            let Some((deadline, timeout)) = this.deadline.as_mut() else {
                return Poll::Pending;
            };
            ready!(deadline.as_mut().poll(cx));
            this.watch.timed_out.store(true, Ordering::Release);
            let error = BodyError::TimedOut(*timeout);
            return Poll::Ready(Some(Err(axum::Error::new(error))));
        }
        let polled = ready!(polled);
        if let Some(Ok(frame)) = &polled {
            this.read += frame.data_ref().map_or(0, |d| d.len());
            if this.read > this.limit {
                return Poll::Ready(Some(Err(axum::Error::new(BodyError::TooLarge(this.limit)))));
            }
        }
        if polled.is_none() || this.inner.is_end_stream() {
            this.watch.finished.store(true, Ordering::Release);
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounded(body: Body, limit: usize, timeout: Option<Duration>) -> Body {
        Body::new(BoundedBody::new(body, limit, timeout, Arc::default()))
    }

    async fn failure(body: Body) -> Option<BodyError> {
        let error = axum::body::to_bytes(body, usize::MAX).await.unwrap_err();
        BodyError::of(&error)
    }

    #[tokio::test]
    async fn a_body_past_its_limit_fails_as_too_large_however_wrapped() {
        let body = bounded(Body::from(vec![b'x'; 100]), 10, None);
        assert_eq!(failure(body).await, Some(BodyError::TooLarge(10)));
        let outer = bounded(Body::from(vec![b'x'; 100]), 1_000, None);
        let narrowed = bounded(outer, 10, None);
        assert_eq!(failure(narrowed).await, Some(BodyError::TooLarge(10)));
        let within = bounded(Body::from(vec![b'x'; 10]), 10, None);
        assert_eq!(axum::body::to_bytes(within, 100).await.unwrap().len(), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stalls_fails_at_its_deadline() {
        let stalled = futures::stream::pending::<Result<bytes::Bytes, std::io::Error>>();
        let timeout = Duration::from_secs(30);
        let body = bounded(Body::from_stream(stalled), 100, Some(timeout));
        assert_eq!(failure(body).await, Some(BodyError::TimedOut(timeout)));
    }
}

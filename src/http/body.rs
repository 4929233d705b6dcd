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

use tokio::time::Instant;

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
    /// ...nor one that sends it a byte now and then (Apache's
    /// `mod_reqtimeout` `MinRate`).
    pub min_rate: Option<MinRate>,
}

/// A minimum rate for bytes a client sends: after `grace`, every
/// `bytes_per_sec` bytes buy one more second. A trickle that stays under
/// every idle bound still falls behind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MinRate {
    bytes_per_sec: u64,
    grace: Duration,
}

impl MinRate {
    /// `None` when `bytes_per_sec` is 0 (no minimum).
    pub fn new(bytes_per_sec: u64, grace: Duration) -> Option<MinRate> {
        (bytes_per_sec > 0).then_some(MinRate {
            bytes_per_sec,
            grace,
        })
    }

    pub fn bytes_per_sec(&self) -> u64 {
        self.bytes_per_sec
    }

    /// How long after the start a client that has sent `received` bytes may
    /// take before it has fallen under the rate.
    pub fn allowance(&self, received: u64) -> Duration {
        self.grace + Duration::from_secs_f64(received as f64 / self.bytes_per_sec as f64)
    }
}

/// Why a bounded body stopped early.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("the request body did not arrive within {} ms; send it whole and promptly", .0.as_millis())]
    TimedOut(Duration),
    #[error("the request body is larger than the limit of {0} bytes")]
    TooLarge(usize),
    #[error("the request body arrived slower than {0} bytes a second; send it whole and promptly")]
    TooSlow(u64),
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
    )
    .with_min_rate(limits.min_rate);
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
        // A client too slow to send its body in time (or at the minimum
        // rate) would hold its slot for the linger too (nginx does not linger after a body timeout
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
    /// The minimum rate, from when the body started, and the time by which
    /// the bytes read so far must be followed by more.
    min_rate: Option<(MinRate, Instant, Pin<Box<Sleep>>)>,
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
            min_rate: None,
            watch,
        }
    }

    /// The rate runs from now.
    fn with_min_rate(mut self, min_rate: Option<MinRate>) -> BoundedBody {
        self.min_rate = min_rate.map(|rate| {
            let start = Instant::now();
            let behind = Box::pin(tokio::time::sleep_until(start + rate.allowance(0)));
            (rate, start, behind)
        });
        self
    }

    /// Whether the client has fallen under the minimum rate (and, if not,
    /// the waker is registered for when it would).
    fn fell_behind(&mut self, cx: &mut Context<'_>) -> Option<BodyError> {
        let (rate, _, behind) = self.min_rate.as_mut()?;
        behind
            .as_mut()
            .poll(cx)
            .is_ready()
            .then(|| BodyError::TooSlow(rate.bytes_per_sec()))
    }

    fn received(&mut self, bytes: usize) {
        self.read += bytes;
        if let Some((rate, start, behind)) = self.min_rate.as_mut() {
            behind
                .as_mut()
                .reset(*start + rate.allowance(self.read as u64));
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
            let timed_out = this.deadline.as_mut().and_then(|(deadline, timeout)| {
                deadline
                    .as_mut()
                    .poll(cx)
                    .is_ready()
                    .then_some(BodyError::TimedOut(*timeout))
            });
            let Some(error) = timed_out.or_else(|| this.fell_behind(cx)) else {
                return Poll::Pending;
            };
            this.watch.timed_out.store(true, Ordering::Release);
            return Poll::Ready(Some(Err(axum::Error::new(error))));
        }
        let polled = ready!(polled);
        if let Some(Ok(frame)) = &polled {
            this.received(frame.data_ref().map_or(0, |d| d.len()));
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

    /// A byte a second never stalls long enough for an idle bound, and
    /// would take the whole deadline: the rate ends it after its grace.
    #[tokio::test(start_paused = true)]
    async fn a_trickle_under_the_minimum_rate_fails_after_the_grace() {
        let trickle = futures::stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Some((Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"x")), ()))
        });
        let rate = MinRate::new(100, Duration::from_secs(5));
        let started = Instant::now();
        let body = Body::new(
            BoundedBody::new(
                Body::from_stream(trickle),
                1 << 20,
                Some(Duration::from_secs(30)),
                Arc::default(),
            )
            .with_min_rate(rate),
        );
        assert_eq!(failure(body).await, Some(BodyError::TooSlow(100)));
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(5) && took < Duration::from_secs(6),
            "{took:?}"
        );
        // Fast enough: read whole.
        let whole: Result<_, std::io::Error> = Ok(bytes::Bytes::from(vec![b'x'; 1000]));
        let fast = futures::stream::iter(vec![whole]);
        let body = Body::new(
            BoundedBody::new(Body::from_stream(fast), 1 << 20, None, Arc::default())
                .with_min_rate(rate),
        );
        assert_eq!(
            axum::body::to_bytes(body, 1 << 20).await.unwrap().len(),
            1000
        );
        assert_eq!(MinRate::new(0, Duration::from_secs(5)), None);
    }
}

//! The outermost layer: signs every response the service sends (RFC 9421
//! over `@status`, `content-type`, `content-digest` and `x-request-id`, and
//! over the request it answers: `"@method";req`, `"@path";req`,
//! `"content-digest";req` and the client's nonce; see [`crate::signing`]).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::{Body, HttpBody};
use axum::extract::{Request, State};
use axum::http::{header, HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use sha2::{Digest, Sha256};

use super::error::ApiError;
use super::request_id::{RequestId, HEADER as REQUEST_ID};
use crate::signing::{
    AnsweredRequest, BodyDigest, ClientNonce, ResponseSigner, SignedResponse, NONCE_HEADER,
};

/// Responses are JSON documents well below this; anything larger is a bug.
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

pub async fn sign(
    State(signer): State<Arc<ResponseSigner>>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    let nonce = parts
        .headers
        .get(NONCE_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(ClientNonce::parse);
    let method = parts.method.as_str().to_owned();
    let path = parts.uri.path().to_owned();
    let (body, digest) = HashedBody::wrap(body);
    let response = next.run(Request::from_parts(parts, body)).await;
    let answered = AnsweredRequest {
        method,
        path,
        body: digest.finish(),
        nonce,
    };
    sign_response(&signer, response, &answered).await
}

async fn sign_response(
    signer: &ResponseSigner,
    response: Response,
    request: &AnsweredRequest,
) -> Response {
    let (mut parts, body) = response.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_RESPONSE_BYTES).await {
        Ok(bytes) => bytes,
        Err(error) => {
            let replacement = ApiError::Internal(format!(
                "response body could not be buffered for signing: {error}"
            ));
            let (new_parts, new_body) = replacement.into_response().into_parts();
            let request_id = parts.headers.get(REQUEST_ID).cloned();
            parts = new_parts;
            if let Some(id) = request_id {
                parts.headers.insert(REQUEST_ID, id);
            }
            axum::body::to_bytes(new_body, MAX_RESPONSE_BYTES)
                .await
                .unwrap_or_default()
        }
    };
    let headers = &mut parts.headers;
    if !headers.contains_key(header::CONTENT_TYPE) {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    if !headers.contains_key(REQUEST_ID) {
        if let Ok(value) = HeaderValue::from_str(&RequestId::generate().0) {
            headers.insert(REQUEST_ID, value);
        }
    }
    // The echo is what the signature covers, so it is the nonce itself.
    match &request.nonce {
        Some(nonce) => {
            if let Ok(value) = HeaderValue::from_str(nonce.as_str()) {
                headers.insert(HeaderName::from_static(NONCE_HEADER), value);
            }
        }
        None => {
            headers.remove(NONCE_HEADER);
        }
    }
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let (content_type, request_id) = (text(header::CONTENT_TYPE.as_str()), text(REQUEST_ID));
    let signed = signer.sign_response(
        &SignedResponse {
            status: parts.status.as_u16(),
            content_type: &content_type,
            request_id: &request_id,
            body: &bytes,
        },
        request,
        chrono::Utc::now().timestamp(),
    );
    for (name, value) in [
        ("content-digest", signed.content_digest),
        ("signature-input", signed.signature_input),
        ("signature", signed.signature),
    ] {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
    Response::from_parts(parts, Body::from(bytes))
}

/// The SHA-256 of a request body as the handlers read it, known once the
/// body was read to its end. Hashing as it streams keeps the body limits and
/// read timeout where they are (in the extractors): nothing here buffers.
#[derive(Clone, Default)]
struct RunningDigest(Arc<Mutex<DigestState>>);

#[derive(Default)]
struct DigestState {
    hasher: Sha256,
    finished: bool,
}

impl RunningDigest {
    fn update(&self, bytes: &[u8]) {
        if let Ok(mut state) = self.0.lock() {
            state.hasher.update(bytes);
        }
    }

    fn mark_finished(&self) {
        if let Ok(mut state) = self.0.lock() {
            state.finished = true;
        }
    }

    fn finish(&self) -> BodyDigest {
        let Ok(state) = self.0.lock() else {
            return BodyDigest::NotRead;
        };
        if !state.finished {
            return BodyDigest::NotRead;
        }
        let hash = state.hasher.clone().finalize();
        BodyDigest::Read(format!("sha-256=:{}:", STANDARD.encode(hash)))
    }
}

/// A request body that feeds what passes through it to a [`RunningDigest`].
struct HashedBody {
    inner: Body,
    digest: RunningDigest,
}

impl HashedBody {
    fn wrap(inner: Body) -> (Body, RunningDigest) {
        let digest = RunningDigest::default();
        if inner.is_end_stream() {
            digest.mark_finished();
        }
        let body = Body::new(HashedBody {
            inner,
            digest: digest.clone(),
        });
        (body, digest)
    }
}

impl HttpBody for HashedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.digest.update(data);
                }
                if self.inner.is_end_stream() {
                    self.digest.mark_finished();
                }
            }
            Poll::Ready(None) => self.digest.mark_finished(),
            Poll::Ready(Some(Err(_))) | Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn the_digest_is_of_the_body_read_whole_and_only_then() {
        let (body, digest) = HashedBody::wrap(Body::from("{\"hello\": \"world\"}"));
        assert_eq!(digest.finish(), BodyDigest::NotRead);
        body.collect().await.unwrap();
        // RFC 9530 §B.2.
        assert_eq!(
            digest.finish(),
            BodyDigest::Read("sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:".into())
        );
        let (_, empty) = HashedBody::wrap(Body::empty());
        assert_eq!(
            empty.finish(),
            BodyDigest::Read(crate::signing::content_digest(b""))
        );
    }
}

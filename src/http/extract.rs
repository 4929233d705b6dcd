//! A JSON body extractor whose every rejection is an `ApiError` naming what
//! to fix: the content type, the size limit, or the JSON path of the field.

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_TYPE;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// The largest body the extractor reads, set per router as an extension.
#[derive(Clone, Copy, Debug)]
pub struct BodyLimit(pub usize);

pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, _state: &S) -> Result<Self, ApiError> {
        check_content_type(
            request
                .headers()
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
        )?;
        let limit = request
            .extensions()
            .get::<BodyLimit>()
            .map_or(usize::MAX, |l| l.0);
        let bytes = read_body(request.into_body(), limit).await?;
        // serde would read a struct from an array too; the API takes objects only.
        if let Some(first) = bytes.iter().find(|b| !b.is_ascii_whitespace()) {
            if *first != b'{' && serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).is_ok() {
                return Err(ApiError::InvalidRequest(
                    "the request body must be a JSON object".into(),
                ));
            }
        }
        parse_json(&bytes).map(JsonBody)
    }
}

fn check_content_type(content_type: Option<&str>) -> Result<(), ApiError> {
    let essence = content_type
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase());
    match essence.as_deref() {
        Some("application/json") => Ok(()),
        Some(other) => Err(ApiError::UnsupportedMediaType(format!(
            "Content-Type {other:?} is not supported: send the body as application/json"
        ))),
        None => Err(ApiError::UnsupportedMediaType(
            "the Content-Type header is missing: send application/json".into(),
        )),
    }
}

/// A client that announces a body and never sends it must not hold a
/// connection and its task forever.
const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

async fn read_body(body: Body, limit: usize) -> Result<bytes::Bytes, ApiError> {
    let read = tokio::time::timeout(BODY_READ_TIMEOUT, axum::body::to_bytes(body, limit))
        .await
        .map_err(|_| {
            ApiError::InvalidRequest("the request body did not arrive within 30 seconds".into())
        })?;
    read.map_err(|error| {
        let too_large = std::error::Error::source(&error)
            .is_some_and(|source| source.is::<http_body_util::LengthLimitError>())
            || error.to_string().contains("length limit");
        if too_large {
            ApiError::PayloadTooLarge(format!(
                "the request body is larger than the limit of {limit} bytes"
            ))
        } else {
            ApiError::InvalidRequest("the request body could not be read completely".into())
        }
    })
}

/// Deserialises, reporting the JSON path of the offending field.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let deserializer = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(deserializer).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        let message = match inner.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                format!("the request body is not valid JSON: {inner}")
            }
            _ if path == "." || path.is_empty() => {
                format!("the request body is not a valid request: {inner}")
            }
            // Item parsers continue the path themselves (`.text: ...`).
            _ if inner.to_string().starts_with(['.', ':']) => format!("{path}{inner}"),
            _ => format!("{path}: {inner}"),
        };
        ApiError::InvalidRequest(message)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types() {
        assert!(check_content_type(Some("application/json")).is_ok());
        assert!(check_content_type(Some("Application/JSON; charset=utf-8")).is_ok());
        assert!(matches!(
            check_content_type(Some("text/plain")),
            Err(ApiError::UnsupportedMediaType(_))
        ));
        assert!(matches!(
            check_content_type(None),
            Err(ApiError::UnsupportedMediaType(_))
        ));
    }

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Outer {
        items: Vec<Inner>,
    }
    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Inner {
        text: String,
    }

    #[test]
    fn errors_name_the_field_path() {
        let err = parse_json::<Outer>(br#"{"items":[{"text":"a"},{"text":5}]}"#)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("items[1].text:"), "{err}");
        let err = parse_json::<Outer>(b"{nope").unwrap_err().to_string();
        assert!(err.contains("not valid JSON"), "{err}");
    }
}

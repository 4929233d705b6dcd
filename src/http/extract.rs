//! A JSON body extractor whose every rejection is an `ApiError` naming what
//! to fix: the content type, encoding or charset, the size limit, a
//! duplicate key, or the JSON path of the field.
//!
//! Everything is checked that can be before the body is read: a declared
//! length over the limit is refused at once. The body's size and deadline
//! are the router's ([`super::body`]); this maps them to 413 and 408.

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::HeaderMap;
use serde::de::DeserializeOwned;

use super::body::BodyError;
pub use super::body::BodyLimits;
use super::error::ApiError;

pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, _state: &S) -> Result<Self, ApiError> {
        // Without the limits the body would be unbounded: a construction bug.
        let limits = *request.extensions().get::<BodyLimits>().ok_or_else(|| {
            ApiError::Internal("the BodyLimits extension is missing from the router".into())
        })?;
        check_headers(request.headers(), limits.max_bytes)?;
        let bytes = read_body(request.into_body(), limits).await?;
        if let Some(problem) = super::strict_json::check(&bytes) {
            return Err(ApiError::InvalidRequest(problem));
        }
        parse_json(&bytes).map(JsonBody)
    }
}

/// What the headers alone can refuse: the media type, charset and encoding
/// (the body would be misread otherwise), and a declared length over the limit.
fn check_headers(headers: &HeaderMap, max_bytes: usize) -> Result<(), ApiError> {
    check_content_type(headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()))?;
    check_content_encoding(headers)?;
    check_declared_length(headers, max_bytes)
}

fn check_content_type(content_type: Option<&str>) -> Result<(), ApiError> {
    let Some(content_type) = content_type else {
        return Err(ApiError::UnsupportedMediaType(
            "the Content-Type header is missing: send application/json".into(),
        ));
    };
    let mut parts = content_type.split(';');
    let essence = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
    if essence != "application/json" {
        return Err(ApiError::UnsupportedMediaType(format!(
            "Content-Type {essence:?} is not supported: send the body as application/json"
        )));
    }
    for parameter in parts {
        let (name, value) = parameter.split_once('=').unwrap_or((parameter, ""));
        let value = value.trim().trim_matches('"');
        if name.trim().eq_ignore_ascii_case("charset")
            && !value.eq_ignore_ascii_case("utf-8")
            && !value.eq_ignore_ascii_case("utf8")
        {
            return Err(ApiError::UnsupportedMediaType(format!(
                "charset {value:?} is not supported: send the body as UTF-8 (charset=utf-8)"
            )));
        }
    }
    Ok(())
}

/// The body is read as sent: an encoded body would be misread, not decoded.
pub(crate) fn check_content_encoding(headers: &HeaderMap) -> Result<(), ApiError> {
    for value in headers.get_all(CONTENT_ENCODING) {
        let text = value.to_str().unwrap_or("(not text)");
        for coding in text.split(',').map(str::trim) {
            if !coding.is_empty() && !coding.eq_ignore_ascii_case("identity") {
                return Err(ApiError::UnsupportedMediaType(format!(
                    "Content-Encoding {coding:?} is not supported: send the body unencoded"
                )));
            }
        }
    }
    Ok(())
}

pub(crate) fn check_declared_length(headers: &HeaderMap, max_bytes: usize) -> Result<(), ApiError> {
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match declared {
        Some(length) if length > max_bytes as u64 => Err(ApiError::PayloadTooLarge(format!(
            "the request body is {length} bytes, more than the limit of {max_bytes} bytes"
        ))),
        _ => Ok(()),
    }
}

/// Reads the whole body (bounded in size and time by the router's body
/// layer, and by `limits.max_bytes` here too), naming the bound it broke.
pub(crate) async fn read_body(body: Body, limits: BodyLimits) -> Result<bytes::Bytes, ApiError> {
    let limit = limits.max_bytes;
    axum::body::to_bytes(body, limit).await.map_err(|error| {
        let too_large = || {
            std::error::Error::source(&error)
                .is_some_and(|source| source.is::<http_body_util::LengthLimitError>())
                || error.to_string().contains("length limit")
        };
        match BodyError::of(&error) {
            Some(bound @ (BodyError::TimedOut(_) | BodyError::TooSlow(_))) => {
                ApiError::RequestTimeout(bound.to_string())
            }
            Some(bound @ BodyError::TooLarge(_)) => ApiError::PayloadTooLarge(bound.to_string()),
            None if too_large() => {
                ApiError::PayloadTooLarge(BodyError::TooLarge(limit).to_string())
            }
            None => {
                ApiError::InvalidRequest("the request body could not be read completely".into())
            }
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
        assert!(check_content_type(Some("application/json; charset=\"UTF-8\"")).is_ok());
        for refused in [
            "application/json; charset=utf-16",
            "application/json;charset=ISO-8859-1",
        ] {
            let err = check_content_type(Some(refused)).unwrap_err();
            assert!(
                matches!(err, ApiError::UnsupportedMediaType(_)),
                "{refused}"
            );
            assert!(err.to_string().contains("charset"), "{err}");
        }
        assert!(matches!(
            check_content_type(Some("text/plain")),
            Err(ApiError::UnsupportedMediaType(_))
        ));
        assert!(matches!(
            check_content_type(None),
            Err(ApiError::UnsupportedMediaType(_))
        ));
    }

    #[test]
    fn encodings_other_than_identity_are_refused() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(CONTENT_ENCODING, value.parse().unwrap());
            check_content_encoding(&headers)
        };
        assert!(check_content_encoding(&HeaderMap::new()).is_ok());
        assert!(with("identity").is_ok());
        for refused in ["gzip", "br", "identity, deflate", "x-whatever"] {
            assert!(
                matches!(with(refused), Err(ApiError::UnsupportedMediaType(_))),
                "{refused}"
            );
        }
    }

    #[test]
    fn declared_length_over_the_limit_is_refused_before_reading() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(CONTENT_LENGTH, value.parse().unwrap());
            check_declared_length(&headers, 100)
        };
        assert!(with("100").is_ok());
        assert!(matches!(with("101"), Err(ApiError::PayloadTooLarge(_))));
        assert!(matches!(
            with("99999999999999999999"),
            Ok(()) | Err(ApiError::PayloadTooLarge(_))
        ));
    }

    #[tokio::test]
    async fn without_the_limits_extension_the_extractor_refuses_with_500() {
        let request = Request::builder()
            .method("POST")
            .header(CONTENT_TYPE, "application/json")
            .body(Body::from("{}"))
            .unwrap();
        let result = JsonBody::<serde_json::Value>::from_request(request, &()).await;
        assert!(matches!(result, Err(ApiError::Internal(_))));
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

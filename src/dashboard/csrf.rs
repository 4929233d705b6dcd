//! What stops another site from making a browser act on the dashboard,
//! besides the per-session token and `SameSite=Strict` cookies:
//!
//! - State-changing requests whose `Origin` is not the dashboard's own, or
//!   whose `Sec-Fetch-Site` is anything but `same-origin` (or `none`, a
//!   request the user made), are refused with 403. `same-site` is refused
//!   too: a sibling subdomain is exactly who can toss cookies at us.
//!   Requests with neither header (not from a browser) pass on to the token.
//! - The pre-sign-in form token is signed with a server secret and dated, so
//!   a cookie planted by someone else must at least be one the server gave
//!   out within the hour; with `cookie_secure` its cookie is `__Host-`, which
//!   no subdomain can set.

use axum::extract::Request;
use axum::http::header::{HOST, ORIGIN};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

use super::error::DashError;
use crate::access::keys::Pepper;

/// Refuses a state-changing request from another origin (403).
pub async fn same_origin_only(request: Request, next: Next) -> Response {
    let authority = request.uri().authority().map(|a| a.as_str().to_owned());
    if !request.method().is_safe() && from_another_origin(request.headers(), authority.as_deref()) {
        return DashError::CrossOrigin.into_response();
    }
    next.run(request).await
}

/// Whether the browser says the request comes from a page of another origin
/// than the one it is sent to (`Host`, else the request line's authority).
fn from_another_origin(headers: &HeaderMap, authority: Option<&str>) -> bool {
    let text = |name| headers.get(name).map(|v| v.to_str().unwrap_or_default());
    if let Some(site) = text("sec-fetch-site") {
        if !matches!(site, "same-origin" | "none") {
            return true;
        }
    }
    let Some(origin) = text(ORIGIN.as_str()) else {
        return false;
    };
    let host = text(HOST.as_str()).or(authority).unwrap_or_default();
    // `null` (a sandboxed or privacy-redirected page) has no scheme.
    let origin_authority = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"));
    match origin_authority {
        Some(authority) => host.is_empty() || !authority.eq_ignore_ascii_case(host),
        None => true,
    }
}

/// How long a pre-sign-in form token is accepted after it was issued.
pub const FORM_TOKEN_SECONDS: i64 = 3600;

/// The key that signs pre-sign-in form tokens.
pub struct FormTokenKey([u8; 32]);

impl FormTokenKey {
    pub fn new(pepper: &Pepper) -> FormTokenKey {
        FormTokenKey(pepper.derive("moderato dashboard pre-session form token v1"))
    }

    fn mac(&self, issued: i64, nonce: &str) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(format!("{issued}.{nonce}").as_bytes());
        mac
    }

    /// `<issued unix seconds>.<16 random bytes>.<HMAC-SHA-256 of both>`,
    /// in URL-safe base64: fit for a cookie and a form field alike.
    pub fn issue(&self, now: i64) -> String {
        let mut bytes = [0u8; 16];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        let nonce = URL_SAFE_NO_PAD.encode(bytes);
        let tag = URL_SAFE_NO_PAD.encode(self.mac(now, &nonce).finalize().into_bytes());
        format!("{now}.{nonce}.{tag}")
    }

    /// Whether the server issued `token` within [`FORM_TOKEN_SECONDS`]
    /// (the tag is compared in constant time).
    pub fn is_valid(&self, token: &str, now: i64) -> bool {
        let mut parts = token.split('.');
        let (Some(issued), Some(nonce), Some(tag), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return false;
        };
        let (Ok(issued), Ok(tag)) = (issued.parse::<i64>(), URL_SAFE_NO_PAD.decode(tag)) else {
            return false;
        };
        // A minute of clock difference between replicas is tolerated.
        let fresh = issued <= now + 60 && now - issued <= FORM_TOKEN_SECONDS;
        fresh && self.mac(issued, nonce).verify_slice(&tag).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn only_the_same_origin_or_no_browser_header_passes() {
        let host = ("host", "dash.example.com");
        for passes in [
            vec![host],
            vec![host, ("origin", "https://dash.example.com")],
            vec![host, ("origin", "http://DASH.example.com")],
            vec![host, ("sec-fetch-site", "same-origin")],
            vec![host, ("sec-fetch-site", "none")],
        ] {
            assert!(!from_another_origin(&headers(&passes), None), "{passes:?}");
        }
        for refused in [
            vec![host, ("origin", "https://evil.example")],
            vec![host, ("origin", "https://dash.example.com:8443")],
            vec![host, ("origin", "https://sub.dash.example.com")],
            vec![host, ("origin", "null")],
            vec![host, ("sec-fetch-site", "same-site")],
            vec![host, ("sec-fetch-site", "cross-site")],
            vec![
                host,
                ("origin", "https://dash.example.com"),
                ("sec-fetch-site", "cross-site"),
            ],
            vec![("origin", "https://dash.example.com")],
        ] {
            assert!(from_another_origin(&headers(&refused), None), "{refused:?}");
        }
    }

    #[test]
    fn form_tokens_are_the_servers_own_and_expire() {
        let pepper = Pepper::from_hex(&"ab".repeat(32)).unwrap();
        let key = FormTokenKey::new(&pepper);
        let now = 1_700_000_000;
        let token = key.issue(now);
        assert!(key.is_valid(&token, now));
        assert!(key.is_valid(&token, now + FORM_TOKEN_SECONDS));
        assert!(!key.is_valid(&token, now + FORM_TOKEN_SECONDS + 1));
        assert!(!key.is_valid(&token, now - 61), "issued in the future");
        let other = FormTokenKey::new(&Pepper::from_hex(&"cd".repeat(32)).unwrap());
        assert!(!other.is_valid(&token, now), "another server's");
        let (issued, rest) = token.split_once('.').unwrap();
        let redated = format!("{}.{rest}", issued.parse::<i64>().unwrap() + 1000);
        assert!(!key.is_valid(&redated, now + 1000), "a changed date");
        for junk in ["", "a.b.c", "1.2", &format!("{token}.x")] {
            assert!(!key.is_valid(junk, now), "{junk:?}");
        }
    }
}

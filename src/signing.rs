//! Response signatures: RFC 9421 HTTP Message Signatures with Ed25519, over
//! an RFC 9530 `Content-Digest`, in one fixed profile.
//!
//! A signature covers the response (`@status`, `content-type`,
//! `content-digest`, `x-request-id`) *and* the request it answers
//! (`"@method";req`, `"@path";req`, `"content-digest";req`, and the
//! client's nonce when it sent one): without the request's parts, a genuine
//! `flagged: false` answer to a harmless request would verify just as well
//! when an attacker on the path hands it back as the answer to a harmful one.

use std::path::{Path, PathBuf};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey};
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use serde::Serialize;
use sha2::{Digest, Sha256};

/// The response's own components every signature covers, in order.
pub const RESPONSE_COMPONENTS: [&str; 4] =
    ["@status", "content-type", "content-digest", "x-request-id"];

/// The request header a client may send a nonce in; the response echoes it
/// under the same name, and the signature covers it.
pub const NONCE_HEADER: &str = "x-client-nonce";

/// The longest nonce echoed.
const MAX_NONCE_CHARS: usize = 128;

/// The signature label used in `Signature-Input` and `Signature`.
pub const LABEL: &str = "sig1";

#[derive(Debug, thiserror::Error)]
pub enum SigningError {
    #[error("signing key {path}: {reason}")]
    KeyFile { path: PathBuf, reason: String },
    #[error("signing key from the environment is not a PKCS#8 Ed25519 PEM")]
    EnvKey,
}

/// The service's signing key and the public keys it publishes.
pub struct ResponseSigner {
    key: SigningKey,
    kid: String,
    /// Published in the JWKS: the signing key's public half first, then any
    /// extra keys (for rotation).
    published: Vec<(String, VerifyingKey)>,
}

impl std::fmt::Debug for ResponseSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseSigner")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

/// Where the key came from, for the start-up log line.
#[derive(Debug, PartialEq, Eq)]
pub enum KeySource {
    Environment,
    File(PathBuf),
    Created(PathBuf),
}

impl ResponseSigner {
    pub fn new(key: SigningKey, extra_public: Vec<VerifyingKey>) -> ResponseSigner {
        let kid = jwk_thumbprint(&key.verifying_key());
        let mut published = vec![(kid.clone(), key.verifying_key())];
        for public in extra_public {
            let id = jwk_thumbprint(&public);
            if !published.iter().any(|(k, _)| *k == id) {
                published.push((id, public));
            }
        }
        ResponseSigner {
            key,
            kid,
            published,
        }
    }

    /// Loads the key from `env_pem` if given, else from `file`, creating and
    /// keeping a new key there (mode 0600) when the file does not exist.
    pub fn load_or_create(
        env_pem: Option<&str>,
        file: &Path,
        extra_public_files: &[PathBuf],
    ) -> Result<(ResponseSigner, KeySource), SigningError> {
        let (key, source) = match env_pem {
            Some(pem) => (
                SigningKey::from_pkcs8_pem(pem).map_err(|_| SigningError::EnvKey)?,
                KeySource::Environment,
            ),
            None if file.exists() => (read_private_key(file)?, KeySource::File(file.to_owned())),
            None => (
                create_private_key(file)?,
                KeySource::Created(file.to_owned()),
            ),
        };
        let extra = extra_public_files
            .iter()
            .map(|p| read_public_key(p))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((ResponseSigner::new(key, extra), source))
    }

    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The JWKS served at `/v1/signing-keys`.
    pub fn jwks(&self) -> Jwks {
        Jwks {
            keys: self
                .published
                .iter()
                .map(|(kid, public)| Jwk {
                    kty: "OKP",
                    crv: "Ed25519",
                    alg: "EdDSA",
                    key_use: "sig",
                    kid: kid.clone(),
                    x: URL_SAFE_NO_PAD.encode(public.as_bytes()),
                })
                .collect(),
        }
    }

    /// The three header values for a response with these parts, answering
    /// `request`.
    pub fn sign_response(
        &self,
        response: &SignedResponse<'_>,
        request: &AnsweredRequest,
        created: i64,
    ) -> SignatureHeaders {
        let content_digest = content_digest(response.body);
        let status = response.status.to_string();
        let values = [
            status.as_str(),
            response.content_type,
            content_digest.as_str(),
            response.request_id,
        ];
        let mut components: Vec<(String, &str)> = RESPONSE_COMPONENTS
            .iter()
            .map(|name| identifier(name, false))
            .zip(values)
            .collect();
        components.push((identifier("@method", true), &request.method));
        components.push((identifier("@path", true), &request.path));
        if let BodyDigest::Read(digest) = &request.body {
            components.push((identifier("content-digest", true), digest));
        }
        if let Some(nonce) = &request.nonce {
            components.push((identifier(NONCE_HEADER, false), nonce.as_str()));
        }
        let identifiers: Vec<&str> = components.iter().map(|(id, _)| id.as_str()).collect();
        let params = signature_params(&identifiers, created, &self.kid, Some("ed25519"));
        let lines: Vec<(&str, &str)> = components
            .iter()
            .map(|(id, value)| (id.as_str(), *value))
            .collect();
        let base = signature_base(&lines, &params);
        let signature = self.key.sign(base.as_bytes());
        SignatureHeaders {
            content_digest,
            signature_input: format!("{LABEL}={params}"),
            signature: format!("{LABEL}=:{}:", STANDARD.encode(signature.to_bytes())),
        }
    }
}

/// What a signature covers of the response itself.
#[derive(Clone, Copy, Debug)]
pub struct SignedResponse<'a> {
    pub status: u16,
    pub content_type: &'a str,
    pub request_id: &'a str,
    pub body: &'a [u8],
}

/// What a signature covers of the request a response answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnsweredRequest {
    /// `@method`: as received (`POST`).
    pub method: String,
    /// `@path`: the request target's path as received, percent-encoding kept.
    pub path: String,
    pub body: BodyDigest,
    /// Echoed in the response and covered, when the client sent a valid one.
    pub nonce: Option<ClientNonce>,
}

/// The request body's `Content-Digest` as the service computed it from the
/// bytes it read (a digest the client sent is not taken on trust: it might
/// not describe the body the service judged).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BodyDigest {
    /// The body was read to its end: `sha-256=:…:` of those bytes.
    Read(String),
    /// The service answered before reading the body whole (413 by
    /// `Content-Length`, 408, 415): the answer says nothing of its content,
    /// and its signature covers no `"content-digest";req`.
    NotRead,
}

/// A client's nonce: 1 to 128 visible ASCII characters other than `"` and
/// `\`, so that it is one token in a header and in the signature base.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientNonce(String);

impl ClientNonce {
    /// `None` for anything else, which is then not echoed (a client that
    /// sent a nonce and finds no echo must refuse the response).
    pub fn parse(text: &str) -> Option<ClientNonce> {
        let valid = !text.is_empty()
            && text.len() <= MAX_NONCE_CHARS
            && text
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\');
        valid.then(|| ClientNonce(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A component identifier as it appears in the signature base and in
/// `Signature-Input`: `"name"`, or `"name";req` for the request's.
pub fn identifier(name: &str, of_request: bool) -> String {
    if of_request {
        format!("\"{name}\";req")
    } else {
        format!("\"{name}\"")
    }
}

/// Header values added to a signed response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignatureHeaders {
    pub content_digest: String,
    pub signature_input: String,
    pub signature: String,
}

/// A JSON Web Key Set (RFC 7517) of Ed25519 public keys.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Jwks {
    pub keys: Vec<Jwk>,
}

/// One Ed25519 public key (RFC 8037).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Jwk {
    #[schema(value_type = String, example = "OKP")]
    pub kty: &'static str,
    #[schema(value_type = String, example = "Ed25519")]
    pub crv: &'static str,
    #[schema(value_type = String, example = "EdDSA")]
    pub alg: &'static str,
    #[serde(rename = "use")]
    #[schema(value_type = String, example = "sig")]
    pub key_use: &'static str,
    /// The `keyid` of `Signature-Input`.
    pub kid: String,
    /// The public key, base64url without padding (32 bytes).
    pub x: String,
}

/// RFC 9530 `Content-Digest` with SHA-256.
pub fn content_digest(body: &[u8]) -> String {
    format!("sha-256=:{}:", STANDARD.encode(Sha256::digest(body)))
}

/// The `@signature-params` value (an inner list with parameters) of
/// component identifiers (see [`identifier`]).
pub fn signature_params(
    identifiers: &[&str],
    created: i64,
    kid: &str,
    alg: Option<&str>,
) -> String {
    let mut out = format!(
        "({});created={created};keyid=\"{kid}\"",
        identifiers.join(" ")
    );
    if let Some(alg) = alg {
        out.push_str(&format!(";alg=\"{alg}\""));
    }
    out
}

/// RFC 9421 §2.5 signature base: one line per component (identifier, see
/// [`identifier`], and value), then the `@signature-params` line, joined by
/// LF with no trailing newline.
pub fn signature_base(components: &[(&str, &str)], params: &str) -> String {
    let mut base = String::new();
    for (identifier, value) in components {
        base.push_str(&format!("{identifier}: {}\n", value.trim()));
    }
    base.push_str(&format!("\"@signature-params\": {params}"));
    base
}

/// RFC 7638 JWK thumbprint of the public key (base64url SHA-256 of the
/// canonical JWK), so a key id follows from the key alone.
pub fn jwk_thumbprint(public: &VerifyingKey) -> String {
    let canonical = format!(
        "{{\"crv\":\"Ed25519\",\"kty\":\"OKP\",\"x\":\"{}\"}}",
        URL_SAFE_NO_PAD.encode(public.as_bytes())
    );
    URL_SAFE_NO_PAD.encode(Sha256::digest(canonical.as_bytes()))
}

fn read_private_key(path: &Path) -> Result<SigningKey, SigningError> {
    let pem = std::fs::read_to_string(path).map_err(|e| key_file_error(path, e.to_string()))?;
    SigningKey::from_pkcs8_pem(&pem)
        .map_err(|_| key_file_error(path, "not a PKCS#8 Ed25519 private key PEM".into()))
}

fn read_public_key(path: &Path) -> Result<VerifyingKey, SigningError> {
    let pem = std::fs::read_to_string(path).map_err(|e| key_file_error(path, e.to_string()))?;
    VerifyingKey::from_public_key_pem(&pem)
        .map_err(|_| key_file_error(path, "not an Ed25519 public key PEM".into()))
}

fn create_private_key(path: &Path) -> Result<SigningKey, SigningError> {
    let key = SigningKey::generate(&mut rand::rngs::OsRng);
    let pem = key
        .to_pkcs8_pem(Default::default())
        .map_err(|e| key_file_error(path, format!("cannot encode a new key: {e}")))?;
    crate::fsutil::write_secret_file(path, pem.as_bytes())
        .map_err(|e| key_file_error(path, e.to_string()))?;
    Ok(key)
}

fn key_file_error(path: &Path, reason: String) -> SigningError {
    SigningError::KeyFile {
        path: path.to_owned(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signature, Verifier};

    /// RFC 9421 appendix B.1.4.
    const RFC_TEST_KEY: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIJ+DYvh6SEqVTm50DFtMDoQikTmiCqirVv9mWG9qfSnF
-----END PRIVATE KEY-----";

    #[test]
    fn reproduces_the_rfc_9421_ed25519_example() {
        // RFC 9421 appendix B.2.6: Ed25519 is deterministic, so the signature
        // over the same base must be the published one, byte for byte.
        let key = SigningKey::from_pkcs8_pem(RFC_TEST_KEY).unwrap();
        let named = [
            ("date", "Tue, 20 Apr 2021 02:07:55 GMT"),
            ("@method", "POST"),
            ("@path", "/foo"),
            ("@authority", "example.com"),
            ("content-type", "application/json"),
            ("content-length", "18"),
        ];
        let identifiers: Vec<String> = named.iter().map(|(n, _)| identifier(n, false)).collect();
        let components: Vec<(&str, &str)> = identifiers
            .iter()
            .map(String::as_str)
            .zip(named.iter().map(|(_, v)| *v))
            .collect();
        let ids: Vec<&str> = identifiers.iter().map(String::as_str).collect();
        let params = signature_params(&ids, 1618884473, "test-key-ed25519", None);
        let base = signature_base(&components, &params);
        let signature = STANDARD.encode(key.sign(base.as_bytes()).to_bytes());
        assert_eq!(
            signature,
            "wqcAqbmYJ2ji2glfAMaRy4gruYYnx2nEFN2HN6jrnDnQCK1u02Gb04v9EDgwUPiu4A0w6vuQv5lIp5WPpBKRCw=="
        );
    }

    #[test]
    fn content_digest_matches_rfc_9530_example() {
        // RFC 9530 §B.2: the SHA-256 digest of `{"hello": "world"}`.
        assert_eq!(
            content_digest(b"{\"hello\": \"world\"}"),
            "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:"
        );
    }

    fn request(path: &str, body: &[u8], nonce: Option<&str>) -> AnsweredRequest {
        AnsweredRequest {
            method: "POST".into(),
            path: path.into(),
            body: BodyDigest::Read(content_digest(body)),
            nonce: nonce.and_then(ClientNonce::parse),
        }
    }

    /// The base a verifier builds from the response and its own request.
    fn base_for(params: &str, status: &str, body: &[u8], request: &AnsweredRequest) -> String {
        let digest = content_digest(body);
        let mut lines = vec![
            ("\"@status\"", status),
            ("\"content-type\"", "application/json"),
            ("\"content-digest\"", digest.as_str()),
            ("\"x-request-id\"", "modr_1"),
            ("\"@method\";req", request.method.as_str()),
            ("\"@path\";req", request.path.as_str()),
        ];
        if let BodyDigest::Read(d) = &request.body {
            lines.push(("\"content-digest\";req", d.as_str()));
        }
        if let Some(nonce) = &request.nonce {
            lines.push(("\"x-client-nonce\"", nonce.as_str()));
        }
        signature_base(&lines, params)
    }

    #[test]
    fn response_signature_binds_status_body_and_the_request() {
        let signer = ResponseSigner::new(SigningKey::from_bytes(&[7u8; 32]), vec![]);
        let asked = request("/v1/moderate", b"{\"harmless\"}", Some("n-1"));
        let response = SignedResponse {
            status: 200,
            content_type: "application/json",
            request_id: "modr_1",
            body: b"{}",
        };
        let headers = signer.sign_response(&response, &asked, 1_700_000_000);
        let public = signer.key.verifying_key();
        let raw = headers
            .signature
            .trim_start_matches("sig1=:")
            .trim_end_matches(':');
        let signature = Signature::from_slice(&STANDARD.decode(raw).unwrap()).unwrap();
        let params = headers.signature_input.trim_start_matches("sig1=");
        let verifies = |status: &str, body: &[u8], request: &AnsweredRequest| {
            public
                .verify(
                    base_for(params, status, body, request).as_bytes(),
                    &signature,
                )
                .is_ok()
        };
        assert!(verifies("200", b"{}", &asked));
        assert!(!verifies("500", b"{}", &asked));
        assert!(!verifies("200", b"{ }", &asked));
        let other_body = request("/v1/moderate", b"{\"harmful\"}", Some("n-1"));
        assert!(!verifies("200", b"{}", &other_body));
        let other_path = request("/v1/moderations", b"{\"harmless\"}", Some("n-1"));
        assert!(!verifies("200", b"{}", &other_path));
        let other_nonce = request("/v1/moderate", b"{\"harmless\"}", Some("n-2"));
        assert!(!verifies("200", b"{}", &other_nonce));
        assert!(params.starts_with(
            "(\"@status\" \"content-type\" \"content-digest\" \"x-request-id\" \"@method\";req \"@path\";req \"content-digest\";req \"x-client-nonce\");"
        ));
        assert!(headers
            .signature_input
            .contains(&format!("keyid=\"{}\"", signer.kid())));
        assert!(headers.signature_input.ends_with(";alg=\"ed25519\""));
    }

    #[test]
    fn nonces_are_single_visible_tokens() {
        assert!(ClientNonce::parse("abc-123_~!").is_some());
        assert!(ClientNonce::parse(&"a".repeat(128)).is_some());
        for bad in ["", "a b", "a\"b", "a\\b", "é", &"a".repeat(129)] {
            assert_eq!(ClientNonce::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn creates_a_key_once_then_reuses_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/signing-key.pem");
        let (first, source) = ResponseSigner::load_or_create(None, &path, &[]).unwrap();
        assert_eq!(source, KeySource::Created(path.clone()));
        let (second, source) = ResponseSigner::load_or_create(None, &path, &[]).unwrap();
        assert_eq!(source, KeySource::File(path.clone()));
        assert_eq!(first.kid(), second.kid());
        std::fs::write(&path, "garbage").unwrap();
        let err = ResponseSigner::load_or_create(None, &path, &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a PKCS#8"), "{err}");
    }

    #[test]
    fn jwks_publishes_extra_keys_for_rotation() {
        let old = SigningKey::from_bytes(&[1u8; 32]).verifying_key();
        let signer = ResponseSigner::new(SigningKey::from_bytes(&[2u8; 32]), vec![old]);
        let jwks = signer.jwks();
        assert_eq!(jwks.keys.len(), 2);
        assert_eq!(jwks.keys[0].kid, signer.kid());
        assert_eq!(
            URL_SAFE_NO_PAD.decode(&jwks.keys[1].x).unwrap(),
            old.as_bytes()
        );
    }
}

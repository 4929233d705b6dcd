//! Response signatures: RFC 9421 HTTP Message Signatures with Ed25519, over
//! an RFC 9530 `Content-Digest`, in one fixed profile.

use std::path::{Path, PathBuf};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey};
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use serde::Serialize;
use sha2::{Digest, Sha256};

/// The components every response signature covers, in order.
pub const COVERED_COMPONENTS: [&str; 4] =
    ["@status", "content-type", "content-digest", "x-request-id"];

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

    /// The three header values for a response with these parts.
    pub fn sign_response(
        &self,
        status: u16,
        content_type: &str,
        request_id: &str,
        body: &[u8],
        created: i64,
    ) -> SignatureHeaders {
        let content_digest = content_digest(body);
        let params = signature_params(&COVERED_COMPONENTS, created, &self.kid, Some("ed25519"));
        let status = status.to_string();
        let values = [
            status.as_str(),
            content_type,
            content_digest.as_str(),
            request_id,
        ];
        let components: Vec<(&str, &str)> =
            COVERED_COMPONENTS.iter().copied().zip(values).collect();
        let base = signature_base(&components, &params);
        let signature = self.key.sign(base.as_bytes());
        SignatureHeaders {
            content_digest,
            signature_input: format!("{LABEL}={params}"),
            signature: format!("{LABEL}=:{}:", STANDARD.encode(signature.to_bytes())),
        }
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

/// The `@signature-params` value (an inner list with parameters).
pub fn signature_params(components: &[&str], created: i64, kid: &str, alg: Option<&str>) -> String {
    let list: Vec<String> = components.iter().map(|c| format!("\"{c}\"")).collect();
    let mut out = format!("({});created={created};keyid=\"{kid}\"", list.join(" "));
    if let Some(alg) = alg {
        out.push_str(&format!(";alg=\"{alg}\""));
    }
    out
}

/// RFC 9421 §2.5 signature base: one line per component, then the
/// `@signature-params` line, joined by LF with no trailing newline.
pub fn signature_base(components: &[(&str, &str)], params: &str) -> String {
    let mut base = String::new();
    for (name, value) in components {
        base.push_str(&format!("\"{name}\": {}\n", value.trim()));
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
        let components = [
            ("date", "Tue, 20 Apr 2021 02:07:55 GMT"),
            ("@method", "POST"),
            ("@path", "/foo"),
            ("@authority", "example.com"),
            ("content-type", "application/json"),
            ("content-length", "18"),
        ];
        let names: Vec<&str> = components.iter().map(|(n, _)| *n).collect();
        let params = signature_params(&names, 1618884473, "test-key-ed25519", None);
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

    #[test]
    fn response_signature_verifies_and_binds_status_and_body() {
        let signer = ResponseSigner::new(SigningKey::from_bytes(&[7u8; 32]), vec![]);
        let headers = signer.sign_response(200, "application/json", "modr_1", b"{}", 1_700_000_000);
        let public = signer.key.verifying_key();
        let raw = headers
            .signature
            .trim_start_matches("sig1=:")
            .trim_end_matches(':');
        let signature = Signature::from_slice(&STANDARD.decode(raw).unwrap()).unwrap();
        let params = headers.signature_input.trim_start_matches("sig1=");
        let base_for = |status: &str, body: &[u8]| {
            let digest = content_digest(body);
            signature_base(
                &[
                    ("@status", status),
                    ("content-type", "application/json"),
                    ("content-digest", &digest),
                    ("x-request-id", "modr_1"),
                ],
                params,
            )
        };
        assert!(public
            .verify(base_for("200", b"{}").as_bytes(), &signature)
            .is_ok());
        assert!(public
            .verify(base_for("500", b"{}").as_bytes(), &signature)
            .is_err());
        assert!(public
            .verify(base_for("200", b"{ }").as_bytes(), &signature)
            .is_err());
        assert!(headers
            .signature_input
            .contains(&format!("keyid=\"{}\"", signer.kid())));
        assert!(headers.signature_input.ends_with(";alg=\"ed25519\""));
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

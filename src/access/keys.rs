//! API keys: how they look, how they are made, and how a presented key is
//! checked against the stored keyed hash.
//!
//! A key is `mdr_<id>_<secret>`: the 16-hex-digit id is public and used for
//! the look-up; the 43-character secret is only ever stored as
//! HMAC-SHA-256(pepper, id ":" secret) and compared in constant time.

use std::fmt;
use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use super::accounts::AccountId;
use super::plan::{effective_rpm, Tier};
use super::policy::{AppliedPolicy, PolicyId};
use crate::config::Plans;

/// The public identifier of an API key (also the first part of the secret).
/// Lower-case hex, 16 characters.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct KeyId(String);

impl KeyId {
    pub const LEN: usize = 16;

    /// Validates the form; `None` if it is not 16 lower-case hex digits.
    pub fn parse(s: &str) -> Option<KeyId> {
        (s.len() == Self::LEN && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| KeyId(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A stored API key. The secret itself is never stored: only `secret_hash`,
/// a keyed hash (HMAC-SHA-256 with the operator's pepper) of it.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiKeyRecord {
    pub id: KeyId,
    pub name: String,
    /// The plan the key runs on: its own for an operator key, its
    /// account's for a customer's key (read from the account, never copied).
    pub tier: Tier,
    /// The plan's own requests per minute; required for enterprise, and
    /// overrides the tier's limit when set. A customer's key: its account's.
    pub custom_rpm: Option<u32>,
    /// Whose allowance the key draws on.
    pub owner: KeyOwner,
    pub secret_hash: Vec<u8>,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
    /// The policy the key names itself, if any (one of its account's).
    pub policy_id: Option<PolicyId>,
    /// The policy it is judged by: its own, else its account's default;
    /// `None`: the shipped thresholds alone. Read from the store with the
    /// key, never set by hand.
    pub policy: Option<AppliedPolicy>,
}

/// Whose allowance a key draws on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyOwner {
    /// A key made by `moderato keys create` for the operator: each has its
    /// own plan and buckets of its own, as operators hand them out one by one.
    Operator,
    /// A customer account's key. Every key of the account draws on the
    /// account's buckets, so more keys never mean more requests;
    /// `key_rpm` is a lower limit of the key's own, on top.
    Account { id: AccountId, key_rpm: Option<u32> },
}

impl ApiKeyRecord {
    /// The requests per minute this key may make: an operator key's plan
    /// (its own limit, else its tier's); a customer's key, its account's
    /// plan, or its own lower limit. Never more than the account's, even
    /// when the account's plan went down after the key's limit was set.
    pub fn effective_rpm(&self, plans: &Plans) -> u32 {
        let plan = effective_rpm(self.tier, self.custom_rpm, plans);
        match self.owner {
            KeyOwner::Account {
                key_rpm: Some(own), ..
            } => own.min(plan),
            _ => plan,
        }
    }
}

pub const PREFIX: &str = "mdr_";
const SECRET_BYTES: usize = 32;
const SECRET_CHARS: usize = 43;
const MIN_PEPPER_BYTES: usize = 32;

/// The server-side secret of the keyed hash. Never logged.
#[derive(Clone)]
pub struct Pepper(Vec<u8>);

impl std::fmt::Debug for Pepper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pepper([redacted])")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PepperError {
    #[error("the API-key pepper must be hex-encoded, at least {MIN_PEPPER_BYTES} bytes")]
    Malformed,
    #[error("API-key pepper file {path}: {reason}")]
    File { path: String, reason: String },
}

impl Pepper {
    pub fn from_hex(hex_text: &str) -> Result<Pepper, PepperError> {
        let bytes = hex::decode(hex_text.trim()).map_err(|_| PepperError::Malformed)?;
        if bytes.len() < MIN_PEPPER_BYTES {
            return Err(PepperError::Malformed);
        }
        Ok(Pepper(bytes))
    }

    /// The configured pepper, else the one kept in `file`, created there on
    /// first use. Returns whether it was created.
    pub fn load_or_create(
        configured: Option<&str>,
        file: &Path,
    ) -> Result<(Pepper, bool), PepperError> {
        if let Some(hex_text) = configured {
            return Ok((Pepper::from_hex(hex_text)?, false));
        }
        let file_error = |reason: String| PepperError::File {
            path: file.display().to_string(),
            reason,
        };
        if file.exists() {
            let text = std::fs::read_to_string(file).map_err(|e| file_error(e.to_string()))?;
            return Ok((
                Pepper::from_hex(&text).map_err(|e| file_error(e.to_string()))?,
                false,
            ));
        }
        let mut bytes = vec![0u8; MIN_PEPPER_BYTES];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        match crate::fsutil::write_secret_file(file, hex::encode(&bytes).as_bytes()) {
            Ok(()) => Ok((Pepper(bytes), true)),
            // Another process created it first: use theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Pepper::load_or_create(None, file)
            }
            Err(e) => Err(file_error(e.to_string())),
        }
    }

    /// A key for another use of the same secret, so that one secret (shared
    /// by every replica already) serves both. Never equal to a key hash: their
    /// input always holds a `:`, and a label must not.
    pub fn derive(&self, label: &str) -> [u8; 32] {
        assert!(!label.contains(':'), "a label is never a key hash's input");
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(label.as_bytes());
        mac.finalize().into_bytes().into()
    }

    fn hash(&self, id: &KeyId, secret: &str) -> Vec<u8> {
        // HMAC accepts keys of any length.
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(id.as_str().as_bytes());
        mac.update(b":");
        mac.update(secret.as_bytes());
        mac.finalize().into_bytes().to_vec()
    }
}

/// A key as presented by a client, split into its parts. Parsing checks the
/// form only; whether it is valid is the store's and `verify`'s business.
#[derive(PartialEq, Eq)]
pub struct PresentedKey {
    pub id: KeyId,
    secret: String,
}

impl std::fmt::Debug for PresentedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PresentedKey({}, [redacted])", self.id)
    }
}

impl PresentedKey {
    pub fn parse(text: &str) -> Option<PresentedKey> {
        let rest = text.strip_prefix(PREFIX)?;
        let (id, secret) = rest.split_once('_')?;
        let id = KeyId::parse(id)?;
        let well_formed = secret.len() == SECRET_CHARS
            && secret
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        well_formed.then(|| PresentedKey {
            id,
            secret: secret.to_owned(),
        })
    }

    /// True when this key's secret hashes to the record's, compared in
    /// constant time, and the record is not revoked.
    pub fn verify(&self, record: &ApiKeyRecord, pepper: &Pepper) -> bool {
        let hash = pepper.hash(&self.id, &self.secret);
        let same: bool = hash.ct_eq(&record.secret_hash).into();
        same && record.id == self.id && record.revoked_at.is_none()
    }
}

/// A newly made key: the full secret string (shown once) and its stored hash.
pub struct NewKey {
    pub id: KeyId,
    pub full_key: String,
    pub secret_hash: Vec<u8>,
}

pub fn generate(pepper: &Pepper) -> NewKey {
    let mut id_bytes = [0u8; KeyId::LEN / 2];
    rand::rngs::OsRng.fill_bytes(&mut id_bytes);
    let id = KeyId::parse(&hex::encode(id_bytes)).expect("hex of 8 bytes is a valid key id");
    let mut secret_bytes = [0u8; SECRET_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut secret_bytes);
    let secret = URL_SAFE_NO_PAD.encode(secret_bytes);
    let secret_hash = pepper.hash(&id, &secret);
    NewKey {
        full_key: format!("{PREFIX}{id}_{secret}"),
        id,
        secret_hash,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::Tier;

    fn record(new: &NewKey) -> ApiKeyRecord {
        ApiKeyRecord {
            id: new.id.clone(),
            name: "t".into(),
            tier: Tier::Free,
            custom_rpm: None,
            owner: KeyOwner::Operator,
            secret_hash: new.secret_hash.clone(),
            created_at: chrono::Utc::now(),
            revoked_at: None,
            policy_id: None,
            policy: None,
        }
    }

    #[test]
    fn generated_key_parses_and_verifies_and_others_do_not() {
        let pepper = Pepper::from_hex(&"ab".repeat(32)).unwrap();
        let new = generate(&pepper);
        assert!(new.full_key.starts_with("mdr_"));
        let presented = PresentedKey::parse(&new.full_key).expect("well formed");
        assert!(presented.verify(&record(&new), &pepper));

        let other_pepper = Pepper::from_hex(&"cd".repeat(32)).unwrap();
        assert!(!presented.verify(&record(&new), &other_pepper));

        let mut tampered = new.full_key.clone();
        let last = tampered.pop().unwrap();
        tampered.push(if last == 'A' { 'B' } else { 'A' });
        assert!(!PresentedKey::parse(&tampered)
            .unwrap()
            .verify(&record(&new), &pepper));

        let mut revoked = record(&new);
        revoked.revoked_at = Some(chrono::Utc::now());
        assert!(!presented.verify(&revoked, &pepper));
    }

    #[test]
    fn malformed_keys_are_refused_by_form() {
        for bad in [
            "",
            "mdr_",
            "sk-abc",
            "mdr_0123456789abcdef",
            "mdr_0123456789ABCDEF_x",
            "mdr_0123456789abcdef_short",
        ] {
            assert!(PresentedKey::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn debug_output_hides_secrets() {
        let pepper = Pepper::from_hex(&"ab".repeat(32)).unwrap();
        let new = generate(&pepper);
        let presented = PresentedKey::parse(&new.full_key).unwrap();
        let secret = new.full_key.rsplit('_').next().unwrap();
        assert!(!format!("{presented:?}").contains(secret));
        assert!(!format!("{pepper:?}").contains("abab"));
    }

    #[test]
    fn pepper_file_is_created_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pepper");
        let (a, created) = Pepper::load_or_create(None, &path).unwrap();
        assert!(created);
        let (b, created) = Pepper::load_or_create(None, &path).unwrap();
        assert!(!created);
        assert_eq!(a.0, b.0);
        assert!(Pepper::load_or_create(Some("zz"), &path).is_err());
    }
}

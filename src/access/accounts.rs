//! Accounts: an e-mail address to sign in with, a role, a plan, and the
//! argon2id hash of a password (never the password).

use std::fmt;
use std::str::FromStr;

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash as Phc, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::plan::Plan;

/// An account's id: a UUID, kept as its hyphenated lower-case text.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct AccountId(String);

impl AccountId {
    /// The account that owns keys made with `moderato keys create` (and the
    /// keys that existed before accounts); created by the migration, with
    /// no password.
    pub const OPERATOR: &'static str = "00000000-0000-0000-0000-000000000000";

    pub fn new_random() -> AccountId {
        AccountId(uuid::Uuid::new_v4().hyphenated().to_string())
    }

    pub fn operator() -> AccountId {
        AccountId(Self::OPERATOR.to_owned())
    }

    /// `None` unless `s` is a UUID in its canonical lower-case form.
    pub fn parse(s: &str) -> Option<AccountId> {
        let uuid = uuid::Uuid::try_parse(s).ok()?;
        let canonical = uuid.hyphenated().to_string();
        (canonical == s).then_some(AccountId(canonical))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn is_operator(&self) -> bool {
        self.0 == Self::OPERATOR
    }
}

impl fmt::Display for AccountId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An e-mail address, trimmed and lower-cased, so that one person cannot
/// hold two accounts by changing case.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Email(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is not an e-mail address (name@domain, at most 254 characters)")]
pub struct EmailError(pub String);

impl Email {
    const MAX_LEN: usize = 254;

    pub fn parse(text: &str) -> Result<Email, EmailError> {
        let email = text.trim().to_lowercase();
        let invalid = || EmailError(text.chars().take(80).collect());
        if email.len() > Self::MAX_LEN || email.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(invalid());
        }
        let (local, domain) = email.split_once('@').ok_or_else(invalid)?;
        let domain_ok = !domain.is_empty()
            && !domain.contains('@')
            && !domain.starts_with('.')
            && !domain.ends_with('.');
        if local.is_empty() || !domain_ok {
            return Err(invalid());
        }
        Ok(Email(email))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Email {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What an account may do in the dashboard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Manages every account.
    Admin,
    /// Manages its own keys.
    Customer,
}

impl Role {
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Customer => "customer",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Role, String> {
        match s {
            "admin" => Ok(Role::Admin),
            "customer" => Ok(Role::Customer),
            other => Err(format!(
                "unknown role {other:?}: expected admin or customer"
            )),
        }
    }
}

/// A password as typed: long enough, and never printed.
pub struct Password(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PasswordError {
    #[error("the password must have at least {} characters", Password::MIN_CHARS)]
    TooShort,
    #[error("the password must have at most {} characters", Password::MAX_CHARS)]
    TooLong,
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password([redacted])")
    }
}

impl Password {
    pub const MIN_CHARS: usize = 12;
    /// Bounds the hashing work a request can ask for.
    pub const MAX_CHARS: usize = 1024;

    pub fn new(text: String) -> Result<Password, PasswordError> {
        let chars = text.chars().count();
        if chars < Self::MIN_CHARS {
            Err(PasswordError::TooShort)
        } else if chars > Self::MAX_CHARS {
            Err(PasswordError::TooLong)
        } else {
            Ok(Password(text))
        }
    }

    /// An argon2id hash with a fresh random salt, at the crate's default
    /// (OWASP-recommended) cost. Takes tens of milliseconds of CPU: call it
    /// off the async threads.
    pub fn hash(&self) -> PasswordHash {
        let salt = SaltString::generate(&mut OsRng);
        let phc = Argon2::default()
            .hash_password(self.0.as_bytes(), &salt)
            .expect("argon2 with default parameters and a generated salt cannot fail");
        PasswordHash(phc.to_string())
    }

    /// Whether this password matches `hash` (compared in constant time by
    /// the crate). A malformed stored hash matches nothing.
    pub fn verify(&self, hash: &PasswordHash) -> bool {
        match Phc::new(&hash.0) {
            Ok(parsed) => Argon2::default()
                .verify_password(self.0.as_bytes(), &parsed)
                .is_ok(),
            Err(_) => false,
        }
    }

    /// Verifies against a fixed hash, for unknown accounts: a sign-in with
    /// an unknown e-mail costs as much time as one with a wrong password.
    pub fn verify_against_nothing(&self) {
        static DUMMY: std::sync::OnceLock<PasswordHash> = std::sync::OnceLock::new();
        let dummy = DUMMY.get_or_init(|| Password("not-a-password-anyone-has".to_owned()).hash());
        let _ = self.verify(dummy);
    }
}

/// A stored argon2id hash in PHC string form.
#[derive(Clone, PartialEq, Eq)]
pub struct PasswordHash(String);

impl fmt::Debug for PasswordHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PasswordHash([redacted])")
    }
}

impl PasswordHash {
    /// Wraps a stored PHC string (checked when verifying).
    pub fn from_stored(phc: String) -> PasswordHash {
        PasswordHash(phc)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A stored account.
#[derive(Clone, Debug, PartialEq)]
pub struct Account {
    pub id: AccountId,
    pub email: Email,
    /// `None`: nobody can sign in (the operator account, or an account
    /// waiting for its first password).
    pub password_hash: Option<PasswordHash>,
    pub role: Role,
    pub plan: Plan,
    pub disabled_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    /// Made by open sign-up, and the link sent to its e-mail not yet
    /// followed: nobody has shown they read that mailbox, so it has no
    /// password and a new sign-up for the address may send another link.
    pub awaiting_confirmation: bool,
}

impl Account {
    /// A new enabled account, created now.
    pub fn new(
        email: Email,
        role: Role,
        plan: Plan,
        password_hash: Option<PasswordHash>,
    ) -> Account {
        Account {
            id: AccountId::new_random(),
            email,
            password_hash,
            role,
            plan,
            disabled_at: None,
            created_at: Utc::now(),
            awaiting_confirmation: false,
        }
    }

    /// A free customer account made by open sign-up: no password until the
    /// link sent to `email` is followed.
    pub fn signed_up(email: Email, plan: Plan) -> Account {
        Account {
            awaiting_confirmation: true,
            ..Account::new(email, Role::Customer, plan, None)
        }
    }

    pub fn is_disabled(&self) -> bool {
        self.disabled_at.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emails_are_trimmed_lower_cased_and_checked() {
        assert_eq!(
            Email::parse("  Ada@Example.COM ").unwrap().as_str(),
            "ada@example.com"
        );
        for bad in [
            "",
            "ada",
            "@example.com",
            "ada@",
            "a b@example.com",
            "a@b@c",
            "ada@.com",
        ] {
            assert!(Email::parse(bad).is_err(), "{bad}");
        }
        assert!(Email::parse(&format!("{}@example.com", "a".repeat(250))).is_err());
    }

    #[test]
    fn passwords_need_twelve_characters_and_verify_only_themselves() {
        assert_eq!(
            Password::new("short".into()).unwrap_err(),
            PasswordError::TooShort
        );
        let password = Password::new("correct horse battery".into()).unwrap();
        let hash = password.hash();
        assert!(
            hash.as_str().starts_with("$argon2id$"),
            "{:?}",
            hash.as_str()
        );
        assert!(password.verify(&hash));
        // A fresh salt each time.
        assert_ne!(password.hash(), hash);
        let wrong = Password::new("correct horse battery!".into()).unwrap();
        assert!(!wrong.verify(&hash));
        assert!(!password.verify(&PasswordHash::from_stored("garbage".into())));
        assert!(!format!("{password:?} {hash:?}").contains("horse"));
    }

    #[test]
    fn account_ids_are_canonical_uuids() {
        let id = AccountId::new_random();
        assert_eq!(AccountId::parse(id.as_str()), Some(id));
        assert!(AccountId::parse("not-a-uuid").is_none());
        assert!(AccountId::parse("0000000000000000000000000000000A").is_none());
        assert!(AccountId::operator().is_operator());
    }

    #[test]
    fn roles_parse() {
        assert_eq!("admin".parse::<Role>(), Ok(Role::Admin));
        assert_eq!("customer".parse::<Role>(), Ok(Role::Customer));
        assert!("root".parse::<Role>().is_err());
    }
}

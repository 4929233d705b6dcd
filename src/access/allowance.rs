//! What a request draws on: the buckets of the rate limiter a key's
//! requests and characters are counted in, and the rules for making a key.
//!
//! A plan's allowance belongs to the account, not to each key: every key of
//! a customer account draws on the account's buckets, so an account cannot
//! multiply its plan by making keys. A key may also carry a lower limit of
//! its own (a bucket of its own, checked first). Operator keys made with
//! `moderato keys create` each keep their own plan and buckets.

use super::keys::{ApiKeyRecord, KeyOwner};
use super::plan::Tier;
use crate::config::{CharsPerMinute, Plans};

/// One bucket of the rate limiter: its name (shared by every replica
/// through Redis) and its allowance per minute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bucket {
    pub name: String,
    pub per_minute: u32,
}

/// The buckets one key's requests are counted in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allowance {
    /// The plan's requests per minute: the account's bucket for a
    /// customer's key, the key's own for an operator key.
    pub requests: Bucket,
    /// A customer key's own lower limit, when it has one.
    pub own_requests: Option<Bucket>,
    /// The plan's text characters per minute, in the same owner's bucket.
    pub characters: Bucket,
}

impl Allowance {
    pub fn of(key: &ApiKeyRecord, plans: &Plans, chars: &CharsPerMinute) -> Allowance {
        let plan_rpm = super::plan::effective_rpm(key.tier, key.custom_rpm, plans);
        let chars_per_minute = chars.of(key.tier);
        match &key.owner {
            // The names operator keys have always had, so an upgrade keeps
            // their state in Redis.
            KeyOwner::Operator => Allowance {
                requests: Bucket {
                    name: key.id.to_string(),
                    per_minute: plan_rpm,
                },
                own_requests: None,
                characters: Bucket {
                    name: format!("chars:{}", key.id),
                    per_minute: chars_per_minute,
                },
            },
            KeyOwner::Account { id, key_rpm } => Allowance {
                requests: Bucket {
                    name: format!("account:{id}"),
                    per_minute: plan_rpm,
                },
                own_requests: key_rpm.map(|own| Bucket {
                    name: format!("key:{}", key.id),
                    per_minute: own.min(plan_rpm),
                }),
                characters: Bucket {
                    name: format!("chars:account:{id}"),
                    per_minute: chars_per_minute,
                },
            },
        }
    }
}

/// Why a key cannot be made for an account. The messages name the limit,
/// for the dashboard and the CLI alike.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyRequestError {
    #[error("this account already has {max} keys, the most its {tier} plan allows (revoked keys do not count): revoke one to make another")]
    TooManyKeys { max: u32, tier: Tier },
    #[error("a key's own limit must be between 1 and its account's {plan_rpm} requests per minute ({tier} plan); leave it empty for the plan's")]
    OwnLimitTooHigh { plan_rpm: u32, tier: Tier },
}

/// A key's own requests per minute, checked against its account's plan.
pub fn check_own_rpm(
    own: Option<u32>,
    tier: Tier,
    custom_rpm: Option<u32>,
    plans: &Plans,
) -> Result<Option<u32>, KeyRequestError> {
    let plan_rpm = super::plan::effective_rpm(tier, custom_rpm, plans);
    match own {
        Some(rpm) if rpm == 0 || rpm > plan_rpm => {
            Err(KeyRequestError::OwnLimitTooHigh { plan_rpm, tier })
        }
        other => Ok(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::{AccountId, KeyId};

    fn plans() -> Plans {
        Plans {
            free: 10,
            basic: 60,
            pro: 300,
            enterprise: 1000,
        }
    }

    fn chars() -> CharsPerMinute {
        CharsPerMinute {
            free: 50_000,
            basic: 500_000,
            pro: 2_000_000,
            enterprise: 10_000_000,
        }
    }

    fn key(n: &str, owner: KeyOwner) -> ApiKeyRecord {
        ApiKeyRecord {
            id: KeyId::parse(&n.repeat(16)).unwrap(),
            name: "k".into(),
            tier: Tier::Free,
            custom_rpm: None,
            owner,
            secret_hash: vec![],
            created_at: chrono::Utc::now(),
            revoked_at: None,
            policy_id: None,
            policy: None,
        }
    }

    #[test]
    fn keys_of_one_account_share_its_buckets() {
        let account = AccountId::new_random();
        let owned = |n, key_rpm| {
            key(
                n,
                KeyOwner::Account {
                    id: account.clone(),
                    key_rpm,
                },
            )
        };
        let a = Allowance::of(&owned("a", None), &plans(), &chars());
        let b = Allowance::of(&owned("b", Some(3)), &plans(), &chars());
        assert_eq!(a.requests, b.requests);
        assert_eq!(a.characters, b.characters);
        assert_eq!(a.requests.per_minute, 10);
        assert_eq!(a.own_requests, None);
        assert_eq!(b.own_requests.unwrap().per_minute, 3);
        // A key's own limit above its account's is capped by it.
        let c = Allowance::of(&owned("c", Some(500)), &plans(), &chars());
        assert_eq!(c.own_requests.unwrap().per_minute, 10);
        assert_eq!(owned("c", Some(500)).effective_rpm(&plans()), 10);
    }

    #[test]
    fn operator_keys_keep_buckets_of_their_own() {
        let a = Allowance::of(&key("a", KeyOwner::Operator), &plans(), &chars());
        let b = Allowance::of(&key("b", KeyOwner::Operator), &plans(), &chars());
        assert_ne!(a.requests.name, b.requests.name);
        assert_ne!(a.characters.name, b.characters.name);
        assert_eq!(a.requests.name, "aaaaaaaaaaaaaaaa");
    }

    #[test]
    fn a_keys_own_limit_is_at_most_its_accounts() {
        assert_eq!(
            check_own_rpm(Some(10), Tier::Free, None, &plans()),
            Ok(Some(10))
        );
        assert_eq!(check_own_rpm(None, Tier::Free, None, &plans()), Ok(None));
        let err = check_own_rpm(Some(11), Tier::Free, None, &plans()).unwrap_err();
        assert!(err.to_string().contains("10 requests per minute"), "{err}");
        assert!(check_own_rpm(Some(0), Tier::Free, None, &plans()).is_err());
        let message = KeyRequestError::TooManyKeys {
            max: 3,
            tier: Tier::Free,
        }
        .to_string();
        assert!(message.contains("3 keys") && message.contains("free plan"));
    }
}

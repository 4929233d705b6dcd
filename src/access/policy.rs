//! Policies: an account's own choice, per category, of "off" or a threshold
//! that replaces the shipped one, and of the text path's speed (accurate by
//! default; fast for high-volume keys). A key is judged by its own policy,
//! else by its account's default policy, else by the shipped thresholds
//! alone on the accurate path.
//!
//! A policy changes decisions (`flagged`, `categories`), never scores; the
//! decision itself is [`crate::moderation::EffectiveThresholds::decide`].
//! Every change makes a new version, kept with who made it and when.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::accounts::AccountId;
use crate::moderation::{
    Category, CategoryRule, CategoryRules, Speed, Threshold, ThresholdOutOfRange, UnknownSpeed,
};

/// A policy's id: a UUID, kept as its hyphenated lower-case text.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PolicyId(String);

impl PolicyId {
    pub fn new_random() -> PolicyId {
        PolicyId(uuid::Uuid::new_v4().hyphenated().to_string())
    }

    /// `None` unless `s` is a UUID in its canonical lower-case form.
    pub fn parse(s: &str) -> Option<PolicyId> {
        let uuid = uuid::Uuid::try_parse(s).ok()?;
        let canonical = uuid.hyphenated().to_string();
        (canonical == s).then_some(PolicyId(canonical))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PolicyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a policy (or a key's choice of one) was refused. Every message names
/// the field it is about, so the CLI and the dashboard can show it as is.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PolicyError {
    #[error(
        "{field}: unknown category {name:?}; the categories are {}",
        category_list()
    )]
    UnknownCategory { field: String, name: String },
    #[error("{field}: {source}")]
    Threshold {
        field: String,
        #[source]
        source: ThresholdOutOfRange,
    },
    #[error("{field}: {category} is given more than one rule")]
    Repeated { field: String, category: Category },
    #[error("name: give the policy a name of 1 to {MAX_NAME_CHARS} characters")]
    Name,
    #[error("speed: {0}")]
    Speed(#[from] UnknownSpeed),
    #[error("{field}: no policy {id:?} in this account")]
    NotInAccount { field: String, id: String },
}

fn category_list() -> String {
    Category::ALL
        .iter()
        .map(|c| c.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

pub const MAX_NAME_CHARS: usize = 100;

/// A policy's name, trimmed: 1 to 100 characters.
pub fn policy_name(text: &str) -> Result<String, PolicyError> {
    let name = text.trim();
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err(PolicyError::Name);
    }
    Ok(name.to_owned())
}

/// The category named `name`, or an error naming `field`.
pub fn category(field: &str, name: &str) -> Result<Category, PolicyError> {
    Category::parse(name.trim()).ok_or_else(|| PolicyError::UnknownCategory {
        field: field.to_owned(),
        name: name.to_owned(),
    })
}

/// A threshold in (0, 1] from text, or an error naming `field`.
pub fn threshold(field: &str, text: &str) -> Result<Threshold, PolicyError> {
    text.parse().map_err(|source| PolicyError::Threshold {
        field: field.to_owned(),
        source,
    })
}

/// Rules from the command line: `--threshold CATEGORY=VALUE` and `--off
/// CATEGORY`, each category at most once.
pub fn rules_from_args(
    thresholds: &[String],
    off: &[String],
) -> Result<CategoryRules, PolicyError> {
    let mut rules = CategoryRules::default();
    let mut put = |field: &str, c: Category, rule: CategoryRule| {
        if rules.get(c).is_some() {
            return Err(PolicyError::Repeated {
                field: field.to_owned(),
                category: c,
            });
        }
        rules.set(c, Some(rule));
        Ok(())
    };
    for arg in thresholds {
        let (name, value) = arg.split_once('=').unwrap_or((arg.as_str(), ""));
        let c = category("--threshold", name)?;
        let t = threshold(&format!("--threshold {}", c.as_str()), value)?;
        put("--threshold", c, CategoryRule::Threshold(t))?;
    }
    for name in off {
        let c = category("--off", name)?;
        put("--off", c, CategoryRule::Off)?;
    }
    Ok(rules)
}

/// The rules as stored and shown: `{"hate": 0.3, "violence": "off"}`, only
/// the categories with a rule.
pub fn rules_to_json(rules: &CategoryRules) -> serde_json::Value {
    let map = rules
        .iter()
        .map(|(c, rule)| {
            let value = match rule {
                CategoryRule::Off => serde_json::Value::from("off"),
                // Through the shortest decimal of the f32, so 0.3 stays 0.3.
                CategoryRule::Threshold(t) => {
                    serde_json::Value::from(t.to_string().parse::<f64>().unwrap_or(1.0))
                }
            };
            (c.as_str().to_owned(), value)
        })
        .collect();
    serde_json::Value::Object(map)
}

/// The key of the stored form that holds the speed: no category is named
/// so, and a policy on the default (accurate) path stores none, so every
/// policy stored before speeds existed reads as accurate.
const SPEED_KEY: &str = "speed";

/// A policy's rules and speed as stored: [`rules_to_json`], with
/// `"speed": "fast"` when the policy chooses the fast path.
pub fn policy_to_json(rules: &CategoryRules, speed: Speed) -> serde_json::Value {
    let mut json = rules_to_json(rules);
    if speed != Speed::default() {
        json[SPEED_KEY] = serde_json::Value::from(speed.as_str());
    }
    json
}

/// Reads a stored policy's rules and speed back, checking them as new ones
/// are checked.
pub fn policy_from_json(text: &str) -> Result<(CategoryRules, Speed), String> {
    let mut map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(text).map_err(|e| format!("stored policy rules: {e}"))?;
    let speed = match map.remove(SPEED_KEY) {
        None => Speed::default(),
        Some(serde_json::Value::String(s)) => {
            s.parse().map_err(|e| format!("stored policy speed: {e}"))?
        }
        Some(other) => return Err(format!("stored policy speed: {other}")),
    };
    let mut rules = CategoryRules::default();
    for (name, value) in map {
        let c = Category::parse(&name).ok_or_else(|| format!("stored rule for {name:?}"))?;
        let rule = match value {
            serde_json::Value::String(s) if s == "off" => CategoryRule::Off,
            // Through its decimal text: the number was written from an f32.
            serde_json::Value::Number(n) => {
                let t: Threshold = n
                    .to_string()
                    .parse()
                    .map_err(|e| format!("stored rule for {name}: {e}"))?;
                CategoryRule::Threshold(t)
            }
            other => return Err(format!("stored rule for {name}: {other}")),
        };
        rules.set(c, Some(rule));
    }
    Ok((rules, speed))
}

/// A policy as stored, at its current version.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    pub id: PolicyId,
    pub account_id: AccountId,
    pub name: String,
    /// 1 when made, one more at every change.
    pub version: u32,
    pub rules: CategoryRules,
    pub speed: Speed,
    /// Whether it is its account's default (for the keys without one of
    /// their own).
    pub is_default: bool,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// One version of a policy: what it said, who made it and when.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyVersion {
    pub version: u32,
    pub name: String,
    pub rules: CategoryRules,
    pub speed: Speed,
    /// The e-mail of the dashboard user, or `cli` for the command line.
    pub changed_by: String,
    pub changed_at: DateTime<Utc>,
}

/// The policy a key is judged by, read with the key (so the key cache's
/// short life carries a policy change to every replica as it carries a
/// revocation).
#[derive(Clone, Debug, PartialEq)]
pub struct AppliedPolicy {
    pub id: PolicyId,
    pub name: String,
    pub version: u32,
    pub rules: CategoryRules,
    pub speed: Speed,
}

/// What makes a new policy, or a new version of one.
#[derive(Clone, Debug)]
pub struct PolicyDraft {
    pub name: String,
    pub rules: CategoryRules,
    pub speed: Speed,
    pub changed_by: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn rules_from_args_name_the_field_of_what_is_wrong() {
        let rules = rules_from_args(
            &args(&["hate=0.3", "self-harm/intent=1"]),
            &args(&["violence"]),
        )
        .unwrap();
        assert_eq!(rules.get(Category::Violence), Some(CategoryRule::Off));
        assert_eq!(rules.get(Category::Sexual), None);
        let json = rules_to_json(&rules);
        assert_eq!(json["hate"], 0.3);
        assert_eq!(json["violence"], "off");
        assert_eq!(
            policy_from_json(&json.to_string()).unwrap(),
            (rules, Speed::Accurate)
        );
        let fast = policy_to_json(&rules, Speed::Fast);
        assert_eq!(fast["speed"], "fast");
        assert_eq!(
            policy_from_json(&fast.to_string()).unwrap(),
            (rules, Speed::Fast)
        );
        assert!(policy_from_json(r#"{"speed": "quick"}"#)
            .unwrap_err()
            .contains("unknown speed"));

        let unknown = rules_from_args(&args(&["hat=0.3"]), &[]).unwrap_err();
        assert!(unknown
            .to_string()
            .starts_with("--threshold: unknown category \"hat\""));
        let range = rules_from_args(&args(&["hate=1.5"]), &[]).unwrap_err();
        assert!(
            range.to_string().starts_with("--threshold hate: "),
            "{range}"
        );
        let zero = rules_from_args(&args(&["hate=0"]), &[]).unwrap_err();
        assert!(matches!(zero, PolicyError::Threshold { .. }));
        let twice = rules_from_args(&args(&["hate=0.3"]), &args(&["hate"])).unwrap_err();
        assert!(matches!(twice, PolicyError::Repeated { .. }));
        assert!(rules_from_args(&[], &args(&["nope"])).is_err());
    }

    #[test]
    fn ids_and_names() {
        let id = PolicyId::new_random();
        assert_eq!(PolicyId::parse(id.as_str()), Some(id));
        assert_eq!(PolicyId::parse("ABC"), None);
        assert_eq!(policy_name("  strict "), Ok("strict".to_owned()));
        assert_eq!(policy_name(" "), Err(PolicyError::Name));
    }
}

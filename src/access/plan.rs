//! A plan as a key or an account carries it: a tier and, optionally, its own
//! requests-per-minute limit.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::config::Plans;

/// A plan. Its rate limit comes from configuration (enterprise: per key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    Free,
    Basic,
    Pro,
    Enterprise,
}

impl Tier {
    pub const ALL: [Tier; 4] = [Tier::Free, Tier::Basic, Tier::Pro, Tier::Enterprise];

    pub const fn as_str(self) -> &'static str {
        match self {
            Tier::Free => "free",
            Tier::Basic => "basic",
            Tier::Pro => "pro",
            Tier::Enterprise => "enterprise",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Tier {
    type Err = String;
    fn from_str(s: &str) -> Result<Tier, String> {
        Tier::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| format!("unknown tier {s:?}: expected free, basic, pro or enterprise"))
    }
}

/// A tier and its optional custom limit. Built only through [`Plan::new`],
/// so an enterprise plan always has its limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    tier: Tier,
    custom_rpm: Option<u32>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("an enterprise plan needs its limit: give the requests per minute (--rpm N)")]
    EnterpriseNeedsRpm,
    #[error("the requests per minute must be at least 1")]
    ZeroRpm,
}

impl Plan {
    pub fn new(tier: Tier, custom_rpm: Option<u32>) -> Result<Plan, PlanError> {
        match (tier, custom_rpm) {
            (_, Some(0)) => Err(PlanError::ZeroRpm),
            (Tier::Enterprise, None) => Err(PlanError::EnterpriseNeedsRpm),
            _ => Ok(Plan { tier, custom_rpm }),
        }
    }

    pub fn tier(self) -> Tier {
        self.tier
    }

    pub fn custom_rpm(self) -> Option<u32> {
        self.custom_rpm
    }

    /// Requests per minute: the custom limit, else the plan's.
    pub fn rpm(self, plans: &Plans) -> u32 {
        effective_rpm(self.tier, self.custom_rpm, plans)
    }
}

/// The one place the rule "custom limit, else the plan's" lives; the API's
/// rate limiter, the CLI and the dashboard all ask it.
pub fn effective_rpm(tier: Tier, custom_rpm: Option<u32>, plans: &Plans) -> u32 {
    custom_rpm.unwrap_or_else(|| plans.rpm(tier))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plans() -> Plans {
        Plans {
            free: 10,
            basic: 60,
            pro: 300,
            enterprise: 1000,
        }
    }

    #[test]
    fn enterprise_needs_its_limit() {
        assert_eq!(
            Plan::new(Tier::Enterprise, None),
            Err(PlanError::EnterpriseNeedsRpm)
        );
        assert_eq!(Plan::new(Tier::Pro, Some(0)), Err(PlanError::ZeroRpm));
        let plan = Plan::new(Tier::Enterprise, Some(5000)).unwrap();
        assert_eq!(plan.rpm(&plans()), 5000);
    }

    #[test]
    fn custom_limit_else_the_plans() {
        assert_eq!(Plan::new(Tier::Basic, None).unwrap().rpm(&plans()), 60);
        assert_eq!(Plan::new(Tier::Basic, Some(7)).unwrap().rpm(&plans()), 7);
    }
}

//! A plan as a key or an account carries it: a tier and, optionally, its own
//! requests-per-minute limit.

use crate::config::Plans;
use crate::store::Tier;

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

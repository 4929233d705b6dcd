//! Upkeep of the raw usage events: the day partitions of the coming days
//! are made ahead (PostgreSQL), and days past the retention are dropped
//! whole. Runs at start and then every hour; several replicas may run it at
//! once (making a partition takes turns, dropping one twice is a no-op).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use chrono::{Days, NaiveDate, Utc};
use tokio_util::sync::CancellationToken;

use crate::store::{Store, StoreError, UsagePruned};

const EVERY: Duration = Duration::from_secs(3600);

/// What the upkeep keeps and makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsageUpkeep {
    /// Partitions are made for yesterday (a late event of a replica whose
    /// clock lags) through today plus this many days.
    pub ahead_days: u32,
    /// Raw events of this many whole UTC days before today are kept with
    /// today's; `None` keeps them forever.
    pub retention_days: Option<NonZeroU32>,
}

impl UsageUpkeep {
    /// From `usage.partitions_ahead_days` and `usage.retention_days` (0:
    /// forever).
    pub fn new(ahead_days: u32, retention_days: u32) -> UsageUpkeep {
        UsageUpkeep {
            ahead_days,
            retention_days: NonZeroU32::new(retention_days),
        }
    }

    /// The first day whose raw events are kept, if any are dropped.
    pub fn first_kept_day(&self, today: NaiveDate) -> Option<NaiveDate> {
        let days = self.retention_days?;
        today.checked_sub_days(Days::new(u64::from(days.get())))
    }

    /// One round: partitions made ahead, then expired days dropped.
    pub async fn run(
        &self,
        store: &dyn Store,
        today: NaiveDate,
    ) -> Result<(u32, UsagePruned), StoreError> {
        let first = today.pred_opt().unwrap_or(today);
        let last = today
            .checked_add_days(Days::new(u64::from(self.ahead_days)))
            .unwrap_or(today);
        let made = store.prepare_usage_days(first, last).await?;
        let pruned = match self.first_kept_day(today) {
            Some(day) => store.drop_usage_before(day).await?,
            None => UsagePruned::default(),
        };
        Ok((made, pruned))
    }
}

/// Runs the upkeep now and then every hour until `shutdown`.
pub fn spawn_upkeep(store: Arc<dyn Store>, upkeep: UsageUpkeep, shutdown: CancellationToken) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(EVERY);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = every.tick() => {}
            }
            match upkeep.run(store.as_ref(), Utc::now().date_naive()).await {
                Ok((
                    0,
                    UsagePruned {
                        partitions: 0,
                        rows: 0,
                    },
                )) => {}
                Ok((made, pruned)) => tracing::info!(
                    partitions_made = made,
                    partitions_dropped = pruned.partitions,
                    rows_deleted = pruned.rows,
                    "usage storage upkeep"
                ),
                // Retried at the next tick: until then events of a day
                // without its partition land in the default one, and
                // expired days only cost disk.
                Err(e) => tracing::warn!(error = %e, "usage storage upkeep failed"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_retention_keeps_everything() {
        let today = NaiveDate::from_ymd_opt(2026, 3, 10).unwrap();
        assert_eq!(UsageUpkeep::new(7, 0).first_kept_day(today), None);
        assert_eq!(
            UsageUpkeep::new(7, 30).first_kept_day(today),
            NaiveDate::from_ymd_opt(2026, 2, 8)
        );
    }
}

//! The memory every request together may hold for decoding images: a
//! request reserves an image's peak before decoding it and waits for its
//! share a short while at most, so concurrent decompression bombs queue (or
//! are turned away) instead of exhausting the machine.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Permits are KiB, so that a u32 count covers terabytes.
const UNIT: u64 = 1024;

pub struct DecodeBudget {
    permits: Arc<Semaphore>,
    total_units: u32,
    wait: Duration,
}

/// Memory held for one decode; given back when dropped.
#[derive(Debug)]
pub struct DecodeReservation {
    _permit: OwnedSemaphorePermit,
}

/// The budget stayed short for the whole wait.
#[derive(Debug, thiserror::Error)]
#[error("no decoding memory became free within {0:?}")]
pub struct NoMemoryInTime(pub Duration);

impl DecodeBudget {
    pub fn new(total_bytes: u64, wait: Duration) -> DecodeBudget {
        let total_units = u32::try_from((total_bytes / UNIT).max(1)).unwrap_or(u32::MAX);
        DecodeBudget {
            permits: Arc::new(Semaphore::new(total_units as usize)),
            total_units,
            wait,
        }
    }

    /// Reserves `bytes` (at most the whole budget: an image larger than it
    /// then decodes alone), waiting at most the configured time. Waiters are
    /// served in order, so a large image is not starved by small ones.
    pub async fn reserve(&self, bytes: u64) -> Result<DecodeReservation, NoMemoryInTime> {
        let units = u32::try_from(bytes.div_ceil(UNIT))
            .unwrap_or(u32::MAX)
            .clamp(1, self.total_units);
        let acquire = self.permits.clone().acquire_many_owned(units);
        match tokio::time::timeout(self.wait, acquire).await {
            Ok(Ok(permit)) => Ok(DecodeReservation { _permit: permit }),
            // The semaphore is never closed; treat it like a timeout anyway.
            Ok(Err(_)) | Err(_) => Err(NoMemoryInTime(self.wait)),
        }
    }

    /// Bytes free right now (for tests and logs).
    pub fn available_bytes(&self) -> u64 {
        self.permits.available_permits() as u64 * UNIT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reservations_wait_for_memory_and_give_up_after_the_wait() {
        let budget = DecodeBudget::new(10 * UNIT, Duration::from_millis(50));
        let first = budget.reserve(6 * UNIT).await.expect("fits");
        assert_eq!(budget.available_bytes(), 4 * UNIT);
        assert!(budget.reserve(6 * UNIT).await.is_err(), "over the budget");
        drop(first);
        let whole = budget
            .reserve(1_000 * UNIT)
            .await
            .expect("clamped to the budget");
        assert_eq!(budget.available_bytes(), 0);
        drop(whole);
        assert_eq!(budget.available_bytes(), 10 * UNIT);
    }
}

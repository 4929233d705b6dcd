//! A request's deadline, shared by the engine and the classifiers it calls:
//! past it (or once cancelled) the remaining work is abandoned, so that one
//! request cannot buy more CPU than its deadline allows.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// When a request's work must stop. Cloning shares the cancellation.
#[derive(Clone, Debug)]
pub struct Deadline {
    at: Instant,
    cancelled: Arc<AtomicBool>,
}

/// The deadline passed (or the request was cancelled) before the work was done.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the request's deadline passed before its work was done")]
pub struct DeadlineExceeded;

impl Deadline {
    pub fn after(duration: Duration) -> Deadline {
        let now = Instant::now();
        Deadline {
            at: now
                .checked_add(duration)
                .unwrap_or(now + Duration::from_secs(86_400)),
            cancelled: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A deadline a day away: for callers (benchmarks, tests) that set none.
    pub fn distant() -> Deadline {
        Deadline::after(Duration::from_secs(86_400))
    }

    pub fn instant(&self) -> Instant {
        self.at
    }

    /// Tells every holder to stop at its next check.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    pub fn is_over(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed) || Instant::now() >= self.at
    }

    /// `Err` once the work should stop: call it between units of work.
    pub fn check(&self) -> Result<(), DeadlineExceeded> {
        if self.is_over() {
            Err(DeadlineExceeded)
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_is_over_when_passed_or_cancelled() {
        let open = Deadline::after(Duration::from_secs(60));
        assert!(open.check().is_ok());
        let shared = open.clone();
        open.cancel();
        assert_eq!(shared.check(), Err(DeadlineExceeded));
        assert!(Deadline::after(Duration::ZERO).is_over());
    }
}

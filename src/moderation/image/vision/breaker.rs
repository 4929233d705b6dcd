//! A circuit breaker, so that a failing provider is not hammered and our
//! requests do not each wait out a timeout against it.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub(super) struct Breaker {
    /// Consecutive failures that open the circuit; 0 disables the breaker.
    threshold: u32,
    cooldown: Duration,
    state: Mutex<State>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Closed {
        failures: u32,
    },
    Open {
        since: Instant,
    },
    /// The cooldown has passed and one trial call is under way.
    HalfOpen,
}

/// The state as the `moderato_vision_circuit_state` gauge: 0 closed, 1
/// open, 2 half-open.
fn publish(state: State) {
    let value = match state {
        State::Closed { .. } => 0.0,
        State::Open { .. } => 1.0,
        State::HalfOpen => 2.0,
    };
    metrics::gauge!(crate::metrics::names::VISION_CIRCUIT).set(value);
}

impl Breaker {
    pub(super) fn new(threshold: u32, cooldown: Duration) -> Breaker {
        Breaker {
            threshold,
            cooldown,
            state: Mutex::new(State::Closed { failures: 0 }),
        }
    }

    /// Permission for one call, or `None` while the circuit is open (or
    /// half-open with its trial call still running).
    pub(super) fn try_call(&self) -> Option<Ticket<'_>> {
        if self.threshold == 0 {
            return Some(Ticket {
                breaker: self,
                trial: false,
                settled: false,
            });
        }
        let mut state = self.lock();
        match *state {
            State::Closed { .. } => Some(Ticket {
                breaker: self,
                trial: false,
                settled: false,
            }),
            State::Open { since } if since.elapsed() >= self.cooldown => {
                *state = State::HalfOpen;
                publish(*state);
                Some(Ticket {
                    breaker: self,
                    trial: true,
                    settled: false,
                })
            }
            State::Open { .. } | State::HalfOpen => None,
        }
    }

    fn record(&self, success: bool, trial: bool) {
        if self.threshold == 0 {
            return;
        }
        let mut state = self.lock();
        *state = match (*state, success) {
            (_, true) => State::Closed { failures: 0 },
            (State::HalfOpen, false) if trial => {
                tracing::warn!(
                    "vision provider still failing after the cooldown; circuit stays open"
                );
                State::Open {
                    since: Instant::now(),
                }
            }
            (State::Closed { failures }, false) if failures + 1 >= self.threshold => {
                tracing::warn!(
                    failures = failures + 1,
                    cooldown_ms = self.cooldown.as_millis() as u64,
                    "vision provider failing; circuit opened"
                );
                State::Open {
                    since: Instant::now(),
                }
            }
            (State::Closed { failures }, false) => State::Closed {
                failures: failures + 1,
            },
            // A call begun before the circuit opened: it changes nothing.
            (other, false) => other,
        };
        publish(*state);
    }

    /// A call that ended without saying anything about the provider (it
    /// panicked): a trial's place is given back, nothing else changes.
    fn abandon(&self, trial: bool) {
        if self.threshold == 0 || !trial {
            return;
        }
        let mut state = self.lock();
        if *state == State::HalfOpen {
            *state = State::Open {
                since: Instant::now()
                    .checked_sub(self.cooldown)
                    .unwrap_or_else(Instant::now),
            };
            publish(*state);
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a plain value, valid even if a holder panicked.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One permitted call. Dropping it unsettled (the call was cancelled, e.g.
/// by the timeout) counts as a failure, so a half-open circuit never waits
/// forever for a trial that will not report.
pub(super) struct Ticket<'a> {
    breaker: &'a Breaker,
    trial: bool,
    settled: bool,
}

impl Ticket<'_> {
    pub(super) fn success(mut self) {
        self.settle(true);
    }

    pub(super) fn failure(mut self) {
        self.settle(false);
    }

    fn settle(&mut self, success: bool) {
        if !self.settled {
            self.settled = true;
            self.breaker.record(success, self.trial);
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Our own bug, not the provider's: count nothing, but give a
            // trial back so that the next call may try again.
            self.settled = true;
            self.breaker.abandon(self.trial);
        } else {
            self.settle(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_only() {
        let breaker = Breaker::new(3, Duration::from_secs(60));
        breaker.try_call().unwrap().failure();
        breaker.try_call().unwrap().failure();
        breaker.try_call().unwrap().success();
        breaker.try_call().unwrap().failure();
        breaker.try_call().unwrap().failure();
        breaker
            .try_call()
            .expect("a success must reset the count")
            .failure();
        assert!(breaker.try_call().is_none());
    }

    #[test]
    fn a_call_that_panics_is_not_the_providers_failure() {
        let breaker = Breaker::new(2, Duration::from_secs(60));
        breaker.try_call().unwrap().failure();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ticket = breaker.try_call().unwrap();
            panic!("a bug of ours while the call was under way");
        }));
        assert!(panicked.is_err());
        // One failure still: the panic did not open the circuit.
        breaker.try_call().expect("still closed").success();

        // A trial that panics gives its place back instead of re-opening
        // the circuit for another cooldown.
        let breaker = Breaker::new(1, Duration::from_millis(50));
        breaker.try_call().unwrap().failure();
        std::thread::sleep(Duration::from_millis(60));
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _trial = breaker.try_call().expect("cooldown over: a trial");
            panic!("a bug of ours during the trial");
        }));
        assert!(panicked.is_err());
        assert!(
            breaker.try_call().is_some(),
            "the next call may try again at once"
        );
    }

    #[test]
    fn half_open_allows_one_trial_then_closes_or_reopens() {
        let breaker = Breaker::new(1, Duration::ZERO);
        breaker.try_call().unwrap().failure();
        let trial = breaker.try_call().expect("cooldown over: a trial");
        assert!(breaker.try_call().is_none(), "only one trial at a time");
        trial.failure();
        let trial = breaker
            .try_call()
            .expect("a new trial after another cooldown");
        trial.success();
        breaker.try_call().expect("closed again").success();
        breaker.try_call().expect("closed again").success();
    }

    #[test]
    fn dropped_ticket_counts_as_failure() {
        let breaker = Breaker::new(1, Duration::from_secs(60));
        drop(breaker.try_call().unwrap());
        assert!(breaker.try_call().is_none());
    }

    #[test]
    fn zero_threshold_disables() {
        let breaker = Breaker::new(0, Duration::from_secs(60));
        for _ in 0..10 {
            breaker.try_call().unwrap().failure();
        }
        assert!(breaker.try_call().is_some());
    }
}

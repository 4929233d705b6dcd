//! The lingering connections, oldest first, so that lingering (a courtesy to
//! clients that write before they read) never makes another client wait:
//! past their own budget, or when the server runs short of slots, the
//! oldest is told to close at once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::futures::Notified;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::metrics::names;

/// Every lingering connection, by the order it started lingering in.
#[derive(Default)]
pub(super) struct Lingering {
    inner: Mutex<Registry>,
    /// Signalled when a connection starts lingering (for a waiting accept).
    entered: Notify,
}

#[derive(Default)]
struct Registry {
    next: u64,
    open: BTreeMap<u64, CancellationToken>,
}

/// One lingering connection's place; `evicted` fires when it must close.
pub(super) struct LingerTicket {
    lingering: Arc<Lingering>,
    id: u64,
    pub(super) evicted: CancellationToken,
}

impl Lingering {
    /// Registers a connection that starts lingering; first closes the
    /// oldest ones while `budget` are already lingering.
    pub(super) fn enter(self: &Arc<Self>, budget: usize) -> LingerTicket {
        let mut registry = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        while registry.open.len() >= budget.max(1) {
            let Some((_, oldest)) = registry.open.pop_first() else {
                break;
            };
            evict(&oldest, "budget");
        }
        let id = registry.next;
        registry.next += 1;
        let evicted = CancellationToken::new();
        registry.open.insert(id, evicted.clone());
        drop(registry);
        self.entered.notify_waiters();
        LingerTicket {
            lingering: self.clone(),
            id,
            evicted,
        }
    }

    /// Resolves when a connection starts lingering after this was made
    /// (`enable`d).
    pub(super) fn entered(&self) -> Notified<'_> {
        self.entered.notified()
    }

    /// Closes the oldest lingering connection, if there is one.
    pub(super) fn evict_oldest(&self) -> bool {
        let mut registry = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        match registry.open.pop_first() {
            Some((_, oldest)) => {
                evict(&oldest, "slots");
                true
            }
            None => false,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().unwrap().open.len()
    }
}

/// `reason`: what made room necessary (`budget`: the lingering budget was
/// full; `slots`: the server ran short of connection slots).
fn evict(token: &CancellationToken, reason: &'static str) {
    token.cancel();
    metrics::counter!(names::LINGERING_EVICTED, "reason" => reason).increment(1);
}

impl Drop for LingerTicket {
    fn drop(&mut self) {
        let mut registry = self
            .lingering
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        registry.open.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_budget_the_oldest_is_evicted() {
        let lingering = Arc::new(Lingering::default());
        let first = lingering.enter(2);
        let second = lingering.enter(2);
        assert!(!first.evicted.is_cancelled());
        let third = lingering.enter(2);
        assert!(first.evicted.is_cancelled(), "the oldest goes first");
        assert!(!second.evicted.is_cancelled() && !third.evicted.is_cancelled());
        assert_eq!(lingering.len(), 2);
    }

    #[test]
    fn short_of_slots_the_oldest_is_evicted_and_a_closed_one_is_forgotten() {
        let lingering = Arc::new(Lingering::default());
        let first = lingering.enter(10);
        let second = lingering.enter(10);
        drop(first);
        assert_eq!(lingering.len(), 1);
        assert!(lingering.evict_oldest());
        assert!(second.evicted.is_cancelled());
        assert!(!lingering.evict_oldest(), "nothing left to evict");
    }
}

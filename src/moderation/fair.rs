//! A lane of CPU slots shared fairly between accounts: when slots are
//! short, waiting jobs are served one account at a time in turn, not in
//! arrival order, so an account with many jobs queued (8 images in each of
//! several requests) delays another account's job by at most one of its
//! own jobs per slot (issue #58, B).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// Whose job it is: the account a key belongs to (an operator key is its
/// own). Jobs of one tenant are served in order; tenants take turns.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Tenant(String);

impl Tenant {
    pub fn new(name: impl Into<String>) -> Tenant {
        Tenant(name.into())
    }
}

/// The slots, and who waits for them.
pub struct FairLane {
    state: Mutex<LaneState>,
}

#[derive(Default)]
struct LaneState {
    free: usize,
    /// Tenants with waiting jobs, the next to be served first.
    turns: VecDeque<Tenant>,
    waiting: HashMap<Tenant, VecDeque<oneshot::Sender<FairPermit>>>,
}

/// One slot, held while a job runs; dropping it hands the slot to the next
/// tenant's first waiting job.
pub struct FairPermit {
    /// `None` once disarmed: a permit nobody took releases nothing.
    lane: Option<Arc<FairLane>>,
}

/// The lane went away while a job waited (the engine is shutting down).
#[derive(Debug, thiserror::Error)]
#[error("the CPU lane closed while a job waited")]
pub struct LaneClosed;

impl FairLane {
    pub fn new(slots: usize) -> Arc<FairLane> {
        Arc::new(FairLane {
            state: Mutex::new(LaneState {
                free: slots,
                ..LaneState::default()
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, LaneState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a slot, behind at most one job of each other tenant
    /// waiting now for every job of `tenant` queued before this one.
    pub async fn acquire(self: &Arc<Self>, tenant: &Tenant) -> Result<FairPermit, LaneClosed> {
        let turn = {
            let mut state = self.state();
            // Free slots only exist while nobody waits (a release serves
            // the queue first), so taking one here jumps no queue.
            if state.free > 0 {
                state.free -= 1;
                return Ok(FairPermit {
                    lane: Some(self.clone()),
                });
            }
            let (sender, turn) = oneshot::channel();
            if !state.waiting.contains_key(tenant) {
                state.turns.push_back(tenant.clone());
            }
            state
                .waiting
                .entry(tenant.clone())
                .or_default()
                .push_back(sender);
            turn
        };
        // A waiter that gives up (its deadline) drops `turn`; a slot sent
        // to it then comes back through the permit's drop.
        turn.await.map_err(|_| LaneClosed)
    }

    /// The next waiting job, the tenants in turn: `None` when nobody waits.
    fn next_waiter(state: &mut LaneState) -> Option<oneshot::Sender<FairPermit>> {
        while let Some(tenant) = state.turns.pop_front() {
            let Some(queue) = state.waiting.get_mut(&tenant) else {
                continue;
            };
            let next = queue.pop_front();
            if queue.is_empty() {
                state.waiting.remove(&tenant);
            } else {
                state.turns.push_back(tenant);
            }
            if let Some(next) = next {
                return Some(next);
            }
        }
        None
    }

    fn release(self: &Arc<Self>) {
        loop {
            let next = {
                let mut state = self.state();
                match Self::next_waiter(&mut state) {
                    Some(next) => next,
                    None => {
                        state.free += 1;
                        return;
                    }
                }
            };
            // Sent without the lock held: a permit sent to a waiter that
            // then drops it unread releases through its own drop.
            let permit = FairPermit {
                lane: Some(self.clone()),
            };
            match next.send(permit) {
                Ok(()) => return,
                Err(mut refused) => {
                    // That waiter gave up: the slot goes to the next one,
                    // in this loop rather than through the permit's drop.
                    refused.lane = None;
                }
            }
        }
    }

    #[cfg(test)]
    fn free(&self) -> usize {
        self.state().free
    }
}

impl Drop for FairPermit {
    fn drop(&mut self) {
        if let Some(lane) = self.lane.take() {
            lane.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Issue #58, B: with one slot held, account A's three jobs queued
    /// before account B's one, B's job runs second, not fourth.
    #[tokio::test]
    async fn tenants_take_turns_for_the_slots() {
        let lane = FairLane::new(1);
        let held = lane.acquire(&Tenant::new("a")).await.unwrap();
        let (done, mut order) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        for (name, job) in [("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1")] {
            let (lane, done) = (lane.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                let permit = lane.acquire(&Tenant::new(name)).await.unwrap();
                done.send(job).unwrap();
                drop(permit);
            }));
            // Queued in this order.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(held);
        for task in tasks {
            task.await.unwrap();
        }
        drop(done);
        let mut served = Vec::new();
        while let Some(job) = order.recv().await {
            served.push(job);
        }
        assert_eq!(served, ["a1", "b1", "a2", "a3"]);
        assert_eq!(lane.free(), 1, "every slot came back");
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_does_not_keep_a_slot() {
        let lane = FairLane::new(1);
        let held = lane.acquire(&Tenant::new("a")).await.unwrap();
        let gave_up =
            tokio::time::timeout(Duration::from_millis(20), lane.acquire(&Tenant::new("b"))).await;
        assert!(gave_up.is_err());
        drop(held);
        assert_eq!(lane.free(), 1);
        let again = tokio::time::timeout(Duration::from_secs(1), lane.acquire(&Tenant::new("c")))
            .await
            .expect("the slot is free");
        drop(again);
        assert_eq!(lane.free(), 1);
    }
}

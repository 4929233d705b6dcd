//! Sign-in attempts for one account, and from one address, run one at a
//! time in this process. Without it, guesses sent together all read the
//! failure count before any of them is recorded, and each gets its password
//! checked: 100 concurrent guesses would pass a limit of 10.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

type Locks = Arc<Mutex<HashMap<String, Arc<AsyncMutex<()>>>>>;

/// One lock per key, created on demand and dropped with its last holder or
/// waiter, so that memory follows the attempts in flight, not every key
/// ever tried.
#[derive(Default)]
pub struct AttemptLocks {
    locks: Locks,
}

/// Held while an attempt reads its failures, checks the password and
/// records the outcome.
pub struct AttemptGuard {
    locks: Locks,
    key: String,
    _held: OwnedMutexGuard<()>,
}

impl AttemptLocks {
    /// Waits for the attempts of `key` before this one to finish.
    pub async fn lock(&self, key: String) -> AttemptGuard {
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
            locks.entry(key.clone()).or_default().clone()
        };
        AttemptGuard {
            locks: self.locks.clone(),
            key,
            _held: lock.lock_owned().await,
        }
    }

    /// Waits for the earlier attempts on this account and then on this
    /// address. Always in this order, so that two attempts never wait for
    /// each other crosswise; hold both guards until the outcome is recorded.
    pub async fn account_then_address(
        &self,
        email_key: &str,
        address: &str,
    ) -> (AttemptGuard, AttemptGuard) {
        let account = self.lock(format!("account:{email_key}")).await;
        let address = self.lock(format!("address:{address}")).await;
        (account, address)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.locks.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Drop for AttemptGuard {
    fn drop(&mut self) {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        // The map's reference and the one this guard still holds: nobody
        // else waits, so the entry can go (a later attempt makes a new one).
        if locks
            .get(&self.key)
            .is_some_and(|l| Arc::strong_count(l) <= 2)
        {
            locks.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn attempts_of_one_key_run_one_at_a_time_and_leave_nothing_behind() {
        let locks = Arc::new(AttemptLocks::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (locks, inside, most) = (locks.clone(), inside.clone(), most.clone());
                tokio::spawn(async move {
                    let _guard = locks.lock("alice@example.com".into()).await;
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 1);
        assert_eq!(locks.len(), 0, "no lock outlives its attempts");

        // Different keys do not wait for each other.
        let a = locks.lock("a".into()).await;
        let b = tokio::time::timeout(Duration::from_secs(1), locks.lock("b".into())).await;
        assert!(b.is_ok());
        drop((a, b));
        assert_eq!(locks.len(), 0);
    }
}

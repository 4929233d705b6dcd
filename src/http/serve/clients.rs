//! Connections open per client: at most `max` from one client key (an IPv4
//! address or an IPv6 /64, as every other per-client limit counts), so that
//! one host cannot take every connection slot.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::access::client::ClientKey;

/// How often a refused client is logged at most.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Refused clients remembered for [`LOG_EVERY`]; past this many, the ones
/// logged longer ago are forgotten (they cannot be logged again sooner).
const LOGGED_PRUNE_AT: usize = 1024;

/// The open connections of every client that has one.
pub(super) struct ClientSlots {
    max: usize,
    open: Mutex<HashMap<ClientKey, usize>>,
    logged: Mutex<HashMap<ClientKey, Instant>>,
}

/// One open connection of a client; gives its place back when dropped.
pub(super) struct ClientSlot {
    slots: Arc<ClientSlots>,
    client: ClientKey,
}

impl ClientSlots {
    pub(super) fn new(max: usize) -> Arc<ClientSlots> {
        Arc::new(ClientSlots {
            max,
            open: Mutex::default(),
            logged: Mutex::default(),
        })
    }

    /// A place for one more connection of `client`, unless it has `max`.
    pub(super) fn try_take(self: &Arc<Self>, client: ClientKey) -> Option<ClientSlot> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(client).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(ClientSlot {
            slots: self.clone(),
            client,
        })
    }

    /// Whether a refusal of `client` should be logged now: once a minute at
    /// most, so that a flood of refusals cannot flood the log.
    pub(super) fn should_log(&self, client: ClientKey, now: Instant) -> bool {
        let mut logged = self.logged.lock().unwrap_or_else(PoisonError::into_inner);
        if logged.len() >= LOGGED_PRUNE_AT {
            logged.retain(|_, at| now.duration_since(*at) < LOG_EVERY);
        }
        match logged.get(&client) {
            Some(at) if now.duration_since(*at) < LOG_EVERY => false,
            _ => {
                logged.insert(client, now);
                true
            }
        }
    }

    #[cfg(test)]
    fn open(&self, client: ClientKey) -> usize {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.get(&client).copied().unwrap_or(0)
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self
            .slots
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                // Only clients with open connections take memory.
                open.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::client::client_key;

    fn key(address: &str) -> ClientKey {
        client_key(address.parse().unwrap())
    }

    #[test]
    fn a_client_gets_at_most_max_places_and_gets_them_back() {
        let slots = ClientSlots::new(2);
        let a = key("203.0.113.7");
        let first = slots.try_take(a).unwrap();
        let _second = slots.try_take(a).unwrap();
        assert!(slots.try_take(a).is_none());
        // Another client, and another address of the same IPv6 /64.
        assert!(slots.try_take(key("203.0.113.8")).is_some());
        let v6 = slots.try_take(key("2001:db8:1:2::1")).unwrap();
        let _v6b = slots.try_take(key("2001:db8:1:2::2")).unwrap();
        assert!(slots.try_take(key("2001:db8:1:2:ffff::9")).is_none());
        drop(v6);
        assert!(slots.try_take(key("2001:db8:1:2::3")).is_some());
        drop(first);
        assert_eq!(slots.open(a), 1);
        assert!(slots.try_take(a).is_some());
    }

    #[test]
    fn a_client_with_no_connection_takes_no_memory() {
        let slots = ClientSlots::new(4);
        let a = key("203.0.113.7");
        drop(slots.try_take(a).unwrap());
        assert!(slots.open.lock().unwrap().is_empty());
    }

    #[test]
    fn refusals_are_logged_once_a_minute_per_client() {
        let slots = ClientSlots::new(1);
        let (a, b) = (key("203.0.113.7"), key("203.0.113.8"));
        let now = Instant::now();
        assert!(slots.should_log(a, now));
        assert!(!slots.should_log(a, now + Duration::from_secs(59)));
        assert!(slots.should_log(b, now + Duration::from_secs(1)));
        assert!(slots.should_log(a, now + Duration::from_secs(61)));
    }
}

//! Results cache and single-flight, keyed by the SHA-256 of the image bytes:
//! an image is sent to the provider once however many requests carry it
//! within the cache window, including requests that arrive together.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, Shared};
use lru::LruCache;

use super::answer::ProviderVerdict;
use super::Failure;

pub(super) type Digest = [u8; 32];

/// What one flight (all attempts for one image) ends with.
pub(super) type Outcome = Result<Arc<ProviderVerdict>, Failure>;

/// A flight's outcome, awaitable by any number of requests.
pub(super) type Pending = Shared<BoxFuture<'static, Outcome>>;

pub(super) enum Lookup {
    Cached(Arc<ProviderVerdict>),
    InFlight(Pending),
}

pub(super) struct Flights {
    ttl: Duration,
    state: Mutex<State>,
}

struct State {
    /// `None` when caching is disabled.
    cache: Option<LruCache<Digest, (Instant, Arc<ProviderVerdict>)>>,
    in_flight: HashMap<Digest, Pending>,
}

impl Flights {
    /// `entries == 0` or a zero `ttl` disables the cache (single-flight stays).
    pub(super) fn new(entries: usize, ttl: Duration) -> Flights {
        let cache = NonZeroUsize::new(entries)
            .filter(|_| !ttl.is_zero())
            .map(LruCache::new);
        Flights {
            ttl,
            state: Mutex::new(State {
                cache,
                in_flight: HashMap::new(),
            }),
        }
    }

    /// A fresh cached result, the flight already under way for this image,
    /// or a new flight from `start`. One lock covers the three so that no
    /// image is ever sent twice by a race between them.
    pub(super) fn lookup_or_start(
        &self,
        digest: Digest,
        start: impl FnOnce() -> Pending,
    ) -> Lookup {
        let mut state = self.lock();
        if let Some(verdict) = state.cached(&digest, self.ttl) {
            return Lookup::Cached(verdict);
        }
        if let Some(pending) = state.in_flight.get(&digest) {
            return Lookup::InFlight(pending.clone());
        }
        let pending = start();
        state.in_flight.insert(digest, pending.clone());
        Lookup::InFlight(pending)
    }

    /// Called by the flight itself when it ends: caches a success (never a
    /// failure, so the next request tries again) and retires the flight.
    pub(super) fn finish(&self, digest: Digest, outcome: &Outcome) {
        let mut state = self.lock();
        if let (Ok(verdict), Some(cache)) = (outcome, state.cache.as_mut()) {
            cache.put(digest, (Instant::now(), Arc::clone(verdict)));
        }
        state.in_flight.remove(&digest);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update leaves the maps consistent, so a poisoned lock is safe to reuse.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl State {
    fn cached(&mut self, digest: &Digest, ttl: Duration) -> Option<Arc<ProviderVerdict>> {
        let cache = self.cache.as_mut()?;
        let (stored_at, verdict) = cache.get(digest)?;
        if stored_at.elapsed() < ttl {
            return Some(Arc::clone(verdict));
        }
        cache.pop(digest);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use std::collections::BTreeMap;

    fn verdict() -> Arc<ProviderVerdict> {
        Arc::new(ProviderVerdict {
            scores: BTreeMap::from([("hate".to_owned(), 0.5)]),
            rationale: None,
        })
    }

    fn ready(outcome: Outcome) -> Pending {
        async move { outcome }.boxed().shared()
    }

    #[test]
    fn second_lookup_joins_the_flight_then_hits_the_cache() {
        let flights = Flights::new(8, Duration::from_secs(60));
        let mut starts = 0;
        let Lookup::InFlight(_) = flights.lookup_or_start([1; 32], || {
            starts += 1;
            ready(Ok(verdict()))
        }) else {
            panic!("nothing cached yet")
        };
        let Lookup::InFlight(_) =
            flights.lookup_or_start([1; 32], || unreachable!("already in flight"))
        else {
            panic!("must join the flight")
        };
        assert_eq!(starts, 1);
        flights.finish([1; 32], &Ok(verdict()));
        assert!(matches!(
            flights.lookup_or_start([1; 32], || unreachable!()),
            Lookup::Cached(_)
        ));
    }

    #[test]
    fn failures_are_not_cached_and_zero_ttl_disables() {
        let flights = Flights::new(8, Duration::from_secs(60));
        let _ = flights.lookup_or_start([2; 32], || {
            ready(Err(Failure::Connection {
                detail: String::new(),
            }))
        });
        flights.finish(
            [2; 32],
            &Err(Failure::Connection {
                detail: String::new(),
            }),
        );
        let mut started = false;
        let _ = flights.lookup_or_start([2; 32], || {
            started = true;
            ready(Ok(verdict()))
        });
        assert!(started, "a failure must not be cached");

        let uncached = Flights::new(8, Duration::ZERO);
        uncached.finish([3; 32], &Ok(verdict()));
        assert!(matches!(
            uncached.lookup_or_start([3; 32], || ready(Ok(verdict()))),
            Lookup::InFlight(_)
        ));
    }

    #[test]
    fn least_recently_used_entry_is_evicted() {
        let flights = Flights::new(1, Duration::from_secs(60));
        flights.finish([4; 32], &Ok(verdict()));
        flights.finish([5; 32], &Ok(verdict()));
        assert!(matches!(
            flights.lookup_or_start([5; 32], || unreachable!()),
            Lookup::Cached(_)
        ));
        assert!(matches!(
            flights.lookup_or_start([4; 32], || ready(Ok(verdict()))),
            Lookup::InFlight(_)
        ));
    }
}

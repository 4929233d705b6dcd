//! Per-key rate limits with GCRA: in process with governor, or shared by
//! every replica through a script run atomically in Redis on Redis's clock.
//! When Redis cannot be reached the service keeps serving on the in-process
//! limiter and says so in the log.

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{DefaultKeyedRateLimiter, Quota};
use redis::aio::ConnectionManager;
use tokio::sync::Mutex as AsyncMutex;

use super::allowance::Allowance;
use super::client::{client_key, ClientKey};

/// How long one Redis round trip may take before the local limiter decides.
const REDIS_TIMEOUT: Duration = Duration::from_millis(250);
/// How often to try to (re)connect to Redis while it is away.
const REDIS_RECONNECT_EVERY: Duration = Duration::from_secs(2);
/// At most one "Redis unreachable" warning per this interval.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The limiter's answer for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// Requests per minute of the key.
    pub limit: u32,
    /// Requests that could be made right now, after this one.
    pub remaining: u32,
    /// Time until the allowance is whole again.
    pub reset_after: Duration,
    /// When refused: time until one request will be admitted.
    pub retry_after: Duration,
}

impl Decision {
    /// From the GCRA state: `tat_after` is how far the theoretical arrival
    /// time lies ahead of now once this request is counted.
    fn from_gcra(
        allowed: bool,
        limit: u32,
        tat_after: Duration,
        retry_after: Duration,
    ) -> Decision {
        let interval = emission_interval(limit);
        let burst_window = interval * limit;
        let headroom = burst_window.saturating_sub(tat_after);
        let remaining = if allowed {
            (headroom.as_micros() / interval.as_micros().max(1)) as u32
        } else {
            0
        };
        Decision {
            allowed,
            limit,
            remaining: remaining.min(limit),
            reset_after: tat_after,
            retry_after,
        }
    }
}

fn emission_interval(rpm: u32) -> Duration {
    Duration::from_micros(60_000_000 / u64::from(rpm.max(1)))
}

/// A direct limiter that reports its remaining burst capacity.
type DirectLimiter =
    governor::RateLimiter<NotKeyed, InMemoryState, DefaultClock, StateInformationMiddleware>;

/// In-process GCRA limiters, one per bucket, rebuilt when a key's limit changes.
#[derive(Default)]
pub struct LocalLimiter {
    buckets: Mutex<HashMap<String, (u32, Arc<DirectLimiter>)>>,
}

impl LocalLimiter {
    /// Counts `cost` units (characters, say) against `bucket`'s allowance of
    /// `per_minute`; a cost over the whole allowance is always refused.
    pub fn check_n(&self, bucket: &str, per_minute: u32, cost: u32) -> Decision {
        let rpm = per_minute.max(1);
        let cost = NonZeroU32::new(cost).unwrap_or(NonZeroU32::MIN);
        let limiter = self.limiter_for(bucket, rpm);
        // The limiter's own clock: making a new one reads the CPU's
        // features with CPUID, which a virtual machine traps, on every request.
        let clock = limiter.clock();
        let interval = emission_interval(rpm);
        let Ok(checked) = limiter.check_n(cost) else {
            return Decision {
                allowed: false,
                limit: rpm,
                remaining: 0,
                reset_after: interval * rpm,
                retry_after: Duration::from_secs(60),
            };
        };
        match checked {
            Ok(snapshot) => {
                let remaining = snapshot.remaining_burst_capacity();
                let used = rpm.saturating_sub(remaining);
                Decision {
                    allowed: true,
                    limit: rpm,
                    remaining,
                    reset_after: interval * used,
                    retry_after: Duration::ZERO,
                }
            }
            Err(not_until) => {
                let wait = not_until.wait_time_from(clock.now());
                Decision {
                    allowed: false,
                    limit: rpm,
                    remaining: 0,
                    reset_after: wait + interval * rpm.saturating_sub(cost.get()),
                    retry_after: wait,
                }
            }
        }
    }

    fn limiter_for(&self, bucket: &str, rpm: u32) -> Arc<DirectLimiter> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        match buckets.get(bucket) {
            Some((limit, limiter)) if *limit == rpm => limiter.clone(),
            _ => {
                let quota = Quota::per_minute(NonZeroU32::new(rpm).unwrap_or(NonZeroU32::MIN));
                let limiter = Arc::new(
                    governor::RateLimiter::direct(quota)
                        .with_middleware::<StateInformationMiddleware>(),
                );
                buckets.insert(bucket.to_owned(), (rpm, limiter.clone()));
                limiter
            }
        }
    }
}

/// GCRA in Redis. Times are microseconds on Redis's own clock, so replicas
/// with skewed clocks still agree. A request costs ARGV[3] units (1 by
/// default; characters for the character allowance). Returns
/// {allowed, tat_after_us, retry_us}.
const GCRA_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local cost = tonumber(ARGV[3] or '1')
local tolerance = interval * (burst - cost)
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
if tat - now > tolerance then
  return {0, tat - now, tat - tolerance - now}
end
local new_tat = tat + interval * cost
redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX', math.ceil((new_tat - now) / 1000) + 1000)
return {1, new_tat - now, 0}
";

struct RedisLimiter {
    url: String,
    prefix: String,
    script: redis::Script,
    connection: AsyncMutex<Option<ConnectionManager>>,
    last_attempt: Mutex<Option<Instant>>,
}

impl RedisLimiter {
    async fn check(&self, bucket: &str, rpm: u32, cost: u32) -> Result<Decision, String> {
        let mut connection = self.connection().await?;
        let interval = emission_interval(rpm);
        let mut invocation = self.script.key(format!("{}{}", self.prefix, bucket));
        invocation
            .arg(interval.as_micros() as u64)
            .arg(rpm)
            .arg(cost);
        let call = invocation.invoke_async::<(i64, i64, i64)>(&mut connection);
        let (allowed, tat_after, retry) = tokio::time::timeout(REDIS_TIMEOUT, call)
            .await
            .map_err(|_| "timed out".to_string())?
            .map_err(|e| e.to_string())?;
        let micros = |v: i64| Duration::from_micros(v.max(0) as u64);
        Ok(Decision::from_gcra(
            allowed == 1,
            rpm,
            micros(tat_after),
            micros(retry),
        ))
    }

    async fn connection(&self) -> Result<ConnectionManager, String> {
        let mut slot = self.connection.lock().await;
        if let Some(connection) = slot.as_ref() {
            return Ok(connection.clone());
        }
        {
            let mut last = self.last_attempt.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|at| at.elapsed() < REDIS_RECONNECT_EVERY) {
                return Err("not connected".into());
            }
            *last = Some(Instant::now());
        }
        let client = redis::Client::open(self.url.as_str()).map_err(|e| e.to_string())?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(REDIS_TIMEOUT)
            .set_response_timeout(REDIS_TIMEOUT)
            .set_number_of_retries(1);
        let connection = tokio::time::timeout(
            REDIS_TIMEOUT * 2,
            ConnectionManager::new_with_config(client, config),
        )
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| e.to_string())?;
        *slot = Some(connection.clone());
        Ok(connection)
    }
}

/// The service's limiter: Redis when configured and reachable, else local.
pub struct RateLimiter {
    local: LocalLimiter,
    redis: Option<RedisLimiter>,
    last_warning: Mutex<Option<Instant>>,
}

impl RateLimiter {
    pub fn local() -> RateLimiter {
        RateLimiter {
            local: LocalLimiter::default(),
            redis: None,
            last_warning: Mutex::new(None),
        }
    }

    /// Shared limits through Redis at `url`; keys are namespaced by `prefix`.
    /// Does not connect yet: a Redis that is down at start-up is no reason
    /// not to serve.
    pub fn with_redis(url: &str, prefix: &str) -> Result<RateLimiter, String> {
        redis::Client::open(url).map_err(|e| format!("redis_url is not a valid Redis URL: {e}"))?;
        Ok(RateLimiter {
            local: LocalLimiter::default(),
            redis: Some(RedisLimiter {
                url: url.to_owned(),
                prefix: prefix.to_owned(),
                script: redis::Script::new(GCRA_SCRIPT),
                connection: AsyncMutex::new(None),
                last_attempt: Mutex::new(None),
            }),
            last_warning: Mutex::new(None),
        })
    }

    /// Counts one request against `bucket`'s allowance of `rpm` per minute.
    pub async fn check(&self, bucket: &str, rpm: u32) -> Decision {
        self.check_n(bucket, rpm, 1).await
    }

    /// Counts one request against a key's allowance: its own lower limit
    /// first, if it has one, so that a request it refuses costs its account
    /// nothing; then its plan's bucket (the account's, for a customer's
    /// key). The answer is the bucket that binds: the one that refused,
    /// else the one with less left (the plan's on a tie), so that the
    /// headers show the account's numbers unless the key's own are tighter.
    /// (A request the account then refuses has spent a unit of the key's
    /// own bucket: at worst the key's own limit is met a little early.)
    pub async fn check_requests(&self, allowance: &Allowance) -> Decision {
        let own = match &allowance.own_requests {
            Some(bucket) => {
                let decision = self.check(&bucket.name, bucket.per_minute).await;
                if !decision.allowed {
                    return decision;
                }
                Some(decision)
            }
            None => None,
        };
        let plan = &allowance.requests;
        let decision = self.check(&plan.name, plan.per_minute).await;
        match own {
            Some(own) if decision.allowed && own.remaining < decision.remaining => own,
            _ => decision,
        }
    }

    /// Counts `cost` units against `bucket`'s allowance of `per_minute`
    /// (GCRA with a burst of one minute's allowance): characters per minute
    /// beside requests per minute. A cost over `per_minute` is refused.
    pub async fn check_n(&self, bucket: &str, per_minute: u32, cost: u32) -> Decision {
        let per_minute = per_minute.max(1);
        let cost = cost.max(1);
        if let Some(redis) = &self.redis {
            match redis.check(bucket, per_minute, cost).await {
                Ok(decision) => return decision,
                Err(reason) => self.warn_fallback(&reason),
            }
        }
        self.local.check_n(bucket, per_minute, cost)
    }

    fn warn_fallback(&self, reason: &str) {
        let mut last = self.last_warning.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
            *last = Some(Instant::now());
            tracing::warn!(
                reason,
                "Redis rate limiter unreachable; using the in-process limiter"
            );
        }
    }
}

/// Database look-ups in flight at once on behalf of blocked addresses.
const BLOCKED_LOOKUP_SLOTS: usize = 2;

/// How often [`FailedAuthLimiter::prune`] runs: the allowance refills
/// within a minute, so state older than that is a fresh start anyway.
pub const FAILED_AUTH_PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Failed authentications per client (an IPv4 address, or an IPv6 /64:
/// [`client_key`]). Past the allowance a client is blocked until its
/// allowance refills: its requests without a valid key get 429, and its
/// keys that are not cached are looked up only through a couple of shared
/// slots. The limiter spares the database; it never refuses a valid key
/// (behind a NAT or a proxy, one address is many clients, and guessing a
/// 256-bit secret is hopeless anyway). What it remembers is pruned on a
/// timer ([`FailedAuthLimiter::spawn_pruning`]), so clients that come and
/// go cannot grow it without end.
pub struct FailedAuthLimiter {
    limiter: DefaultKeyedRateLimiter<ClientKey>,
    blocked_until: Mutex<HashMap<ClientKey, Instant>>,
    lookup_slots: tokio::sync::Semaphore,
}

impl FailedAuthLimiter {
    pub fn new(per_minute: u32) -> FailedAuthLimiter {
        let quota = Quota::per_minute(NonZeroU32::new(per_minute).unwrap_or(NonZeroU32::MIN));
        FailedAuthLimiter {
            limiter: DefaultKeyedRateLimiter::keyed(quota),
            blocked_until: Mutex::new(HashMap::new()),
            lookup_slots: tokio::sync::Semaphore::new(BLOCKED_LOOKUP_SLOTS),
        }
    }

    /// Waits for one of the look-up slots shared by every blocked address.
    pub async fn lookup_slot(&self) -> tokio::sync::SemaphorePermit<'_> {
        self.lookup_slots
            .acquire()
            .await
            .expect("the semaphore is never closed")
    }

    /// `Some(wait)` while the address's client is blocked.
    pub fn blocked(&self, address: IpAddr) -> Option<Duration> {
        let client = client_key(address);
        let mut blocked = self.blocked_until.lock().unwrap_or_else(|e| e.into_inner());
        let until = *blocked.get(&client)?;
        let now = Instant::now();
        if until > now {
            Some(until - now)
        } else {
            blocked.remove(&client);
            None
        }
    }

    /// Records a failure; `Some(wait)` when this one exhausted the allowance.
    pub fn record_failure(&self, address: IpAddr) -> Option<Duration> {
        let client = client_key(address);
        let clock = self.limiter.clock();
        let not_until = self.limiter.check_key(&client).err()?;
        let wait = not_until.wait_time_from(clock.now());
        let mut blocked = self.blocked_until.lock().unwrap_or_else(|e| e.into_inner());
        blocked.insert(client, Instant::now() + wait);
        Some(wait)
    }

    /// Forgets the clients whose blocks have ended and whose allowance is
    /// whole again: for them, remembering and forgetting are the same.
    pub fn prune(&self) {
        let now = Instant::now();
        self.blocked_until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, until| *until > now);
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
    }

    /// Clients remembered (counted failures or blocks), for tests.
    pub fn remembered(&self) -> usize {
        let blocked = self
            .blocked_until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        blocked.max(self.limiter.len())
    }

    /// Prunes every `every` until `shutdown`.
    pub fn spawn_pruning(
        limiter: Arc<FailedAuthLimiter>,
        every: Duration,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = ticks.tick() => limiter.prune(),
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_free_key_gets_its_burst_then_one_every_six_seconds() {
        let limiter = LocalLimiter::default();
        let decisions: Vec<Decision> = (0..11).map(|_| limiter.check_n("k", 10, 1)).collect();
        assert!(decisions[..10].iter().all(|d| d.allowed));
        assert_eq!(decisions[0].remaining, 9);
        assert_eq!(decisions[9].remaining, 0);
        let refused = decisions[10];
        assert!(!refused.allowed);
        assert!(
            refused.retry_after > Duration::from_secs(5)
                && refused.retry_after <= Duration::from_secs(6)
        );
        assert!(
            refused.reset_after > Duration::from_secs(59)
                && refused.reset_after <= Duration::from_secs(60)
        );
    }

    #[test]
    fn weighted_costs_spend_the_allowance_by_their_size() {
        let limiter = LocalLimiter::default();
        let first = limiter.check_n("chars", 1000, 600);
        assert!(first.allowed);
        assert_eq!(first.remaining, 400);
        let refused = limiter.check_n("chars", 1000, 600);
        assert!(!refused.allowed, "600 more do not fit in the 400 left");
        assert!(refused.retry_after > Duration::from_secs(11));
        assert!(limiter.check_n("chars", 1000, 400).allowed);
        assert!(
            !limiter.check_n("other", 1000, 1001).allowed,
            "over the whole allowance"
        );
    }

    #[test]
    fn a_changed_limit_takes_effect() {
        let limiter = LocalLimiter::default();
        assert_eq!(limiter.check_n("k", 10, 1).remaining, 9);
        assert_eq!(limiter.check_n("k", 60, 1).remaining, 59);
    }

    #[test]
    fn gcra_decision_from_redis_state() {
        // After the first of 10: TAT is one interval (6 s) ahead.
        let d = Decision::from_gcra(true, 10, Duration::from_secs(6), Duration::ZERO);
        assert_eq!((d.remaining, d.reset_after), (9, Duration::from_secs(6)));
        let d = Decision::from_gcra(true, 10, Duration::from_secs(60), Duration::ZERO);
        assert_eq!(d.remaining, 0);
    }

    #[test]
    fn failed_auth_blocks_an_address_after_its_allowance() {
        let limiter = FailedAuthLimiter::new(3);
        let address: IpAddr = "192.0.2.1".parse().unwrap();
        assert!((0..3).all(|_| limiter.record_failure(address).is_none()));
        assert!(limiter.blocked(address).is_none());
        assert!(limiter.record_failure(address).is_some());
        assert!(limiter.blocked(address).is_some());
        assert!(limiter.blocked("192.0.2.2".parse().unwrap()).is_none());
    }

    #[test]
    fn failed_auth_counts_an_ipv6_host_by_its_64() {
        let limiter = FailedAuthLimiter::new(3);
        let in_64 = |n: u16| IpAddr::from([0x2001, 0xdb8, 1, 2, n, 0, 0, 1]);
        assert!((1..=3).all(|n| limiter.record_failure(in_64(n)).is_none()));
        assert!(
            limiter.record_failure(in_64(4)).is_some(),
            "a fourth address of the same /64 is the same client"
        );
        assert!(limiter.blocked(in_64(999)).is_some());
        let next_64 = IpAddr::from([0x2001, 0xdb8, 1, 3, 0, 0, 0, 1]);
        assert!(limiter.blocked(next_64).is_none());
        assert!(limiter.record_failure(next_64).is_none());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failed_auth_forgets_clients_on_a_timer() {
        // 600 a minute: a client's single failure is a fresh start again
        // after 100 ms. (A client that used its whole allowance is kept
        // until the allowance is whole again, a minute later.)
        let limiter = Arc::new(FailedAuthLimiter::new(600));
        for n in 0..5_000u32 {
            let address = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + n));
            limiter.record_failure(address);
        }
        assert_eq!(limiter.remembered(), 5_000);
        let shutdown = tokio_util::sync::CancellationToken::new();
        FailedAuthLimiter::spawn_pruning(
            limiter.clone(),
            Duration::from_millis(50),
            shutdown.clone(),
        );
        let mut waited = Duration::ZERO;
        while limiter.remembered() > 0 && waited < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            waited += Duration::from_millis(20);
        }
        shutdown.cancel();
        assert_eq!(
            limiter.remembered(),
            0,
            "nothing is kept once it is a fresh start"
        );
    }
}

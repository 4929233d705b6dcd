//! Key look-ups for the API, cached for less than a second.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::keys::{ApiKeyRecord, KeyId};
use crate::store::{Store, StoreError};

const MAX_CACHED_KEYS: usize = 100_000;

/// Key look-ups cached for a short time (at most one second, so that a
/// revocation reaches every replica within a second). Unknown ids are cached
/// too, so that guessing does not reach the database every time.
pub struct KeyCache {
    ttl: Duration,
    entries: Mutex<HashMap<KeyId, (Instant, Option<ApiKeyRecord>)>>,
}

impl KeyCache {
    pub fn new(ttl: Duration) -> KeyCache {
        KeyCache {
            ttl,
            entries: Mutex::new(HashMap::new()),
        }
    }

    pub async fn get(
        &self,
        store: &dyn Store,
        id: &KeyId,
    ) -> Result<Option<ApiKeyRecord>, StoreError> {
        if let Some(hit) = self.cached(id) {
            return Ok(hit);
        }
        let record = store.get_key(id).await?;
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= MAX_CACHED_KEYS {
            entries.clear();
        }
        entries.insert(id.clone(), (Instant::now(), record.clone()));
        Ok(record)
    }

    /// The cached look-up of `id`, if fresh: `Some(None)` is a cached "no such key".
    pub fn cached(&self, id: &KeyId) -> Option<Option<ApiKeyRecord>> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(id)
            .filter(|(at, _)| at.elapsed() < self.ttl)
            .map(|(_, record)| record.clone())
    }
}

//! A bounded cache of embeddings across requests, keyed by the window's
//! token ids. Chat traffic repeats itself and spam floods repeat exactly, so
//! a repeated sentence costs a look-up instead of an encoder pass. The
//! cache belongs to one loaded encoder, whose files are pinned by checksum
//! (see `files.rs`), so the key needs no model version: another model is
//! another cache.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lru::LruCache;

use crate::moderation::classifier::EmbeddingCacheStats;

pub struct EmbeddingCache {
    entries: Mutex<LruCache<Vec<u32>, Arc<[f32]>>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl EmbeddingCache {
    /// A cache of up to `capacity` embeddings; `None` for 0.
    pub fn new(capacity: usize) -> Option<EmbeddingCache> {
        Some(EmbeddingCache {
            entries: Mutex::new(LruCache::new(NonZeroUsize::new(capacity)?)),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    /// The cached embedding of each window, counting hits and misses.
    pub fn get_all(&self, windows: &[&[u32]]) -> Vec<Option<Arc<[f32]>>> {
        let found: Vec<Option<Arc<[f32]>>> = {
            let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            windows.iter().map(|w| entries.get(*w).cloned()).collect()
        };
        let hits = found.iter().filter(|f| f.is_some()).count() as u64;
        let misses = windows.len() as u64 - hits;
        self.hits.fetch_add(hits, Ordering::Relaxed);
        self.misses.fetch_add(misses, Ordering::Relaxed);
        metrics::counter!(crate::metrics::names::CACHE_HITS).increment(hits);
        metrics::counter!(crate::metrics::names::CACHE_MISSES).increment(misses);
        found
    }

    pub fn insert_all(&self, windows: &[&[u32]], embeddings: &[Arc<[f32]>]) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        for (w, e) in windows.iter().zip(embeddings) {
            entries.put(w.to_vec(), e.clone());
        }
    }

    pub fn stats(&self) -> EmbeddingCacheStats {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        EmbeddingCacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            entries: entries.len(),
            capacity: entries.cap().get(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_at_most_capacity_and_counts_hits_and_misses() {
        assert!(EmbeddingCache::new(0).is_none());
        let cache = EmbeddingCache::new(2).unwrap();
        let (a, b, c) = ([1u32, 2].as_slice(), [3u32].as_slice(), [4u32].as_slice());
        let e: Arc<[f32]> = Arc::from(vec![0.5f32]);
        assert_eq!(cache.get_all(&[a, b]), vec![None, None]);
        cache.insert_all(&[a, b], &[e.clone(), e.clone()]);
        assert!(cache.get_all(&[a])[0].is_some());
        cache.insert_all(&[c], std::slice::from_ref(&e));
        // b was the least recently used.
        let found = cache.get_all(&[a, b, c]);
        assert!(found[0].is_some() && found[1].is_none() && found[2].is_some());
        let stats = cache.stats();
        assert_eq!((stats.hits, stats.misses), (3, 3));
        assert_eq!((stats.entries, stats.capacity), (2, 2));
    }
}

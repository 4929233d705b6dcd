//! A bounded cache of embeddings across requests, keyed by the window's
//! token ids. Chat traffic repeats itself and spam floods repeat exactly, so
//! a repeated sentence costs a look-up instead of an encoder pass. The
//! cache belongs to one loaded encoder, whose files are pinned by checksum
//! (see `files.rs`), so the key needs no model version: another model is
//! another cache.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lru::LruCache;

use super::TextModelError;
use crate::moderation::classifier::EmbeddingCacheStats;

pub struct EmbeddingCache {
    /// The encoder whose embeddings these are, as the metrics label it.
    encoder: &'static str,
    entries: Mutex<LruCache<Vec<u32>, Arc<[f32]>>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl EmbeddingCache {
    /// A cache of up to `capacity` embeddings of `encoder` (the metrics'
    /// label); `None` for 0.
    pub fn new(capacity: usize, encoder: &'static str) -> Option<EmbeddingCache> {
        Some(EmbeddingCache {
            encoder,
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
        metrics::counter!(crate::metrics::names::CACHE_HITS, "encoder" => self.encoder)
            .increment(hits);
        metrics::counter!(crate::metrics::names::CACHE_MISSES, "encoder" => self.encoder)
            .increment(misses);
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

/// The embedding of every window, in order: identical windows are
/// computed once, windows in `cache` are looked up, and the rest are
/// computed together by `compute` (and cached).
pub fn embed_through(
    cache: Option<&EmbeddingCache>,
    windows: &[&[u32]],
    compute: impl FnOnce(&[&[u32]]) -> Result<Vec<Arc<[f32]>>, TextModelError>,
) -> Result<Vec<Arc<[f32]>>, TextModelError> {
    let mut first_of: HashMap<&[u32], usize> = HashMap::new();
    let mut distinct: Vec<&[u32]> = Vec::new();
    let slot: Vec<usize> = windows
        .iter()
        .map(|w| {
            *first_of.entry(w).or_insert_with(|| {
                distinct.push(w);
                distinct.len() - 1
            })
        })
        .collect();
    let mut found: Vec<Option<Arc<[f32]>>> = match cache {
        Some(cache) => cache.get_all(&distinct),
        None => vec![None; distinct.len()],
    };
    let missing: Vec<usize> = (0..distinct.len())
        .filter(|&d| found[d].is_none())
        .collect();
    if !missing.is_empty() {
        let todo: Vec<&[u32]> = missing.iter().map(|&d| distinct[d]).collect();
        let computed = compute(&todo)?;
        if let Some(cache) = cache {
            cache.insert_all(&todo, &computed);
        }
        for (d, e) in missing.into_iter().zip(computed) {
            found[d] = Some(e);
        }
    }
    Ok(slot
        .into_iter()
        .map(|d| found[d].clone().unwrap_or_else(|| Arc::from(Vec::new())))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_at_most_capacity_and_counts_hits_and_misses() {
        assert!(EmbeddingCache::new(0, "test").is_none());
        let cache = EmbeddingCache::new(2, "test").unwrap();
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

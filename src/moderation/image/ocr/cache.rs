//! Images already read, by their bytes' SHA-256, per account: an account
//! that sends one image eight times (issue #58, B) has it read once. Kept
//! per account so that how fast an answer comes tells nobody what another
//! account sent; bounded, the least recently used read going first.

use std::num::NonZeroUsize;
use std::sync::Mutex;

use lru::LruCache;
use sha2::{Digest, Sha256};

use super::ReadText;
use crate::moderation::fair::Tenant;

/// An image's bytes, hashed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ImageDigest([u8; 32]);

impl ImageDigest {
    pub fn of(bytes: &[u8]) -> ImageDigest {
        ImageDigest(Sha256::digest(bytes).into())
    }
}

/// One account's read of one image: its text, or `None` for no text.
type Reads = LruCache<(Tenant, ImageDigest), Option<ReadText>>;

/// Whole reads (the image's own limits, not cut short by its request's),
/// the image's text or `None` for no text.
pub struct ReadCache {
    entries: Option<Mutex<Reads>>,
}

impl ReadCache {
    /// At most `entries` reads; 0 keeps none.
    pub fn new(entries: usize) -> ReadCache {
        ReadCache {
            entries: NonZeroUsize::new(entries).map(|n| Mutex::new(LruCache::new(n))),
        }
    }

    /// `Some(read)` when `tenant` had this image read before.
    pub fn get(&self, tenant: &Tenant, image: ImageDigest) -> Option<Option<ReadText>> {
        let entries = self.entries.as_ref()?;
        let mut entries = entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.get(&(tenant.clone(), image)).cloned()
    }

    pub fn insert(&self, tenant: &Tenant, image: ImageDigest, read: Option<ReadText>) {
        if let Some(entries) = &self.entries {
            let mut entries = entries.lock().unwrap_or_else(|e| e.into_inner());
            entries.put((tenant.clone(), image), read);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Option<ReadText> {
        ReadText::new(vec![s.to_owned()])
    }

    #[test]
    fn a_read_is_found_again_by_its_account_only_and_the_oldest_goes_first() {
        let cache = ReadCache::new(2);
        let (a, b) = (Tenant::new("a"), Tenant::new("b"));
        let (one, two, three) = (
            ImageDigest::of(b"one"),
            ImageDigest::of(b"two"),
            ImageDigest::of(b"three"),
        );
        cache.insert(&a, one, text("hello"));
        assert_eq!(cache.get(&a, ImageDigest::of(b"one")), Some(text("hello")));
        assert_eq!(cache.get(&b, one), None, "another account's read");
        cache.insert(&a, two, None);
        assert_eq!(cache.get(&a, two), Some(None), "no text is remembered too");
        cache.insert(&a, three, text("x"));
        assert_eq!(cache.get(&a, one), None, "the least recently used went");
        assert!(ReadCache::new(0).get(&a, one).is_none());
    }
}

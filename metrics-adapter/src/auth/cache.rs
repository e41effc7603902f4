//! A bounded cache whose entries expire, for TokenReview and SubjectAccessReview
//! answers (k8s.io/apiserver caches both, allowed and denied alike, for 10 s).

use std::hash::Hash;
use std::num::NonZeroUsize;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use lru::LruCache;

/// At most `capacity` entries; the least recently used goes first when full, and an
/// entry past its time is never returned.
pub struct TtlCache<K: Hash + Eq, V: Clone> {
    entries: Mutex<LruCache<K, (V, Instant)>>,
}

impl<K: Hash + Eq, V: Clone> TtlCache<K, V> {
    pub fn new(capacity: NonZeroUsize) -> Self {
        Self {
            entries: Mutex::new(LruCache::new(capacity)),
        }
    }

    /// The value under `key` if it has not expired.
    pub fn get(&self, key: &K) -> Option<V> {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        match entries.get(key) {
            Some((value, expires)) if Instant::now() < *expires => Some(value.clone()),
            Some(_) => {
                entries.pop(key);
                None
            }
            None => None,
        }
    }

    /// Keeps `value` under `key` for `ttl`; a zero `ttl` keeps nothing.
    pub fn put(&self, key: K, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.put(key, (value, Instant::now() + ttl));
    }

    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(capacity: usize) -> TtlCache<u32, &'static str> {
        TtlCache::new(NonZeroUsize::new(capacity).expect("capacity > 0"))
    }

    #[test]
    fn entries_expire() {
        let c = cache(4);
        c.put(1, "a", Duration::from_secs(60));
        c.put(2, "b", Duration::from_nanos(1));
        c.put(3, "c", Duration::ZERO);
        assert_eq!(c.get(&1), Some("a"));
        // 1 ns has passed by the time we look; Instant is monotonic.
        std::thread::yield_now();
        assert_eq!(c.get(&2), None);
        assert_eq!(c.get(&3), None);
        assert_eq!(c.len(), 1, "the expired entry was dropped on read");
    }

    #[test]
    fn size_is_bounded_and_least_recently_used_goes_first() {
        let c = cache(2);
        c.put(1, "a", Duration::from_secs(60));
        c.put(2, "b", Duration::from_secs(60));
        assert_eq!(c.get(&1), Some("a"));
        c.put(3, "c", Duration::from_secs(60));
        assert_eq!(c.len(), 2);
        assert_eq!(c.get(&2), None, "2 was least recently used");
        assert_eq!(c.get(&1), Some("a"));
        assert_eq!(c.get(&3), Some("c"));
    }
}

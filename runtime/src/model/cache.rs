//! Triton's response cache (`docs/user_guide/response_cache.md`): one
//! store for the server (`--cache-config local,size=BYTES`), used by the
//! models whose configuration has `response_cache { enable: true }`. A
//! request to the same load of a model version (a version reloaded from a
//! changed file starts afresh) whose inputs (names, datatypes, shapes and
//! bytes) and requested outputs equal an earlier successful one's gets that
//! answer without queueing or running the model. Entries go least recently
//! used first when the store is full; an answer larger than the whole store
//! is not kept.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::tensor::Tensor;

use super::OutputRequest;

/// The flag that configures the store.
pub const FLAG: &str = "--cache-config";

/// The server's response cache.
pub struct ResponseCache {
    capacity: usize,
    store: Mutex<Store>,
}

struct Store {
    entries: lru::LruCache<Key, Vec<Tensor>>,
    used: usize,
}

/// A request's identity: two independent 64-bit hashes of everything the
/// answer depends on, so a collision needs both to collide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key(u64, u64);

impl ResponseCache {
    /// A store of at most `capacity` bytes of output data.
    pub fn new(capacity: usize) -> ResponseCache {
        let entries = lru::LruCache::unbounded();
        ResponseCache { capacity, store: Mutex::new(Store { entries, used: 0 }) }
    }

    /// The capacity in bytes `--cache-config` gives: Triton's
    /// `<cache>,<key>=<value>` flags, of which Plinth has the `local`
    /// cache and its `size`; `None` without flags (no cache).
    ///
    /// # Errors
    /// A message naming the flag for another cache, another key, or a size
    /// that is not a number of bytes.
    pub fn capacity_from_flags(flags: &[String]) -> Result<Option<usize>, String> {
        let mut size = None;
        for flag in flags {
            let (cache, setting) = flag.split_once(',').ok_or_else(|| {
                format!("{FLAG} expects <cache>,<key>=<value> (e.g. local,size=1048576), got '{flag}'")
            })?;
            if cache != "local" {
                return Err(format!("{FLAG}: unknown cache '{cache}'; Plinth has the 'local' cache"));
            }
            match setting.split_once('=') {
                Some(("size", bytes)) => {
                    size = Some(bytes.parse::<usize>().map_err(|_| {
                        format!("{FLAG}: local cache size must be a whole number of bytes, got '{bytes}'")
                    })?);
                }
                _ => return Err(format!("{FLAG}: unknown local cache setting '{setting}'; it has 'size=<bytes>'")),
            }
        }
        Ok(size)
    }

    /// A number for one load of a model version, never given twice: part
    /// of its keys, so that a version reloaded from a changed file never
    /// gets the answers of the file it replaced.
    pub fn new_owner() -> u64 {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed)
    }

    /// The key of a request to the load `owner` ([`ResponseCache::new_owner`])
    /// with `inputs` asking for `requested` (empty: all outputs).
    pub fn key(owner: u64, inputs: &[Tensor], requested: &[OutputRequest]) -> Key {
        let hash = |seed: u64| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            seed.hash(&mut h);
            owner.hash(&mut h);
            for t in inputs {
                (&t.name, t.datatype.name(), &t.shape, &t.data).hash(&mut h);
            }
            for r in requested {
                (&r.name, r.classification).hash(&mut h);
            }
            h.finish()
        };
        Key(hash(1), hash(2))
    }

    /// The answer kept for `key`, now the most recently used.
    pub fn get(&self, key: &Key) -> Option<Vec<Tensor>> {
        self.lock().entries.get(key).cloned()
    }

    /// Keeps `outputs` as the answer for `key`, evicting the least recently
    /// used answers until it fits; an answer larger than the store is not
    /// kept.
    pub fn insert(&self, key: Key, outputs: &[Tensor]) {
        let size = size_of(outputs);
        if size > self.capacity {
            return;
        }
        let mut store = self.lock();
        if let Some(old) = store.entries.pop(&key) {
            store.used -= size_of(&old);
        }
        while store.used + size > self.capacity {
            let Some((_, evicted)) = store.entries.pop_lru() else { break };
            store.used -= size_of(&evicted);
        }
        store.used += size;
        store.entries.put(key, outputs.to_vec());
    }

    /// Bytes held, and the number of answers.
    #[cfg(test)]
    fn usage(&self) -> (usize, usize) {
        let store = self.lock();
        (store.used, store.entries.len())
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Store> {
        self.store.lock()
    }
}

/// The bytes an answer takes in the store: its tensors' data and names.
fn size_of(outputs: &[Tensor]) -> usize {
    outputs.iter().map(|t| t.data.len() + t.name.len() + 8 * t.shape.len()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DataType;

    fn tensor(name: &str, data: Vec<u8>) -> Tensor {
        Tensor { name: name.into(), datatype: DataType::Uint8, shape: vec![data.len() as i64], data }
    }

    #[test]
    fn the_key_covers_the_load_inputs_and_requested_outputs() {
        let x = [tensor("x", vec![1, 2])];
        let (one, other) = (ResponseCache::new_owner(), ResponseCache::new_owner());
        let base = ResponseCache::key(one, &x, &[]);
        assert_eq!(base, ResponseCache::key(one, &[tensor("x", vec![1, 2])], &[]));
        assert_ne!(base, ResponseCache::key(other, &x, &[]));
        assert_ne!(base, ResponseCache::key(one, &[tensor("x", vec![1, 3])], &[]));
        let y = [OutputRequest { name: "y".into(), classification: None }];
        assert_ne!(base, ResponseCache::key(one, &x, &y));
    }

    #[test]
    fn the_least_recently_used_answers_go_first() {
        let one = |n: u8| vec![tensor("y", vec![n; 10])]; // 10 + 1 + 8 bytes
        let cache = ResponseCache::new(40);
        let key = |n: u8| ResponseCache::key(0, &[tensor("x", vec![n])], &[]);
        cache.insert(key(1), &one(1));
        cache.insert(key(2), &one(2));
        assert_eq!(cache.get(&key(1)), Some(one(1)), "1 is now the most recently used");
        cache.insert(key(3), &one(3));
        assert_eq!(cache.get(&key(2)), None, "2 was evicted");
        assert_eq!(cache.usage(), (38, 2));
        cache.insert(key(4), &[tensor("y", vec![0; 41])]);
        assert_eq!(cache.get(&key(4)), None, "larger than the store");
    }

    #[test]
    fn flags_are_triton_s_and_the_rest_is_refused_by_name() {
        let flags =
            |f: &[&str]| ResponseCache::capacity_from_flags(&f.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        assert_eq!(flags(&[]).unwrap(), None);
        assert_eq!(flags(&["local,size=1048576"]).unwrap(), Some(1 << 20));
        for (bad, message) in [
            (&["redis,host=x"][..], "unknown cache 'redis'"),
            (&["local,size=1MiB"], "must be a whole number of bytes"),
            (&["local,ttl=5"], "unknown local cache setting 'ttl=5'"),
            (&["local"], "expects <cache>,<key>=<value>"),
        ] {
            let e = flags(bad).err().unwrap();
            assert!(e.contains(message), "{e}");
        }
    }
}

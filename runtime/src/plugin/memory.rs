//! Each plugin instance's memory limit, and the bytes its linear memories
//! hold: what a plugin adds to its model's footprint (with its compiled
//! code), counted by the store that owns the memories, so another model's
//! traffic never shows in it.

use wasmtime::{ResourceLimiter, StoreLimits, StoreLimitsBuilder};

/// wasmtime's [`StoreLimits`] that also counts the linear memory it allows.
pub(super) struct CountingLimits {
    limits: StoreLimits,
    /// Bytes of all the instance's linear memories (initial sizes and every
    /// growth allowed since).
    bytes: usize,
    /// The growth allowed last, taken back if the memory then fails to grow.
    pending: usize,
}

impl CountingLimits {
    /// Linear memories of at most `memory_bytes` each.
    pub(super) fn new(memory_bytes: usize) -> CountingLimits {
        CountingLimits { limits: StoreLimitsBuilder::new().memory_size(memory_bytes).build(), bytes: 0, pending: 0 }
    }

    /// The bytes of the instance's linear memories: what it holds whatever
    /// of that its pages have touched so far.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl ResourceLimiter for CountingLimits {
    fn memory_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        let allowed = self.limits.memory_growing(current, desired, maximum)?;
        if allowed {
            // `current` is 0 when a memory is created with its initial size.
            self.pending = desired.saturating_sub(current);
            self.bytes += self.pending;
        }
        Ok(allowed)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.bytes -= std::mem::take(&mut self.pending);
        self.limits.memory_grow_failed(error)
    }

    fn table_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        self.limits.table_growing(current, desired, maximum)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.limits.table_grow_failed(error)
    }

    fn instances(&self) -> usize {
        self.limits.instances()
    }

    fn tables(&self) -> usize {
        self.limits.tables()
    }

    fn memories(&self) -> usize {
        self.limits.memories()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 64 << 10;

    #[test]
    fn linear_memory_is_counted_as_it_is_created_and_grows_within_the_limit() {
        let mut limits = CountingLimits::new(4 * PAGE);
        assert!(limits.memory_growing(0, 2 * PAGE, None).unwrap(), "created with two pages");
        assert!(limits.memory_growing(2 * PAGE, 3 * PAGE, None).unwrap());
        assert_eq!(limits.bytes(), 3 * PAGE);
        assert!(!limits.memory_growing(3 * PAGE, 5 * PAGE, None).unwrap(), "over the limit: refused");
        assert_eq!(limits.bytes(), 3 * PAGE, "a refused growth counts nothing");
        assert!(limits.memory_growing(3 * PAGE, 4 * PAGE, None).unwrap());
        limits.memory_grow_failed(wasmtime::Error::msg("no memory")).unwrap();
        assert_eq!(limits.bytes(), 3 * PAGE, "a growth that failed after all is taken back");
    }
}

//! Plinth's system shared memory family: the bytes of each registered
//! region that requests in flight hold, as copies of their inputs or as
//! places for their outputs.

use prometheus::{IntGauge, IntGaugeVec, Opts, Registry};

use super::register;

/// The shared memory family, recorded by the server's region registry.
#[derive(Clone)]
pub struct SharedMemoryMetrics {
    held: IntGaugeVec,
}

impl SharedMemoryMetrics {
    /// Creates the family and registers it with `registry`.
    pub(super) fn register(registry: &Registry) -> SharedMemoryMetrics {
        let held = IntGaugeVec::new(
            Opts::new(
                "plinth_shared_memory_held_bytes",
                "Bytes of each registered system shared memory region that requests in flight hold: their inputs' \
                 copies and their outputs' places",
            ),
            &["region"],
        )
        .expect("valid metric");
        SharedMemoryMetrics { held: register(registry, held) }
    }

    /// A family registered nowhere (a region registry without a server).
    pub fn detached() -> SharedMemoryMetrics {
        let held = IntGaugeVec::new(Opts::new("plinth_shared_memory_held_bytes", "unregistered"), &["region"])
            .expect("valid metric");
        SharedMemoryMetrics { held }
    }

    /// The series of region `name`, at zero until requests hold it.
    pub fn region(&self, name: &str) -> IntGauge {
        self.held.with_label_values(&[name])
    }

    /// Removes the series of region `name`: it was unregistered.
    pub fn forget(&self, name: &str) {
        let _ = self.held.remove_label_values(&[name]);
    }
}

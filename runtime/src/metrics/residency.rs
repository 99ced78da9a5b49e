//! Plinth's residency and load families: what is in memory under the
//! budget, and the loads that put it there.

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use super::register;

/// The residency families (`plinth_residency_*`, `plinth_model_*`,
/// `plinth_memory_*`), recorded by the lifecycle.
pub struct ResidencyMetrics {
    /// Inference requests whose model was resident.
    pub hits: IntCounter,
    /// Inference requests whose model had to be loaded first.
    pub misses: IntCounter,
    /// Model loads, by model.
    pub loads: IntCounterVec,
    /// Evictions to make room, by model.
    pub evictions: IntCounterVec,
    /// Accounted footprint of each resident model, in bytes.
    pub resident_bytes: IntGaugeVec,
    /// Device memory each resident model holds, by model and GPU index, in bytes.
    pub device_bytes: IntGaugeVec,
    /// `--model-memory-budget` in bytes (0: none).
    pub budget_bytes: IntGauge,
    /// Bytes held by all resident models.
    pub used_bytes: IntGauge,
    /// Loads running now.
    pub loads_in_progress: IntGauge,
}

impl ResidencyMetrics {
    /// Creates the families and registers them with `registry`.
    pub(super) fn register(registry: &Registry) -> ResidencyMetrics {
        let counter = |name: &str, help: &str| register(registry, IntCounter::new(name, help).expect("valid metric"));
        let gauge = |name: &str, help: &str| register(registry, IntGauge::new(name, help).expect("valid metric"));
        let per_model = |name: &str, help: &str| {
            register(registry, IntCounterVec::new(Opts::new(name, help), &["model"]).expect("valid metric"))
        };
        let resident_bytes = IntGaugeVec::new(
            Opts::new(
                "plinth_model_resident_bytes",
                "Host memory each resident model holds, in bytes, as its runtimes account for it",
            ),
            &["model"],
        )
        .expect("valid metric");
        let device_bytes = IntGaugeVec::new(
            Opts::new(
                "plinth_model_gpu_memory_bytes",
                "Device memory each resident model holds on each GPU, in bytes (NVML's used memory after its load \
                 less before)",
            ),
            &["model", "gpu"],
        )
        .expect("valid metric");
        ResidencyMetrics {
            device_bytes: register(registry, device_bytes),
            hits: counter("plinth_residency_hits_total", "Inference requests whose model was resident"),
            misses: counter("plinth_residency_misses_total", "Inference requests that loaded their model"),
            loads: per_model("plinth_model_loads_total", "Model loads, by model"),
            evictions: per_model("plinth_model_evictions_total", "Models evicted to stay within the budget"),
            resident_bytes: register(registry, resident_bytes),
            budget_bytes: gauge("plinth_memory_budget_bytes", "The --model-memory-budget, in bytes (0: none)"),
            used_bytes: gauge("plinth_memory_used_bytes", "Bytes held by all resident models"),
            loads_in_progress: gauge("plinth_model_loads_in_progress", "Model loads running now"),
        }
    }

    /// Removes the series of model `name`: its loads, evictions and
    /// footprint on the host and on `gpus`. For a model unloaded or
    /// forgotten (a ModelMesh model id, which comes back, if ever, as a new
    /// model); an evicted model keeps its loads and evictions.
    pub fn forget(&self, name: &str, gpus: impl IntoIterator<Item = u32>) {
        let _ = self.loads.remove_label_values(&[name]);
        let _ = self.evictions.remove_label_values(&[name]);
        self.forget_footprint(name, gpus);
    }

    /// Removes model `name`'s footprint series, on the host and on `gpus`:
    /// it left memory.
    pub fn forget_footprint(&self, name: &str, gpus: impl IntoIterator<Item = u32>) {
        let _ = self.resident_bytes.remove_label_values(&[name]);
        for gpu in gpus {
            let _ = self.device_bytes.remove_label_values(&[name, &gpu.to_string()]);
        }
    }
}

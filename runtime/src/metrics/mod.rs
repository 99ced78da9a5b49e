//! Prometheus metrics, served in the text exposition format at
//! `GET /metrics` on `--metrics-port` (as Triton serves its own). Inference
//! and system metrics use Triton's `nv_` family names and `model` /
//! `version` labels (Triton's `docs/user_guide/metrics.md`); Plinth's own
//! (latency histograms, plugins, residency) carry the `plinth_` prefix.
//!
//! Every family is registered here, in one group per concern, and every
//! value is recorded through the handles this module gives out
//! ([`ModelMetrics`], [`PluginMetrics`], [`GenerationMetrics`],
//! [`ResidencyMetrics`], [`RepositoryMetrics`]).
//!
//! A model version's series live as long as a handle of that version does:
//! once the last [`ModelMetrics`] or [`PluginMetrics`] of a version is
//! dropped (the version was unloaded, replaced or failed to load, and its
//! last request finished), its series leave `/metrics`, as Triton drops a
//! model's metrics when it unloads it. Without that, every version ever
//! loaded would keep its series, and each version rolled out would make
//! every scrape longer.

mod connections;
mod generation;
mod gpu;
mod model;
mod plugin;
mod repository;
mod residency;
mod rollout;
mod shared_memory;
mod system;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use prometheus::core::Collector;
use prometheus::{Encoder, GaugeVec, Opts, Registry, TextEncoder};

pub use connections::{ConnectionMetrics, Listener, OpenConnection, SlowClient};
pub use generation::{GenerationMetrics, SequenceOutcome};
pub use model::{
    BatchStats, Compute, FailureReason, GenerationCounts, InferenceStats, LiveCounts, ModelMetrics, ModelStatistics,
    SequenceEnd, Total,
};
pub use plugin::{PluginMetrics, PluginStage};
pub use repository::RepositoryMetrics;
pub use residency::ResidencyMetrics;
pub use rollout::RolloutMetrics;
pub use shared_memory::SharedMemoryMetrics;

/// The labels of Triton's per-model families.
const MODEL_LABELS: &[&str] = &["model", "version"];

/// Every metric Plinth exports.
pub struct Metrics {
    registry: Registry,
    /// Residency and load counts (`plinth_residency_*`, `plinth_model_*`,
    /// `plinth_memory_*`).
    pub residency: ResidencyMetrics,
    /// Fetches from object storage (`plinth_repository_*`).
    pub repository: Arc<RepositoryMetrics>,
    /// Connections per listener: open, refused at the limit, closed for
    /// slow clients, failed TLS handshakes.
    pub connections: ConnectionMetrics,
    /// The bytes of each system shared memory region requests hold.
    pub shared_memory: SharedMemoryMetrics,
    /// Rollouts (`plinth_rollout_*`).
    pub rollout: Arc<RolloutMetrics>,
    versions: Arc<Versions>,
    system: system::SystemMetrics,
    /// Triton's `nv_gpu_*` families; `None` without a GPU.
    gpu: Option<gpu::GpuMetrics>,
}

/// The per-version families, and how many handles hold each version's
/// series.
struct Versions {
    /// `nv_model_load_duration_secs`: how long each version's load took.
    load_seconds: GaugeVec,
    inference: model::Families,
    plugins: plugin::Families,
    generation: generation::Families,
    /// The handles ([`Lease`]s) of each (model, version) now.
    leases: Mutex<HashMap<[String; 2], usize>>,
}

impl Versions {
    /// A hold on the series of `model`'s version `version`.
    fn lease(self: &Arc<Versions>, model: &str, version: u64) -> Arc<Lease> {
        let labels = [model.to_owned(), version.to_string()];
        *self.leases().entry(labels.clone()).or_default() += 1;
        Arc::new(Lease { versions: self.clone(), labels })
    }

    fn leases(&self) -> parking_lot::MutexGuard<'_, HashMap<[String; 2], usize>> {
        self.leases.lock()
    }

    /// Lets go of one hold on `labels`; the last one removes their series
    /// (under the lock, so a new hold taken meanwhile creates them anew).
    fn release(&self, labels: &[String; 2]) {
        let mut leases = self.leases();
        let Some(count) = leases.get_mut(labels) else { return };
        *count -= 1;
        if *count > 0 {
            return;
        }
        leases.remove(labels);
        let labels = [labels[0].as_str(), labels[1].as_str()];
        let _ = self.load_seconds.remove_label_values(&labels);
        self.inference.remove(&labels);
        self.plugins.remove(&labels);
        self.generation.remove(&labels);
    }
}

/// One handle's hold on its version's series, shared by the handle's
/// clones; dropping the last hold of a version removes its series.
struct Lease {
    versions: Arc<Versions>,
    labels: [String; 2],
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.versions.release(&self.labels);
    }
}

/// Registers `collector` with `registry` and returns it.
fn register<C: Collector + Clone + 'static>(registry: &Registry, collector: C) -> C {
    registry.register(Box::new(collector.clone())).expect("unique, valid metric");
    collector
}

impl Metrics {
    /// Creates and registers every metric, without GPU families.
    pub fn new() -> Metrics {
        Metrics::with_gpus(Arc::new(crate::gpu::Gpus::none("not asked".to_owned())))
    }

    /// Creates and registers every metric, with Triton's `nv_gpu_*`
    /// families for `gpus` when it lists any device.
    pub fn with_gpus(gpus: Arc<crate::gpu::Gpus>) -> Metrics {
        let registry = Registry::new();
        let load_seconds = GaugeVec::new(
            Opts::new("nv_model_load_duration_secs", "How long the model version took to load, in seconds"),
            MODEL_LABELS,
        )
        .expect("valid metric");
        let versions = Versions {
            load_seconds: register(&registry, load_seconds),
            inference: model::Families::register(&registry),
            plugins: plugin::Families::register(&registry),
            generation: generation::Families::register(&registry),
            leases: Mutex::default(),
        };
        Metrics {
            residency: ResidencyMetrics::register(&registry),
            repository: Arc::new(RepositoryMetrics::register(&registry)),
            connections: ConnectionMetrics::register(&registry),
            shared_memory: SharedMemoryMetrics::register(&registry),
            rollout: Arc::new(RolloutMetrics::register(&registry)),
            versions: Arc::new(versions),
            system: system::SystemMetrics::register(&registry),
            gpu: gpu::GpuMetrics::register(&registry, gpus),
            registry,
        }
    }

    /// The inference metrics of version `version` of model `model`. The
    /// version's series stay until the last handle of it is dropped.
    pub fn for_model(&self, model: &str, version: u64) -> ModelMetrics {
        let lease = self.versions.lease(model, version);
        self.versions.inference.for_model(model, version, lease)
    }

    /// The plugin metrics of version `version` of model `model`. The
    /// version's series stay until the last handle of it is dropped.
    pub fn for_plugin(&self, model: &str, version: u64) -> PluginMetrics {
        let lease = self.versions.lease(model, version);
        self.versions.plugins.for_model(model, version, lease)
    }

    /// The generation metrics of version `version` of generative model
    /// `model`. The version's series stay until the last handle of it is
    /// dropped.
    pub fn for_generation(&self, model: &str, version: u64) -> GenerationMetrics {
        let lease = self.versions.lease(model, version);
        self.versions.generation.for_model(model, version, lease)
    }

    /// Records how long a version's load took (`nv_model_load_duration_secs`),
    /// while a handle of the version holds its series (a version without one
    /// has no series to add it to).
    pub fn load_duration(&self, model: &str, version: u64, seconds: f64) {
        let labels = [model.to_owned(), version.to_string()];
        let leases = self.versions.leases();
        if leases.contains_key(&labels) {
            self.versions.load_seconds.with_label_values(&[model, &labels[1]]).set(seconds);
        }
    }

    /// The text exposition of every metric, with the CPU, memory and GPU
    /// gauges read at this moment.
    pub fn render(&self) -> String {
        self.system.refresh();
        if let Some(gpu) = &self.gpu {
            gpu.refresh();
        }
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out).expect("text encoding cannot fail");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn metrics_render_in_the_text_format() {
        let m = Metrics::new();
        m.residency.loads.with_label_values(&["a"]).inc();
        m.residency.resident_bytes.with_label_values(&["a"]).set(42);
        let text = m.render();
        assert!(text.contains("plinth_model_loads_total{model=\"a\"} 1"), "{text}");
        assert!(text.contains("plinth_model_resident_bytes{model=\"a\"} 42"), "{text}");
        assert!(text.contains("# TYPE plinth_residency_hits_total counter"), "{text}");
        assert!(text.contains("nv_cpu_memory_total_bytes "), "{text}");

        let model = m.for_model("a", 2);
        model.executed(4, Compute { infer: Duration::from_micros(300), ..Compute::default() }, true);
        model.finished(Err(FailureReason::Rejected), Duration::from_micros(10));
        let text = m.render();
        assert!(text.contains("nv_inference_exec_count{model=\"a\",version=\"2\"} 1"), "{text}");
        assert!(text.contains("nv_inference_count{model=\"a\",version=\"2\"} 4"), "{text}");
        assert!(
            text.contains("nv_inference_request_failure{model=\"a\",reason=\"REJECTED\",version=\"2\"} 1"),
            "{text}"
        );
        let stats = serde_json::to_value(model.statistics()).unwrap();
        assert_eq!(stats["execution_count"], 1);
        assert_eq!(stats["inference_stats"]["fail"]["count"], 1);
        assert_eq!(stats["batch_stats"][0]["batch_size"], 4);
        assert_eq!(stats["batch_stats"][0]["compute_infer"]["ns"], 300_000);
    }

    #[test]
    fn a_versions_series_leave_with_its_last_handle() {
        let m = Metrics::new();
        let first = m.for_model("a", 1);
        let plugin = m.for_plugin("a", 1);
        let other = m.for_model("b", 1);
        let record = |model: &ModelMetrics, plugin: &PluginMetrics| {
            model.executed(1, Compute::default(), true);
            model.queued(Duration::from_micros(3));
            model.finished(Ok(()), Duration::from_micros(5));
            for reason in FailureReason::ALL {
                model.finished(Err(reason), Duration::from_micros(5));
            }
            for reason in SequenceEnd::ALL {
                model.sequence_ended(reason);
            }
            model.cache_hit(Duration::from_micros(1));
            model.cache_miss(Duration::from_micros(1));
            model.pending().inc();
            model.sequences_active().inc();
            for stage in PluginStage::ALL {
                plugin.called(stage, Duration::from_micros(2), false);
            }
            plugin.started();
            plugin.trapped();
        };
        record(&first, &plugin);
        m.load_duration("a", 1, 0.5);
        // A second load of the same version (a reload beside it) shares them.
        let second = m.for_model("a", 1);
        drop((first, plugin));
        assert!(m.render().contains("nv_inference_request_success{model=\"a\",version=\"1\"} 1"));
        drop(second.clone());
        assert!(m.render().contains("nv_model_load_duration_secs{model=\"a\",version=\"1\"} 0.5"));
        drop(second);
        let text = m.render();
        assert!(!text.contains("model=\"a\""), "every series of a/1 is gone: {text}");
        assert!(text.contains("nv_inference_request_success{model=\"b\",version=\"1\"} 0"), "{text}");
        // Loaded again, it starts from zero; a load duration without a
        // handle adds nothing.
        m.load_duration("a", 2, 0.5);
        let again = m.for_model("a", 1);
        let text = m.render();
        assert!(text.contains("nv_inference_request_success{model=\"a\",version=\"1\"} 0"), "{text}");
        assert!(!text.contains("version=\"2\""), "{text}");
        drop((again, other));
        assert!(!m.render().contains("model="));
    }

    #[test]
    fn plugin_calls_starts_and_traps_are_counted_per_stage() {
        let m = Metrics::new();
        let plugin = m.for_plugin("a", 1);
        plugin.called(PluginStage::Preprocess, Duration::from_micros(7), true);
        plugin.called(PluginStage::Postprocess, Duration::from_micros(5), false);
        plugin.started();
        plugin.trapped();
        let text = m.render();
        for series in [
            "plinth_plugin_duration_us{model=\"a\",stage=\"preprocess\",version=\"1\"} 7",
            "plinth_plugin_failures_total{model=\"a\",stage=\"postprocess\",version=\"1\"} 1",
            "plinth_plugin_instance_starts_total{model=\"a\",version=\"1\"} 1",
            "plinth_plugin_traps_total{model=\"a\",version=\"1\"} 1",
        ] {
            assert!(text.contains(series), "{series} in {text}");
        }
        assert!(!text.contains("plinth_plugin_failures_total{model=\"a\",stage=\"preprocess\""), "{text}");
    }
}

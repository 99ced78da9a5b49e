//! Prometheus metrics, served in the text exposition format at
//! `GET /metrics` on `--metrics-port` (as Triton serves its own). Inference
//! and system metrics use Triton's `nv_` family names and `model` /
//! `version` labels (Triton's `docs/user_guide/metrics.md`); Plinth's own
//! (latency histograms, plugins, residency) carry the `plinth_` prefix.
//!
//! Every family is registered here, in one group per concern, and every
//! value is recorded through the handles this module gives out
//! ([`ModelMetrics`], [`PluginMetrics`], [`ResidencyMetrics`]).

mod model;
mod plugin;
mod residency;
mod system;

use prometheus::core::Collector;
use prometheus::{Encoder, GaugeVec, Opts, Registry, TextEncoder};

pub use model::{
    BatchStats, Compute, FailureReason, InferenceStats, ModelMetrics, ModelStatistics, SequenceEnd, Total,
};
pub use plugin::{PluginMetrics, PluginStage};
pub use residency::ResidencyMetrics;

/// The labels of Triton's per-model families.
const MODEL_LABELS: &[&str] = &["model", "version"];

/// Every metric Plinth exports.
pub struct Metrics {
    registry: Registry,
    /// Residency and load counts (`plinth_residency_*`, `plinth_model_*`,
    /// `plinth_memory_*`).
    pub residency: ResidencyMetrics,
    /// `nv_model_load_duration_secs`: how long each version's load took.
    load_seconds: GaugeVec,
    inference: model::Families,
    plugins: plugin::Families,
    system: system::SystemMetrics,
}

/// Registers `collector` with `registry` and returns it.
fn register<C: Collector + Clone + 'static>(registry: &Registry, collector: C) -> C {
    registry.register(Box::new(collector.clone())).expect("unique, valid metric");
    collector
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let load_seconds = GaugeVec::new(
            Opts::new("nv_model_load_duration_secs", "How long the model version took to load, in seconds"),
            MODEL_LABELS,
        )
        .expect("valid metric");
        Metrics {
            residency: ResidencyMetrics::register(&registry),
            load_seconds: register(&registry, load_seconds),
            inference: model::Families::register(&registry),
            plugins: plugin::Families::register(&registry),
            system: system::SystemMetrics::register(&registry),
            registry,
        }
    }

    /// The inference metrics of version `version` of model `model`.
    pub fn for_model(&self, model: &str, version: u64) -> ModelMetrics {
        self.inference.for_model(model, version)
    }

    /// The plugin metrics of version `version` of model `model`.
    pub fn for_plugin(&self, model: &str, version: u64) -> PluginMetrics {
        self.plugins.for_model(model, version)
    }

    /// Records how long a version's load took (`nv_model_load_duration_secs`).
    pub fn load_duration(&self, model: &str, version: u64, seconds: f64) {
        self.load_seconds.with_label_values(&[model, &version.to_string()]).set(seconds);
    }

    /// The text exposition of every metric, with the CPU and memory gauges
    /// read at this moment.
    pub fn render(&self) -> String {
        self.system.refresh();
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

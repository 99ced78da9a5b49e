//! Prometheus metrics, served in the text exposition format at
//! `GET /metrics` on `--metrics-port` (as Triton serves its own). Inference
//! and system metrics use Triton's `nv_` family names and `model` /
//! `version` labels; Plinth's own (latency histograms, plugins, residency)
//! carry the `plinth_` prefix.

mod model;
mod system;

use prometheus::core::Collector;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

pub use model::{BatchStats, Compute, InferenceStats, ModelMetrics, ModelStatistics, Total};

/// The labels of Triton's per-model families.
const MODEL_LABELS: &[&str] = &["model", "version"];

/// Every metric Plinth exports.
pub struct Metrics {
    registry: Registry,
    /// Inference requests whose model was resident.
    pub residency_hits: IntCounter,
    /// Inference requests whose model had to be loaded first.
    pub residency_misses: IntCounter,
    /// Model loads, by model.
    pub loads: IntCounterVec,
    /// Evictions to make room, by model.
    pub evictions: IntCounterVec,
    /// Measured footprint of each resident model, in bytes.
    pub resident_bytes: IntGaugeVec,
    /// `--model-memory-budget` in bytes (0: none).
    pub budget_bytes: IntGauge,
    /// Bytes held by all resident models.
    pub used_bytes: IntGauge,
    /// Loads running now.
    pub loads_in_progress: IntGauge,
    /// `nv_model_load_duration_secs`: how long each version's load took.
    load_seconds: GaugeVec,
    inference: Families,
    system: system::SystemMetrics,
}

/// The per-model families, shared by every [`ModelMetrics`].
struct Families {
    success: IntCounterVec,
    failure: IntCounterVec,
    inference_count: IntCounterVec,
    exec_count: IntCounterVec,
    pending: IntGaugeVec,
    request_us: IntCounterVec,
    queue_us: IntCounterVec,
    compute_input_us: IntCounterVec,
    compute_infer_us: IntCounterVec,
    compute_output_us: IntCounterVec,
    request_seconds: HistogramVec,
    plugin_us: IntCounterVec,
    plugin_failures: IntCounterVec,
    plugin_starts: IntCounterVec,
    plugin_traps: IntCounterVec,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let register = |c: Box<dyn Collector>| registry.register(c).expect("unique, valid metric");
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid metric");
            register(Box::new(c.clone()));
            c
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("valid metric");
            register(Box::new(g.clone()));
            g
        };
        let counters = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            register(Box::new(c.clone()));
            c
        };
        let gauges = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
            register(Box::new(g.clone()));
            g
        };
        let per_model = |name: &str, help: &str| counters(name, help, MODEL_LABELS);
        let plugin_labels = &["model", "version", "stage"];
        let request_seconds = HistogramVec::new(
            HistogramOpts::new(
                "plinth_inference_request_duration_seconds",
                "Inference request latency from arrival at the model to the answer",
            )
            .buckets(prometheus::exponential_buckets(0.0001, 2.0, 18).expect("valid buckets")),
            MODEL_LABELS,
        )
        .expect("valid metric");
        register(Box::new(request_seconds.clone()));
        let load_seconds = GaugeVec::new(
            Opts::new("nv_model_load_duration_secs", "How long the model version took to load, in seconds"),
            MODEL_LABELS,
        )
        .expect("valid metric");
        register(Box::new(load_seconds.clone()));
        let inference = Families {
            success: per_model("nv_inference_request_success", "Successful inference requests"),
            failure: counters(
                "nv_inference_request_failure",
                "Failed inference requests, by reason",
                &["model", "version", "reason"],
            ),
            inference_count: per_model("nv_inference_count", "Inferences performed (each row of a batch counts)"),
            exec_count: per_model("nv_inference_exec_count", "Model executions (batches) performed"),
            pending: gauges(
                "nv_inference_pending_request_count",
                "Inference requests queued, not yet running",
                MODEL_LABELS,
            ),
            request_us: per_model("nv_inference_request_duration_us", "Cumulative inference request time, in µs"),
            queue_us: per_model("nv_inference_queue_duration_us", "Cumulative time requests spent queued, in µs"),
            compute_input_us: per_model(
                "nv_inference_compute_input_duration_us",
                "Cumulative time gathering batch inputs, in µs (once per execution)",
            ),
            compute_infer_us: per_model(
                "nv_inference_compute_infer_duration_us",
                "Cumulative model execution time, in µs (once per execution)",
            ),
            compute_output_us: per_model(
                "nv_inference_compute_output_duration_us",
                "Cumulative time splitting batch outputs, in µs (once per execution)",
            ),
            request_seconds,
            plugin_us: counters(
                "plinth_plugin_duration_us",
                "Cumulative plugin call time, in µs, by stage (preprocess, postprocess)",
                plugin_labels,
            ),
            plugin_failures: counters(
                "plinth_plugin_failures_total",
                "Plugin calls that trapped, ran out of time or memory, or returned an internal error",
                plugin_labels,
            ),
            plugin_starts: counters(
                "plinth_plugin_instance_starts_total",
                "Plugin instances started: the first, and each one replacing an instance that trapped",
                &["model", "version"],
            ),
            plugin_traps: counters(
                "plinth_plugin_traps_total",
                "Plugin calls that trapped (panicked, ran out of time or memory); the instance is replaced",
                &["model", "version"],
            ),
        };
        let resident_bytes = gauges(
            "plinth_model_resident_bytes",
            "Measured memory footprint of each resident model, in bytes",
            &["model"],
        );
        Metrics {
            residency_hits: counter("plinth_residency_hits_total", "Inference requests whose model was resident"),
            residency_misses: counter("plinth_residency_misses_total", "Inference requests that loaded their model"),
            loads: counters("plinth_model_loads_total", "Model loads, by model", &["model"]),
            evictions: counters("plinth_model_evictions_total", "Models evicted to stay within the budget", &["model"]),
            resident_bytes,
            budget_bytes: gauge("plinth_memory_budget_bytes", "The --model-memory-budget, in bytes (0: none)"),
            used_bytes: gauge("plinth_memory_used_bytes", "Bytes held by all resident models"),
            loads_in_progress: gauge("plinth_model_loads_in_progress", "Model loads running now"),
            load_seconds,
            system: system::SystemMetrics::register(&registry),
            inference,
            registry,
        }
    }

    /// The inference metrics of version `version` of model `model`.
    pub fn for_model(&self, model: &str, version: u64) -> ModelMetrics {
        let version = version.to_string();
        let labels = [model, version.as_str()];
        let f = &self.inference;
        ModelMetrics::new(
            [model.to_owned(), version.clone()],
            model::Series {
                success: f.success.with_label_values(&labels),
                failure: f.failure.clone(),
                inference_count: f.inference_count.with_label_values(&labels),
                exec_count: f.exec_count.with_label_values(&labels),
                pending: f.pending.with_label_values(&labels),
                request_us: f.request_us.with_label_values(&labels),
                queue_us: f.queue_us.with_label_values(&labels),
                compute_input_us: f.compute_input_us.with_label_values(&labels),
                compute_infer_us: f.compute_infer_us.with_label_values(&labels),
                compute_output_us: f.compute_output_us.with_label_values(&labels),
                request_seconds: f.request_seconds.with_label_values(&labels),
                plugin_us: f.plugin_us.clone(),
                plugin_failures: f.plugin_failures.clone(),
            },
        )
    }

    /// The plugin counters of a model version.
    pub fn plugin_counters(&self, model: &str, version: u64) -> crate::plugin::PluginCounters {
        let labels = [model, &version.to_string()];
        crate::plugin::PluginCounters {
            starts: self.inference.plugin_starts.with_label_values(&labels),
            traps: self.inference.plugin_traps.with_label_values(&labels),
        }
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
        m.loads.with_label_values(&["a"]).inc();
        m.resident_bytes.with_label_values(&["a"]).set(42);
        let text = m.render();
        assert!(text.contains("plinth_model_loads_total{model=\"a\"} 1"), "{text}");
        assert!(text.contains("plinth_model_resident_bytes{model=\"a\"} 42"), "{text}");
        assert!(text.contains("# TYPE plinth_residency_hits_total counter"), "{text}");
        assert!(text.contains("nv_cpu_memory_total_bytes "), "{text}");

        let model = m.for_model("a", 2);
        model.executed(4, Compute { infer: Duration::from_micros(300), ..Compute::default() }, true);
        model.finished(Err("REJECTED"), Duration::from_micros(10));
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
}

//! Prometheus metrics, served in the text exposition format at
//! `GET /metrics` on `--metrics-port` (as Triton serves its own). Inference
//! metrics use Triton's `nv_` family names and `model` / `version` labels;
//! Plinth's own (residency) carry the `plinth_` prefix.

use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder};

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
    inference: InferenceFamilies,
}

/// Triton's per-model inference families.
struct InferenceFamilies {
    success: IntCounterVec,
    failure: IntCounterVec,
    inference_count: IntCounterVec,
    exec_count: IntCounterVec,
    pending: IntGaugeVec,
    queue_us: IntCounterVec,
    compute_infer_us: IntCounterVec,
}

/// The inference metrics of one model version, as Triton names them.
#[derive(Clone)]
pub struct ModelMetrics {
    failure: IntCounterVec,
    labels: [String; 2],
    /// `nv_inference_request_success`: requests answered.
    pub success: IntCounter,
    /// `nv_inference_count`: inferences run, counting each row of a batch.
    pub inference_count: IntCounter,
    /// `nv_inference_exec_count`: backend executions (batches).
    pub exec_count: IntCounter,
    /// `nv_inference_pending_request_count`: requests queued, not yet running.
    pub pending_requests: IntGauge,
    /// `nv_inference_queue_duration_us`: total time requests spent queued.
    pub queue_duration_us: IntCounter,
    /// `nv_inference_compute_infer_duration_us`: total backend time, in
    /// microseconds, counted once per batch.
    pub compute_infer_duration_us: IntCounter,
}

impl ModelMetrics {
    /// Counts a failed request in `nv_inference_request_failure` with
    /// Triton's `reason`: `REJECTED`, `CANCELED`, `BACKEND` or `OTHER`.
    pub fn failure(&self, reason: &str) {
        self.failure.with_label_values(&[self.labels[0].as_str(), self.labels[1].as_str(), reason]).inc();
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid metric");
            registry.register(Box::new(c.clone())).expect("unique metric");
            c
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("valid metric");
            registry.register(Box::new(g.clone())).expect("unique metric");
            g
        };
        let counter_vec = |name: &str, help: &str| {
            let c = IntCounterVec::new(Opts::new(name, help), &["model"]).expect("valid metric");
            registry.register(Box::new(c.clone())).expect("unique metric");
            c
        };
        let resident_bytes = IntGaugeVec::new(
            Opts::new("plinth_model_resident_bytes", "Measured memory footprint of each resident model, in bytes"),
            &["model"],
        )
        .expect("valid metric");
        registry.register(Box::new(resident_bytes.clone())).expect("unique metric");
        let per_model = |name: &str, help: &str| {
            let c = IntCounterVec::new(Opts::new(name, help), MODEL_LABELS).expect("valid metric");
            registry.register(Box::new(c.clone())).expect("unique metric");
            c
        };
        let failure = IntCounterVec::new(
            Opts::new("nv_inference_request_failure", "Failed inference requests, by reason"),
            &["model", "version", "reason"],
        )
        .expect("valid metric");
        registry.register(Box::new(failure.clone())).expect("unique metric");
        let pending = IntGaugeVec::new(
            Opts::new("nv_inference_pending_request_count", "Inference requests queued, not yet running"),
            MODEL_LABELS,
        )
        .expect("valid metric");
        registry.register(Box::new(pending.clone())).expect("unique metric");
        let inference = InferenceFamilies {
            success: per_model("nv_inference_request_success", "Successful inference requests"),
            failure,
            inference_count: per_model("nv_inference_count", "Inferences performed (each row of a batch counts)"),
            exec_count: per_model("nv_inference_exec_count", "Model executions (batches) performed"),
            pending,
            queue_us: per_model("nv_inference_queue_duration_us", "Cumulative time requests spent queued, in µs"),
            compute_infer_us: per_model(
                "nv_inference_compute_infer_duration_us",
                "Cumulative model execution time, in µs (once per batch)",
            ),
        };
        Metrics {
            inference,
            residency_hits: counter("plinth_residency_hits_total", "Inference requests whose model was resident"),
            residency_misses: counter("plinth_residency_misses_total", "Inference requests that loaded their model"),
            loads: counter_vec("plinth_model_loads_total", "Model loads, by model"),
            evictions: counter_vec("plinth_model_evictions_total", "Models evicted to stay within the budget"),
            resident_bytes,
            budget_bytes: gauge("plinth_memory_budget_bytes", "The --model-memory-budget, in bytes (0: none)"),
            used_bytes: gauge("plinth_memory_used_bytes", "Bytes held by all resident models"),
            loads_in_progress: gauge("plinth_model_loads_in_progress", "Model loads running now"),
            registry,
        }
    }

    /// The inference metrics of version `version` of model `model`.
    pub fn for_model(&self, model: &str, version: u64) -> ModelMetrics {
        let version = version.to_string();
        let labels = [model, version.as_str()];
        let f = &self.inference;
        ModelMetrics {
            failure: f.failure.clone(),
            success: f.success.with_label_values(&labels),
            inference_count: f.inference_count.with_label_values(&labels),
            exec_count: f.exec_count.with_label_values(&labels),
            pending_requests: f.pending.with_label_values(&labels),
            queue_duration_us: f.queue_us.with_label_values(&labels),
            compute_infer_duration_us: f.compute_infer_us.with_label_values(&labels),
            labels: [model.to_owned(), version],
        }
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
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

        let model = m.for_model("a", 2);
        model.exec_count.inc();
        model.failure("REJECTED");
        let text = m.render();
        assert!(text.contains("nv_inference_exec_count{model=\"a\",version=\"2\"} 1"), "{text}");
        assert!(
            text.contains("nv_inference_request_failure{model=\"a\",reason=\"REJECTED\",version=\"2\"} 1"),
            "{text}"
        );
    }
}

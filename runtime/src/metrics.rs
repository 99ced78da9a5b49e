//! Prometheus metrics, served in the text exposition format at
//! `GET /metrics` on `--metrics-port` (as Triton serves its own). Plinth's
//! residency metrics carry the `plinth_` prefix.

use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder};

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
        Metrics {
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
    }
}

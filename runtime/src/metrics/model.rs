//! The inference metrics of one model version, recorded once and kept in
//! two forms: Prometheus families with Triton's names, and Triton's
//! statistics extension (`GET /v2/models/{m}/stats`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge};
use serde::Serialize;

/// How long one execution took in each of Triton's compute phases.
#[derive(Clone, Copy, Debug, Default)]
pub struct Compute {
    /// Gathering the batch's inputs (`compute_input`).
    pub input: Duration,
    /// The backend run (`compute_infer`).
    pub infer: Duration,
    /// Splitting the outputs per request (`compute_output`).
    pub output: Duration,
}

/// The Prometheus series of one model version.
#[derive(Clone)]
pub(super) struct Series {
    pub success: IntCounter,
    pub failure: IntCounterVec,
    pub inference_count: IntCounter,
    pub exec_count: IntCounter,
    pub pending: IntGauge,
    pub request_us: IntCounter,
    pub queue_us: IntCounter,
    pub compute_input_us: IntCounter,
    pub compute_infer_us: IntCounter,
    pub compute_output_us: IntCounter,
    pub request_seconds: Histogram,
    pub plugin_us: IntCounterVec,
    pub plugin_failures: IntCounterVec,
}

/// The inference metrics of one model version.
#[derive(Clone)]
pub struct ModelMetrics {
    pub(super) labels: [String; 2],
    pub(super) series: Series,
    statistics: Arc<Mutex<Statistics>>,
}

impl ModelMetrics {
    pub(super) fn new(labels: [String; 2], series: Series) -> ModelMetrics {
        ModelMetrics { labels, series, statistics: Arc::default() }
    }

    /// `nv_inference_pending_request_count`: requests queued, not yet running.
    pub fn pending(&self) -> &IntGauge {
        &self.series.pending
    }

    /// A request left the queue after `wait`.
    pub fn queued(&self, wait: Duration) {
        self.series.queue_us.inc_by(micros(wait));
        self.stats().queue.add(wait);
    }

    /// One execution of `rows` rows; inferences count only when it succeeded.
    pub fn executed(&self, rows: usize, compute: Compute, ok: bool) {
        let s = &self.series;
        s.exec_count.inc();
        s.compute_input_us.inc_by(micros(compute.input));
        s.compute_infer_us.inc_by(micros(compute.infer));
        s.compute_output_us.inc_by(micros(compute.output));
        let mut stats = self.stats();
        stats.execution_count += 1;
        stats.compute_input.add(compute.input);
        stats.compute_infer.add(compute.infer);
        stats.compute_output.add(compute.output);
        let batch = stats.batches.entry(rows).or_default();
        batch.compute_input.add(compute.input);
        batch.compute_infer.add(compute.infer);
        batch.compute_output.add(compute.output);
        if ok {
            s.inference_count.inc_by(rows as u64);
            stats.inference_count += rows as u64;
            stats.last_inference = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        }
    }

    /// A request ended after `took`: answered (`Ok`), or failed with one of
    /// Triton's reasons: `REJECTED`, `CANCELED`, `BACKEND` or `OTHER`.
    pub fn finished(&self, outcome: Result<(), &str>, took: Duration) {
        let s = &self.series;
        s.request_us.inc_by(micros(took));
        s.request_seconds.observe(took.as_secs_f64());
        match outcome {
            Ok(()) => {
                s.success.inc();
                self.stats().success.add(took);
            }
            Err(reason) => {
                s.failure.with_label_values(&[&self.labels[0], &self.labels[1], reason]).inc();
                self.stats().fail.add(took);
            }
        }
    }

    /// A plugin call (`stage` is `preprocess` or `postprocess`) took `took`.
    pub fn plugin(&self, stage: &str, took: Duration, ok: bool) {
        self.series.plugin_us.with_label_values(&[&self.labels[0], &self.labels[1], stage]).inc_by(micros(took));
        if !ok {
            self.series.plugin_failures.with_label_values(&[&self.labels[0], &self.labels[1], stage]).inc();
        }
    }

    /// This version's entry of Triton's statistics extension (`model_stats`).
    pub fn statistics(&self) -> ModelStatistics {
        let stats = self.stats();
        let zero = Total::default();
        ModelStatistics {
            name: self.labels[0].clone(),
            version: self.labels[1].clone(),
            last_inference: stats.last_inference,
            inference_count: stats.inference_count,
            execution_count: stats.execution_count,
            inference_stats: InferenceStats {
                success: stats.success,
                fail: stats.fail,
                queue: stats.queue,
                compute_input: stats.compute_input,
                compute_infer: stats.compute_infer,
                compute_output: stats.compute_output,
                cache_hit: zero,
                cache_miss: zero,
            },
            batch_stats: stats
                .batches
                .iter()
                .map(|(&batch_size, b)| BatchStats {
                    batch_size: batch_size as u64,
                    compute_input: b.compute_input,
                    compute_infer: b.compute_infer,
                    compute_output: b.compute_output,
                })
                .collect(),
        }
    }

    fn stats(&self) -> std::sync::MutexGuard<'_, Statistics> {
        self.statistics.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn micros(d: Duration) -> u64 {
    d.as_micros() as u64
}

/// A count and the nanoseconds it took, as the statistics extension reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Total {
    /// How many times.
    pub count: u64,
    /// Their cumulative duration, in nanoseconds.
    pub ns: u64,
}

impl Total {
    fn add(&mut self, d: Duration) {
        self.count += 1;
        self.ns += d.as_nanos() as u64;
    }
}

/// One version's statistics, in the shape and names of Triton's statistics
/// extension (`ModelStatistics`).
#[derive(Clone, Debug, Serialize)]
pub struct ModelStatistics {
    /// The model's name.
    pub name: String,
    /// The version.
    pub version: String,
    /// Milliseconds since the epoch of the last successful execution.
    pub last_inference: u64,
    /// Rows inferred successfully.
    pub inference_count: u64,
    /// Executions (batches).
    pub execution_count: u64,
    /// Request and phase totals.
    pub inference_stats: InferenceStats,
    /// Compute phase totals per executed batch size.
    pub batch_stats: Vec<BatchStats>,
}

/// Request outcomes and the time spent in each phase.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct InferenceStats {
    /// Answered requests, with their durations.
    pub success: Total,
    /// Failed requests, with their durations.
    pub fail: Total,
    /// Time spent queued.
    pub queue: Total,
    /// Gathering batch inputs.
    pub compute_input: Total,
    /// Backend runs.
    pub compute_infer: Total,
    /// Splitting batch outputs.
    pub compute_output: Total,
    /// Always zero: Plinth has no response cache.
    pub cache_hit: Total,
    /// Always zero: Plinth has no response cache.
    pub cache_miss: Total,
}

/// The compute phases of the executions of one batch size.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct BatchStats {
    /// Rows in the batch.
    pub batch_size: u64,
    /// Gathering the inputs.
    pub compute_input: Total,
    /// Backend runs.
    pub compute_infer: Total,
    /// Splitting the outputs.
    pub compute_output: Total,
}

#[derive(Clone, Default)]
struct BatchTotals {
    compute_input: Total,
    compute_infer: Total,
    compute_output: Total,
}

#[derive(Default)]
struct Statistics {
    /// Milliseconds since the epoch of the last successful execution.
    last_inference: u64,
    inference_count: u64,
    execution_count: u64,
    success: Total,
    fail: Total,
    queue: Total,
    compute_input: Total,
    compute_infer: Total,
    compute_output: Total,
    batches: BTreeMap<usize, BatchTotals>,
}

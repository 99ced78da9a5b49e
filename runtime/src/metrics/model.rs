//! The inference metrics of one model version, recorded once and kept in
//! two forms: Prometheus families with Triton's names, and Triton's
//! statistics extension (`GET /v2/models/{m}/stats`,
//! `docs/protocol/extension_statistics.md`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};
use serde::Serialize;

use super::{Lease, MODEL_LABELS, register};
use crate::error::Error;

/// Why a request failed, as Triton labels `nv_inference_request_failure`
/// (`reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureReason {
    /// Refused by the scheduler: a full queue or an expired queue timeout.
    Rejected,
    /// The client went away before its answer.
    Canceled,
    /// The backend (or a remote server) failed.
    Backend,
    /// Anything else: a malformed request, an unknown output.
    Other,
}

impl FailureReason {
    /// Every reason.
    pub const ALL: [FailureReason; 4] =
        [FailureReason::Rejected, FailureReason::Canceled, FailureReason::Backend, FailureReason::Other];

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            FailureReason::Rejected => "REJECTED",
            FailureReason::Canceled => "CANCELED",
            FailureReason::Backend => "BACKEND",
            FailureReason::Other => "OTHER",
        }
    }
}

impl From<&Error> for FailureReason {
    /// The reason a request failing with `e` is counted under.
    fn from(e: &Error) -> FailureReason {
        match e {
            Error::Overloaded(_) => FailureReason::Rejected,
            Error::Internal(_) | Error::BadGateway(_) | Error::Unavailable(_) => FailureReason::Backend,
            Error::InvalidArgument(_) | Error::NotFound(_) | Error::AlreadyExists(_) | Error::Unsupported(_) => {
                FailureReason::Other
            }
        }
    }
}

/// The per-model inference families, shared by every [`ModelMetrics`].
pub(super) struct Families {
    success: IntCounterVec,
    failure: IntCounterVec,
    inference_count: IntCounterVec,
    exec_count: IntCounterVec,
    pending: IntGaugeVec,
    request_us: IntCounterVec,
    queue_us: IntCounterVec,
    rate_limiter_us: IntCounterVec,
    compute_input_us: IntCounterVec,
    compute_infer_us: IntCounterVec,
    compute_output_us: IntCounterVec,
    request_seconds: HistogramVec,
    cache_hits: IntCounterVec,
    cache_misses: IntCounterVec,
    cache_hit_us: IntCounterVec,
    cache_miss_us: IntCounterVec,
    sequences_active: IntGaugeVec,
    sequences_ended: IntCounterVec,
}

/// Why a sequence of a sequence model ended, as
/// `plinth_sequence_ended_total` labels it (`reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SequenceEnd {
    /// Its request with `sequence_end` ran.
    End,
    /// No request came for `max_sequence_idle_microseconds`.
    Idle,
    /// A request of it was cancelled, or its gRPC stream closed before its
    /// end.
    Cancelled,
}

impl SequenceEnd {
    /// Every reason.
    pub const ALL: [SequenceEnd; 3] = [SequenceEnd::End, SequenceEnd::Idle, SequenceEnd::Cancelled];

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            SequenceEnd::End => "END",
            SequenceEnd::Idle => "IDLE",
            SequenceEnd::Cancelled => "CANCELLED",
        }
    }
}

impl Families {
    pub(super) fn register(registry: &Registry) -> Families {
        let per_model = |name: &str, help: &str| {
            register(registry, IntCounterVec::new(Opts::new(name, help), MODEL_LABELS).expect("valid metric"))
        };
        let request_seconds = HistogramVec::new(
            HistogramOpts::new(
                "plinth_inference_request_duration_seconds",
                "Inference request latency from arrival at the model to the answer",
            )
            .buckets(prometheus::exponential_buckets(0.0001, 2.0, 18).expect("valid buckets")),
            MODEL_LABELS,
        )
        .expect("valid metric");
        let failure = IntCounterVec::new(
            Opts::new("nv_inference_request_failure", "Failed inference requests, by reason"),
            &["model", "version", "reason"],
        )
        .expect("valid metric");
        let pending = IntGaugeVec::new(
            Opts::new("nv_inference_pending_request_count", "Inference requests queued, not yet running"),
            MODEL_LABELS,
        )
        .expect("valid metric");
        let sequences_active = IntGaugeVec::new(
            Opts::new(
                "plinth_sequence_active",
                "Sequences of a sequence model that are open: holding a batch slot or waiting for one",
            ),
            MODEL_LABELS,
        )
        .expect("valid metric");
        let sequences_ended = IntCounterVec::new(
            Opts::new("plinth_sequence_ended_total", "Sequences ended, by reason (END, IDLE, CANCELLED)"),
            &["model", "version", "reason"],
        )
        .expect("valid metric");
        Families {
            success: per_model("nv_inference_request_success", "Successful inference requests"),
            failure: register(registry, failure),
            inference_count: per_model("nv_inference_count", "Inferences performed (each row of a batch counts)"),
            exec_count: per_model("nv_inference_exec_count", "Model executions (batches) performed"),
            pending: register(registry, pending),
            request_us: per_model("nv_inference_request_duration_us", "Cumulative inference request time, in µs"),
            queue_us: per_model("nv_inference_queue_duration_us", "Cumulative time requests spent queued, in µs"),
            rate_limiter_us: per_model(
                "plinth_inference_rate_limiter_wait_us",
                "Cumulative time requests waited for their instance's turn and resources in the rate limiter, in µs \
                 (also counted in nv_inference_queue_duration_us, as Triton counts it)",
            ),
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
            request_seconds: register(registry, request_seconds),
            cache_hits: per_model("nv_cache_num_hits_per_model", "Response cache hits"),
            cache_misses: per_model("nv_cache_num_misses_per_model", "Response cache misses"),
            cache_hit_us: per_model(
                "nv_cache_hit_duration_per_model",
                "Cumulative time looking up the answers found in the response cache, in µs",
            ),
            cache_miss_us: per_model(
                "nv_cache_miss_duration_per_model",
                "Cumulative time looking up and inserting the answers not in the response cache, in µs",
            ),
            sequences_active: register(registry, sequences_active),
            sequences_ended: register(registry, sequences_ended),
        }
    }

    pub(super) fn for_model(&self, model: &str, version: u64, lease: Arc<Lease>) -> ModelMetrics {
        let version = version.to_string();
        let labels = [model, version.as_str()];
        let series = Series {
            success: self.success.with_label_values(&labels),
            failure: self.failure.clone(),
            inference_count: self.inference_count.with_label_values(&labels),
            exec_count: self.exec_count.with_label_values(&labels),
            pending: self.pending.with_label_values(&labels),
            request_us: self.request_us.with_label_values(&labels),
            queue_us: self.queue_us.with_label_values(&labels),
            rate_limiter_us: self.rate_limiter_us.with_label_values(&labels),
            compute_input_us: self.compute_input_us.with_label_values(&labels),
            compute_infer_us: self.compute_infer_us.with_label_values(&labels),
            compute_output_us: self.compute_output_us.with_label_values(&labels),
            request_seconds: self.request_seconds.with_label_values(&labels),
            cache_hits: self.cache_hits.with_label_values(&labels),
            cache_misses: self.cache_misses.with_label_values(&labels),
            cache_hit_us: self.cache_hit_us.with_label_values(&labels),
            cache_miss_us: self.cache_miss_us.with_label_values(&labels),
            sequences_active: self.sequences_active.with_label_values(&labels),
            sequences_ended: self.sequences_ended.clone(),
        };
        ModelMetrics { labels: [model.to_owned(), version], series, statistics: Arc::default(), _lease: lease }
    }

    /// Removes every series of the version `labels` names (model, version).
    pub(super) fn remove(&self, labels: &[&str; 2]) {
        for family in [
            &self.success,
            &self.inference_count,
            &self.exec_count,
            &self.request_us,
            &self.queue_us,
            &self.rate_limiter_us,
            &self.compute_input_us,
            &self.compute_infer_us,
            &self.compute_output_us,
            &self.cache_hits,
            &self.cache_misses,
            &self.cache_hit_us,
            &self.cache_miss_us,
        ] {
            let _ = family.remove_label_values(labels);
        }
        let _ = self.pending.remove_label_values(labels);
        let _ = self.sequences_active.remove_label_values(labels);
        let _ = self.request_seconds.remove_label_values(labels);
        for reason in FailureReason::ALL {
            let _ = self.failure.remove_label_values(&[labels[0], labels[1], reason.label()]);
        }
        for reason in SequenceEnd::ALL {
            let _ = self.sequences_ended.remove_label_values(&[labels[0], labels[1], reason.label()]);
        }
    }
}

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
struct Series {
    success: IntCounter,
    failure: IntCounterVec,
    inference_count: IntCounter,
    exec_count: IntCounter,
    pending: IntGauge,
    request_us: IntCounter,
    queue_us: IntCounter,
    rate_limiter_us: IntCounter,
    compute_input_us: IntCounter,
    compute_infer_us: IntCounter,
    compute_output_us: IntCounter,
    request_seconds: Histogram,
    cache_hits: IntCounter,
    cache_misses: IntCounter,
    cache_hit_us: IntCounter,
    cache_miss_us: IntCounter,
    sequences_active: IntGauge,
    sequences_ended: IntCounterVec,
}

/// The inference metrics of one model version.
#[derive(Clone)]
pub struct ModelMetrics {
    labels: [String; 2],
    series: Series,
    statistics: Arc<Mutex<Statistics>>,
    /// Keeps the version's series while this handle (or a clone) exists.
    _lease: Arc<Lease>,
}

impl ModelMetrics {
    /// `nv_inference_pending_request_count`: requests queued, not yet running.
    pub fn pending(&self) -> &IntGauge {
        &self.series.pending
    }

    /// A request left the queue after `wait`.
    pub fn queued(&self, wait: Duration) {
        self.series.queue_us.inc_by(micros(wait));
        self.stats().queue.add(wait);
    }

    /// The `requests` of one execution waited `wait` each for their
    /// instance's turn in the rate limiter (that wait is also in their
    /// queue time).
    pub fn rate_limited(&self, wait: Duration, requests: usize) {
        self.series.rate_limiter_us.inc_by(micros(wait) * requests as u64);
    }

    /// One execution of `rows` rows; inferences count only when it succeeded.
    pub fn executed(&self, rows: usize, compute: Compute, ok: bool) {
        self.executed_padded(rows, rows, compute, ok);
    }

    /// One execution of a batch of `batch_size` rows of which `rows` are
    /// requests and the rest padding (a sequence model's idle slots): the
    /// batch statistics count the batch size, the inference count only the
    /// requests, as Triton counts them.
    pub fn executed_padded(&self, batch_size: usize, rows: usize, compute: Compute, ok: bool) {
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
        let batch = stats.batches.entry(batch_size).or_default();
        batch.compute_input.add(compute.input);
        batch.compute_infer.add(compute.infer);
        batch.compute_output.add(compute.output);
        if ok {
            s.inference_count.inc_by(rows as u64);
            stats.inference_count += rows as u64;
            stats.last_inference = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        }
    }

    /// `plinth_sequence_active`: the open sequences of a sequence model.
    pub fn sequences_active(&self) -> &IntGauge {
        &self.series.sequences_active
    }

    /// A sequence ended for `reason`.
    pub fn sequence_ended(&self, reason: SequenceEnd) {
        self.series.sequences_ended.with_label_values(&[&self.labels[0], &self.labels[1], reason.label()]).inc();
    }

    /// A request answered from the response cache, its lookup taking `took`.
    pub fn cache_hit(&self, took: Duration) {
        self.series.cache_hits.inc();
        self.series.cache_hit_us.inc_by(micros(took));
        self.stats().cache_hit.add(took);
    }

    /// A request not in the response cache, its lookup and the insertion of
    /// its answer taking `took`.
    pub fn cache_miss(&self, took: Duration) {
        self.series.cache_misses.inc();
        self.series.cache_miss_us.inc_by(micros(took));
        self.stats().cache_miss.add(took);
    }

    /// A request ended after `took`: answered (`Ok`), or failed for one of
    /// Triton's reasons.
    pub fn finished(&self, outcome: Result<(), FailureReason>, took: Duration) {
        let s = &self.series;
        s.request_us.inc_by(micros(took));
        s.request_seconds.observe(took.as_secs_f64());
        match outcome {
            Ok(()) => {
                s.success.inc();
                self.stats().success.add(took);
            }
            Err(reason) => {
                s.failure.with_label_values(&[&self.labels[0], &self.labels[1], reason.label()]).inc();
                self.stats().fail.add(took);
            }
        }
    }

    /// This version's counters as they stand now (for rates over a window,
    /// read twice).
    pub fn live(&self) -> LiveCounts {
        use prometheus::core::Metric;
        let s = &self.series;
        let histogram = s.request_seconds.metric();
        let buckets = histogram.get_histogram().get_bucket();
        LiveCounts {
            success: s.success.get(),
            failure: FailureReason::ALL
                .iter()
                .map(|r| s.failure.with_label_values(&[&self.labels[0], &self.labels[1], r.label()]).get())
                .sum(),
            pending: s.pending.get(),
            latency: buckets.iter().map(|b| (b.upper_bound(), b.cumulative_count())).collect(),
            generation: None,
        }
    }

    /// This version's entry of Triton's statistics extension (`model_stats`).
    pub fn statistics(&self) -> ModelStatistics {
        let stats = self.stats();
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
                cache_hit: stats.cache_hit,
                cache_miss: stats.cache_miss,
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

    fn stats(&self) -> parking_lot::MutexGuard<'_, Statistics> {
        self.statistics.lock()
    }
}

fn micros(d: Duration) -> u64 {
    d.as_micros() as u64
}

/// One model version's counters at one moment: what the status page turns
/// into a request rate, a failure rate and latency percentiles over a
/// window, and the queue depth now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveCounts {
    /// Requests answered (`nv_inference_request_success`).
    pub success: u64,
    /// Requests failed, every reason (`nv_inference_request_failure`).
    pub failure: u64,
    /// Requests queued, not yet running (`nv_inference_pending_request_count`).
    pub pending: i64,
    /// `plinth_inference_request_duration_seconds`: each bucket's upper
    /// bound in seconds and its cumulative count, in order.
    pub latency: Vec<(f64, u64)>,
    /// A generative model's figures; `None` for any other.
    pub generation: Option<GenerationCounts>,
}

/// A generative model's figures the status page shows.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GenerationCounts {
    /// Tokens generated (`plinth_generation_completion_tokens_total`).
    pub tokens: u64,
    /// Sequences in KV cache slots now.
    pub running: i64,
    /// Sequences queued for a slot now.
    pub waiting: i64,
    /// Share of the KV cache filled now (0 to 1).
    pub cache_usage: f64,
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
    /// The version number, as text (as the statistics extension writes it).
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
    /// Answers from the response cache, with their lookup times.
    pub cache_hit: Total,
    /// Requests not in the response cache (of models that use it), with
    /// their lookup and insertion times.
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
    cache_hit: Total,
    cache_miss: Total,
    batches: BTreeMap<usize, BatchTotals>,
}

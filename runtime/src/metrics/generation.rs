//! Plinth's generation families, per generative model version: time to
//! first token and per output token, prompt and completion tokens,
//! sequences running and waiting, the KV cache's use, and how sequences
//! ended. The figures are vLLM's (`docs/design/metrics.md` in
//! vllm-project/vllm), under Plinth's prefix and OpenAI's token names.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

use super::{GenerationCounts, Lease, MODEL_LABELS, register};

/// How a sequence ended: the `finish_reason` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SequenceOutcome {
    /// A stop token or string (OpenAI's `stop`).
    Stop,
    /// `max_tokens` or the context reached (OpenAI's `length`).
    Length,
    /// Its client went away before the end.
    Abort,
    /// A decoder step or the plugin failed.
    Error,
}

impl SequenceOutcome {
    /// Every outcome.
    pub const ALL: [SequenceOutcome; 4] =
        [SequenceOutcome::Stop, SequenceOutcome::Length, SequenceOutcome::Abort, SequenceOutcome::Error];

    fn label(self) -> &'static str {
        match self {
            SequenceOutcome::Stop => "stop",
            SequenceOutcome::Length => "length",
            SequenceOutcome::Abort => "abort",
            SequenceOutcome::Error => "error",
        }
    }
}

/// The generation families, shared by every [`GenerationMetrics`].
pub(super) struct Families {
    first_token: HistogramVec,
    per_token: HistogramVec,
    prompt_tokens: IntCounterVec,
    completion_tokens: IntCounterVec,
    running: IntGaugeVec,
    waiting: IntGaugeVec,
    cache_usage: GaugeVec,
    ended: IntCounterVec,
}

impl Families {
    pub(super) fn register(registry: &Registry) -> Families {
        let histogram = |name: &str, help: &str, buckets: &[f64]| {
            let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
            register(registry, HistogramVec::new(opts, MODEL_LABELS).expect("valid metric"))
        };
        let counter = |name: &str, help: &str, labels: &[&str]| {
            register(registry, IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"))
        };
        let gauge = |name: &str, help: &str| {
            register(registry, IntGaugeVec::new(Opts::new(name, help), MODEL_LABELS).expect("valid metric"))
        };
        Families {
            first_token: histogram(
                "plinth_generation_time_to_first_token_seconds",
                "Time from a sequence's arrival at the decode loop to its first token, in seconds",
                &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0],
            ),
            per_token: histogram(
                "plinth_generation_time_per_output_token_seconds",
                "Time between a sequence's consecutive output tokens, in seconds",
                &[0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5],
            ),
            prompt_tokens: counter(
                "plinth_generation_prompt_tokens_total",
                "Prompt tokens read into the KV cache",
                MODEL_LABELS,
            ),
            completion_tokens: counter(
                "plinth_generation_completion_tokens_total",
                "Tokens generated (stop tokens not counted)",
                MODEL_LABELS,
            ),
            running: gauge("plinth_generation_requests_running", "Sequences holding a KV cache slot now"),
            waiting: gauge("plinth_generation_requests_waiting", "Sequences queued for a KV cache slot now"),
            cache_usage: register(
                registry,
                GaugeVec::new(
                    Opts::new(
                        "plinth_generation_kv_cache_usage_ratio",
                        "Share of the KV cache's token positions that running sequences fill now (0 to 1)",
                    ),
                    MODEL_LABELS,
                )
                .expect("valid metric"),
            ),
            ended: counter(
                "plinth_generation_requests_total",
                "Sequences ended, by finish_reason: stop, length, abort (the client left), error",
                &["model", "version", "finish_reason"],
            ),
        }
    }

    pub(super) fn for_model(&self, model: &str, version: u64, lease: Arc<Lease>) -> GenerationMetrics {
        let version = version.to_string();
        let labels = [model, version.as_str()];
        GenerationMetrics {
            first_token: self.first_token.with_label_values(&labels),
            per_token: self.per_token.with_label_values(&labels),
            prompt_tokens: self.prompt_tokens.with_label_values(&labels),
            completion_tokens: self.completion_tokens.with_label_values(&labels),
            running: self.running.with_label_values(&labels),
            waiting: self.waiting.with_label_values(&labels),
            cache_usage: self.cache_usage.with_label_values(&labels),
            ended: SequenceOutcome::ALL.map(|o| self.ended.with_label_values(&[model, &version, o.label()])),
            _lease: lease,
        }
    }

    /// Removes every series of the version `labels` names (model, version).
    pub(super) fn remove(&self, labels: &[&str; 2]) {
        let _ = self.first_token.remove_label_values(labels);
        let _ = self.per_token.remove_label_values(labels);
        let _ = self.prompt_tokens.remove_label_values(labels);
        let _ = self.completion_tokens.remove_label_values(labels);
        let _ = self.running.remove_label_values(labels);
        let _ = self.waiting.remove_label_values(labels);
        let _ = self.cache_usage.remove_label_values(labels);
        for outcome in SequenceOutcome::ALL {
            let _ = self.ended.remove_label_values(&[labels[0], labels[1], outcome.label()]);
        }
    }
}

/// The generation metrics of one model version; its decode loop records
/// them.
#[derive(Clone)]
pub struct GenerationMetrics {
    first_token: Histogram,
    per_token: Histogram,
    prompt_tokens: IntCounter,
    completion_tokens: IntCounter,
    running: IntGauge,
    waiting: IntGauge,
    cache_usage: Gauge,
    /// By [`SequenceOutcome`], in the order of `ALL`.
    ended: [IntCounter; 4],
    /// Keeps the version's series while this handle (or a clone) exists.
    _lease: Arc<Lease>,
}

impl GenerationMetrics {
    /// A sequence's prompt of `tokens` is in the cache and its first token
    /// came `waited` after it arrived.
    pub fn first_token(&self, tokens: usize, waited: Duration) {
        self.prompt_tokens.inc_by(tokens as u64);
        self.first_token.observe(waited.as_secs_f64());
    }

    /// A token was generated, `since` after the sequence's one before
    /// (`None` for its first).
    pub fn token(&self, since: Option<Duration>) {
        self.completion_tokens.inc();
        if let Some(since) = since {
            self.per_token.observe(since.as_secs_f64());
        }
    }

    /// A sequence ended so.
    pub fn ended(&self, outcome: SequenceOutcome) {
        let at = SequenceOutcome::ALL.iter().position(|o| *o == outcome).expect("every outcome is listed");
        self.ended[at].inc();
    }

    /// Sequences in slots now, and the share of the cache's positions
    /// they fill.
    pub fn set_running(&self, running: usize, cache_usage: f64) {
        self.running.set(running as i64);
        self.cache_usage.set(cache_usage);
    }

    /// Sequences queued for a slot now.
    pub fn set_waiting(&self, waiting: usize) {
        self.waiting.set(waiting as i64);
    }

    /// The figures as they stand now (for a rate, read twice).
    pub fn counts(&self) -> GenerationCounts {
        GenerationCounts {
            tokens: self.completion_tokens.get(),
            running: self.running.get(),
            waiting: self.waiting.get(),
            cache_usage: self.cache_usage.get(),
        }
    }
}

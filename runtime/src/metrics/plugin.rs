//! Plinth's plugin families: time and failures of each plugin call by stage,
//! instances started, calls that trapped and failures in a row, per model
//! version.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use super::{Lease, MODEL_LABELS, register};

/// The plugin export a call ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PluginStage {
    /// `preprocess`: a raw request into input tensors.
    Preprocess,
    /// `postprocess`: output tensors into the answer.
    Postprocess,
    /// `generation.encode` (and `generation.info`): a generative model's
    /// prompt into token ids.
    Encode,
    /// `generation.decode`: generated token ids into text.
    Decode,
}

impl PluginStage {
    /// Every stage.
    pub const ALL: [PluginStage; 4] =
        [PluginStage::Preprocess, PluginStage::Postprocess, PluginStage::Encode, PluginStage::Decode];

    /// The `stage` label (and the export's name).
    pub fn label(self) -> &'static str {
        match self {
            PluginStage::Preprocess => "preprocess",
            PluginStage::Postprocess => "postprocess",
            PluginStage::Encode => "encode",
            PluginStage::Decode => "decode",
        }
    }
}

/// The plugin families, shared by every [`PluginMetrics`].
pub(super) struct Families {
    duration_us: IntCounterVec,
    failures: IntCounterVec,
    starts: IntCounterVec,
    traps: IntCounterVec,
    consecutive_failures: IntGaugeVec,
}

impl Families {
    pub(super) fn register(registry: &Registry) -> Families {
        let stage_labels = &["model", "version", "stage"];
        let counters = |name: &str, help: &str, labels: &[&str]| {
            register(registry, IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"))
        };
        Families {
            duration_us: counters(
                "plinth_plugin_duration_us",
                "Cumulative plugin call time, in µs, by stage (preprocess, postprocess)",
                stage_labels,
            ),
            failures: counters(
                "plinth_plugin_failures_total",
                "Plugin calls that trapped, ran out of time or memory, or returned an internal error",
                stage_labels,
            ),
            starts: counters(
                "plinth_plugin_instance_starts_total",
                "Plugin instances started: the first, and each one replacing an instance that trapped",
                MODEL_LABELS,
            ),
            traps: counters(
                "plinth_plugin_traps_total",
                "Plugin calls that trapped (panicked, ran out of time or memory); the instance is replaced",
                MODEL_LABELS,
            ),
            consecutive_failures: register(
                registry,
                IntGaugeVec::new(
                    Opts::new(
                        "plinth_plugin_consecutive_failures",
                        "Plugin calls that failed in a row, either stage, since its last call that did not fail \
                         (0 after any success; alert when it stays above 0)",
                    ),
                    MODEL_LABELS,
                )
                .expect("valid metric"),
            ),
        }
    }

    pub(super) fn for_model(&self, model: &str, version: u64, lease: Arc<Lease>) -> PluginMetrics {
        let version = version.to_string();
        let labels = [model, version.as_str()];
        PluginMetrics {
            labels: [model.to_owned(), version.clone()],
            duration_us: self.duration_us.clone(),
            failures: self.failures.clone(),
            starts: self.starts.with_label_values(&labels),
            traps: self.traps.with_label_values(&labels),
            consecutive_failures: self.consecutive_failures.with_label_values(&labels),
            _lease: lease,
        }
    }

    /// Removes every series of the version `labels` names (model, version).
    pub(super) fn remove(&self, labels: &[&str; 2]) {
        let _ = self.starts.remove_label_values(labels);
        let _ = self.traps.remove_label_values(labels);
        let _ = self.consecutive_failures.remove_label_values(labels);
        for stage in PluginStage::ALL {
            let staged = [labels[0], labels[1], stage.label()];
            let _ = self.duration_us.remove_label_values(&staged);
            let _ = self.failures.remove_label_values(&staged);
        }
    }
}

/// The plugin metrics of one model version; the plugin host records them.
#[derive(Clone)]
pub struct PluginMetrics {
    labels: [String; 2],
    duration_us: IntCounterVec,
    failures: IntCounterVec,
    starts: IntCounter,
    traps: IntCounter,
    consecutive_failures: IntGauge,
    /// Keeps the version's series while this handle (or a clone) exists.
    _lease: Arc<Lease>,
}

impl PluginMetrics {
    /// A call of `stage` took `took` (waiting for a free instance included);
    /// `ok` is false when the plugin failed, trapped or exceeded a limit (a
    /// request the plugin refused as bad input is not its failure).
    pub fn called(&self, stage: PluginStage, took: Duration, ok: bool) {
        let labels = [self.labels[0].as_str(), self.labels[1].as_str(), stage.label()];
        self.duration_us.with_label_values(&labels).inc_by(took.as_micros() as u64);
        if ok {
            self.consecutive_failures.set(0);
        } else {
            self.failures.with_label_values(&labels).inc();
            self.consecutive_failures.inc();
        }
    }

    /// An instance started: the first, or one replacing an instance that
    /// trapped (`plinth_plugin_instance_starts_total`).
    pub fn started(&self) {
        self.starts.inc();
    }

    /// A call trapped, and its instance is dropped (`plinth_plugin_traps_total`).
    pub fn trapped(&self) {
        self.traps.inc();
    }
}

//! How long a plugin's calls take, per stage: what decides whether a call
//! runs on the thread that asks for it or is handed to a blocking thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::metrics::PluginStage;

/// The longest a stage's calls may take, on average, to run on the calling
/// (async runtime) thread: the hand-off to a blocking thread and back costs
/// tens of microseconds, and a longer call would hold up the thread's other
/// requests.
pub const INLINE_CALL: Duration = Duration::from_micros(100);

/// Each stage's recent mean call time, and whether the plugin ever ran
/// another model (such a call's time is mostly the other model's, which
/// says nothing of how long the plugin itself holds a thread, so it never
/// runs on an async thread).
#[derive(Default)]
pub(super) struct CallTiming {
    /// Exponential moving averages (weight 1/8), in microseconds; 0 before
    /// the first call.
    means_us: [AtomicU64; PluginStage::ALL.len()],
    composes: AtomicBool,
}

impl CallTiming {
    fn mean(&self, stage: PluginStage) -> &AtomicU64 {
        &self.means_us[stage as usize]
    }

    /// Whether the next `stage` call runs on the calling thread.
    pub(super) fn runs_inline(&self, stage: PluginStage) -> bool {
        let mean = self.mean(stage).load(Ordering::Relaxed);
        !self.composes.load(Ordering::Relaxed) && mean > 0 && mean <= INLINE_CALL.as_micros() as u64
    }

    /// Folds one `stage` call that took `took` into its mean.
    pub(super) fn remember(&self, stage: PluginStage, took: Duration) {
        let sample = (took.as_micros() as u64).max(1);
        let _ = self.mean(stage).fetch_update(Ordering::Relaxed, Ordering::Relaxed, |mean| {
            Some(if mean == 0 { sample } else { (mean * 7 + sample) / 8 })
        });
    }

    /// Records that the plugin ran another model: its calls never run
    /// inline from now on.
    pub(super) fn composed(&self) {
        self.composes.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_fast_stages_of_plugins_that_never_compose_run_inline() {
        let timing = CallTiming::default();
        assert!(!timing.runs_inline(PluginStage::Postprocess), "unknown until measured");
        timing.remember(PluginStage::Postprocess, Duration::from_micros(20));
        timing.remember(PluginStage::Preprocess, Duration::from_millis(5));
        assert!(timing.runs_inline(PluginStage::Postprocess));
        assert!(!timing.runs_inline(PluginStage::Preprocess));
        for _ in 0..20 {
            timing.remember(PluginStage::Postprocess, Duration::from_millis(1));
        }
        assert!(!timing.runs_inline(PluginStage::Postprocess), "slow again: back on a blocking thread");
        timing.remember(PluginStage::Preprocess, Duration::from_micros(1));
        let fast = CallTiming::default();
        fast.remember(PluginStage::Preprocess, Duration::from_micros(1));
        fast.composed();
        assert!(!fast.runs_inline(PluginStage::Preprocess));
    }
}

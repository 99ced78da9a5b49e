//! What one version did during one step of a rollout: requests, failures
//! and the latency distribution (an HDR histogram, so p99 costs no sort).

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// The longest latency a window records exactly, in microseconds (one
/// hour); longer ones count as this.
const HIGHEST_US: u64 = 3_600_000_000;

/// One version's requests in the current step.
#[derive(Clone, Debug)]
pub struct Window {
    /// Requests answered or failed.
    pub requests: u64,
    /// Requests that failed on the server's side.
    pub failures: u64,
    latency_us: Histogram<u64>,
}

impl Default for Window {
    fn default() -> Window {
        Window {
            requests: 0,
            failures: 0,
            latency_us: Histogram::new_with_bounds(1, HIGHEST_US, 3).expect("histogram bounds are valid"),
        }
    }
}

impl Window {
    /// Counts one request that took `latency` and did or did not fail.
    pub fn record(&mut self, latency: Duration, failed: bool) {
        self.requests += 1;
        self.failures += u64::from(failed);
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX).clamp(1, HIGHEST_US);
        self.latency_us.saturating_record(us);
    }

    /// The 99th percentile of the latencies recorded, in microseconds (0
    /// when none).
    pub fn p99_us(&self) -> u64 {
        self.latency_us.value_at_quantile(0.99)
    }

    /// The share of requests that failed (0 when none).
    pub fn error_rate(&self) -> f64 {
        if self.requests == 0 { 0.0 } else { self.failures as f64 / self.requests as f64 }
    }

    /// The window's figures, for the API and the status page.
    pub fn figures(&self) -> Figures {
        Figures { requests: self.requests, failures: self.failures, p99_us: self.p99_us() }
    }
}

/// A window's figures as the API shows them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Figures {
    /// Requests in the step.
    pub requests: u64,
    /// Of which failed on the server's side.
    pub failures: u64,
    /// Their 99th percentile latency, in microseconds.
    pub p99_us: u64,
}

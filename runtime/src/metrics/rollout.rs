//! Plinth's rollout families: each model's rollout phase, the candidate's
//! share, and the requests each side of a rollout in canary answered.

use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use super::register;

/// The `plinth_rollout_*` families, recorded by the rollouts.
pub struct RolloutMetrics {
    /// The candidate's share of the requests that name no version, in
    /// percent, by model.
    pub percent: GaugeVec,
    /// 1 for the rollout's phase (`SHADOW`, `CANARY`, `PROMOTED`,
    /// `ROLLED_BACK`), 0
    /// for the others, by model.
    pub phase: IntGaugeVec,
    /// Requests answered during a canary, by model, role (`serving`,
    /// `candidate`) and outcome (`success`, `failure`).
    pub requests: IntCounterVec,
    /// Shadow requests, by model and result (`agreed`, `disagreed`,
    /// `dropped`: not run, the shadow queue being full).
    pub shadow: IntCounterVec,
}

impl RolloutMetrics {
    /// Creates the families and registers them with `registry`.
    pub(super) fn register(registry: &Registry) -> RolloutMetrics {
        let percent = GaugeVec::new(
            Opts::new("plinth_rollout_candidate_percent", "The rollout candidate's share of unversioned requests"),
            &["model"],
        )
        .expect("valid metric");
        let phase = IntGaugeVec::new(
            Opts::new("plinth_rollout_phase", "1 for the phase the model's rollout is in"),
            &["model", "phase"],
        )
        .expect("valid metric");
        let requests = IntCounterVec::new(
            Opts::new("plinth_rollout_requests_total", "Requests answered during a rollout's canary, by side"),
            &["model", "role", "outcome"],
        )
        .expect("valid metric");
        let shadow = IntCounterVec::new(
            Opts::new("plinth_rollout_shadow_total", "Requests also run on a rollout's candidate, by result"),
            &["model", "result"],
        )
        .expect("valid metric");
        RolloutMetrics {
            shadow: register(registry, shadow),
            percent: register(registry, percent),
            phase: register(registry, phase),
            requests: register(registry, requests),
        }
    }

    /// Drops `model`'s series (its rollout is forgotten).
    pub fn forget(&self, model: &str) {
        let _ = self.percent.remove_label_values(&[model]);
        for result in ["agreed", "disagreed", "dropped"] {
            let _ = self.shadow.remove_label_values(&[model, result]);
        }
        for phase in ["SHADOW", "CANARY", "PROMOTED", "ROLLED_BACK"] {
            let _ = self.phase.remove_label_values(&[model, phase]);
        }
        for role in ["serving", "candidate"] {
            for outcome in ["success", "failure"] {
                let _ = self.requests.remove_label_values(&[model, role, outcome]);
            }
        }
    }
}

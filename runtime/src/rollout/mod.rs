//! Rollouts inside one server: a model's requests that name no version move
//! from its serving version to a candidate version in canary steps, on
//! evidence measured in the same window for both (the candidate's failures,
//! its p99 latency against the serving version's), and move back at once
//! when a rule is broken.
//!
//! This module decides (which version a request reaches, when a step ends,
//! when the candidate is promoted or rolled back) and knows only version
//! numbers; the lifecycle acts on its [`Transition`]s.

pub mod compare;
mod plan;
mod state;
mod window;

pub use plan::{Plan, ShadowPlan, declared_plan};
pub use window::{Figures, Window};

use state::Rollout;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;

use crate::metrics::RolloutMetrics;

/// Where a rollout is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Phase {
    /// The serving version answers every request; some are also run on
    /// the candidate, whose answers are compared and never returned.
    Shadow,
    /// The candidate answers the current step's share of the requests.
    Canary,
    /// Every rule held through the last step: the candidate serves.
    Promoted,
    /// A rule was broken (or the rollout was cancelled): the serving
    /// version takes every request back.
    RolledBack,
}

impl Phase {
    /// The phase as the API writes it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Phase::Shadow => "SHADOW",
            Phase::Canary => "CANARY",
            Phase::Promoted => "PROMOTED",
            Phase::RolledBack => "ROLLED_BACK",
        }
    }
}

/// A change a rollout made, for the lifecycle to act on and log.
#[derive(Clone, Debug, PartialEq)]
pub enum Transition {
    /// The next step began (the first canary step after the shadow
    /// phase), with the candidate's new share in percent.
    Advanced {
        /// The step begun, counted from 1.
        step: usize,
        /// The candidate's share, in percent.
        percent: f64,
    },
    /// The candidate serves every request that names no version.
    Promoted {
        /// The version promoted.
        candidate: u64,
        /// The version it replaces.
        serving: u64,
    },
    /// The serving version takes every request back.
    RolledBack {
        /// The version rolled back.
        candidate: u64,
        /// Which rule was broken, with the figures.
        reason: String,
    },
}

/// What the shadow phase measured.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ShadowCounts {
    /// Requests chosen for shadowing so far, for the choice by count.
    #[serde(skip)]
    chosen: u64,
    /// Shadow requests running or waiting now.
    pub in_flight: usize,
    /// Answers compared.
    pub compared: u64,
    /// Of which differed (or failed on the candidate).
    pub disagreed: u64,
    /// Requests not shadowed because `queue` were in flight.
    pub dropped: u64,
    /// The first difference seen, if any.
    pub first_difference: String,
}

/// A request chosen to be run on the candidate too: which version, and the
/// plan's tolerances. Give it back to [`Rollouts::shadowed`].
#[derive(Clone, Debug)]
pub struct ShadowTicket {
    pub model: String,
    /// The candidate version to run the request on.
    pub candidate: u64,
    /// The shadow plan the answers are compared by.
    pub plan: ShadowPlan,
}

/// A rollout as the API, the repository index and the status page show it.
#[derive(Clone, Debug, Serialize)]
pub struct RolloutStatus {
    pub model: String,
    /// The version serving meanwhile.
    pub serving: u64,
    /// The version tried.
    pub candidate: u64,
    /// `SHADOW`, `CANARY`, `PROMOTED` or `ROLLED_BACK`.
    pub phase: Phase,
    /// The current step, from 1.
    pub step: usize,
    /// Steps in the plan.
    pub steps: usize,
    /// The candidate's share of the requests that name no version, in
    /// percent.
    pub percent: f64,
    /// Why it was rolled back; else empty.
    pub reason: String,
    /// When it started, in milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
    /// Seconds since the current step began.
    pub step_seconds: f64,
    /// The serving version's figures in the step.
    pub serving_window: Figures,
    /// The candidate's figures in the step.
    pub candidate_window: Figures,
    /// The candidate's share of failed requests in the step.
    pub candidate_error_rate: f64,
    /// The candidate's p99 latency over the serving version's, once both
    /// have answered in the step.
    pub p99_ratio: Option<f64>,
    /// What the shadow phase compared, when the plan has one.
    pub shadow: Option<ShadowCounts>,
    /// The plan, defaults filled in.
    pub plan: Plan,
}

/// Every model's rollout.
pub struct Rollouts {
    by_model: Mutex<HashMap<String, Rollout>>,
    /// Rollouts kept (in any phase): requests skip the lock while there
    /// are none.
    kept: AtomicUsize,
    /// Rollouts in canary: answers skip the lock while there are none.
    live: AtomicUsize,
    metrics: Arc<RolloutMetrics>,
}

impl Rollouts {
    /// No rollouts, counted in `metrics`.
    pub fn new(metrics: Arc<RolloutMetrics>) -> Rollouts {
        Rollouts { by_model: Mutex::default(), kept: AtomicUsize::new(0), live: AtomicUsize::new(0), metrics }
    }

    /// Starts a rollout of `model` from `serving` to `plan.candidate`,
    /// replacing any earlier one of the model.
    pub fn start(&self, model: &str, plan: Plan, serving: u64) -> RolloutStatus {
        let rollout = Rollout::new(plan, serving, Instant::now());
        let status = rollout.status(model);
        let mut by_model = self.by_model.lock();
        match by_model.insert(model.to_owned(), rollout) {
            None => {
                self.kept.fetch_add(1, Ordering::AcqRel);
                self.live.fetch_add(1, Ordering::AcqRel);
            }
            Some(old) if !old.in_progress() => {
                self.live.fetch_add(1, Ordering::AcqRel);
            }
            Some(_) => {}
        }
        self.record(model, &status);
        status
    }

    /// The version a request for `model` that names no version reaches,
    /// when a rollout of it decides; `header` looks up a request header
    /// (for the plan's `sticky_header`).
    pub fn route(&self, model: &str, header: &(dyn Fn(&str) -> Option<String> + Sync)) -> Option<u64> {
        self.pick(model, |plan| plan.sticky_header.as_deref().and_then(header))
    }

    /// As [`Rollouts::route`], for a request whose sticky key is `key`
    /// whatever the plan's `sticky_header` (a sequence's id).
    pub fn route_by_key(&self, model: &str, key: &str) -> Option<u64> {
        self.pick(model, |_| Some(key.to_owned()))
    }

    fn pick(&self, model: &str, key: impl FnOnce(&Plan) -> Option<String>) -> Option<u64> {
        if self.kept.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut by_model = self.by_model.lock();
        let rollout = by_model.get_mut(model)?;
        let key = key(&rollout.plan);
        Some(match rollout.phase {
            Phase::Shadow => rollout.serving,
            Phase::Canary => rollout.route(key.as_deref()),
            Phase::Promoted => rollout.plan.candidate,
            Phase::RolledBack => rollout.serving,
        })
    }

    /// The version of `model` that answers the requests naming no version
    /// when its rollout splits none: the serving version in the shadow
    /// phase, in canary and after a rollback, the candidate once promoted.
    /// `None` when the model has no rollout.
    pub fn answering(&self, model: &str) -> Option<u64> {
        let by_model = self.by_model.lock();
        let rollout = by_model.get(model)?;
        Some(if rollout.phase == Phase::Promoted { rollout.plan.candidate } else { rollout.serving })
    }

    /// The candidate of `model`'s rollout while it is in progress.
    pub fn candidate_in_progress(&self, model: &str) -> Option<u64> {
        let by_model = self.by_model.lock();
        by_model.get(model).filter(|r| r.in_progress()).map(|r| r.plan.candidate)
    }

    /// Counts a request that `version` of `model` answered (`failed`: on the
    /// server's side) in `latency`; returns what the rollout did about it.
    pub fn observe(&self, model: &str, version: u64, latency: Duration, failed: bool) -> Option<Transition> {
        if self.live.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut by_model = self.by_model.lock();
        let rollout = by_model.get_mut(model)?;
        let role = if version == rollout.plan.candidate { "candidate" } else { "serving" };
        let transition = rollout.observe(version, latency, failed, Instant::now());
        if rollout.phase == Phase::Canary || transition.is_some() {
            let outcome = if failed { "failure" } else { "success" };
            self.metrics.requests.with_label_values(&[model, role, outcome]).inc();
        }
        if let Some(transition) = &transition {
            let status = rollout.status(model);
            if !matches!(transition, Transition::Advanced { .. }) {
                self.live.fetch_sub(1, Ordering::AcqRel);
            }
            self.record(model, &status);
        }
        transition
    }

    /// Whether the answer `version` of `model` just gave is also run on
    /// the candidate (the shadow phase chooses it): `None` most of the
    /// time, and always for the candidate's own answers.
    pub fn shadow_ticket(&self, model: &str, version: u64) -> Option<ShadowTicket> {
        if self.live.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut by_model = self.by_model.lock();
        let rollout = by_model.get_mut(model).filter(|r| r.serving == version)?;
        let before = rollout.shadow.dropped;
        let ticket = rollout.shadow_ticket(model);
        if rollout.shadow.dropped > before {
            self.metrics.shadow.with_label_values(&[model, "dropped"]).inc();
        }
        ticket
    }

    /// Counts the comparison of a shadow request `ticket` chose (`Err`: how
    /// the candidate's answer differed or why it failed); returns what the
    /// rollout did about it.
    pub fn shadowed(&self, ticket: &ShadowTicket, outcome: Result<(), String>) -> Option<Transition> {
        let model = ticket.model.as_str();
        let mut by_model = self.by_model.lock();
        let rollout = by_model.get_mut(model)?;
        // Comparisons that finish after the phase ended count for nothing.
        if rollout.phase == Phase::Shadow {
            let result = if outcome.is_ok() { "agreed" } else { "disagreed" };
            self.metrics.shadow.with_label_values(&[model, result]).inc();
        }
        let transition = rollout.shadowed(outcome, Instant::now());
        if let Some(transition) = &transition {
            if matches!(transition, Transition::RolledBack { .. }) {
                self.live.fetch_sub(1, Ordering::AcqRel);
            }
            let status = rollout.status(model);
            self.record(model, &status);
        }
        transition
    }

    /// Lets go of a shadow request that will not run (the serving version
    /// failed it: there is no answer to compare with).
    pub fn release(&self, ticket: &ShadowTicket) {
        let mut by_model = self.by_model.lock();
        if let Some(rollout) = by_model.get_mut(&ticket.model) {
            rollout.shadow.in_flight = rollout.shadow.in_flight.saturating_sub(1);
        }
    }

    /// Stops `model`'s rollout in progress: the serving version takes every
    /// request back, with `reason`. `None` when it has none in progress.
    pub fn cancel(&self, model: &str, reason: &str) -> Option<Transition> {
        let mut by_model = self.by_model.lock();
        let rollout = by_model.get_mut(model).filter(|r| r.in_progress())?;
        let transition = rollout.roll_back(reason.to_owned());
        self.live.fetch_sub(1, Ordering::AcqRel);
        let status = rollout.status(model);
        self.record(model, &status);
        Some(transition)
    }

    /// Forgets `model`'s rollout (the model was unloaded).
    pub fn forget(&self, model: &str) {
        let mut by_model = self.by_model.lock();
        if let Some(old) = by_model.remove(model) {
            self.kept.fetch_sub(1, Ordering::AcqRel);
            if old.in_progress() {
                self.live.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.metrics.forget(model);
    }

    /// `model`'s rollout, if it has one (in canary or finished).
    pub fn status(&self, model: &str) -> Option<RolloutStatus> {
        self.by_model.lock().get(model).map(|r| r.status(model))
    }

    /// Every rollout, by model name.
    pub fn all(&self) -> Vec<RolloutStatus> {
        let by_model = self.by_model.lock();
        let mut all: Vec<RolloutStatus> = by_model.iter().map(|(m, r)| r.status(m)).collect();
        all.sort_by(|a, b| a.model.cmp(&b.model));
        all
    }

    /// Whether the rollouts' lock can be taken within `wait` (readiness:
    /// a lock held that long means requests are stuck behind it).
    pub fn responsive(&self, wait: Duration) -> bool {
        self.by_model.try_lock_for(wait).is_some()
    }

    /// Runs `f` while holding the rollouts' lock, as a request does when a
    /// rollout judges its answer (the test-only fault hook of the server:
    /// a panic or a stall in there).
    pub fn while_locked<T>(&self, f: impl FnOnce() -> T) -> T {
        let _held = self.by_model.lock();
        f()
    }

    fn record(&self, model: &str, status: &RolloutStatus) {
        self.metrics.percent.with_label_values(&[model]).set(status.percent);
        for phase in [Phase::Shadow, Phase::Canary, Phase::Promoted, Phase::RolledBack] {
            let on = status.phase == phase;
            self.metrics.phase.with_label_values(&[model, phase.as_str()]).set(i64::from(on));
        }
    }
}

#[cfg(test)]
mod tests;

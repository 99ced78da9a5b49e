//! One model's rollout: its phase, step and the windows measured in it,
//! and the decisions taken on them (route, judge, promote, roll back).

use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant, SystemTime};

use super::{Phase, Plan, RolloutStatus, ShadowCounts, ShadowTicket, Transition, Window};

/// One model's rollout.
#[derive(Debug)]
pub(super) struct Rollout {
    pub(super) plan: Plan,
    pub(super) serving: u64,
    pub(super) phase: Phase,
    /// The current step, from 0.
    pub(super) step: usize,
    pub(super) step_started: Instant,
    pub(super) started: SystemTime,
    pub(super) reason: String,
    pub(super) serving_window: Window,
    pub(super) candidate_window: Window,
    /// Requests routed so far, for the split by count.
    pub(super) routed: u64,
    pub(super) shadow: ShadowCounts,
}

impl Rollout {
    pub(super) fn new(mut plan: Plan, serving: u64, now: Instant) -> Rollout {
        plan.serving = Some(serving);
        Rollout {
            phase: if plan.shadow.is_some() { Phase::Shadow } else { Phase::Canary },
            plan,
            serving,
            step: 0,
            step_started: now,
            started: SystemTime::now(),
            reason: String::new(),
            serving_window: Window::default(),
            candidate_window: Window::default(),
            routed: 0,
            shadow: ShadowCounts::default(),
        }
    }

    pub(super) fn in_progress(&self) -> bool {
        matches!(self.phase, Phase::Shadow | Phase::Canary)
    }

    /// Whether a request the serving version answered is also run on the
    /// candidate: in the shadow phase, by count at the plan's share, while
    /// fewer than `queue` shadow requests are in flight.
    pub(super) fn shadow_ticket(&mut self, model: &str) -> Option<ShadowTicket> {
        let plan = self.plan.shadow.as_ref().filter(|_| self.phase == Phase::Shadow)?;
        let n = self.shadow.chosen as f64;
        self.shadow.chosen += 1;
        if ((n + 1.0) * plan.percent / 100.0).floor() <= (n * plan.percent / 100.0).floor() {
            return None;
        }
        if self.shadow.in_flight >= plan.queue {
            self.shadow.dropped += 1;
            return None;
        }
        self.shadow.in_flight += 1;
        Some(ShadowTicket { model: model.to_owned(), candidate: self.plan.candidate, plan: plan.clone() })
    }

    /// Counts a shadow comparison (`Err`: how the candidate's answer
    /// differed, or why it failed) and judges the answers rule.
    pub(super) fn shadowed(&mut self, outcome: Result<(), String>, now: Instant) -> Option<Transition> {
        self.shadow.in_flight = self.shadow.in_flight.saturating_sub(1);
        let plan = self.plan.shadow.as_ref().filter(|_| self.phase == Phase::Shadow)?;
        self.shadow.compared += 1;
        if let Err(difference) = outcome {
            self.shadow.disagreed += 1;
            if self.shadow.first_difference.is_empty() {
                self.shadow.first_difference = difference;
            }
        }
        let allowed = plan.max_disagreement_rate * self.shadow.compared.max(self.plan.min_requests) as f64;
        if self.shadow.disagreed as f64 > allowed {
            return Some(self.roll_back(format!(
                "answers: {} of {} shadowed requests differed on version {}, more than max_disagreement_rate {} \
                 allows; first: {}",
                self.shadow.disagreed,
                self.shadow.compared,
                self.plan.candidate,
                plan.max_disagreement_rate,
                self.shadow.first_difference
            )));
        }
        if self.shadow.compared < plan.requests {
            return None;
        }
        self.phase = Phase::Canary;
        self.step_started = now;
        self.serving_window = Window::default();
        Some(Transition::Advanced { step: 1, percent: self.plan.steps[0] })
    }

    pub(super) fn percent(&self) -> f64 {
        match self.phase {
            Phase::Shadow => 0.0,
            Phase::Canary => self.plan.steps[self.step],
            Phase::Promoted => 100.0,
            Phase::RolledBack => 0.0,
        }
    }

    /// The version a request that names none reaches; `key` is its sticky
    /// header's value, when the plan names one and the request has it.
    pub(super) fn route(&mut self, key: Option<&str>) -> u64 {
        let percent = self.percent();
        let to_candidate = match key {
            // The same key lands in the same bucket every time, and a bucket
            // below the share stays below it as the share grows.
            Some(key) => (bucket(key) as f64) < percent * 100.0,
            // By count: request n goes to the candidate when the running
            // share crosses a whole request, so the split is exact.
            None => {
                let n = self.routed as f64;
                self.routed += 1;
                ((n + 1.0) * percent / 100.0).floor() > (n * percent / 100.0).floor()
            }
        };
        if to_candidate { self.plan.candidate } else { self.serving }
    }

    /// Counts a request `version` answered (or failed) in `latency`, and
    /// judges the rules.
    pub(super) fn observe(
        &mut self,
        version: u64,
        latency: Duration,
        failed: bool,
        now: Instant,
    ) -> Option<Transition> {
        if self.phase != Phase::Canary {
            return None;
        }
        if version == self.plan.candidate {
            self.candidate_window.record(latency, failed);
        } else if version == self.serving {
            self.serving_window.record(latency, failed);
        } else {
            return None;
        }
        self.judge(now)
    }

    /// The first broken rule rolls back; a step that lasted its dwell time
    /// with enough candidate requests ends.
    pub(super) fn judge(&mut self, now: Instant) -> Option<Transition> {
        if let Some(reason) = self.broken_rule() {
            return Some(self.roll_back(reason));
        }
        let dwelt = now.duration_since(self.step_started) >= self.plan.dwell();
        // A plan whose only step is 100 % leaves the serving version nothing
        // to answer: only the error rule (and a shadow phase) judge it.
        let serving_measured = self.serving_window.requests >= self.plan.min_requests || self.plan.steps[0] >= 100.0;
        let measured = self.candidate_window.requests >= self.plan.min_requests && serving_measured;
        if !(dwelt && measured) {
            return None;
        }
        if self.step + 1 == self.plan.steps.len() {
            self.phase = Phase::Promoted;
            return Some(Transition::Promoted { candidate: self.plan.candidate, serving: self.serving });
        }
        self.step += 1;
        self.step_started = now;
        self.candidate_window = Window::default();
        // At 100 % the serving version gets no share to measure: the
        // latency rule compares against the previous step's figures.
        if self.plan.steps[self.step] < 100.0 {
            self.serving_window = Window::default();
        }
        Some(Transition::Advanced { step: self.step + 1, percent: self.plan.steps[self.step] })
    }

    pub(super) fn broken_rule(&self) -> Option<String> {
        let (plan, c, s) = (&self.plan, &self.candidate_window, &self.serving_window);
        // Judged from the first failure, but over at least min_requests, so
        // one early failure of few requests is not a rate of 100 %.
        let allowed = plan.max_error_rate * c.requests.max(plan.min_requests) as f64;
        if c.failures as f64 > allowed {
            return Some(format!(
                "error rate: {} of {} requests failed on version {} ({:.1} %), more than max_error_rate {} allows",
                c.failures,
                c.requests,
                plan.candidate,
                c.error_rate() * 100.0,
                plan.max_error_rate
            ));
        }
        if c.requests >= plan.min_requests && s.requests >= plan.min_requests {
            let ratio = c.p99_us() as f64 / s.p99_us().max(1) as f64;
            let slower_us = c.p99_us().saturating_sub(s.p99_us()) as f64;
            if ratio > plan.max_p99_ratio && slower_us > plan.p99_slack_ms * 1000.0 {
                return Some(format!(
                    "p99 latency: version {} took {} µs, {:.2} times version {}'s {} µs, more than max_p99_ratio {}",
                    plan.candidate,
                    c.p99_us(),
                    ratio,
                    self.serving,
                    s.p99_us(),
                    plan.max_p99_ratio
                ));
            }
        }
        None
    }

    pub(super) fn roll_back(&mut self, reason: String) -> Transition {
        self.phase = Phase::RolledBack;
        self.reason = reason.clone();
        Transition::RolledBack { candidate: self.plan.candidate, reason }
    }

    pub(super) fn status(&self, model: &str) -> RolloutStatus {
        let (c, s) = (&self.candidate_window, &self.serving_window);
        RolloutStatus {
            model: model.to_owned(),
            serving: self.serving,
            candidate: self.plan.candidate,
            phase: self.phase.clone(),
            step: self.step + 1,
            steps: self.plan.steps.len(),
            percent: self.percent(),
            reason: self.reason.clone(),
            started_unix_ms: self.started.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
            step_seconds: self.step_started.elapsed().as_secs_f64(),
            serving_window: s.figures(),
            candidate_window: c.figures(),
            candidate_error_rate: c.error_rate(),
            p99_ratio: (c.requests > 0 && s.requests > 0).then(|| c.p99_us() as f64 / s.p99_us().max(1) as f64),
            shadow: self.plan.shadow.is_some().then(|| self.shadow.clone()),
            plan: self.plan.clone(),
        }
    }
}

/// A stable bucket in [0, 10000) for a sticky key.
fn bucket(key: &str) -> u64 {
    // DefaultHasher::new has fixed keys: the same key gives the same bucket
    // in every process of one build, so a client stays put across a
    // restart too.
    let mut hasher = std::hash::DefaultHasher::new();
    key.hash(&mut hasher);
    hasher.finish() % 10_000
}

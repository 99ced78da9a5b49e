//! A rollout's plan: which version is tried, in which steps, and the rules
//! that promote it or roll it back. Written as JSON in
//! `POST /v2/repository/models/{m}/rollout` or in a model's `config.pbtxt`
//! parameter `rollout`; a field this page does not name is refused by name.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{self, ModelConfig};

/// The canary steps when a plan names none: the percentages of
/// unversioned requests the candidate answers, one after another.
pub const DEFAULT_STEPS: [f64; 4] = [1.0, 10.0, 50.0, 100.0];

/// A rollout of a model from its serving version to a candidate version.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// The version tried. Must be READY when the rollout starts.
    pub candidate: u64,
    /// The version that serves meanwhile and takes the traffic back on a
    /// rollback; by default the highest READY version below the candidate.
    #[serde(default)]
    pub serving: Option<u64>,
    /// Percentages of the requests that name no version answered by the
    /// candidate, step after step: increasing, each in (0, 100], the last
    /// 100.
    #[serde(default = "default_steps")]
    pub steps: Vec<f64>,
    /// How long each step lasts at least, in seconds.
    #[serde(default = "default_dwell_secs")]
    pub dwell_secs: f64,
    /// Requests the candidate answers in a step before the step may end and
    /// before the latency rule judges it.
    #[serde(default = "default_min_requests")]
    pub min_requests: u64,
    /// The largest share of the candidate's requests that may fail on the
    /// server's side (HTTP 500 or 502) in a step; judged on every answer,
    /// over at least `min_requests` requests.
    #[serde(default = "default_max_error_rate")]
    pub max_error_rate: f64,
    /// The largest ratio of the candidate's p99 latency to the serving
    /// version's, both measured in the same step.
    #[serde(default = "default_max_p99_ratio")]
    pub max_p99_ratio: f64,
    /// A candidate p99 within this many milliseconds of the serving
    /// version's never breaks the latency rule: at sub-millisecond
    /// latencies a ratio measures scheduling noise, not the model.
    #[serde(default = "default_p99_slack_ms")]
    pub p99_slack_ms: f64,
    /// A request header whose value keeps one client on one version during
    /// a step (a value in the candidate's share stays in it as the share
    /// grows). Without it, requests are split by count.
    #[serde(default)]
    pub sticky_header: Option<String>,
    /// Before any canary step, run requests on the candidate as well, after
    /// the serving version has answered, and compare the answers; the
    /// candidate's are never returned.
    #[serde(default)]
    pub shadow: Option<ShadowPlan>,
}

/// The shadow phase of a rollout: which requests are run on the candidate
/// too, how its answers must agree, and the bound on its cost.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowPlan {
    /// Percentage of the serving version's answered requests also run on
    /// the candidate.
    #[serde(default = "default_shadow_percent")]
    pub percent: f64,
    /// Answers compared before the first canary step.
    #[serde(default = "default_shadow_requests")]
    pub requests: u64,
    /// The largest share of compared answers that may differ (judged on
    /// every comparison, over at least the plan's `min_requests`).
    #[serde(default)]
    pub max_disagreement_rate: f64,
    /// The largest absolute difference between two floating-point
    /// elements that still agree; other types must be equal.
    #[serde(default)]
    pub tolerance: f64,
    /// A tolerance per output name, in place of `tolerance`.
    #[serde(default)]
    pub output_tolerances: BTreeMap<String, f64>,
    /// Shadow requests running or waiting at most; a request past it is
    /// not shadowed, and counted as dropped.
    #[serde(default = "default_shadow_queue")]
    pub queue: usize,
}

impl ShadowPlan {
    /// The tolerance of output `name`.
    pub fn tolerance_of(&self, name: &str) -> f64 {
        self.output_tolerances.get(name).copied().unwrap_or(self.tolerance)
    }
}

fn default_shadow_percent() -> f64 {
    100.0
}
fn default_shadow_requests() -> u64 {
    200
}
fn default_shadow_queue() -> usize {
    64
}

fn default_steps() -> Vec<f64> {
    DEFAULT_STEPS.to_vec()
}
fn default_dwell_secs() -> f64 {
    60.0
}
fn default_min_requests() -> u64 {
    50
}
fn default_max_error_rate() -> f64 {
    0.01
}
fn default_max_p99_ratio() -> f64 {
    1.5
}
fn default_p99_slack_ms() -> f64 {
    1.0
}

impl Plan {
    /// Reads a plan from JSON.
    ///
    /// # Errors
    /// A message naming the field that is unknown, missing, of the wrong
    /// type or out of range.
    pub fn parse(json: &[u8]) -> Result<Plan, String> {
        let plan: Plan = serde_json::from_slice(json).map_err(|e| format!("rollout plan: {e}"))?;
        plan.check()?;
        Ok(plan)
    }

    /// Reads the plan a model declares in its `config.pbtxt` parameter
    /// `rollout`, for a new version `candidate` that rolls out from the
    /// version `serving` before it. The version folders decide both, so the
    /// declared plan names neither.
    ///
    /// # Errors
    /// As [`Plan::parse`], and a message naming `candidate` or `serving`
    /// when the declared plan names them.
    pub fn declared(json: &str, candidate: u64, serving: u64) -> Result<Plan, String> {
        let mut fields: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(json).map_err(|e| format!("rollout plan: {e}"))?;
        for decided in ["candidate", "serving"] {
            if fields.contains_key(decided) {
                return Err(format!(
                    "rollout plan: a plan in config.pbtxt names no '{decided}': a new version folder is the \
                     candidate, and the version serving before it the serving one"
                ));
            }
        }
        fields.insert("candidate".into(), candidate.into());
        fields.insert("serving".into(), serving.into());
        let plan: Plan = serde_json::from_value(fields.into()).map_err(|e| format!("rollout plan: {e}"))?;
        plan.check()?;
        Ok(plan)
    }

    /// The dwell time of each step.
    pub fn dwell(&self) -> Duration {
        Duration::from_secs_f64(self.dwell_secs)
    }

    fn check(&self) -> Result<(), String> {
        let refuse = |m: String| Err(format!("rollout plan: {m}"));
        if self.steps.is_empty() {
            return refuse("'steps' is empty; give percentages ending at 100".into());
        }
        if self.steps.iter().any(|s| !(*s > 0.0 && *s <= 100.0)) {
            return refuse(format!("'steps' must be percentages in (0, 100], got {:?}", self.steps));
        }
        if self.steps.windows(2).any(|w| w[0] >= w[1]) {
            return refuse(format!("'steps' must increase, got {:?}", self.steps));
        }
        if self.steps.last() != Some(&100.0) {
            return refuse(format!("the last of 'steps' must be 100, got {:?}", self.steps));
        }
        if !(self.dwell_secs.is_finite() && self.dwell_secs >= 0.0) {
            return refuse(format!("'dwell_secs' must be 0 or more, got {}", self.dwell_secs));
        }
        if self.min_requests == 0 {
            return refuse("'min_requests' must be 1 or more".into());
        }
        if !(0.0..=1.0).contains(&self.max_error_rate) {
            return refuse(format!("'max_error_rate' must be in [0, 1], got {}", self.max_error_rate));
        }
        if !(self.max_p99_ratio.is_finite() && self.max_p99_ratio >= 1.0) {
            return refuse(format!("'max_p99_ratio' must be 1 or more, got {}", self.max_p99_ratio));
        }
        if !(self.p99_slack_ms.is_finite() && self.p99_slack_ms >= 0.0) {
            return refuse(format!("'p99_slack_ms' must be 0 or more, got {}", self.p99_slack_ms));
        }
        if self.serving == Some(self.candidate) {
            return refuse(format!("'serving' and 'candidate' are both version {}", self.candidate));
        }
        if self.sticky_header.as_deref().is_some_and(|h| h.is_empty() || !h.is_ascii()) {
            return refuse("'sticky_header' must be a header name".into());
        }
        if let Some(shadow) = &self.shadow {
            if !(shadow.percent > 0.0 && shadow.percent <= 100.0) {
                return refuse(format!("'shadow.percent' must be in (0, 100], got {}", shadow.percent));
            }
            if shadow.requests == 0 || shadow.queue == 0 {
                return refuse("'shadow.requests' and 'shadow.queue' must be 1 or more".into());
            }
            if !(0.0..=1.0).contains(&shadow.max_disagreement_rate) {
                return refuse(format!(
                    "'shadow.max_disagreement_rate' must be in [0, 1], got {}",
                    shadow.max_disagreement_rate
                ));
            }
            let tolerances = std::iter::once(&shadow.tolerance).chain(shadow.output_tolerances.values());
            if tolerances.clone().any(|t| !(t.is_finite() && *t >= 0.0)) {
                return refuse("'shadow.tolerance' and 'shadow.output_tolerances' must be 0 or more".into());
            }
        }
        Ok(())
    }
}

/// The `config.pbtxt` parameter that declares the rollout every new version
/// of the model goes through: a plan in JSON without `candidate` or
/// `serving` ([`Plan::declared`]).
pub const ROLLOUT_PARAMETER: &str = "rollout";

/// The plan `config` declares in its [`ROLLOUT_PARAMETER`], checked as far
/// as it can be before the versions are known.
///
/// # Errors
/// A message naming the parameter for a plan that does not parse.
pub fn declared_plan(config: &ModelConfig) -> Result<Option<&str>, String> {
    let Some(json) = config::parameter(config, ROLLOUT_PARAMETER) else { return Ok(None) };
    Plan::declared(json, 2, 1).map_err(|e| format!("parameter '{ROLLOUT_PARAMETER}': {e}"))?;
    Ok(Some(json))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fill_what_a_plan_leaves_out() {
        let plan = Plan::parse(br#"{"candidate": 2}"#).unwrap();
        assert_eq!(plan.steps, DEFAULT_STEPS);
        assert_eq!((plan.serving, plan.min_requests, plan.sticky_header), (None, 50, None));
    }

    #[test]
    fn a_declared_plan_gets_its_versions_from_the_folders() {
        let plan = Plan::declared(r#"{"steps": [50, 100]}"#, 3, 2).unwrap();
        assert_eq!((plan.candidate, plan.serving, plan.steps), (3, Some(2), vec![50.0, 100.0]));
        for (json, words) in [
            (r#"{"candidate": 3}"#, "names no 'candidate'"),
            (r#"{"serving": 1}"#, "names no 'serving'"),
            (r#"{"stepz": [100]}"#, "unknown field `stepz`"),
            (r#"[100]"#, "expected a map"),
        ] {
            let e = Plan::declared(json, 3, 2).unwrap_err();
            assert!(e.contains(words), "{json}: {e}");
        }
    }

    #[test]
    fn a_wrong_field_is_refused_by_name() {
        for (json, words) in [
            (r#"{"candidate": 2, "step": [100]}"#, "unknown field `step`"),
            (r#"{"serving": 1}"#, "missing field `candidate`"),
            (r#"{"candidate": 2, "steps": [10, 5, 100]}"#, "'steps' must increase"),
            (r#"{"candidate": 2, "steps": [10, 50]}"#, "the last of 'steps' must be 100"),
            (r#"{"candidate": 2, "steps": [0, 100]}"#, "in (0, 100]"),
            (r#"{"candidate": 2, "max_error_rate": 2}"#, "'max_error_rate' must be in [0, 1]"),
            (r#"{"candidate": 2, "max_p99_ratio": 0.5}"#, "'max_p99_ratio' must be 1 or more"),
            (r#"{"candidate": 2, "serving": 2}"#, "both version 2"),
            (r#"{"candidate": 2, "min_requests": 0}"#, "'min_requests' must be 1 or more"),
            (r#"{"candidate": 2, "shadow": {"percent": 0}}"#, "'shadow.percent' must be in (0, 100]"),
            (r#"{"candidate": 2, "shadow": {"tolerance": -1}}"#, "must be 0 or more"),
            (r#"{"candidate": 2, "shadow": {"sample": 5}}"#, "unknown field `sample`"),
        ] {
            let e = Plan::parse(json.as_bytes()).unwrap_err();
            assert!(e.contains(words), "{json}: {e}");
        }
    }
}

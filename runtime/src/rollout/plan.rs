//! A rollout's plan: which version is tried, in which steps, and the rules
//! that promote it or roll it back. Written as JSON in
//! `POST /v2/repository/models/{m}/rollout` or in a model's `config.pbtxt`
//! parameter `rollout`; a field this page does not name is refused by name.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The canary steps when a plan names none: the percentages of
/// unversioned requests the candidate answers, one after another.
pub const DEFAULT_STEPS: [f64; 4] = [1.0, 10.0, 50.0, 100.0];

// The range of every number in a plan (docs/rollouts.md, "The plan"): a
// value outside it is refused naming the field, so no figure a client
// sends reaches arithmetic that could overflow or panic.
/// Most canary steps in a plan.
pub const MAX_STEPS: usize = 100;
/// Longest `dwell_secs`: 30 days.
pub const MAX_DWELL_SECS: f64 = 30.0 * 24.0 * 3600.0;
/// Largest `min_requests` and `shadow.requests`.
pub const MAX_REQUESTS: u64 = 1_000_000_000;
/// Largest `max_p99_ratio`.
pub const MAX_P99_RATIO: f64 = 1000.0;
/// Largest `p99_slack_ms`: one hour.
pub const MAX_P99_SLACK_MS: f64 = 3_600_000.0;
/// Largest `shadow.queue`.
pub const MAX_SHADOW_QUEUE: usize = 10_000;
/// Most names in `shadow.output_tolerances`.
pub const MAX_OUTPUT_TOLERANCES: usize = 1000;
/// Longest `sticky_header`, in bytes.
pub const MAX_STICKY_HEADER_BYTES: usize = 256;

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
    /// How long each step lasts at least, in seconds (0 to
    /// [`MAX_DWELL_SECS`]).
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
        let fields = fields(serde_json::from_slice(json))?;
        Plan::from_fields(fields)
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
        let mut fields = fields(serde_json::from_str(json))?;
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
        Plan::from_fields(fields)
    }

    fn from_fields(fields: serde_json::Map<String, Value>) -> Result<Plan, String> {
        // serde reads a struct from an array too (`"shadow": []` would be
        // every default): a plan and its shadow phase are objects only.
        if let Some(shadow) = fields.get("shadow").filter(|s| !s.is_null() && !s.is_object()) {
            return Err(format!("rollout plan: 'shadow' must be a JSON object, got {shadow}"));
        }
        let plan: Plan = serde_json::from_value(fields.into()).map_err(|e| format!("rollout plan: {e}"))?;
        plan.check()?;
        Ok(plan)
    }

    /// The dwell time of each step.
    pub fn dwell(&self) -> Duration {
        // check() bounds dwell_secs; saturate anyway rather than panic.
        Duration::try_from_secs_f64(self.dwell_secs).unwrap_or(Duration::MAX)
    }

    fn check(&self) -> Result<(), String> {
        let refuse = |m: String| Err(format!("rollout plan: {m}"));
        if self.steps.is_empty() {
            return refuse("'steps' is empty; give percentages ending at 100".into());
        }
        if self.steps.len() > MAX_STEPS {
            return refuse(format!("'steps' has {} steps, more than {MAX_STEPS}", self.steps.len()));
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
        if !(0.0..=MAX_DWELL_SECS).contains(&self.dwell_secs) {
            return refuse(format!("'dwell_secs' must be in [0, {MAX_DWELL_SECS}], got {}", self.dwell_secs));
        }
        if !(1..=MAX_REQUESTS).contains(&self.min_requests) {
            return refuse(format!("'min_requests' must be in [1, {MAX_REQUESTS}], got {}", self.min_requests));
        }
        if !(0.0..=1.0).contains(&self.max_error_rate) {
            return refuse(format!("'max_error_rate' must be in [0, 1], got {}", self.max_error_rate));
        }
        if !(1.0..=MAX_P99_RATIO).contains(&self.max_p99_ratio) {
            return refuse(format!("'max_p99_ratio' must be in [1, {MAX_P99_RATIO}], got {}", self.max_p99_ratio));
        }
        if !(0.0..=MAX_P99_SLACK_MS).contains(&self.p99_slack_ms) {
            return refuse(format!("'p99_slack_ms' must be in [0, {MAX_P99_SLACK_MS}], got {}", self.p99_slack_ms));
        }
        if self.serving == Some(self.candidate) {
            return refuse(format!("'serving' and 'candidate' are both version {}", self.candidate));
        }
        if let Some(header) = &self.sticky_header {
            check_header_name(header).or_else(|m| refuse(format!("'sticky_header' {m}")))?;
        }
        if let Some(shadow) = &self.shadow {
            if !(shadow.percent > 0.0 && shadow.percent <= 100.0) {
                return refuse(format!("'shadow.percent' must be in (0, 100], got {}", shadow.percent));
            }
            if !(1..=MAX_REQUESTS).contains(&shadow.requests) {
                return refuse(format!("'shadow.requests' must be in [1, {MAX_REQUESTS}], got {}", shadow.requests));
            }
            if !(1..=MAX_SHADOW_QUEUE).contains(&shadow.queue) {
                return refuse(format!("'shadow.queue' must be in [1, {MAX_SHADOW_QUEUE}], got {}", shadow.queue));
            }
            if shadow.output_tolerances.len() > MAX_OUTPUT_TOLERANCES {
                return refuse(format!(
                    "'shadow.output_tolerances' names {} outputs, more than {MAX_OUTPUT_TOLERANCES}",
                    shadow.output_tolerances.len()
                ));
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

/// The JSON object a plan is read from.
fn fields(parsed: serde_json::Result<Value>) -> Result<serde_json::Map<String, Value>, String> {
    match parsed.map_err(|e| format!("rollout plan: {e}"))? {
        Value::Object(fields) => Ok(fields),
        other => Err(format!("rollout plan: a plan is a JSON object, got {}", kind(&other))),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Whether `name` can be a sticky header: an HTTP field name (RFC 9110
/// `token`), which is also a gRPC metadata key once lower-cased, of at most
/// [`MAX_STICKY_HEADER_BYTES`]; a pseudo-header such as `:authority` is no
/// field a client sets.
///
/// # Errors
/// What is wrong with it, to follow the field's name.
fn check_header_name(name: &str) -> Result<(), String> {
    if name.len() > MAX_STICKY_HEADER_BYTES {
        return Err(format!("is {} bytes long, more than {MAX_STICKY_HEADER_BYTES}", name.len()));
    }
    if name.is_empty() || http::HeaderName::from_bytes(name.as_bytes()).is_err() {
        let shown: String = name.escape_default().collect();
        return Err(format!("must be a header name (letters, digits and !#$%&'*+-.^_`|~), got \"{shown}\""));
    }
    Ok(())
}

/// The plan a model's `rollout` parameter declares (`json`, the plan every
/// new version of the model goes through: without `candidate` or
/// `serving`, [`Plan::declared`]), checked as far as it can be before the
/// versions are known.
///
/// # Errors
/// A message naming the parameter for a plan that does not parse.
pub fn declared_plan(json: Option<&str>) -> Result<Option<&str>, String> {
    let Some(json) = json else { return Ok(None) };
    Plan::declared(json, 2, 1).map_err(|e| format!("parameter 'rollout': {e}"))?;
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
            (r#"[100]"#, "a plan is a JSON object, got an array"),
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
            (r#"{"candidate": 2, "max_p99_ratio": 0.5}"#, "'max_p99_ratio' must be in [1, 1000], got 0.5"),
            (r#"{"candidate": 2, "serving": 2}"#, "both version 2"),
            (r#"{"candidate": 2, "min_requests": 0}"#, "'min_requests' must be in [1, 1000000000], got 0"),
            (r#"{"candidate": 2, "shadow": {"percent": 0}}"#, "'shadow.percent' must be in (0, 100]"),
            (r#"{"candidate": 2, "shadow": {"tolerance": -1}}"#, "must be 0 or more"),
            (r#"{"candidate": 2, "shadow": {"sample": 5}}"#, "unknown field `sample`"),
        ] {
            let e = Plan::parse(json.as_bytes()).unwrap_err();
            assert!(e.contains(words), "{json}: {e}");
        }
    }

    #[test]
    fn every_number_is_bounded_and_every_shape_checked() {
        let steps = format!(
            "[{}]",
            (1..=101).map(|s| (f64::from(s) * 100.0 / 101.0).to_string()).collect::<Vec<_>>().join(",")
        );
        let long = "x".repeat(MAX_STICKY_HEADER_BYTES + 1);
        for (json, words) in [
            (r#"{"candidate": 2, "dwell_secs": 1e20}"#.to_owned(), "'dwell_secs' must be in [0, 2592000]"),
            (r#"{"candidate": 2, "dwell_secs": -1}"#.to_owned(), "'dwell_secs' must be in"),
            (r#"{"candidate": 2, "p99_slack_ms": 1e308}"#.to_owned(), "'p99_slack_ms' must be in [0, 3600000]"),
            (r#"{"candidate": 2, "max_p99_ratio": 1e300}"#.to_owned(), "'max_p99_ratio' must be in [1, 1000]"),
            (r#"{"candidate": 2, "min_requests": 18446744073709551615}"#.to_owned(), "'min_requests' must be in"),
            (format!(r#"{{"candidate": 2, "steps": {steps}}}"#), "more than 100"),
            (r#"{"candidate": 2, "shadow": []}"#.to_owned(), "'shadow' must be a JSON object, got []"),
            (r#"{"candidate": 2, "shadow": 5}"#.to_owned(), "'shadow' must be a JSON object"),
            (r#"[2]"#.to_owned(), "a plan is a JSON object, got an array"),
            (r#"{"candidate": 2, "shadow": {"queue": 100000}}"#.to_owned(), "'shadow.queue' must be in [1, 10000]"),
            (r#"{"candidate": 2, "shadow": {"requests": 0}}"#.to_owned(), "'shadow.requests' must be in"),
            (r#"{"candidate": 2, "sticky_header": "bad header\n"}"#.to_owned(), r#"got "bad header\n""#),
            (r#"{"candidate": 2, "sticky_header": ":authority"}"#.to_owned(), "'sticky_header' must be a header name"),
            (r#"{"candidate": 2, "sticky_header": ""}"#.to_owned(), "'sticky_header' must be a header name"),
            (format!(r#"{{"candidate": 2, "sticky_header": "{long}"}}"#), "more than 256"),
        ] {
            let e = Plan::parse(json.as_bytes()).unwrap_err();
            assert!(e.contains(words), "{json}: {e}");
        }
        let edges = r#"{"candidate": 2, "dwell_secs": 2592000, "p99_slack_ms": 3600000, "max_p99_ratio": 1000,
            "min_requests": 1000000000, "sticky_header": "X-Client-Id", "shadow": {"queue": 10000}}"#;
        Plan::parse(edges.as_bytes()).unwrap();
        assert_eq!(Plan::declared(r#"{"shadow": null}"#, 2, 1).unwrap().shadow, None);
    }
}

//! The status page (`GET /`): what a person opening the server in a
//! browser wants to see. Every model version with its state, reason,
//! platform and resident bytes; per version the request and failure rates
//! and p50 / p99 latency over the last minute, and the queue depth now; the
//! residency budget; per generative model version its tokens per second
//! over the last minute, its sequences running and waiting and its KV
//! cache's use now; each rollout's phase, step, candidate share and the
//! figures its rules judge; in explicit mode, buttons that load and unload
//! models through the repository API.
//!
//! It reads the counters the metrics already keep ([`LiveCounts`]),
//! sampled every [`SAMPLE_EVERY`] by a background task, so a page view
//! costs the inference path nothing.
//!
//! The page obeys `--http-restricted-api` as the routes whose data it shows
//! do: without the header of `model-repository` it shows no model, state,
//! reason, resident size or rollout (the repository index's and the
//! rollout routes' data); without that of `statistics`, no rate, latency or
//! queue; without that of `health`, not whether the server is ready. Each
//! section left out says which group's header shows it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use askama::Template;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Html;
use parking_lot::Mutex;

use super::Service;
use super::restrictions::Api;
use crate::lifecycle::ControlMode;
use crate::lifecycle::RolloutStatus;
use crate::metrics::{GenerationCounts, LiveCounts};
use crate::registry::RepositoryState;
use crate::residency::human;

/// How often the counters are sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// The window rates and latencies are computed over.
const WINDOW: Duration = Duration::from_secs(60);

/// The counters of every READY version, keyed by (model, version).
type Counts = HashMap<(String, u64), LiveCounts>;

/// Samples of the counters over the last [`WINDOW`], oldest first.
#[derive(Default)]
pub struct Sampler {
    history: Mutex<VecDeque<(Instant, Counts)>>,
}

impl Sampler {
    /// Takes a sample of every READY version's counters now, and drops
    /// those older than the window.
    pub fn sample(&self, service: &Service) {
        let now = Instant::now();
        let counts = counts(service);
        let mut history = self.history.lock();
        history.push_back((now, counts));
        while history.front().is_some_and(|(at, _)| now.duration_since(*at) > WINDOW) {
            history.pop_front();
        }
    }

    /// The oldest sample within the window.
    fn oldest(&self) -> Option<(Instant, Counts)> {
        self.history.lock().front().cloned()
    }
}

/// Samples `service`'s counters every [`SAMPLE_EVERY`] until the process
/// ends.
pub async fn sample_forever(service: Arc<Service>) {
    let mut ticks = tokio::time::interval(SAMPLE_EVERY);
    loop {
        ticks.tick().await;
        service.status.sample(&service);
    }
}

fn counts(service: &Service) -> Counts {
    let models = service.registry().ready_models(None);
    models.iter().map(|m| ((m.name.clone(), m.version), m.live_counts())).collect()
}

/// One model version on the page, every figure already formatted.
struct Row {
    name: String,
    version: String,
    state: &'static str,
    reason: String,
    platform: String,
    resident: String,
    requests_per_second: String,
    failures_per_second: String,
    p50_ms: String,
    p99_ms: String,
    queue: String,
}

/// One generative model version on the page: its decode loop's figures.
struct GenerationRow {
    name: String,
    version: u64,
    tokens_per_second: String,
    running: i64,
    waiting: i64,
    cache_percent: String,
}

impl GenerationRow {
    /// `now`'s figures, with the token rate since `before`, `seconds` ago.
    fn of(key: &(String, u64), now: &GenerationCounts, before: Option<&LiveCounts>, seconds: f64) -> GenerationRow {
        let earlier = before.and_then(|b| b.generation).map_or(0, |g| g.tokens);
        let rate = if seconds >= 1.0 {
            format!("{:.1}", now.tokens.saturating_sub(earlier) as f64 / seconds)
        } else {
            "—".to_owned()
        };
        GenerationRow {
            name: key.0.clone(),
            version: key.1,
            tokens_per_second: rate,
            running: now.running,
            waiting: now.waiting,
            cache_percent: format!("{:.1}", now.cache_usage * 100.0),
        }
    }
}

/// One model's rollout on the page, every figure already formatted.
struct RolloutRow {
    model: String,
    versions: String,
    phase: &'static str,
    step: String,
    percent: String,
    candidate: String,
    serving: String,
    p99_ratio: String,
    reason: String,
}

impl RolloutRow {
    fn of(r: &RolloutStatus) -> RolloutRow {
        let side = |f: &crate::lifecycle::Figures| {
            format!("{} requests, {} failed, p99 {:.2} ms", f.requests, f.failures, f.p99_us as f64 / 1000.0)
        };
        RolloutRow {
            model: r.model.clone(),
            versions: format!("{} → {}", r.serving, r.candidate),
            phase: r.phase.as_str(),
            step: format!("{} of {}", r.step, r.steps),
            percent: format!("{}", r.percent),
            candidate: match &r.shadow {
                Some(s) if r.phase == crate::lifecycle::Phase::Shadow => {
                    format!("shadow: {} compared, {} differed, {} dropped", s.compared, s.disagreed, s.dropped)
                }
                _ => side(&r.candidate_window),
            },
            serving: side(&r.serving_window),
            p99_ratio: r.p99_ratio.map_or_else(|| "—".to_owned(), |x| format!("{x:.2}")),
            reason: r.reason.clone(),
        }
    }
}

/// What a page view may show: the API groups whose data it shows that the
/// request passes the restrictions of.
#[derive(Clone, Copy)]
struct Shown {
    /// Models, states, reasons, resident sizes, rollouts, the buttons.
    repository: bool,
    /// Rates, latencies, queue depths.
    statistics: bool,
    /// Whether the server is ready.
    health: bool,
}

#[derive(Template)]
#[template(path = "status.html")]
struct Page {
    version: &'static str,
    shown: Shown,
    /// The headers that show what is left out, by what they show.
    hidden: Vec<String>,
    ready: bool,
    mode: String,
    explicit: bool,
    window_s: u64,
    rows: Vec<Row>,
    generation: Vec<GenerationRow>,
    rollouts: Vec<RolloutRow>,
    resident: String,
    budget: String,
}

/// `GET /`: the status page, showing what `headers` pass the restrictions
/// of.
pub async fn page(State(service): State<Arc<Service>>, headers: HeaderMap) -> Html<String> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let restrictions = &service.http_restrictions;
    let mut hidden = Vec::new();
    let mut allowed = |api: Api, what: &str| match restrictions.check(api, header) {
        Ok(()) => true,
        Err(missing) => {
            hidden.push(format!("{what}: the '{}' API is restricted; send its header '{missing}'", api.name()));
            false
        }
    };
    let shown = Shown {
        repository: allowed(Api::ModelRepository, "models, their states and rollouts"),
        statistics: allowed(Api::Statistics, "request rates, latencies and queues"),
        health: allowed(Api::Health, "readiness"),
    };
    let page = build(&service, shown, hidden);
    Html(page.render().unwrap_or_else(|e| format!("the status page failed to render: {e}")))
}

fn build(service: &Service, shown: Shown, hidden: Vec<String>) -> Page {
    let now = counts(service);
    let (since, before) = service.status.oldest().unwrap_or_else(|| (Instant::now(), Counts::new()));
    let seconds = since.elapsed().as_secs_f64();
    let models: HashMap<(String, u64), _> =
        service.registry().ready_models(None).into_iter().map(|m| ((m.name.clone(), m.version), m)).collect();
    let dash = || "—".to_owned();
    let mut total = 0;
    let index = if shown.repository { service.repository_index(false) } else { Vec::new() };
    let rows = index
        .into_iter()
        .map(|entry| {
            let key = (entry.name.clone(), entry.version.parse().unwrap_or(0));
            let model = models.get(&key).filter(|_| entry.state == RepositoryState::Ready);
            total += if model.is_some() { entry.resident_bytes } else { 0 };
            let window = model.and_then(|_| Some((now.get(&key)?, before.get(&key))));
            let (rates, latency) = match window {
                Some((now, before)) if seconds >= 1.0 => {
                    let zero = LiveCounts::default();
                    let before = before.unwrap_or(&zero);
                    let rate = |n: u64, b: u64| format!("{:.1}", n.saturating_sub(b) as f64 / seconds);
                    let rates = (rate(now.success, before.success), rate(now.failure, before.failure));
                    (Some(rates), Some(percentiles(now, before)))
                }
                _ => (None, None),
            };
            let (requests, failures) = rates.unwrap_or_else(|| (dash(), dash()));
            let (p50, p99) = latency.flatten().unwrap_or_else(|| (dash(), dash()));
            Row {
                name: entry.name,
                version: if entry.version.is_empty() { dash() } else { entry.version },
                state: entry.state.as_str(),
                reason: entry.reason,
                platform: model.map_or_else(dash, |m| m.platform().to_owned()),
                resident: if model.is_some() { human(entry.resident_bytes) } else { dash() },
                requests_per_second: requests,
                failures_per_second: failures,
                p50_ms: p50,
                p99_ms: p99,
                queue: now.get(&key).map_or_else(dash, |c| c.pending.to_string()),
            }
        })
        .collect();
    let mut generation: Vec<GenerationRow> = if shown.statistics && shown.repository {
        let of = |(key, c): (&(String, u64), &LiveCounts)| {
            Some(GenerationRow::of(key, c.generation.as_ref()?, before.get(key), seconds))
        };
        now.iter().filter_map(of).collect()
    } else {
        Vec::new()
    };
    generation.sort_by(|a, b| (&a.name, a.version).cmp(&(&b.name, b.version)));
    let budget = service.lifecycle.limits().budget.bytes;
    let rollouts = if shown.repository { service.lifecycle.rollouts() } else { Vec::new() };
    Page {
        version: env!("CARGO_PKG_VERSION"),
        shown,
        hidden,
        ready: shown.health && service.is_ready(),
        mode: service.lifecycle.mode().to_string(),
        explicit: service.lifecycle.mode() == ControlMode::Explicit,
        window_s: seconds.round() as u64,
        rows,
        generation,
        rollouts: rollouts.iter().map(RolloutRow::of).collect(),
        resident: human(total),
        budget: budget.map_or_else(|| "no --model-memory-budget".to_owned(), human),
    }
}

/// The p50 and p99 latency in milliseconds of the requests between two
/// readings of the latency histogram, each interpolated within its bucket;
/// `None` when no request finished in between.
fn percentiles(now: &LiveCounts, before: &LiveCounts) -> Option<(String, String)> {
    let total = (now.success + now.failure).saturating_sub(before.success + before.failure);
    if total == 0 {
        return None;
    }
    let earlier = |i: usize| before.latency.get(i).map_or(0, |(_, c)| *c);
    let at = |q: f64| {
        let target = q * total as f64;
        let mut lower = (0.0, 0u64);
        for (i, &(bound, cumulative)) in now.latency.iter().enumerate() {
            let count = cumulative.saturating_sub(earlier(i));
            if count as f64 >= target {
                let within = (target - lower.1 as f64) / (count - lower.1).max(1) as f64;
                return format!("{:.2}", (lower.0 + within * (bound - lower.0)) * 1000.0);
            }
            lower = (bound, count);
        }
        format!("> {:.0}", lower.0 * 1000.0)
    };
    Some((at(0.50), at(0.99)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(success: u64, latency: &[(f64, u64)]) -> LiveCounts {
        LiveCounts { success, failure: 0, pending: 0, latency: latency.to_vec(), generation: None }
    }

    #[test]
    fn percentiles_come_from_the_requests_between_two_readings() {
        let before = counts(10, &[(0.001, 10), (0.002, 10), (0.004, 10)]);
        // 100 more requests: 50 under 1 ms, 49 between 1 and 2 ms, 1 between 2 and 4 ms.
        let now = counts(110, &[(0.001, 60), (0.002, 109), (0.004, 110)]);
        let (p50, p99) = percentiles(&now, &before).unwrap();
        assert_eq!(p50, "1.00");
        assert_eq!(p99, "2.00");
        assert_eq!(percentiles(&before, &before), None, "nothing happened in between");
        let slow = counts(111, &[(0.001, 10), (0.002, 10), (0.004, 10)]);
        assert_eq!(percentiles(&slow, &before).unwrap().1, "> 4");
    }
}

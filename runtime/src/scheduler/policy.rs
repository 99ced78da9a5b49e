//! The scheduling policy of one model, read from `config.pbtxt`
//! (`dynamic_batching`, Triton's model configuration), and the per-request
//! options (`priority`, `timeout`) of the KServe v2 request `parameters`.

use std::time::Duration;

use super::ragged::BatchLayout;
use crate::config::ModelConfig;
use crate::config::proto::model_config::SchedulingChoice;
use crate::config::proto::{ModelDynamicBatching, ModelQueuePolicy, model_queue_policy::TimeoutAction};

/// What happens to a request whose queue timeout expires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnTimeout {
    /// It is removed and answered 503 (`REJECT`).
    Reject,
    /// It stays queued, behind the requests of its priority level that have
    /// not timed out (`DELAY`).
    Delay,
}

/// Triton's `ModelQueuePolicy` for one priority level.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuePolicy {
    /// `timeout_action`.
    pub on_timeout: OnTimeout,
    /// `default_timeout_microseconds`; `None` when 0 (no timeout).
    pub default_timeout: Option<Duration>,
    /// `allow_timeout_override`: a request's `timeout` parameter may shorten
    /// the default (never lengthen it).
    pub allow_timeout_override: bool,
    /// `max_queue_size`: requests queued at this level; 0 = unbounded.
    pub max_queue_size: usize,
}

impl QueuePolicy {
    /// Unbounded, no timeout: Triton's default.
    pub const UNBOUNDED: QueuePolicy = QueuePolicy {
        on_timeout: OnTimeout::Reject,
        default_timeout: None,
        allow_timeout_override: false,
        max_queue_size: 0,
    };

    fn from_config(p: &ModelQueuePolicy) -> QueuePolicy {
        QueuePolicy {
            on_timeout: if p.timeout_action() == TimeoutAction::Delay { OnTimeout::Delay } else { OnTimeout::Reject },
            default_timeout: (p.default_timeout_microseconds > 0)
                .then(|| Duration::from_micros(p.default_timeout_microseconds)),
            allow_timeout_override: p.allow_timeout_override,
            max_queue_size: p.max_queue_size as usize,
        }
    }

    /// The queue timeout of a request that asks for `requested` (the v2
    /// `timeout` parameter, in microseconds; 0 or absent = none).
    pub fn timeout(&self, requested: Option<u64>) -> Option<Duration> {
        let requested = requested.filter(|&us| us > 0).map(Duration::from_micros);
        match (self.allow_timeout_override, requested, self.default_timeout) {
            (true, Some(r), Some(d)) => Some(r.min(d)),
            (true, Some(r), None) => Some(r),
            _ => self.default_timeout,
        }
    }
}

/// How a model's requests are queued and grouped into executions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Whether requests carry a leading batch dimension
    /// (`max_batch_size` > 0).
    pub batch_dimension: bool,
    /// Whether requests are combined (`dynamic_batching` is present).
    pub dynamic_batching: bool,
    /// `max_batch_size`: the most rows in one execution (1 when the model
    /// does not batch).
    pub max_batch_size: usize,
    /// `preferred_batch_size`, ascending; empty means `max_batch_size`.
    pub preferred_batch_sizes: Vec<usize>,
    /// `max_queue_delay_microseconds`: how long the oldest request may wait
    /// for a fuller batch.
    pub max_queue_delay: Duration,
    /// `preserve_ordering`: responses are released in arrival order.
    pub preserve_ordering: bool,
    /// The queue policy of each priority level; index 0 is level 1, the
    /// highest.
    pub levels: Vec<QueuePolicy>,
    /// `default_priority_level`, as an index into `levels`.
    pub default_level: usize,
    /// Ragged inputs, batch inputs and batch outputs (`allow_ragged_batch`,
    /// `batch_input`, `batch_output`); plain batching without them.
    pub layout: BatchLayout,
}

impl Policy {
    /// Whether a request that finds the queue empty runs at once, alone:
    /// without dynamic batching, or with it but neither a delay to wait
    /// for more requests nor a preferred batch size to fill.
    pub fn runs_a_lone_request_at_once(&self) -> bool {
        !self.dynamic_batching || (self.max_queue_delay.is_zero() && self.preferred_batch_sizes.is_empty())
    }

    /// The policy `config` declares. Without `dynamic_batching`, each
    /// request runs on its own, from one unbounded queue.
    ///
    /// # Errors
    /// A message naming the field: `dynamic_batching` on a model with
    /// `max_batch_size: 0`, a `preferred_batch_size` outside
    /// 1..=`max_batch_size`, a priority level outside 1..=`priority_levels`,
    /// or a `batch_input` / `batch_output` as [`BatchLayout::from_config`]
    /// refuses it.
    pub fn from_config(config: &ModelConfig) -> Result<Policy, String> {
        let layout = BatchLayout::from_config(config)?;
        let max_batch_size = usize::try_from(config.max_batch_size).unwrap_or(0).max(1);
        let db = match &config.scheduling_choice {
            Some(SchedulingChoice::DynamicBatching(db)) => db,
            Some(SchedulingChoice::SequenceBatching(_)) => {
                return Err("sequence_batching is scheduled by the sequence batcher, not this policy".into());
            }
            Some(SchedulingChoice::EnsembleScheduling(_)) => {
                return Err("ensemble_scheduling is not supported; compose models in a plugin instead".into());
            }
            None => {
                return Ok(Policy {
                    batch_dimension: config.max_batch_size > 0,
                    dynamic_batching: false,
                    max_batch_size,
                    preferred_batch_sizes: Vec::new(),
                    max_queue_delay: Duration::ZERO,
                    preserve_ordering: false,
                    levels: vec![QueuePolicy::UNBOUNDED],
                    default_level: 0,
                    layout,
                });
            }
        };
        if config.max_batch_size <= 0 {
            return Err("dynamic_batching needs max_batch_size > 0 (the model must accept a batch dimension)".into());
        }
        let mut preferred = Vec::new();
        for &p in &db.preferred_batch_size {
            match usize::try_from(p) {
                Ok(p) if (1..=max_batch_size).contains(&p) => preferred.push(p),
                _ => {
                    return Err(format!(
                        "preferred_batch_size {p} is not within 1..={max_batch_size} (max_batch_size)"
                    ));
                }
            }
        }
        preferred.sort_unstable();
        preferred.dedup();
        let (levels, default_level) = levels(db)?;
        Ok(Policy {
            batch_dimension: true,
            dynamic_batching: true,
            max_batch_size,
            preferred_batch_sizes: preferred,
            max_queue_delay: Duration::from_micros(db.max_queue_delay_microseconds),
            preserve_ordering: db.preserve_ordering,
            levels,
            default_level,
            layout,
        })
    }

    /// The level index a request's `priority` parameter selects; 0 or
    /// absent means `default_priority_level`. A model with one level
    /// ignores the priority.
    ///
    /// # Errors
    /// A message when the priority is above `priority_levels`.
    pub fn level(&self, priority: Option<u64>) -> Result<usize, String> {
        let count = self.levels.len();
        match priority {
            None | Some(0) => Ok(self.default_level),
            _ if count == 1 => Ok(0),
            Some(p) if p <= count as u64 => Ok(p as usize - 1),
            Some(p) => {
                Err(format!("priority {p} is not a priority level of this model (1 = highest to {count} = lowest)"))
            }
        }
    }
}

/// The most `priority_levels` a model may have: each level is a queue that
/// every batching decision looks at.
pub const MAX_PRIORITY_LEVELS: u64 = 256;

fn levels(db: &ModelDynamicBatching) -> Result<(Vec<QueuePolicy>, usize), String> {
    let default = db.default_queue_policy.as_ref().map_or(QueuePolicy::UNBOUNDED, QueuePolicy::from_config);
    if db.priority_levels > MAX_PRIORITY_LEVELS {
        return Err(format!("priority_levels is {}; Plinth allows at most {MAX_PRIORITY_LEVELS}", db.priority_levels));
    }
    let count = db.priority_levels.max(1);
    let default_level = match (db.priority_levels, db.default_priority_level) {
        (0, 0) => 1,
        (0, l) => return Err(format!("default_priority_level {l} is set, but priority_levels is not")),
        (_, l) if (1..=db.priority_levels).contains(&l) => l,
        (n, l) => return Err(format!("default_priority_level must be within 1..={n} (priority_levels), got {l}")),
    };
    let mut levels = vec![default; count as usize];
    for (&level, p) in &db.priority_queue_policy {
        if !(1..=count).contains(&level) {
            return Err(format!("priority_queue_policy names level {level}, outside 1..={count} (priority_levels)"));
        }
        levels[level as usize - 1] = QueuePolicy::from_config(p);
    }
    Ok((levels, default_level as usize - 1))
}

/// What one request carries besides its tensors: its scheduling options,
/// from the KServe v2 request `parameters` (Triton's names), its id and,
/// when it is traced, the span its model's span goes under.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestOptions {
    /// `priority`: 1 is the highest level; 0 or absent = the default level.
    pub priority: Option<u64>,
    /// `timeout`: queue timeout in microseconds, if the model allows
    /// overriding it.
    pub timeout_us: Option<u64>,
    /// `sequence_id`, `sequence_start` and `sequence_end`, for a model with
    /// `sequence_batching` (or an ensemble whose steps have it).
    pub sequence: Option<super::sequence::SequenceRequest>,
    /// The client's request `id`, for traces (an ensemble's steps carry
    /// their request's, as in Triton).
    pub request_id: Option<String>,
    /// The span of whatever sends this request (the HTTP or gRPC request,
    /// an ensemble, a plugin call), when it is traced.
    pub trace: Option<crate::trace::Span>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(text: &str) -> Result<Policy, String> {
        Policy::from_config(&crate::config::parse(text).unwrap())
    }

    #[test]
    fn without_dynamic_batching_requests_run_alone() {
        let p = policy("max_batch_size: 8").unwrap();
        assert!(!p.dynamic_batching);
        assert_eq!(p.levels, vec![QueuePolicy::UNBOUNDED]);
    }

    #[test]
    fn dynamic_batching_fields_are_read() {
        let p = policy(
            "max_batch_size: 8
             dynamic_batching {
               preferred_batch_size: [ 8, 4 ]
               max_queue_delay_microseconds: 500
               priority_levels: 2
               default_priority_level: 2
               default_queue_policy { max_queue_size: 4 default_timeout_microseconds: 1000 allow_timeout_override: true }
               priority_queue_policy { key: 1 value: { timeout_action: DELAY } }
             }",
        )
        .unwrap();
        assert_eq!(p.preferred_batch_sizes, vec![4, 8]);
        assert_eq!(p.max_queue_delay, Duration::from_micros(500));
        assert_eq!(p.default_level, 1);
        assert_eq!(p.levels[1].max_queue_size, 4);
        assert_eq!(p.levels[0].on_timeout, OnTimeout::Delay);
        assert_eq!(p.level(Some(1)), Ok(0));
        assert_eq!(p.level(None), Ok(1));
        assert!(p.level(Some(3)).unwrap_err().contains("priority 3"));
        assert_eq!(p.levels[1].timeout(Some(200)), Some(Duration::from_micros(200)));
        assert_eq!(p.levels[1].timeout(Some(5000)), Some(Duration::from_micros(1000)));
        assert_eq!(p.levels[0].timeout(Some(200)), None);
    }

    #[test]
    fn inconsistent_batching_configs_are_refused() {
        assert!(policy("dynamic_batching {}").unwrap_err().contains("max_batch_size > 0"));
        let err = policy("max_batch_size: 4 dynamic_batching { preferred_batch_size: 8 }").unwrap_err();
        assert!(err.contains("preferred_batch_size 8"), "{err}");
        let err = policy("max_batch_size: 4 dynamic_batching { priority_levels: 2 default_priority_level: 3 }");
        assert!(err.unwrap_err().contains("default_priority_level"));
        let err =
            policy("max_batch_size: 4 dynamic_batching { priority_levels: 4294967295 default_priority_level: 1 }");
        assert!(err.unwrap_err().contains("at most 256"));
    }
}

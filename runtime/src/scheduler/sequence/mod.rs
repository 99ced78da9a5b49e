//! The sequence batcher of a model with `sequence_batching`: every request
//! names its sequence (correlation id); a sequence is bound to one batch
//! slot of one instance from its START to its END, its requests run one at
//! a time and in order, and the host fills in the control inputs and
//! carries the implicit state between them (Triton's
//! `docs/user_guide/architecture.md` §stateful models,
//! `docs/protocol/extension_sequence.md`).
//!
//! One worker thread per instance forms executions from the sequences bound
//! to it ([`Strategy`]); new sequences wait in a backlog while every slot
//! is taken. A sequence ends with its END request, after
//! `max_sequence_idle_microseconds` without a request, or when a request of
//! it is cancelled (its client went away): its slot and state are freed
//! and the next backlogged sequence takes the slot.

pub mod policy;
mod rows;
mod worker;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};
use tokio::sync::oneshot;

use self::policy::{SequencePolicy, Strategy};
use self::rows::{RowAnswer, RowInputs};
use super::Timing;
use super::rate_limiter::{self, Registration};
use crate::backend::{Backend, BackendError};
use crate::error::Error;
use crate::metrics::{Compute, FailureReason, ModelMetrics, SequenceEnd};
use crate::protocol::request::SequenceId;
use crate::tensor::Tensor;

/// A sequence's correlation id, the v2 `sequence_id` parameter: an unsigned
/// integer or a string (Triton's `docs/protocol/extension_sequence.md`).
/// 0 and the empty string name no sequence.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CorrelationId {
    /// An integer id.
    Uint(u64),
    /// A string id.
    Text(String),
    /// An id the host opened for one of its own requests (a `/predict` on a
    /// sequence model); no client can name it. A CORRID control reads it as
    /// `2^63 + n` (integer) or `plinth-N` (string).
    Host(u64),
}

impl From<SequenceId> for CorrelationId {
    fn from(id: SequenceId) -> CorrelationId {
        match id {
            SequenceId::Uint(n) => CorrelationId::Uint(n),
            SequenceId::Text(s) => CorrelationId::Text(s),
        }
    }
}

/// Where host ids start in an integer CORRID control.
const HOST_BASE: u64 = 1 << 63;

impl CorrelationId {
    /// Whether the id names no sequence (0 or "").
    pub fn is_none(&self) -> bool {
        match self {
            CorrelationId::Uint(n) => *n == 0,
            CorrelationId::Text(s) => s.is_empty(),
            CorrelationId::Host(_) => false,
        }
    }

    /// A new host id, never handed out before in this process.
    pub fn new_host() -> CorrelationId {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        CorrelationId::Host(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }

    /// The id as an integer CORRID element, if it has one.
    fn as_integer(&self) -> Option<u64> {
        match self {
            CorrelationId::Uint(n) => Some(*n),
            CorrelationId::Host(n) => Some(HOST_BASE | n),
            CorrelationId::Text(_) => None,
        }
    }
}

impl fmt::Display for CorrelationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CorrelationId::Uint(n) => write!(f, "{n}"),
            CorrelationId::Text(s) => f.write_str(s),
            CorrelationId::Host(n) => write!(f, "plinth-{n}"),
        }
    }
}

/// A number naming who opened a sequence (a gRPC stream, a `/predict`
/// request), so that only its opener ends it when done with it.
pub type Owner = u64;

/// A new [`Owner`], never handed out before in this process.
pub fn new_owner() -> Owner {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The sequence parameters of one request: `sequence_id`, `sequence_start`
/// and `sequence_end`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequenceRequest {
    /// `sequence_id`.
    pub id: CorrelationId,
    /// `sequence_start`: the sequence's first request.
    pub start: bool,
    /// `sequence_end`: its last request.
    pub end: bool,
    /// Who sends the request, when a stream or the host does; a START
    /// makes it the sequence's owner.
    pub owner: Option<Owner>,
}

/// The answer a worker sends back to a queued request.
type Reply = Result<(Vec<Tensor>, Timing), Error>;

/// One row of an execution: a sequence's request, or padding.
struct Row {
    /// The sequence and its serial; `None` for padding.
    sequence: Option<(CorrelationId, u64)>,
    /// The request, its inputs moved into `inputs`; `None` for padding.
    job: Option<Job>,
    inputs: RowInputs,
}

/// A queued request of a sequence.
struct Job {
    id: u64,
    inputs: Vec<Tensor>,
    start: bool,
    end: bool,
    enqueued: Instant,
    reply: oneshot::Sender<Reply>,
}

/// One open sequence.
struct Sequence {
    /// Tells this sequence from a later one with the same correlation id.
    serial: u64,
    /// Its (instance, slot), or `None` while it waits in the backlog.
    slot: Option<(usize, usize)>,
    /// Its requests, in arrival order, not yet running.
    queue: VecDeque<Job>,
    /// Its implicit state after its last request; `None` before its first
    /// (the initial state is used). A failed request leaves it as it was.
    states: Option<Vec<Tensor>>,
    /// Whether its last request so far did not end it.
    open: bool,
    /// Whether a request of it is running.
    running: bool,
    /// When its last request arrived or finished.
    last_seen: Instant,
    /// Who opened it (its last START's sender), if a stream or the host.
    owner: Option<Owner>,
    /// Its owner is done with it: it ends once nothing of it is queued or
    /// running.
    closing: bool,
}

/// Correlation ids whose sequences ended recently other than by their END
/// request, so that a late request is told why; the oldest are forgotten.
const REMEMBERED: usize = 1024;

struct State {
    sequences: HashMap<CorrelationId, Sequence>,
    /// `slots[instance][slot]`: the sequence holding the slot.
    slots: Vec<Vec<Option<CorrelationId>>>,
    /// Sequences waiting for a slot, oldest first.
    backlog: VecDeque<CorrelationId>,
    /// Sequences ended by idleness or cancellation, newest last.
    released: VecDeque<(CorrelationId, SequenceEnd)>,
    next_serial: u64,
    next_job: u64,
    closed: bool,
}

struct Shared {
    model: String,
    policy: SequencePolicy,
    /// The initial state tensors, in the policy's order.
    initial: Vec<Tensor>,
    state: Mutex<State>,
    /// Wakes the workers: a request arrived, a slot changed hands, or the
    /// scheduler closed.
    wake: Condvar,
    metrics: ModelMetrics,
    /// With `--rate-limit=execution_count`: the instances' turns.
    limited: Option<Registration>,
}

/// Schedules the requests of one sequence model version onto its
/// instances. Dropping it stops the workers (after the execution they are
/// running).
pub struct SequenceScheduler {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl SequenceScheduler {
    /// Starts one worker thread per instance.
    pub fn start(
        model: &str,
        policy: SequencePolicy,
        instances: Vec<Arc<dyn Backend>>,
        metrics: ModelMetrics,
        limited: Option<Registration>,
    ) -> SequenceScheduler {
        let mut shared = Shared::new(model, policy, instances.len(), metrics);
        shared.limited = limited;
        let shared = Arc::new(shared);
        let workers = super::spawn_workers(&format!("{model}-seq"), instances.len(), {
            let shared = shared.clone();
            move |i| shared.work(i, &*instances[i])
        });
        SequenceScheduler { shared, workers }
    }

    /// Queues `inputs` (already checked against the signature; the control
    /// and state inputs are the host's) as the next request of `sequence`,
    /// and waits for its outputs (state outputs removed). If the caller
    /// goes away first, the whole sequence is cancelled: its slot and state
    /// are freed and its other queued requests fail.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`], with Triton's texts, for correlation id 0
    /// or "", a batch of more than one row, or a request without START for
    /// a sequence that is not open (never started, ended, or released
    /// after `max_sequence_idle_microseconds`, which the message says);
    /// [`Error::InvalidArgument`] or [`Error::Internal`] when the backend
    /// refuses or fails the execution.
    pub async fn submit(
        &self,
        mut inputs: Vec<Tensor>,
        sequence: SequenceRequest,
    ) -> Result<(Vec<Tensor>, Timing), Error> {
        let shared = &*self.shared;
        shared.check_request(&inputs, &sequence)?;
        inputs.sort_by(|a, b| a.name.cmp(&b.name));
        let (reply, answer) = oneshot::channel();
        let (job, serial) = shared.enqueue(&sequence, inputs, reply)?;
        let mut waiting = Waiting { shared, id: Some(sequence.id), serial, job, since: Instant::now() };
        let reply = answer.await;
        waiting.id = None;
        reply.unwrap_or_else(|_| Err(Error::Internal(format!("model '{}' stopped", shared.model))))
    }

    /// Ends sequence `id` for `reason` if `owner` opened it (a gRPC stream
    /// that carried it closed before its END, or the `/predict` request it
    /// belongs to is done): at once if nothing of it is queued or running,
    /// else when that is done. Its slot and state are freed. A sequence
    /// someone else opened since under the same id is left alone.
    pub fn release(&self, id: &CorrelationId, owner: Owner, reason: SequenceEnd) {
        let mut state = self.shared.lock();
        let Some(s) = state.sequences.get_mut(id).filter(|s| s.owner == Some(owner)) else { return };
        if s.queue.is_empty() && !s.running {
            self.shared.end(&mut state, id, reason);
        } else {
            s.closing = true;
        }
    }
}

impl SequenceScheduler {
    /// A warm-up sample's inputs with the control and state tensors added,
    /// each of its rows a sequence of one request from the initial state
    /// (`model_warmup` runs on the instances directly, not through here).
    ///
    /// # Errors
    /// As [`super::ragged::BatchLayout::gather`].
    pub fn warm_up_inputs(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, String> {
        let policy = &self.shared.policy;
        let rows = match inputs.first().and_then(|t| t.shape.first()) {
            Some(&n) if policy.batch_dimension => usize::try_from(n).unwrap_or(1),
            _ => 1,
        };
        rows::warm_up(policy, inputs, rows)
    }
}

impl Drop for SequenceScheduler {
    fn drop(&mut self) {
        {
            // The version is unloaded: its open sequences end, their queued
            // requests fail, and the gauges go back down.
            let mut state = self.shared.lock();
            state.closed = true;
            let open: Vec<CorrelationId> = state.sequences.keys().cloned().collect();
            for id in open {
                self.shared.end(&mut state, &id, SequenceEnd::Cancelled);
            }
        }
        self.shared.wake.notify_all();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

/// A request waiting for its answer. Dropped before the answer (the client
/// went away), it cancels its sequence.
struct Waiting<'a> {
    shared: &'a Shared,
    id: Option<CorrelationId>,
    serial: u64,
    job: u64,
    since: Instant,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let mut state = self.shared.lock();
        let Some(sequence) = state.sequences.get_mut(&id).filter(|s| s.serial == self.serial) else { return };
        if let Some(at) = sequence.queue.iter().position(|j| j.id == self.job) {
            sequence.queue.remove(at);
            self.shared.metrics.pending().dec();
            self.shared.metrics.finished(Err(FailureReason::Canceled), self.since.elapsed());
        }
        tracing::info!(model = %self.shared.model, sequence = %id, "a request was cancelled: the sequence ends");
        self.shared.end(&mut state, &id, SequenceEnd::Cancelled);
    }
}

impl Shared {
    /// The shared state of a model with `instances` instances, no sequence
    /// open yet.
    fn new(model: &str, policy: SequencePolicy, instances: usize, metrics: ModelMetrics) -> Shared {
        let slots = policy.slots_per_instance();
        Shared {
            model: model.to_owned(),
            state: Mutex::new(State {
                sequences: HashMap::new(),
                slots: vec![vec![None; slots]; instances],
                backlog: VecDeque::new(),
                released: VecDeque::new(),
                next_serial: 0,
                next_job: 0,
                closed: false,
            }),
            wake: Condvar::new(),
            initial: policy.states.iter().map(|s| s.initial.clone()).collect(),
            policy,
            metrics,
            limited: None,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    fn check_request(&self, inputs: &[Tensor], sequence: &SequenceRequest) -> Result<(), Error> {
        if sequence.id.is_none() {
            return Err(Error::InvalidArgument(format!(
                "inference request to model '{}' must specify a non-zero or non-empty correlation ID",
                self.model
            )));
        }
        use crate::tensor::DataType;
        let corrid = self.policy.controls.iter().find(|c| c.signal == policy::Signal::CorrelationId);
        match (corrid, &sequence.id) {
            (Some(control), CorrelationId::Text(text)) if control.datatype != DataType::Bytes => {
                return Err(Error::InvalidArgument(format!(
                    "model '{}' takes integer correlation IDs (its CONTROL_SEQUENCE_CORRID input '{}' is {}), got the string '{text}'",
                    self.model, control.name, control.datatype
                )));
            }
            (Some(control), CorrelationId::Uint(n))
                if matches!(control.datatype, DataType::Int32 | DataType::Uint32) && *n > u64::from(u32::MAX) =>
            {
                return Err(Error::InvalidArgument(format!(
                    "model '{}' takes 32-bit correlation IDs (its CONTROL_SEQUENCE_CORRID input '{}' is {}), got {n}",
                    self.model, control.name, control.datatype
                )));
            }
            _ => {}
        }
        if self.policy.batch_dimension && inputs.iter().any(|t| t.shape.first() != Some(&1)) {
            return Err(Error::InvalidArgument(format!(
                "inference request to model '{}' must specify batch-size 1 due to requirements of sequence batcher",
                self.model
            )));
        }
        Ok(())
    }

    /// Queues a request on its sequence, opening the sequence on START;
    /// returns the job's id and the sequence's serial.
    fn enqueue(
        &self,
        sequence: &SequenceRequest,
        inputs: Vec<Tensor>,
        reply: oneshot::Sender<Reply>,
    ) -> Result<(u64, u64), Error> {
        let mut state = self.lock();
        let open = state.sequences.get(&sequence.id).is_some_and(|s| s.open);
        if !open && !sequence.start {
            return Err(self.no_start(&state, &sequence.id));
        }
        if !state.sequences.contains_key(&sequence.id) {
            self.open(&mut state, &sequence.id);
        }
        let s = state.sequences.get_mut(&sequence.id).expect("opened above");
        if sequence.start {
            s.owner = sequence.owner;
            s.closing = false;
        }
        let id = state.next_job;
        state.next_job += 1;
        let job = Job { id, inputs, start: sequence.start, end: sequence.end, enqueued: Instant::now(), reply };
        let s = state.sequences.get_mut(&sequence.id).expect("opened above");
        s.queue.push_back(job);
        s.open = !sequence.end;
        s.last_seen = Instant::now();
        let serial = s.serial;
        self.metrics.pending().inc();
        self.wake.notify_all();
        Ok((id, serial))
    }

    fn no_start(&self, state: &State, id: &CorrelationId) -> Error {
        let why = match state.released.iter().rev().find(|(r, _)| r == id) {
            Some((_, SequenceEnd::Idle)) => format!(
                "; the sequence was released after {} µs without a request (max_sequence_idle_microseconds)",
                self.policy.max_idle.as_micros()
            ),
            Some((_, SequenceEnd::Cancelled)) => {
                "; the sequence was cancelled (a request of it was cancelled or its stream closed)".to_owned()
            }
            _ => String::new(),
        };
        Error::InvalidArgument(format!(
            "inference request for sequence {id} to model '{}' must specify the START flag on the first request of the sequence{why}",
            self.model
        ))
    }

    /// A new sequence, in a free slot (of the instance with the most free
    /// slots) or else in the backlog.
    fn open(&self, state: &mut State, id: &CorrelationId) {
        let serial = state.next_serial;
        state.next_serial += 1;
        let slot = free_slot(&state.slots);
        match slot {
            Some((i, j)) => state.slots[i][j] = Some(id.clone()),
            None => state.backlog.push_back(id.clone()),
        }
        let sequence = Sequence {
            serial,
            slot,
            queue: VecDeque::new(),
            states: None,
            open: true,
            running: false,
            last_seen: Instant::now(),
            owner: None,
            closing: false,
        };
        state.sequences.insert(id.clone(), sequence);
        self.metrics.sequences_active().inc();
    }

    /// Ends sequence `id`: frees its slot for the oldest backlogged
    /// sequence and drops its state; its queued requests fail.
    fn end(&self, state: &mut State, id: &CorrelationId, reason: SequenceEnd) {
        let Some(sequence) = state.sequences.remove(id) else { return };
        self.metrics.sequences_active().dec();
        self.metrics.sequence_ended(reason);
        if reason != SequenceEnd::End {
            state.released.push_back((id.clone(), reason));
            if state.released.len() > REMEMBERED {
                state.released.pop_front();
            }
        }
        for job in sequence.queue {
            self.metrics.pending().dec();
            let _ = job.reply.send(Err(Error::InvalidArgument(format!(
                "sequence {id} of model '{}' ended ({}) before this request ran",
                self.model,
                reason.label()
            ))));
        }
        match sequence.slot {
            Some((i, j)) => {
                state.slots[i][j] = None;
                if let Some(next) = state.backlog.pop_front() {
                    state.slots[i][j] = Some(next.clone());
                    if let Some(s) = state.sequences.get_mut(&next) {
                        s.slot = Some((i, j));
                    }
                }
            }
            None => state.backlog.retain(|b| b != id),
        }
        self.wake.notify_all();
    }

    /// Ends the sequences with nothing queued or running that have been
    /// idle for `max_sequence_idle_microseconds`; returns when the next one
    /// would be.
    fn reap(&self, state: &mut State, now: Instant) -> Option<Instant> {
        let max_idle = self.policy.max_idle;
        // The host's own sequences end with the request they serve, which
        // may wait longer than the idle time between its calls (for a
        // plugin instance, under load).
        let reaped = |id: &CorrelationId, s: &Sequence| {
            s.queue.is_empty() && !s.running && !matches!(id, CorrelationId::Host(_))
        };
        let idle: Vec<CorrelationId> = state
            .sequences
            .iter()
            .filter(|(id, s)| reaped(id, s) && now.duration_since(s.last_seen) >= max_idle)
            .map(|(id, _)| id.clone())
            .collect();
        for id in idle {
            tracing::info!(model = %self.model, sequence = %id, "sequence idle for max_sequence_idle_microseconds: released");
            self.end(state, &id, SequenceEnd::Idle);
        }
        state.sequences.iter().filter(|(id, s)| reaped(id, s)).map(|(_, s)| s.last_seen + max_idle).min()
    }
}

/// A free (instance, slot): on the instance with the most free slots, its
/// lowest free slot, so that sequences spread over the instances.
fn free_slot(slots: &[Vec<Option<CorrelationId>>]) -> Option<(usize, usize)> {
    let (i, free) = slots
        .iter()
        .enumerate()
        .map(|(i, s)| (i, s.iter().filter(|x| x.is_none()).count()))
        .max_by_key(|&(i, free)| (free, std::cmp::Reverse(i)))?;
    if free == 0 {
        return None;
    }
    Some((i, slots[i].iter().position(Option::is_none)?))
}

/// How long a test waits at most for an event that must come.
#[cfg(test)]
const HANG_GUARD: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests;

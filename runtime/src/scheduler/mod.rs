//! The per-model scheduler between the request path and the backend: one
//! queue per priority level, one worker thread per model instance
//! (`instance_group`), and, with `dynamic_batching`, requests combined into
//! batches as Triton's dynamic batcher combines them.
//!
//! A request is queued with a oneshot channel for its answer. While it
//! waits, its own task enforces its queue timeout and, if the client goes
//! away (the task is dropped), takes it out of the queue so that it never
//! runs.
//!
//! A request for a fast model that finds the queue empty and an instance
//! idle runs at once on its own thread instead ([`INLINE_INFER`]): handing
//! it to a worker thread and its answer back cost two thread wake-ups,
//! several times a tiny model's run. A model whose runs take longer never
//! runs there, so it cannot hold up the threads that serve HTTP.

mod batch;
mod ordering;
pub mod policy;
mod queue;
pub(crate) mod ragged;
pub(crate) mod rate_limiter;
pub(crate) mod sequence;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::{Condvar, Mutex, MutexGuard};
use tokio::sync::oneshot;

use self::ordering::Ordering;
use self::policy::{OnTimeout, Policy, RequestOptions};
use self::queue::{Entry, Next, Queue};
use self::rate_limiter::Registration;
use crate::backend::{Backend, BackendError};
use crate::error::{Error, Overload};
use crate::metrics::{Compute, FailureReason, ModelMetrics};
use crate::tensor::Tensor;

/// The answer a worker sends back to a queued request.
type Reply = Result<(Vec<Tensor>, Timing), Error>;

/// The longest a model's executions may take, on average, for a request
/// that finds the queue empty to run on its own thread rather than a
/// worker's (the async runtime's threads are held that long at most).
pub const INLINE_INFER: Duration = Duration::from_micros(100);

/// Where one request's time went inside the scheduler.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// When the execution that ran it began (wall clock, for traces: the
    /// queue ends and the compute phases start here).
    pub started: SystemTime,
    /// Time in the queue.
    pub queue: Duration,
    /// The compute phases of the execution that ran it (shared by its batch).
    pub compute: Compute,
}

impl Default for Timing {
    /// No time spent, at the Unix epoch.
    fn default() -> Timing {
        Timing { started: SystemTime::UNIX_EPOCH, queue: Duration::ZERO, compute: Compute::default() }
    }
}

struct Job {
    inputs: Vec<Tensor>,
    reply: oneshot::Sender<Reply>,
}

struct State {
    queue: Queue<Job>,
    /// Set when the scheduler is dropped: workers exit.
    closed: bool,
}

struct Shared {
    model: String,
    policy: Policy,
    /// One per instance: its backend, locked while it runs.
    slots: Vec<Slot>,
    /// The recent executions' mean backend time, in microseconds (an
    /// exponential moving average; 0 before the first).
    infer_us: std::sync::atomic::AtomicU64,
    state: Mutex<State>,
    /// Wakes workers: a request arrived, or the scheduler closed.
    wake: Condvar,
    /// `preserve_ordering`: releases answers in arrival order.
    ordering: Option<Ordering>,
    metrics: ModelMetrics,
    /// With `--rate-limit=execution_count`: the instances' turns.
    limited: Option<Registration>,
}

/// Schedules the requests of one model version onto its instances.
/// Dropping it stops the workers (after the batch they are running), which
/// drops the instances.
pub struct Scheduler {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Scheduler {
    /// Starts one worker thread per instance; with `limited`, each
    /// execution waits for its instance's turn in the rate limiter.
    pub fn start(
        model: &str,
        policy: Policy,
        instances: Vec<Arc<dyn Backend>>,
        metrics: ModelMetrics,
        limited: Option<Registration>,
    ) -> Scheduler {
        let count = instances.len();
        let shared = Arc::new(Shared {
            model: model.to_owned(),
            slots: instances.into_iter().map(|instance| Slot { instance, running: Mutex::new(()) }).collect(),
            infer_us: std::sync::atomic::AtomicU64::new(0),
            state: Mutex::new(State { queue: Queue::new(policy.levels.len()), closed: false }),
            wake: Condvar::new(),
            ordering: policy.preserve_ordering.then(Ordering::default),
            policy,
            metrics,
            limited,
        });
        let workers = spawn_workers(model, count, {
            let shared = shared.clone();
            move |i| shared.work(i)
        });
        Scheduler { shared, workers }
    }

    /// Queues `inputs` (already checked against the model's signature) and
    /// waits for the outputs: the request's own rows of every output, and
    /// where its time went.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `priority` the model does not have;
    /// [`Error::Overloaded`] when the priority level's queue is full
    /// (`max_queue_size`) or the request's queue timeout expires under
    /// `timeout_action: REJECT`; [`Error::InvalidArgument`] or
    /// [`Error::Internal`] when the backend refuses or fails the batch.
    pub async fn submit(
        &self,
        mut inputs: Vec<Tensor>,
        options: RequestOptions,
    ) -> Result<(Vec<Tensor>, Timing), Error> {
        let shared = &*self.shared;
        let level = shared.policy.level(options.priority).map_err(|m| shared.invalid(m))?;
        let queue_policy = &shared.policy.levels[level];
        inputs.sort_by(|a, b| a.name.cmp(&b.name));
        let rows = batch::rows(&inputs, shared.policy.batch_dimension);
        let inputs = match shared.run_inline(inputs, rows) {
            Ok(answer) => return answer,
            Err(inputs) => inputs,
        };
        let key = shared.policy.layout.key(&inputs);
        let (reply, mut answer) = oneshot::channel();
        let id = {
            let mut state = shared.lock();
            let queued = state.queue.len(level);
            if queue_policy.max_queue_size > 0 && queued >= queue_policy.max_queue_size {
                return Err(Error::Overloaded(Overload::new(format!(
                    "model '{}' is overloaded: its queue at priority level {} is full ({queued} requests, max_queue_size); retry later",
                    shared.model,
                    level + 1
                ))));
            }
            let id = state.queue.push(level, rows, key, Job { inputs, reply });
            shared.metrics.pending().inc();
            shared.wake.notify_one();
            id
        };
        let mut queued = Queued { shared, level, id, since: Instant::now(), stage: Stage::Queued };
        let reply = match queue_policy.timeout(options.timeout_us) {
            None => answer.await,
            Some(timeout) => match tokio::time::timeout(timeout, &mut answer).await {
                Ok(reply) => reply,
                Err(_) => {
                    if queue_policy.on_timeout == OnTimeout::Reject && shared.take_out(level, id) {
                        return Err(Error::Overloaded(Overload::new(format!(
                            "model '{}' is overloaded: the request waited {} µs in the queue (its timeout) without running; retry later",
                            shared.model,
                            timeout.as_micros()
                        ))));
                    }
                    shared.lock().queue.delay(level, id);
                    answer.await
                }
            },
        };
        let reply = reply.unwrap_or_else(|_| Err(Error::Internal(format!("model '{}' stopped", shared.model))));
        queued.finish().await;
        reply
    }

    /// A warm-up sample's `inputs` (one request) as the backend takes them:
    /// unchanged, or for a ragged layout flattened and with the batch inputs
    /// added.
    ///
    /// # Errors
    /// As [`ragged::BatchLayout::gather`].
    pub fn warm_up_inputs(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, String> {
        let layout = &self.shared.policy.layout;
        if layout.is_plain() { Ok(inputs) } else { layout.gather(std::slice::from_ref(&inputs)) }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_all();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

/// A request in the queue. Dropped before it returned (the client went
/// away), it takes the request out of the queue so that it never runs, and
/// counts it as CANCELED.
struct Queued<'a> {
    shared: &'a Shared,
    level: usize,
    id: u64,
    since: Instant,
    stage: Stage,
}

enum Stage {
    /// Queued or running.
    Queued,
    /// Its answer arrived; with `preserve_ordering` it may wait for earlier
    /// requests' answers.
    Answered,
    /// Its answer is on the way to the client.
    Returned,
}

impl Queued<'_> {
    /// Marks the answer as arrived and, with `preserve_ordering`, waits
    /// until every earlier request has its answer too.
    async fn finish(&mut self) {
        self.stage = Stage::Answered;
        if let Some(ordering) = &self.shared.ordering {
            ordering.done(self.id);
            ordering.turn(self.id).await;
        }
        self.stage = Stage::Returned;
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        match self.stage {
            Stage::Returned => {}
            Stage::Answered => self.shared.metrics.finished(Err(FailureReason::Canceled), self.since.elapsed()),
            Stage::Queued => {
                // Not in the queue any more: it timed out (already counted),
                // or it is running and the worker counts it.
                if self.shared.lock().queue.remove(self.level, self.id).is_some() {
                    self.shared.metrics.pending().dec();
                    self.shared.metrics.finished(Err(FailureReason::Canceled), self.since.elapsed());
                }
                if let Some(ordering) = &self.shared.ordering {
                    ordering.done(self.id);
                }
            }
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    fn invalid(&self, message: String) -> Error {
        Error::InvalidArgument(format!("model '{}': {message}", self.model))
    }

    /// Takes an expired request out of the queue; false if a worker has it.
    fn take_out(&self, level: usize, id: u64) -> bool {
        let removed = self.lock().queue.remove(level, id).is_some();
        if removed {
            self.metrics.pending().dec();
        }
        removed
    }

    /// A worker: runs batches on instance `i` until the scheduler closes,
    /// each in its turn when the rate limiter applies.
    fn work(&self, i: usize) {
        let slot = &self.slots[i];
        let turns = self.limited.as_ref().map(|r| (r, i));
        rate_limiter::work(
            turns,
            || self.next_batch(),
            || self.try_next_batch(),
            |batch, waited| {
                self.metrics.rate_limited(waited, batch.len());
                let _running = slot.running.lock();
                self.execute(&*slot.instance, batch);
            },
        );
    }

    /// The next batch if one is ready now (the queue's policy runs it).
    fn try_next_batch(&self) -> Option<Vec<Entry<Job>>> {
        let mut state = self.lock();
        if state.closed {
            return None;
        }
        match state.queue.next(&self.policy, Instant::now()) {
            Next::Run(batch) => {
                self.metrics.pending().sub(batch.len() as i64);
                Some(batch)
            }
            Next::Wait(_) => None,
        }
    }

    /// Runs a request at once on the calling thread when the model is fast
    /// ([`INLINE_INFER`]), its policy runs a lone request at once, nothing
    /// is queued and an instance is idle; gives `inputs` back otherwise.
    fn run_inline(&self, inputs: Vec<Tensor>, rows: usize) -> Result<Reply, Vec<Tensor>> {
        let mean = self.infer_us.load(std::sync::atomic::Ordering::Relaxed);
        let fast = mean > 0 && mean <= INLINE_INFER.as_micros() as u64;
        let limited = self.limited.is_some();
        if !fast || !self.policy.runs_a_lone_request_at_once() || self.ordering.is_some() || limited {
            return Err(inputs);
        }
        let state = self.lock();
        if state.closed || state.queue.total() > 0 {
            return Err(inputs);
        }
        // An idle instance, held until the run is over: a worker that gets a
        // batch meanwhile waits for it.
        let Some((slot, _running)) = self.slots.iter().find_map(|s| Some((s, s.running.try_lock()?))) else {
            return Err(inputs);
        };
        drop(state);
        self.metrics.queued(Duration::ZERO);
        let started = SystemTime::now();
        let answer = self.run_batch(&*slot.instance, vec![inputs], &[rows]).pop();
        let answer = answer.unwrap_or_else(|| Err(Error::Internal(format!("model '{}' gave no answer", self.model))));
        Ok(answer.map(|(outputs, compute)| (outputs, Timing { started, queue: Duration::ZERO, compute })))
    }

    /// Waits for the next batch; `None` once the scheduler is closed.
    fn next_batch(&self) -> Option<Vec<Entry<Job>>> {
        let mut state = self.lock();
        loop {
            if state.closed {
                return None;
            }
            let now = Instant::now();
            match state.queue.next(&self.policy, now) {
                Next::Run(batch) => {
                    if state.queue.total() > 0 {
                        self.wake.notify_one();
                    }
                    self.metrics.pending().sub(batch.len() as i64);
                    return Some(batch);
                }
                Next::Wait(None) => self.wake.wait(&mut state),
                Next::Wait(Some(until)) => {
                    self.wake.wait_for(&mut state, until.saturating_duration_since(now));
                }
            }
        }
    }

    /// Runs one batch and sends each request its rows of the outputs.
    fn execute(&self, instance: &dyn Backend, batch: Vec<Entry<Job>>) {
        let (taken, started) = (Instant::now(), SystemTime::now());
        let rows: Vec<usize> = batch.iter().map(|e| e.rows).collect();
        let mut inputs = Vec::with_capacity(batch.len());
        let mut waiting = Vec::with_capacity(batch.len());
        for entry in batch {
            let queue = taken.duration_since(entry.enqueued);
            self.metrics.queued(queue);
            inputs.push(entry.job.inputs);
            waiting.push((entry.job.reply, entry.enqueued, queue));
        }
        for ((reply, enqueued, queue), answer) in waiting.into_iter().zip(self.run_batch(instance, inputs, &rows)) {
            let answer = answer.map(|(outputs, compute)| (outputs, Timing { started, queue, compute }));
            if reply.send(answer).is_err() {
                // The client went away while its request ran.
                self.metrics.finished(Err(FailureReason::Canceled), enqueued.elapsed());
            }
        }
    }

    /// One answer per request. When the backend refuses the combined input,
    /// each request runs alone, so that only the one at fault fails.
    fn run_batch(
        &self,
        instance: &dyn Backend,
        mut requests: Vec<Vec<Tensor>>,
        rows: &[usize],
    ) -> Vec<Result<(Vec<Tensor>, Compute), Error>> {
        if requests.len() == 1 {
            let inputs = requests.pop().unwrap_or_default();
            return vec![self.run_alone(instance, inputs, rows[0])];
        }
        let layout = &self.policy.layout;
        let started = Instant::now();
        let result = if layout.is_plain() {
            let inputs = batch::concat(&requests);
            self.run_once(instance, inputs, rows.iter().sum(), started.elapsed(), |outputs| batch::split(outputs, rows))
        } else {
            let sources: Vec<_> = requests.iter().map(|r| layout.sources(r)).collect();
            match layout.gather(&requests) {
                Ok(inputs) => self.run_once(instance, inputs, rows.iter().sum(), started.elapsed(), |outputs| {
                    layout.split(outputs, rows, &sources)
                }),
                // Each request alone finds the one at fault.
                Err(m) => Err(Error::InvalidArgument(m)),
            }
        };
        match result {
            Ok((per_request, compute)) => per_request.into_iter().map(|outputs| Ok((outputs, compute))).collect(),
            Err(Error::InvalidArgument(_)) => {
                requests.into_iter().zip(rows).map(|(inputs, &n)| self.run_alone(instance, inputs, n)).collect()
            }
            Err(e) => vec![Err(e); requests.len()],
        }
    }

    /// One request's execution: its inputs as they are, or for a ragged
    /// layout flattened and with the batch inputs added, and its outputs
    /// (batch outputs cut to its shape).
    fn run_alone(
        &self,
        instance: &dyn Backend,
        inputs: Vec<Tensor>,
        rows: usize,
    ) -> Result<(Vec<Tensor>, Compute), Error> {
        let layout = &self.policy.layout;
        let answer = if layout.is_plain() {
            self.run_once(instance, inputs, rows, Duration::ZERO, |outputs| Ok(vec![outputs]))
        } else {
            let started = Instant::now();
            let sources = [layout.sources(&inputs)];
            let inputs = layout
                .gather(std::slice::from_ref(&inputs))
                .map_err(|m| model_error(&self.model, BackendError::InvalidInput(m)))?;
            self.run_once(instance, inputs, rows, started.elapsed(), |outputs| layout.split(outputs, &[rows], &sources))
        };
        answer.map(|(mut one, compute)| (one.pop().unwrap_or_default(), compute))
    }

    /// Folds one execution's backend time into the moving average that
    /// decides which requests may run inline (weight 1/8).
    fn remember(&self, infer: Duration) {
        let sample = (infer.as_micros() as u64).max(1);
        let _ = self.infer_us.fetch_update(
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
            |mean| Some(if mean == 0 { sample } else { (mean * 7 + sample) / 8 }),
        );
    }

    /// One backend execution of `rows` rows whose outputs `split` divides
    /// per request, timed and counted in the metrics; a panic in the
    /// backend is a failure, not a dead worker.
    fn run_once(
        &self,
        instance: &dyn Backend,
        inputs: Vec<Tensor>,
        rows: usize,
        gathered: Duration,
        split: impl FnOnce(Vec<Tensor>) -> Result<Vec<Vec<Tensor>>, String>,
    ) -> Result<(Vec<Vec<Tensor>>, Compute), Error> {
        let started = Instant::now();
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| instance.execute(inputs)))
            .unwrap_or_else(|_| Err(BackendError::Failed("the backend panicked".into())));
        let infer = started.elapsed();
        self.remember(infer);
        let result = result.and_then(|outputs| split(outputs).map_err(BackendError::Failed));
        let compute = Compute { input: gathered, infer, output: started.elapsed() - infer };
        self.metrics.executed(rows, compute, result.is_ok());
        result.map(|per_request| (per_request, compute)).map_err(|e| model_error(&self.model, e))
    }
}

/// `count` threads, one per instance, named `plinth-{name}-{i}`, each
/// running `work(i)`: the workers of both schedulers.
fn spawn_workers<F>(name: &str, count: usize, work: F) -> Vec<JoinHandle<()>>
where
    F: Fn(usize) + Clone + Send + 'static,
{
    (0..count)
        .map(|i| {
            let work = work.clone();
            std::thread::Builder::new()
                .name(format!("plinth-{name}-{i}"))
                .spawn(move || work(i))
                .expect("the OS can start a thread")
        })
        .collect()
}

/// One instance of the model and whether it is running.
struct Slot {
    instance: Arc<dyn Backend>,
    /// Held while the instance runs a batch (by its worker, or by a request
    /// running inline).
    running: Mutex<()>,
}

/// A backend's error as the request's, of the same class, naming `model`.
fn model_error(model: &str, e: BackendError) -> Error {
    let named = |m: String| format!("model '{model}': {m}");
    match e {
        BackendError::InvalidInput(m) => Error::InvalidArgument(named(m)),
        BackendError::Unavailable(m) => Error::Unavailable(named(m)),
        BackendError::BadGateway(m) => Error::BadGateway(named(m)),
        BackendError::Failed(m) => Error::Internal(named(m)),
    }
}

#[cfg(test)]
mod tests;

//! A sequence batcher's worker: forms each execution on its instance from
//! the sequences bound to its slots ([`Strategy`]), runs it, and hands each
//! row's answer and next state back.

use super::*;

impl Shared {
    /// A worker: runs executions on instance `i` until the scheduler
    /// closes, each in its turn when the rate limiter applies.
    pub(super) fn work(&self, i: usize, instance: &dyn Backend) {
        let turns = self.limited.as_ref().map(|r| (r, i));
        rate_limiter::work(
            turns,
            || self.next_rows(i),
            || self.try_next_rows(i),
            |rows, waited| {
                self.metrics.rate_limited(waited, rows.iter().filter(|r| r.job.is_some()).count());
                self.execute(instance, rows);
            },
        );
    }

    /// Instance `i`'s next execution if one can run now.
    fn try_next_rows(&self, i: usize) -> Option<Vec<Row>> {
        let mut state = self.lock();
        if state.closed {
            return None;
        }
        let rows = self.pick(&mut state, i, Instant::now()).ok()?;
        self.metrics.pending().sub(rows.iter().filter(|r| r.job.is_some()).count() as i64);
        Some(rows)
    }

    /// Waits for the next execution on instance `i`; `None` once closed.
    fn next_rows(&self, i: usize) -> Option<Vec<Row>> {
        let mut state = self.lock();
        loop {
            if state.closed {
                return None;
            }
            let now = Instant::now();
            let next_idle = self.reap(&mut state, now);
            let wait_until = match self.pick(&mut state, i, now) {
                Ok(rows) => {
                    self.metrics.pending().sub(rows.iter().filter(|r| r.job.is_some()).count() as i64);
                    return Some(rows);
                }
                Err(until) => [until, next_idle].into_iter().flatten().min(),
            };
            match wait_until {
                None => self.wake.wait(&mut state),
                Some(until) => {
                    self.wake.wait_for(&mut state, until.saturating_duration_since(now));
                }
            }
        }
    }

    /// The rows of instance `i`'s next execution, or when to look again
    /// (`None`: when woken).
    fn pick(&self, state: &mut State, i: usize, now: Instant) -> Result<Vec<Row>, Option<Instant>> {
        // (slot, enqueued) of each sequence of this instance with a request
        // that can run.
        let ready: Vec<(usize, Instant)> = state.slots[i]
            .iter()
            .enumerate()
            .filter_map(|(j, id)| {
                let s = state.sequences.get(id.as_ref()?)?;
                let front = s.queue.front().filter(|_| !s.running)?;
                Some((j, front.enqueued))
            })
            .collect();
        let oldest = ready.iter().map(|(_, t)| *t).min().ok_or(None)?;
        let slots = state.slots[i].len();
        let max_rows = self.policy.max_batch_size;
        let (delay, enough) = match &self.policy.strategy {
            Strategy::Direct { max_queue_delay, minimum_slot_utilization } => {
                let needed = ((*minimum_slot_utilization * slots as f32).ceil() as usize).clamp(1, slots);
                (*max_queue_delay, ready.len() >= needed)
            }
            Strategy::Oldest { max_queue_delay, preferred_batch_sizes, .. } => {
                let n = ready.len().min(max_rows);
                (*max_queue_delay, n == max_rows || preferred_batch_sizes.contains(&n))
            }
        };
        if !delay.is_zero() && !enough && now < oldest + delay {
            return Err(Some(oldest + delay));
        }
        let direct = matches!(self.policy.strategy, Strategy::Direct { .. });
        let mut by_age = ready.clone();
        by_age.sort_by_key(|(_, t)| *t);
        let order: Vec<usize> =
            if direct { ready.iter().map(|(j, _)| *j).collect() } else { by_age.iter().map(|(j, _)| *j).collect() };
        // The oldest ready request sets the shape the execution's rows
        // share, so that no slot waits behind others of another shape.
        let key = self.row_key(state, i, by_age[0].0).ok_or(None)?;
        Ok(self.take_rows(state, i, &order, direct, &key))
    }

    /// The shape key of the front request of slot `j` of instance `i`.
    fn row_key(&self, state: &State, i: usize, j: usize) -> Option<rows::RowKey> {
        let s = state.sequences.get(state.slots[i][j].as_ref()?)?;
        let front = s.queue.front()?;
        Some(rows::key(&self.policy.layout, &front.inputs, self.states_for(s, front.start)))
    }

    /// The state tensors a request of `s` runs with: the initial state for
    /// a START (or before any state), else the sequence's.
    fn states_for<'a>(&'a self, s: &'a Sequence, start: bool) -> &'a [Tensor] {
        match (&s.states, start) {
            (Some(states), false) => states,
            _ => &self.initial,
        }
    }

    /// Takes the front request of the sequences in `slots` (in that order)
    /// whose shape key is `key` (the first is always one of them): with `direct`, each at its slot's row, idle
    /// rows below the highest one padding.
    fn take_rows(&self, state: &mut State, i: usize, slots: &[usize], direct: bool, key: &rows::RowKey) -> Vec<Row> {
        let limit = if direct { usize::MAX } else { self.policy.max_batch_size };
        let mut taken: Vec<(usize, Row)> = Vec::new();
        for &j in slots {
            if taken.len() == limit {
                break;
            }
            if self.row_key(state, i, j).as_ref() != Some(key) {
                continue;
            }
            let Some(id) = state.slots[i][j].clone() else { continue };
            let Some(s) = state.sequences.get_mut(&id) else { continue };
            let Some(front) = s.queue.front() else { continue };
            let states = self.states_for(s, front.start).to_vec();
            let mut job = s.queue.pop_front().expect("checked above");
            s.running = true;
            if job.start {
                // What came before this START is gone, even if it fails.
                s.states = None;
            }
            let mut tensors = std::mem::take(&mut job.inputs);
            tensors.extend(states);
            let inputs = RowInputs { tensors, start: job.start, end: job.end, id: Some(id.clone()) };
            taken.push((j, Row { sequence: Some((id, s.serial)), job: Some(job), inputs }));
        }
        if !direct {
            return taken.into_iter().map(|(_, row)| row).collect();
        }
        let top = taken.iter().map(|(j, _)| *j).max().unwrap_or(0);
        let padding = rows::padding(&taken[0].1.inputs);
        let mut taken = taken.into_iter().peekable();
        (0..=top)
            .map(|j| match taken.next_if(|(at, _)| *at == j) {
                Some((_, row)) => row,
                None => Row {
                    sequence: None,
                    job: None,
                    inputs: RowInputs { tensors: padding.tensors.clone(), start: false, end: false, id: None },
                },
            })
            .collect()
    }

    /// Runs one execution and answers each request in it; stores each
    /// sequence's next state and ends the sequences whose END ran. When
    /// the backend refuses the combined input, each request runs alone, so
    /// that only the one at fault fails (its sequence's state stays as it
    /// was, as any failed request's does).
    fn execute(&self, instance: &dyn Backend, rows: Vec<Row>) {
        let (taken, began) = (Instant::now(), std::time::SystemTime::now());
        for job in rows.iter().filter_map(|r| r.job.as_ref()) {
            self.metrics.queued(taken.duration_since(job.enqueued));
        }
        let row_inputs: Vec<&RowInputs> = rows.iter().map(|r| &r.inputs).collect();
        let requests = rows.iter().filter(|r| r.job.is_some()).count();
        let (result, compute) = self.run(instance, &row_inputs, requests, taken);
        let answers: Vec<Result<RowAnswer, Error>> = match result {
            Ok(per_row) => per_row.into_iter().map(Ok).collect(),
            Err(BackendError::InvalidInput(_)) if requests > 1 => rows
                .iter()
                .map(|row| match row.job {
                    // A padding row answers no one.
                    None => Err(Error::Internal("padding".into())),
                    Some(_) => {
                        let (alone, _) = self.run(instance, &[&row.inputs], 1, Instant::now());
                        alone.map(|mut one| one.remove(0)).map_err(|e| super::super::model_error(&self.model, e))
                    }
                })
                .collect(),
            Err(e) => vec![Err(super::super::model_error(&self.model, e)); rows.len()],
        };
        let mut state = self.lock();
        for (row, answer) in rows.into_iter().zip(answers) {
            let (Some(job), Some((id, serial))) = (row.job, row.sequence) else { continue };
            let reply = answer.map(|(outputs, next)| {
                self.finished_row(&mut state, &id, serial, job.end, Some(next));
                (outputs, Timing { started: began, queue: taken.duration_since(job.enqueued), compute })
            });
            if reply.is_err() {
                self.finished_row(&mut state, &id, serial, job.end, None);
            }
            if job.reply.send(reply).is_err() {
                self.metrics.finished(Err(FailureReason::Canceled), job.enqueued.elapsed());
            }
        }
        self.wake.notify_all();
    }

    /// One execution of `rows` (`requests` of them real, the rest padding)
    /// taken from the queue at `taken`, counted in the model's statistics:
    /// each row's answer, and where the time went.
    fn run(
        &self,
        instance: &dyn Backend,
        rows: &[&RowInputs],
        requests: usize,
        taken: Instant,
    ) -> (Result<Vec<RowAnswer>, BackendError>, Compute) {
        // A panic anywhere in the execution fails its requests; the worker
        // and the sequences' slots survive it.
        let mut phases = (Duration::ZERO, Duration::ZERO);
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let inputs = rows::batch_inputs(&self.policy, rows).map_err(BackendError::InvalidInput)?;
            phases.0 = taken.elapsed();
            let started = Instant::now();
            let outputs = instance.execute(inputs);
            phases.1 = started.elapsed();
            outputs.and_then(|outputs| rows::split(&self.policy, outputs, rows).map_err(BackendError::Failed))
        }))
        .unwrap_or_else(|_| Err(BackendError::Failed("the backend panicked".into())));
        let (gathered, infer) = phases;
        let compute = Compute { input: gathered, infer, output: taken.elapsed().saturating_sub(gathered + infer) };
        self.metrics.executed_padded(rows.len(), requests, compute, result.is_ok());
        (result, compute)
    }

    /// A request of sequence `id` (`serial`) finished, leaving `next` as
    /// its state (`None`: it failed, the state stays as it was); a request
    /// with END ends the sequence unless a new START is already queued.
    fn finished_row(&self, state: &mut State, id: &CorrelationId, serial: u64, end: bool, next: Option<Vec<Tensor>>) {
        // A sequence cancelled while its request ran is gone (or another
        // sequence has its id now): nothing to keep.
        let Some(s) = state.sequences.get_mut(id).filter(|s| s.serial == serial) else { return };
        s.running = false;
        s.last_seen = Instant::now();
        if next.is_some() {
            s.states = next;
        }
        if end && !s.open && s.queue.is_empty() {
            self.end(state, id, SequenceEnd::End);
        } else if end {
            s.states = None;
        } else if s.closing && s.queue.is_empty() {
            self.end(state, id, SequenceEnd::End);
        }
    }
}

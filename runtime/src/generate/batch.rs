//! The decode loop: continuous batching over the decoder's slots, on a
//! thread of its own.
//!
//! Each iteration runs at most one prefill chunk (of the oldest sequence
//! still reading its prompt) and then one decode step for every sequence
//! that is generating, all in one batch. A new request takes a free slot
//! between iterations and a finished or abandoned one leaves at once, so a
//! running stream waits at most one chunk's prefill per token for a long
//! prompt that arrives. The slots a decode step covers are the contiguous
//! block from slot 0 to the highest one generating (slots are handed out
//! lowest first); a slot in it that is not generating runs a placeholder
//! token written where its next real one will go, which is overwritten.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use tokio::sync::mpsc::UnboundedSender;

use super::decoder::Decoder;
use super::sampling::Sampler;
use super::{Event, FinishReason, Job};
use crate::metrics::{GenerationMetrics, SequenceOutcome};

/// What the loop and the requests share.
pub(super) struct Shared {
    pub(super) waiting: Mutex<VecDeque<Job>>,
    pub(super) wake: Condvar,
    pub(super) stop: AtomicBool,
    pub(super) metrics: GenerationMetrics,
}

/// A sequence in a slot.
struct Sequence {
    slot: usize,
    prompt: Vec<u32>,
    /// Prompt tokens in the cache so far.
    filled: usize,
    /// The last token chosen, not yet in the cache (while generating).
    next: Option<u32>,
    generated: usize,
    max_tokens: usize,
    stop_ids: Vec<u32>,
    sampler: Sampler,
    events: UnboundedSender<Event>,
    /// When it arrived (queued).
    started: Instant,
    /// When its last token was chosen.
    last_token: Option<Instant>,
}

impl Sequence {
    /// The position its next token goes to.
    fn position(&self) -> usize {
        self.filled + self.generated.saturating_sub(1)
    }
}

/// Runs the loop until `shared.stop` is set.
pub(super) fn run(mut decoder: Decoder, slots: usize, chunk: usize, shared: Arc<Shared>) {
    let metrics = &shared.metrics;
    let mut running: Vec<Sequence> = Vec::new();
    loop {
        if !admit(&shared, &mut running, slots) {
            return;
        }
        if let Err(e) = step(&mut decoder, &mut running, chunk, metrics) {
            tracing::error!(error = %e, "a decoder step failed; its sequences end with the error");
            for s in running.drain(..) {
                metrics.ended(SequenceOutcome::Error);
                let _ = s.events.send(Event::Failed(e.clone()));
            }
        }
        let filled: usize = running.iter().map(|s| s.filled + s.generated).sum();
        metrics.set_running(running.len(), filled as f64 / (slots * decoder.context()) as f64);
    }
}

/// Drops the sequences that ended or whose client left (counted as
/// aborted), which frees their slots.
fn leave(running: &mut Vec<Sequence>, metrics: &GenerationMetrics) {
    running.retain(|s| {
        if s.max_tokens == 0 {
            return false;
        }
        let left = s.events.is_closed();
        if left {
            metrics.ended(SequenceOutcome::Abort);
        }
        !left
    });
}

/// Moves waiting jobs into free slots; blocks while there is nothing to
/// do. `false` once the loop should stop.
fn admit(shared: &Shared, running: &mut Vec<Sequence>, slots: usize) -> bool {
    let mut waiting = shared.waiting.lock();
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return false;
        }
        waiting.retain(|job| {
            let left = job.events.is_closed();
            if left {
                shared.metrics.ended(SequenceOutcome::Abort);
            }
            !left
        });
        while running.len() < slots {
            let Some(job) = waiting.pop_front() else { break };
            let slot = (0..slots).find(|s| running.iter().all(|r| r.slot != *s)).expect("a free slot");
            let sampler = Sampler::new(job.sampling, &job.prompt);
            running.push(Sequence {
                slot,
                prompt: job.prompt,
                filled: 0,
                next: None,
                generated: 0,
                max_tokens: job.max_tokens,
                stop_ids: job.stop_ids,
                sampler,
                events: job.events,
                started: job.queued,
                last_token: None,
            });
        }
        shared.metrics.set_waiting(waiting.len());
        if !running.is_empty() {
            return true;
        }
        shared.metrics.set_running(0, 0.0);
        shared.wake.wait(&mut waiting);
    }
}

/// One iteration: a prefill chunk, then a decode step.
fn step(
    decoder: &mut Decoder,
    running: &mut Vec<Sequence>,
    chunk: usize,
    metrics: &GenerationMetrics,
) -> Result<(), String> {
    leave(running, metrics);
    if let Some(s) = running.iter_mut().filter(|s| s.filled < s.prompt.len()).min_by_key(|s| s.started) {
        let end = (s.filled + chunk).min(s.prompt.len());
        let mut logits = decoder.run(s.slot, &s.prompt[s.filled..end], &[end])?;
        s.filled = end;
        if end == s.prompt.len() {
            choose(s, &mut logits[0], decoder.context(), metrics);
        }
    }
    leave(running, metrics);
    let generating: Vec<usize> = (0..running.len()).filter(|&i| running[i].next.is_some()).collect();
    let Some(rows) = generating.iter().map(|&i| running[i].slot + 1).max() else { return Ok(()) };
    let mut ids = vec![0u32; rows];
    let mut ends: Vec<usize> = vec![1; rows];
    for s in running.iter() {
        (ids[s.slot], ends[s.slot]) = match s.next {
            Some(token) if s.slot < rows => (token, s.position() + 1),
            _ if s.slot < rows => (0, s.filled + 1),
            _ => continue,
        };
    }
    let mut logits = decoder.run(0, &ids, &ends)?;
    for &i in &generating {
        let s = &mut running[i];
        choose(s, &mut logits[s.slot], decoder.context(), metrics);
    }
    leave(running, metrics);
    Ok(())
}

/// Picks sequence `s`'s next token from `logits` and sends it, or its end.
fn choose(s: &mut Sequence, logits: &mut [f32], context: usize, metrics: &GenerationMetrics) {
    let choice = s.sampler.pick(logits);
    let token = choice.token;
    let now = Instant::now();
    let stop = s.stop_ids.contains(&token);
    let previous = s.last_token.replace(now);
    if previous.is_none() {
        metrics.first_token(s.prompt.len(), now - s.started);
    }
    if stop {
        end(s, FinishReason::Stop, metrics);
        return;
    }
    metrics.token(previous.map(|last| now - last));
    s.generated += 1;
    let _ = s.events.send(Event::Token(choice));
    if s.generated >= s.max_tokens || s.position() >= context {
        end(s, FinishReason::Length, metrics);
        return;
    }
    s.next = Some(token);
}

/// Sends `s` its end; it leaves its slot at the next [`leave`].
fn end(s: &mut Sequence, reason: FinishReason, metrics: &GenerationMetrics) {
    let _ = s.events.send(Event::Finished(reason));
    metrics.ended(match reason {
        FinishReason::Stop => SequenceOutcome::Stop,
        FinishReason::Length => SequenceOutcome::Length,
    });
    s.next = None;
    s.max_tokens = 0;
}

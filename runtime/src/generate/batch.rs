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
use super::{Event, FinishReason, Job, Stats};

/// What the loop and the requests share.
pub(super) struct Shared {
    pub(super) waiting: Mutex<VecDeque<Job>>,
    pub(super) wake: Condvar,
    pub(super) stop: AtomicBool,
    pub(super) stats: Arc<Stats>,
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
    started: Instant,
}

impl Sequence {
    /// The position its next token goes to.
    fn position(&self) -> usize {
        self.filled + self.generated.saturating_sub(1)
    }
}

/// Runs the loop until `shared.stop` is set.
pub(super) fn run(mut decoder: Decoder, slots: usize, chunk: usize, shared: Arc<Shared>) {
    let mut running: Vec<Sequence> = Vec::new();
    loop {
        if !admit(&shared, &mut running, slots) {
            return;
        }
        running.retain(|s| !s.events.is_closed());
        if let Err(e) = step(&mut decoder, &mut running, chunk) {
            tracing::error!(error = %e, "a decoder step failed; its sequences end with the error");
            for s in running.drain(..) {
                let _ = s.events.send(Event::Failed(e.clone()));
            }
        }
        shared.stats.set_running(running.len());
    }
}

/// Moves waiting jobs into free slots; blocks while there is nothing to
/// do. `false` once the loop should stop.
fn admit(shared: &Shared, running: &mut Vec<Sequence>, slots: usize) -> bool {
    let mut waiting = shared.waiting.lock();
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return false;
        }
        waiting.retain(|job| !job.events.is_closed());
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
            });
        }
        shared.stats.set_waiting(waiting.len());
        if !running.is_empty() {
            return true;
        }
        shared.stats.set_running(0);
        shared.wake.wait(&mut waiting);
    }
}

/// One iteration: a prefill chunk, then a decode step.
fn step(decoder: &mut Decoder, running: &mut Vec<Sequence>, chunk: usize) -> Result<(), String> {
    if let Some(s) = running.iter_mut().filter(|s| s.filled < s.prompt.len()).min_by_key(|s| s.started) {
        let end = (s.filled + chunk).min(s.prompt.len());
        let mut logits = decoder.run(s.slot, &s.prompt[s.filled..end], &[end])?;
        s.filled = end;
        if end == s.prompt.len() {
            choose(s, &mut logits[0], decoder.context());
        }
    }
    running.retain(|s| !finished(s));
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
        choose(s, &mut logits[s.slot], decoder.context());
    }
    running.retain(|s| !finished(s));
    Ok(())
}

/// Picks sequence `s`'s next token from `logits` and sends it, or its end.
fn choose(s: &mut Sequence, logits: &mut [f32], context: usize) {
    let choice = s.sampler.pick(logits);
    let token = choice.token;
    if s.stop_ids.contains(&token) {
        let _ = s.events.send(Event::Finished(FinishReason::Stop));
        s.next = None;
        s.max_tokens = 0;
        return;
    }
    s.generated += 1;
    let _ = s.events.send(Event::Token(choice));
    if s.generated >= s.max_tokens || s.position() >= context {
        let _ = s.events.send(Event::Finished(FinishReason::Length));
        s.next = None;
        s.max_tokens = 0;
        return;
    }
    s.next = Some(token);
}

/// Whether `s` has ended (sent its end, or its client left).
fn finished(s: &Sequence) -> bool {
    s.max_tokens == 0 || s.events.is_closed()
}

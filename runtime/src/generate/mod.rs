//! Generative models: a decode loop and KV cache run natively over ONNX
//! Runtime ([`decoder`], [`batch`]), sampling ([`sampling`]), and the
//! model-specific steps (tokenizer, chat template, detokenization) in the
//! model's plugin, through contract 0.4's `generation` export ([`text`]).
//!
//! A model is generative when its `config.pbtxt` sets
//! `model_transaction_policy { decoupled: true }` (one request, many
//! responses) and its version folder holds an export of ONNX Runtime
//! GenAI's model builder (`genai_config.json`, `model.onnx`).

mod batch;
mod decoder;
pub mod sampling;
pub mod text;

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use crate::backend::onnx::{OnnxRuntime, SessionOptions};
use crate::backend::{BackendKind, Placement};
use crate::config::parameters::GenerationParameters;
use crate::error::{Error, Overload};
use crate::metrics::GenerationMetrics;
pub use sampling::{Choice, Sampling};

/// Why a sequence ended (OpenAI's `finish_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token or stop string: `stop`.
    Stop,
    /// `max_tokens` or the context is reached: `length`.
    Length,
}

impl FinishReason {
    /// OpenAI's name.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// What the decode loop sends a request, in order: tokens, then one end.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Token(Choice),
    Finished(FinishReason),
    /// The decoder failed; the sequence is over.
    Failed(String),
}

/// A request for the decode loop.
#[derive(Debug)]
pub struct GenerationRequest {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// The most tokens to generate.
    pub max_tokens: usize,
    pub sampling: Sampling,
    /// Token ids that end the sequence (not sent as tokens).
    pub stop_ids: Vec<u32>,
}

/// A request waiting for a slot.
struct Job {
    prompt: Vec<u32>,
    max_tokens: usize,
    sampling: Sampling,
    stop_ids: Vec<u32>,
    events: tokio::sync::mpsc::UnboundedSender<Event>,
    queued: Instant,
}

/// A loaded generative model's decode loop.
pub struct Generator {
    shared: Arc<batch::Shared>,
    kind: BackendKind,
    limits: GenerationParameters,
    cache_bytes: u64,
    weight_bytes: u64,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Generator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generator").field("limits", &self.limits).finish_non_exhaustive()
    }
}

impl Generator {
    /// Loads the export in `version_dir` (`genai_config.json` and the ONNX
    /// file it names) on `placement` and starts its loop with a KV cache of
    /// `limits.max_sequences` × `limits.context_length` tokens, recording
    /// its figures in `metrics`.
    ///
    /// # Errors
    /// A message when the folder has no export, `generation.context_length`
    /// exceeds the model's context, or ONNX Runtime cannot load the file.
    pub fn load(
        onnx: &OnnxRuntime,
        version_dir: &Path,
        options: SessionOptions,
        placement: Placement,
        limits: GenerationParameters,
        metrics: GenerationMetrics,
    ) -> Result<Generator, String> {
        let (file, dims) = decoder::read_config(version_dir)?;
        if limits.context_length > dims.context_length {
            return Err(format!(
                "parameter 'generation.context_length' is {}, longer than the model's context of {} tokens",
                limits.context_length, dims.context_length
            ));
        }
        let session = onnx.session(&file, options, placement)?;
        let weight_bytes = weights(&file);
        let decoder = decoder::Decoder::new(session, dims, limits.max_sequences, limits.context_length);
        let cache_bytes = decoder.cache_bytes();
        let shared = Arc::new(batch::Shared {
            waiting: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            metrics,
        });
        let (slots, chunk, loop_shared) = (limits.max_sequences, limits.prefill_chunk, shared.clone());
        let thread = std::thread::Builder::new()
            .name("plinth-decode".into())
            .spawn(move || batch::run(decoder, slots, chunk, loop_shared))
            .map_err(|e| format!("cannot start the decode loop: {e}"))?;
        Ok(Generator { shared, kind: OnnxRuntime::KIND, limits, cache_bytes, weight_bytes, thread: Some(thread) })
    }

    /// The backend its decoder runs on.
    pub fn kind(&self) -> BackendKind {
        self.kind
    }

    /// The model's `generation.*` limits.
    pub fn limits(&self) -> &GenerationParameters {
        &self.limits
    }

    /// Its figures: sequences running and waiting, the cache's use.
    pub fn metrics(&self) -> &GenerationMetrics {
        &self.shared.metrics
    }

    /// Host memory it holds, in bytes: the weights (the ONNX file and its
    /// external data) and the KV cache.
    pub fn resident_bytes(&self) -> u64 {
        self.weight_bytes + self.cache_bytes
    }

    /// Queues `request`; its events come on the returned channel. Dropping
    /// the channel ends the sequence at the next step and frees its slot.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the prompt is empty or the prompt and
    /// `max_tokens` together exceed the context (naming both lengths);
    /// [`Error::Overloaded`] when `generation.max_queue` requests wait.
    pub fn submit(&self, request: GenerationRequest) -> Result<UnboundedReceiver<Event>, Error> {
        let context = self.limits.context_length;
        if request.prompt.is_empty() {
            return Err(Error::InvalidArgument("the prompt is empty (no tokens)".into()));
        }
        if request.prompt.len() + request.max_tokens > context {
            return Err(Error::InvalidArgument(format!(
                "the prompt's {} tokens and max_tokens {} exceed the model's context of {context} tokens",
                request.prompt.len(),
                request.max_tokens
            )));
        }
        let (events, receiver) = unbounded_channel();
        let mut waiting = self.shared.waiting.lock();
        if waiting.len() >= self.limits.max_queue {
            return Err(Error::Overloaded(Overload {
                message: format!("{} requests already wait for a sequence slot", waiting.len()),
                retry_after_secs: 1,
            }));
        }
        let GenerationRequest { prompt, max_tokens, sampling, stop_ids } = request;
        waiting.push_back(Job { prompt, max_tokens, sampling, stop_ids, events, queued: Instant::now() });
        self.shared.metrics.set_waiting(waiting.len());
        self.shared.wake.notify_one();
        Ok(receiver)
    }
}

impl Drop for Generator {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        {
            let _waiting = self.shared.waiting.lock();
            self.shared.wake.notify_all();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The bytes of an ONNX file and its external data (`FILE.data`).
fn weights(file: &Path) -> u64 {
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    size(file) + size(&file.with_extension("onnx.data"))
}

#[cfg(test)]
mod tests;

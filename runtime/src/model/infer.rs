//! Serving a request of tensors: checks, the response cache, the scheduler
//! or an ensemble's steps, and the outputs as requested.

use std::sync::Arc;
use std::time::Instant;

use crate::error::Error;
use crate::metrics::FailureReason;
use crate::plugin::ModelRunner;
use crate::scheduler::Timing;
use crate::scheduler::policy::RequestOptions;
use crate::scheduler::sequence::{CorrelationId, SequenceRequest};
use crate::tensor::Tensor;

use super::cache::ResponseCache;
use super::check::{self, check_inputs};
use super::outputs::{self, OutputRequest};
use super::{Batcher, Engine, Model, reshape, traced};

impl Model {
    /// Runs the model on tensors: through its scheduler, or for an
    /// ensemble through its steps' models, which `runner` reaches.
    /// `requested` names the outputs to return, in that order, each as its
    /// tensor or as a classification; empty means all, in the order the
    /// model declares them. `options` are the request's `priority` and
    /// `timeout`. Counts the outcome in Triton's success / failure metrics.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for inputs that do not fit the signature,
    /// an unknown, repeated or unclassifiable requested output, an unknown
    /// priority; [`Error::Overloaded`] when the queue is full or the queue
    /// timeout expired; [`Error::Internal`] when the backend fails; for an
    /// ensemble, its failing step's error.
    ///
    /// A traced request (`options.trace`) gets this model's span under it,
    /// as do its ensemble steps under that.
    pub async fn infer(
        &self,
        inputs: Vec<Tensor>,
        requested: &[OutputRequest],
        mut options: RequestOptions,
        runner: &Arc<dyn ModelRunner>,
    ) -> Result<(Vec<Tensor>, Timing), Error> {
        let span = options.trace.take().map(|parent| traced::model_span(&parent, self, &options, &inputs));
        options.trace = span.clone();
        let result = self.infer_in_span(inputs, requested, options, runner).await;
        if let Some(span) = &span {
            traced::end(span, &result);
        }
        result
    }

    /// [`Model::infer`] within the model's own span (`options.trace`),
    /// which the caller ends.
    pub(super) async fn infer_in_span(
        &self,
        inputs: Vec<Tensor>,
        requested: &[OutputRequest],
        options: RequestOptions,
        runner: &Arc<dyn ModelRunner>,
    ) -> Result<(Vec<Tensor>, Timing), Error> {
        let started = Instant::now();
        let result = self.run(inputs, requested, options, runner).await;
        self.metrics.finished(result.as_ref().map(drop).map_err(FailureReason::from), started.elapsed());
        result
    }

    async fn run(
        &self,
        inputs: Vec<Tensor>,
        requested: &[OutputRequest],
        options: RequestOptions,
        runner: &Arc<dyn ModelRunner>,
    ) -> Result<(Vec<Tensor>, Timing), Error> {
        if matches!(&*self.engine, Engine::Generative(_)) {
            return Err(self.not_tensors());
        }
        check_inputs(&self.signature, &self.name, &inputs)?;
        outputs::check(&self.signature, &self.name, requested)?;
        // A sequence's answers depend on its state: never cached.
        let cache = self.cache.as_ref().filter(|_| options.sequence.is_none());
        let Some((cache, owner)) = cache else { return self.compute(inputs, requested, options, runner).await };
        let looked_up = Instant::now();
        let key = ResponseCache::key(*owner, &inputs, requested);
        if let Some(outputs) = cache.get(&key) {
            self.metrics.cache_hit(looked_up.elapsed());
            return Ok((outputs, Timing::default()));
        }
        let lookup = looked_up.elapsed();
        let (outputs, timing) = self.compute(inputs, requested, options, runner).await?;
        let inserted = Instant::now();
        cache.insert(key, &outputs);
        self.metrics.cache_miss(lookup + inserted.elapsed());
        Ok((outputs, timing))
    }

    /// The answer to checked inputs, computed: by the scheduler's backends
    /// or the ensemble's steps.
    async fn compute(
        &self,
        inputs: Vec<Tensor>,
        requested: &[OutputRequest],
        options: RequestOptions,
        runner: &Arc<dyn ModelRunner>,
    ) -> Result<(Vec<Tensor>, Timing), Error> {
        let rows = if self.signature.max_batch_size > 0 {
            inputs.first().and_then(|t| t.shape.first().copied())
        } else {
            None
        };
        let (outputs, timing) = match &*self.engine {
            Engine::Backends { batcher, .. } => {
                let inputs = reshape::inputs(&self.signature, inputs);
                let span = options.trace.clone();
                let (outputs, timing) = match batcher {
                    Batcher::Dynamic(scheduler) => scheduler.submit(inputs, options).await?,
                    Batcher::Sequence(scheduler) => {
                        for (key, set) in
                            [("priority", options.priority.is_some()), ("timeout", options.timeout_us.is_some())]
                        {
                            if set {
                                return Err(Error::InvalidArgument(format!(
                                    "model '{}' has sequence_batching: its requests run in their sequence's order, so request parameter '{key}' does not apply",
                                    self.name
                                )));
                            }
                        }
                        let sequence = options.sequence.unwrap_or(SequenceRequest {
                            id: CorrelationId::Uint(0),
                            start: false,
                            end: false,
                            owner: None,
                        });
                        scheduler.submit(inputs, sequence).await?
                    }
                };
                if let Some(span) = &span {
                    traced::scheduled(span, &timing);
                }
                (reshape::outputs(&self.signature, outputs).map_err(|m| self.wrong_answer(m))?, timing)
            }
            Engine::Generative(_) => return Err(self.not_tensors()),
            Engine::Ensemble(ensemble) => {
                let wanted: Vec<&str> = if requested.is_empty() {
                    self.signature.outputs.iter().map(|o| o.name.as_str()).collect()
                } else {
                    requested.iter().map(|r| r.name.as_str()).collect()
                };
                // An ensemble's own reshape applies between its clients and
                // its steps, as a backend's does.
                let inputs = reshape::inputs(&self.signature, inputs);
                let outputs = ensemble.run(&self.name, &self.signature, inputs, &wanted, options, runner).await?;
                // Triton counts an ensemble's request as one execution of
                // its batch size (its steps' times are theirs).
                let batch_size = rows.and_then(|r| usize::try_from(r).ok()).unwrap_or(1);
                self.metrics.executed(batch_size, crate::metrics::Compute::default(), true);
                (reshape::outputs(&self.signature, outputs).map_err(|m| self.wrong_answer(m))?, Timing::default())
            }
        };
        check::check_outputs(&self.signature, &outputs, rows).map_err(|m| self.wrong_answer(m))?;
        let mut outputs = outputs;
        outputs.retain(|t| self.signature.outputs.iter().any(|o| o.name == t.name));
        let batching = self.signature.max_batch_size > 0;
        Ok((outputs::select(outputs, requested, &self.labels, batching), timing))
    }

    /// Why a generative model does not run tensor requests, and where to
    /// send them.
    fn not_tensors(&self) -> Error {
        Error::InvalidArgument(format!(
            "model '{}' is generative (decoupled): send its requests to generate, generate_stream, \
             /v1/completions or /v1/chat/completions",
            self.name
        ))
    }

    /// An answer of the backend (or of an ensemble's steps) that does not
    /// fit the signature.
    fn wrong_answer(&self, problem: String) -> Error {
        let message = format!("model '{}' returned {problem}", self.name);
        // A remote server's wrong answer is its fault, not ours.
        if self.answers_from_elsewhere() { Error::BadGateway(message) } else { Error::Internal(message) }
    }
}

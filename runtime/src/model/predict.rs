//! Serving a raw request through the model's plugin: preprocess, the
//! tensors' inference, postprocess.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::{self, parameters};
use crate::error::Error;
use crate::metrics::FailureReason;
use crate::plugin::{CallContext, ModelRunner, PluginError, RawRequest, RawResponse};
use crate::scheduler::Timing;
use crate::scheduler::policy::RequestOptions;
use crate::scheduler::sequence::{CorrelationId, Owner, SequenceRequest, SequenceScheduler, new_owner};
use crate::trace::Span;

use super::{Batcher, Engine, Model, traced};

/// Where a `/predict` request's time went: the plugin calls around the
/// scheduler's [`Timing`].
#[derive(Clone, Copy, Debug, Default)]
pub struct PredictTiming {
    /// The plugin's `preprocess` call.
    pub preprocess: Duration,
    /// Queue and compute.
    pub inference: Timing,
    /// The plugin's `postprocess` call.
    pub postprocess: Duration,
}

impl Model {
    /// Sends a raw request through the model's plugin: preprocess, run,
    /// postprocess. The plugin's composed calls reach other models through
    /// `runner`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the model has no plugin or the plugin
    /// refuses the request; [`Error::Internal`] when the plugin fails, traps,
    /// exceeds its limits or produces tensors that do not fit the model.
    pub async fn predict(
        &self,
        req: RawRequest,
        runner: Arc<dyn ModelRunner>,
    ) -> Result<(RawResponse, PredictTiming), Error> {
        self.predict_within(req, CallContext { runner, chain: Vec::new(), sequence: None, trace: None }).await
    }

    /// [`Model::predict`] for a plugin's composed call: `context.chain`
    /// names the models whose plugin already runs for the request,
    /// outermost first. For a sequence model the request is one sequence
    /// of its own: the preprocessed tensors start it, the plugin's
    /// composed calls on this model continue it (the host carries the
    /// state), and it ends with the request. A traced request
    /// (`context.trace`) gets this model's span, with `preprocess` and
    /// `postprocess` spans under which the plugin's composed calls go.
    ///
    /// # Errors
    /// As [`Model::predict`].
    pub async fn predict_within(
        &self,
        req: RawRequest,
        mut context: CallContext,
    ) -> Result<(RawResponse, PredictTiming), Error> {
        let span =
            context.trace.take().map(|parent| traced::model_span(&parent, self, &RequestOptions::default(), &[]));
        let result = self.predict_in_span(req, context, span.as_ref()).await;
        if let Some(span) = &span {
            traced::end(span, &result);
        }
        result
    }

    async fn predict_in_span(
        &self,
        req: RawRequest,
        mut context: CallContext,
        span: Option<&Span>,
    ) -> Result<(RawResponse, PredictTiming), Error> {
        context.chain.push(self.name.clone());
        let plugin = self.plugin.as_ref().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "model '{}' has no plugin, so it takes tensors only: use /infer, or name a plugin in its {} (parameters key '{}')",
                self.name,
                config::CONFIG_FILE,
                parameters::PLUGIN
            ))
        })?;
        let req = Arc::new(req);
        let sequence = self.open_predict_sequence();
        context.sequence = sequence.as_ref().map(|s| (self.name.clone(), self.version, s.id.clone()));
        let options = RequestOptions {
            sequence: sequence.as_ref().map(|s| SequenceRequest {
                id: s.id.clone(),
                start: true,
                end: false,
                owner: Some(s.owner),
            }),
            trace: span.cloned(),
            ..RequestOptions::default()
        };
        let mut timing = PredictTiming::default();
        let started = Instant::now();
        context.trace = span.map(|s| s.child("preprocess", Vec::new()));
        // A request the plugin refuses or fails on counts as the model's
        // failed request, as one whose tensors do not decode does.
        let inputs = plugin
            .preprocess(req.clone(), context.clone())
            .await
            .map_err(|e| self.failed_before_running(plugin_error(e)));
        end_stage(&context.trace, &inputs);
        timing.preprocess = started.elapsed();
        let (outputs, inference) = self
            .infer_in_span(inputs?, &[], options, &context.runner)
            .await
            .map_err(blame_the_plugin_for_its_tensors)?;
        timing.inference = inference;
        let started = Instant::now();
        context.trace = span.map(|s| s.child("postprocess", Vec::new()));
        let stage = context.trace.clone();
        let response = plugin.postprocess(req, outputs, context).await.map_err(plugin_error);
        end_stage(&stage, &response);
        timing.postprocess = started.elapsed();
        Ok((response?, timing))
    }

    /// A new sequence for one `/predict` request, if this is a sequence
    /// model; it ends when the returned guard drops.
    fn open_predict_sequence(&self) -> Option<PredictSequence<'_>> {
        let Engine::Backends { batcher: Batcher::Sequence(scheduler), .. } = &*self.engine else { return None };
        Some(PredictSequence { scheduler, id: CorrelationId::new_host(), owner: new_owner() })
    }

    /// Counts a `/predict` request that failed in the plugin's
    /// `preprocess`, before the model ran, under the reason its error gives
    /// (OTHER for a refusal, BACKEND for a plugin that failed); returns `e`.
    fn failed_before_running(&self, e: Error) -> Error {
        self.metrics.finished(Err(FailureReason::from(&e)), Duration::ZERO);
        e
    }
}

/// Ends a plugin stage's span, if the request is traced.
fn end_stage<T>(span: &Option<Span>, result: &Result<T, Error>) {
    if let Some(span) = span {
        traced::end_stage(span, result);
    }
}

/// The sequence of one `/predict` request on a sequence model; ends it
/// when dropped.
struct PredictSequence<'a> {
    scheduler: &'a SequenceScheduler,
    id: CorrelationId,
    owner: Owner,
}

impl Drop for PredictSequence<'_> {
    fn drop(&mut self) {
        self.scheduler.release(&self.id, self.owner, crate::metrics::SequenceEnd::End);
    }
}

/// Tensors a plugin's preprocess made that the model refuses are the
/// plugin's fault (500), not the client's (400): the client sent a raw body.
fn blame_the_plugin_for_its_tensors(e: Error) -> Error {
    match e {
        Error::InvalidArgument(m) => {
            Error::Internal(format!("the plugin's preprocess produced tensors the model cannot take: {m}"))
        }
        other => other,
    }
}

fn plugin_error(e: PluginError) -> Error {
    match e {
        PluginError::Refused(e) => e,
        PluginError::Failed(m) => Error::Internal(m),
    }
}

//! The host side of `plinth:plugin/inference` (WIT 0.2 and later): a plugin runs
//! other models of the repository through a [`ModelRunner`], which resolves
//! them as a client's request is resolved (so on-demand loading and
//! residency apply) and runs them through their schedulers. The server's
//! lifecycle implements it; this module never names it.
//!
//! Each plugin call carries a [`CallContext`]: the runner, and the chain of
//! models whose plugin is running for the request, which stops cycles and
//! runaway depth before anything runs. Plugin calls are asynchronous
//! (wasmtime runs the guest on a fiber), so a composed call awaits the
//! runner's future while the plugin's call is suspended.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{RawRequest, RawResponse};
use crate::config::Signature;
use crate::error::Error;
use crate::scheduler::policy::RequestOptions;
use crate::scheduler::sequence::{CorrelationId, SequenceRequest};
use crate::tensor::Tensor;
use crate::trace::Span;

/// The most plugins one request may pass through (`predict` nesting).
pub const MAX_DEPTH: usize = 8;

/// A boxed future a [`ModelRunner`] returns.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Runs other models for a plugin's composed calls.
pub trait ModelRunner: Send + Sync {
    /// Runs `inputs` through version `version` (the server's choice when
    /// `None`) of `model`, resolved as a client's request, and returns the
    /// `outputs` asked for (all when empty), in that order. `options` are
    /// the scheduling options (an ensemble passes its request's sequence on
    /// to its steps; a plugin's composed call has none).
    ///
    /// # Errors
    /// The callee's [`Error`]: unknown or unavailable model, inputs that do
    /// not fit it, overload, a backend failure.
    fn infer(
        self: Arc<Self>,
        model: String,
        version: Option<u64>,
        inputs: Vec<Tensor>,
        outputs: Vec<String>,
        options: RequestOptions,
    ) -> BoxFuture<Result<Vec<Tensor>, Error>>;

    /// The signature of version `version` of `model`, resolved as
    /// [`ModelRunner::infer`] resolves it (ensembles fit the tensors they
    /// pass to a step to its batching).
    ///
    /// # Errors
    /// As [`ModelRunner::infer`] for an unknown or unavailable model.
    fn signature(self: Arc<Self>, model: String, version: Option<u64>) -> BoxFuture<Result<Signature, Error>>;

    /// Sends `request` through `model`'s plugin and model; `chain` names the
    /// models whose plugin already runs for the request, outermost first;
    /// `trace` is the calling plugin stage's span, when the request is
    /// traced.
    ///
    /// # Errors
    /// As [`ModelRunner::infer`], and the callee plugin's errors.
    fn predict(
        self: Arc<Self>,
        model: String,
        version: Option<u64>,
        request: RawRequest,
        chain: Vec<String>,
        trace: Option<Span>,
    ) -> BoxFuture<Result<RawResponse, Error>>;
}

/// What one request's plugin call may compose.
#[derive(Clone)]
pub struct CallContext {
    /// Where other models run.
    pub runner: Arc<dyn ModelRunner>,
    /// The models whose plugin is running for this request, outermost
    /// first; this call's model last.
    pub chain: Vec<String>,
    /// When this call's model is a sequence model: its name, version and
    /// the sequence the host opened for this request, which the plugin's
    /// composed `infer` calls on the same model continue (so the host
    /// carries the model's state between them).
    pub sequence: Option<(String, u64, CorrelationId)>,
    /// The span of this plugin call (`preprocess` or `postprocess`) when
    /// the request is traced: the composed calls' model spans go under it.
    pub trace: Option<Span>,
}

/// The composition state of one plugin instance during a call.
#[derive(Default)]
pub(super) struct Composition {
    /// The running call's context; `None` between calls and during `init`,
    /// which cannot run other models.
    pub(super) context: Option<CallContext>,
    /// Time spent in composed calls since the deadline was last extended:
    /// the callee's work does not count against this plugin's time limit.
    pub(super) host_time: Duration,
    /// Whether the running call made a composed call.
    pub(super) composed: bool,
}

impl Composition {
    /// `plinth:plugin/inference.infer`: tensors through `model`'s scheduler.
    ///
    /// # Errors
    /// The callee's [`Error`], its class kept and its message prefixed with
    /// the model's name; [`Error::Internal`] outside a request's call.
    pub(super) async fn infer(
        &mut self,
        model: &str,
        version: Option<u64>,
        inputs: Vec<Tensor>,
        outputs: Vec<String>,
    ) -> Result<Vec<Tensor>, Error> {
        let context = self.context()?;
        let runner = context.runner.clone();
        // The plugin's own model, in its sequence, runs the version the
        // plugin belongs to, whatever a rollout would pick for a call that
        // names none.
        let (sequence, version) = match &context.sequence {
            Some((own, own_version, id)) if own == model && version.is_none_or(|v| v == *own_version) => {
                (Some(SequenceRequest { id: id.clone(), start: false, end: false, owner: None }), Some(*own_version))
            }
            _ => (None, version),
        };
        let options = RequestOptions { sequence, trace: context.trace.clone(), ..RequestOptions::default() };
        self.counted(runner.infer(model.to_owned(), version, inputs, outputs, options))
            .await
            .map_err(|e| callee_error(model, e))
    }

    /// `plinth:plugin/inference.predict`: a raw request through `model`'s
    /// plugin and model, refused when it would close a cycle or exceed
    /// [`MAX_DEPTH`].
    ///
    /// # Errors
    /// As [`Composition::infer`]; [`Error::Internal`] for a cycle or a
    /// chain too deep, before anything runs.
    pub(super) async fn predict(
        &mut self,
        model: &str,
        version: Option<u64>,
        req: RawRequest,
    ) -> Result<RawResponse, Error> {
        let context = self.context()?;
        let chain = &context.chain;
        if chain.iter().any(|m| m == model) {
            let path = chain.join(" → ");
            return Err(Error::Internal(format!(
                "calling model '{model}' from {path} would be a cycle ({path} → {model}); nothing ran"
            )));
        }
        if chain.len() >= MAX_DEPTH {
            return Err(Error::Internal(format!(
                "calling model '{model}' would pass through more than {MAX_DEPTH} plugins ({}); nothing ran",
                chain.join(" → ")
            )));
        }
        let (runner, chain, trace) = (context.runner.clone(), chain.clone(), context.trace.clone());
        self.counted(runner.predict(model.to_owned(), version, req, chain, trace))
            .await
            .map_err(|e| callee_error(model, e))
    }

    fn context(&self) -> Result<&CallContext, Error> {
        self.context.as_ref().ok_or_else(|| {
            Error::Internal("other models can be run from preprocess and postprocess, not from init".to_owned())
        })
    }

    /// Awaits a composed call's `future` and counts its time in
    /// [`Composition::host_time`].
    async fn counted<T>(&mut self, future: BoxFuture<Result<T, Error>>) -> Result<T, Error> {
        let started = Instant::now();
        self.composed = true;
        let result = future.await;
        self.host_time += started.elapsed();
        result
    }
}

/// The callee's error for the plugin: the same class, its message naming
/// the model called (each contract version then keeps the classes it has).
fn callee_error(model: &str, e: Error) -> Error {
    e.map_message(|m| format!("model '{model}': {m}"))
}

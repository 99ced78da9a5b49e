//! The one path every inference takes, whoever sends it (an HTTP or gRPC
//! client, `/predict`, OpenAI's routes, a plugin's composed call, an
//! ensemble step):
//!
//! 1. [`Lifecycle::accept`] routes the request to a version (the rollout's
//!    split or sticky header for a request that names none; on-demand
//!    loading and residency apply);
//! 2. the caller reads the request for that version (its signature);
//! 3. [`Accepted::infer`] or [`Accepted::predict`] re-routes a sequence's
//!    request to the version its id keeps, takes a shadow ticket, runs the
//!    model, counts the answer for the rollout, and hands the ticket back
//!    with the answer (the candidate runs it too) or without one.
//!
//! Composed calls and ensemble steps take every step but the shadow one:
//! the shadow run of a client's request makes the same composed calls on
//! its own, so shadowing them too would run the candidate's work twice.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use opentelemetry::KeyValue;

use super::Lifecycle;
use crate::error::Error;
use crate::model::{Model, OutputRequest, PredictTiming};
use crate::plugin::{CallContext, ModelRunner, RawRequest, RawResponse};
use crate::protocol::request::RequestHead;
use crate::rollout::ShadowTicket;
use crate::scheduler::Timing;
use crate::scheduler::policy::RequestOptions;
use crate::scheduler::sequence::{Owner, SequenceRequest};
use crate::tensor::Tensor;
use crate::trace::Span;

/// Looks up a request header (HTTP) or metadata key (gRPC) by its
/// lower-case name, for a rollout's `sticky_header`.
pub type Headers<'a> = &'a (dyn Fn(&str) -> Option<String> + Sync);

/// The headers of a call that has none (composed calls, ensemble steps).
pub const NO_HEADERS: Headers<'static> = &|_| None;

/// Who sent a request, which decides whether a rollout shadows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Caller {
    /// A client of the server: every step.
    Client,
    /// A plugin's composed call or an ensemble step: never shadowed.
    Composed,
}

/// An inference request read for its model.
pub struct InferCall {
    /// The inputs, in request order.
    pub tensors: Vec<Tensor>,
    /// The outputs asked for, in order; empty for all.
    pub requested: Vec<OutputRequest>,
    /// `priority`, `timeout` and the sequence parameters.
    pub options: RequestOptions,
}

impl InferCall {
    /// The call a decoded request makes: its inputs, its `head` (the
    /// outputs it asks for and its parameters), the client's request `id`,
    /// and the stream it came on, if any (which owns the sequences it
    /// starts).
    pub fn new(tensors: Vec<Tensor>, head: &RequestHead, id: Option<String>, stream: Option<Owner>) -> InferCall {
        let requested = head
            .outputs
            .iter()
            .map(|o| OutputRequest { name: o.name.clone(), classification: o.classification })
            .collect();
        let p = &head.parameters;
        let sequence =
            p.sequence.clone().map(|s| SequenceRequest { id: s.id.into(), start: s.start, end: s.end, owner: stream });
        let options =
            RequestOptions { priority: p.priority, timeout_us: p.timeout_us, sequence, request_id: id, trace: None };
        InferCall { tensors, requested, options }
    }
}

/// What an inference returned.
pub struct Inferred<T> {
    /// The version that answered.
    pub model: Arc<Model>,
    /// The outputs asked for.
    pub outputs: Vec<Tensor>,
    /// Where its time went.
    pub timing: Timing,
    /// What the caller's decoder kept of the request.
    pub request: T,
}

/// A request routed to a version, not yet run (see the module's steps).
pub struct Accepted {
    lifecycle: Arc<Lifecycle>,
    model: Arc<Model>,
    /// The version the request named, if any.
    named: Option<u64>,
    caller: Caller,
}

impl Lifecycle {
    /// Routes a request for `name` (`version`, when it names one) sent by
    /// `caller`: with no version, to the version the model's rollout picks
    /// (`headers` for a sticky one), else as [`Lifecycle::resolve`].
    ///
    /// # Errors
    /// As [`Lifecycle::resolve`].
    pub async fn accept(
        self: &Arc<Self>,
        name: &str,
        version: Option<u64>,
        headers: Headers<'_>,
        caller: Caller,
    ) -> Result<Accepted, Error> {
        let model = self.route(name, version, headers).await?;
        Ok(Accepted { lifecycle: self.clone(), model, named: version, caller })
    }

    /// As [`Lifecycle::accept`], for a composed call of a sequence: its id
    /// keeps it on one version ([`Accepted::infer`] re-routes it by the
    /// id), so it takes no turn in the rollout's split by count.
    ///
    /// # Errors
    /// As [`Lifecycle::resolve`].
    pub(super) async fn accept_sequence_step(
        self: &Arc<Self>,
        name: &str,
        version: Option<u64>,
    ) -> Result<Accepted, Error> {
        let model = self.resolve(name, version).await?;
        Ok(Accepted { lifecycle: self.clone(), model, named: version, caller: Caller::Composed })
    }
}

/// `options` for a composed call to `callee`: an ensemble's sequence
/// reaches the steps that are sequence models (or ensembles); the others
/// run as if it had none.
pub(super) fn for_callee(callee: &Model, mut options: RequestOptions) -> RequestOptions {
    if !callee.takes_sequences() {
        options.sequence = None;
    }
    options
}

impl Accepted {
    /// The version the request was routed to: the one to read it for.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Runs an inference: `decode` reads the request for the routed
    /// version and returns the call and what the caller keeps for the
    /// answer; `trace` is the request's root span, when it is traced. A
    /// request refused in decoding counts as a failure of the model.
    ///
    /// # Errors
    /// `decode`'s error; [`Error::InvalidArgument`] for sequence
    /// parameters sent to a model without `sequence_batching`;
    /// [`Model::infer`]'s errors.
    pub async fn infer<T>(
        self,
        trace: Option<Span>,
        decode: impl FnOnce(&Model) -> Result<(InferCall, T), Error>,
    ) -> Result<Inferred<T>, Error> {
        let Accepted { lifecycle, model, named, caller } = self;
        tracing::debug!(model = %model.name, version = model.version, "infer: accepted");
        let (mut call, request) = decode(&model).map_err(|e| model.refused(e))?;
        let model = lifecycle.route_sequence(model, named, call.options.sequence.as_ref()).await;
        if let (Some(span), Some(id)) = (&trace, &call.options.request_id) {
            span.set(KeyValue::new("request_id", id.clone()));
        }
        call.options.trace = trace.or(call.options.trace);
        if caller == Caller::Composed {
            call.options = for_callee(&model, call.options);
        } else if call.options.sequence.is_some() && !model.takes_sequences() {
            return Err(model.refused(Error::InvalidArgument(format!(
                "model '{}' has no sequence_batching: the request parameters 'sequence_id', 'sequence_start' and 'sequence_end' are for sequence models",
                model.name
            ))));
        }
        // A sequence's requests carry state: they are never shadowed.
        let shadowed = caller == Caller::Client && call.options.sequence.is_none();
        let shadow = Shadow::take(&lifecycle, &model, shadowed, call.options.trace.as_ref(), || {
            (call.tensors.clone(), call.requested.clone())
        });
        let runner: Arc<dyn ModelRunner> = lifecycle.clone();
        let result =
            observed(&lifecycle, &model, model.infer(call.tensors, &call.requested, call.options, &runner)).await;
        Shadow::settle(shadow, &lifecycle, &result, |lifecycle, ticket, (inputs, requested), (outputs, _)| {
            lifecycle.shadow_infer(ticket, inputs, requested, outputs.clone());
        });
        let (outputs, timing) = result?;
        Ok(Inferred { model, outputs, timing, request })
    }

    /// Sends a raw request through the routed version's plugin and model
    /// (`/predict`); `chain` is the plugins already on the call's path (a
    /// composed call's callers), `trace` the span it runs under. Returns
    /// the version that answered with its answer.
    ///
    /// # Errors
    /// As [`Model::predict_within`].
    pub async fn predict(
        self,
        request: RawRequest,
        chain: Vec<String>,
        trace: Option<Span>,
    ) -> Result<(Arc<Model>, RawResponse, PredictTiming), Error> {
        let Accepted { lifecycle, model, caller, .. } = self;
        tracing::debug!(model = %model.name, version = model.version, "predict: accepted");
        let shadow = Shadow::take(&lifecycle, &model, caller == Caller::Client, trace.as_ref(), || request.clone());
        let context = CallContext { runner: lifecycle.clone(), chain, sequence: None, trace };
        let result = observed(&lifecycle, &model, model.predict_within(request, context)).await;
        Shadow::settle(shadow, &lifecycle, &result, |lifecycle, ticket, request, (response, _)| {
            lifecycle.shadow_predict(ticket, request, response.clone());
        });
        let (response, timing) = result?;
        Ok((model, response, timing))
    }
}

/// Runs `run` on `model` and counts its answer for the model's rollout (a
/// failure on the server's side counts against the version).
async fn observed<A>(
    lifecycle: &Arc<Lifecycle>,
    model: &Model,
    run: impl Future<Output = Result<A, Error>>,
) -> Result<A, Error> {
    let started = Instant::now();
    let result = run.await;
    lifecycle.observe(model, started.elapsed(), result.as_ref().is_err_and(Error::is_server_side));
    result
}

/// A request the rollout's candidate runs too, after the serving version:
/// its ticket and a copy of the request `R`.
struct Shadow<R> {
    ticket: ShadowTicket,
    request: R,
}

impl<R> Shadow<R> {
    /// The shadow of a request to `model` when `wanted` and its rollout
    /// takes one now (`copy` makes the copy then); marks `trace`.
    fn take(
        lifecycle: &Lifecycle,
        model: &Model,
        wanted: bool,
        trace: Option<&Span>,
        copy: impl FnOnce() -> R,
    ) -> Option<Shadow<R>> {
        if !wanted {
            return None;
        }
        let ticket = lifecycle.shadow_ticket(model)?;
        if let Some(span) = trace {
            span.set(KeyValue::new("plinth.rollout.shadowed", true));
        }
        Some(Shadow { ticket, request: copy() })
    }

    /// Hands the ticket back: with the serving version's answer to `run`
    /// (which starts the candidate's run), or released when it failed.
    fn settle<A>(
        shadow: Option<Shadow<R>>,
        lifecycle: &Arc<Lifecycle>,
        answer: &Result<A, Error>,
        run: impl FnOnce(&Arc<Lifecycle>, ShadowTicket, R, &A),
    ) {
        match (shadow, answer) {
            (Some(Shadow { ticket, request }), Ok(answer)) => run(lifecycle, ticket, request, answer),
            (Some(Shadow { ticket, .. }), Err(_)) => lifecycle.release_shadow(&ticket),
            (None, _) => {}
        }
    }
}

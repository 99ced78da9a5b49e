//! The lifecycle as the [`ModelRunner`] of plugins' composed calls and
//! ensemble steps: a call takes the path a client's request takes
//! (`serve`), as [`Caller::Composed`]; and the [`WarmUpRunner`] of a
//! plugin's warm-up samples.

use std::sync::Arc;

use super::Lifecycle;
use super::serve::{Caller, InferCall, NO_HEADERS, for_callee};
use crate::config::Signature;
use crate::error::Error;
use crate::model::{Model, OutputRequest};
use crate::plugin::compose::BoxFuture;
use crate::plugin::{CallContext, ModelRunner, RawRequest, RawResponse};
use crate::registry::Registry;
use crate::scheduler::policy::RequestOptions;
use crate::tensor::Tensor;
use crate::trace::Span;

impl ModelRunner for Lifecycle {
    fn infer(
        self: Arc<Self>,
        model: String,
        version: Option<u64>,
        inputs: Vec<Tensor>,
        outputs: Vec<String>,
        options: RequestOptions,
    ) -> BoxFuture<Result<Vec<Tensor>, Error>> {
        Box::pin(async move {
            let requested = outputs.iter().map(|name| OutputRequest::named(name)).collect();
            let call = InferCall { tensors: inputs, requested, options };
            let accepted = match &call.options.sequence {
                Some(_) => self.accept_sequence_step(&model, version).await?,
                None => self.accept(&model, version, NO_HEADERS, Caller::Composed).await?,
            };
            Ok(accepted.infer(None, |_| Ok((call, ()))).await?.outputs)
        })
    }

    fn signature(self: Arc<Self>, model: String, version: Option<u64>) -> BoxFuture<Result<Signature, Error>> {
        // Not routed: a rollout's versions take the same tensors, and a
        // look at the signature is no request to count.
        Box::pin(async move { Ok(self.resolve(&model, version).await?.signature.clone()) })
    }

    fn predict(
        self: Arc<Self>,
        model: String,
        version: Option<u64>,
        request: RawRequest,
        chain: Vec<String>,
        trace: Option<Span>,
    ) -> BoxFuture<Result<RawResponse, Error>> {
        Box::pin(async move {
            let accepted = self.accept(&model, version, NO_HEADERS, Caller::Composed).await?;
            Ok(accepted.predict(request, chain, trace).await?.1)
        })
    }
}

/// The runner of a plugin's composed calls while its model warms up
/// (`plugin.warmup`), before the version is READY: calls to the model
/// itself reach the version warming up, calls to others reach their READY
/// versions. Nothing loads on demand from a warm-up (the load in progress
/// holds its model's record and a load permit), so a callee that is not
/// READY answers UNAVAILABLE, and the warm-up stops at that call.
pub(super) struct WarmUpRunner {
    /// The version warming up.
    pub(super) model: Arc<Model>,
    /// Where the other models are.
    pub(super) registry: Arc<Registry>,
}

impl WarmUpRunner {
    fn resolve(&self, name: &str, version: Option<u64>) -> Result<Arc<Model>, Error> {
        if name == self.model.name && version.is_none_or(|v| v == self.model.version) {
            Ok(self.model.clone())
        } else {
            self.registry.resolve(name, version)
        }
    }
}

impl ModelRunner for WarmUpRunner {
    fn infer(
        self: Arc<Self>,
        model: String,
        version: Option<u64>,
        inputs: Vec<Tensor>,
        outputs: Vec<String>,
        options: RequestOptions,
    ) -> BoxFuture<Result<Vec<Tensor>, Error>> {
        Box::pin(async move {
            let callee = self.resolve(&model, version)?;
            infer_on(&callee, inputs, &outputs, options, self).await
        })
    }

    fn signature(self: Arc<Self>, model: String, version: Option<u64>) -> BoxFuture<Result<Signature, Error>> {
        Box::pin(async move { Ok(self.resolve(&model, version)?.signature.clone()) })
    }

    fn predict(
        self: Arc<Self>,
        model: String,
        version: Option<u64>,
        request: RawRequest,
        chain: Vec<String>,
        trace: Option<Span>,
    ) -> BoxFuture<Result<RawResponse, Error>> {
        Box::pin(async move {
            let callee = self.resolve(&model, version)?;
            predict_on(&callee, request, chain, trace, self).await
        })
    }
}

/// Runs a composed `infer` on `callee`, whose own composed calls go to
/// `runner`.
async fn infer_on(
    callee: &Model,
    inputs: Vec<Tensor>,
    outputs: &[String],
    options: RequestOptions,
    runner: Arc<dyn ModelRunner>,
) -> Result<Vec<Tensor>, Error> {
    let requested: Vec<OutputRequest> = outputs.iter().map(|name| OutputRequest::named(name)).collect();
    let (outputs, _) = callee.infer(inputs, &requested, for_callee(callee, options), &runner).await?;
    Ok(outputs)
}

/// Runs a composed `predict` on `callee` for the plugins in `chain`, under
/// the calling stage's span `trace`.
async fn predict_on(
    callee: &Model,
    request: RawRequest,
    chain: Vec<String>,
    trace: Option<Span>,
    runner: Arc<dyn ModelRunner>,
) -> Result<RawResponse, Error> {
    let context = CallContext { runner, chain, sequence: None, trace };
    let (response, _) = callee.predict_within(request, context).await?;
    Ok(response)
}

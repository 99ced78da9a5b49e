//! The lifecycle as the [`ModelRunner`] of plugins' composed calls: the
//! callee is resolved as a client's request is (on-demand loading and
//! residency apply) and runs through its own scheduler and plugin.

use std::sync::Arc;

use super::Lifecycle;
use crate::config::Signature;
use crate::error::Error;
use crate::model::OutputRequest;
use crate::plugin::compose::BoxFuture;
use crate::plugin::{CallContext, ModelRunner, RawRequest, RawResponse};
use crate::scheduler::policy::RequestOptions;
use crate::tensor::Tensor;

impl ModelRunner for Lifecycle {
    fn infer(
        self: Arc<Self>,
        model: String,
        version: Option<u64>,
        inputs: Vec<Tensor>,
        outputs: Vec<String>,
        mut options: RequestOptions,
    ) -> BoxFuture<Result<Vec<Tensor>, Error>> {
        Box::pin(async move {
            let callee = self.resolve(&model, version).await?;
            let requested: Vec<OutputRequest> = outputs.iter().map(|name| OutputRequest::named(name)).collect();
            let runner: Arc<dyn ModelRunner> = self;
            // An ensemble's sequence reaches the steps that are sequence
            // models (or ensembles); the others run as if it had none.
            if !callee.takes_sequences() {
                options.sequence = None;
            }
            let (outputs, _) = callee.infer(inputs, &requested, options, &runner).await?;
            Ok(outputs)
        })
    }

    fn signature(self: Arc<Self>, model: String, version: Option<u64>) -> BoxFuture<Result<Signature, Error>> {
        Box::pin(async move { Ok(self.resolve(&model, version).await?.signature.clone()) })
    }

    fn predict(
        self: Arc<Self>,
        model: String,
        version: Option<u64>,
        request: RawRequest,
        chain: Vec<String>,
    ) -> BoxFuture<Result<RawResponse, Error>> {
        Box::pin(async move {
            let callee = self.resolve(&model, version).await?;
            let context = CallContext { runner: self, chain, sequence: None };
            let (response, _) = callee.predict_within(request, context).await?;
            Ok(response)
        })
    }
}

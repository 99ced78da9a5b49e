//! The host side of `plinth:plugin/inference` (WIT 0.2): a plugin runs
//! other models of the repository, resolved as a client's request is (so
//! on-demand loading and residency apply) and run through their schedulers.
//!
//! A plugin call runs on a blocking thread, so the async model calls are
//! driven there with the runtime's handle. Each call carries the chain of
//! models whose plugin is running for the request, which stops cycles and
//! runaway depth before anything runs.

use std::sync::{Arc, OnceLock, Weak};

use super::{RawRequest, wit};
use crate::error::Error;
use crate::lifecycle::Lifecycle;
use crate::scheduler::policy::RequestOptions;

/// The most plugins one request may pass through (`predict` nesting).
pub const MAX_DEPTH: usize = 8;

/// Where composed calls find models: set once the lifecycle exists (not in
/// `plinth check`, where composition answers an error).
#[derive(Clone, Default)]
pub struct Models(Arc<OnceLock<Weak<Lifecycle>>>);

impl Models {
    /// Connects composed calls to `lifecycle`; later calls are ignored.
    pub fn connect(&self, lifecycle: &Arc<Lifecycle>) {
        let _ = self.0.set(Arc::downgrade(lifecycle));
    }

    fn lifecycle(&self) -> Result<Arc<Lifecycle>, wit::Error> {
        self.0
            .get()
            .and_then(Weak::upgrade)
            .ok_or_else(|| wit::Error::Internal("other models cannot be run here (no server is running)".to_owned()))
    }
}

/// What one plugin call may compose: the models, and the chain of models
/// whose plugin is running for this request, outermost first (this call's
/// model last).
pub struct Composition {
    pub(super) models: Models,
    pub(super) chain: Vec<String>,
    /// Time spent in composed calls since the deadline was last extended:
    /// the callee's work does not count against this plugin's time limit.
    pub(super) host_time: std::time::Duration,
}

impl Composition {
    /// `plinth:plugin/inference.infer`: tensors through `model`'s scheduler.
    pub fn infer(
        &mut self,
        model: &str,
        version: Option<u64>,
        inputs: Vec<wit::Tensor>,
        outputs: Vec<String>,
    ) -> Result<Vec<wit::Tensor>, wit::Error> {
        let lifecycle = self.models.lifecycle()?;
        let inputs = inputs.into_iter().map(super::convert::tensor_from_wit).collect();
        let run = async {
            let callee = lifecycle.resolve(model, version).await?;
            callee.infer(inputs, &outputs, RequestOptions::default()).await
        };
        let (outputs, _) = self.block_on(run).map_err(|e| self.callee_error(model, e))?;
        Ok(outputs.into_iter().map(super::convert::tensor_to_wit).collect())
    }

    /// `plinth:plugin/inference.predict`: a raw request through `model`'s
    /// plugin and model, refused when it would close a cycle or exceed
    /// [`MAX_DEPTH`].
    pub fn predict(
        &mut self,
        model: &str,
        version: Option<u64>,
        req: wit::Request,
    ) -> Result<wit::Response, wit::Error> {
        if self.chain.iter().any(|m| m == model) {
            let path = self.chain.join(" → ");
            return Err(wit::Error::Internal(format!(
                "calling model '{model}' from {path} would be a cycle ({path} → {model}); nothing ran"
            )));
        }
        if self.chain.len() >= MAX_DEPTH {
            return Err(wit::Error::Internal(format!(
                "calling model '{model}' would pass through more than {MAX_DEPTH} plugins ({}); nothing ran",
                self.chain.join(" → ")
            )));
        }
        let lifecycle = self.models.lifecycle()?;
        let req = RawRequest { content_type: req.content_type, body: req.body, parameters: req.parameters };
        let chain = self.chain.clone();
        let run = async move {
            let callee = lifecycle.resolve(model, version).await?;
            callee.predict_within(req, &chain).await
        };
        let (response, _) = self.block_on(run).map_err(|e| self.callee_error(model, e))?;
        Ok(wit::Response { content_type: response.content_type, body: response.body })
    }

    /// Drives `future` to completion from the plugin's blocking thread and
    /// counts the time in [`Composition::host_time`].
    fn block_on<T>(&mut self, future: impl Future<Output = Result<T, Error>>) -> Result<T, Error> {
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::Internal("composed calls need the server's runtime".to_owned()))?;
        let started = std::time::Instant::now();
        let result = handle.block_on(future);
        self.host_time += started.elapsed();
        result
    }

    /// The callee's error as a value for the plugin: the request's fault
    /// stays `bad-input`, anything else is `internal`.
    fn callee_error(&self, model: &str, e: Error) -> wit::Error {
        let message = format!("model '{model}': {e}");
        match e {
            Error::InvalidArgument(_) => wit::Error::BadInput(message),
            _ => wit::Error::Internal(message),
        }
    }
}

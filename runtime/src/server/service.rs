//! The service core both front ends call: readiness, server and model
//! metadata, configuration, statistics, the repository extension and the
//! inference entry points, each written once. The axum routes
//! (`routes`) and the tonic services (`grpc`) only translate between their
//! protocol and these calls.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Map, Value};
use std::sync::atomic::{AtomicBool, Ordering};

use super::logging::Logging;
use super::restrictions::Restrictions;
use super::shared_memory::{OutputPlaces, SharedMemory};
use crate::config::ModelConfig;
use crate::drain::{Hold, InUse};
use crate::error::Error;
use crate::lifecycle::Lifecycle;
use crate::metrics::ModelStatistics;
use crate::model::{Model, OutputRequest, PredictTiming};
use crate::plugin::{CallContext, ModelRunner, RawRequest, RawResponse};
use crate::protocol::json::{ModelMetadata, TensorMetadata};
use crate::protocol::repository::LoadRequest;
use crate::protocol::request::{RequestHead, RequestedOutput};
use crate::registry::{IndexEntry, Registry, RepositoryState, UNKNOWN_MODEL};
use crate::rollout::{Plan, RolloutStatus};
use crate::scheduler::Timing;
use crate::scheduler::policy::RequestOptions;
use crate::scheduler::sequence::{Owner, SequenceRequest};
use crate::tensor::{Tensor, TensorSpec};
use crate::trace::{Front, Span, Tracing, Update};
use opentelemetry::KeyValue;

/// The protocol extensions Plinth serves, as server metadata lists them
/// (Triton's names): exactly those it implements.
pub const EXTENSIONS: [&str; 9] = [
    "binary_tensor_data",
    "classification",
    "logging",
    "model_configuration",
    "model_repository",
    "schedule_policy",
    "statistics",
    "system_shared_memory",
    "trace",
];

/// How long a shared lock of the core may stay held before readiness says
/// the server cannot serve: far above any hold of a working server
/// (microseconds), far below a readiness probe's timeout.
pub const STUCK_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// The server's name in server metadata.
pub const SERVER_NAME: &str = "plinth";

/// State shared by every handler of both front ends, and the operations on
/// it.
pub struct Service {
    /// Loads and unloads models; resolves requests to them.
    pub lifecycle: Arc<Lifecycle>,
    /// Set once the start-up loads have been tried.
    pub startup_done: AtomicBool,
    /// Set at SIGTERM/SIGINT: not ready.
    pub shutting_down: AtomicBool,
    /// Set `--drain-delay-secs` after SIGTERM/SIGINT: no new inference.
    pub refusing: AtomicBool,
    /// Inference requests accepted and not yet answered.
    pub in_flight: InUse,
    /// `--strict-readiness`: ready only when every model is READY.
    pub strict_readiness: bool,
    /// `--http-max-body-bytes`: the largest body (and gRPC message) taken.
    pub max_body_bytes: usize,
    /// The process's log, whose level the logging extension changes;
    /// `None` where no log was set up (unit tests).
    pub logging: Option<Arc<Logging>>,
    /// `--http-restricted-api`: the HTTP APIs that need a header.
    pub http_restrictions: Restrictions,
    /// `--grpc-restricted-protocol`: the gRPC APIs that need a header.
    pub grpc_restrictions: Restrictions,
    /// The system shared memory regions clients registered
    /// (`--allow-client-shm`).
    pub shared_memory: SharedMemory,
    /// Request tracing (`--trace-config`); `None` where the process set up
    /// none (unit tests).
    pub tracing: Option<Arc<Tracing>>,
    /// The status page's samples of the counters.
    pub status: super::status::Sampler,
    /// The HTTP request bodies read and decoded at once.
    pub request_memory: super::memory::RequestMemory,
}

/// An inference request as a front end decoded it for its model.
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

/// Where the requested outputs that name a shared memory region go, each
/// checked against its region now, before the model runs.
///
/// # Errors
/// The errors of [`SharedMemory::output`] (an unregistered region, a place
/// past its end).
pub fn output_places(service: &Service, outputs: &[RequestedOutput]) -> Result<OutputPlaces, Error> {
    let mut places = OutputPlaces::default();
    for o in outputs {
        if let Some(at) = &o.region {
            places.insert(o.name.clone(), service.shared_memory.output(at.clone())?);
        }
    }
    Ok(places)
}

/// What an inference returned.
pub struct Inferred<T> {
    /// The version that answered.
    pub model: Arc<Model>,
    /// The outputs asked for.
    pub outputs: Vec<Tensor>,
    /// Where its time went.
    pub timing: Timing,
    /// What the front end's decoder kept of the request.
    pub request: T,
}

impl Service {
    /// The service over `lifecycle`, not ready until the start-up loads are
    /// done.
    pub fn new(lifecycle: Arc<Lifecycle>, strict_readiness: bool, max_body_bytes: usize) -> Service {
        let shared_memory = SharedMemory::new(false, max_body_bytes as u64, lifecycle.metrics().shared_memory.clone());
        Service {
            lifecycle,
            startup_done: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
            refusing: AtomicBool::new(false),
            in_flight: InUse::default(),
            strict_readiness,
            max_body_bytes,
            logging: None,
            http_restrictions: Restrictions::default(),
            grpc_restrictions: Restrictions::default(),
            shared_memory,
            tracing: None,
            status: super::status::Sampler::default(),
            request_memory: super::memory::RequestMemory::new(max_body_bytes as u64 * 4),
        }
    }

    /// The models and their states.
    pub fn registry(&self) -> &Registry {
        self.lifecycle.registry()
    }

    /// Ready (`/v2/health/ready`, `ServerReady`): the start-up loads are
    /// done, shutdown has not begun, the core can serve (no shared lock of
    /// it is stuck for [`STUCK_AFTER`]) and, with `--strict-readiness`,
    /// every model that should be loaded is READY.
    pub fn is_ready(&self) -> bool {
        let loaded = self.startup_done.load(Ordering::Acquire) && !self.shutting_down.load(Ordering::Acquire);
        loaded && (!self.strict_readiness || self.registry().all_ready()) && self.core_can_serve()
    }

    /// Whether no shared lock of the core is held past [`STUCK_AFTER`]
    /// (a request stuck while holding it holds up every other); logged
    /// when one is.
    fn core_can_serve(&self) -> bool {
        let Some(part) = self.lifecycle.stuck(STUCK_AFTER) else { return true };
        tracing::error!(part, "not ready: {part} has been held for over {STUCK_AFTER:?}, so requests cannot be served");
        false
    }

    /// Counts an inference request in flight until the guard drops.
    ///
    /// # Errors
    /// [`Error::Unavailable`] once shutdown has stopped taking requests.
    pub fn begin_inference(&self) -> Result<Hold, Error> {
        let guard = self.in_flight.hold();
        // Checked after counting, so shutdown never misses a request it let in.
        if self.refusing.load(Ordering::Acquire) {
            return Err(Error::Unavailable("the server is shutting down".into()));
        }
        Ok(guard)
    }

    /// The model a request for `name` (and `version`) reaches; in on-demand
    /// mode this loads it if needed.
    ///
    /// # Errors
    /// As [`Lifecycle::resolve`].
    pub async fn model(&self, name: &str, version: Option<u64>) -> Result<Arc<Model>, Error> {
        self.lifecycle.resolve(name, version).await
    }

    /// The model an inference request for `name` (and `version`) reaches:
    /// as [`Service::model`], but a request that names no version goes
    /// where the model's rollout sends it (`header` looks up the request's
    /// headers or gRPC metadata, for a sticky rollout).
    ///
    /// # Errors
    /// As [`Lifecycle::resolve`].
    pub async fn model_for_request(
        &self,
        name: &str,
        version: Option<u64>,
        header: &(dyn Fn(&str) -> Option<String> + Sync),
    ) -> Result<Arc<Model>, Error> {
        self.lifecycle.route(name, version, header).await
    }

    /// Model readiness (`/v2/models/{m}/ready`, `ModelReady`): whether the
    /// version is READY now; never loads.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown model or version,
    /// [`Error::Unavailable`] with the reason when it is not READY.
    pub fn model_ready(&self, name: &str, version: Option<u64>) -> Result<(), Error> {
        self.registry().resolve(name, version).map(drop)
    }

    /// Model metadata (`GET /v2/models/{m}`, `ModelMetadata`): its READY
    /// versions, platform and tensors (shapes with -1 for any size, batch
    /// dimension included).
    ///
    /// # Errors
    /// As [`Service::model`].
    pub async fn model_metadata(&self, name: &str, version: Option<u64>) -> Result<ModelMetadata, Error> {
        let m = self.model(name, version).await?;
        let tensors = |specs: &[TensorSpec]| {
            specs
                .iter()
                .map(|s| TensorMetadata {
                    name: s.name.clone(),
                    datatype: s.datatype.name(),
                    shape: m.signature.full_shape(s),
                })
                .collect()
        };
        Ok(ModelMetadata {
            name: m.name.clone(),
            versions: self.registry().ready_versions(&m.name).iter().map(u64::to_string).collect(),
            platform: m.platform().to_owned(),
            inputs: tensors(&m.signature.inputs),
            outputs: tensors(&m.signature.outputs),
        })
    }

    /// The model configuration as served (`/config`, `ModelConfig`): inputs
    /// and outputs completed from the model file.
    ///
    /// # Errors
    /// As [`Service::model`].
    pub async fn model_config(&self, name: &str, version: Option<u64>) -> Result<ModelConfig, Error> {
        Ok(self.model(name, version).await?.completed_config())
    }

    /// Triton's statistics extension for the READY versions asked for:
    /// every model's (no name), one model's, or one version's.
    ///
    /// # Errors
    /// [`Error::NotFound`] or [`Error::Unavailable`] for a model or version
    /// that cannot be resolved.
    pub fn statistics(&self, name: Option<&str>, version: Option<u64>) -> Result<Vec<ModelStatistics>, Error> {
        let registry = self.registry();
        let models = match (name, version) {
            (None, _) => registry.ready_models(None),
            (Some(name), Some(v)) => vec![registry.resolve(name, Some(v))?],
            (Some(name), None) => {
                registry.resolve(name, None)?;
                registry.ready_models(Some(name))
            }
        };
        Ok(models.iter().map(|m| m.statistics()).collect())
    }

    /// The repository index: every model version and its state, or only the
    /// READY ones.
    pub fn repository_index(&self, ready_only: bool) -> Vec<IndexEntry> {
        let rows = self.registry().index();
        rows.into_iter().filter(|r| !ready_only || r.state == RepositoryState::Ready).collect()
    }

    /// Starts a rollout of `name` with the JSON `plan` (in any control
    /// mode: both versions must be READY).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a plan that does not parse or
    /// versions that are not READY; [`Error::NotFound`] for an unknown
    /// model.
    pub fn start_rollout(&self, name: &str, plan: &[u8]) -> Result<RolloutStatus, Error> {
        let plan = Plan::parse(plan).map_err(Error::InvalidArgument)?;
        self.lifecycle.start_rollout(name, plan)
    }

    /// `name`'s rollout, in progress or finished.
    ///
    /// # Errors
    /// [`Error::NotFound`] when it has none.
    pub fn rollout(&self, name: &str) -> Result<RolloutStatus, Error> {
        self.lifecycle.rollout(name).ok_or_else(|| Error::NotFound(format!("model '{name}' has no rollout")))
    }

    /// Every model's rollout.
    pub fn rollouts(&self) -> Vec<RolloutStatus> {
        self.lifecycle.rollouts()
    }

    /// Cancels `name`'s rollout in progress: the serving version takes
    /// every request back.
    ///
    /// # Errors
    /// [`Error::NotFound`] when it has none in progress.
    pub fn cancel_rollout(&self, name: &str) -> Result<RolloutStatus, Error> {
        self.lifecycle.cancel_rollout(name)
    }

    /// The repository extension's `load`: loads the model, or reloads what
    /// changed, with the request's `config` and `file:` overrides.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (HTTP 400, gRPC INVALID_ARGUMENT) with
    /// every failure's reason; [`Error::Unavailable`] (HTTP 503, gRPC
    /// UNAVAILABLE) when the control mode has no explicit loads, as Triton
    /// answers.
    pub async fn load(&self, name: &str, request: LoadRequest) -> Result<(), Error> {
        Ok(self.lifecycle.load(name, request).await?)
    }

    /// The repository extension's `unload`, with its `unload_dependents`
    /// parameter.
    ///
    /// # Errors
    /// As [`Lifecycle::unload`].
    pub async fn unload(&self, name: &str, unload_dependents: bool) -> Result<(), Error> {
        self.lifecycle.unload(name, unload_dependents).await
    }

    /// The logging extension's settings (`GET /v2/logging`, `LogSettings`).
    ///
    /// # Errors
    /// [`Error::Unsupported`] where the process set up no log of its own.
    pub fn log_settings(&self) -> Result<Value, Error> {
        Ok(self.log()?.settings())
    }

    /// Changes the log settings in `update` and returns them all.
    ///
    /// # Errors
    /// As [`Logging::update`], and as [`Service::log_settings`].
    pub fn update_log_settings(&self, update: &Map<String, Value>) -> Result<Value, Error> {
        self.log()?.update(update)
    }

    fn log(&self) -> Result<&Logging, Error> {
        self.logging.as_deref().ok_or_else(|| Error::Unsupported("this server has no log settings".into()))
    }

    /// The trace extension (`/v2/trace/setting`, `TraceSetting`): the
    /// settings in force, the server's or `model`'s, after applying
    /// `update` (nothing for a read).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming a setting that is unknown or does
    /// not parse; [`Error::NotFound`] for a model the repository does not
    /// know; [`Error::Unsupported`] where the process traces nothing.
    pub fn trace_settings(&self, model: Option<&str>, update: Option<&Update>) -> Result<Value, Error> {
        let tracing = self.tracing.as_deref().ok_or_else(|| Error::Unsupported("this server traces nothing".into()))?;
        if let Some(name) = model
            && !self.registry().index().iter().any(|row| row.name == name)
        {
            return Err(Error::NotFound(format!("{UNKNOWN_MODEL}: '{name}'")));
        }
        match update {
            None => Ok(tracing.settings(model)),
            Some(update) => tracing.update(model, update).map_err(Error::InvalidArgument),
        }
    }

    /// The root span of an inference request for `model`, when it is
    /// traced (see [`Tracing::start`]).
    pub fn start_trace(
        &self,
        model: &str,
        front: Front,
        traceparent: Option<&str>,
        tracestate: Option<&str>,
    ) -> Option<Span> {
        self.tracing.as_ref()?.start(model, front, traceparent, tracestate)
    }

    /// Runs an inference request on `model` (resolved with
    /// [`Service::model_for_request`]; `named` is the version the request
    /// named, if any): `decode` reads the request for it (a raw body needs
    /// its signature) and returns the call and what the front end keeps
    /// for the answer. A request refused in decoding counts as a failure
    /// of the model. A sequence's request that names no version goes to
    /// the version of the model's rollout that its sequence id picks, so
    /// that one sequence meets one version.
    ///
    /// # Errors
    /// `decode`'s error, and [`Model::infer`]'s.
    pub async fn infer<T>(
        &self,
        model: Arc<Model>,
        named: Option<u64>,
        trace: Option<Span>,
        decode: impl FnOnce(&Model) -> Result<(InferCall, T), Error>,
    ) -> Result<Inferred<T>, Error> {
        tracing::debug!(model = %model.name, version = model.version, "infer: accepted");
        let (mut call, request) = decode(&model).map_err(|e| model.refused(e))?;
        let model = self.lifecycle.route_sequence(model, named, call.options.sequence.as_ref()).await;
        if let (Some(span), Some(id)) = (&trace, &call.options.request_id) {
            span.set(KeyValue::new("request_id", id.clone()));
        }
        call.options.trace = trace;
        if call.options.sequence.is_some() && !model.takes_sequences() {
            return Err(model.refused(Error::InvalidArgument(format!(
                "model '{}' has no sequence_batching: the request parameters 'sequence_id', 'sequence_start' and 'sequence_end' are for sequence models",
                model.name
            ))));
        }
        // A sequence's requests carry state: they are never shadowed.
        let shadow = if call.options.sequence.is_none() { self.lifecycle.shadow_ticket(&model) } else { None };
        let copy = shadow.as_ref().map(|_| (call.tensors.clone(), call.requested.clone()));
        if let (Some(_), Some(span)) = (&shadow, &call.options.trace) {
            span.set(KeyValue::new("plinth.rollout.shadowed", true));
        }
        let runner: Arc<dyn ModelRunner> = self.lifecycle.clone();
        let started = Instant::now();
        let result = model.infer(call.tensors, &call.requested, call.options, &runner).await;
        self.lifecycle.observe(&model, started.elapsed(), result.as_ref().is_err_and(Error::is_server_side));
        match (shadow, copy, &result) {
            (Some(ticket), Some((inputs, requested)), Ok((outputs, _))) => {
                self.lifecycle.shadow_infer(ticket, inputs, requested, outputs.clone());
            }
            (Some(ticket), _, _) => self.lifecycle.release_shadow(&ticket),
            _ => {}
        }
        let (outputs, timing) = result?;
        Ok(Inferred { model, outputs, timing, request })
    }

    /// Sends a raw request through `model`'s plugin and model (`/predict`);
    /// the plugin's composed calls reach other models through the
    /// lifecycle. `trace` is the request's root span, when it is traced.
    ///
    /// # Errors
    /// As [`Model::predict`].
    pub async fn predict(
        &self,
        model: &Model,
        request: RawRequest,
        trace: Option<Span>,
    ) -> Result<(RawResponse, PredictTiming), Error> {
        tracing::debug!(model = %model.name, version = model.version, "predict: accepted");
        let shadow = self.lifecycle.shadow_ticket(model);
        let copy = shadow.as_ref().map(|_| request.clone());
        if let (Some(_), Some(span)) = (&shadow, &trace) {
            span.set(KeyValue::new("plinth.rollout.shadowed", true));
        }
        let context = CallContext { runner: self.lifecycle.clone(), chain: Vec::new(), sequence: None, trace };
        let started = Instant::now();
        let result = model.predict_within(request, context).await;
        self.lifecycle.observe(model, started.elapsed(), result.as_ref().is_err_and(Error::is_server_side));
        match (shadow, copy, &result) {
            (Some(ticket), Some(request), Ok((response, _))) => {
                self.lifecycle.shadow_predict(ticket, request, response.clone());
            }
            (Some(ticket), _, _) => self.lifecycle.release_shadow(&ticket),
            _ => {}
        }
        result
    }
}

/// A version number from a URL or a gRPC field: whole, no leading zeros.
///
/// # Errors
/// [`Error::NotFound`] for a well-formed number too large to be a version,
/// [`Error::InvalidArgument`] for anything else.
pub fn parse_version(v: &str) -> Result<u64, Error> {
    crate::repository::parse_version(v).ok_or_else(|| {
        if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) && !v.starts_with('0') {
            Error::NotFound(format!("no version {v}"))
        } else {
            Error::InvalidArgument(format!("model version must be a whole number without leading zeros, got '{v}'"))
        }
    })
}

//! The service core both front ends call: readiness, server and model
//! metadata, configuration, statistics, the repository extension and the
//! inference entry points, each written once. The axum routes
//! (`routes`) and the tonic services (`grpc`) only translate between their
//! protocol and these calls.

use std::sync::Arc;

use serde_json::{Map, Value};
use std::sync::atomic::{AtomicBool, Ordering};

use super::logging::Logging;
use super::restrictions::Restrictions;
use super::shared_memory::SharedMemory;
use crate::config::ModelConfig;
use crate::drain::{Hold, InUse};
use crate::error::Error;
use crate::lifecycle::{Accepted, Caller, Headers, Lifecycle};
use crate::metrics::ModelStatistics;
use crate::model::Model;
use crate::protocol::json::{ModelMetadata, TensorMetadata};
use crate::protocol::repository::LoadRequest;
use crate::registry::{IndexEntry, Registry, RepositoryState, UNKNOWN_MODEL};
use crate::tensor::TensorSpec;
use crate::trace::{Front, Span, Tracing, Update};

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
    pub(super) lifecycle: Arc<Lifecycle>,
    /// Set once the start-up loads have been tried.
    pub(super) startup_done: AtomicBool,
    /// Set at SIGTERM/SIGINT: not ready.
    pub(super) shutting_down: AtomicBool,
    /// Set `--drain-delay-secs` after SIGTERM/SIGINT: no new inference.
    pub(super) refusing: AtomicBool,
    /// Inference requests accepted and not yet answered.
    pub(super) in_flight: InUse,
    /// `--strict-readiness`: ready only when every model is READY.
    pub(super) strict_readiness: bool,
    /// `--http-max-body-bytes`: the largest body (and gRPC message) taken.
    pub(super) max_body_bytes: usize,
    /// The process's log, whose level the logging extension changes;
    /// `None` where no log was set up (unit tests).
    pub(super) logging: Option<Arc<Logging>>,
    /// `--http-restricted-api`: the HTTP APIs that need a header.
    pub(super) http_restrictions: Restrictions,
    /// `--grpc-restricted-protocol`: the gRPC APIs that need a header.
    pub(super) grpc_restrictions: Restrictions,
    /// The system shared memory regions clients registered
    /// (`--allow-client-shm`).
    pub(super) shared_memory: SharedMemory,
    /// Request tracing (`--trace-config`); `None` where the process set up
    /// none (unit tests).
    pub(super) tracing: Option<Arc<Tracing>>,
    /// The status page's samples of the counters.
    pub(super) status: super::status::Sampler,
    /// The HTTP request bodies read and decoded at once.
    pub(super) request_memory: super::memory::RequestMemory,
}

/// What `plinth serve`'s flags set in the [`Service`].
pub struct Settings {
    /// `--strict-readiness`: ready only when every model is READY.
    pub strict_readiness: bool,
    /// `--http-max-body-bytes`: the largest body (and gRPC message) taken.
    pub max_body_bytes: usize,
    /// `--http-max-inflight-body-bytes`: the request bodies read and
    /// decoded at once, in bytes.
    pub max_inflight_body_bytes: u64,
    /// The process's log, whose level the logging extension changes.
    pub logging: Option<Arc<Logging>>,
    /// `--http-restricted-api`.
    pub http_restrictions: Restrictions,
    /// `--grpc-restricted-protocol`.
    pub grpc_restrictions: Restrictions,
    /// `--allow-client-shm`.
    pub allow_client_shm: bool,
    /// `--shm-max-input-bytes`: what one request may read from shared
    /// memory, in bytes.
    pub shm_max_input_bytes: u64,
    /// Request tracing (`--trace-config`).
    pub tracing: Option<Arc<Tracing>>,
}

impl Settings {
    /// Strict readiness and a 1 MiB body limit; no log, tracing, shared
    /// memory or restrictions: the settings of the front ends' unit tests.
    #[cfg(test)]
    pub fn for_tests() -> Settings {
        Settings {
            strict_readiness: true,
            max_body_bytes: 1 << 20,
            max_inflight_body_bytes: 4 << 20,
            logging: None,
            http_restrictions: Restrictions::default(),
            grpc_restrictions: Restrictions::default(),
            allow_client_shm: false,
            shm_max_input_bytes: 1 << 20,
            tracing: None,
        }
    }
}

impl Service {
    /// The service over `lifecycle` with `settings`, not ready until the
    /// start-up loads are done.
    pub fn new(lifecycle: Arc<Lifecycle>, settings: Settings) -> Service {
        let held = lifecycle.metrics().shared_memory.clone();
        let shared_memory = SharedMemory::new(settings.allow_client_shm, settings.shm_max_input_bytes, held);
        Service {
            lifecycle,
            startup_done: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
            refusing: AtomicBool::new(false),
            in_flight: InUse::default(),
            strict_readiness: settings.strict_readiness,
            max_body_bytes: settings.max_body_bytes,
            logging: settings.logging,
            http_restrictions: settings.http_restrictions,
            grpc_restrictions: settings.grpc_restrictions,
            shared_memory,
            tracing: settings.tracing,
            status: super::status::Sampler::default(),
            request_memory: super::memory::RequestMemory::new(settings.max_inflight_body_bytes),
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

    /// A client's inference request for `name` (and `version`), routed
    /// to the version that serves it (where its rollout sends a request
    /// that names no version, by `headers` when sticky); in on-demand mode
    /// this loads it if needed. The front end then reads the request for
    /// that version and runs it ([`Accepted::infer`],
    /// [`Accepted::predict`]).
    ///
    /// # Errors
    /// As [`Lifecycle::resolve`].
    pub async fn accept(&self, name: &str, version: Option<u64>, headers: Headers<'_>) -> Result<Accepted, Error> {
        self.lifecycle.accept(name, version, headers, Caller::Client).await
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
        let rows = self.lifecycle.index();
        rows.into_iter().filter(|r| !ready_only || r.state == RepositoryState::Ready).collect()
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
            && !self.lifecycle.index().iter().any(|row| row.name == name)
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

//! One loaded model version and the request path through it:
//! (plugin preprocess) → checks → scheduler → backend instances → (plugin
//! postprocess). Plugins run per request, outside the scheduler.

pub mod cache;
mod check;
mod ensemble;
mod instances;
mod outputs;
mod reshape;
mod traced;
mod warmup;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::backend::onnx::OnnxRuntime;
use crate::backend::{Backend, BackendKind};
use crate::config::{self, ModelConfig, PLUGIN_PARAMETER, Signature};
use crate::error::Error;
use crate::metrics::{FailureReason, Metrics, ModelMetrics, PluginMetrics};
use crate::plugin::{CallContext, ModelInfo, ModelRunner, Plugin, PluginError, PluginHost, RawRequest, RawResponse};
use crate::repository::{self, ModelDir};
use crate::scheduler::policy::{Policy, RequestOptions};
use crate::scheduler::sequence::policy::SequencePolicy;
use crate::scheduler::sequence::{CorrelationId, Owner, SequenceRequest, SequenceScheduler, new_owner};
use crate::scheduler::{Scheduler, Timing};
use crate::tensor::Tensor;
use crate::trace::Span;

pub use cache::ResponseCache;
pub use check::check_inputs;
pub use ensemble::{Ensemble, Step};
pub use instances::may_use_gpu;
pub use outputs::OutputRequest;

/// What loading a model needs: the frameworks and the plugin sandbox.
pub struct Runtimes {
    /// ONNX Runtime, for `onnxruntime_onnx` models; `None` when no
    /// `ORT_DYLIB_PATH` was given (TorchScript and remote models still load).
    pub onnx: Option<OnnxRuntime>,
    /// libtorch, for `pytorch_libtorch` models.
    #[cfg(feature = "libtorch")]
    pub torch: crate::backend::torch::Libtorch,
    /// The machine's GPUs as NVML lists them (none without a driver).
    pub gpus: Arc<crate::gpu::Gpus>,
    /// The wasmtime sandbox, for model plugins.
    pub plugins: PluginHost,
    /// Where each model's inference metrics are registered.
    pub metrics: Arc<Metrics>,
    /// The server's response cache (`--cache-config`), for the models that
    /// enable it.
    pub response_cache: Option<Arc<ResponseCache>>,
}

impl Runtimes {
    /// Starts ONNX Runtime from `ort_dylib` (`ORT_DYLIB_PATH`), or else from
    /// `lib/libonnxruntime.so` beside the binary's folder (the bundle `make
    /// dist` builds), libtorch when built with the `libtorch` feature, and
    /// the plugin sandbox.
    ///
    /// # Errors
    /// A message when the given ONNX Runtime library cannot be loaded or
    /// wasmtime cannot start.
    pub fn start(
        ort_dylib: Option<&Path>,
        plugin_limits: crate::plugin::PluginLimits,
        plugin_cache_dir: Option<std::path::PathBuf>,
    ) -> Result<Runtimes, String> {
        let gpus = Arc::new(crate::gpu::Gpus::probe());
        match gpus.absence() {
            None => tracing::info!(gpus = ?gpus.devices(), "NVML lists the GPUs"),
            Some(why) => tracing::info!(%why, "no GPU"),
        }
        Ok(Runtimes {
            onnx: match ort_dylib.map(Path::to_path_buf).or_else(bundled_onnxruntime) {
                Some(path) => Some(OnnxRuntime::init(&path)?),
                None => {
                    tracing::warn!("no ORT_DYLIB_PATH: ONNX models will not load");
                    None
                }
            },
            #[cfg(feature = "libtorch")]
            torch: crate::backend::torch::Libtorch::init(),
            plugins: PluginHost::new(plugin_limits, plugin_cache_dir)?,
            metrics: Arc::new(Metrics::with_gpus(gpus.clone())),
            gpus,
            response_cache: None,
        })
    }
}

/// The response cache a model with `config` uses: the server's when the
/// configuration enables it, else none.
///
/// # Errors
/// A message when it enables it and the server has no cache, which Plinth
/// refuses rather than serve uncached.
fn response_cache(config: &ModelConfig, rt: &Runtimes) -> Result<Option<(Arc<ResponseCache>, u64)>, String> {
    if !config.response_cache.as_ref().is_some_and(|c| c.enable) {
        return Ok(None);
    }
    rt.response_cache.clone().map(|cache| Some((cache, ResponseCache::new_owner()))).ok_or_else(|| {
        format!(
            "response_cache.enable is set, but the server has no response cache; start it with {} local,size=BYTES",
            cache::FLAG
        )
    })
}

/// `../lib/libonnxruntime.so` relative to the running binary, if it exists.
fn bundled_onnxruntime() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let lib = exe.parent()?.parent()?.join("lib/libonnxruntime.so");
    lib.is_file().then_some(lib)
}

/// A model version that is loaded and can serve.
pub struct Model {
    /// The model's name (its folder name).
    pub name: String,
    /// The version number (its version folder name).
    pub version: u64,
    /// The configuration as `config.pbtxt` states it.
    pub config: ModelConfig,
    /// The inputs and outputs served, completed from the model file where
    /// the configuration leaves them out.
    pub signature: Signature,
    /// When this version was made (loaded); OpenAI's model `created`.
    pub loaded_at: SystemTime,
    engine: Engine,
    metrics: ModelMetrics,
    plugin: Option<Arc<Plugin>>,
    /// Class labels of the outputs with a `label_filename`, by output.
    labels: HashMap<String, Vec<String>>,
    /// The response cache, when the configuration enables it, and this
    /// load's owner number in it.
    cache: Option<(Arc<ResponseCache>, u64)>,
    /// Raw requests the warm-up sends through the plugin (`plugin.warmup`).
    plugin_samples: Vec<warmup::PluginSample>,
    /// Device memory the instances' loads took, in bytes, by GPU index.
    device_bytes: BTreeMap<u32, u64>,
}

/// What runs a model's requests.
enum Engine {
    /// One backend per `instance_group` instance behind the model's
    /// scheduler, whose workers run them; warm-up runs each.
    Backends { instances: Vec<Arc<dyn Backend>>, batcher: Batcher },
    /// An ensemble's steps, run through other models.
    Ensemble(Ensemble),
}

/// The scheduler in front of a model's instances.
enum Batcher {
    /// Requests queue by priority and batch dynamically (or run alone).
    Dynamic(Scheduler),
    /// Requests belong to sequences (`sequence_batching`).
    Sequence(SequenceScheduler),
}

/// How a model's requests are scheduled, as its configuration says.
pub enum Scheduling {
    /// `dynamic_batching`, or none.
    Dynamic(Policy),
    /// `sequence_batching`.
    Sequence(SequencePolicy),
}

impl Scheduling {
    /// The scheduling of `config`; initial state files are read from
    /// `model_dir`.
    ///
    /// # Errors
    /// As [`Policy::from_config`] and [`SequencePolicy::from_config`].
    pub fn from_config(config: &ModelConfig, model_dir: &Path) -> Result<Scheduling, String> {
        match SequencePolicy::from_config(config, model_dir)? {
            Some(sequence) => Ok(Scheduling::Sequence(sequence)),
            None => Policy::from_config(config).map(Scheduling::Dynamic),
        }
    }

    /// The tensors the backend exchanges: the requests' (`signature`) and,
    /// for a sequence model, the host's controls and state.
    fn backend_signature(&self, signature: &Signature) -> Signature {
        let mut full = signature.clone();
        if let Scheduling::Sequence(policy) = self {
            let (inputs, outputs) = policy.host_specs();
            full.inputs.extend(inputs);
            full.outputs.extend(outputs);
        }
        full
    }
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("name", &self.name).field("version", &self.version).finish_non_exhaustive()
    }
}

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
    /// Loads version `version` of `dir` with `config`: builds the backend
    /// instances (ONNX Runtime sessions, TorchScript modules or connections
    /// to a remote server), checks the configuration against the model and
    /// starts the plugin, if the configuration names one.
    ///
    /// # Errors
    /// A message saying what failed: an unsupported platform, a missing or
    /// invalid model file, a configuration that does not match the model
    /// (naming the tensor and both values), or a plugin that does not load.
    pub fn load(dir: &ModelDir, version: u64, config: &ModelConfig, rt: &Runtimes) -> Result<Model, String> {
        if let Some(ensemble) = Ensemble::from_config(config) {
            let signature = Signature::from_config(config)?;
            let metrics = rt.metrics.for_model(&dir.name, version);
            let mut model = Model::ensemble(&dir.name, version, config, signature, ensemble, metrics);
            model.labels = outputs::load_labels(config, &dir.path)?;
            model.cache = response_cache(config, rt)?;
            return Ok(model);
        }
        let cache = response_cache(config, rt)?;
        let scheduling = Scheduling::from_config(config, &dir.path)?;
        let version_dir = dir.version_path(version);
        let mut signature = Signature::from_config(config)?;
        let instances::Instances { backends: instances, device_bytes } =
            instances::load(&dir.name, &version_dir, config, &scheduling.backend_signature(&signature), rt)?;
        let backend = &instances[0];
        let (inputs, outputs) = check::client_tensors(&scheduling, backend.inputs(), backend.outputs())?;
        check::complete_and_check(&mut signature, &inputs, &outputs)?;
        let plugin = match config::parameter(config, PLUGIN_PARAMETER) {
            None => {
                if let Some(key) = config.parameters.keys().find(|k| crate::plugin::PARAMETERS.contains(&k.as_str())) {
                    return Err(format!(
                        "parameter '{key}' is about a plugin, but the model names none ('{PLUGIN_PARAMETER}')"
                    ));
                }
                None
            }
            Some("") => {
                return Err(format!(
                    "parameter '{PLUGIN_PARAMETER}' is empty; name the plugin's .wasm file or leave the parameter out"
                ));
            }
            Some(file) => {
                let info = ModelInfo {
                    name: dir.name.clone(),
                    version,
                    signature: signature.clone(),
                    parameters: config.parameters.iter().map(|(k, v)| (k.clone(), v.string_value.clone())).collect(),
                    metadata: backend.metadata().to_vec(),
                };
                let keys: Vec<&str> = config.parameters.keys().map(String::as_str).collect();
                let parameter = |key: &str| config::parameter(config, key).map(str::to_owned);
                let limits = rt.plugins.limits().for_model(&keys, parameter)?;
                let metrics = rt.metrics.for_plugin(&dir.name, version);
                let plugin = load_plugin(&rt.plugins, dir, file, &version_dir, info, limits, metrics);
                let missing = !dir.path.join(file).exists();
                let plugin = plugin.map_err(|e| if missing { config::with_missing_files_hint(config, e) } else { e });
                Some(Arc::new(plugin?))
            }
        };
        let labels = outputs::load_labels(config, &dir.path)?;
        let plugin_samples = warmup::plugin_samples(
            config::parameter(config, warmup::PLUGIN_WARMUP_PARAMETER),
            config::parameter(config, warmup::PLUGIN_WARMUP_CONTENT_TYPE_PARAMETER),
            &dir.path,
        )?;
        let metrics = rt.metrics.for_model(&dir.name, version);
        let mut model = Model::new(&dir.name, version, config, signature, instances, scheduling, metrics, plugin);
        model.labels = labels;
        model.plugin_samples = plugin_samples;
        model.cache = cache;
        model.device_bytes = device_bytes;
        Ok(model)
    }

    /// A model version over backend `instances` that are already built,
    /// `signature` complete: starts its scheduler as `scheduling` says.
    /// This is the seam where tests put fake backends behind a real
    /// scheduler.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: &str,
        version: u64,
        config: &ModelConfig,
        signature: Signature,
        instances: Vec<Arc<dyn Backend>>,
        scheduling: Scheduling,
        metrics: ModelMetrics,
        plugin: Option<Arc<Plugin>>,
    ) -> Model {
        let batcher = match scheduling {
            Scheduling::Dynamic(policy) => {
                Batcher::Dynamic(Scheduler::start(name, policy, instances.clone(), metrics.clone()))
            }
            Scheduling::Sequence(policy) => {
                Batcher::Sequence(SequenceScheduler::start(name, policy, instances.clone(), metrics.clone()))
            }
        };
        Model {
            name: name.to_owned(),
            version,
            config: config.clone(),
            signature,
            loaded_at: SystemTime::now(),
            engine: Engine::Backends { instances, batcher },
            metrics,
            plugin,
            labels: HashMap::new(),
            cache: None,
            plugin_samples: Vec::new(),
            device_bytes: BTreeMap::new(),
        }
    }

    /// An ensemble version: `ensemble`'s steps run its requests.
    pub fn ensemble(
        name: &str,
        version: u64,
        config: &ModelConfig,
        signature: Signature,
        ensemble: Ensemble,
        metrics: ModelMetrics,
    ) -> Model {
        Model {
            name: name.to_owned(),
            version,
            config: config.clone(),
            signature,
            loaded_at: SystemTime::now(),
            engine: Engine::Ensemble(ensemble),
            metrics,
            plugin: None,
            labels: HashMap::new(),
            cache: None,
            plugin_samples: Vec::new(),
            device_bytes: BTreeMap::new(),
        }
    }

    /// The class labels of output `output`, if it has a `label_filename` (or
    /// inherited them, for an ensemble).
    pub fn labels(&self, output: &str) -> Option<&[String]> {
        self.labels.get(output).map(Vec::as_slice)
    }

    /// Gives an ensemble's outputs that have no `label_filename` of their
    /// own the labels of the step output that writes them, `labels` by
    /// ensemble output, as Triton completes an ensemble's labels at load
    /// (`model_lifecycle.cc`).
    pub fn inherit_labels(&mut self, labels: HashMap<String, Vec<String>>) {
        for (output, labels) in labels {
            self.labels.entry(output).or_insert(labels);
        }
    }

    /// The ensemble's steps, if this is an ensemble.
    pub fn steps(&self) -> Option<&Ensemble> {
        match &self.engine {
            Engine::Ensemble(ensemble) => Some(ensemble),
            Engine::Backends { .. } => None,
        }
    }

    /// Host memory the model holds, in bytes, as its runtimes account for
    /// it: each instance's (ONNX Runtime's session arena, libtorch's
    /// parameters) and its plugin's (compiled code and instance memory).
    /// Nothing another model or request allocates is in it; 0 for an
    /// ensemble, whose steps are models of their own.
    pub fn resident_bytes(&self) -> u64 {
        let instances = match &self.engine {
            Engine::Backends { instances, .. } => instances.iter().map(|i| i.resident_bytes()).sum(),
            Engine::Ensemble(_) => 0,
        };
        instances + self.plugin.as_ref().map_or(0, |p| p.resident_bytes())
    }

    /// Device memory the model's instances took at load, in bytes, by GPU
    /// index (NVML's used memory after each instance's load less before
    /// it); empty for a model on the CPU.
    pub fn device_bytes(&self) -> &BTreeMap<u32, u64> {
        &self.device_bytes
    }

    /// Sets what [`Model::device_bytes`] reports, for fake loaders.
    #[cfg(test)]
    pub fn set_device_bytes(&mut self, bytes: BTreeMap<u32, u64>) {
        self.device_bytes = bytes;
    }

    /// Runs the configuration's `model_warmup` samples through every
    /// instance, each `count` times (at least once); returns the number of
    /// runs.
    /// Blocks: call it off the async executor.
    ///
    /// # Errors
    /// A message naming the sample when its inputs cannot be built, do not
    /// fit the signature, or the backend fails on them.
    pub fn warm_up(&self, model_dir: &Path) -> Result<usize, String> {
        // An ensemble has no model_warmup (config::validate refuses it).
        let Engine::Backends { instances, batcher } = &self.engine else { return Ok(0) };
        let mut runs = 0;
        for sample in &self.config.model_warmup {
            let inputs = warmup::sample_inputs(sample, &self.signature, model_dir)?;
            check_inputs(&self.signature, &self.name, &inputs)
                .map_err(|e| format!("warm-up sample '{}': {e}", sample.name))?;
            let mut inputs = reshape::inputs(&self.signature, inputs);
            if let Batcher::Sequence(scheduler) = batcher {
                inputs = scheduler.warm_up_inputs(inputs);
            }
            for instance in instances {
                for _ in 0..sample.count.max(1) {
                    instance
                        .execute(inputs.clone())
                        .map_err(|e| format!("warm-up sample '{}' failed: {e}", sample.name))?;
                    runs += 1;
                }
            }
        }
        Ok(runs)
    }

    /// Sends each `plugin.warmup` sample through the plugin and model as a
    /// client's `/predict` would (preprocess, inference, postprocess), with
    /// `runner` for the plugin's composed calls; returns the number that
    /// ran to the end. A sample whose composed call finds its callee
    /// unknown, not READY or overloaded did not fail here: the warm-up
    /// stops at that call, and the callee's state is logged.
    ///
    /// # Errors
    /// A message naming the sample when the plugin fails on it (traps,
    /// returns an internal error, produces tensors the model refuses) or
    /// refuses it as bad input: a sample the plugin cannot read is a wrong
    /// configuration.
    pub async fn warm_up_plugin(&self, runner: Arc<dyn ModelRunner>) -> Result<usize, String> {
        let mut completed = 0;
        for sample in &self.plugin_samples {
            match self.predict(sample.request.clone(), runner.clone()).await {
                Ok(_) => completed += 1,
                Err(e @ (Error::NotFound(_) | Error::Unavailable(_) | Error::Overloaded(_))) => {
                    tracing::warn!(
                        model = %self.name, version = self.version, sample = %sample.file,
                        "plugin warm-up stopped at a composed call whose callee cannot serve now: {e}"
                    );
                }
                Err(e) => return Err(format!("plugin warm-up sample '{}' failed: {e}", sample.file)),
            }
        }
        Ok(completed)
    }

    /// Whether requests may carry `sequence_id`: the model has
    /// `sequence_batching`, or it is an ensemble (whose steps may).
    pub fn takes_sequences(&self) -> bool {
        match &self.engine {
            Engine::Backends { batcher, .. } => matches!(batcher, Batcher::Sequence(_)),
            Engine::Ensemble(_) => true,
        }
    }

    /// Ends sequence `id` of a sequence model if `owner` opened it (its
    /// gRPC stream closed before its END), once nothing of it is queued or
    /// running; does nothing for other models. For an ensemble, its steps'
    /// sequences end by their idle time.
    pub fn release_sequence(&self, id: &CorrelationId, owner: Owner) {
        if let Engine::Backends { batcher: Batcher::Sequence(scheduler), .. } = &self.engine {
            scheduler.release(id, owner, crate::metrics::SequenceEnd::Cancelled);
        }
    }

    /// The platform name for model metadata (`onnxruntime_onnx`, `ensemble`).
    pub fn platform(&self) -> &str {
        match &self.engine {
            Engine::Backends { instances, .. } => instances[0].platform(),
            Engine::Ensemble(_) => config::validate::ENSEMBLE_PLATFORM,
        }
    }

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
    async fn infer_in_span(
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
        let (outputs, timing) = match &self.engine {
            Engine::Backends { batcher, .. } => {
                let inputs = reshape::inputs(&self.signature, inputs);
                let (span, submitted) = (options.trace.clone(), SystemTime::now());
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
                    traced::scheduled(span, submitted, &timing);
                }
                (reshape::outputs(&self.signature, outputs).map_err(|m| self.wrong_answer(m))?, timing)
            }
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

    /// An answer of the backend (or of an ensemble's steps) that does not
    /// fit the signature.
    fn wrong_answer(&self, problem: String) -> Error {
        let message = format!("model '{}' returned {problem}", self.name);
        // A remote server's wrong answer is its fault, not ours.
        match self.backend_kind() {
            Some(BackendKind::Remote) => Error::BadGateway(message),
            _ => Error::Internal(message),
        }
    }

    /// The backend serving this model; `None` for an ensemble.
    fn backend_kind(&self) -> Option<BackendKind> {
        match &self.engine {
            Engine::Backends { instances, .. } => Some(instances[0].kind()),
            Engine::Ensemble(_) => None,
        }
    }

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
                "model '{}' has no plugin, so it takes tensors only: use /infer, or name a plugin in its {} (parameters key '{PLUGIN_PARAMETER}')",
                self.name,
                config::CONFIG_FILE
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
        let Engine::Backends { batcher: Batcher::Sequence(scheduler), .. } = &self.engine else { return None };
        Some(PredictSequence { scheduler, id: CorrelationId::new_host(), owner: new_owner() })
    }

    /// The configuration as served: `config.pbtxt` with the platform,
    /// backend, name, inputs and outputs filled in where it leaves them out
    /// (Triton's auto-complete).
    pub fn completed_config(&self) -> ModelConfig {
        use crate::config::proto::{ModelInput, ModelOutput};
        let mut c = self.config.clone();
        c.name.clone_from(&self.name);
        c.platform = self.platform().to_owned();
        c.backend = self.backend_kind().map_or("", BackendKind::name).to_owned();
        let data_type = |dt| config::datatype_to_config(dt) as i32;
        if c.input.is_empty() {
            let spec = |s: &crate::tensor::TensorSpec| ModelInput {
                name: s.name.clone(),
                data_type: data_type(s.datatype),
                dims: s.dims.clone(),
                ..ModelInput::default()
            };
            c.input = self.signature.inputs.iter().map(spec).collect();
        }
        if c.output.is_empty() {
            let spec = |s: &crate::tensor::TensorSpec| ModelOutput {
                name: s.name.clone(),
                data_type: data_type(s.datatype),
                dims: s.dims.clone(),
                ..ModelOutput::default()
            };
            c.output = self.signature.outputs.iter().map(spec).collect();
        }
        c
    }

    /// Counts a request refused before it reached the model (malformed
    /// tensors or parameters) as a failure with reason OTHER, so that
    /// successes and failures add up to the requests sent; returns `e`.
    pub fn refused(&self, e: Error) -> Error {
        self.metrics.finished(Err(FailureReason::Other), Duration::ZERO);
        e
    }

    /// Counts a `/predict` request that failed in the plugin's
    /// `preprocess`, before the model ran, under the reason its error gives
    /// (OTHER for a refusal, BACKEND for a plugin that failed); returns `e`.
    fn failed_before_running(&self, e: Error) -> Error {
        self.metrics.finished(Err(FailureReason::from(&e)), Duration::ZERO);
        e
    }

    /// The model's counters as they stand now (the status page's source).
    pub fn live_counts(&self) -> crate::metrics::LiveCounts {
        self.metrics.live()
    }

    /// The model's inference statistics (Triton's statistics extension).
    pub fn statistics(&self) -> crate::metrics::ModelStatistics {
        self.metrics.statistics()
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

fn load_plugin(
    host: &PluginHost,
    dir: &ModelDir,
    file: &str,
    version_dir: &Path,
    info: ModelInfo,
    limits: crate::plugin::PluginLimits,
    metrics: PluginMetrics,
) -> Result<Plugin, String> {
    let wasm = dir.path.join(file);
    if !wasm.exists() {
        return Err(format!("plugin '{file}' named in {} is not in {}", config::CONFIG_FILE, dir.path.display()));
    }
    if !wasm.is_file() {
        return Err(format!("plugin '{file}' in {} is not a file", dir.path.display()));
    }
    if !repository::is_within(&wasm, &dir.path) {
        return Err(format!("plugin '{file}' must be inside the model folder {}", dir.path.display()));
    }
    host.load(&wasm, version_dir, info, limits, metrics)
}

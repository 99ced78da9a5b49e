//! One loaded model version and the request path through it:
//! (plugin preprocess) → checks → scheduler → backend instances → (plugin
//! postprocess). Plugins run per request, outside the scheduler.

mod check;
mod warmup;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::backend::onnx::{OnnxRuntime, SessionOptions};
use crate::config::proto::model_instance_group::Kind;
use crate::config::{self, ModelConfig, PLUGIN_PARAMETER, Signature};
use crate::error::Error;
use crate::metrics::{Metrics, ModelMetrics};
use crate::plugin::{ModelInfo, Plugin, PluginError, PluginHost, RawRequest, RawResponse};
use crate::repository::{self, ModelDir};
use crate::scheduler::policy::{Policy, RequestOptions};
use crate::scheduler::{Scheduler, Timing};
use crate::tensor::Tensor;

pub use check::check_inputs;

/// What loading a model needs: the frameworks and the plugin sandbox.
pub struct Runtimes {
    /// ONNX Runtime, for `onnxruntime_onnx` models.
    pub onnx: OnnxRuntime,
    /// The wasmtime sandbox, for model plugins.
    pub plugins: PluginHost,
    /// Where each model's inference metrics are registered.
    pub metrics: Arc<Metrics>,
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
    /// One backend per `instance_group` instance; the scheduler's workers
    /// run them, warm-up runs each.
    instances: Vec<Arc<dyn Backend>>,
    scheduler: Scheduler,
    metrics: ModelMetrics,
    plugin: Option<Arc<Plugin>>,
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

/// The model file used when `default_model_filename` is not set.
const DEFAULT_MODEL_FILE: &str = "model.onnx";

impl Model {
    /// Loads version `version` of `dir` with `config`: builds the backend
    /// session, checks the configuration against the model file and starts
    /// the plugin, if the configuration names one.
    ///
    /// # Errors
    /// A message saying what failed: an unsupported platform, a missing or
    /// invalid model file, a configuration that does not match the model
    /// (naming the tensor and both values), or a plugin that does not load.
    pub fn load(dir: &ModelDir, version: u64, config: &ModelConfig, rt: &Runtimes) -> Result<Model, String> {
        check_platform(config)?;
        let policy = Policy::from_config(config)?;
        let count = instance_count(config)?;
        let options = session_options(config, count)?;
        let version_dir = dir.version_path(version);
        let file =
            if config.default_model_filename.is_empty() { DEFAULT_MODEL_FILE } else { &config.default_model_filename };
        let instances = (0..count)
            .map(|_| rt.onnx.load(&version_dir.join(file), options).map(|b| Arc::new(b) as Arc<dyn Backend>))
            .collect::<Result<Vec<_>, _>>()?;
        let backend = &instances[0];
        let mut signature = Signature::from_config(config)?;
        check::complete_and_check(&mut signature, backend.inputs(), backend.outputs())?;
        let plugin = match config::parameter(config, PLUGIN_PARAMETER) {
            None => None,
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
                Some(Arc::new(load_plugin(&rt.plugins, dir, file, &version_dir, info)?))
            }
        };
        let metrics = rt.metrics.for_model(&dir.name, version);
        let scheduler = Scheduler::start(&dir.name, policy, instances.clone(), metrics.clone());
        Ok(Model {
            name: dir.name.clone(),
            version,
            config: config.clone(),
            signature,
            instances,
            scheduler,
            metrics,
            plugin,
        })
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
        let mut runs = 0;
        for sample in &self.config.model_warmup {
            let inputs = warmup::sample_inputs(sample, &self.signature, model_dir)?;
            check_inputs(&self.signature, &self.name, &inputs)
                .map_err(|e| format!("warm-up sample '{}': {e}", sample.name))?;
            for instance in &self.instances {
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

    /// The platform name for model metadata (`onnxruntime_onnx`).
    pub fn platform(&self) -> &'static str {
        self.instances[0].platform()
    }

    /// Runs the model on tensors through its scheduler. `requested` names
    /// the outputs to return; empty means all, in the order the model
    /// declares them. `options` are the request's `priority` and `timeout`.
    /// Counts the outcome in Triton's success / failure metrics.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for inputs that do not fit the signature,
    /// an unknown requested output or priority; [`Error::Overloaded`] when
    /// the queue is full or the queue timeout expired; [`Error::Internal`]
    /// when the backend fails.
    pub async fn infer(
        &self,
        inputs: Vec<Tensor>,
        requested: &[String],
        options: RequestOptions,
    ) -> Result<(Vec<Tensor>, Timing), Error> {
        let started = Instant::now();
        let result = self.run(inputs, requested, options).await;
        let outcome = match &result {
            Ok(_) => Ok(()),
            Err(Error::Overloaded(_)) => Err("REJECTED"),
            Err(Error::Internal(_)) => Err("BACKEND"),
            Err(_) => Err("OTHER"),
        };
        self.metrics.finished(outcome, started.elapsed());
        result
    }

    async fn run(
        &self,
        inputs: Vec<Tensor>,
        requested: &[String],
        options: RequestOptions,
    ) -> Result<(Vec<Tensor>, Timing), Error> {
        check_inputs(&self.signature, &self.name, &inputs)?;
        if let Some(unknown) = requested.iter().find(|r| !self.signature.outputs.iter().any(|o| &o.name == *r)) {
            let names: Vec<_> = self.signature.outputs.iter().map(|o| o.name.as_str()).collect();
            return Err(Error::InvalidArgument(format!(
                "model '{}' has no output '{unknown}'; its outputs are {names:?}",
                self.name
            )));
        }
        let (mut outputs, timing) = self.scheduler.submit(inputs, options).await?;
        outputs.retain(|t| self.signature.outputs.iter().any(|o| o.name == t.name));
        if requested.is_empty() {
            return Ok((outputs, timing));
        }
        // In the order the request names them.
        let outputs = requested
            .iter()
            .filter_map(|r| outputs.iter().position(|t| &t.name == r).map(|i| outputs.swap_remove(i)))
            .collect();
        Ok((outputs, timing))
    }

    /// Sends a raw request through the model's plugin: preprocess, run,
    /// postprocess.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the model has no plugin or the plugin
    /// refuses the request; [`Error::Internal`] when the plugin fails, traps,
    /// exceeds its limits or produces tensors that do not fit the model.
    pub async fn predict(&self, req: RawRequest) -> Result<(RawResponse, PredictTiming), Error> {
        let plugin = self.plugin.as_ref().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "model '{}' has no plugin, so it takes tensors only: use /infer, or name a plugin in its {} (parameters key '{PLUGIN_PARAMETER}')",
                self.name,
                config::CONFIG_FILE
            ))
        })?;
        let req = Arc::new(req);
        let mut timing = PredictTiming::default();
        let started = Instant::now();
        let inputs = plugin.preprocess(req.clone()).await;
        timing.preprocess = started.elapsed();
        self.metrics.plugin("preprocess", timing.preprocess, !matches!(inputs, Err(PluginError::Failed(_))));
        let (outputs, inference) = match self.infer(inputs.map_err(plugin_error)?, &[], RequestOptions::default()).await
        {
            Err(Error::InvalidArgument(m)) => {
                return Err(Error::Internal(format!(
                    "the plugin's preprocess produced tensors the model cannot take: {m}"
                )));
            }
            other => other?,
        };
        timing.inference = inference;
        let started = Instant::now();
        let response = plugin.postprocess(req, outputs).await;
        timing.postprocess = started.elapsed();
        self.metrics.plugin("postprocess", timing.postprocess, !matches!(response, Err(PluginError::Failed(_))));
        Ok((response.map_err(plugin_error)?, timing))
    }

    /// The configuration as served: `config.pbtxt` with the platform,
    /// backend, name, inputs and outputs filled in where it leaves them out
    /// (Triton's auto-complete).
    pub fn completed_config(&self) -> ModelConfig {
        use crate::config::proto::{ModelInput, ModelOutput};
        let mut c = self.config.clone();
        c.name.clone_from(&self.name);
        c.platform = self.platform().to_owned();
        c.backend = "onnxruntime".to_owned();
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
        self.metrics.finished(Err("OTHER"), Duration::ZERO);
        e
    }

    /// The model's inference statistics (Triton's statistics extension).
    pub fn statistics(&self) -> crate::metrics::ModelStatistics {
        self.metrics.statistics()
    }
}

fn plugin_error(e: PluginError) -> Error {
    match e {
        PluginError::BadInput(m) => Error::InvalidArgument(m),
        PluginError::Failed(m) => Error::Internal(m),
    }
}

fn check_platform(config: &ModelConfig) -> Result<(), String> {
    let platform_ok = matches!(config.platform.as_str(), "" | "onnxruntime_onnx");
    let backend_ok = matches!(config.backend.as_str(), "" | "onnxruntime");
    if platform_ok && backend_ok {
        Ok(())
    } else {
        Err(format!(
            "platform '{}' / backend '{}' is not supported; Plinth serves platform 'onnxruntime_onnx' (backend 'onnxruntime')",
            config.platform, config.backend
        ))
    }
}

/// The number of backend instances `instance_group` asks for (1 without
/// one). Plinth runs ONNX models on the CPU, so KIND_AUTO and KIND_MODEL
/// mean the CPU and KIND_GPU is refused rather than silently served on the
/// CPU.
fn instance_count(config: &ModelConfig) -> Result<usize, String> {
    if config.instance_group.is_empty() {
        return Ok(1);
    }
    let mut total = 0;
    for group in &config.instance_group {
        let name = if group.name.is_empty() { "(unnamed)" } else { &group.name };
        if group.kind() == Kind::Gpu {
            return Err(format!(
                "instance_group {name} asks for KIND_GPU, but this Plinth runs ONNX models on the CPU only; use KIND_CPU or KIND_AUTO"
            ));
        }
        total += match group.count {
            0 => 1,
            n @ 1.. => n as usize,
            n => return Err(format!("instance_group {name} has count {n}; it must be at least 1")),
        };
    }
    if total > MAX_INSTANCES {
        return Err(format!("instance_group asks for {total} instances; a model may have at most {MAX_INSTANCES}"));
    }
    Ok(total)
}

/// The most instances one model may have: each is a full ONNX Runtime
/// session, so a typo in `count` must not exhaust the machine's memory.
const MAX_INSTANCES: usize = 128;

/// ONNX Runtime's session parameter for busy-waiting intra-op threads.
const SPINNING_PARAMETER: &str = "session.intra_op.allow_spinning";

/// ONNX Runtime thread settings from the model's `parameters`: the counts
/// Triton's ONNX Runtime backend reads (`intra_op_thread_count`,
/// `inter_op_thread_count`) and `session.intra_op.allow_spinning`. Without
/// `intra_op_thread_count`, the cores are shared among the `instances`, so
/// that instances running at once do not oversubscribe the CPU. Spinning is
/// off unless set to "1": threads that busy-wait between runs take the
/// cores the HTTP handlers, plugins and other models need.
fn session_options(config: &ModelConfig, instances: usize) -> Result<SessionOptions, String> {
    let count = |key: &str| match config::parameter(config, key) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<usize>()
            .map(Some)
            .map_err(|_| format!("parameter '{key}' must be a whole number, got '{v}'")),
    };
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let spinning = match config::parameter(config, SPINNING_PARAMETER).map(str::trim) {
        None | Some("0") => false,
        Some("1") => true,
        Some(v) => return Err(format!("parameter '{SPINNING_PARAMETER}' must be \"0\" or \"1\", got '{v}'")),
    };
    Ok(SessionOptions {
        intra_op_threads: count("intra_op_thread_count")?.unwrap_or((cores / instances).max(1)),
        inter_op_threads: count("inter_op_thread_count")?.unwrap_or(0),
        intra_op_spinning: spinning,
    })
}

fn load_plugin(
    host: &PluginHost,
    dir: &ModelDir,
    file: &str,
    version_dir: &Path,
    info: ModelInfo,
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
    host.load(&wasm, version_dir, info)
}

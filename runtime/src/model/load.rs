//! Making a [`Model`]: loading a version from its folder (backend
//! instances, checks against the model file, plugin, labels, warm-up
//! samples), or putting one together from parts already built.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use crate::backend::Backend;
use crate::config::{self, ModelConfig, Parameters, Signature};
use crate::drain::FreedOffThread;
use crate::metrics::{ModelMetrics, PluginMetrics};
use crate::plugin::{ModelInfo, Plugin, PluginHost};
use crate::repository::{self, ModelDir};
use crate::scheduler::Scheduler;
use crate::scheduler::rate_limiter::{InstanceLimits, Registration};
use crate::scheduler::sequence::SequenceScheduler;

use super::cache::{self, ResponseCache};
use super::ensemble::Ensemble;
use super::runtimes::Runtimes;
use super::scheduling::Scheduling;
use super::{Batcher, Engine, Model, check, instances, outputs, warmup};

/// What [`Model::new`] builds a model version from: its identity, its
/// configuration, the backend instances already built and how their
/// requests are scheduled.
pub struct ModelParts<'a> {
    /// The model's name (its folder name).
    pub name: &'a str,
    pub version: u64,
    /// The configuration as `config.pbtxt` states it.
    pub config: &'a ModelConfig,
    /// Its Plinth parameters, parsed.
    pub parameters: Parameters,
    /// The inputs and outputs served, complete.
    pub signature: Signature,
    /// One backend per instance; at least one.
    pub instances: Vec<Arc<dyn Backend>>,
    /// The scheduler to start in front of `instances`.
    pub scheduling: Scheduling,
    /// Where the version's inference metrics go.
    pub metrics: ModelMetrics,
    /// The model's plugin, if it has one.
    pub plugin: Option<Arc<Plugin>>,
    /// The instances' place in the rate limiter, when it is on.
    pub rate_limited: Option<Registration>,
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
    pub fn load(
        dir: &ModelDir,
        version: u64,
        config: &ModelConfig,
        parameters: &Parameters,
        rt: &Runtimes,
    ) -> Result<Model, String> {
        if let Some(ensemble) = Ensemble::from_config(config) {
            let signature = Signature::from_config(config)?;
            let metrics = rt.metrics.for_model(&dir.name, version);
            let mut model =
                Model::ensemble(&dir.name, version, config, parameters.clone(), signature, ensemble, metrics);
            model.labels = outputs::load_labels(config, &dir.path)?;
            model.cache = response_cache(config, rt)?;
            return Ok(model);
        }
        if config.model_transaction_policy.as_ref().is_some_and(|t| t.decoupled) {
            return Model::load_generative(dir, version, config, parameters, rt);
        }
        let cache = response_cache(config, rt)?;
        let scheduling = Scheduling::from_config(config, &dir.path)?;
        let version_dir = dir.version_path(version);
        let mut signature = Signature::from_config(config)?;
        let instances::Instances { backends: instances, limits, device_bytes } = instances::load(
            &dir.name,
            &version_dir,
            config,
            parameters,
            &scheduling.backend_signature(&signature),
            rt,
        )?;
        let rate_limited = rate_limited(&dir.name, config, &limits, rt)?;
        let backend = &instances[0];
        let (inputs, outputs) = check::client_tensors(
            &scheduling,
            &signature,
            &backend.description().inputs,
            &backend.description().outputs,
        )?;
        check::complete_and_check(&mut signature, &inputs, &outputs)?;
        let plugin = match &parameters.plugin {
            None => None,
            Some(own) => {
                let metadata = backend.description().metadata.clone();
                Some(model_plugin(dir, version, config, parameters, own, &signature, metadata, rt)?)
            }
        };
        let labels = outputs::load_labels(config, &dir.path)?;
        let plugin_samples = match &parameters.plugin {
            Some(own) => warmup::plugin_samples(&own.warmup, own.warmup_content_type.as_deref(), &dir.path)?,
            None => Vec::new(),
        };
        let metrics = rt.metrics.for_model(&dir.name, version);
        let mut model = Model::new(ModelParts {
            name: &dir.name,
            version,
            config,
            parameters: parameters.clone(),
            signature,
            instances,
            scheduling,
            metrics,
            plugin,
            rate_limited,
        });
        model.labels = labels;
        model.plugin_samples = plugin_samples;
        model.cache = cache;
        model.device_bytes = device_bytes;
        Ok(model)
    }

    /// A model version over backend instances that are already built, its
    /// signature complete: starts its scheduler as `parts.scheduling` says.
    /// This is the seam where tests put fake backends behind a real
    /// scheduler.
    pub fn new(parts: ModelParts<'_>) -> Model {
        let ModelParts {
            name,
            version,
            config,
            parameters,
            signature,
            instances,
            scheduling,
            metrics,
            plugin,
            rate_limited,
        } = parts;
        let batcher = match scheduling {
            Scheduling::Dynamic(policy) => {
                Batcher::Dynamic(Scheduler::start(name, policy, instances.clone(), metrics.clone(), rate_limited))
            }
            Scheduling::Sequence(policy) => Batcher::Sequence(SequenceScheduler::start(
                name,
                policy,
                instances.clone(),
                metrics.clone(),
                rate_limited,
            )),
        };
        Model {
            name: name.to_owned(),
            version,
            config: config.clone(),
            parameters,
            signature,
            loaded_at: SystemTime::now(),
            engine: FreedOffThread::new(Engine::Backends { instances, batcher }),
            metrics,
            plugin,
            labels: HashMap::new(),
            cache: None,
            plugin_samples: Vec::new(),
            device_bytes: BTreeMap::new(),
        }
    }

    /// A generative version (`model_transaction_policy { decoupled: true
    /// }`): the decode loop over the folder's ONNX Runtime GenAI export on
    /// the CPU, and the tokenizer plugin. Its tensors are those of Triton's
    /// vLLM backend, for gRPC streaming clients.
    ///
    /// # Errors
    /// As [`crate::generate::Generator::load`]; a plugin that does not load.
    fn load_generative(
        dir: &ModelDir,
        version: u64,
        config: &ModelConfig,
        parameters: &Parameters,
        rt: &Runtimes,
    ) -> Result<Model, String> {
        use crate::tensor::{DataType, TensorSpec};
        let version_dir = dir.version_path(version);
        let own = parameters.plugin.as_ref().ok_or("a generative model needs its tokenizer plugin ('plugin')")?;
        let onnx = rt.frameworks.onnx()?;
        let options = crate::backend::onnx::session_options(config, parameters.onnx, 1);
        let generator = crate::generate::Generator::load(
            onnx,
            &version_dir,
            options,
            crate::backend::Placement::Cpu,
            parameters.generation,
            rt.metrics.for_generation(&dir.name, version),
        )
        .map_err(|e| {
            if version_dir.join("genai_config.json").exists() { e } else { parameters.with_missing_files_hint(e) }
        })?;
        let optional = |name: &str, datatype| TensorSpec { optional: true, ..TensorSpec::new(name, datatype, &[1]) };
        let signature = Signature {
            max_batch_size: 0,
            inputs: vec![
                TensorSpec::new("text_input", DataType::Bytes, &[1]),
                optional("stream", DataType::Bool),
                optional("sampling_parameters", DataType::Bytes),
                optional("exclude_input_in_output", DataType::Bool),
            ],
            outputs: vec![TensorSpec::new("text_output", DataType::Bytes, &[-1])],
        };
        let plugin = model_plugin(dir, version, config, parameters, own, &signature, Vec::new(), rt)?;
        let metrics = rt.metrics.for_model(&dir.name, version);
        Ok(Model {
            name: dir.name.clone(),
            version,
            config: config.clone(),
            parameters: parameters.clone(),
            signature,
            loaded_at: SystemTime::now(),
            engine: FreedOffThread::new(Engine::Generative(generator)),
            metrics,
            plugin: Some(plugin),
            labels: HashMap::new(),
            cache: None,
            plugin_samples: Vec::new(),
            device_bytes: BTreeMap::new(),
        })
    }

    /// An ensemble version: `ensemble`'s steps run its requests.
    pub fn ensemble(
        name: &str,
        version: u64,
        config: &ModelConfig,
        parameters: Parameters,
        signature: Signature,
        ensemble: Ensemble,
        metrics: ModelMetrics,
    ) -> Model {
        Model {
            name: name.to_owned(),
            version,
            config: config.clone(),
            parameters,
            signature,
            loaded_at: SystemTime::now(),
            engine: FreedOffThread::new(Engine::Ensemble(ensemble)),
            metrics,
            plugin: None,
            labels: HashMap::new(),
            cache: None,
            plugin_samples: Vec::new(),
            device_bytes: BTreeMap::new(),
        }
    }
}

/// The instances of model `name` (asking `limits` each) registered with the
/// server's rate limiter, when it is on and one of them lists resources
/// (one that lists none is never limited). When it is off, a
/// configuration's `rate_limiter` settings are not applied, as in Triton,
/// and the log says so.
///
/// # Errors
/// Triton's texts when the rate limiter's resources cannot serve the
/// instances (an explicit count below an instance's need, a resource both
/// global and per device): the load fails.
fn rate_limited(
    name: &str,
    config: &ModelConfig,
    limits: &[InstanceLimits],
    rt: &Runtimes,
) -> Result<Option<Registration>, String> {
    match &rt.rate_limiter {
        Some(limiter) if limits.iter().any(InstanceLimits::limited) => limiter.register(limits).map(Some),
        Some(_) => Ok(None),
        None => {
            if config.instance_group.iter().any(|g| g.rate_limiter.is_some()) {
                tracing::info!(model = name, "rate_limiter settings not applied: --rate-limit is off");
            }
            Ok(None)
        }
    }
}

/// Starts the plugin `own` names for version `version` of `dir`, which
/// sees `signature`, the configuration's parameters and the model file's
/// `metadata`.
///
/// # Errors
/// A message naming the plugin's file when it is missing or does not load,
/// with the model's `missing_files_hint` when it is missing.
#[allow(clippy::too_many_arguments)]
fn model_plugin(
    dir: &ModelDir,
    version: u64,
    config: &ModelConfig,
    parameters: &Parameters,
    own: &crate::config::parameters::PluginParameters,
    signature: &Signature,
    metadata: Vec<(String, String)>,
    rt: &Runtimes,
) -> Result<Arc<Plugin>, String> {
    let info = ModelInfo {
        name: dir.name.clone(),
        version,
        signature: signature.clone(),
        parameters: config.parameters.iter().map(|(k, v)| (k.clone(), v.string_value.clone())).collect(),
        metadata,
    };
    let limits = rt.plugins.limits().for_model(own);
    let metrics = rt.metrics.for_plugin(&dir.name, version);
    let plugin = load_plugin(&rt.plugins, dir, &own.file, &dir.version_path(version), info, limits, metrics);
    let missing = !dir.path.join(&own.file).exists();
    plugin.map(Arc::new).map_err(|e| if missing { parameters.with_missing_files_hint(e) } else { e })
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
        // cargo writes a crate `csv-doubler` as `csv_doubler.wasm`.
        let underscored = file.replace('-', "_");
        let hint = if underscored != file && dir.path.join(&underscored).is_file() {
            format!("; did you mean '{underscored}'? (cargo writes a crate's '-' as '_' in its .wasm name)")
        } else {
            String::new()
        };
        return Err(format!("plugin '{file}' named in {} is not in {}{hint}", config::CONFIG_FILE, dir.path.display()));
    }
    if !wasm.is_file() {
        return Err(format!("plugin '{file}' in {} is not a file", dir.path.display()));
    }
    if !repository::is_within(&wasm, &dir.path) {
        return Err(format!("plugin '{file}' must be inside the model folder {}", dir.path.display()));
    }
    host.load(&wasm, version_dir, info, limits, metrics)
}

//! One loaded model version and the request path through it:
//! (plugin preprocess) → checks → scheduler → backend instances → (plugin
//! postprocess). Plugins run per request, outside the scheduler.

pub mod cache;
mod check;
mod ensemble;
mod infer;
mod instances;
mod load;
mod outputs;
mod predict;
mod reshape;
mod runtimes;
mod scheduling;
mod traced;
mod warmup;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::backend::{Backend, BackendKind};
use crate::config::{self, ModelConfig, Parameters, Signature};
use crate::drain::{FreedOffThread, InUse};
use crate::error::Error;
use crate::metrics::{FailureReason, ModelMetrics};
use crate::plugin::Plugin;
use crate::scheduler::Scheduler;
use crate::scheduler::sequence::{CorrelationId, Owner, SequenceScheduler};

pub use cache::ResponseCache;
#[cfg(feature = "fuzzing")]
pub use check::check_inputs;
pub use ensemble::Ensemble;
pub use instances::may_use_gpu;
#[cfg(test)]
pub use load::ModelParts;
pub use outputs::OutputRequest;
pub use predict::PredictTiming;
pub use runtimes::Runtimes;
#[cfg(test)]
pub use scheduling::Scheduling;

/// A model version that is loaded and can serve.
pub struct Model {
    /// The model's name (its folder name).
    pub name: String,
    /// The version number (its version folder name).
    pub version: u64,
    /// The configuration as `config.pbtxt` states it.
    pub config: ModelConfig,
    /// Plinth's `parameters` of the configuration, parsed.
    pub parameters: Parameters,
    /// The inputs and outputs served, completed from the model file where
    /// the configuration leaves them out.
    pub signature: Signature,
    /// When this version was made (loaded); OpenAI's model `created`.
    pub loaded_at: SystemTime,
    /// Dropped on a blocking thread: dropping it joins the scheduler's
    /// workers and frees the runtimes' sessions.
    engine: FreedOffThread<Engine>,
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
    /// A generative model's decode loop; the plugin is its tokenizer.
    Generative(crate::generate::Generator),
}

/// The scheduler in front of a model's instances.
enum Batcher {
    /// Requests queue by priority and batch dynamically (or run alone).
    Dynamic(Scheduler),
    /// Requests belong to sequences (`sequence_batching`).
    Sequence(SequenceScheduler),
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("name", &self.name).field("version", &self.version).finish_non_exhaustive()
    }
}

impl Model {
    /// Held until this version's instances and schedulers are gone: they
    /// are dropped on a blocking thread once the last holder of the version
    /// lets it go, and [`InUse::none_by`] waits for that (an unload that
    /// hands memory back).
    pub fn freed(&self) -> InUse {
        self.engine.freed()
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
        match &*self.engine {
            Engine::Ensemble(ensemble) => Some(ensemble),
            Engine::Backends { .. } | Engine::Generative(_) => None,
        }
    }

    /// The decode loop and the tokenizer plugin, if this is a generative
    /// model.
    pub fn generative(&self) -> Option<(&crate::generate::Generator, &Arc<Plugin>)> {
        match (&*self.engine, &self.plugin) {
            (Engine::Generative(generator), Some(plugin)) => Some((generator, plugin)),
            _ => None,
        }
    }

    /// Host memory the model holds, in bytes, as its runtimes account for
    /// it: each instance's (ONNX Runtime's session arena, libtorch's
    /// parameters) and its plugin's (compiled code and instance memory).
    /// Nothing another model or request allocates is in it; 0 for an
    /// ensemble, whose steps are models of their own.
    pub fn resident_bytes(&self) -> u64 {
        let instances = match &*self.engine {
            Engine::Backends { instances, .. } => instances.iter().map(|i| i.resident_bytes()).sum(),
            Engine::Ensemble(_) => 0,
            Engine::Generative(generator) => generator.resident_bytes(),
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

    /// Whether requests may carry `sequence_id`: the model has
    /// `sequence_batching`, or it is an ensemble (whose steps may).
    pub fn takes_sequences(&self) -> bool {
        match &*self.engine {
            Engine::Backends { batcher, .. } => matches!(batcher, Batcher::Sequence(_)),
            Engine::Ensemble(_) => true,
            Engine::Generative(_) => false,
        }
    }

    /// Ends sequence `id` of a sequence model if `owner` opened it (its
    /// gRPC stream closed before its END), once nothing of it is queued or
    /// running; does nothing for other models. For an ensemble, its steps'
    /// sequences end by their idle time.
    pub fn release_sequence(&self, id: &CorrelationId, owner: Owner) {
        if let Engine::Backends { batcher: Batcher::Sequence(scheduler), .. } = &*self.engine {
            scheduler.release(id, owner, crate::metrics::SequenceEnd::Cancelled);
        }
    }

    /// The platform name for model metadata (`onnxruntime_onnx`, `ensemble`).
    pub fn platform(&self) -> &str {
        match &*self.engine {
            Engine::Backends { instances, .. } => &instances[0].description().platform,
            Engine::Ensemble(_) => config::validate::ENSEMBLE_PLATFORM,
            Engine::Generative(generator) => generator.kind().platform().unwrap_or_default(),
        }
    }

    /// Whether its answers come from another server (a remote model).
    fn answers_from_elsewhere(&self) -> bool {
        matches!(&*self.engine, Engine::Backends { instances, .. } if instances[0].description().remote)
    }

    /// The backend serving this model; `None` for an ensemble.
    fn backend_kind(&self) -> Option<BackendKind> {
        match &*self.engine {
            Engine::Backends { instances, .. } => Some(instances[0].description().kind),
            Engine::Ensemble(_) => None,
            Engine::Generative(generator) => Some(generator.kind()),
        }
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

    /// The model's counters as they stand now (the status page's source).
    pub fn live_counts(&self) -> crate::metrics::LiveCounts {
        let generation = self.generative().map(|(generator, _)| generator.metrics().counts());
        crate::metrics::LiveCounts { generation, ..self.metrics.live() }
    }

    /// The model's inference statistics (Triton's statistics extension).
    pub fn statistics(&self) -> crate::metrics::ModelStatistics {
        self.metrics.statistics()
    }
}

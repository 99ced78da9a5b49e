//! Execution backends. The rest of the runtime sees a [`Framework`] that
//! loads a model's instances and the [`Backend`] each instance is; each
//! framework lives in its own file, and [`Frameworks::start`] lists them.
//!
//! Adding a backend: a file here with a [`Framework`] (its kind, the GPUs
//! it can use, `load` reading its own `parameters`) and a [`Backend`]
//! (`execute`), its `BackendKind` with Triton's names in
//! `config/backends.rs`, and one entry in [`Frameworks::start`].

#[cfg(test)]
pub mod fake;
pub mod identity;
pub mod onnx;
pub mod remote;
#[cfg(feature = "libtorch")]
pub mod torch;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::config::{ModelConfig, Parameters, Signature};
use crate::gpu::Gpus;
use crate::tensor::{DataType, Tensor};

/// An input or output as the model file declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelIo {
    /// The tensor's name in the model file.
    pub name: String,
    /// `None` when the framework's element type has no v2 datatype.
    pub datatype: Option<DataType>,
    /// The framework's own name of the element type, for error messages.
    pub type_name: String,
    /// Full shape; -1 for a dimension of any size.
    pub shape: Vec<i64>,
}

impl ModelIo {
    /// A tensor as the configuration declares it to the backend: its
    /// `reshape` dimensions if it has them, else `dims`, with a leading
    /// variable batch dimension when the model batches. For backends whose
    /// model files do not record their tensors (TorchScript, identity, some
    /// remotes).
    pub fn from_spec(spec: &crate::tensor::TensorSpec, batching: bool) -> ModelIo {
        let dims = spec.model_dims();
        let shape = if batching { std::iter::once(-1).chain(dims.iter().copied()).collect() } else { dims.to_vec() };
        ModelIo { name: spec.name.clone(), datatype: Some(spec.datatype), type_name: spec.datatype.to_string(), shape }
    }
}

pub use crate::config::BackendKind;

/// Where one instance of a model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    Cpu,
    /// The CUDA device with this index.
    Gpu(usize),
}

/// What a loaded instance declares, the same for every instance of a
/// model: given once at load, read by the model's checks and metadata.
#[derive(Clone, Debug)]
pub struct Description {
    /// Which backend runs it.
    pub kind: BackendKind,
    /// The platform name model metadata reports (`onnxruntime_onnx`,
    /// `identity`, a remote model's own).
    pub platform: String,
    /// The inputs the model file declares.
    pub inputs: Vec<ModelIo>,
    /// The outputs the model file declares.
    pub outputs: Vec<ModelIo>,
    /// Custom key/value metadata stored in the model file.
    pub metadata: Vec<(String, String)>,
    /// Its answers come from another server, whose fault a wrong one is
    /// (HTTP 502, not 500).
    pub remote: bool,
}

/// A loaded model that executes tensors.
pub trait Backend: Send + Sync {
    /// What the instance declares.
    fn description(&self) -> &Description;
    /// Host memory this instance holds, in bytes, as its framework accounts
    /// for it: a property of the model, the same for identical copies
    /// whatever else the process does at the time (a measurement of the
    /// whole process would charge a load with other requests' buffers). 0
    /// for what holds no weights (identity, remote).
    fn resident_bytes(&self) -> u64 {
        0
    }
    /// Runs the model once. Blocks: call it off the async executor.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] when the framework refuses the inputs
    /// (e.g. a size the network cannot process), [`BackendError::Unavailable`]
    /// and [`BackendError::BadGateway`] when a remote server cannot answer or
    /// answers wrongly, [`BackendError::Failed`] for any other failure; each
    /// with the framework's or the remote's message.
    fn execute(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, BackendError>;
}

/// Why a backend run failed; each shows as its message.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The inputs fit the signature but the model cannot process them.
    #[error("{0}")]
    InvalidInput(String),
    /// A remote server cannot be reached or timed out (HTTP 503).
    #[error("{0}")]
    Unavailable(String),
    /// A remote server answered with a failure or an answer that is not a
    /// valid inference response (HTTP 502).
    #[error("{0}")]
    BadGateway(String),
    /// Anything else.
    #[error("{0}")]
    Failed(String),
}

/// A framework Plinth serves models with: it loads a model's instances.
pub trait Framework: Send + Sync {
    /// Which backend it is.
    fn kind(&self) -> BackendKind;

    /// How many GPUs it can run instances on here (ids from 0), or why
    /// none.
    ///
    /// # Errors
    /// Why no GPU serves it: by default, that it runs on the CPU only.
    fn gpus(&self, gpus: &Gpus) -> Result<usize, String> {
        let _ = gpus;
        Err(format!("Plinth runs {} models on the CPU only", self.kind().name()))
    }

    /// The CPU instances of a model without an `instance_group` where no
    /// GPU serves it.
    fn default_instances(&self) -> usize {
        1
    }

    /// Loads `model`'s instances, one per placement, in order.
    ///
    /// # Errors
    /// A message for a bad `parameters` value of the framework's, a missing
    /// or invalid model file, or the framework's own load error.
    fn load(&self, model: &LoadContext<'_>, placements: &[Placement]) -> Result<Vec<Arc<dyn Backend>>, String>;
}

/// What a framework loads a model from.
pub struct LoadContext<'a> {
    /// The model's name, for messages.
    pub name: &'a str,
    /// The version's folder.
    pub version_dir: &'a Path,
    /// The model's configuration.
    pub config: &'a ModelConfig,
    /// Its Plinth parameters, parsed (the framework's own keys among them).
    pub parameters: &'a Parameters,
    /// The tensors the configuration declares to the backend (before
    /// completion from the model file).
    pub signature: &'a Signature,
    gpus: &'a Gpus,
    device_bytes: Mutex<BTreeMap<u32, u64>>,
}

/// Loads onto GPUs one at a time, so that NVML's device-wide count of used
/// memory, read before and after, is this load's alone.
static GPU_LOADS: Mutex<()> = Mutex::new(());

impl<'a> LoadContext<'a> {
    /// The context of one model's load.
    pub fn new(
        name: &'a str,
        version_dir: &'a Path,
        config: &'a ModelConfig,
        parameters: &'a Parameters,
        signature: &'a Signature,
        gpus: &'a Gpus,
    ) -> LoadContext<'a> {
        LoadContext { name, version_dir, config, parameters, signature, gpus, device_bytes: Mutex::default() }
    }

    /// The model file: `default_model_filename` when the configuration
    /// sets it, else the framework's `default`, in the version folder.
    pub fn file(&self, default: &str) -> PathBuf {
        let name = &self.config.default_model_filename;
        self.version_dir.join(if name.is_empty() { default } else { name })
    }

    /// Runs `load` for an instance on `placement`; on a GPU, counts the
    /// device memory it took (NVML's used memory after less before). The
    /// device's CUDA context is made first, so that its fixed cost
    /// (hundreds of MiB that no unload returns) is not charged to the
    /// first model loaded there.
    ///
    /// # Errors
    /// `load`'s, or a GPU index that does not exist.
    pub fn measured<T>(&self, placement: Placement, load: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
        let Placement::Gpu(index) = placement else { return load() };
        let index = u32::try_from(index).map_err(|_| format!("GPU {index} does not exist"))?;
        let _only_load = GPU_LOADS.lock();
        if let Err(e) = crate::gpu::init_context(index) {
            tracing::warn!(gpu = index, "cannot make the CUDA context before measuring a load: {e}");
        }
        let before = self.gpus.memory_used(index);
        let loaded = load()?;
        if let (Some(before), Some(after)) = (before, self.gpus.memory_used(index)) {
            *self.device_bytes.lock().entry(index).or_default() += after.saturating_sub(before);
        }
        Ok(loaded)
    }

    /// The device memory the loads took, in bytes, by GPU index.
    pub fn device_bytes(self) -> BTreeMap<u32, u64> {
        self.device_bytes.into_inner()
    }
}

/// Every framework this build serves, with the runtime each needs.
pub struct Frameworks {
    list: Vec<Box<dyn Framework>>,
    /// ONNX Runtime, or why it is not loaded.
    onnx: Result<Arc<onnx::OnnxRuntime>, String>,
}

impl Frameworks {
    /// Starts ONNX Runtime from `onnx_library` (none: ONNX models will not
    /// load), libtorch when built with the `libtorch` feature, and the
    /// frameworks that need no runtime.
    ///
    /// # Errors
    /// A message when the given ONNX Runtime library cannot be loaded.
    pub fn start(onnx_library: Option<&Path>) -> Result<Frameworks, String> {
        let onnx = onnx::Onnx::start(onnx_library)?;
        let runtime = onnx.runtime().cloned();
        let list: Vec<Box<dyn Framework>> = vec![
            Box::new(onnx),
            #[cfg(feature = "libtorch")]
            Box::new(torch::Libtorch::init()),
            #[cfg(not(feature = "libtorch"))]
            Box::new(Unbuilt {
                kind: BackendKind::Pytorch,
                why: "platform 'pytorch_libtorch' needs a Plinth built with the cargo feature 'libtorch' \
                      (`make setup` builds it)",
            }),
            Box::new(remote::Remote),
            Box::new(identity::Identity),
        ];
        Ok(Frameworks { list, onnx: runtime })
    }

    /// The framework of `kind`.
    pub fn get(&self, kind: BackendKind) -> &dyn Framework {
        self.list.iter().find(|f| f.kind() == kind).map(Box::as_ref).expect("every kind is listed")
    }

    /// Whether ONNX Runtime is loaded (ONNX models can load).
    pub fn has_onnx(&self) -> bool {
        self.onnx.is_ok()
    }

    /// ONNX Runtime, for what runs sessions itself (a generative model).
    ///
    /// # Errors
    /// Says how to give the library when it is not loaded.
    pub fn onnx(&self) -> Result<&Arc<onnx::OnnxRuntime>, String> {
        self.onnx.as_ref().map_err(Clone::clone)
    }
}

/// A framework this build leaves out (a cargo feature off): every load is
/// refused with `why`.
#[cfg(not(feature = "libtorch"))]
struct Unbuilt {
    kind: BackendKind,
    why: &'static str,
}

#[cfg(not(feature = "libtorch"))]
impl Framework for Unbuilt {
    fn kind(&self) -> BackendKind {
        self.kind
    }

    fn gpus(&self, _: &Gpus) -> Result<usize, String> {
        Err(self.why.to_owned())
    }

    fn load(&self, _: &LoadContext<'_>, _: &[Placement]) -> Result<Vec<Arc<dyn Backend>>, String> {
        Err(self.why.to_owned())
    }
}

/// Backends as the trait objects a model holds.
fn shared<B: Backend + 'static>(backends: Vec<B>) -> Vec<Arc<dyn Backend>> {
    backends.into_iter().map(|b| Arc::new(b) as Arc<dyn Backend>).collect()
}

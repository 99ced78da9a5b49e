//! Execution backends. The rest of the runtime sees only [`Backend`]; each
//! framework lives in its own file.

#[cfg(test)]
pub mod fake;
pub mod identity;
pub mod onnx;
pub mod remote;
#[cfg(feature = "libtorch")]
pub mod torch;

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
    /// The CPU.
    Cpu,
    /// The CUDA device with this index.
    Gpu(usize),
}

/// A loaded model that executes tensors.
pub trait Backend: Send + Sync {
    /// The platform name reported in model metadata (`onnxruntime_onnx`).
    fn platform(&self) -> &str;
    /// Which backend this is.
    fn kind(&self) -> BackendKind;
    /// The inputs the model file declares.
    fn inputs(&self) -> &[ModelIo];
    /// The outputs the model file declares.
    fn outputs(&self) -> &[ModelIo];
    /// Custom key/value metadata stored in the model file.
    fn metadata(&self) -> &[(String, String)];
    /// Host memory this instance holds, in bytes, as its framework accounts
    /// for it: a property of the model, the same for identical copies
    /// whatever else the process does at the time (a measurement of the
    /// whole process would charge a load with other requests' buffers). 0
    /// for what holds no weights (identity, remote).
    fn resident_bytes(&self) -> u64;
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

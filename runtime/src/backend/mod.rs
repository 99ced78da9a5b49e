//! Execution backends. The rest of the runtime sees only [`Backend`]; each
//! framework lives in its own file.

pub mod onnx;

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

/// A loaded model that executes tensors.
pub trait Backend: Send + Sync {
    /// The platform name reported in model metadata (`onnxruntime_onnx`).
    fn platform(&self) -> &'static str;
    /// The inputs the model file declares.
    fn inputs(&self) -> &[ModelIo];
    /// The outputs the model file declares.
    fn outputs(&self) -> &[ModelIo];
    /// Custom key/value metadata stored in the model file.
    fn metadata(&self) -> &[(String, String)];
    /// Runs the model once. Blocks: call it off the async executor.
    ///
    /// # Errors
    /// [`BackendError::InvalidInput`] when the framework refuses the inputs
    /// (e.g. a size the network cannot process), [`BackendError::Failed`]
    /// for any other failure; both with the framework's message.
    fn execute(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, BackendError>;
}

/// Why a backend run failed.
#[derive(Debug, PartialEq, Eq)]
pub enum BackendError {
    /// The inputs fit the signature but the model cannot process them.
    InvalidInput(String),
    /// Anything else.
    Failed(String),
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendError::InvalidInput(m) | BackendError::Failed(m) => f.write_str(m),
        }
    }
}

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
    /// The framework's message when execution fails.
    fn execute(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, String>;
}

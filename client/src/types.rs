//! The KServe v2 JSON request and response messages, with typed helpers
//! for tensor data.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::ClientError;

/// An inference request (`POST .../infer` body).
#[derive(Clone, Debug, Default, Serialize)]
pub struct InferRequest {
    /// Echoed back in the response.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Request parameters, e.g. `priority` (1 = highest level) and
    /// `timeout` (queue timeout, microseconds).
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub parameters: Map<String, Value>,
    /// The input tensors.
    pub inputs: Vec<InferInput>,
}

impl InferRequest {
    /// A request with these inputs and no parameters.
    pub fn new(inputs: Vec<InferInput>) -> InferRequest {
        InferRequest { inputs, ..InferRequest::default() }
    }

    /// The request as a JSON body.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a request of JSON values serialises")
    }

    /// The same request with parameter `key` set to `value`.
    pub fn parameter(mut self, key: &str, value: impl Into<Value>) -> InferRequest {
        self.parameters.insert(key.to_owned(), value.into());
        self
    }
}

/// One input tensor: flat row-major `data`.
#[derive(Clone, Debug, Serialize)]
pub struct InferInput {
    /// The input's name.
    pub name: String,
    /// Its full shape, batch dimension included.
    pub shape: Vec<i64>,
    /// A v2 datatype name (`FP32`, `INT64`, `BYTES`, ...).
    pub datatype: String,
    /// The elements, flat, as JSON values.
    pub data: Value,
}

impl InferInput {
    /// An `FP32` input of `shape` with `values` (row-major).
    pub fn fp32(name: &str, shape: &[i64], values: &[f32]) -> InferInput {
        InferInput { name: name.to_owned(), shape: shape.to_vec(), datatype: "FP32".into(), data: values.into() }
    }
}

/// An inference response.
#[derive(Clone, Debug, Deserialize)]
pub struct InferResponse {
    /// The model that answered.
    pub model_name: String,
    /// The version that answered (optional in the protocol).
    #[serde(default)]
    pub model_version: Option<String>,
    /// The request's `id`, if it had one.
    #[serde(default)]
    pub id: Option<String>,
    /// The output tensors.
    pub outputs: Vec<InferOutput>,
}

impl InferResponse {
    /// The output named `name`.
    pub fn output(&self, name: &str) -> Option<&InferOutput> {
        self.outputs.iter().find(|o| o.name == name)
    }
}

/// One output tensor.
#[derive(Clone, Debug, Deserialize)]
pub struct InferOutput {
    /// The output's name.
    pub name: String,
    /// Its full shape.
    pub shape: Vec<i64>,
    /// Its v2 datatype name.
    pub datatype: String,
    /// The elements, flat, row-major.
    pub data: Vec<Value>,
}

impl InferOutput {
    /// The elements as `f32`.
    ///
    /// # Errors
    /// [`ClientError::Protocol`] when an element is not a number.
    pub fn to_f32(&self) -> Result<Vec<f32>, ClientError> {
        self.data
            .iter()
            .map(|v| v.as_f64().map(|f| f as f32))
            .collect::<Option<_>>()
            .ok_or_else(|| ClientError::Protocol(format!("output '{}' has elements that are not numbers", self.name)))
    }
}

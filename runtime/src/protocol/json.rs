//! The KServe v2 (Open Inference Protocol) JSON messages and the conversion
//! of JSON tensor `data` to and from raw tensor bytes (the protocol's
//! "Inference Request JSON Object" and "Tensor Data" sections).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::parameters::Parameters;
use crate::error::Error;
use crate::tensor::{DataType, Tensor, bytes_elements, element_count, push_bytes_element, request_datatype};

/// `POST /v2/models/{m}/infer` body.
#[derive(Debug, Default, Deserialize)]
pub struct InferRequest {
    /// The client's request id, echoed in the response.
    #[serde(default)]
    pub id: Option<String>,
    /// Request parameters (`priority`, `timeout`, `binary_data_output`,
    /// the sequence extension's), read by [`super::request::decode_head`].
    #[serde(default)]
    pub parameters: Parameters,
    /// The input tensors.
    pub inputs: Vec<InputTensor>,
    /// The outputs asked for; absent means all.
    #[serde(default)]
    pub outputs: Option<Vec<RequestedOutput>>,
}

/// One input tensor of an inference request.
#[derive(Debug, Deserialize)]
pub struct InputTensor {
    /// The input's name.
    pub name: String,
    /// Its full shape, batch dimension included.
    pub shape: Vec<i64>,
    /// The v2 datatype name (`FP32`, `BYTES`, ...).
    pub datatype: String,
    /// Tensor parameters (`binary_data_size`, a shared memory place).
    /// `null` reads as none: the KServe Python server sends it that way.
    #[serde(default)]
    pub parameters: Parameters,
    /// Row-major elements, flat or nested as the shape.
    #[serde(default)]
    pub data: Value,
}

/// An output the client asks for.
#[derive(Debug, Deserialize)]
pub struct RequestedOutput {
    /// The output's name.
    pub name: String,
    /// Output parameters (`binary_data`, `classification`, a shared
    /// memory place).
    #[serde(default)]
    pub parameters: Parameters,
}

/// The inference response body.
#[derive(Debug, Serialize)]
pub struct InferResponse {
    /// The model that answered.
    pub model_name: String,
    /// Its version.
    pub model_version: String,
    /// The request's id, if it had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The output tensors.
    pub outputs: Vec<OutputTensor>,
}

/// One output tensor of a response: `data` flat and row-major, or, for
/// binary tensor data, `parameters.binary_data_size` and no `data`.
#[derive(Debug, Serialize)]
pub struct OutputTensor {
    /// The output's name.
    pub name: String,
    /// Its v2 datatype name.
    pub datatype: &'static str,
    /// Its full shape.
    pub shape: Vec<i64>,
    /// `{"binary_data_size": N}` for an output sent as binary data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// The elements, for an output sent as JSON.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<OutputData>,
}

/// Output elements, kept in their own type so that floats print with their
/// shortest exact representation (an FP32 0.1 stays `0.1`).
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum OutputData {
    /// BOOL.
    Bool(Vec<bool>),
    /// UINT8 to UINT64.
    Unsigned(Vec<u64>),
    /// INT8 to INT64.
    Signed(Vec<i64>),
    /// FP32.
    Fp32(Vec<f32>),
    /// FP64.
    Fp64(Vec<f64>),
    /// BYTES, as UTF-8 text (invalid sequences replaced).
    Bytes(Vec<String>),
}

/// `GET /v2/models/{m}` body.
#[derive(Debug, Serialize)]
pub struct ModelMetadata {
    /// The model's name.
    pub name: String,
    /// Its READY versions, ascending.
    pub versions: Vec<String>,
    /// The platform (`onnxruntime_onnx`, `pytorch_libtorch`).
    pub platform: String,
    /// The inputs.
    pub inputs: Vec<TensorMetadata>,
    /// The outputs.
    pub outputs: Vec<TensorMetadata>,
}

/// A tensor in model metadata; -1 marks a dimension of any size.
#[derive(Debug, Serialize)]
pub struct TensorMetadata {
    /// The tensor's name.
    pub name: String,
    /// Its v2 datatype name.
    pub datatype: &'static str,
    /// Its full shape, -1 for a dimension of any size.
    pub shape: Vec<i64>,
}

impl InputTensor {
    /// Converts the JSON tensor to raw bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the tensor for an unknown datatype,
    /// a negative dimension, an element of the wrong JSON type or range, a
    /// datatype JSON cannot carry (FP16, BF16) or an element count that does
    /// not match the shape.
    pub fn into_tensor(self) -> Result<Tensor, Error> {
        let name = self.name;
        let bad = |m: String| Error::InvalidArgument(format!("input '{name}': {m}"));
        let datatype = request_datatype(&self.datatype, &self.shape).map_err(bad)?;
        if matches!(datatype, DataType::Fp16 | DataType::Bf16) {
            return Err(bad(format!(
                "{datatype} has no JSON representation; send it with the binary tensor data extension"
            )));
        }
        // Both limits and their texts are Triton's (`http_server.cc`).
        let max = i64::MAX as usize;
        let expected = element_count(&self.shape).filter(|&n| n <= max).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "invalid shape for input '{name}': shape {:?} causes total element count to exceed maximum size of {max}",
                self.shape
            ))
        })?;
        let size = datatype.element_size().unwrap_or(4);
        if expected.checked_mul(size).is_none_or(|bytes| bytes > max) {
            return Err(Error::InvalidArgument(format!(
                "byte size overflow for input '{name}': element count ({expected}) * data type size ({size}) exceeds \
                 maximum allowed size ({max})"
            )));
        }
        let mut data = Vec::new();
        let mut count = 0usize;
        flatten(&self.data, &self.shape, &mut |v| {
            encode_element(datatype, v, &mut data).map_err(|m| bad(format!("element {count}: {m}")))?;
            count += 1;
            Ok(())
        })
        .map_err(|m| bad(format!("data: {m}")))??;
        if count != expected {
            return Err(bad(format!("shape {:?} needs {expected} elements, but data has {count}", self.shape)));
        }
        Ok(Tensor { name, datatype, shape: self.shape, data })
    }
}

/// Visits the scalars of `data` in row-major order. `data` is a flat array,
/// or nested to follow `dims` from the outside in: an array of arrays must
/// have `dims[0]` items, and an array of scalars holds the rest of the
/// shape flat. Ragged or mixed nesting is an error (outer `Err`); the
/// visitor's own errors come back in the inner `Result`.
fn flatten(
    data: &Value,
    dims: &[i64],
    visit: &mut impl FnMut(&Value) -> Result<(), Error>,
) -> Result<Result<(), Error>, String> {
    let Value::Array(items) = data else { return Ok(visit(data)) };
    if !items.iter().any(Value::is_array) {
        return Ok(items.iter().try_for_each(visit));
    }
    let Some((&outer, inner)) = dims.split_first() else {
        return Err("nested deeper than the shape".into());
    };
    if !items.iter().all(Value::is_array) || items.len() as i64 != outer {
        return Err(format!("a nested array must hold {outer} arrays, one per index of that dimension"));
    }
    for item in items {
        let held = visit_count(item);
        if held != element_count(inner).unwrap_or(usize::MAX) {
            return Err(format!("a nested array holds {held} elements where the shape needs {inner:?}"));
        }
        if let Err(e) = flatten(item, inner, visit)? {
            return Ok(Err(e));
        }
    }
    Ok(Ok(()))
}

/// How many scalars a JSON value holds.
fn visit_count(v: &Value) -> usize {
    match v {
        Value::Array(items) => items.iter().map(visit_count).sum(),
        _ => 1,
    }
}

fn encode_element(dt: DataType, v: &Value, out: &mut Vec<u8>) -> Result<(), String> {
    fn int<T: TryFrom<i64> + TryFrom<u64>>(v: &Value, dt: DataType) -> Result<T, String> {
        let out_of_range = || format!("{v} is out of range for {dt}");
        match (v.as_i64(), v.as_u64()) {
            (_, Some(u)) => T::try_from(u).map_err(|_| out_of_range()),
            (Some(i), None) => T::try_from(i).map_err(|_| out_of_range()),
            _ => Err(format!("expected an integer for {dt}, got {v}")),
        }
    }
    let float = || v.as_f64().ok_or_else(|| format!("expected a number for {dt}, got {v}"));
    match dt {
        DataType::Bool => {
            out.push(u8::from(v.as_bool().ok_or_else(|| format!("expected true or false for BOOL, got {v}"))?))
        }
        DataType::Uint8 => out.extend(int::<u8>(v, dt)?.to_le_bytes()),
        DataType::Uint16 => out.extend(int::<u16>(v, dt)?.to_le_bytes()),
        DataType::Uint32 => out.extend(int::<u32>(v, dt)?.to_le_bytes()),
        DataType::Uint64 => out.extend(int::<u64>(v, dt)?.to_le_bytes()),
        DataType::Int8 => out.extend(int::<i8>(v, dt)?.to_le_bytes()),
        DataType::Int16 => out.extend(int::<i16>(v, dt)?.to_le_bytes()),
        DataType::Int32 => out.extend(int::<i32>(v, dt)?.to_le_bytes()),
        DataType::Int64 => out.extend(int::<i64>(v, dt)?.to_le_bytes()),
        DataType::Fp32 => {
            let x = float()? as f32;
            if x.is_infinite() {
                return Err(format!("{v} is out of range for FP32"));
            }
            out.extend(x.to_le_bytes())
        }
        DataType::Fp64 => out.extend(float()?.to_le_bytes()),
        DataType::Bytes => {
            let s = v.as_str().ok_or_else(|| format!("expected a string for BYTES, got {v}"))?;
            push_bytes_element(out, s.as_bytes());
        }
        DataType::Fp16 | DataType::Bf16 => unreachable!("refused before encoding"),
    }
    Ok(())
}

impl OutputTensor {
    /// Converts a raw output tensor to its JSON form.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for FP16/BF16 outputs, which JSON cannot
    /// carry; [`Error::Internal`] for data that does not fill the shape.
    pub fn from_tensor(t: Tensor) -> Result<OutputTensor, Error> {
        t.check_data().map_err(Error::Internal)?;
        let le = |n: usize| t.data.chunks_exact(n);
        let data = match t.datatype {
            DataType::Bool => OutputData::Bool(t.data.iter().map(|&b| b != 0).collect()),
            DataType::Uint8 => OutputData::Unsigned(t.data.iter().map(|&b| u64::from(b)).collect()),
            DataType::Uint16 => {
                OutputData::Unsigned(le(2).map(|c| u64::from(u16::from_le_bytes([c[0], c[1]]))).collect())
            }
            DataType::Uint32 => {
                OutputData::Unsigned(le(4).map(|c| u64::from(u32::from_le_bytes(c.try_into().unwrap()))).collect())
            }
            DataType::Uint64 => {
                OutputData::Unsigned(le(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect())
            }
            DataType::Int8 => OutputData::Signed(t.data.iter().map(|&b| i64::from(b as i8)).collect()),
            DataType::Int16 => OutputData::Signed(le(2).map(|c| i64::from(i16::from_le_bytes([c[0], c[1]]))).collect()),
            DataType::Int32 => {
                OutputData::Signed(le(4).map(|c| i64::from(i32::from_le_bytes(c.try_into().unwrap()))).collect())
            }
            DataType::Int64 => OutputData::Signed(le(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()),
            DataType::Fp32 => OutputData::Fp32(le(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()),
            DataType::Fp64 => OutputData::Fp64(le(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect()),
            DataType::Bytes => OutputData::Bytes(
                bytes_elements(&t.data)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .collect(),
            ),
            DataType::Fp16 | DataType::Bf16 => {
                return Err(Error::InvalidArgument(format!(
                    "output '{}' is {}, which has no JSON representation; request it with the binary tensor data extension",
                    t.name, t.datatype
                )));
            }
        };
        Ok(OutputTensor {
            name: t.name,
            datatype: t.datatype.name(),
            shape: t.shape,
            parameters: None,
            data: Some(data),
        })
    }

    /// The JSON part of an output sent as `size` bytes of binary data.
    pub fn binary(t: Tensor, size: usize) -> OutputTensor {
        OutputTensor {
            name: t.name,
            datatype: t.datatype.name(),
            shape: t.shape,
            parameters: Some(serde_json::json!({ "binary_data_size": size })),
            data: None,
        }
    }

    /// An output without its data: its name, datatype and shape (one
    /// written to shared memory).
    pub fn described(t: Tensor) -> OutputTensor {
        OutputTensor { name: t.name, datatype: t.datatype.name(), shape: t.shape, parameters: None, data: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn input(datatype: &str, shape: &[i64], data: Value) -> InputTensor {
        InputTensor {
            name: "x".into(),
            shape: shape.to_vec(),
            datatype: datatype.into(),
            parameters: Parameters::default(),
            data,
        }
    }

    #[test]
    fn nested_and_flat_data_give_the_same_bytes() {
        let flat = input("INT32", &[2, 2], json!([1, 2, 3, -4])).into_tensor().unwrap();
        let nested = input("INT32", &[2, 2], json!([[1, 2], [3, -4]])).into_tensor().unwrap();
        assert_eq!(flat, nested);
        assert_eq!(&flat.data[12..], &(-4i32).to_le_bytes());
    }

    #[test]
    fn every_json_datatype_round_trips() {
        let cases = [
            ("BOOL", json!([true, false])),
            ("UINT8", json!([0, 255])),
            ("UINT16", json!([0, 65535])),
            ("UINT32", json!([0, 4294967295u64])),
            ("UINT64", json!([0, u64::MAX])),
            ("INT8", json!([-128, 127])),
            ("INT16", json!([-32768, 32767])),
            ("INT32", json!([i32::MIN, i32::MAX])),
            ("INT64", json!([i64::MIN, i64::MAX])),
            ("FP32", json!([0.1, -2.5])),
            ("FP64", json!([0.1, 1e300])),
            ("BYTES", json!(["héllo", ""])),
        ];
        for (dt, data) in cases {
            let t = input(dt, &[2], data.clone()).into_tensor().unwrap();
            let text = serde_json::to_string(&OutputTensor::from_tensor(t).unwrap()).unwrap();
            let out: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(out["data"], data, "{dt}");
            assert_eq!(out["datatype"], dt);
        }
    }

    #[test]
    fn bad_data_names_the_tensor_and_the_problem() {
        let err = input("UINT8", &[1], json!([256])).into_tensor().unwrap_err().to_string();
        assert!(err.contains("input 'x'") && err.contains("out of range for UINT8"), "{err}");
        let err = input("FP32", &[3], json!([1.0, 2.0])).into_tensor().unwrap_err().to_string();
        assert!(err.contains("needs 3 elements, but data has 2"), "{err}");
        let err = input("FP32", &[1], json!(["a"])).into_tensor().unwrap_err().to_string();
        assert!(err.contains("expected a number for FP32"), "{err}");
        let err = input("FLOAT32", &[1], json!([1])).into_tensor().unwrap_err().to_string();
        assert!(err.contains("unknown datatype 'FLOAT32'"), "{err}");
        let err = input("FP16", &[1], json!([1])).into_tensor().unwrap_err().to_string();
        assert!(err.contains("binary tensor data extension"), "{err}");
        let err = input("FP32", &[1], json!([1e39])).into_tensor().unwrap_err().to_string();
        assert!(err.contains("out of range for FP32"), "{err}");
        // Triton's texts for both overflows (`http_server.cc`).
        let err = input("FP32", &[16, (1 << 60) + 2], json!([1])).into_tensor().unwrap_err().to_string();
        assert!(err.contains("causes total element count to exceed maximum size of 9223372036854775807"), "{err}");
        let err = input("FP32", &[4, (1 << 60) + 2], json!([1])).into_tensor().unwrap_err().to_string();
        assert!(err.starts_with("byte size overflow for input 'x': element count (4611686018427387912)"), "{err}");
    }

    #[test]
    fn nesting_must_follow_the_shape() {
        let ok = input("INT8", &[2, 2, 2], json!([[1, 2, 3, 4], [5, 6, 7, 8]])).into_tensor().unwrap();
        assert_eq!(ok.data, vec![1, 2, 3, 4, 5, 6, 7, 8]);
        for ragged in [json!([[1, 2, 3], [4, 5, 6, 7, 8]]), json!([[1, 2], 3, 4, 5, 6, 7, 8]), json!([[[[1]]]])] {
            let err = input("INT8", &[2, 2, 2], ragged.clone()).into_tensor().unwrap_err().to_string();
            assert!(err.contains("input 'x': data:"), "{ragged}: {err}");
        }
    }
}

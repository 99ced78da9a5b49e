//! The KServe v2 (Open Inference Protocol) JSON messages and the conversion
//! of JSON tensor `data` to and from raw tensor bytes (the protocol's
//! "Inference Request JSON Object" and "Tensor Data" sections).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::json_data::{DataSeed, InputData, REFUSED, WORDING_LIMIT, read_raw, read_value};
use super::parameters::Parameters;
use crate::error::Error;
use crate::tensor::{DataType, Tensor, bytes_elements, element_count, request_datatype};

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
#[derive(Debug)]
pub struct InputTensor {
    /// The input's name.
    pub name: String,
    /// Its full shape, batch dimension included.
    pub shape: Vec<i64>,
    /// The v2 datatype name (`FP32`, `BYTES`, ...).
    pub datatype: String,
    /// Tensor parameters (`binary_data_size`, a shared memory place).
    /// `null` reads as none: the KServe Python server sends it that way.
    pub parameters: Parameters,
    /// Row-major elements, flat or nested as the shape, as far as parsing
    /// read them.
    pub data: InputData,
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
    /// The version that answered, as text (the protocol's string).
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
    /// The input tensors, in the configuration's order.
    pub inputs: Vec<TensorMetadata>,
    /// The output tensors, in the configuration's order.
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
        let (data, count) = match self.data {
            InputData::Read { bytes, elements } => (bytes, elements),
            InputData::Parsed(value) => read_value(&value, datatype, &self.shape).map_err(bad)?,
            InputData::Raw(raw) => read_raw(&raw, datatype, &self.shape).map_err(bad)?,
            InputData::Absent => read_value(&Value::Null, datatype, &self.shape).map_err(bad)?,
            // Left unread by `from_json` in a message over WORDING_LIMIT.
            InputData::Unread => return Err(bad(REFUSED.to_owned())),
        };
        if count != expected {
            return Err(bad(format!("shape {:?} needs {expected} elements, but data has {count}", self.shape)));
        }
        Ok(Tensor { name, datatype, shape: self.shape, data })
    }
}

/// Reads an input tensor's fields in any order; `data` is read straight
/// into bytes when `shape` and `datatype` came before it ([`DataSeed`]).
/// Other fields are ignored, as in the rest of the message.
impl<'de> Deserialize<'de> for InputTensor {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<InputTensor, D::Error> {
        d.deserialize_map(InputTensorVisitor)
    }
}

struct InputTensorVisitor;

/// An input tensor's keys.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum Field {
    Name,
    Shape,
    Datatype,
    Parameters,
    Data,
    #[serde(other)]
    Other,
}

impl<'de> serde::de::Visitor<'de> for InputTensorVisitor {
    type Value = InputTensor;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an input tensor object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<InputTensor, A::Error> {
        use serde::de::Error as _;
        fn once<T, E: serde::de::Error>(slot: &mut Option<T>, field: &'static str, value: T) -> Result<(), E> {
            match slot.replace(value) {
                Some(_) => Err(E::duplicate_field(field)),
                None => Ok(()),
            }
        }
        let (mut name, mut shape, mut datatype, mut parameters, mut data) = (None, None, None, None, None);
        while let Some(field) = map.next_key::<Field>()? {
            match field {
                Field::Name => once(&mut name, "name", map.next_value::<String>()?)?,
                Field::Shape => once(&mut shape, "shape", map.next_value::<Vec<i64>>()?)?,
                Field::Datatype => once(&mut datatype, "datatype", map.next_value::<String>()?)?,
                Field::Parameters => once(&mut parameters, "parameters", map.next_value::<Parameters>()?)?,
                Field::Data => {
                    let seed = DataSeed { datatype: datatype.as_deref(), shape: shape.as_deref() };
                    let value = map.next_value_seed(seed)?;
                    once(&mut data, "data", value)?
                }
                Field::Other => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(InputTensor {
            name: name.ok_or_else(|| A::Error::missing_field("name"))?,
            shape: shape.ok_or_else(|| A::Error::missing_field("shape"))?,
            datatype: datatype.ok_or_else(|| A::Error::missing_field("datatype"))?,
            parameters: parameters.unwrap_or_default(),
            data: data.unwrap_or_default(),
        })
    }
}

/// A message holding a list of tensors with JSON `data`: a request's
/// `inputs`, or a response's `outputs` read by the remote backend.
pub trait TensorList: serde::de::DeserializeOwned {
    /// The list's key in the message.
    const KEY: &'static str;
    /// The tensors, in message order.
    fn tensors(&mut self) -> &mut [InputTensor];
}

impl TensorList for InferRequest {
    const KEY: &'static str = "inputs";
    fn tensors(&mut self) -> &mut [InputTensor] {
        &mut self.inputs
    }
}

/// Parses a message whose tensors' `data` is read as it is parsed; a
/// tensor whose direct reading stopped ([`InputData::Unread`]) has its
/// `data` parsed again from `json` as a value, which words its error,
/// when `json` is within [`WORDING_LIMIT`].
///
/// # Errors
/// serde_json's, for text that is not the message.
pub fn from_json<T: TensorList>(json: &[u8]) -> serde_json::Result<T> {
    let mut message: T = serde_json::from_slice(json)?;
    if json.len() <= WORDING_LIMIT && message.tensors().iter().any(|t| matches!(t.data, InputData::Unread)) {
        let mut parsed: Value = serde_json::from_slice(json)?;
        for (i, tensor) in message.tensors().iter_mut().enumerate() {
            if matches!(tensor.data, InputData::Unread) {
                tensor.data = InputData::Parsed(parsed[T::KEY][i]["data"].take());
            }
        }
    }
    Ok(message)
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

    /// The tensor of `{"name": "x", ...}` with `data` last, as clients
    /// write it (read as parsed), after checking that the same tensor with
    /// `data` first (read from a value) converts the same way.
    fn input(datatype: &str, shape: &[i64], data: Value) -> InputTensor {
        let parse = |fields: [String; 4]| {
            let body = format!(r#"{{"inputs": [{{{}}}]}}"#, fields.join(", "));
            from_json::<InferRequest>(body.as_bytes()).unwrap().inputs.pop().unwrap()
        };
        let [name, shape, datatype, data] = [
            r#""name": "x""#.to_owned(),
            format!(r#""shape": {}"#, json!(shape)),
            format!(r#""datatype": {}"#, json!(datatype)),
            format!(r#""data": {data}"#),
        ];
        let first = parse([data.clone(), name.clone(), shape.clone(), datatype.clone()]);
        assert!(matches!(first.data, InputData::Raw(_) | InputData::Absent), "{:?}", first.data);
        let last = parse([name, shape, datatype, data]);
        let converted = |t: &InputTensor| {
            let copy = InputTensor {
                name: t.name.clone(),
                shape: t.shape.clone(),
                datatype: t.datatype.clone(),
                parameters: Parameters::default(),
                data: match &t.data {
                    InputData::Read { bytes, elements } => {
                        InputData::Read { bytes: bytes.clone(), elements: *elements }
                    }
                    InputData::Parsed(v) => InputData::Parsed(v.clone()),
                    InputData::Raw(r) => InputData::Raw(r.clone()),
                    InputData::Absent => InputData::Absent,
                    InputData::Unread => InputData::Unread,
                },
            };
            copy.into_tensor().map_err(|e| e.to_string())
        };
        assert_eq!(converted(&first), converted(&last), "data first and last convert alike");
        last
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

    #[test]
    fn data_after_its_datatype_and_shape_is_read_while_parsing_and_anything_odd_is_worded_by_the_value_reading() {
        let read = input("FP32", &[2, 2], json!([[1, 2.5], [3, -4]]));
        assert!(matches!(&read.data, InputData::Read { elements: 4, .. }), "{:?}", read.data);
        // Each of these is compared with the value reading in `input`.
        let cases = [
            ("FP32", vec![1], json!(7)),
            ("BYTES", vec![1], json!("one")),
            ("BYTES", vec![2], json!(["a", 1])),
            ("FP32", vec![2], json!(null)),
            ("FP32", vec![2], json!([1, null])),
            ("FP32", vec![2], json!([1, {"a": 1}])),
            ("FP32", vec![2], json!({"a": [1, 2]})),
            ("FP32", vec![0, 2], json!([])),
            ("FP32", vec![2, 0], json!([[], []])),
            ("FP32", vec![2, 2], json!([[1, 2], 3, 4])),
            ("FP32", vec![2, 2], json!([1, 2, [3, 4]])),
            ("FP32", vec![2, 2], json!([[1, 2], [3, 4], [5, 6]])),
            ("FP32", vec![2, 2], json!([[1, 2, 3], [4]])),
            ("FP32", vec![2, 2], json!([[[1, 2]], [[3, 4]]])),
            ("FP32", vec![4], json!([[1, 2], [3, 4]])),
            ("UINT8", vec![2, 2], json!([[1, 256], [3, 4, 5]])),
            ("INT8", vec![2, 2], json!([[1, "2"], [3, 4]])),
            ("BOOL", vec![3], json!([true, false, 1])),
            ("FP16", vec![1], json!([1])),
            ("FP32", vec![-1], json!([1])),
            ("FP64", vec![2], json!([1e308, -0.0])),
        ];
        for (datatype, shape, data) in cases {
            input(datatype, &shape, data);
        }
    }

    #[test]
    fn both_readings_agree_on_generated_data() {
        // A fixed-seed generator of nested data, mostly well formed.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let datatypes = ["BOOL", "UINT8", "INT8", "INT32", "UINT64", "INT64", "FP32", "FP64", "BYTES"];
        for _ in 0..600 {
            let datatype = datatypes[next(datatypes.len() as u64) as usize];
            let shape: Vec<i64> = (0..1 + next(3)).map(|_| next(3) as i64).collect();
            let count = element_count(&shape).unwrap() + (next(8) == 0) as usize;
            let mut element = || match next(12) {
                0 => json!(true),
                1 => json!(-(next(300) as i64)),
                2 => json!("s"),
                3 => json!(1e39),
                4 => json!(null),
                5 => json!(u64::MAX),
                6..=8 => json!(next(300)),
                _ => json!(next(1000) as f64 / 8.0),
            };
            let flat: Vec<Value> = (0..count).map(|_| element()).collect();
            let data = match (next(3), shape.as_slice()) {
                (0, [outer, ..]) if *outer > 0 => {
                    let rows = flat.chunks(flat.len().div_ceil(*outer as usize).max(1));
                    Value::Array(rows.map(|r| Value::Array(r.to_vec())).collect())
                }
                _ => Value::Array(flat),
            };
            input(datatype, &shape, data);
        }
    }

    #[test]
    fn an_input_s_keys_are_read_in_any_order_once_each_and_unknown_ones_are_skipped() {
        let parse = |input: &str| from_json::<InferRequest>(format!(r#"{{"inputs": [{input}]}}"#).as_bytes());
        let ok =
            parse(r#"{"extra": {"a": [1]}, "data": [1, 2], "datatype": "INT8", "shape": [2], "name": "x"}"#).unwrap();
        assert_eq!(ok.inputs[0].datatype, "INT8");
        let err = parse(r#"{"name": "x", "shape": [1], "datatype": "INT8", "data": [1], "data": [2]}"#).unwrap_err();
        assert!(err.to_string().contains("duplicate field `data`"), "{err}");
        let err = parse(r#"{"name": "x", "shape": [1], "data": [1]}"#).unwrap_err();
        assert!(err.to_string().contains("missing field `datatype`"), "{err}");
    }
}

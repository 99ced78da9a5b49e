//! The KServe v2 gRPC messages (`inference.GRPCInferenceService`, from
//! `proto/grpc_service.proto`) and their tensor codec: a `ModelInferRequest`
//! taken apart into its [`RequestHead`] and input tensors, and output
//! tensors put into a `ModelInferResponse`. The gRPC counterpart of
//! [`super::json`] and [`super::binary`]; the tonic service (`server`)
//! only calls it.

use std::collections::HashMap;

use super::parameters::{Front, Parameters, Value};
use super::request::{RequestHead, SequenceParameters, decode_head};
use super::shared_memory::{self, RegionRef, Regions};
use crate::error::Error;
use crate::tensor::{DataType, Tensor, push_bytes_element, request_datatype};

/// The generated messages and the service trait of package `inference`
/// (`ModelConfig` itself is `config::proto`'s).
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/wire/inference.rs"));
}

use proto::infer_parameter::ParameterChoice;
use proto::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};

/// An inference request's or tensor's parameters as [`Parameters`]; a
/// parameter with no value set is none.
pub fn parameters(map: &HashMap<String, proto::InferParameter>) -> Parameters {
    let value = |choice: &ParameterChoice| match choice {
        ParameterChoice::BoolParam(b) => Value::Bool(*b),
        ParameterChoice::Int64Param(n) => Value::Int(*n),
        ParameterChoice::Uint64Param(n) => Value::Uint(*n),
        ParameterChoice::DoubleParam(x) => Value::Double(*x),
        ParameterChoice::StringParam(s) => Value::Text(s.clone()),
    };
    map.iter().filter_map(|(k, p)| Some((k.clone(), value(p.parameter_choice.as_ref()?)))).collect()
}

/// A repository load's or unload's parameters as [`Parameters`].
pub fn repository_parameters(map: HashMap<String, proto::ModelRepositoryParameter>) -> Parameters {
    use proto::model_repository_parameter::ParameterChoice as P;
    let value = |choice: P| match choice {
        P::BoolParam(b) => Value::Bool(b),
        P::Int64Param(n) => Value::Int(n),
        P::StringParam(s) => Value::Text(s),
        P::BytesParam(b) => Value::Bytes(b),
    };
    map.into_iter().filter_map(|(k, p)| Some((k, value(p.parameter_choice?)))).collect()
}

/// A `ModelInferRequest` taken apart for `model`.
pub struct Decoded {
    /// Its parameters and requested outputs, read.
    pub head: RequestHead,
    /// Its inputs, in request order.
    pub tensors: Vec<Tensor>,
}

/// Reads the parameters, inputs and requested outputs of a request to
/// `model`. An input's data comes from a shared memory region (read through
/// `regions`), from `raw_input_contents` (one entry per input not in shared
/// memory, in order, as Triton counts them) or from its typed `contents`.
///
/// # Errors
/// [`Error::InvalidArgument`] for the errors of [`decode_head`], a count of
/// raw contents that does not match the inputs, an input with both raw and
/// typed contents, typed contents in another field than its datatype's or
/// beside a region (Triton's text), or data that does not fill the shape;
/// the errors of [`Regions::read`].
pub fn decode(
    model: &str,
    parameters: &HashMap<String, proto::InferParameter>,
    inputs: Vec<InferInputTensor>,
    raw: Vec<Vec<u8>>,
    outputs: &[InferRequestedOutputTensor],
    regions: &dyn Regions,
) -> Result<Decoded, Error> {
    let input_parameters: Vec<Parameters> = inputs.iter().map(|i| self::parameters(&i.parameters)).collect();
    let output_parameters: Vec<Parameters> = outputs.iter().map(|o| self::parameters(&o.parameters)).collect();
    let head = decode_head(
        Front::Grpc,
        &self::parameters(parameters),
        inputs.iter().map(|i| i.name.as_str()).zip(&input_parameters),
        outputs.iter().map(|o| o.name.as_str()).zip(&output_parameters),
    )?;
    let places = inputs
        .iter()
        .zip(&input_parameters)
        .map(|(i, p)| RegionRef::from_parameters(&i.name, p))
        .collect::<Result<Vec<_>, _>>()?;
    let tensors = input_tensors(model, inputs, places, raw, regions)?;
    Ok(Decoded { head, tensors })
}

/// The inputs as tensors, each from its shared memory place, its raw
/// contents or its typed contents.
fn input_tensors(
    model: &str,
    inputs: Vec<InferInputTensor>,
    places: Vec<Option<RegionRef>>,
    raw: Vec<Vec<u8>>,
    regions: &dyn Regions,
) -> Result<Vec<Tensor>, Error> {
    let in_body = places.iter().filter(|p| p.is_none()).count();
    if !raw.is_empty() && raw.len() != in_body {
        return Err(Error::InvalidArgument(format!(
            "raw_input_contents has {} entries for {in_body} inputs not in shared memory; give one per input, in order",
            raw.len(),
        )));
    }
    let mut raw = raw.into_iter();
    inputs
        .into_iter()
        .zip(places)
        .map(|(input, place)| {
            let bad = |m: String| Error::InvalidArgument(format!("input '{}': {m}", input.name));
            let contents = input.contents.unwrap_or_default();
            if let Some(at) = place {
                if contents != proto::InferTensorContents::default() {
                    return Err(Error::InvalidArgument(format!(
                        "unexpected 'content' provided when using shared memory for input tensor '{}' for model \
                         '{model}'",
                        input.name
                    )));
                }
                return shared_memory::input_tensor(model, input.name, &input.datatype, input.shape, &at, regions);
            }
            let datatype = request_datatype(&input.datatype, &input.shape).map_err(bad)?;
            let data = match raw.next() {
                Some(_) if contents != proto::InferTensorContents::default() => {
                    return Err(bad("has both typed contents and raw_input_contents; give one".into()));
                }
                Some(bytes) => bytes,
                None => typed_contents(datatype, contents).map_err(bad)?,
            };
            let tensor = Tensor { name: input.name.clone(), datatype, shape: input.shape, data };
            tensor.check_data().map_err(Error::InvalidArgument)?;
            Ok(tensor)
        })
        .collect()
}

/// The `InferTensorContents` field that carries `datatype`.
fn contents_field(datatype: DataType) -> &'static str {
    match datatype {
        DataType::Bool => "bool_contents",
        DataType::Int8 | DataType::Int16 | DataType::Int32 => "int_contents",
        DataType::Int64 => "int64_contents",
        DataType::Uint8 | DataType::Uint16 | DataType::Uint32 => "uint_contents",
        DataType::Uint64 => "uint64_contents",
        DataType::Fp32 => "fp32_contents",
        DataType::Fp64 => "fp64_contents",
        DataType::Bytes => "bytes_contents",
        DataType::Fp16 | DataType::Bf16 => "raw_input_contents",
    }
}

/// Typed `InferTensorContents` as little-endian bytes; only the field of
/// the datatype may be set.
fn typed_contents(datatype: DataType, c: proto::InferTensorContents) -> Result<Vec<u8>, String> {
    let set = [
        ("bool_contents", !c.bool_contents.is_empty()),
        ("int_contents", !c.int_contents.is_empty()),
        ("int64_contents", !c.int64_contents.is_empty()),
        ("uint_contents", !c.uint_contents.is_empty()),
        ("uint64_contents", !c.uint64_contents.is_empty()),
        ("fp32_contents", !c.fp32_contents.is_empty()),
        ("fp64_contents", !c.fp64_contents.is_empty()),
        ("bytes_contents", !c.bytes_contents.is_empty()),
    ];
    let want = contents_field(datatype);
    if let Some((other, _)) = set.iter().find(|(name, is_set)| *is_set && *name != want) {
        return Err(format!("{datatype} data goes in {want}, but {other} is set"));
    }
    /// `values` as the narrower `T`, little-endian, each checked for range.
    fn narrow<T: TryFrom<i64>, const N: usize>(
        values: impl Iterator<Item = i64>,
        dt: DataType,
        out: &mut Vec<u8>,
        le: impl Fn(T) -> [u8; N],
    ) -> Result<(), String> {
        for v in values {
            out.extend(le(T::try_from(v).map_err(|_| format!("{v} is out of range for {dt}"))?));
        }
        Ok(())
    }
    let mut out = Vec::new();
    let ints = || c.int_contents.iter().map(|&v| i64::from(v));
    let uints = || c.uint_contents.iter().map(|&v| i64::from(v));
    match datatype {
        DataType::Bool => out.extend(c.bool_contents.iter().map(|&b| u8::from(b))),
        DataType::Int8 => narrow(ints(), datatype, &mut out, i8::to_le_bytes)?,
        DataType::Int16 => narrow(ints(), datatype, &mut out, i16::to_le_bytes)?,
        DataType::Int32 => narrow(ints(), datatype, &mut out, i32::to_le_bytes)?,
        DataType::Int64 => out.extend(c.int64_contents.iter().flat_map(|v| v.to_le_bytes())),
        DataType::Uint8 => narrow(uints(), datatype, &mut out, u8::to_le_bytes)?,
        DataType::Uint16 => narrow(uints(), datatype, &mut out, u16::to_le_bytes)?,
        DataType::Uint32 => narrow(uints(), datatype, &mut out, u32::to_le_bytes)?,
        DataType::Uint64 => out.extend(c.uint64_contents.iter().flat_map(|v| v.to_le_bytes())),
        DataType::Fp32 => out.extend(c.fp32_contents.iter().flat_map(|v| v.to_le_bytes())),
        DataType::Fp64 => out.extend(c.fp64_contents.iter().flat_map(|v| v.to_le_bytes())),
        DataType::Bytes => c.bytes_contents.iter().for_each(|b| push_bytes_element(&mut out, b)),
        DataType::Fp16 | DataType::Bf16 => {
            return Err(format!("{datatype} has no typed contents; send it in raw_input_contents"));
        }
    }
    Ok(out)
}

/// Where an output of a gRPC answer went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputPlace {
    /// In the answer's `raw_output_contents`.
    Raw,
    /// Into the shared memory region the request named.
    SharedMemory,
}

/// The answer of `model_name` version `model_version` to request `id`:
/// each output described, its data in `raw_output_contents` at its
/// position (an empty entry for one written to shared memory, so that
/// clients still find each output's data by its position), and the
/// request's sequence flags, which a stream's reader tells a sequence's
/// last answer by (Triton sends them back so).
pub fn encode(
    model: (&str, u64),
    id: String,
    sequence: Option<&SequenceParameters>,
    outputs: impl IntoIterator<Item = (Tensor, OutputPlace)>,
) -> proto::ModelInferResponse {
    let (model_name, version) = model;
    let mut response = proto::ModelInferResponse {
        model_name: model_name.to_owned(),
        model_version: version.to_string(),
        id,
        ..Default::default()
    };
    if let Some(sequence) = sequence {
        for (key, flag) in [("sequence_start", sequence.start), ("sequence_end", sequence.end)] {
            let value = proto::InferParameter { parameter_choice: Some(ParameterChoice::BoolParam(flag)) };
            response.parameters.insert(key.to_owned(), value);
        }
    }
    for (t, place) in outputs {
        response.outputs.push(proto::model_infer_response::InferOutputTensor {
            name: t.name,
            datatype: t.datatype.name().into(),
            shape: t.shape,
            ..Default::default()
        });
        response.raw_output_contents.push(if place == OutputPlace::SharedMemory { Vec::new() } else { t.data });
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::shared_memory::NoRegions;

    fn input(name: &str, datatype: &str, shape: &[i64], contents: proto::InferTensorContents) -> InferInputTensor {
        InferInputTensor {
            name: name.into(),
            datatype: datatype.into(),
            shape: shape.to_vec(),
            contents: Some(contents),
            ..Default::default()
        }
    }

    fn decoded(inputs: Vec<InferInputTensor>, raw: Vec<Vec<u8>>) -> Result<Vec<Tensor>, String> {
        decode("m", &HashMap::new(), inputs, raw, &[], &NoRegions).map(|d| d.tensors).map_err(|e| e.to_string())
    }

    #[test]
    fn typed_contents_become_little_endian_bytes_of_the_datatype() {
        let ints = proto::InferTensorContents { int_contents: vec![1, -2], ..Default::default() };
        let tensors = decoded(vec![input("a", "INT16", &[2], ints.clone())], vec![]).unwrap();
        assert_eq!(tensors[0].data, vec![1, 0, 0xfe, 0xff]);
        let e = decoded(
            vec![input(
                "a",
                "INT8",
                &[2],
                proto::InferTensorContents { int_contents: vec![1, 300], ..Default::default() },
            )],
            vec![],
        )
        .unwrap_err();
        assert_eq!(e, "input 'a': 300 is out of range for INT8");
        let e = decoded(vec![input("a", "FP32", &[2], ints)], vec![]).unwrap_err();
        assert_eq!(e, "input 'a': FP32 data goes in fp32_contents, but int_contents is set");
        let strings = proto::InferTensorContents { bytes_contents: vec![b"hi".to_vec()], ..Default::default() };
        let tensors = decoded(vec![input("s", "BYTES", &[1], strings)], vec![]).unwrap();
        assert_eq!(tensors[0].data, vec![2, 0, 0, 0, b'h', b'i']);
    }

    #[test]
    fn raw_contents_go_to_the_inputs_in_order_one_each() {
        let none = proto::InferTensorContents::default();
        let inputs = || vec![input("a", "INT8", &[1], none.clone()), input("b", "INT8", &[2], none.clone())];
        let tensors = decoded(inputs(), vec![vec![1], vec![2, 3]]).unwrap();
        assert_eq!((tensors[0].data.clone(), tensors[1].data.clone()), (vec![1], vec![2, 3]));
        let e = decoded(inputs(), vec![vec![1]]).unwrap_err();
        assert!(e.starts_with("raw_input_contents has 1 entries for 2 inputs"), "{e}");
        let e = decoded(inputs(), vec![vec![1], vec![2]]).unwrap_err();
        assert!(e.contains("'b'"), "{e}");
    }

    #[test]
    fn answers_keep_each_outputs_position_and_the_sequence_flags() {
        let t = |name: &str| Tensor { name: name.into(), datatype: DataType::Int8, shape: vec![1], data: vec![5] };
        let sequence = SequenceParameters { id: super::super::request::SequenceId::Uint(1), start: false, end: true };
        let r = encode(
            ("m", 2),
            "id".into(),
            Some(&sequence),
            [(t("a"), OutputPlace::SharedMemory), (t("b"), OutputPlace::Raw)],
        );
        assert_eq!((r.model_name.as_str(), r.model_version.as_str(), r.id.as_str()), ("m", "2", "id"));
        assert_eq!(r.raw_output_contents, vec![vec![], vec![5]]);
        let end = r.parameters["sequence_end"].parameter_choice.clone();
        assert_eq!(end, Some(ParameterChoice::BoolParam(true)));
    }
}

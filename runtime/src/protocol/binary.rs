//! The KServe v2 binary tensor data extension (Triton's
//! `docs/protocol/extension_binary_data.md`): an `/infer` body is a JSON
//! header of `Inference-Header-Content-Length` bytes followed by the raw
//! data of the inputs that carry `binary_data_size`, in input order;
//! outputs asked for with `binary_data` (or the request parameter
//! `binary_data_output`) come back the same way. Bodies in, bodies out: the
//! HTTP framing (headers, content types) is the front end's.

use super::json::{InferRequest, InferResponse, InputTensor, OutputTensor};
use super::parameters::{Front, Value};
use super::request::{RequestHead, decode_head};
use super::shared_memory::{self, RegionRef, Regions};
use crate::config::Signature;
use crate::error::Error;
use crate::tensor::{Tensor, TensorSpec, push_bytes_element, request_datatype};

/// The header giving the length of the JSON part of a body.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// An `/infer` body taken apart: the JSON request and its input tensors.
pub struct Decoded {
    /// The JSON header (its `inputs` already converted to `tensors`).
    pub request: InferRequest,
    /// Its parameters and requested outputs, read.
    pub head: RequestHead,
    /// The inputs, in request order.
    pub tensors: Vec<Tensor>,
}

/// Reads an `/infer` body for `model` (its name and signature);
/// `header_length` is the value of its
/// `Inference-Header-Content-Length` header, if it has one. Without it the
/// body is all JSON; with it, the JSON header is followed by binary tensor
/// data; with the value 0 the whole body is the raw data of the model's only
/// input (its datatype and shape taken from the signature).
///
/// # Errors
/// [`Error::InvalidArgument`] naming what is wrong: a header value that is
/// not a number within the body's length, malformed JSON, an input with
/// both or neither of `data` and `binary_data_size`, a size past the end of
/// the body, bytes left over, or data that does not fill the input's shape
/// (including a `BYTES` element length past the end), and the errors of
/// [`decode_head`]. An input whose parameters name a shared memory region
/// is read from `regions`, with their errors.
pub fn decode(
    header_length: Option<&[u8]>,
    body: &[u8],
    model: (&str, &Signature),
    regions: &dyn Regions,
) -> Result<Decoded, Error> {
    let (name, signature) = model;
    let Some(value) = header_length else {
        return tensors(json(body)?, None, name, regions);
    };
    let text = String::from_utf8_lossy(value);
    let length = text.trim().parse::<usize>().ok().filter(|&n| n <= body.len()).ok_or_else(|| {
        bad(format!(
            "{HEADER_LENGTH} must be a whole number from 0 to the body's length ({} bytes), got {text:?}",
            body.len()
        ))
    })?;
    if length == 0 {
        return raw_input(body, signature);
    }
    let (header, binary) = body.split_at(length);
    tensors(json(header)?, Some(binary), name, regions)
}

fn json(bytes: &[u8]) -> Result<InferRequest, Error> {
    super::json::from_json(bytes).map_err(|e| bad(format!("malformed inference request JSON: {e}")))
}

/// Converts each input, taking the binary ones' bytes from `binary` in
/// order (`None` when the body has no binary part), and the shared memory
/// ones' from `regions`.
fn tensors(
    mut request: InferRequest,
    binary: Option<&[u8]>,
    model: &str,
    regions: &dyn Regions,
) -> Result<Decoded, Error> {
    let inputs = request.inputs.iter().map(|i| (i.name.as_str(), &i.parameters));
    let outputs = request.outputs.iter().flatten().map(|o| (o.name.as_str(), &o.parameters));
    let head = decode_head(Front::Http, &request.parameters, inputs, outputs)?;
    let has_binary = binary.is_some();
    let mut binary = binary.unwrap_or_default();
    let inputs = std::mem::take(&mut request.inputs);
    let mut tensors = Vec::with_capacity(inputs.len());
    for input in inputs {
        if let Some(at) = RegionRef::from_parameters(&input.name, &input.parameters)? {
            one_source(&input)?;
            tensors.push(shared_memory::input_tensor(model, input.name, &input.datatype, input.shape, &at, regions)?);
            continue;
        }
        let tensor = match binary_size(&input)? {
            None => input.into_tensor()?,
            Some(_) if !has_binary => {
                return Err(bad(format!(
                    "input '{}' has binary_data_size, but the request has no {HEADER_LENGTH} header to say where its JSON ends",
                    input.name
                )));
            }
            Some(_) if !input.data.is_absent() => {
                return Err(bad(format!(
                    "input '{}' has both 'data' and 'binary_data_size'; give exactly one",
                    input.name
                )));
            }
            Some(size) => {
                let (data, rest) = binary.split_at_checked(size).ok_or_else(|| {
                    bad(format!(
                        "input '{}' has binary_data_size {size}, but only {} bytes of binary data are left in the body",
                        input.name,
                        binary.len()
                    ))
                })?;
                binary = rest;
                binary_tensor(input, data.to_vec())?
            }
        };
        tensors.push(tensor);
    }
    if !binary.is_empty() {
        return Err(bad(format!(
            "{} bytes of binary data are left over after the inputs' binary_data_size",
            binary.len()
        )));
    }
    Ok(Decoded { request, head, tensors })
}

/// Refuses an input in shared memory that also has `data` or
/// `binary_data_size` (Triton's text).
fn one_source(input: &InputTensor) -> Result<(), Error> {
    let binary = input.parameters.contains("binary_data_size");
    if input.data.is_absent() && !binary {
        return Ok(());
    }
    let set =
        [(!input.data.is_absent(), " 'data'"), (binary, " 'binary_data_size'"), (true, " 'shared_memory_region'")];
    let set: String = set.iter().filter(|(is, _)| *is).map(|(_, name)| *name).collect();
    Err(bad(format!(
        "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', \
         'shared_memory_region' in 'parameters'. But set{set} (input '{}')",
        input.name
    )))
}

/// The input's `binary_data_size` parameter, if it has one. Also reads the
/// outputs of a remote server's response, which have the same fields.
///
/// # Errors
/// [`Error::InvalidArgument`] when it is not a non-negative integer.
pub fn binary_size(input: &InputTensor) -> Result<Option<usize>, Error> {
    let size = input.parameters.uint("binary_data_size", &format!("input '{}'", input.name))?;
    Ok(size.map(|n| usize::try_from(n).unwrap_or(usize::MAX)))
}

/// The tensor `input` describes, holding the binary `data` that followed
/// the JSON header.
///
/// # Errors
/// [`Error::InvalidArgument`] for an unknown datatype, a negative dimension
/// or data that does not fill the shape.
pub fn binary_tensor(input: InputTensor, data: Vec<u8>) -> Result<Tensor, Error> {
    let datatype =
        request_datatype(&input.datatype, &input.shape).map_err(|m| bad(format!("input '{}': {m}", input.name)))?;
    let tensor = Tensor { name: input.name, datatype, shape: input.shape, data };
    tensor.check_data().map_err(|m| bad(format!("binary data of {m}")))?;
    Ok(tensor)
}

/// `Inference-Header-Content-Length: 0`: the body is the raw data of the
/// model's only input, and the answer is all binary data (as Triton's
/// raw binary requests). A BYTES input gets the body as one element. A
/// fixed-size input with one variable dimension gets that dimension from
/// the body's size, and a batch of one (Triton's deduction); one with fixed
/// dimensions in a batching model gets as many rows as the body holds.
fn raw_input(body: &[u8], signature: &Signature) -> Result<Decoded, Error> {
    // The refusals begin with Triton's texts (`infer_request.cc`).
    let [spec] = signature.inputs.as_slice() else {
        return Err(bad(format!(
            "Raw request must only have 1 input (found 1) to be deduced but got {} inputs in the model \
             configuration: {HEADER_LENGTH}: 0 sends the body as the model's only input",
            signature.inputs.len()
        )));
    };
    let batching = signature.max_batch_size > 0;
    let (shape, data) = match spec.datatype.element_size() {
        None => {
            if spec.dims.iter().any(|&d| d != 1) {
                return Err(bad(format!(
                    "For BYTE datatype raw input '{}', the model must have input shape [1] (its dims are {:?}): \
                     the body is one element",
                    spec.name, spec.dims
                )));
            }
            let mut shape = spec.dims.clone();
            if batching {
                shape.insert(0, 1);
            }
            let mut data = Vec::with_capacity(body.len() + 4);
            push_bytes_element(&mut data, body);
            (shape, data)
        }
        Some(size) => (raw_shape(spec, batching, body.len(), size)?, body.to_vec()),
    };
    let mut request = InferRequest::default();
    request.parameters.insert("binary_data_output", Value::Bool(true));
    let head = decode_head(Front::Http, &request.parameters, [], [])?;
    let tensors = vec![Tensor { name: spec.name.clone(), datatype: spec.datatype, shape, data }];
    Ok(Decoded { request, head, tensors })
}

/// The shape of a raw input of `len` bytes whose elements have `size`
/// bytes: at most one variable dimension, deduced with a batch of one; with
/// fixed dimensions only, as many rows as the body holds (batching) or
/// exactly one tensor.
fn raw_shape(spec: &TensorSpec, batching: bool, len: usize, size: usize) -> Result<Vec<i64>, Error> {
    let variable: Vec<usize> = (0..spec.dims.len()).filter(|&i| spec.dims[i] < 0).collect();
    let fixed: usize = spec.dims.iter().filter(|&&d| d >= 0).map(|&d| d as usize).product::<usize>() * size;
    let unfilled = |per: &str| {
        bad(format!(
            "the raw body of {len} bytes does not fill input '{}' ({} of {fixed} bytes per {per})",
            spec.name, spec.datatype
        ))
    };
    let fills = |n: usize| fixed > 0 && n > 0 && len.is_multiple_of(fixed) && len / fixed == n;
    let mut shape = spec.dims.clone();
    let batch = match variable.as_slice() {
        [] if batching => {
            if fixed == 0 || len == 0 || !len.is_multiple_of(fixed) {
                return Err(unfilled("row"));
            }
            (len / fixed) as i64
        }
        [] if fills(1) => 1,
        [] => return Err(unfilled("tensor")),
        [axis] if fixed > 0 && len.is_multiple_of(fixed) => {
            shape[*axis] = (len / fixed) as i64;
            1
        }
        [_] => return Err(unfilled("element of its variable dimension")),
        _ => {
            return Err(bad(format!(
                "The shape of the raw input '{}' can not be deduced because there are more than one variable-sized \
                 dimension (its dims are {:?})",
                spec.name, spec.dims
            )));
        }
    };
    if batching {
        shape.insert(0, batch);
    }
    Ok(shape)
}

/// A response body as [`encode`] writes it.
pub struct Encoded {
    /// JSON alone, or the JSON header followed by the binary outputs' data.
    pub body: Vec<u8>,
    /// The JSON header's length in bytes, the value of the response's
    /// `Inference-Header-Content-Length`, when any output is binary; `None`
    /// for a body that is all JSON.
    pub header_length: Option<usize>,
}

/// How an output goes back to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputForm {
    /// As JSON `data`.
    Json,
    /// As binary data after the JSON header.
    Binary,
    /// Already written to shared memory: the response gives its name,
    /// datatype and shape only (as Triton's does).
    SharedMemory,
}

/// The response body for `outputs`, each in its form: JSON alone, or, when
/// any output is binary, the JSON header followed by those outputs' data.
///
/// # Errors
/// [`Error::InvalidArgument`] for an FP16/BF16 output asked for as JSON.
pub fn encode(mut response: InferResponse, outputs: Vec<(Tensor, OutputForm)>) -> Result<Encoded, Error> {
    let mut binary = Vec::new();
    let any_binary = outputs.iter().any(|(_, form)| *form == OutputForm::Binary);
    for (tensor, form) in outputs {
        response.outputs.push(match form {
            OutputForm::Binary => {
                let size = tensor.data.len();
                binary.extend_from_slice(&tensor.data);
                OutputTensor::binary(tensor, size)
            }
            OutputForm::Json => OutputTensor::from_tensor(tensor)?,
            OutputForm::SharedMemory => OutputTensor::described(tensor),
        });
    }
    let mut body = serde_json::to_vec(&response).expect("a response serialises");
    let header_length = any_binary.then_some(body.len());
    if header_length.is_some() {
        body.extend_from_slice(&binary);
    }
    Ok(Encoded { body, header_length })
}

fn bad(message: String) -> Error {
    Error::InvalidArgument(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::shared_memory::NoRegions;
    use crate::tensor::DataType;

    fn signature(datatype: DataType, dims: &[i64], max_batch_size: u32) -> Signature {
        Signature { max_batch_size, inputs: vec![TensorSpec::new("x", datatype, dims)], outputs: vec![] }
    }

    fn body(header: &str, binary: &[u8]) -> (Vec<u8>, Vec<u8>) {
        (header.len().to_string().into_bytes(), [header.as_bytes(), binary].concat())
    }

    fn error(header_length: &[u8], body: &[u8]) -> String {
        match decode(Some(header_length), body, ("m", &signature(DataType::Fp32, &[2], 4)), &NoRegions) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted"),
        }
    }

    const ONE_INPUT: &str =
        r#"{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","parameters":{"binary_data_size":8}}]}"#;

    #[test]
    fn binary_inputs_follow_the_json_header_in_order() {
        let header = r#"{"inputs":[
            {"name":"a","shape":[2],"datatype":"INT16","parameters":{"binary_data_size":4}},
            {"name":"b","shape":[1],"datatype":"INT8","data":[7]},
            {"name":"c","shape":[1],"datatype":"BYTES","parameters":{"binary_data_size":6}}]}"#;
        let (length, body) = body(header, &[1, 0, 2, 0, 2, 0, 0, 0, b'h', b'i']);
        let decoded = decode(Some(&length), &body, ("m", &signature(DataType::Fp32, &[2], 4)), &NoRegions).unwrap();
        assert_eq!(decoded.tensors[0].data, vec![1, 0, 2, 0]);
        assert_eq!(decoded.tensors[1].data, vec![7]);
        assert_eq!(decoded.tensors[2].data, vec![2, 0, 0, 0, b'h', b'i']);
    }

    #[test]
    fn malformed_binary_requests_are_refused_with_the_reason() {
        let (_, full) = body(ONE_INPUT, &[0; 8]);
        assert!(error((full.len() + 1).to_string().as_bytes(), &full).contains("from 0 to the body's length"));
        assert!(error(b"twelve", &full).contains("got \"twelve\""));

        let (length, short) = body(ONE_INPUT, &[0; 4]);
        assert!(error(&length, &short).contains("only 4 bytes of binary data are left"));

        let (length, long) = body(ONE_INPUT, &[0; 12]);
        assert!(error(&length, &long).contains("4 bytes of binary data are left over"));

        let both = r#"{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[1,2],"parameters":{"binary_data_size":8}}]}"#;
        let (length, b) = body(both, &[0; 8]);
        assert!(error(&length, &b).contains("both 'data' and 'binary_data_size'"));

        let strings = r#"{"inputs":[{"name":"s","shape":[1],"datatype":"BYTES","parameters":{"binary_data_size":6}}]}"#;
        let (length, b) = body(strings, &[9, 0, 0, 0, b'h', b'i']);
        assert!(error(&length, &b).contains("malformed BYTES"));
    }

    /// A region `r` of 8 bytes 1..=8.
    struct OneRegion;

    impl Regions for OneRegion {
        fn check(&self, at: &RegionRef) -> Result<(), Error> {
            self.read(at).map(drop)
        }

        fn read(&self, at: &RegionRef) -> Result<Vec<u8>, Error> {
            let bytes: Vec<u8> = (1..=8).collect();
            match at.region.as_str() {
                "r" => Ok(bytes[at.offset as usize..(at.offset + at.byte_size) as usize].to_vec()),
                other => Err(Error::NotFound(format!("no region {other}"))),
            }
        }
    }

    #[test]
    fn shared_memory_inputs_come_from_their_region() {
        let header = r#"{"inputs":[
            {"name":"a","shape":[2],"datatype":"INT16","parameters":
                {"shared_memory_region":"r","shared_memory_byte_size":4,"shared_memory_offset":2}},
            {"name":"b","shape":[1],"datatype":"INT8","data":[7]}]}"#;
        let decoded = decode(None, header.as_bytes(), ("m", &signature(DataType::Fp32, &[2], 4)), &OneRegion).unwrap();
        assert_eq!(decoded.tensors[0].data, vec![3, 4, 5, 6]);
        assert_eq!(decoded.tensors[1].data, vec![7]);
        let cases = [
            (
                r#""shared_memory_byte_size":2"#,
                "input byte size mismatch for input 'a' for model 'm'. Expected 4, got 2",
            ),
            (r#""shared_memory_byte_size":4,"binary_data_size":4"#, "Input must set only one of the following fields"),
            (r#""shared_memory_offset":1"#, "'shared_memory_byte_size' must be specified along with"),
            (
                r#""shared_memory_byte_size":"4""#,
                "invalid value type for 'shared_memory_byte_size' parameter for tensor 'a', expected a non-negative \
                 integer, got \"4\"",
            ),
        ];
        for (parameters, message) in cases {
            let header = format!(
                r#"{{"inputs":[{{"name":"a","shape":[2],"datatype":"INT16","parameters":{{"shared_memory_region":"r",{parameters}}}}}]}}"#
            );
            let e = decode(None, header.as_bytes(), ("m", &signature(DataType::Fp32, &[2], 4)), &OneRegion);
            let e = e.err().unwrap().to_string();
            assert!(e.starts_with(message), "{parameters}: {e}");
        }
    }

    #[test]
    fn a_zero_header_length_makes_the_body_the_only_input() {
        let zero = Some(&b"0"[..]);
        let raw = [0u8; 16];
        let decoded = decode(zero, &raw, ("m", &signature(DataType::Fp32, &[2], 4)), &NoRegions).unwrap();
        assert_eq!(decoded.tensors[0].shape, vec![2, 2], "fixed dims: rows from the body");
        assert!(decoded.head.wants_binary("any output"), "a raw request is answered in binary");
        let decoded = decode(zero, b"hello", ("m", &signature(DataType::Bytes, &[1], 0)), &NoRegions).unwrap();
        assert_eq!(decoded.tensors[0].shape, vec![1]);
        let many =
            decode(zero, b"hello", ("m", &signature(DataType::Bytes, &[-1], 0)), &NoRegions).err().unwrap().to_string();
        assert!(many.starts_with("For BYTE datatype raw input 'x', the model must have input shape [1]"), "{many}");
        assert!(decode(zero, &raw[..6], ("m", &signature(DataType::Fp32, &[2], 4)), &NoRegions).is_err());
        // One variable dimension is deduced from the size, with a batch of one.
        let decoded = decode(zero, &raw, ("m", &signature(DataType::Int16, &[2, -1], 8)), &NoRegions).unwrap();
        assert_eq!(decoded.tensors[0].shape, vec![1, 2, 4]);
        let decoded = decode(zero, &raw, ("m", &signature(DataType::Fp32, &[-1], 0)), &NoRegions).unwrap();
        assert_eq!(decoded.tensors[0].shape, vec![4]);
        let two =
            decode(zero, &raw, ("m", &signature(DataType::Fp32, &[-1, -1], 0)), &NoRegions).err().unwrap().to_string();
        assert!(two.contains("more than one variable-sized dimension"), "{two}");
        let odd =
            decode(zero, &raw[..6], ("m", &signature(DataType::Fp32, &[-1], 0)), &NoRegions).err().unwrap().to_string();
        assert!(odd.contains("does not fill input 'x' (FP32 of 4 bytes per element"), "{odd}");
    }

    #[test]
    fn binary_outputs_follow_the_json_header() {
        let response =
            || InferResponse { model_name: "m".into(), model_version: "1".into(), id: None, outputs: vec![] };
        let y = Tensor { name: "y".into(), datatype: DataType::Int8, shape: vec![2], data: vec![3, 4] };
        let encoded = encode(response(), vec![(y.clone(), OutputForm::Binary)]).unwrap();
        let n = encoded.header_length.unwrap();
        let header: serde_json::Value = serde_json::from_slice(&encoded.body[..n]).unwrap();
        assert_eq!(header["outputs"][0]["parameters"]["binary_data_size"], 2);
        assert_eq!(&encoded.body[n..], &[3, 4]);
        let in_shm = encode(response(), vec![(y.clone(), OutputForm::SharedMemory)]).unwrap();
        assert_eq!(in_shm.header_length, None, "nothing binary follows");
        let header: serde_json::Value = serde_json::from_slice(&in_shm.body).unwrap();
        assert_eq!(header["outputs"][0], serde_json::json!({"name": "y", "datatype": "INT8", "shape": [2]}));
        let json = encode(response(), vec![(y, OutputForm::Json)]).unwrap();
        assert_eq!(json.header_length, None);
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&json.body).unwrap()["outputs"][0]["data"],
            serde_json::json!([3, 4])
        );
    }
}

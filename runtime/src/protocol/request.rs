//! What an inference request asks for besides its input data, read once
//! for both front ends from [`Parameters`]: the request's scheduling and
//! sequence parameters, and each requested output with its
//! `classification` count and shared memory place. The tensor codecs
//! (`binary` for HTTP, `grpc`) read the input data and call
//! [`decode_head`] for the rest. A parameter Plinth does not act on is
//! refused naming it rather than ignored (Triton passes them on to its
//! backends, which may read them; Plinth's backends read none).

use super::parameters::{Front, Parameters, Value};
use super::shared_memory::{BYTE_SIZE, OFFSET, REGION, RegionRef};
use crate::error::Error;

/// Where a parameter sits in an inference request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// The request's own `parameters`.
    Request,
    /// An input's `parameters`.
    Input,
    /// A requested output's `parameters`.
    Output,
}

/// The parameters Plinth reads at `level` through `front`.
/// `triton_enable_empty_final_response` (sent by perf_analyzer and
/// tritonclient's stream) asks a decoupled model for an empty final answer;
/// for the models Plinth serves, none decoupled, it changes nothing, as in
/// Triton.
fn known(level: Level, front: Front) -> &'static [&'static str] {
    match (level, front) {
        (Level::Request, Front::Http) => &[
            "priority",
            "timeout",
            "binary_data_output",
            "triton_enable_empty_final_response",
            "sequence_id",
            "sequence_start",
            "sequence_end",
        ],
        (Level::Request, Front::Grpc) => &[
            "priority",
            "timeout",
            "triton_enable_empty_final_response",
            "sequence_id",
            "sequence_start",
            "sequence_end",
        ],
        (Level::Input, Front::Http) => &["binary_data_size", REGION, OFFSET, BYTE_SIZE],
        (Level::Input, Front::Grpc) => &[REGION, OFFSET, BYTE_SIZE],
        (Level::Output, Front::Http) => &["binary_data", "classification", REGION, OFFSET, BYTE_SIZE],
        (Level::Output, Front::Grpc) => &["classification", REGION, OFFSET, BYTE_SIZE],
    }
}

/// Checks the keys of `parameters` at `level` (`what` names the input or
/// output, or is empty for the request).
///
/// # Errors
/// [`Error::InvalidArgument`] naming the first parameter Plinth does not
/// act on, with the ones it does.
pub fn check(level: Level, front: Front, what: &str, parameters: &Parameters) -> Result<(), Error> {
    let known = known(level, front);
    let Some((key, _)) = parameters.iter().find(|(key, _)| !known.contains(key)) else { return Ok(()) };
    let at = if what.is_empty() { "request" } else { what };
    Err(Error::InvalidArgument(format!("unknown {at} parameter '{key}'; Plinth reads {known:?} here")))
}

/// The request-level parameters Plinth acts on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestParameters {
    /// `priority`: a priority level, 1 the highest; 0 or absent is the
    /// model's default level.
    pub priority: Option<u64>,
    /// `timeout`: the queue timeout in microseconds.
    pub timeout_us: Option<u64>,
    /// The sequence extension's parameters, when any is given.
    pub sequence: Option<SequenceParameters>,
    /// `binary_data_output` (HTTP only): every output as binary data
    /// unless its own `binary_data` says otherwise.
    pub binary_output: Option<bool>,
}

/// `sequence_id`, `sequence_start` and `sequence_end` (Triton's
/// `docs/protocol/extension_sequence.md`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequenceParameters {
    /// `sequence_id`; a missing one reads as 0, which names no sequence
    /// and which the sequence batcher refuses.
    pub id: SequenceId,
    /// `sequence_start`: the sequence's first request.
    pub start: bool,
    /// `sequence_end`: its last request.
    pub end: bool,
}

/// A sequence's id as a client gives it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SequenceId {
    /// An integer id (0 names no sequence).
    Uint(u64),
    /// A string id ("" names no sequence).
    Text(String),
}

/// An output the request asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestedOutput {
    /// The output's name.
    pub name: String,
    /// `classification`: answer the top N classes instead of the tensor
    /// (the classification extension); 0 or absent is the tensor itself.
    pub classification: Option<usize>,
    /// `binary_data` (HTTP only): this output as binary data, or not.
    pub binary: Option<bool>,
    /// Where in shared memory to write the output, if the request says.
    pub region: Option<RegionRef>,
}

/// A request's parameters and requested outputs, checked and read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestHead {
    /// The request-level parameters.
    pub parameters: RequestParameters,
    /// The outputs asked for, in request order; empty asks for all.
    pub outputs: Vec<RequestedOutput>,
}

impl RequestHead {
    /// Whether the output `name` goes back as binary data (HTTP): its own
    /// `binary_data`, else the request's `binary_data_output`, else not.
    pub fn wants_binary(&self, name: &str) -> bool {
        let own = self.outputs.iter().find(|o| o.name == name).and_then(|o| o.binary);
        own.or(self.parameters.binary_output).unwrap_or(false)
    }
}

/// Checks every parameter of a request that came through `front` (the
/// request's own, each input's and each output's, by name) and reads the
/// request's and the outputs'. Inputs' parameters are read by the tensor
/// codecs.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the first parameter Plinth does not
/// read ([`check`]), or one whose value is not of its kind.
pub fn decode_head<'a>(
    front: Front,
    request: &Parameters,
    inputs: impl IntoIterator<Item = (&'a str, &'a Parameters)>,
    outputs: impl IntoIterator<Item = (&'a str, &'a Parameters)>,
) -> Result<RequestHead, Error> {
    check(Level::Request, front, "", request)?;
    for (name, p) in inputs {
        check(Level::Input, front, &format!("input '{name}'"), p)?;
    }
    let outputs = outputs
        .into_iter()
        .map(|(name, p)| {
            check(Level::Output, front, &format!("output '{name}'"), p)?;
            requested_output(name, p)
        })
        .collect::<Result<_, _>>()?;
    Ok(RequestHead { parameters: request_parameters(request)?, outputs })
}

/// The request-level parameters, as Triton reads them.
///
/// # Errors
/// [`Error::InvalidArgument`] naming a parameter of the wrong kind.
pub fn request_parameters(p: &Parameters) -> Result<RequestParameters, Error> {
    const AT: &str = "request";
    Ok(RequestParameters {
        priority: p.uint("priority", AT)?,
        timeout_us: p.uint("timeout", AT)?,
        sequence: sequence(p)?,
        binary_output: p.bool("binary_data_output", AT)?,
    })
}

/// The sequence parameters; `None` when the request has none of them.
///
/// # Errors
/// [`Error::InvalidArgument`] for a `sequence_id` that is neither a
/// non-negative integer nor a string, or a flag that is not a boolean.
pub fn sequence(p: &Parameters) -> Result<Option<SequenceParameters>, Error> {
    let id = match p.get("sequence_id") {
        None => None,
        Some(Value::Text(s)) => Some(SequenceId::Text(s.clone())),
        Some(v) => Some(SequenceId::Uint(v.as_uint().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "request parameter 'sequence_id' must be a non-negative integer or a string, got {v}"
            ))
        })?)),
    };
    let start = p.bool("sequence_start", "request")?;
    let end = p.bool("sequence_end", "request")?;
    if id.is_none() && start.is_none() && end.is_none() {
        return Ok(None);
    }
    Ok(Some(SequenceParameters {
        id: id.unwrap_or(SequenceId::Uint(0)),
        start: start.unwrap_or(false),
        end: end.unwrap_or(false),
    }))
}

/// The output `name` as its parameters ask for it.
///
/// `classification` is a non-negative integer of either kind, 0 meaning
/// the tensor itself, over both front ends. That is how Triton's HTTP front
/// end reads it (`CheckClassificationOutput` in `src/http_server.cc`: a
/// uint, 0 for none); its gRPC front end takes only an `int64_param` above
/// 0 (`ParseClassificationParams` in `src/grpc/grpc_utils.cc`). Plinth reads
/// gRPC as HTTP: every value Triton's gRPC takes means the same here.
///
/// # Errors
/// [`Error::InvalidArgument`] for a `classification` that is not such an
/// integer (or above 2^32 - 1, Triton's `uint32_t` count), a bad shared
/// memory place ([`RegionRef::from_parameters`]), or a place together with
/// `classification` or `"binary_data": true` (Triton's text).
pub fn requested_output(name: &str, p: &Parameters) -> Result<RequestedOutput, Error> {
    let at = format!("output '{name}'");
    let classification = match p.get("classification") {
        None => None,
        Some(v) => {
            let n = v.as_uint().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{at} parameter 'classification' must be an integer from 0 to {}, got {v}",
                    u32::MAX
                ))
            })?;
            usize::try_from(n).ok().filter(|&n| n > 0)
        }
    };
    let binary = p.bool("binary_data", &at)?;
    let region = RegionRef::from_parameters(name, p)?;
    if region.is_some() {
        let both = [("classification", p.contains("classification")), ("binary_data", binary == Some(true))];
        if let Some((key, _)) = both.iter().find(|(_, set)| *set) {
            return Err(Error::InvalidArgument(format!(
                "Output can't set both '{REGION}' and '{key}' (output '{name}')"
            )));
        }
    }
    Ok(RequestedOutput { name: name.to_owned(), classification, binary, region })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(keys: &[&str]) -> Parameters {
        keys.iter().map(|k| ((*k).to_owned(), Value::Bool(true))).collect()
    }

    #[test]
    fn parameters_plinth_does_not_read_are_named() {
        assert!(check(Level::Request, Front::Http, "", &of(&["priority", "binary_data_output"])).is_ok());
        assert!(check(Level::Output, Front::Grpc, "output 'y'", &of(&["classification", REGION])).is_ok());
        assert!(check(Level::Request, Front::Grpc, "", &of(&["triton_enable_empty_final_response"])).is_ok());
        assert!(
            check(Level::Request, Front::Http, "", &of(&["sequence_id", "sequence_start", "sequence_end"])).is_ok()
        );
        let cases = [
            (Level::Request, Front::Http, "", "custom", "unknown request parameter 'custom'; Plinth reads"),
            (Level::Request, Front::Grpc, "", "binary_data_output", "unknown request parameter 'binary_data_output'"),
            (Level::Request, Front::Http, "", REGION, "unknown request parameter 'shared_memory_region'"),
            (Level::Output, Front::Http, "output 'y'", "binary", "unknown output 'y' parameter 'binary'"),
        ];
        for (level, front, what, key, message) in cases {
            let e = check(level, front, what, &of(&[key])).unwrap_err().to_string();
            assert!(e.starts_with(message), "{key}: {e}");
        }
    }

    fn params(pairs: &[(&str, Value)]) -> Parameters {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect()
    }

    #[test]
    fn classification_is_a_non_negative_integer_of_either_kind_and_zero_is_none() {
        for (value, expected) in [(Value::Uint(0), None), (Value::Int(0), None), (Value::Int(3), Some(3))] {
            let o = requested_output("y", &params(&[("classification", value)])).unwrap();
            assert_eq!(o.classification, expected);
        }
        for bad in [Value::Int(-1), Value::Text("2".into()), Value::Uint(1 << 32), Value::Double(2.0)] {
            let e = requested_output("y", &params(&[("classification", bad.clone())])).unwrap_err();
            assert!(
                e.to_string().starts_with("output 'y' parameter 'classification' must be an integer"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn an_output_in_shared_memory_takes_no_classification_nor_binary_data() {
        let place = [(REGION, Value::Text("r".into())), (BYTE_SIZE, Value::Uint(8)), (OFFSET, Value::Int(0))];
        let o = requested_output("y", &params(&place)).unwrap();
        assert_eq!(o.region, Some(RegionRef { region: "r".into(), offset: 0, byte_size: 8 }));
        for (key, value) in [("classification", Value::Uint(0)), ("binary_data", Value::Bool(true))] {
            let mut p = params(&place);
            p.insert(key, value);
            let e = requested_output("y", &p).unwrap_err().to_string();
            assert_eq!(e, format!("Output can't set both 'shared_memory_region' and '{key}' (output 'y')"));
        }
        let mut p = params(&place);
        p.insert("binary_data", Value::Bool(false));
        assert!(requested_output("y", &p).is_ok());
    }

    #[test]
    fn sequence_parameters_default_the_flags_and_the_id() {
        assert_eq!(sequence(&Parameters::default()).unwrap(), None);
        let s = sequence(&params(&[("sequence_start", Value::Bool(true))])).unwrap().unwrap();
        assert_eq!(s, SequenceParameters { id: SequenceId::Uint(0), start: true, end: false });
        let s = sequence(&params(&[("sequence_id", Value::Int(7))])).unwrap().unwrap();
        assert_eq!(s.id, SequenceId::Uint(7));
        let s = sequence(&params(&[("sequence_id", Value::Text("a".into()))])).unwrap().unwrap();
        assert_eq!(s.id, SequenceId::Text("a".into()));
        let e = sequence(&params(&[("sequence_id", Value::Int(-7))])).unwrap_err().to_string();
        assert!(e.contains("must be a non-negative integer or a string, got -7"), "{e}");
        let e = sequence(&params(&[("sequence_end", Value::Uint(1))])).unwrap_err().to_string();
        assert_eq!(e, "request parameter 'sequence_end' must be a boolean, got 1");
    }

    #[test]
    fn binary_output_follows_the_output_then_the_request() {
        let p = params(&[("binary_data_output", Value::Bool(true))]);
        let outputs = [("a", params(&[("binary_data", Value::Bool(false))])), ("b", Parameters::default())];
        let head = decode_head(Front::Http, &p, [], outputs.iter().map(|(n, p)| (*n, p))).unwrap();
        assert!(!head.wants_binary("a"));
        assert!(head.wants_binary("b"));
        assert!(head.wants_binary("not asked for"));
        let e = decode_head(Front::Grpc, &p, [], []).unwrap_err().to_string();
        assert!(e.starts_with("unknown request parameter 'binary_data_output'"), "{e}");
    }
}

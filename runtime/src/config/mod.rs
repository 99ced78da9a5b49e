//! Model configuration: `config.pbtxt` (or the load API's JSON) parsed with
//! protobuf text format against our own `.proto` messages, which follow the
//! field names and numbers of Triton's `ModelConfig` so that Triton
//! repositories load unchanged; the configuration's parameters and
//! signature as the rest of the server reads them; and, in [`validate`],
//! Triton's rules for a configuration before any model file is read.
//! [`proto`] holds the messages of `proto/model_config.proto` only; the
//! KServe v2 gRPC messages, which share the package `inference` with them
//! in Triton's `.proto` files, are the wire protocol's
//! (`protocol::grpc::proto`).

use std::path::Path;
use std::sync::LazyLock;

use prost_reflect::{DescriptorPool, DynamicMessage};

use crate::tensor::{DataType, TensorSpec};

/// Messages generated from `proto/model_config.proto` (package `inference`).
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/config/inference.rs"));
}

pub use proto::ModelConfig;

mod backends;
pub(crate) mod parameters;
pub(crate) mod validate;

pub use backends::{BackendKind, served};
pub use parameters::{GpuSwapPolicy, Parameters};

/// The file name of a model's configuration inside its folder.
pub const CONFIG_FILE: &str = "config.pbtxt";

static DESCRIPTORS: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(include_bytes!(concat!(env!("OUT_DIR"), "/model_config.bin")).as_ref())
        .expect("the build script writes a valid descriptor set")
});

/// Parses `config.pbtxt` text. Unknown fields and enum values are errors.
///
/// # Errors
/// The parser's message, which names the offending field or value.
pub fn parse(text: &str) -> Result<ModelConfig, String> {
    let desc = DESCRIPTORS.get_message_by_name("inference.ModelConfig").expect("ModelConfig is in the descriptor set");
    let text = colon_before_lists(text.strip_prefix('\u{feff}').unwrap_or(text));
    let message = DynamicMessage::parse_text_format(desc, &text).map_err(|e| explain(&e, &text))?;
    message.transcode_to::<ModelConfig>().map_err(|e| e.to_string())
}

/// A text-format parse error of `text` as a person reads it: its line, and
/// for a misspelt field or enum value the name meant, in Triton's names
/// (`ModelInput`, not `inference.ModelInput`). `colon_before_lists` adds
/// no line, so the line is the file's.
fn explain(e: &prost_reflect::text_format::ParseError, text: &str) -> String {
    use miette::Diagnostic;
    let what = reword(&e.to_string());
    let offset = e.labels().and_then(|mut labels| labels.next()).map(|label| label.offset());
    match offset {
        Some(at) => format!("line {}: {what}", text[..at.min(text.len())].matches('\n').count() + 1),
        None => what,
    }
}

/// prost-reflect's wording of an unknown field or enum value, in words a
/// model's author knows, with the closest known name.
fn reword(message: &str) -> String {
    let quoted: Vec<&str> = message.split('\'').skip(1).step_by(2).collect();
    let short = |full: &str| full.strip_prefix("inference.").unwrap_or(full).to_owned();
    match quoted[..] {
        [field, owner] if message.starts_with("field ") => {
            let names =
                DESCRIPTORS.get_message_by_name(owner).map(|m| m.fields().map(|f| f.name().to_owned()).collect());
            let place = if owner == "inference.ModelConfig" { "the model configuration".into() } else { short(owner) };
            format!("unknown field '{field}' in {place}{}", did_you_mean(field, names.unwrap_or_default()))
        }
        [value, owner] if message.starts_with("value ") => {
            let names = DESCRIPTORS.get_enum_by_name(owner).map(|e| e.values().map(|v| v.name().to_owned()).collect());
            format!("unknown {} value '{value}'{}", short(owner), did_you_mean(value, names.unwrap_or_default()))
        }
        _ => message.to_owned(),
    }
}

/// "; did you mean 'NAME'?" for the name of `names` closest to `typed`,
/// when one is close (a few letters apart); else nothing.
fn did_you_mean(typed: &str, names: Vec<String>) -> String {
    let closest = names.into_iter().map(|n| (strsim::levenshtein(typed, &n), n)).min();
    match closest {
        Some((distance, name)) if distance <= (typed.len() / 3).max(2) => format!("; did you mean '{name}'?"),
        _ => String::new(),
    }
}

/// Adds the optional `:` between a field name and a `[` list, which the
/// text-format grammar allows (`input [ { ... } ]`, the usual Triton style)
/// but prost-reflect 0.16 requires. Strings and `#` comments are copied
/// unchanged; a name that is itself a value (after `:`) is left alone.
fn colon_before_lists(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut chars = text.chars().peekable();
    let mut after_colon = false;
    while let Some(c) = chars.next() {
        out.push(c);
        match c {
            '"' | '\'' => {
                while let Some(s) = chars.next() {
                    out.push(s);
                    if s == '\\' {
                        out.extend(chars.next());
                    } else if s == c {
                        break;
                    }
                }
                after_colon = false;
            }
            '#' => {
                for s in chars.by_ref() {
                    out.push(s);
                    if s == '\n' {
                        break;
                    }
                }
            }
            c if c.is_alphabetic() || c == '_' => {
                while let Some(&s) = chars.peek().filter(|s| s.is_alphanumeric() || **s == '_' || **s == '.') {
                    out.push(s);
                    chars.next();
                }
                let is_field_name = !after_colon;
                after_colon = false;
                let mut gap = String::new();
                while let Some(&s) = chars.peek().filter(|s| s.is_whitespace()) {
                    gap.push(s);
                    chars.next();
                }
                if is_field_name && chars.peek() == Some(&'[') {
                    out.push(':');
                }
                out.push_str(&gap);
            }
            c if c.is_whitespace() => {}
            ':' => after_colon = true,
            _ => after_colon = false,
        }
    }
    out
}

/// Parses a model configuration given as JSON (the protobuf JSON mapping of
/// `ModelConfig`, as Triton's load API and `/config` use: field names as in
/// `config.pbtxt`, enums as strings).
///
/// # Errors
/// The parser's message, which names the offending field or value.
pub fn parse_json(text: &str) -> Result<ModelConfig, String> {
    let desc = DESCRIPTORS.get_message_by_name("inference.ModelConfig").expect("ModelConfig is in the descriptor set");
    let mut de = serde_json::Deserializer::from_str(text);
    let message = DynamicMessage::deserialize(desc, &mut de).map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())?;
    message.transcode_to::<ModelConfig>().map_err(|e| e.to_string())
}

/// Reads and parses `<model_dir>/config.pbtxt`. A missing file is an empty
/// configuration (everything is then taken from the model file).
///
/// # Errors
/// A message naming the file and the parse error.
pub fn load(model_dir: &Path) -> Result<ModelConfig, String> {
    let path = model_dir.join(CONFIG_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => parse(&text).map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ModelConfig::default()),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Maps a `config.pbtxt` `data_type` (`TYPE_FP32`, ...) to the v2 datatype.
/// `TYPE_STRING` is `BYTES`; `TYPE_INVALID` and unknown numbers are `None`.
pub fn datatype_from_config(value: i32) -> Option<DataType> {
    use proto::DataType as C;
    Some(match C::try_from(value).ok()? {
        C::TypeInvalid => return None,
        C::TypeBool => DataType::Bool,
        C::TypeUint8 => DataType::Uint8,
        C::TypeUint16 => DataType::Uint16,
        C::TypeUint32 => DataType::Uint32,
        C::TypeUint64 => DataType::Uint64,
        C::TypeInt8 => DataType::Int8,
        C::TypeInt16 => DataType::Int16,
        C::TypeInt32 => DataType::Int32,
        C::TypeInt64 => DataType::Int64,
        C::TypeFp16 => DataType::Fp16,
        C::TypeFp32 => DataType::Fp32,
        C::TypeFp64 => DataType::Fp64,
        C::TypeString => DataType::Bytes,
        C::TypeBf16 => DataType::Bf16,
    })
}

/// The `config.pbtxt` name of a v2 datatype (`TYPE_FP32`, ...; `BYTES` is
/// `TYPE_STRING`), as messages about a configuration spell it.
pub fn config_type_name(datatype: DataType) -> &'static str {
    match datatype {
        DataType::Bytes => "TYPE_STRING",
        DataType::Bool => "TYPE_BOOL",
        DataType::Uint8 => "TYPE_UINT8",
        DataType::Uint16 => "TYPE_UINT16",
        DataType::Uint32 => "TYPE_UINT32",
        DataType::Uint64 => "TYPE_UINT64",
        DataType::Int8 => "TYPE_INT8",
        DataType::Int16 => "TYPE_INT16",
        DataType::Int32 => "TYPE_INT32",
        DataType::Int64 => "TYPE_INT64",
        DataType::Fp16 => "TYPE_FP16",
        DataType::Fp32 => "TYPE_FP32",
        DataType::Fp64 => "TYPE_FP64",
        DataType::Bf16 => "TYPE_BF16",
    }
}

/// A configuration as JSON, as Triton's model configuration extension
/// returns it: protobuf field names, enum values by name, 64-bit integers
/// as numbers, and fields left at their default included.
pub fn to_json(config: &ModelConfig) -> serde_json::Value {
    use prost::Message;
    let desc = DESCRIPTORS.get_message_by_name("inference.ModelConfig").expect("ModelConfig is in the descriptor set");
    let message = DynamicMessage::decode(desc, config.encode_to_vec().as_slice()).expect("a message decodes as itself");
    let options = prost_reflect::SerializeOptions::new()
        .use_proto_field_name(true)
        .stringify_64_bit_integers(false)
        .skip_default_fields(false);
    message.serialize_with_options(serde_json::value::Serializer, &options).expect("a configuration serialises")
}

/// The `config.pbtxt` `data_type` for a v2 datatype.
pub fn datatype_to_config(dt: DataType) -> proto::DataType {
    use proto::DataType as C;
    match dt {
        DataType::Bool => C::TypeBool,
        DataType::Uint8 => C::TypeUint8,
        DataType::Uint16 => C::TypeUint16,
        DataType::Uint32 => C::TypeUint32,
        DataType::Uint64 => C::TypeUint64,
        DataType::Int8 => C::TypeInt8,
        DataType::Int16 => C::TypeInt16,
        DataType::Int32 => C::TypeInt32,
        DataType::Int64 => C::TypeInt64,
        DataType::Fp16 => C::TypeFp16,
        DataType::Fp32 => C::TypeFp32,
        DataType::Fp64 => C::TypeFp64,
        DataType::Bf16 => C::TypeBf16,
        DataType::Bytes => C::TypeString,
    }
}

/// The declared inputs and outputs of a model and whether it batches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    /// 0: tensors have exactly `dims`; otherwise a leading batch dimension of
    /// 1 to `max_batch_size` comes first.
    pub max_batch_size: u32,
    /// The tensors a request must carry, in declaration order.
    pub inputs: Vec<TensorSpec>,
    /// The tensors the model returns, in declaration order.
    pub outputs: Vec<TensorSpec>,
}

impl Signature {
    /// The signature a configuration declares.
    ///
    /// # Errors
    /// A message naming a tensor whose `data_type` is missing or invalid, or
    /// a negative `max_batch_size`.
    pub fn from_config(config: &ModelConfig) -> Result<Signature, String> {
        let spec = |name: &str, data_type: i32, dims: &[i64], reshape: &Option<proto::ModelTensorReshape>| {
            let datatype = datatype_from_config(data_type)
                .ok_or_else(|| format!("tensor '{name}' has no valid data_type in {CONFIG_FILE}"))?;
            let mut spec = TensorSpec::new(name, datatype, dims);
            spec.reshape = reshape.as_ref().map(|r| r.shape.clone());
            Ok::<_, String>(spec)
        };
        let inputs = config
            .input
            .iter()
            .map(|i| spec(&i.name, i.data_type, &i.dims, &i.reshape).map(|s| TensorSpec { optional: i.optional, ..s }));
        Ok(Signature {
            max_batch_size: u32::try_from(config.max_batch_size)
                .map_err(|_| format!("max_batch_size must be >= 0, got {}", config.max_batch_size))?,
            inputs: inputs.collect::<Result<_, _>>()?,
            outputs: config
                .output
                .iter()
                .map(|o| spec(&o.name, o.data_type, &o.dims, &o.reshape))
                .collect::<Result<_, _>>()?,
        })
    }

    /// `dims` with the batch dimension (-1) in front when the model batches:
    /// the shape a client sees in model metadata.
    pub fn full_shape(&self, spec: &TensorSpec) -> Vec<i64> {
        let mut shape = Vec::with_capacity(spec.dims.len() + 1);
        if self.max_batch_size > 0 {
            shape.push(-1);
        }
        shape.extend_from_slice(&spec.dims);
        shape
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_type_names_round_trip() {
        for datatype in DataType::ALL {
            let name = config_type_name(datatype);
            let value = proto::DataType::from_str_name(name).unwrap_or_else(|| panic!("{name} is no data_type"));
            assert_eq!(datatype_from_config(value as i32), Some(datatype), "{name}");
        }
    }

    const OCR_REC: &str = r#"
        name: "ocr_rec"
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, 48, -1 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ -1, 6625 ] } ]
        instance_group [ { count: 2 kind: KIND_CPU } ]
        version_policy: { latest: { num_versions: 2 } }
        dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 100 }
        parameters { key: "plugin" value: { string_value: "ocr_rec.wasm" } }
        model_warmup [ { name: "w" batch_size: 1 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 3, 48, 320 ] zero_data: true } } } ]
    "#;

    #[test]
    fn parses_triton_fields() {
        let c = parse(OCR_REC).unwrap();
        assert_eq!(c.name, "ocr_rec");
        assert_eq!(c.max_batch_size, 8);
        assert_eq!(c.input[0].dims, vec![3, 48, -1]);
        assert_eq!(c.instance_group[0].count, 2);
        assert_eq!(Parameters::parse(&c).unwrap().plugin.unwrap().file, "ocr_rec.wasm");
        assert_eq!(c.model_warmup[0].inputs["x"].dims, vec![3, 48, 320]);
        let Some(proto::model_config::SchedulingChoice::DynamicBatching(b)) = &c.scheduling_choice else {
            panic!("dynamic_batching was not kept")
        };
        assert_eq!(b.preferred_batch_size, vec![4, 8]);
        let sig = Signature::from_config(&c).unwrap();
        assert_eq!(sig.full_shape(&sig.inputs[0]), vec![-1, 3, 48, -1]);
    }

    #[test]
    fn message_lists_need_no_colon() {
        let text = "input [ { name: \"a[\" dims: [ 1 ] } ] # output [\noutput: [ { name: \"b\" } ]";
        assert_eq!(
            colon_before_lists(text),
            "input: [ { name: \"a[\" dims: [ 1 ] } ] # output [\noutput: [ { name: \"b\" } ]"
        );
        let c = parse(text).unwrap();
        assert_eq!((c.input[0].name.as_str(), c.output[0].name.as_str()), ("a[", "b"));
    }

    #[test]
    fn unknown_fields_are_errors_that_name_the_field() {
        let err = parse("name: \"m\"\nmax_batch_sise: 4").unwrap_err();
        assert_eq!(
            err,
            "line 2: unknown field 'max_batch_sise' in the model configuration; did you mean 'max_batch_size'?"
        );
        let err = parse("name: \"m\"\ninput [\n  { name: \"x\" data_type: TYPE_FLOAT } ]").unwrap_err();
        assert_eq!(err, "line 3: unknown DataType value 'TYPE_FLOAT'");
        let err = parse("input [ { nmae: \"x\" } ]").unwrap_err();
        assert_eq!(err, "line 1: unknown field 'nmae' in ModelInput; did you mean 'name'?");
        let err = parse("no_such_thing_at_all: 1").unwrap_err();
        assert_eq!(err, "line 1: unknown field 'no_such_thing_at_all' in the model configuration");
    }

    #[test]
    fn json_configs_use_the_same_names() {
        let c = parse_json(r#"{"name": "m", "max_batch_size": 2, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [3, "-1"]}]}"#).unwrap();
        assert_eq!((c.max_batch_size, c.input[0].dims.clone()), (2, vec![3, -1]));
        let err = parse_json(r#"{"max_batchsize": 2}"#).unwrap_err();
        assert!(err.contains("max_batchsize"), "{err}");
    }

    #[test]
    fn datatypes_map_both_ways() {
        for dt in DataType::ALL {
            assert_eq!(datatype_from_config(datatype_to_config(dt) as i32), Some(dt));
        }
        assert_eq!(datatype_from_config(0), None);
    }
}

//! The fuzz targets' entry points (cargo feature `fuzzing`): one function
//! per untrusted input Plinth parses, each taking the fuzzer's bytes. The
//! targets in `fuzz/` (cargo-fuzz, libFuzzer) call them, and this module's
//! test replays the committed corpus `fuzz/corpus/<target>/` through them,
//! so every input a fuzzer kept, crashes it found included, runs again in
//! `make test`.
//!
//! Whatever the bytes, a function must return: a panic, an overflow (the
//! targets build with debug assertions) or a hang is a finding. Where a
//! decoded value has an encoding back, the round trip is asserted too.

use std::sync::{Arc, LazyLock};

use arbitrary::{Arbitrary, Unstructured};
use serde_json::Value;

use crate::config::{self, Signature};
use crate::error::Error;
use crate::model::{Ensemble, check_inputs};
use crate::plugin::compose::BoxFuture;
use crate::plugin::{ModelRunner, RawRequest, RawResponse};
use crate::protocol::binary::{self, OutputForm};
use crate::protocol::json::{InferResponse, InputTensor};
use crate::protocol::shared_memory::{RegionRef, Regions};
use crate::scheduler::policy::{Policy, RequestOptions};
use crate::server::shared_memory::SharedMemory;
use crate::tensor::{DataType, Tensor, TensorSpec, bytes_elements, push_bytes_element};

/// A fuzz target's entry point.
pub type Target = fn(&[u8]);

/// The fuzz targets, by the name of their binary in `fuzz/fuzz_targets/`
/// and of their corpus folder.
pub const TARGETS: [(&str, Target); 8] = [
    ("config_pbtxt", config_pbtxt),
    ("json_request", json_request),
    ("binary_request", binary_request),
    ("bytes_elements", bytes_elements_round_trip),
    ("shared_memory", shared_memory),
    ("ensemble", ensemble),
    ("plugin_tensors", plugin_tensors),
    ("rollout_plan", rollout_plan),
];

/// `config.pbtxt` text: parsed (the text-format parser behind
/// [`config::parse`], with its colon insertion), validated as a load
/// validates it, and, when valid, read as a load reads it (signature,
/// scheduling policy, ensemble steps). A valid configuration's JSON form
/// (`/config`) must parse back ([`config::parse_json`], the load API's
/// form) to the same JSON.
pub fn config_pbtxt(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(config) = config::parse(text) else { return };
    if config::validate::validate(&config).is_err() {
        return;
    }
    if let Ok(signature) = Signature::from_config(&config) {
        for spec in signature.inputs.iter().chain(&signature.outputs) {
            let _ = signature.full_shape(spec);
            let _ = spec.model_dims();
        }
    }
    let _ = Policy::from_config(&config);
    let _ = Ensemble::from_config(&config);
    let json = config::to_json(&config);
    let again = config::parse_json(&json.to_string()).expect("the JSON form of a valid configuration parses");
    assert_eq!(config::to_json(&again), json, "the JSON form of a configuration parses back to itself");
}

/// The signature requests are decoded for: a batching model (at most 4)
/// with an FP32 input `x` [-1, 2], a BYTES input `s` [-1] and an INT64
/// input `i` [3].
static SIGNATURE: LazyLock<Signature> = LazyLock::new(|| Signature {
    max_batch_size: 4,
    inputs: vec![
        TensorSpec::new("x", DataType::Fp32, &[-1, 2]),
        TensorSpec::new("s", DataType::Bytes, &[-1]),
        TensorSpec::new("i", DataType::Int64, &[3]),
    ],
    outputs: vec![],
});

/// An `/infer` body that is all JSON (no `Inference-Header-Content-Length`):
/// decoded as the HTTP front end decodes it, checked against the model's
/// signature, and, once decoded, each input sent back as a JSON output must
/// read back as the same tensor.
pub fn json_request(data: &[u8]) {
    let Ok(decoded) = binary::decode(None, data, ("m", &SIGNATURE), &NoRegion) else { return };
    let _ = check_inputs(&SIGNATURE, "m", &decoded.tensors);
    let outputs: Vec<(Tensor, OutputForm)> = decoded.tensors.iter().map(|t| (t.clone(), OutputForm::Json)).collect();
    let encoded = binary::encode(response(), outputs).expect("tensors decoded from JSON encode as JSON");
    let body: Value = serde_json::from_slice(&encoded.body).expect("the response is JSON");
    for (output, input) in body["outputs"].as_array().expect("outputs").iter().zip(&decoded.tensors) {
        let back = serde_json::from_value::<InputTensor>(output.clone()).expect("an output reads as a tensor");
        assert_eq!(&back.into_tensor().expect("an output converts back"), input, "JSON round trip");
    }
}

/// An `/infer` body with the binary tensor data extension. The first byte
/// says how `Inference-Header-Content-Length` is given (absent, 0, a
/// number from the next two bytes, or those bytes as text); the rest is
/// the body. What decodes is sent back with every other output binary.
pub fn binary_request(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let (header, body) = match mode % 4 {
        0 => (None, rest),
        1 => (Some(b"0".to_vec()), rest),
        2 if rest.len() >= 2 => {
            let length = usize::from(u16::from_le_bytes([rest[0], rest[1]])) % (rest.len() - 1);
            (Some(length.to_string().into_bytes()), &rest[2..])
        }
        _ if rest.len() >= 2 => (Some(rest[..2].to_vec()), &rest[2..]),
        _ => return,
    };
    let Ok(decoded) = binary::decode(header.as_deref(), body, ("m", &SIGNATURE), &NoRegion) else { return };
    let _ = check_inputs(&SIGNATURE, "m", &decoded.tensors);
    let outputs = decoded
        .tensors
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t, if i % 2 == 0 { OutputForm::Binary } else { OutputForm::Json }))
        .collect();
    // FP16 and BF16 cannot be JSON: a refusal, not a finding.
    if let Ok(encoded) = binary::encode(response(), outputs) {
        let json = &encoded.body[..encoded.header_length.unwrap_or(encoded.body.len())];
        serde_json::from_slice::<Value>(json).expect("the response header is JSON");
    }
}

/// BYTES tensor data (each element a 4-byte little-endian length and its
/// bytes): what parses must serialise back to the same bytes, and a tensor
/// of that many elements must pass its data check.
pub fn bytes_elements_round_trip(data: &[u8]) {
    let Some(items) = bytes_elements(data) else { return };
    let mut again = Vec::with_capacity(data.len());
    for item in &items {
        push_bytes_element(&mut again, item);
    }
    assert_eq!(again, data, "BYTES elements serialise back to the same bytes");
    let tensor = Tensor { name: "s".into(), datatype: DataType::Bytes, shape: vec![items.len() as i64], data: again };
    tensor.check_data().expect("a tensor of the elements parsed is consistent");
}

/// A shared memory object of 256 bytes (0, 1, ..., 255) registered as two
/// regions: `all` (the whole object) and `part` (64 bytes from offset 16).
/// Made once per process under `/dev/shm`, named after the process so that
/// parallel fuzzers never share it, and unlinked once registered (the
/// registry keeps its file open). `None` where `/dev/shm` is not writable.
static REGIONS: LazyLock<Option<SharedMemory>> = LazyLock::new(|| {
    let key = format!("plinth-fuzz-{}", std::process::id());
    let path = std::path::Path::new("/dev/shm").join(&key);
    let pattern: Vec<u8> = (0..=255).collect();
    std::fs::write(&path, pattern).ok()?;
    let regions = SharedMemory::new(true, u64::MAX, crate::metrics::SharedMemoryMetrics::detached());
    let registered = regions.register("all", &key, 0, 256).and_then(|()| regions.register("part", &key, 16, 64));
    let _ = std::fs::remove_file(&path);
    registered.ok().map(|()| regions)
});

/// A request whose inputs and outputs may name registered shared memory
/// regions (`shared_memory_region`, `_offset`, `_byte_size`). The first 16
/// bytes are an offset and a size for one more registration of the same
/// object, which must be refused exactly when the range leaves it; the
/// rest is the JSON request, decoded and its outputs placed.
pub fn shared_memory(data: &[u8]) {
    let Some(regions) = REGIONS.as_ref() else { return };
    if data.len() < 16 {
        return;
    }
    let (numbers, body) = data.split_at(16);
    let offset = u64::from_le_bytes(numbers[..8].try_into().expect("8 bytes"));
    let size = u64::from_le_bytes(numbers[8..].try_into().expect("8 bytes"));
    let at = RegionRef { region: "all".into(), offset, byte_size: size };
    // Triton's rule: the offset inside the region, the end not past it (a
    // tensor of no elements has size 0).
    let fits = offset < 256 && offset.checked_add(size).is_some_and(|end| end <= 256);
    assert_eq!(
        regions.reads().read(&at).is_ok(),
        fits,
        "a read is refused exactly when it leaves the region ({offset}, {size})"
    );
    let Ok(decoded) = binary::decode(None, body, ("m", &SIGNATURE), &regions.reads()) else { return };
    for output in &decoded.head.outputs {
        if let Some(place) = output.region.clone()
            && let Ok(region) = regions.output(place)
        {
            let _ = region.write(&output.name, &[7; 8]);
        }
    }
}

/// An ensemble's configuration: when it is valid, the ensemble runs once
/// with an input of ones for each of its inputs, over steps that answer
/// each output asked for with a copy of their first input. The run must
/// end (an answer or an error), whatever the graph.
pub fn ensemble(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(config) = config::parse(text) else { return };
    if config::validate::validate(&config).is_err() {
        return;
    }
    let (Some(ensemble), Ok(signature)) = (Ensemble::from_config(&config), Signature::from_config(&config)) else {
        return;
    };
    let batching = signature.max_batch_size > 0;
    let inputs: Vec<Tensor> = signature
        .inputs
        .iter()
        .filter(|spec| spec.datatype.element_size().is_some())
        .filter_map(|spec| ones(spec, batching))
        .collect();
    let wanted: Vec<&str> = signature.outputs.iter().map(|s| s.name.as_str()).collect();
    let runner: Arc<dyn ModelRunner> = Arc::new(EchoSteps);
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a tokio runtime");
    let _ = runtime.block_on(ensemble.run("e", &signature, inputs, &wanted, RequestOptions::default(), &runner));
}

/// A tensor of `spec` filled with ones, its variable dimensions 1 (`None`
/// for a shape too large to fill).
fn ones(spec: &TensorSpec, batching: bool) -> Option<Tensor> {
    let dims = spec.model_dims().iter().map(|&d| d.max(1));
    let shape: Vec<i64> = if batching { std::iter::once(1).chain(dims).collect() } else { dims.collect() };
    let count = crate::tensor::element_count(&shape).filter(|&n| n <= 1 << 16)?;
    let size = spec.datatype.element_size()?;
    Some(Tensor { name: spec.name.clone(), datatype: spec.datatype, shape, data: vec![1; count * size] })
}

/// Steps of an ensemble under fuzzing: every model takes anything and
/// answers each output asked for with its first input.
struct EchoSteps;

impl ModelRunner for EchoSteps {
    fn infer(
        self: Arc<Self>,
        _model: String,
        _version: Option<u64>,
        inputs: Vec<Tensor>,
        outputs: Vec<String>,
        _options: RequestOptions,
    ) -> BoxFuture<Result<Vec<Tensor>, Error>> {
        Box::pin(async move {
            let first = inputs.into_iter().next().ok_or_else(|| Error::InvalidArgument("no input".into()))?;
            Ok(outputs.into_iter().map(|name| Tensor { name, ..first.clone() }).collect())
        })
    }

    fn signature(self: Arc<Self>, _model: String, _version: Option<u64>) -> BoxFuture<Result<Signature, Error>> {
        Box::pin(async { Ok(Signature { max_batch_size: 0, inputs: vec![], outputs: vec![] }) })
    }

    fn predict(
        self: Arc<Self>,
        model: String,
        _version: Option<u64>,
        _request: RawRequest,
        _chain: Vec<String>,
        _trace: Option<crate::trace::Span>,
    ) -> BoxFuture<Result<RawResponse, Error>> {
        Box::pin(async move { Err(Error::NotFound(format!("model '{model}' has no plugin here"))) })
    }
}

/// A rollout plan as a client sends it (`POST .../rollout`) or a
/// `config.pbtxt` declares it, its bytes split at the first NUL into the
/// plan's JSON and the answers it then judges: a plan that parses starts a
/// rollout, which routes, shadows and judges every answer the rest of the
/// bytes describe (two bytes each: version side, failure and latency), as
/// a server's requests would, its status read after each.
pub fn rollout_plan(data: &[u8]) {
    let (json, answers) = data.split_at(data.iter().position(|&b| b == 0).unwrap_or(data.len()));
    let declared = std::str::from_utf8(json).ok().map(|text| crate::rollout::Plan::declared(text, 2, 1));
    let plan = match (crate::rollout::Plan::parse(json), declared) {
        (Ok(plan), _) | (Err(_), Some(Ok(plan))) => plan,
        _ => return,
    };
    let (candidate, serving) = (plan.candidate, plan.serving.unwrap_or(1));
    let rollouts = crate::rollout::Rollouts::new(crate::metrics::Metrics::new().rollout.clone());
    rollouts.start("m", plan, serving);
    for pair in answers.chunks(2) {
        let key = format!("{}", pair[0]);
        let version = rollouts.route("m", &|_| Some(key.clone())).unwrap_or(serving);
        let version = if pair[0] & 1 == 1 { candidate } else { version };
        let latency = std::time::Duration::from_micros(u64::from(*pair.last().unwrap_or(&0)) << (pair[0] % 40));
        let _ = rollouts.observe("m", version, latency, pair[0] & 2 == 2);
        if let Some(ticket) = rollouts.shadow_ticket("m", version) {
            let outcome = if pair[0] & 4 == 4 { Err("differs".to_owned()) } else { Ok(()) };
            let _ = rollouts.shadowed(&ticket, outcome);
        }
        let status = rollouts.status("m").expect("a started rollout has a status");
        serde_json::to_string(&status).expect("a status serializes");
    }
}

/// One tensor as a plugin's `preprocess` may return it: any name of the
/// signature's (or another), any datatype, shape and data.
#[derive(Arbitrary, Debug)]
struct PluginTensor {
    name: u8,
    datatype: u8,
    shape: Vec<i64>,
    data: Vec<u8>,
}

/// The tensors a plugin's `preprocess` hands the host (WIT `tensor`
/// records, structured from the bytes by `arbitrary`): checked against the
/// model's signature as the host checks them, and those accepted encoded
/// as an answer in every output form.
pub fn plugin_tensors(data: &[u8]) {
    let Ok(given) = Vec::<PluginTensor>::arbitrary_take_rest(Unstructured::new(data)) else { return };
    const NAMES: [&str; 4] = ["x", "s", "i", "other"];
    let tensors: Vec<Tensor> = given
        .into_iter()
        .map(|t| Tensor {
            name: NAMES[usize::from(t.name) % NAMES.len()].to_owned(),
            datatype: DataType::ALL[usize::from(t.datatype) % DataType::ALL.len()],
            shape: t.shape,
            data: t.data,
        })
        .collect();
    if check_inputs(&SIGNATURE, "m", &tensors).is_err() {
        return;
    }
    for form in [OutputForm::Json, OutputForm::Binary, OutputForm::SharedMemory] {
        let outputs = tensors.iter().map(|t| (t.clone(), form)).collect();
        // FP16 and BF16 cannot be JSON: a refusal, not a finding.
        let _ = binary::encode(response(), outputs);
    }
}

/// An empty response of model `m`.
fn response() -> InferResponse {
    InferResponse { model_name: "m".into(), model_version: "1".into(), id: None, outputs: Vec::new() }
}

/// No shared memory region registered.
struct NoRegion;

impl Regions for NoRegion {
    fn check(&self, at: &RegionRef) -> Result<(), Error> {
        Err(Error::NotFound(format!("Unable to find shared memory region: '{}'", at.region)))
    }

    fn read(&self, at: &RegionRef) -> Result<Vec<u8>, Error> {
        self.check(at).map(|()| Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every committed corpus input through its target: `make test` runs
    /// again what the fuzzers kept and every crash they found.
    #[test]
    fn the_committed_fuzz_corpus_replays_cleanly() {
        let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
        let mut replayed = 0;
        for (name, target) in TARGETS {
            let dir = corpus.join(name);
            let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            let mut files: Vec<_> = entries.map(|e| e.expect("a corpus entry").path()).collect();
            files.sort();
            assert!(!files.is_empty(), "the corpus of {name} is empty");
            for file in files {
                let data = std::fs::read(&file).expect("a corpus file");
                let run = std::panic::catch_unwind(|| target(&data));
                assert!(run.is_ok(), "{name} fails on {}", file.display());
                replayed += 1;
            }
        }
        assert!(replayed > 0);
    }
}

//! TorchScript through libtorch, end to end: the example repository's
//! MobileNetV2, served by ONNX Runtime and by libtorch, names scikit-learn's
//! sample photos alike and gives the same logits; a configuration that does
//! not fit the TorchScript file is refused at load, naming the tensor;
//! eviction gives the module's memory back; dynamic batching returns each
//! request its own answer.

use std::path::PathBuf;

use plinth_client::{Client, InferInput, InferRequest, RetryPolicy};
use plinth_tests::{Server, add_model, example_repository, sample_photo};
use serde_json::json;

const IMAGE: [i64; 3] = [3, 224, 224];
const ROW: usize = 3 * 224 * 224;

fn torchscript() -> PathBuf {
    example_repository().join("mobilenet_v2_torchscript/1/model.pt")
}

/// The example configuration of the TorchScript copy, renamed, without its
/// plugin, with `extra` appended.
fn config(name: &str, extra: &str) -> String {
    format!(
        r#"name: "{name}"
        platform: "pytorch_libtorch"
        max_batch_size: 32
        input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] }} ]
        output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1000 ] }} ]
        {extra}"#
    )
}

/// Distinct images of values in [-2, 2], like normalised pixels.
fn images(seed: usize, rows: usize) -> Vec<f32> {
    (0..rows * ROW).map(|i| ((i * 7919 + seed * 104_729) % 1025) as f32 / 256.0 - 2.0).collect()
}

fn request(seed: usize, rows: usize) -> InferRequest {
    let shape = [rows as i64, IMAGE[0], IMAGE[1], IMAGE[2]];
    InferRequest::new(vec![InferInput::fp32("INPUT__0", &shape, &images(seed, rows))])
}

fn logits(client: &Client, model: &str, request: &InferRequest) -> Vec<f32> {
    let response = client.infer(model, request).unwrap_or_else(|e| panic!("{model}: {e}"));
    response.output("OUTPUT__0").expect("OUTPUT__0").to_f32().unwrap()
}

fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn both_backends_name_the_sample_photos_and_agree_on_the_logits() {
    let server = Server::start(&example_repository(), &[]);
    for model in ["mobilenet_v2", "mobilenet_v2_torchscript"] {
        for (photo, label) in [("china.jpg", "palace"), ("flower.jpg", "honeycomb")] {
            let path = format!("/v2/models/{model}/predict?top_k=3");
            let (status, body) = server.post_bytes(&path, "image/jpeg", sample_photo(photo));
            assert_eq!(status, 200, "{model} {photo}: {body}");
            let classes = body["classes"].as_array().unwrap();
            assert_eq!(classes.len(), 3, "{body}");
            assert_eq!(classes[0]["label"], label, "{model} {photo}: {body}");
            assert!(classes[0]["probability"].as_f64().unwrap() > 0.4, "{model} {photo}: {body}");
        }
    }
    let client = Client::new(server.base()).with_retry(RetryPolicy::NEVER);
    let batch = request(1, 4);
    let onnx = logits(&client, "mobilenet_v2", &batch);
    let torch = logits(&client, "mobilenet_v2_torchscript", &batch);
    assert_eq!(onnx.len(), 4 * 1000);
    let difference = max_difference(&onnx, &torch);
    assert!(difference <= 1e-4, "ONNX Runtime and libtorch logits differ by up to {difference}");
}

#[test]
fn torchscript_metadata_and_configuration_follow_triton() {
    let server = Server::start(&example_repository(), &[]);
    let (status, meta) = server.get("/v2/models/mobilenet_v2_torchscript");
    assert_eq!(status, 200, "{meta}");
    assert_eq!(meta["platform"], "pytorch_libtorch");
    assert_eq!(meta["inputs"], json!([{ "name": "INPUT__0", "datatype": "FP32", "shape": [-1, 3, 224, 224] }]));
    assert_eq!(meta["outputs"], json!([{ "name": "OUTPUT__0", "datatype": "FP32", "shape": [-1, 1000] }]));
    let (status, config) = server.get("/v2/models/mobilenet_v2_torchscript/config");
    assert_eq!(status, 200, "{config}");
    assert_eq!((config["backend"].as_str(), config["max_batch_size"].as_i64()), (Some("pytorch"), Some(32)));
}

#[test]
fn a_configuration_that_does_not_fit_the_torchscript_file_is_refused_at_load() {
    let repo = tempfile::tempdir().unwrap();
    let cases = [
        (
            "wide",
            config("wide", "").replace("dims: [ 1000 ]", "dims: [ 1001 ]"),
            "declares shape [-1, 1001] (with the batch dimension), but the model returns [1, 1000]",
        ),
        (
            "half",
            config("half", "")
                .replace("name: \"OUTPUT__0\" data_type: TYPE_FP32", "name: \"OUTPUT__0\" data_type: TYPE_FP16"),
            "says data_type FP16, but the model returns FP32",
        ),
        (
            "ints",
            config("ints", "")
                .replace("name: \"INPUT__0\" data_type: TYPE_FP32", "name: \"INPUT__0\" data_type: TYPE_INT64"),
            "fails on zeros of the inputs",
        ),
        (
            "flat",
            config("flat", "").replace("dims: [ 3, 224, 224 ]", "dims: [ 3, 224 ]"),
            "fails on zeros of the inputs",
        ),
        (
            "unnamed",
            config("unnamed", "").replace("INPUT__0", "image"),
            "or after the forward method's arguments, which are [\"x\"]",
        ),
        ("bare", "name: \"bare\" platform: \"pytorch_libtorch\"".to_owned(), "declare every input and output"),
    ];
    for (name, text, _) in &cases {
        add_model(repo.path(), name, &torchscript(), text);
    }
    add_model(repo.path(), "good", &torchscript(), &config("good", ""));
    let server = Server::start(repo.path(), &["--model-control-mode", "explicit"]);
    for (name, _, expected) in &cases {
        let (status, body) = server.post_json(&format!("/v2/repository/models/{name}/load"), &json!({}));
        assert_eq!(status, 400, "{name}: {body}");
        let error = body["error"].as_str().unwrap();
        assert!(error.contains(expected), "{name}: {error}");
    }
    // Named after the forward argument instead of INPUT__0: the same model.
    add_model(repo.path(), "by_argument", &torchscript(), &config("by_argument", "").replace("INPUT__0", "x"));
    let client = Client::new(server.base()).with_retry(RetryPolicy::NEVER);
    for name in ["good", "by_argument"] {
        let (status, body) = server.post_json(&format!("/v2/repository/models/{name}/load"), &json!({}));
        assert_eq!(status, 200, "{name}: {body}");
    }
    let input = images(2, 1);
    let by_argument = InferRequest::new(vec![InferInput::fp32("x", &[1, 3, 224, 224], &input)]);
    assert_eq!(logits(&client, "good", &request(2, 1)), logits(&client, "by_argument", &by_argument));
}

#[test]
fn evicted_torchscript_models_give_their_memory_back() {
    let repo = tempfile::tempdir().unwrap();
    for name in ["warm", "x", "y"] {
        add_model(repo.path(), name, &torchscript(), &config(name, ""));
    }
    // Room for warm and one more: every request to x or y evicts the other.
    let args = ["--model-control-mode", "on_demand", "--load-model", "warm", "--max-loaded-models", "2"];
    let server = Server::start(repo.path(), &args);
    let client = Client::new(server.base()).with_retry(RetryPolicy::NEVER);
    let one = request(3, 1);
    let want = logits(&client, "warm", &one);
    let mut after_first = 0;
    for cycle in 1..=15 {
        for model in ["x", "y"] {
            let got = logits(&client, model, &one);
            assert!(max_difference(&got, &want) <= 1e-5, "cycle {cycle} {model}");
        }
        if cycle == 1 {
            after_first = server.rss();
        }
    }
    assert_eq!(server.metric("plinth_model_loads_total{model=\"x\"}"), 15.0);
    let after_all = server.rss();
    // 28 more loads each leaking a model would grow by 28 footprints.
    let (_, index) = server.post_json("/v2/repository/index", &json!({}));
    let footprint =
        index.as_array().unwrap().iter().find(|r| r["name"] == "y").unwrap()["resident_bytes"].as_u64().unwrap();
    assert!(
        after_all.saturating_sub(after_first) < 5 * footprint,
        "memory grew from {} MiB after the first cycle to {} MiB after fifteen, loading a {} MiB model 28 more times",
        after_first >> 20,
        after_all >> 20,
        footprint >> 20
    );
}

#[test]
fn batched_torchscript_requests_each_get_their_own_answer() {
    let repo = tempfile::tempdir().unwrap();
    add_model(repo.path(), "plain", &torchscript(), &config("plain", ""));
    // The queue holds requests until all 24 are there: one execution.
    let batching = "dynamic_batching { preferred_batch_size: [ 24 ] max_queue_delay_microseconds: 600000000 }";
    add_model(repo.path(), "batched", &torchscript(), &config("batched", batching));
    let server = Server::start(repo.path(), &[]);
    let client = &Client::new(server.base()).with_retry(RetryPolicy::NEVER);
    let unbatched: Vec<Vec<f32>> = (0..24).map(|seed| logits(client, "plain", &request(seed, 1))).collect();
    let batched: Vec<Vec<f32>> = std::thread::scope(|s| {
        let handles: Vec<_> =
            (0..24).map(|seed| s.spawn(move || logits(client, "batched", &request(seed, 1)))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (seed, (got, want)) in batched.iter().zip(&unbatched).enumerate() {
        let difference = max_difference(got, want);
        assert!(difference <= 1e-4, "request {seed}: batched logits differ by {difference}");
    }
    let series = |family: &str| server.metric(&format!("{family}{{model=\"batched\",version=\"1\"}}"));
    assert_eq!(series("nv_inference_count"), 24.0);
    assert_eq!(series("nv_inference_exec_count"), 1.0, "the 24 requests ran as one batch");
}

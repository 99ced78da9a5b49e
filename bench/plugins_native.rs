//! Each plugin's `preprocess` and `postprocess` in the WebAssembly sandbox
//! against the same Rust code compiled natively into this benchmark, as a
//! ratio, measured in the same run. The sandboxed times are the
//! `Server-Timing` entries of `/predict` on the example repository (host
//! conversions and call included); the native ones call the plugin types
//! directly, with the same model information, request and model outputs.
//! Plugins that compose (`ocr`, `vad`, `spam_classifier`) call the host, so
//! they are left out. For `minilm` (text-embedding) preprocess is the
//! tokenizer (`tokenizers` compiled to wasm32-wasip2 against natively) and
//! postprocess tokenizes again and pools.
//!
//! Usage: cargo run --release -p plinth-bench --bin plugins_native [MODEL...]
//! (after `make setup`; every model when none is named)

use std::time::{Duration, Instant};

use plinth_client::{Client, InferInput, InferRequest};
use plinth_plugin_sdk::{Datatype, ModelInfo, Plugin, Request, Tensor, TensorSpec};
use plinth_tests::{Server, example_repository, fixture, ort_dylib_path, sample_photo};
use serde_json::Value;

/// Calls per measurement; the median is reported.
const RUNS: usize = 41;

fn main() {
    let named: Vec<String> = std::env::args().skip(1).collect();
    let wanted = |model: &str| named.is_empty() || named.iter().any(|n| n == model);
    let server = Server::start(&example_repository(), &[]);
    let client = Client::new(server.base());
    println!("{:<14} {:<12} {:>10} {:>10} {:>8}", "model", "stage", "wasm µs", "native µs", "ratio");
    if wanted("ocr_cls") {
        measure::<ocr_cls::ExportedPlugin>(&server, &client, "ocr_cls", "image/png", fixture("cls_rotated.png"));
    }
    if wanted("ocr_rec") {
        measure::<ocr_rec::ExportedPlugin>(&server, &client, "ocr_rec", "image/png", fixture("line_invoice.png"));
    }
    if wanted("mobilenet_v2") {
        // SAFETY: set before any other thread of this process reads the environment.
        unsafe { std::env::set_var("PLINTH_MODEL_DIR", example_repository().join("mobilenet_v2/1")) };
        let photo = sample_photo("china.jpg");
        measure::<image_classification::ExportedPlugin>(&server, &client, "mobilenet_v2", "image/jpeg", photo);
    }
    if wanted("minilm") {
        // SAFETY: as above; the plugins read it in `init` only.
        unsafe { std::env::set_var("PLINTH_MODEL_DIR", example_repository().join("minilm/1")) };
        // 16 texts of 3 to 59 tokens: the 50 test sentences, every third.
        let sentences = String::from_utf8(fixture("sentences.txt")).unwrap();
        let texts: Vec<&str> = sentences.lines().step_by(3).take(16).collect();
        let body = serde_json::to_vec(&serde_json::json!({ "input": texts })).unwrap();
        measure::<text_embedding::ExportedPlugin>(&server, &client, "minilm", "application/json", body);
    }
}

fn measure<P: Plugin>(server: &Server, client: &Client, model: &str, content_type: &str, body: Vec<u8>) {
    let (wasm_pre, wasm_post) = sandboxed(server, model, content_type, &body);
    let info = model_info(server, model);
    let mut plugin = P::init(&info).unwrap_or_else(|e| panic!("{model}: init failed natively: {e:?}"));
    let req = Request { content_type: content_type.to_owned(), body, parameters: Vec::new() };
    let inputs = plugin.preprocess(&req).expect("native preprocess");
    let native_pre = median(|| drop(plugin.preprocess(&req).expect("native preprocess")));
    let outputs = run_model(client, model, &inputs);
    let native_post = median(|| drop(plugin.postprocess(&req, outputs.clone()).expect("native postprocess")));
    for (stage, wasm, native) in [("preprocess", wasm_pre, native_pre), ("postprocess", wasm_post, native_post)] {
        let (w, n) = (wasm.as_secs_f64() * 1e6, native.as_secs_f64() * 1e6);
        println!("{model:<14} {stage:<12} {w:>10.1} {n:>10.1} {:>7.1}x", w / n.max(0.001));
    }
}

/// Median `preprocess` and `postprocess` times from `/predict`'s
/// `Server-Timing` header.
fn sandboxed(server: &Server, model: &str, content_type: &str, body: &[u8]) -> (Duration, Duration) {
    let http = reqwest::blocking::Client::new();
    let url = server.url(&format!("/v2/models/{model}/predict"));
    let (mut pre, mut post) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let response = http.post(&url).header("content-type", content_type).body(body.to_vec()).send().unwrap();
        assert!(response.status().is_success(), "{model}: {}", response.status());
        let timing = response.headers()["server-timing"].to_str().unwrap().to_owned();
        let entry = |name: &str| {
            let dur = timing.split(',').find_map(|e| e.trim().strip_prefix(&format!("{name};dur="))).unwrap();
            Duration::from_secs_f64(dur.parse::<f64>().unwrap() / 1000.0)
        };
        pre.push(entry("preprocess"));
        post.push(entry("postprocess"));
    }
    pre.sort();
    post.sort();
    (pre[RUNS / 2], post[RUNS / 2])
}

fn median(mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let started = Instant::now();
            f();
            started.elapsed()
        })
        .collect();
    times.sort();
    times[RUNS / 2]
}

/// What the host tells the plugin: the served configuration, and the ONNX
/// file's metadata (ocr_rec's dictionary lives there).
fn model_info(server: &Server, model: &str) -> ModelInfo {
    let (_, config) = server.get(&format!("/v2/models/{model}/config"));
    let specs = |list: &Value| -> Vec<TensorSpec> {
        list.as_array()
            .unwrap()
            .iter()
            .map(|t| TensorSpec {
                name: t["name"].as_str().unwrap().to_owned(),
                datatype: datatype(t["data_type"].as_str().unwrap()),
                dims: t["dims"].as_array().unwrap().iter().map(|d| d.as_i64().unwrap()).collect(),
            })
            .collect()
    };
    let parameters = config["parameters"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v["string_value"].as_str().unwrap_or("").to_owned())).collect())
        .unwrap_or_default();
    ModelInfo {
        name: model.to_owned(),
        version: 1,
        max_batch_size: config["max_batch_size"].as_u64().unwrap() as u32,
        inputs: specs(&config["input"]),
        outputs: specs(&config["output"]),
        parameters,
        metadata: onnx_metadata(model),
    }
}

fn datatype(config_type: &str) -> Datatype {
    match config_type {
        "TYPE_FP32" => Datatype::Fp32,
        "TYPE_INT64" => Datatype::Int64,
        other => panic!("the benchmark's plugins take FP32 and INT64 tensors, not {other}"),
    }
}

fn onnx_metadata(model: &str) -> Vec<(String, String)> {
    // ONNX Runtime allows one environment per process.
    static ENV: std::sync::OnceLock<ort::environment::Environment> = std::sync::OnceLock::new();
    let env = ENV.get_or_init(|| {
        ort::init_from(ort_dylib_path()).expect("ONNX Runtime loads").with_name("bench").build().expect("env")
    });
    let path = example_repository().join(model).join("1/model.onnx");
    let session = ort::session::Session::builder(env).unwrap().commit_from_file(path).expect("the model loads");
    let meta = session.metadata().unwrap();
    meta.custom_keys().unwrap().into_iter().filter_map(|k| meta.custom(&k).map(|v| (k, v))).collect()
}

/// The model's outputs for `inputs`, through the server.
fn run_model(client: &Client, model: &str, inputs: &[Tensor]) -> Vec<Tensor> {
    let request = InferRequest::new(
        inputs
            .iter()
            .map(|t| match t.datatype {
                Datatype::Int64 => {
                    let values: Vec<i64> =
                        t.data.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect();
                    InferInput {
                        name: t.name.clone(),
                        shape: t.shape.clone(),
                        datatype: "INT64".into(),
                        data: values.into(),
                    }
                }
                _ => {
                    let values: Vec<f32> =
                        t.data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
                    InferInput::fp32(&t.name, &t.shape, &values)
                }
            })
            .collect(),
    );
    let response = client.infer(model, &request).expect("the model runs");
    response
        .outputs
        .iter()
        .map(|o| Tensor {
            name: o.name.clone(),
            datatype: Datatype::Fp32,
            shape: o.shape.clone(),
            data: o.to_f32().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect(),
        })
        .collect()
}

//! Each plugin's `preprocess` and `postprocess`, in the WebAssembly sandbox
//! (the `Server-Timing` entries of `/predict`, host conversions and call
//! included) and natively (the plugin crate compiled into the benchmark and
//! called directly with the same model information, request and model
//! outputs): shared by `plugins_native` and `overhead`.

use std::time::{Duration, Instant};

use plinth_client::{Client, InferInput, InferRequest};
use plinth_plugin_sdk::{Datatype, ModelInfo, Plugin, Request, Tensor, TensorSpec};
use plinth_tests::{Server, example_repository, ort_dylib_path};
use serde_json::Value;

/// The process's ONNX Runtime environment (ONNX Runtime allows one per
/// process), made at first use.
pub fn ort_environment() -> &'static ort::environment::Environment {
    static ENV: std::sync::OnceLock<ort::environment::Environment> = std::sync::OnceLock::new();
    ENV.get_or_init(|| {
        ort::init_from(ort_dylib_path()).expect("ONNX Runtime loads").with_name("bench").build().expect("env")
    })
}

/// Calls per measurement; the median is reported.
pub const RUNS: usize = 41;

/// One plugin stage, in the sandbox and natively (medians).
pub struct Stage {
    pub name: &'static str,
    pub wasm: Duration,
    pub native: Duration,
}

/// `model`'s plugin stages on a request of `content_type` with `body`:
/// preprocess, then postprocess.
pub fn measure<P: Plugin>(
    server: &Server,
    client: &Client,
    model: &str,
    content_type: &str,
    body: Vec<u8>,
) -> [Stage; 2] {
    let (wasm_pre, wasm_post) = sandboxed(server, model, content_type, &body);
    let info = model_info(server, model);
    let mut plugin = P::init(&info).unwrap_or_else(|e| panic!("{model}: init failed natively: {e:?}"));
    let req = Request { content_type: content_type.to_owned(), body, parameters: Vec::new() };
    let inputs = plugin.preprocess(&req).expect("native preprocess");
    let native_pre = median(|| drop(plugin.preprocess(&req).expect("native preprocess")));
    let outputs = run_model(client, model, &inputs);
    let native_post = median(|| drop(plugin.postprocess(&req, outputs.clone()).expect("native postprocess")));
    [
        Stage { name: "preprocess", wasm: wasm_pre, native: native_pre },
        Stage { name: "postprocess", wasm: wasm_post, native: native_post },
    ]
}

/// Median `preprocess` and `postprocess` times from `/predict`'s
/// `Server-Timing` header.
fn sandboxed(server: &Server, model: &str, content_type: &str, body: &[u8]) -> (Duration, Duration) {
    let http = plinth_client::http_client(None);
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
    let env = ort_environment();
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
                        t.data.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes"))).collect();
                    InferInput {
                        name: t.name.clone(),
                        shape: t.shape.clone(),
                        datatype: "INT64".into(),
                        data: values.into(),
                    }
                }
                _ => {
                    let values: Vec<f32> =
                        t.data.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect();
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

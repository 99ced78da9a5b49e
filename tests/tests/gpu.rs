//! GPU placement on a machine without a GPU (the CI machine's case): an
//! ONNX or TorchScript model whose `instance_group` asks for KIND_GPU is
//! refused at load with a reason that names the model and the library that
//! is missing; the CPU models beside it keep serving; `/metrics` has no
//! `nv_gpu_*` family; `--model-load-gpu-limit` for a GPU that does not
//! exist, or twice for one GPU, stops the server at start; and a bad `gpu_swap_policy` is refused.
//! On a GPU machine (the build script sets `gpu_machine`) those that need
//! a machine without one are ignored, and `bench/gpu.sh` checks the GPU side.

use std::process::Command;

use plinth_tests::{Server, add_model, binary, copy_example_model, example_repository, fixture, ort_dylib_path};
use serde_json::json;

/// The direction classifier's configuration under `name`, without its
/// plugin, with `extra` appended.
fn cls_config(name: &str, extra: &str) -> String {
    format!(
        r#"name: "{name}"
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 3, 48, 192 ] }} ]
        output [ {{ name: "save_infer_model/scale_0.tmp_1" data_type: TYPE_FP32 dims: [ 2 ] }} ]
        {extra}"#
    )
}

fn reason_of(server: &Server, model: &str) -> String {
    let (_, index) = server.post_json("/v2/repository/index", &json!({}));
    let row = index.as_array().unwrap().iter().find(|r| r["name"] == model).unwrap_or_else(|| panic!("{index}"));
    assert_eq!(row["state"], "UNAVAILABLE", "{row}");
    row["reason"].as_str().unwrap().to_owned()
}

#[test]
#[cfg_attr(gpu_machine, ignore = "a machine without a GPU's case; on a GPU machine bench/gpu.sh checks placement")]
fn kind_gpu_without_a_gpu_is_refused_by_name_and_cpu_models_keep_serving() {
    let repo = tempfile::tempdir().unwrap();
    copy_example_model("ocr_cls", repo.path());
    let onnx = example_repository().join("ocr_cls/1/model.onnx");
    add_model(repo.path(), "cls_on_gpu", &onnx, &cls_config("cls_on_gpu", "instance_group [{ kind: KIND_GPU }]"));
    add_model(repo.path(), "cls_auto", &onnx, &cls_config("cls_auto", "instance_group [{ kind: KIND_AUTO count: 2 }]"));
    let policy = r#"parameters { key: "gpu_swap_policy" value: { string_value: "sometimes" } }"#;
    add_model(repo.path(), "cls_bad_policy", &onnx, &cls_config("cls_bad_policy", policy));
    let torchscript = example_repository().join("mobilenet_v2_torchscript/1/model.pt");
    let torch_config = r#"name: "torch_on_gpu"
        platform: "pytorch_libtorch"
        max_batch_size: 4
        input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1000 ] } ]
        instance_group [{ kind: KIND_GPU gpus: [ 0 ] }]"#;
    add_model(repo.path(), "torch_on_gpu", &torchscript, torch_config);
    let server = Server::start(repo.path(), &["--model-control-mode", "explicit", "--load-model", "*"]);

    // ONNX: the CPU build of ONNX Runtime names the provider library it
    // lacks; the GPU build on a machine without a driver names the driver's
    // library (libcuda.so.1 or NVML's libnvidia-ml.so.1) instead.
    let onnx_reason = reason_of(&server, "cls_on_gpu");
    assert!(onnx_reason.contains("model 'cls_on_gpu'"), "{onnx_reason}");
    assert!(onnx_reason.contains("asks for KIND_GPU"), "{onnx_reason}");
    let names_library = ["libonnxruntime_providers_cuda.so", "libcuda.so.1", "libnvidia-ml.so.1"];
    assert!(names_library.iter().any(|l| onnx_reason.contains(l)), "{onnx_reason}");
    let torch_reason = reason_of(&server, "torch_on_gpu");
    assert!(torch_reason.contains("model 'torch_on_gpu'"), "{torch_reason}");
    assert!(torch_reason.contains("libtorch sees no CUDA device"), "{torch_reason}");
    let policy_reason = reason_of(&server, "cls_bad_policy");
    assert!(policy_reason.contains("parameter 'gpu_swap_policy'") && policy_reason.contains("sometimes"));

    // The load API answers the same refusal, in the protocol's error shape.
    let (status, body) = server.post_json("/v2/repository/models/cls_on_gpu/load", &json!({}));
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("model 'cls_on_gpu'"), "{body}");

    // KIND_AUTO falls back to the CPU, and the CPU models answer.
    for model in ["ocr_cls", "cls_auto"] {
        let (status, body) = server.get(&format!("/v2/models/{model}/ready"));
        assert_eq!(status, 200, "{model}: {body}");
    }
    let (status, body) = server.post_bytes("/v2/models/ocr_cls/predict", "image/png", fixture("cls_rotated.png"));
    assert_eq!((status, &body["angle"]), (200, &json!(180)), "{body}");
    let scores = |model: &str| {
        let (status, body) = server.post_json(&format!("/v2/models/{model}/infer"), &cls_request());
        assert_eq!(status, 200, "{model}: {body}");
        body["outputs"][0]["data"].clone()
    };
    let on_cpu = scores("ocr_cls");
    assert_eq!(on_cpu.as_array().unwrap().len(), 2, "{on_cpu}");
    assert_eq!(scores("cls_auto"), on_cpu, "the same model on the CPU gives the same scores");

    let metrics = server.metrics_text();
    assert!(metrics.contains("nv_cpu_utilization"), "{metrics}");
    assert!(!metrics.contains("nv_gpu_"), "no GPU, no nv_gpu_* family: {metrics}");
    assert!(!metrics.contains("plinth_model_gpu_memory_bytes{"), "no model holds GPU memory");
}

/// A text-line tensor of values in [-1, 1], as the classifier's inputs are.
fn cls_request() -> serde_json::Value {
    let data: Vec<f32> = (0..3 * 48 * 192).map(|i| ((i * 7919) % 201) as f32 / 100.0 - 1.0).collect();
    json!({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3, 48, 192], "data": data}]})
}

#[test]
#[cfg_attr(gpu_machine, ignore = "a machine without a GPU's case: there GPU 0 exists")]
fn a_gpu_limit_for_a_gpu_that_does_not_exist_stops_the_server() {
    let repo = tempfile::tempdir().unwrap();
    let out = Command::new(binary())
        .env("ORT_DYLIB_PATH", ort_dylib_path())
        .args([
            "serve",
            "--http-port",
            "0",
            "--metrics-port",
            "0",
            "--grpc-port",
            "0",
            "--model-load-gpu-limit",
            "0:0.8",
        ])
        .arg("--model-repository")
        .arg(repo.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("--model-load-gpu-limit names GPU 0, which does not exist"), "{stderr}");
    assert!(stderr.contains("libnvidia-ml.so.1"), "NVML's absence is named: {stderr}");

    let bad = Command::new(binary()).args(["serve", "--model-load-gpu-limit", "0:1.5"]).output().unwrap();
    assert!(String::from_utf8_lossy(&bad.stderr).contains("'1.5' is not a fraction"), "{bad:?}");
    let twice =
        ["serve", "--model-repository", ".", "--model-load-gpu-limit", "0:0.5", "--model-load-gpu-limit", "0:0.8"];
    let twice = Command::new(binary()).args(twice).output().unwrap();
    let stderr = String::from_utf8_lossy(&twice.stderr);
    assert!(!twice.status.success() && stderr.contains("--model-load-gpu-limit is given twice for GPU 0"), "{stderr}");
}

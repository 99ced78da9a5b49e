//! Bad input gets a clear `{"error"}` with the right status, and the server
//! keeps serving afterwards.

use std::path::Path;

use plinth_tests::{Server, add_faulty_model, copy_dir, copy_example_model, example_repository, fixture};
use serde_json::{Value, json};

fn error_of(body: &Value) -> &str {
    body["error"].as_str().unwrap_or_else(|| panic!("no {{\"error\"}} in {body}"))
}

/// Still reads the hello line correctly: the server kept serving.
fn assert_still_serving(server: &Server) {
    let (status, body) = server.post_bytes("/v2/models/ocr_rec/predict", "image/png", fixture("line_hello.png"));
    assert_eq!((status, body["text"].as_str()), (200, Some("Hello World")), "{body}");
}

fn cls_request(datatype: &str, shape: &[i64], data: Value) -> Value {
    json!({"inputs": [{"name": "x", "shape": shape, "datatype": datatype, "data": data}]})
}

#[test]
fn bad_requests_get_400_or_404_with_the_reason() {
    let server = Server::start(&example_repository(), &[]);

    let (status, body) = server.get("/v2/models/no_such_model");
    assert_eq!(status, 404);
    assert!(error_of(&body).contains("no_such_model"), "{body}");
    let (status, _) = server.post_json("/v2/models/no_such_model/infer", &json!({"inputs": []}));
    assert_eq!(status, 404);

    let (status, body) = server.post_bytes("/v2/models/ocr_cls/infer", "application/json", b"{\"inputs\": [".to_vec());
    assert_eq!(status, 400);
    assert!(error_of(&body).contains("malformed"), "{body}");

    let n = 3 * 48 * 192;
    let (status, body) =
        server.post_json("/v2/models/ocr_cls/infer", &cls_request("INT32", &[1, 3, 48, 192], json!(vec![0; n])));
    assert_eq!(status, 400);
    let msg = error_of(&body);
    assert!(msg.contains("'x'") && msg.contains("FP32") && msg.contains("INT32"), "{msg}");

    let (status, body) = server
        .post_json("/v2/models/ocr_cls/infer", &cls_request("FP32", &[1, 3, 48, 100], json!(vec![0.0; 3 * 48 * 100])));
    assert_eq!(status, 400);
    let msg = error_of(&body);
    assert!(msg.contains("'x'") && msg.contains("[-1, 3, 48, 192]") && msg.contains("[1, 3, 48, 100]"), "{msg}");

    let (status, body) =
        server.post_json("/v2/models/ocr_cls/infer", &cls_request("FP32", &[1, 3, 48, 192], json!([1.0, 2.0])));
    assert_eq!(status, 400);
    assert!(error_of(&body).contains("needs 27648 elements, but data has 2"), "{body}");

    let (status, body) = server.post_bytes("/v2/models/ocr_rec/predict", "image/png", b"this is not an image".to_vec());
    assert_eq!(status, 400);
    let msg = error_of(&body);
    assert!(msg.contains("ocr_rec.wasm") && msg.contains("not a PNG or JPEG"), "{msg}");

    let (status, body) = server.get("/v2/models/ocr_rec/versions/7");
    assert_eq!(status, 404);
    assert_eq!(error_of(&body), "Request for unknown model: 'ocr_rec' version 7 is not found");

    let (status, body) = server.get("/v2/no/such/route");
    assert_eq!(status, 404);
    error_of(&body);

    assert_still_serving(&server);
}

#[test]
fn tensors_the_model_cannot_take_get_400() {
    let server = Server::start(&example_repository(), &[]);
    let rec = |shape: Value, data: Value| json!({"inputs": [{"name": "x", "shape": shape, "datatype": "FP32", "data": data}]});
    let cases = [
        (rec(json!([1, 3, 48, 0]), json!([])), 400, "ONNX Runtime cannot run these inputs"),
        (rec(json!([1, 3, 48, 1_u64 << 60]), json!([])), 400, "causes total element count to exceed maximum size of"),
        (rec(json!([1, 3, 48, 4]), json!([[vec![0.0; 100]], [vec![0.0; 476]]])), 400, "nested array"),
        (rec(json!([1, 3, 48, 1]), json!(vec![1e39; 144])), 400, "out of range for FP32"),
    ];
    for (request, status, words) in cases {
        let (got, body) = server.post_json("/v2/models/ocr_rec/infer", &request);
        assert_eq!(got, status, "{body}");
        assert!(error_of(&body).contains(words), "{body}");
    }
    let mut binary = rec(json!([1, 3, 48, 1]), json!(vec![0.0; 144]));
    binary["inputs"][0]["parameters"] = json!({"binary_data_size": 576});
    let (status, body) = server.post_json("/v2/models/ocr_rec/infer", &binary);
    assert_eq!(status, 400);
    assert!(error_of(&body).contains("no inference-header-content-length header"), "{body}");

    let (status, _) = server.get("/v2/models/ocr_rec/versions/01");
    assert_eq!(status, 400, "leading zeros are not a version");
    let (status, _) = server.get("/v2/models/ocr_rec/versions/99999999999999999999");
    assert_eq!(status, 404);
    let (status, body) = server.post_bytes("/v2/models/ocr_rec/predict", "image/png", vec![]);
    assert_eq!(status, 400);
    assert!(error_of(&body).contains("empty"), "{body}");
    let (status, body) = server.post_json("/v2/repository/index", &json!({"ready": "yes"}));
    assert_eq!(status, 400, "{body}");
    assert_still_serving(&server);
}

#[test]
fn a_configuration_its_plugin_cannot_serve_fails_the_load() {
    let repo = tempfile::tempdir().unwrap();
    copy_example_model("ocr_rec", repo.path());
    copy_example_model("ocr_cls", repo.path());
    let config = repo.path().join("ocr_cls/config.pbtxt");
    let text = std::fs::read_to_string(&config).unwrap().replace("dims: [ 3, 48, 192 ]", "dims: [ 3, 32, 192 ]");
    std::fs::write(&config, text).unwrap();
    let server = Server::start(repo.path(), &["--strict-readiness", "false"]);
    let (status, body) = server.get("/v2/models/ocr_cls/ready");
    assert_eq!(status, 503);
    let msg = error_of(&body);
    assert!(
        msg.contains("ocr_cls.wasm") && msg.contains("[3, 32, 192]") && msg.contains("[3, 48 or -1, 192 or -1]"),
        "{msg}"
    );
    assert_still_serving(&server);
}

/// A repository with ocr_rec and the `faulty` test model.
fn repository_with_faulty_plugin(repo: &Path) {
    copy_example_model("ocr_rec", repo);
    add_faulty_model(repo);
}

#[test]
fn a_misbehaving_plugin_fails_its_request_and_nothing_else() {
    let repo = tempfile::tempdir().unwrap();
    repository_with_faulty_plugin(repo.path());
    let server = Server::start(repo.path(), &["--plugin-timeout-ms", "3000", "--plugin-memory-limit", "128MiB"]);

    let (status, body) = server.post_bytes("/v2/models/faulty/predict", "text/plain", b"ok".to_vec());
    assert_eq!(status, 200, "the healthy path works first: {body}");
    assert_eq!(body["outputs"][0]["shape"], json!([1, 2]));

    for (behaviour, expect) in [
        ("trap", "it panicked at faulty/src/lib.rs:36:"),
        ("loop", "exceeded its time limit of 3000 ms"),
        ("alloc", "memory allocation of 1073741824 bytes failed"),
    ] {
        let (status, body) =
            server.post_bytes("/v2/models/faulty/predict", "text/plain", behaviour.as_bytes().to_vec());
        assert_eq!(status, 500, "{behaviour}: {body}");
        let msg = error_of(&body);
        assert!(msg.contains("plugin 'faulty.wasm' of model 'faulty'") && msg.contains(expect), "{behaviour}: {msg}");

        let (status, body) = server.post_bytes("/v2/models/faulty/predict", "text/plain", b"ok".to_vec());
        assert_eq!(status, 200, "the next request after '{behaviour}' succeeds: {body}");
        assert_still_serving(&server);
    }

    let (status, body) = server.post_bytes("/v2/models/faulty/predict", "text/plain", b"bad".to_vec());
    assert_eq!(status, 400);
    assert!(error_of(&body).contains("deliberate bad input"), "{body}");
}

#[test]
fn a_model_sets_its_own_plugin_limits_and_traps_are_counted() {
    let repo = tempfile::tempdir().unwrap();
    repository_with_faulty_plugin(repo.path());
    let config = repo.path().join("faulty/config.pbtxt");
    let limits = r#"
        parameters { key: "plugin.timeout_ms" value: { string_value: "1000" } }
        parameters { key: "plugin.memory_limit" value: { string_value: "64MiB" } }
        parameters { key: "plugin.instances" value: { string_value: "1" } }"#;
    std::fs::write(&config, std::fs::read_to_string(&config).unwrap() + limits).unwrap();
    let server = Server::start(repo.path(), &["--plugin-timeout-ms", "60000"]);
    let (status, body) = server.post_bytes("/v2/models/faulty/predict", "text/plain", b"loop".to_vec());
    assert_eq!(status, 500, "the model's own 1000 ms, not the server's 60000 ms: {body}");
    assert!(error_of(&body).contains("time limit of 1000 ms"), "{body}");
    let (status, body) = server.post_bytes("/v2/models/faulty/predict", "text/plain", b"ok".to_vec());
    assert_eq!(status, 200, "{body}");
    let series = |family: &str| server.metric(&format!("{family}{{model=\"faulty\",version=\"1\"}}"));
    assert_eq!(series("plinth_plugin_traps_total"), 1.0);
    assert_eq!(series("plinth_plugin_instance_starts_total"), 2.0, "the first instance, and its replacement");

    std::fs::write(&config, std::fs::read_to_string(&config).unwrap().replace("\"64MiB\"", "\"lots\"")).unwrap();
    let strict = ["--model-control-mode", "explicit", "--strict-readiness", "false"];
    let server = Server::start(repo.path(), &strict);
    let (status, body) = server.post_json("/v2/repository/models/faulty/load", &json!({}));
    assert_eq!(status, 400, "{body}");
    assert!(error_of(&body).contains("'plugin.memory_limit' must be a size such as 512MiB, got 'lots'"), "{body}");
}

#[test]
fn a_config_that_does_not_match_its_model_fails_only_that_model() {
    let repo = tempfile::tempdir().unwrap();
    copy_example_model("ocr_rec", repo.path());
    copy_example_model("ocr_cls", repo.path());
    let config = repo.path().join("ocr_cls/config.pbtxt");
    let text = std::fs::read_to_string(&config).unwrap().replace("dims: [ 3, 48, 192 ]", "dims: [ 1, 48, 192 ]");
    std::fs::write(&config, text).unwrap();
    let server = Server::start(repo.path(), &["--strict-readiness", "false"]);

    let (status, body) = server.get("/v2/models/ocr_cls/ready");
    assert_eq!(status, 503);
    let msg = error_of(&body);
    assert!(msg.contains("input 'x'") && msg.contains("dimension 0 is 1") && msg.contains("but 3"), "{msg}");
    let (status, body) = server.post_bytes("/v2/models/ocr_cls/predict", "image/png", fixture("cls_upright.png"));
    assert_eq!(status, 503);
    assert!(error_of(&body).contains("input 'x'"), "{body}");

    let (_, index) = server.post_json("/v2/repository/index", &json!({}));
    let row = index.as_array().unwrap().iter().find(|r| r["name"] == "ocr_cls").unwrap().clone();
    assert_eq!(row["state"], "UNAVAILABLE");
    assert!(row["reason"].as_str().unwrap().contains("input 'x'"), "{row}");
    assert!(server.log().contains("input 'x'"), "the reason is logged too");

    assert_still_serving(&server);
    assert_eq!(server.get("/v2/health/ready").0, 200, "not strict: ready with one model down");
}

#[test]
fn strict_readiness_waits_for_every_model() {
    let repo = tempfile::tempdir().unwrap();
    copy_example_model("ocr_rec", repo.path());
    std::fs::create_dir_all(repo.path().join("broken/1")).unwrap();
    std::fs::write(repo.path().join("broken/config.pbtxt"), "max_batchsize: 4").unwrap();
    let server = Server::start(repo.path(), &[]);
    assert_eq!(server.get("/v2/health/ready").0, 503);
    let (status, body) = server.get("/v2/models/broken");
    assert_eq!(status, 503);
    assert!(error_of(&body).contains("max_batchsize"), "the parse error names the unknown field: {body}");
    assert_still_serving(&server);
}

#[test]
fn a_missing_onnx_runtime_library_is_a_clear_start_up_error() {
    let out = std::process::Command::new(plinth_tests::binary())
        .args(["serve", "--http-port", "0", "--model-repository"])
        .arg(example_repository())
        .env("ORT_DYLIB_PATH", "/nonexistent/libonnxruntime.so")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ORT_DYLIB_PATH") && !stderr.contains("panicked"), "{stderr}");

    let not_a_library = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(not_a_library.path(), b"not a shared library").unwrap();
    let out = std::process::Command::new(plinth_tests::binary())
        .args(["serve", "--http-port", "0", "--model-repository"])
        .arg(example_repository())
        .env("ORT_DYLIB_PATH", not_a_library.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ORT_DYLIB_PATH") && !stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_plugin_sees_only_its_own_version_folder_read_only() {
    let repo = tempfile::tempdir().unwrap();
    repository_with_faulty_plugin(repo.path());
    let server = Server::start(repo.path(), &[]);
    let (status, body) = server.post_bytes("/v2/models/faulty/predict", "text/plain", b"sandbox".to_vec());
    assert_eq!(status, 400, "{body}");
    let msg = error_of(&body);
    let report: Value = serde_json::from_str(msg.split_once(": ").unwrap().1).unwrap();
    assert_eq!(
        report,
        json!({
            "read_own_model_file": true,
            "list_own_folder": true,
            "write_own_folder": false,
            "read_outside": false,
            "read_host_file": false,
            "environment": 0,
            "arguments": 0,
            "tcp_connect": false,
        })
    );
    assert!(!repo.path().join("faulty/1/written-by-plugin").exists());
}

#[test]
fn a_body_over_the_limit_gets_413() {
    let server = Server::start(&example_repository(), &["--http-max-body-bytes", "1KiB"]);
    let (status, body) = server.post_bytes("/v2/models/ocr_rec/predict", "image/png", fixture("line_serif.png"));
    assert_eq!(status, 413, "{body}");
    assert!(
        error_of(&body).contains("exceeds the maximum allowed input size of 1024 bytes (--http-max-body-bytes)"),
        "{body}"
    );
    let (status, body) = server.post_bytes("/v2/repository/index", "application/json", vec![b' '; 2048]);
    assert_eq!(status, 413, "{body}");
    let (status, _) = server.post_bytes("/v2/models/ocr_cls/predict", "image/png", vec![0; 100]);
    assert_eq!(status, 400, "small bodies still pass");
}

#[test]
fn a_plugin_that_fails_its_warm_up_sample_never_makes_its_model_ready() {
    let repo = tempfile::tempdir().unwrap();
    repository_with_faulty_plugin(repo.path());
    // The same plugin twice: `faulty` warms up with a body that traps in
    // preprocess, `faulty_ok` with one it answers.
    copy_dir(&repo.path().join("faulty"), &repo.path().join("faulty_ok"));
    for (model, body) in [("faulty", "trap"), ("faulty_ok", "ok")] {
        let dir = repo.path().join(model);
        std::fs::create_dir_all(dir.join("warmup")).unwrap();
        std::fs::write(dir.join("warmup/sample.txt"), body).unwrap();
        let config = dir.join("config.pbtxt");
        let sample = r#"
            parameters { key: "plugin.warmup" value: { string_value: "sample.txt" } }
            parameters { key: "plugin.warmup_content_type" value: { string_value: "text/plain" } }"#;
        std::fs::write(&config, std::fs::read_to_string(&config).unwrap() + sample).unwrap();
    }
    let server = Server::start(repo.path(), &["--strict-readiness", "true"]);

    let (status, body) = server.get("/v2/models/faulty/ready");
    assert_eq!(status, 503, "READY although every request would fail: {body}");
    let (_, index) = server.post_json("/v2/repository/index", &json!({}));
    let faulty = index.as_array().unwrap().iter().find(|m| m["name"] == "faulty").unwrap();
    let reason = faulty["reason"].as_str().unwrap();
    assert!(
        reason.contains("plugin warm-up sample 'sample.txt' failed")
            && reason.contains("it panicked at faulty/src/lib.rs:36:"),
        "{reason}"
    );
    assert_eq!(server.get("/v2/health/ready").0, 503, "strict readiness counts the failed model");
    assert_eq!(server.get("/v2/models/faulty_ok/ready").0, 200);
    let warmed = |family: &str| server.metric(&format!("{family}{{model=\"faulty_ok\",version=\"1\"}}"));
    assert_eq!(warmed("nv_inference_request_success"), 1.0, "the sample ran through the model");
    assert_still_serving(&server);
}

#[test]
fn consecutive_plugin_failures_are_counted_until_a_call_succeeds() {
    let repo = tempfile::tempdir().unwrap();
    repository_with_faulty_plugin(repo.path());
    let server = Server::start(repo.path(), &[]);
    let failures = || server.metric("plinth_plugin_consecutive_failures{model=\"faulty\",version=\"1\"}");
    let post = |body: &str| server.post_bytes("/v2/models/faulty/predict", "text/plain", body.as_bytes().to_vec()).0;
    assert_eq!(failures(), 0.0);
    for n in 1..=3 {
        assert_eq!(post("trap"), 500);
        assert_eq!(failures(), f64::from(n));
    }
    assert_eq!(post("bad"), 400);
    assert_eq!(failures(), 0.0, "a refused request is a call that did not fail");
    assert_eq!(post("trap"), 500);
    assert_eq!(post("ok"), 200);
    assert_eq!(failures(), 0.0);
}

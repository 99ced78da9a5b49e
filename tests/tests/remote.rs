//! The remote backend, end to end: one Plinth process serves ocr_cls, a
//! second serves it through `backend: "remote"` with the ocr_cls plugin,
//! beside a local model. Answers match the direct ones; a stopped, hung or
//! restarted remote gives clear 503s and then service again, while the local
//! model keeps answering; a configuration that does not fit the remote's
//! metadata is refused at load; `remote.repository_control` loads the
//! remote model and unloads it once no local model uses it.

use std::path::Path;

use plinth_client::{Client, InferInput, InferRequest, RetryPolicy};
use plinth_tests::{Server, built_plugin, copy_dir, example_repository, fixture, wait_until};
use serde_json::{Value, json};

const CLS_OUTPUT: &str = "save_infer_model/scale_0.tmp_1";

/// A repository with only the example ocr_cls, for the remote server.
fn remote_repository() -> tempfile::TempDir {
    let repo = tempfile::tempdir().unwrap();
    copy_dir(&example_repository().join("ocr_cls"), &repo.path().join("ocr_cls"));
    repo
}

/// How long the front waits for its remote, in ms: only the hung-remote
/// test waits for the limit; for the others it is a hang guard, far above
/// what a loaded machine takes to answer (or to load the remote model).
const PATIENT_MS: u32 = 60_000;

/// Adds `remote_cls` (ocr_cls at `url`, with its plugin and `extra` config
/// lines) and a local ocr_cls copy, `local_cls`, to `repo`.
fn add_front_models(repo: &Path, url: &str, extra: &str) {
    add_front_models_waiting(repo, url, extra, PATIENT_MS);
}

/// [`add_front_models`] with `remote.timeout_ms` = `timeout_ms`.
fn add_front_models_waiting(repo: &Path, url: &str, extra: &str, timeout_ms: u32) {
    let dir = repo.join("remote_cls");
    std::fs::create_dir_all(dir.join("1")).unwrap();
    std::fs::copy(built_plugin("ocr_cls.wasm"), dir.join("ocr_cls.wasm")).unwrap();
    let config = format!(
        r#"backend: "remote"
        max_batch_size: 8
        dynamic_batching {{ }}
        parameters {{ key: "remote.url" value {{ string_value: "{url}" }} }}
        parameters {{ key: "remote.model" value {{ string_value: "ocr_cls" }} }}
        parameters {{ key: "remote.timeout_ms" value {{ string_value: "{timeout_ms}" }} }}
        parameters {{ key: "plugin" value {{ string_value: "ocr_cls.wasm" }} }}
        {extra}"#
    );
    std::fs::write(dir.join("config.pbtxt"), config).unwrap();
    copy_dir(&example_repository().join("ocr_cls"), &repo.join("local_cls"));
    let local = repo.join("local_cls/config.pbtxt");
    let text = std::fs::read_to_string(&local).unwrap().replace("name: \"ocr_cls\"", "name: \"local_cls\"");
    std::fs::write(local, text).unwrap();
}

fn classify(server: &Server, model: &str, file: &str) -> (u16, Value) {
    server.post_bytes(&format!("/v2/models/{model}/predict"), "image/png", fixture(file))
}

fn rows(seed: usize) -> InferRequest {
    let x: Vec<f32> = (0..2 * 3 * 48 * 192).map(|i| ((i * 31 + seed * 977) % 257) as f32 / 128.0 - 1.0).collect();
    InferRequest::new(vec![InferInput::fp32("x", &[2, 3, 48, 192], &x)])
}

fn scores(server: &Server, model: &str) -> Vec<f32> {
    let client = Client::new(server.base()).with_retry(RetryPolicy::NEVER);
    let response = client.infer(model, &rows(5)).unwrap_or_else(|e| panic!("{model}: {e}"));
    response.output(CLS_OUTPUT).unwrap().to_f32().unwrap()
}

/// Asserts a 503 whose error names the remote (a hang would fail the test
/// client's own timeout).
fn assert_remote_unavailable(front: &Server, remote_url: &str, what: &str) {
    let (status, body) = classify(front, "remote_cls", "cls_rotated.png");
    assert_eq!(status, 503, "{what}: {body}");
    let error = body["error"].as_str().unwrap();
    assert!(error.contains(remote_url) && error.contains("ocr_cls"), "{what}: {error}");
}

#[test]
fn a_remote_model_answers_like_the_direct_one_and_survives_its_remote_going_away() {
    let remote_repo = remote_repository();
    let remote = Server::start(remote_repo.path(), &[]);
    let url = remote.base().to_owned();
    let front_repo = tempfile::tempdir().unwrap();
    add_front_models(front_repo.path(), &url, "");
    let front = Server::start(front_repo.path(), &[]);

    for (file, angle) in [("cls_upright.png", 0), ("cls_rotated.png", 180)] {
        let (status, through) = classify(&front, "remote_cls", file);
        let (_, direct) = classify(&remote, "ocr_cls", file);
        assert_eq!((status, &through["angle"]), (200, &json!(angle)), "{file}: {through}");
        assert_eq!(through, direct, "{file}");
    }
    assert_eq!(scores(&front, "remote_cls"), scores(&remote, "ocr_cls"));
    let (_, meta) = front.get("/v2/models/remote_cls");
    assert_eq!(meta["platform"], "onnxruntime_onnx", "the remote's metadata: {meta}");
    let success = "nv_inference_request_success{model=\"remote_cls\",version=\"1\"}";
    assert_eq!(front.metric(success), 3.0);

    let port = remote.port();
    drop(remote);
    assert_remote_unavailable(&front, &url, "remote stopped");
    assert_eq!(classify(&front, "local_cls", "cls_rotated.png").0, 200, "the local model keeps serving");
    assert_eq!(front.get("/v2/health/live").0, 200);

    let _remote = Server::start_on(port, remote_repo.path(), &[]);
    let (status, body) = classify(&front, "remote_cls", "cls_rotated.png");
    assert_eq!((status, &body["angle"]), (200, &json!(180)), "after the remote restarted: {body}");
}

#[test]
fn a_hung_remote_gives_503_after_the_timeout() {
    let remote_repo = remote_repository();
    let remote = Server::start(remote_repo.path(), &[]);
    let front_repo = tempfile::tempdir().unwrap();
    add_front_models_waiting(front_repo.path(), remote.base(), "", 1000);
    let front = Server::start(front_repo.path(), &[]);
    let signal = |name: &str| {
        let status = std::process::Command::new("kill").args([name, &remote.pid().to_string()]).status().unwrap();
        assert!(status.success());
    };
    signal("-STOP");
    let (status, body) = classify(&front, "remote_cls", "cls_upright.png");
    signal("-CONT");
    assert_eq!(status, 503, "{body}");
    assert!(body["error"].as_str().unwrap().contains("did not answer within remote.timeout_ms = 1000 ms"), "{body}");
    // Once it resumes, it answers again (however slowly the machine wakes it).
    wait_until("the resumed remote serves again", || classify(&front, "remote_cls", "cls_upright.png").0 == 200);
}

#[test]
fn a_remote_that_does_not_fit_the_configuration_or_is_absent_fails_the_load() {
    let remote_repo = remote_repository();
    let remote = Server::start(remote_repo.path(), &[]);
    let repo = tempfile::tempdir().unwrap();
    add_front_models(
        repo.path(),
        remote.base(),
        r#"input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, 48, 100 ] } ]"#,
    );
    let front = Server::start(repo.path(), &["--model-control-mode", "explicit"]);
    let (status, body) = front.post_json("/v2/repository/models/remote_cls/load", &json!({}));
    assert_eq!(status, 400, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(error.contains("input 'x'") && error.contains("100") && error.contains("192"), "{error}");

    let absent = tempfile::tempdir().unwrap();
    add_front_models(absent.path(), "http://127.0.0.1:9", "");
    let front = Server::start(absent.path(), &["--model-control-mode", "explicit"]);
    let (status, body) = front.post_json("/v2/repository/models/remote_cls/load", &json!({}));
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("http://127.0.0.1:9 cannot be reached"), "{body}");
}

#[test]
fn repository_control_loads_and_unloads_the_remote_model() {
    let remote_repo = remote_repository();
    let remote = Server::start(remote_repo.path(), &["--model-control-mode", "explicit"]);
    let state = |server: &Server| {
        let (_, index) = server.post_json("/v2/repository/index", &json!({}));
        index.as_array().unwrap().iter().find(|r| r["name"] == "ocr_cls").map(|r| r["state"].clone())
    };
    assert_ne!(state(&remote), Some(json!("READY")));
    let repo = tempfile::tempdir().unwrap();
    let control = r#"parameters { key: "remote.repository_control" value { string_value: "1" } }"#;
    add_front_models(repo.path(), remote.base(), control);
    let front = Server::start(repo.path(), &["--model-control-mode", "explicit"]);
    let (status, body) = front.post_json("/v2/repository/models/remote_cls/load", &json!({}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(state(&remote), Some(json!("READY")));
    assert_eq!(classify(&front, "remote_cls", "cls_rotated.png").1["angle"], 180);
    // A second local model on the same remote model, and a reload of the
    // first: neither may unload it while a local model uses it.
    copy_dir(&repo.path().join("remote_cls"), &repo.path().join("second_cls"));
    // The decision to unload the remote one is logged when it is made,
    // before the response.
    let unloading = "unloading the remote model";
    for (model, action) in [("second_cls", "load"), ("remote_cls", "load"), ("remote_cls", "unload")] {
        let (status, body) = front.post_json(&format!("/v2/repository/models/{model}/{action}"), &json!({}));
        assert_eq!(status, 200, "{model} {action}: {body}");
        assert_eq!(front.log_count(unloading), 0, "after {model} {action}: {}", front.log());
        assert_eq!(state(&remote), Some(json!("READY")), "after {model} {action}");
    }
    assert_eq!(classify(&front, "second_cls", "cls_rotated.png").1["angle"], 180);
    let (status, body) = front.post_json("/v2/repository/models/second_cls/unload", &json!({}));
    assert_eq!(status, 200, "{body}");
    // The server's log is read by another thread of this test: wait for it.
    wait_until("the remote model's unload is logged", || front.log_count(unloading) == 1);
    wait_until("the remote model is unloaded", || state(&remote) != Some(json!("READY")));
}

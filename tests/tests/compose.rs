//! Composition from plugins (`plinth:plugin/inference`, WIT 0.2 and 0.3) and the
//! versioned contract, end to end: a plugin runs another model's plugin and
//! model and its own model again; a call that would close a cycle or go too
//! deep fails only that request, with the path in the error; a callee's
//! failure reaches the plugin as a value; a plugin built against WIT 0.1
//! (a prebuilt fixture) still loads and answers.

use std::path::Path;

use plinth_tests::{Server, add_faulty_model, copy_dir, example_repository, fixture, root};
use serde_json::Value;

/// Adds the faulty test plugin's model as `name` (`plugins/faulty`).
fn add_composer(repo: &Path, name: &str) {
    let scratch = tempfile::tempdir().unwrap();
    add_faulty_model(scratch.path());
    copy_dir(&scratch.path().join("faulty"), &repo.join(name));
    let config = repo.join(name).join("config.pbtxt");
    let text = std::fs::read_to_string(&config).unwrap().replace("name: \"faulty\"", &format!("name: \"{name}\""));
    std::fs::write(config, text).unwrap();
}

fn predict(server: &Server, model: &str, body: &str) -> (u16, Value) {
    server.post_bytes(&format!("/v2/models/{model}/predict"), "text/plain", body.as_bytes().to_vec())
}

fn error(body: &Value) -> &str {
    body["error"].as_str().unwrap_or_else(|| panic!("no error in {body}"))
}

#[test]
fn a_plugin_runs_other_models_and_its_own_through_the_host() {
    let repo = tempfile::tempdir().unwrap();
    for name in ["a", "b"] {
        add_composer(repo.path(), name);
    }
    let limit = |model: &str, ms: u32| {
        let config = repo.path().join(model).join("config.pbtxt");
        let limit = format!(r#"parameters {{ key: "plugin.timeout_ms" value: {{ string_value: "{ms}" }} }}"#);
        std::fs::write(&config, std::fs::read_to_string(&config).unwrap() + &limit).unwrap();
    };
    // a may run for 2000 ms; b sleeps 5000 ms inside a's call (and may run
    // for ten minutes, a bound that only guards against a hang).
    limit("a", 2000);
    limit("b", 600_000);
    let server = Server::start(repo.path(), &[]);
    let (status, direct) = predict(&server, "b", "ok");
    assert_eq!(status, 200, "{direct}");
    let (status, through_a) = predict(&server, "a", "call:b/ok");
    assert_eq!((status, &through_a), (200, &direct), "a's answer is b's");
    let (status, nested) = predict(&server, "a", "call:b/self-infer");
    assert_eq!((status, &nested), (200, &direct), "b ran its own model again, through the host");
    // b's 5000 ms are b's time, not a's: a's own 2000 ms limit still holds.
    let (status, body) = predict(&server, "a", "call:b/sleep:5000");
    assert_eq!((status, &body), (200, &direct), "time in a composed call does not count against the caller");
    let executions = |m: &str| server.metric(&format!("nv_inference_exec_count{{model=\"{m}\",version=\"1\"}}"));
    assert_eq!((executions("a"), executions("b")), (3.0, 5.0), "each model ran through its own scheduler");
}

#[test]
fn cycles_and_runaway_depth_fail_that_request_only() {
    let repo = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    for name in &names {
        add_composer(repo.path(), name);
    }
    let server = Server::start(repo.path(), &[]);

    let (status, body) = predict(&server, "m0", "call:m0");
    assert_eq!(status, 500, "{body}");
    assert!(error(&body).contains("would be a cycle (m0 → m0)"), "{body}");

    let (status, body) = predict(&server, "m0", "call:m1/call:m2/call:m0");
    assert_eq!(status, 500, "{body}");
    assert!(error(&body).contains("(m0 → m1 → m2 → m0); nothing ran"), "{body}");

    let deep: String = names[1..].iter().map(|n| format!("call:{n}/")).collect::<String>() + "ok";
    let (status, body) = predict(&server, "m0", &deep);
    assert_eq!(status, 500, "{body}");
    assert!(error(&body).contains("more than 8 plugins"), "{body}");
    let shallow: String = names[1..8].iter().map(|n| format!("call:{n}/")).collect::<String>() + "ok";
    assert_eq!(predict(&server, "m0", &shallow).0, 200, "eight plugins deep is allowed");

    let (status, body) = predict(&server, "m0", "call:absent");
    assert_eq!(status, 404, "passed on unchanged, the callee's error keeps its class: {body}");
    assert!(error(&body).contains("model 'absent'"), "the callee's error reaches the caller: {body}");
    let (status, body) = predict(&server, "m0", "call:m1/bad");
    assert_eq!(status, 400, "the callee's bad-input stays bad input: {body}");
    assert!(error(&body).contains("deliberate bad input"), "{body}");

    assert_eq!(predict(&server, "m0", "ok").0, 200, "the server keeps serving");
    assert_eq!(server.get("/v2/health/ready").0, 200);
}

#[test]
fn plugins_built_against_wit_0_1_and_0_3_still_load_and_answer() {
    for old in ["plugin_v0_1", "plugin_v0_3"] {
        let repo = tempfile::tempdir().unwrap();
        copy_dir(&example_repository().join("ocr_cls"), &repo.path().join("ocr_cls"));
        let wasm = root().join(format!("tests/fixtures/{old}/ocr_cls.wasm"));
        std::fs::copy(wasm, repo.path().join("ocr_cls/ocr_cls.wasm")).unwrap();
        let server = Server::start(repo.path(), &[]);
        let (status, body) = server.post_bytes("/v2/models/ocr_cls/predict", "image/png", fixture("cls_rotated.png"));
        assert_eq!((status, &body["angle"]), (200, &serde_json::json!(180)), "{old}: {body}");
    }
}

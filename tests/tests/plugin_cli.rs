//! The plugin author's path through the real binary: `plinth plugin new`
//! makes a crate that builds as is, `plinth plugin check` names the
//! contract version of it and of the prebuilt 0.1 fixture, and the new
//! plugin serves a model; so does a plugin written in Python
//! (`plugins/python-doubler`, built by componentize-py).

use std::path::Path;
use std::process::Command;

use plinth_tests::{Server, add_model, binary, built_plugin, root};
use serde_json::json;

fn plinth(args: &[&str]) -> (bool, String) {
    let out = Command::new(binary()).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// Serves `doubler` (y = 2x on rows of 4, `tests/fixtures/slow_model.onnx`)
/// behind the plugin `wasm`.
fn serve_doubler(wasm: &Path) -> (tempfile::TempDir, Server) {
    let repo = tempfile::tempdir().unwrap();
    let file = wasm.file_name().unwrap().to_str().unwrap();
    let config = format!(r#"max_batch_size: 4 parameters {{ key: "plugin" value: {{ string_value: "{file}" }} }}"#);
    add_model(repo.path(), "doubler", &root().join("tests/fixtures/slow_model.onnx"), &config);
    std::fs::copy(wasm, repo.path().join("doubler").join(file)).unwrap();
    let server = Server::start(repo.path(), &[]);
    (repo, server)
}

#[test]
fn a_new_plugin_crate_builds_as_is_and_serves_a_model() {
    let work = tempfile::tempdir().unwrap();
    let parent = work.path().to_str().unwrap();
    let (ok, text) = plinth(&["plugin", "new", "doubler-io", "--path", parent]);
    assert!(ok, "{text}");
    // The plugins' lockfile pins what it builds (cargo keeps its versions
    // and only adds the new crate), and their target folder already holds
    // the SDK's dependencies: nothing is resolved anew or downloaded.
    let target = root().join("plugins/target");
    let crate_dir = work.path().join("doubler-io");
    std::fs::copy(root().join("plugins/Cargo.lock"), crate_dir.join("Cargo.lock")).unwrap();
    let status = Command::new("cargo")
        .args(["build", "--release", "--quiet", "--offline"])
        .current_dir(&crate_dir)
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .unwrap();
    assert!(status.success(), "the new crate does not build");
    let wasm = target.join("wasm32-wasip2/release/doubler_io.wasm");
    let (ok, text) = plinth(&["plugin", "check", wasm.to_str().unwrap()]);
    assert!(ok && text.contains("built against plinth:plugin@0.4.0; this host runs it"), "{text}");

    let (_repo, server) = serve_doubler(&wasm);
    let (status, body) = server.post_json("/v2/models/doubler/predict", &json!({ "data": [1, 2, 3, 4] }));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outputs"][0]["data"], json!([2.0, 4.0, 6.0, 8.0]), "{body}");
    let (status, body) = server.post_json("/v2/models/doubler/predict", &json!({ "data": "four" }));
    assert_eq!(status, 400, "{body}");
}

#[test]
fn plugin_check_names_the_contract_version_or_why_it_cannot_run() {
    for (old, version) in [("plugin_v0_1", "0.1.0"), ("plugin_v0_3", "0.3.0")] {
        let old = root().join(format!("tests/fixtures/{old}/ocr_cls.wasm"));
        let (ok, text) = plinth(&["plugin", "check", old.to_str().unwrap()]);
        assert!(ok && text.contains(&format!("built against plinth:plugin@{version}")), "{text}");
    }
    let not_wasm = root().join("tests/fixtures/page.png");
    let (ok, text) = plinth(&["plugin", "check", not_wasm.to_str().unwrap()]);
    assert!(!ok && text.contains("cannot compile"), "{text}");
}

#[test]
fn a_plugin_written_in_python_serves_a_model() {
    let wasm = built_plugin("python_doubler.wasm");
    let (ok, text) = plinth(&["plugin", "check", wasm.to_str().unwrap()]);
    assert!(ok && text.contains("plinth:plugin@0.2.0"), "{text}");
    let (_repo, server) = serve_doubler(&wasm);
    let (status, body) = server.post_json("/v2/models/doubler/predict", &json!({ "data": [1.5, -2, 3, 4] }));
    assert_eq!((status, &body), (200, &json!({ "outputs": [3.0, -4.0, 6.0, 8.0] })));
    let (status, body) = server.post_json("/v2/models/doubler/predict", &json!({ "data": "x" }));
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("expected {\"data\": [numbers]}"), "{body}");
}

//! The plugin author's path through the real binary: `plinth plugin new`
//! makes a crate that builds as is (a request handler, or with
//! `--generation` a generative model's tokenizer that serves SmolLM2), `plinth plugin check` names the
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

/// Runs `plinth plugin new NAME` with `flags` in `work` and builds the
/// crate; returns its `.wasm`.
fn new_plugin(work: &Path, name: &str, flags: &[&str]) -> std::path::PathBuf {
    let parent = work.to_str().unwrap();
    let (ok, text) = plinth(&[&["plugin", "new", name, "--path", parent], flags].concat());
    assert!(ok, "{text}");
    // The plugins' lockfile pins what it builds (cargo keeps its versions
    // and only adds the new crate), and their target folder already holds
    // the SDK's dependencies: nothing is resolved anew or downloaded.
    let target = root().join("plugins/target");
    let crate_dir = work.join(name);
    std::fs::copy(root().join("plugins/Cargo.lock"), crate_dir.join("Cargo.lock")).unwrap();
    let status = Command::new("cargo")
        .args(["build", "--release", "--quiet", "--offline"])
        .current_dir(&crate_dir)
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .unwrap();
    assert!(status.success(), "the new crate does not build");
    target.join(format!("wasm32-wasip2/release/{}.wasm", name.replace('-', "_")))
}

#[test]
fn a_new_plugin_crate_builds_as_is_and_serves_a_model() {
    let work = tempfile::tempdir().unwrap();
    let wasm = new_plugin(work.path(), "doubler-io", &[]);
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
fn a_new_generation_plugin_crate_builds_as_is_and_serves_an_llm_as_transformers_writes() {
    let work = tempfile::tempdir().unwrap();
    let wasm = new_plugin(work.path(), "my-llm", &["--generation"]);
    let (ok, text) = plinth(&["plugin", "check", wasm.to_str().unwrap()]);
    assert!(ok && text.contains("built against plinth:plugin@0.4.0"), "{text}");
    // SmolLM2's fp32 export behind the new plugin: the weights linked, the
    // files the sandboxed plugin reads copied into its version folder.
    let export = root().join(".cache/smollm2");
    let repo = tempfile::tempdir().unwrap();
    let version = repo.path().join("llm/1");
    std::fs::create_dir_all(&version).unwrap();
    for file in std::fs::read_dir(export.join("fp32")).unwrap() {
        let file = file.unwrap().path();
        let to = version.join(file.file_name().unwrap());
        if file.file_name().unwrap().to_str().unwrap().starts_with("model.onnx") {
            std::os::unix::fs::symlink(&file, &to).unwrap();
        } else {
            std::fs::copy(&file, &to).unwrap();
        }
    }
    std::fs::copy(&wasm, repo.path().join("llm/my_llm.wasm")).unwrap();
    let config = r#"backend: "onnxruntime" model_transaction_policy { decoupled: true }
        parameters { key: "plugin" value: { string_value: "my_llm.wasm" } }
        parameters { key: "generation.context_length" value: { string_value: "256" } }"#;
    std::fs::write(repo.path().join("llm/config.pbtxt"), config).unwrap();
    let server = Server::start(repo.path(), &[]);
    let reference: serde_json::Value =
        serde_json::from_slice(&std::fs::read(export.join("reference.json")).unwrap()).unwrap();
    for kind in ["completion", "chat"] {
        let case = reference["cases"].as_array().unwrap().iter().find(|c| c["kind"] == kind).unwrap();
        let (route, prompt) = match kind {
            "chat" => ("/v1/chat/completions", json!({ "messages": case["prompt"] })),
            _ => ("/v1/completions", json!({ "prompt": case["prompt"] })),
        };
        let mut body = json!({ "model": "llm", "temperature": 0, "max_tokens": 8 });
        body.as_object_mut().unwrap().extend(prompt.as_object().unwrap().clone());
        let (status, answer) = server.post_json(route, &body);
        assert_eq!(status, 200, "{answer}");
        let choice = &answer["choices"][0];
        let text = choice["text"].as_str().or(choice["message"]["content"].as_str()).unwrap();
        assert!(text.len() > 4 && case["text"].as_str().unwrap().starts_with(text), "{kind}: {text:?} vs {case}");
    }
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

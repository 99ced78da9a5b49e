//! The bundle `make dist` builds (`scripts/dist.sh`): written to a fresh
//! temporary folder and run with an empty environment (no venv, no
//! `ORT_DYLIB_PATH`, no cargo, no `LD_LIBRARY_PATH`), it serves the example
//! repository, ONNX and TorchScript models included, and `plinth health`
//! (the container image's health check) reports it ready.

use std::process::Command;

use plinth_tests::{Server, example_repository, fixture, root};

#[test]
fn the_bundle_serves_the_example_repository_from_an_empty_environment() {
    let work = tempfile::tempdir().unwrap();
    let bundle = work.path().join("plinth");
    let status = Command::new(root().join("scripts/dist.sh")).arg(&bundle).status().unwrap();
    assert!(status.success(), "scripts/dist.sh failed");
    let mut command = Command::new(bundle.join("bin/plinth"));
    command.env_clear();
    let server = Server::spawn(command, 0, &example_repository(), &[]);
    let (status, body) = server.post_bytes("/v2/models/ocr_rec/predict", "image/png", fixture("line_hello.png"));
    assert_eq!((status, body["text"].as_str()), (200, Some("Hello World")), "{body}");
    assert_eq!(server.get("/v2/models/mobilenet_v2_torchscript/ready").0, 200, "libtorch came from the bundle");
    // The image's health check: `plinth health` on the ready server.
    let health = Command::new(bundle.join("bin/plinth")).args(["health", "--url", server.base()]).env_clear().status();
    assert!(health.unwrap().success());
    // The libraries in use are the bundle's, not the build tree's.
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", server.pid())).unwrap();
    for library in ["libonnxruntime.so", "libtorch_cpu.so", "libc10.so"] {
        let from: Vec<&str> =
            maps.lines().filter_map(|l| l.split_whitespace().nth(5)).filter(|p| p.ends_with(library)).collect();
        assert!(
            !from.is_empty() && from.iter().all(|p| p.starts_with(bundle.to_str().unwrap())),
            "{library}: {from:?}"
        );
    }
}

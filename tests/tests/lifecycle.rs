//! Replacing, breaking and removing models while traffic flows: hot swap in
//! poll mode, failed loads in explicit mode, half-copied files, unload and
//! shutdown with requests in flight.

use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use plinth_tests::{Server, add_faulty_model, copy_dir, copy_example_model, example_repository, fixture, wait_until};
use serde_json::{Value, json};

/// An unversioned `/infer` on ocr_cls with a zero image: `(status, version
/// that answered, class probabilities)`.
fn infer_cls(server: &Server) -> (u16, String, Vec<f64>) {
    let request = json!({"inputs": [{"name": "x", "shape": [1, 3, 48, 192], "datatype": "FP32", "data": vec![0.0f32; 3 * 48 * 192]}]});
    let (status, body) = server.post_json("/v2/models/ocr_cls/infer", &request);
    let version = body["model_version"].as_str().unwrap_or_default().to_owned();
    let probs = body["outputs"][0]["data"]
        .as_array()
        .map_or_else(Vec::new, |a| a.iter().map(|v| v.as_f64().unwrap()).collect());
    (status, version, probs)
}

fn index_row(server: &Server, model: &str, version: &str) -> Option<Value> {
    let (_, index) = server.post_json("/v2/repository/index", &json!({}));
    let same_version = |r: &Value| r["version"].as_str().unwrap_or_default() == version;
    index.as_array().unwrap().iter().find(|r| r["name"] == model && same_version(r)).cloned()
}

/// Adds `faulty` with a plugin time limit that only guards against a hang:
/// its `wait:NAME` requests stay in flight until the test creates NAME.
fn add_holding_model(repo: &std::path::Path) {
    add_faulty_model(repo);
    let config = repo.join("faulty/config.pbtxt");
    let limit = r#"parameters { key: "plugin.timeout_ms" value: { string_value: "600000" } }"#;
    std::fs::write(&config, std::fs::read_to_string(&config).unwrap() + limit).unwrap();
}

/// Lets the faulty model's `wait:release` requests finish.
fn release(repo: &std::path::Path) {
    std::fs::write(repo.join("faulty/1/release"), b"").unwrap();
}

#[test]
fn poll_mode_swaps_versions_under_load_without_a_failed_request() {
    let repo = tempfile::tempdir().unwrap();
    copy_example_model("ocr_cls", repo.path());
    let server = Server::start(repo.path(), &["--model-control-mode", "poll", "--repository-poll-secs", "1"]);
    let (_, v1, reference) = infer_cls(&server);
    assert_eq!(v1, "1");

    let stop = AtomicBool::new(false);
    // (sent, received, status, version) of every unversioned request.
    let answers = Mutex::new(Vec::new());
    let mut last_not_ready_sent = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let sent = Instant::now();
                let (status, version, probs) = infer_cls(&server);
                assert!(status != 200 || probs == reference, "a wrong answer from version {version}: {probs:?}");
                answers.lock().unwrap().push((sent, Instant::now(), status, version));
            }
        });
        wait_until("version 1 answered under load", || answers.lock().unwrap().iter().any(|a| a.3 == "1"));
        copy_dir(&repo.path().join("ocr_cls/1"), &repo.path().join("ocr_cls/2"));
        wait_until("version 2 is ready", || {
            let sent = Instant::now();
            let ready = server.get("/v2/models/ocr_cls/versions/2/ready").0 == 200;
            if !ready {
                last_not_ready_sent = sent;
            }
            ready
        });
        wait_until("version 1 is unloaded", || index_row(&server, "ocr_cls", "1").is_none());
        let answered = answers.lock().unwrap().len();
        wait_until("more answers after the swap", || answers.lock().unwrap().len() > answered + 10);
        stop.store(true, Ordering::Relaxed);
    });

    let answers = answers.into_inner().unwrap();
    let failed = answers.iter().filter(|a| a.2 != 200).count();
    assert_eq!(failed, 0, "{failed} of {} requests failed during the swap", answers.len());
    let first_v2 = answers.iter().find(|a| a.3 == "2").expect("traffic reached version 2");
    assert!(first_v2.1 > last_not_ready_sent, "version 2 answered before its ready route said READY");
    assert!(answers.iter().any(|a| a.3 == "1"), "version 1 served before the swap");
    assert_eq!(server.get("/v2/models/ocr_cls/versions/1/ready").0, 404, "version 1 is gone after the swap");
    assert_eq!(infer_cls(&server).1, "2");
}

#[test]
fn a_broken_new_version_fails_every_load_and_the_old_one_keeps_answering() {
    let repo = tempfile::tempdir().unwrap();
    copy_example_model("ocr_cls", repo.path());
    let server = Server::start(repo.path(), &["--model-control-mode", "explicit", "--load-model", "ocr_cls"]);
    std::fs::create_dir_all(repo.path().join("ocr_cls/2")).unwrap();
    std::fs::write(repo.path().join("ocr_cls/2/model.onnx"), b"this is not an ONNX model").unwrap();

    for attempt in 1..=3 {
        let (status, body) = server.post_json("/v2/repository/models/ocr_cls/load", &json!({}));
        assert_eq!(status, 400, "attempt {attempt}: {body}");
        let msg = body["error"].as_str().unwrap();
        assert!(msg.contains("version 2") && msg.contains("model.onnx"), "attempt {attempt}: {msg}");
        let (status, answer) = server.post_bytes("/v2/models/ocr_cls/predict", "image/png", fixture("cls_upright.png"));
        assert_eq!((status, answer["angle"].as_i64()), (200, Some(0)), "attempt {attempt}: {answer}");
        let row = index_row(&server, "ocr_cls", "2").unwrap();
        assert_eq!(row["state"], "UNAVAILABLE");
        assert!(row["reason"].as_str().unwrap().contains("model.onnx"), "{row}");
        assert_eq!(index_row(&server, "ocr_cls", "1").unwrap()["state"], "READY");
    }
    assert_eq!(server.log_count("load: start"), 1 + 3, "version 1 once, version 2 at every attempt");
}

#[test]
fn an_unchanged_model_is_not_reloaded_and_a_config_override_is_applied() {
    let repo = tempfile::tempdir().unwrap();
    copy_example_model("ocr_cls", repo.path());
    let server = Server::start(repo.path(), &["--model-control-mode", "explicit"]);
    assert_eq!(server.get("/v2/models/ocr_cls/ready").0, 503, "explicit mode loads nothing unasked");
    assert_eq!(server.get("/v2/health/ready").0, 200, "nothing was asked for, so nothing is missing");

    for _ in 0..2 {
        let (status, body) = server.post_json("/v2/repository/models/ocr_cls/load", &json!({}));
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(server.log_count("load: start"), 1, "the second load found nothing changed");

    let config = json!({"max_batch_size": 2, "parameters": {"plugin": {"string_value": "ocr_cls.wasm"}}}).to_string();
    let (status, body) =
        server.post_json("/v2/repository/models/ocr_cls/load", &json!({"parameters": {"config": config}}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(server.log_count("load: start"), 2, "a new configuration reloads");
    let (_, meta) = server.get("/v2/models/ocr_cls");
    assert_eq!(meta["inputs"][0]["shape"], json!([-1, 3, -1, -1]), "inputs completed from the model file: {meta}");

    let (status, body) = server
        .post_json("/v2/repository/models/ocr_cls/load", &json!({"parameters": {"config": "{\"max_batchsize\": 2}"}}));
    assert_eq!(status, 400);
    assert!(body["error"].as_str().unwrap().contains("max_batchsize"), "{body}");
    assert_eq!(
        server.post_bytes("/v2/models/ocr_cls/predict", "image/png", fixture("cls_rotated.png")).1["angle"],
        180
    );

    let (status, body) = server.post_json("/v2/repository/models/no_such_model/load", &json!({}));
    assert_eq!(status, 400);
    assert!(body["error"].as_str().unwrap().contains("no_such_model"), "{body}");
    assert_eq!(server.get("/v2/health/ready").0, 200, "a mistyped load does not make the server unready");
}

#[test]
fn load_and_unload_are_refused_outside_explicit_mode() {
    let server = Server::start(&example_repository(), &[]);
    // Triton's status and the text its clients match, then Plinth's hint.
    let (status, body) = server.post_json("/v2/repository/models/ocr_cls/unload", &json!({}));
    assert_eq!(status, 503);
    let message = body["error"].as_str().unwrap();
    assert!(message.starts_with("explicit model load / unload is not allowed if polling is enabled"), "{body}");
    assert!(message.contains("--model-control-mode=explicit"), "{body}");
    let (_, meta) = server.get("/v2");
    let extensions = meta["extensions"].as_array().unwrap();
    assert!(extensions.contains(&json!("model_repository")), "{meta}");
    assert!(extensions.contains(&json!("binary_tensor_data")), "{meta}");
}

#[test]
fn a_half_copied_version_is_never_served_and_the_complete_one_is() {
    let repo = tempfile::tempdir().unwrap();
    copy_example_model("ocr_cls", repo.path());
    let server = Server::start(repo.path(), &["--model-control-mode", "poll", "--repository-poll-secs", "1"]);
    let model = std::fs::read(repo.path().join("ocr_cls/1/model.onnx")).unwrap();
    std::fs::create_dir_all(repo.path().join("ocr_cls/2")).unwrap();
    let mut file = std::fs::File::create(repo.path().join("ocr_cls/2/model.onnx")).unwrap();
    let (first, rest) = model.split_at(model.len() / 4);
    file.write_all(first).unwrap();
    file.flush().unwrap();
    // Its files stayed the same for a whole poll interval, so the poll tried
    // the quarter-written version, which must fail and leave version 1.
    server.wait_for_log("load: failed");
    let row = index_row(&server, "ocr_cls", "2").unwrap();
    assert_eq!(row["state"], "UNAVAILABLE", "{row}");
    let (status, answer) = server.post_bytes("/v2/models/ocr_cls/predict", "image/png", fixture("cls_upright.png"));
    assert_eq!((status, answer["angle"].as_i64()), (200, Some(0)), "version 1 keeps serving: {answer}");

    file.write_all(rest).unwrap();
    drop(file);
    wait_until("the complete version 2 is ready", || server.get("/v2/models/ocr_cls/versions/2/ready").0 == 200);
    let (status, answer) = server.post_bytes("/v2/models/ocr_cls/predict", "image/png", fixture("cls_rotated.png"));
    assert_eq!((status, answer["angle"].as_i64()), (200, Some(180)), "{answer}");
}

#[test]
fn unload_lets_accepted_requests_finish_and_refuses_later_ones() {
    let repo = tempfile::tempdir().unwrap();
    add_holding_model(repo.path());
    let flags = ["--model-control-mode", "explicit", "--load-model", "*", "--log-verbose", "1"];
    let server = Server::start(repo.path(), &flags);
    std::thread::scope(|s| {
        let held = s.spawn(|| server.post_bytes("/v2/models/faulty/predict", "text/plain", b"wait:release".to_vec()));
        server.wait_for_log("predict: accepted");
        let (status, body) = server.post_json("/v2/repository/models/faulty/unload", &json!({}));
        assert_eq!(status, 200, "{body}");
        let (status, body) = server.post_bytes("/v2/models/faulty/predict", "text/plain", b"ok".to_vec());
        assert_eq!(status, 503, "{body}");
        assert!(body["error"].as_str().unwrap().contains("unloaded"), "{body}");
        let row = index_row(&server, "faulty", "1").expect("the unloaded version drains");
        assert_eq!(row["state"], "UNLOADING");
        release(repo.path());
        let (status, answer) = held.join().unwrap();
        assert_eq!(status, 200, "the request accepted before the unload completes: {answer}");
        assert_eq!(answer["outputs"][0]["shape"], json!([1, 2]));
    });
    wait_until("the drained version is gone", || index_row(&server, "faulty", "1").is_none());
    let row = index_row(&server, "faulty", "").unwrap();
    assert_eq!((row["state"].as_str(), row["reason"].as_str()), (Some("UNAVAILABLE"), Some("unloaded")));
}

/// Reads the hello line until the server stops answering; every answer must
/// be the right text or a 503 "shutting down", and the only transport error
/// a refused connection (the server gone). Counts the right ones in
/// `answered`.
fn read_until_refused(base: &str, answered: &AtomicUsize) {
    let client = plinth_client::http_client(None);
    loop {
        let sent = client
            .post(format!("{base}/v2/models/ocr_rec/predict"))
            .header("content-type", "image/png")
            .body(fixture("line_hello.png"))
            .send();
        let response = match sent {
            Ok(response) => response,
            Err(e) if e.is_connect() => return,
            Err(e) => panic!("a request broke off instead of being answered or refused: {e}"),
        };
        let status = response.status().as_u16();
        let body: Value = response.json().unwrap();
        match status {
            200 => assert_eq!(body["text"], "Hello World"),
            503 => {
                assert!(body["error"].as_str().unwrap().contains("shutting down"), "{body}");
                return;
            }
            _ => panic!("status {status}: {body}"),
        }
        answered.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn sigterm_finishes_accepted_requests_and_exits_cleanly() {
    let repo = tempfile::tempdir().unwrap();
    add_holding_model(repo.path());
    copy_example_model("ocr_rec", repo.path());
    let server = Server::start(repo.path(), &["--log-verbose", "1"]);
    let base = server.url("");
    let answered = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..3).map(|_| s.spawn(|| read_until_refused(&base, &answered))).collect();
        let held = s.spawn(|| server.post_bytes("/v2/models/faulty/predict", "text/plain", b"wait:release".to_vec()));
        server.wait_for_log("predict: accepted model=faulty");
        wait_until("traffic flows", || answered.load(Ordering::Relaxed) >= 3);
        server.terminate();
        server.wait_for_log("shutting down: refusing new inference");
        assert_eq!(server.get("/v2/health/ready").0, 503, "not ready once shutdown began");
        let (status, body) = server.post_bytes("/v2/models/ocr_rec/predict", "image/png", fixture("line_hello.png"));
        assert_eq!(status, 503, "new inference is refused while draining: {body}");
        release(repo.path());
        let (status, answer) = held.join().unwrap();
        assert_eq!(status, 200, "the accepted request completes: {answer}");
        for reader in readers {
            reader.join().unwrap();
        }
    });
    let exit = server.wait_exit();
    assert!(exit.success(), "exit status {exit}");
    assert!(server.log().contains("stopped"));
}

#[test]
fn polling_reports_a_broken_config_and_picks_up_the_fix() {
    let repo = tempfile::tempdir().unwrap();
    copy_example_model("ocr_cls", repo.path());
    let server = Server::start(repo.path(), &["--model-control-mode", "poll", "--repository-poll-secs", "1"]);
    let config = repo.path().join("ocr_cls/config.pbtxt");
    let good = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, good.replace("max_batch_size: 8", "max_batch_size: 8\nwarmup_count: 3")).unwrap();
    wait_until("the parse error is in the index", || {
        index_row(&server, "ocr_cls", "").is_some_and(|r| r["reason"].as_str().unwrap().contains("warmup_count"))
    });
    let (status, answer) = server.post_bytes("/v2/models/ocr_cls/predict", "image/png", fixture("cls_upright.png"));
    assert_eq!((status, answer["angle"].as_i64()), (200, Some(0)), "version 1 keeps serving: {answer}");

    let warm = good.replace(
        "max_batch_size: 8",
        r#"max_batch_size: 8
model_warmup [ { name: "zeros" batch_size: 2 count: 3
  inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 3, 48, 192 ] zero_data: true } } } ]"#,
    );
    std::fs::write(&config, warm).unwrap();
    wait_until("the fixed configuration is loaded and warmed up", || server.log_count("load: ready") == 2);
    assert!(server.log().lines().any(|l| l.contains("load: warm-up done") && l.contains("runs=3")), "{}", server.log());
    assert!(index_row(&server, "ocr_cls", "").is_none(), "the error is gone");
    assert_eq!(index_row(&server, "ocr_cls", "1").unwrap()["state"], "READY");
}

//! The scheduler through the real binary: dynamic batching returns each
//! request exactly its own answer, a full queue or an expired queue timeout
//! answers 503 with `Retry-After`, a request whose client went away is never
//! run, and the client crate's retries get every request through.

use std::path::{Path, PathBuf};
use std::time::Duration;

use plinth_client::{Client, ClientError, InferInput, InferRequest, InferResponse, RetryPolicy};
use plinth_tests::{Server, add_model, example_repository, root};

/// ocr_cls's input: one text-line image, [batch, 3, 48, 192].
const CLS_ROW: usize = 3 * 48 * 192;
const CLS_OUTPUT: &str = "save_infer_model/scale_0.tmp_1";

fn cls_model() -> PathBuf {
    example_repository().join("ocr_cls/1/model.onnx")
}

/// `tests/fixtures/slow_model.onnx`: y = 2x for x [batch, 4], about 40 ms
/// of work per row on one core.
fn slow_model() -> PathBuf {
    root().join("tests/fixtures/slow_model.onnx")
}

/// Distinct inputs with short exact JSON numbers (multiples of 1/256).
fn cls_input(seed: usize, rows: usize) -> Vec<f32> {
    (0..rows * CLS_ROW).map(|i| ((i * 7919 + seed * 104_729) % 513) as f32 / 256.0 - 1.0).collect()
}

fn cls_request(seed: usize, rows: usize) -> InferRequest {
    InferRequest::new(vec![InferInput::fp32("x", &[rows as i64, 3, 48, 192], &cls_input(seed, rows))])
}

fn slow_request(first: f32, rows: usize) -> InferRequest {
    let x: Vec<f32> = (0..rows * 4).map(|i| first + i as f32).collect();
    InferRequest::new(vec![InferInput::fp32("x", &[rows as i64, 4], &x)])
}

fn output(response: &InferResponse, name: &str) -> Vec<f32> {
    response.output(name).unwrap_or_else(|| panic!("no output {name}")).to_f32().unwrap()
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 1e-4, "{what}: {got:?} != {want:?}");
    }
}

fn metric(server: &Server, family: &str, model: &str) -> f64 {
    server.metric(&format!("{family}{{model=\"{model}\",version=\"1\"}}"))
}

fn failures(server: &Server, model: &str, reason: &str) -> f64 {
    server.metric(&format!("nv_inference_request_failure{{model=\"{model}\",reason=\"{reason}\",version=\"1\"}}"))
}

fn start(repo: &Path) -> (Server, Client) {
    let server = Server::start(repo, &[]);
    let client = Client::new(server.base()).with_retry(RetryPolicy::NEVER);
    (server, client)
}

#[test]
fn concurrent_requests_are_batched_and_each_gets_its_own_answer() {
    let repo = tempfile::tempdir().unwrap();
    add_model(repo.path(), "cls_plain", &cls_model(), "max_batch_size: 8");
    add_model(
        repo.path(),
        "cls_batched",
        &cls_model(),
        "max_batch_size: 8
         dynamic_batching { max_queue_delay_microseconds: 5000 }
         instance_group [ { count: 2 kind: KIND_CPU } ]",
    );
    let (server, client) = start(repo.path());
    let client = &client;

    let unbatched: Vec<Vec<f32>> =
        (0..200).map(|seed| output(&client.infer("cls_plain", &cls_request(seed, 1)).unwrap(), CLS_OUTPUT)).collect();
    assert_eq!(metric(&server, "nv_inference_exec_count", "cls_plain"), 200.0);

    let batched: Vec<Vec<f32>> = std::thread::scope(|s| {
        let handles: Vec<_> =
            (0..200).map(|seed| s.spawn(move || client.infer("cls_batched", &cls_request(seed, 1)).unwrap())).collect();
        handles.into_iter().map(|h| output(&h.join().unwrap(), CLS_OUTPUT)).collect()
    });
    for (seed, (got, want)) in batched.iter().zip(&unbatched).enumerate() {
        assert_close(got, want, &format!("request {seed}"));
    }
    let inferences = metric(&server, "nv_inference_count", "cls_batched");
    let executions = metric(&server, "nv_inference_exec_count", "cls_batched");
    assert_eq!(inferences, 200.0);
    assert!(executions < 200.0, "200 concurrent requests ran in {executions} executions: no batching happened");
    assert_eq!(metric(&server, "nv_inference_request_success", "cls_batched"), 200.0);
}

#[test]
fn requests_of_batch_size_three_and_one_share_a_batch() {
    let repo = tempfile::tempdir().unwrap();
    add_model(repo.path(), "cls_plain", &cls_model(), "max_batch_size: 8");
    // A 4-row batch is preferred, so 3 + 1 rows run at once; anything less
    // would wait up to 10 s.
    add_model(
        repo.path(),
        "cls_wait",
        &cls_model(),
        "max_batch_size: 8
         dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 10000000 }",
    );
    let (server, client) = start(repo.path());

    let (three, one) = std::thread::scope(|s| {
        let three = s.spawn(|| client.infer("cls_wait", &cls_request(1, 3)).unwrap());
        let one = s.spawn(|| client.infer("cls_wait", &cls_request(2, 1)).unwrap());
        (three.join().unwrap(), one.join().unwrap())
    });
    assert_eq!(three.output(CLS_OUTPUT).unwrap().shape, vec![3, 2]);
    assert_eq!(one.output(CLS_OUTPUT).unwrap().shape, vec![1, 2]);
    assert_close(
        &output(&three, CLS_OUTPUT),
        &output(&client.infer("cls_plain", &cls_request(1, 3)).unwrap(), CLS_OUTPUT),
        "batch of 3",
    );
    assert_close(
        &output(&one, CLS_OUTPUT),
        &output(&client.infer("cls_plain", &cls_request(2, 1)).unwrap(), CLS_OUTPUT),
        "batch of 1",
    );
    assert_eq!(metric(&server, "nv_inference_exec_count", "cls_wait"), 1.0, "one execution for both requests");
    assert_eq!(metric(&server, "nv_inference_count", "cls_wait"), 4.0);
}

#[test]
fn a_full_queue_answers_503_with_retry_after_and_retries_get_through() {
    let repo = tempfile::tempdir().unwrap();
    add_model(
        repo.path(),
        "slow",
        &slow_model(),
        "max_batch_size: 8
         dynamic_batching { default_queue_policy { max_queue_size: 4 } }",
    );
    let (server, client) = start(repo.path());
    let send_32 = |client: &Client| {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..32)
                .map(|i| s.spawn(move || (i, client.infer("slow", &slow_request(i as f32 * 10.0, 1)))))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        })
    };

    let mut rejected = 0;
    for (i, result) in send_32(&client) {
        match result {
            Ok(response) => {
                let x: Vec<f32> = (0..4).map(|j| i as f32 * 10.0 + j as f32).collect();
                assert_eq!(output(&response, "y"), x.iter().map(|v| v * 2.0).collect::<Vec<_>>(), "request {i}");
            }
            Err(ClientError::Status { status, message, retry_after }) => {
                assert_eq!(status.as_u16(), 503, "{message}");
                assert!(message.contains("max_queue_size"), "{message}");
                assert_eq!(retry_after, Some(Duration::from_secs(1)), "503 without Retry-After");
                rejected += 1;
            }
            Err(e) => panic!("request {i}: {e}"),
        }
    }
    assert!(rejected > 0, "32 concurrent requests on a queue of 4 were all accepted");
    assert_eq!(failures(&server, "slow", "REJECTED"), rejected as f64);

    let patient = client.with_retry(RetryPolicy {
        max_attempts: 50,
        initial_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(200),
    });
    for (i, result) in send_32(&patient) {
        assert!(result.is_ok(), "request {i} failed despite retries: {:?}", result.err());
    }
}

#[test]
fn a_request_whose_client_went_away_is_never_run() {
    let repo = tempfile::tempdir().unwrap();
    add_model(
        repo.path(),
        "slow",
        &slow_model(),
        r#"max_batch_size: 8
           dynamic_batching { }
           parameters { key: "intra_op_thread_count" value: { string_value: "1" } }"#,
    );
    let (mut server, client) = start(repo.path());
    let client = &client;
    std::thread::scope(|s| {
        // Two full batches keep the only instance busy for about 0.6 s.
        let busy: Vec<_> = (0..2).map(|i| s.spawn(move || client.infer("slow", &slow_request(i as f32, 8)))).collect();
        std::thread::sleep(Duration::from_millis(100));
        let impatient = client.clone().with_timeout(Duration::from_millis(100));
        let err = impatient.infer("slow", &slow_request(100.0, 1)).unwrap_err();
        assert!(matches!(err, ClientError::Transport(_)), "{err}");
        for h in busy {
            h.join().unwrap().unwrap();
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(failures(&server, "slow", "CANCELED"), 1.0);
    assert_eq!(metric(&server, "nv_inference_count", "slow"), 16.0, "the cancelled request ran");
    assert_eq!(metric(&server, "nv_inference_pending_request_count", "slow"), 0.0);

    // The abandoned request no longer counts as in flight: shutdown does not
    // wait for it.
    let stopping = std::time::Instant::now();
    server.terminate();
    assert!(server.wait_exit(Duration::from_secs(20)).success());
    assert!(stopping.elapsed() < Duration::from_secs(10), "shutdown waited for the abandoned request");
    assert_eq!(server.log_count("exit timeout reached"), 0, "{}", server.log());
}

#[test]
fn an_expired_queue_timeout_answers_503() {
    let repo = tempfile::tempdir().unwrap();
    add_model(
        repo.path(),
        "slow",
        &slow_model(),
        r#"max_batch_size: 8
           dynamic_batching {
             priority_levels: 2
             default_priority_level: 2
             default_queue_policy { default_timeout_microseconds: 100000 allow_timeout_override: true }
           }
           parameters { key: "intra_op_thread_count" value: { string_value: "1" } }"#,
    );
    let (server, client) = start(repo.path());
    std::thread::scope(|s| {
        let busy = s.spawn(|| client.infer("slow", &slow_request(0.0, 8)));
        std::thread::sleep(Duration::from_millis(100));
        let err = client.infer("slow", &slow_request(1.0, 1)).unwrap_err();
        assert_eq!(err.status().map(|s| s.as_u16()), Some(503), "{err}");
        assert!(err.to_string().contains("timeout"), "{err}");
        assert!(matches!(err, ClientError::Status { retry_after: Some(_), .. }));
        busy.join().unwrap().unwrap();
    });
    assert_eq!(failures(&server, "slow", "REJECTED"), 1.0);
    assert_eq!(metric(&server, "nv_inference_count", "slow"), 8.0, "the expired request ran");
}

#[test]
fn higher_priority_requests_run_first() {
    let repo = tempfile::tempdir().unwrap();
    add_model(
        repo.path(),
        "slow",
        &slow_model(),
        r#"max_batch_size: 8
           dynamic_batching { priority_levels: 2 default_priority_level: 2 }
           parameters { key: "intra_op_thread_count" value: { string_value: "1" } }"#,
    );
    let (_server, client) = start(repo.path());
    let finished = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        let send = |name: &'static str, priority: u64, delay_ms: u64| {
            let (client, finished) = (&client, &finished);
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(delay_ms));
                // Full batches, so that no two requests share an execution.
                client.infer("slow", &slow_request(0.0, 8).parameter("priority", priority)).unwrap();
                finished.lock().unwrap().push(name);
            })
        };
        send("first", 2, 0);
        send("low", 2, 100);
        send("high", 1, 200);
    });
    assert_eq!(*finished.lock().unwrap(), vec!["first", "high", "low"]);
    let err = client.infer("slow", &slow_request(0.0, 1).parameter("priority", 3)).unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(400), "{err}");
    assert!(err.to_string().contains("priority 3"), "{err}");
}

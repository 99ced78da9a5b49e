//! The scheduler through the real binary: dynamic batching returns each
//! request exactly its own answer, a full queue or an expired queue timeout
//! answers 503 with `Retry-After`, a request whose client went away is never
//! run, and the client crate's retries get every request through.
//!
//! Where a request must wait in the queue, a `preferred_batch_size` it
//! cannot fill and a long `max_queue_delay_microseconds` hold it there (a
//! state the test observes), so no test depends on how fast a model runs.
//! The scheduler's ordering of priorities is unit-tested with a backend the
//! test holds (`runtime/src/scheduler`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use plinth_client::{Client, ClientError, InferInput, InferRequest, InferResponse, RetryPolicy};
use plinth_tests::{Server, add_model, example_repository, root, wait_until};
use serde_json::json;

/// Holds one-row requests in the queue: a batch runs only at 8 rows, or
/// after 60 s.
const HOLD: &str = "preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 60000000";

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
    start_with(repo, &[])
}

fn start_with(repo: &Path, flags: &[&str]) -> (Server, Client) {
    let server = Server::start(repo, flags);
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
        &format!(
            "max_batch_size: 8
             dynamic_batching {{ {HOLD} }}
             instance_group [ {{ count: 2 kind: KIND_CPU }} ]"
        ),
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
    assert_eq!(metric(&server, "nv_inference_count", "cls_batched"), 200.0);
    assert_eq!(metric(&server, "nv_inference_exec_count", "cls_batched"), 25.0, "200 rows in batches of 8");
    assert_eq!(metric(&server, "nv_inference_request_success", "cls_batched"), 200.0);
}

#[test]
fn requests_of_batch_size_three_and_one_share_a_batch() {
    let repo = tempfile::tempdir().unwrap();
    add_model(repo.path(), "cls_plain", &cls_model(), "max_batch_size: 8");
    // A 4-row batch is preferred, so 3 + 1 rows run at once; anything less
    // would wait up to 60 s.
    add_model(
        repo.path(),
        "cls_wait",
        &cls_model(),
        "max_batch_size: 8
         dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 60000000 }",
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

/// `slow` with one-row requests held at priority level 1 until a batch of
/// four rows forms (or 60 s pass), and level 1 holding at most three
/// requests; level 2 is unbounded.
const HELD_QUEUE: &str = r#"max_batch_size: 8
    dynamic_batching {
      preferred_batch_size: [ 4 ]
      max_queue_delay_microseconds: 60000000
      priority_levels: 2
      default_priority_level: 1
      priority_queue_policy { key: 1 value { max_queue_size: 3 } }
    }"#;

#[test]
fn a_full_queue_answers_503_with_retry_after_and_retries_get_through() {
    let repo = tempfile::tempdir().unwrap();
    add_model(repo.path(), "slow", &slow_model(), HELD_QUEUE);
    let (server, client) = start(repo.path());
    let client = &client;
    let pending = || metric(&server, "nv_inference_pending_request_count", "slow");
    let doubled = |first: f32| (0..4).map(|j| 2.0 * (first + j as f32)).collect::<Vec<_>>();
    std::thread::scope(|s| {
        let held: Vec<_> = (0..3).map(|i| s.spawn(move || client.infer("slow", &slow_request(i as f32, 1)))).collect();
        wait_until("three requests fill level 1", || pending() == 3.0);
        match client.infer("slow", &slow_request(9.0, 1)).unwrap_err() {
            ClientError::Status { status, message, retry_after } => {
                assert_eq!(status.as_u16(), 503, "{message}");
                assert!(
                    message.contains("queue at priority level 1 is full (3 requests, max_queue_size)"),
                    "{message}"
                );
                assert_eq!(retry_after, Some(Duration::from_secs(1)), "503 without Retry-After");
            }
            other => panic!("expected a 503, got {other}"),
        }
        assert_eq!(failures(&server, "slow", "REJECTED"), 1.0);

        // A client that retries 503s is refused too, and keeps trying.
        let patient = client.clone().with_retry(RetryPolicy {
            max_attempts: 1000,
            initial_delay: Duration::from_millis(20),
            max_delay: Duration::from_millis(100),
        });
        let retried = s.spawn(move || patient.infer("slow", &slow_request(20.0, 1)));
        wait_until("the retrying client was refused", || failures(&server, "slow", "REJECTED") >= 2.0);
        // One row at level 2 makes a batch of four: the held requests run.
        let filler = client.infer("slow", &slow_request(30.0, 1).parameter("priority", 2)).unwrap();
        assert_eq!(output(&filler, "y"), doubled(30.0));
        for (i, request) in held.into_iter().enumerate() {
            assert_eq!(output(&request.join().unwrap().unwrap(), "y"), doubled(i as f32), "held request {i}");
        }
        // The retry now waits alone in level 1; three more rows release it.
        wait_until("the retry is queued", || pending() == 1.0);
        client.infer("slow", &slow_request(40.0, 3).parameter("priority", 2)).unwrap();
        assert_eq!(output(&retried.join().unwrap().unwrap(), "y"), doubled(20.0), "the retry got through");
    });
    assert_eq!(metric(&server, "nv_inference_exec_count", "slow"), 2.0);
}

#[test]
fn a_request_whose_client_went_away_is_never_run() {
    let repo = tempfile::tempdir().unwrap();
    add_model(repo.path(), "slow", &slow_model(), HELD_QUEUE);
    // If the abandoned request still counted as in flight, shutdown would
    // wait out this timeout and exit with status 1.
    let (server, _) = start_with(repo.path(), &["--exit-timeout-secs", "1"]);
    let request = json!({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]});
    let connection = server.open_request("/v2/models/slow/infer", &request);
    wait_until("the request is queued", || metric(&server, "nv_inference_pending_request_count", "slow") == 1.0);
    drop(connection);
    wait_until("the request is counted as cancelled", || failures(&server, "slow", "CANCELED") == 1.0);
    assert_eq!(metric(&server, "nv_inference_pending_request_count", "slow"), 0.0, "it left the queue");
    assert_eq!(metric(&server, "nv_inference_exec_count", "slow"), 0.0, "the cancelled request ran");

    server.terminate();
    assert!(server.wait_exit().success(), "{}", server.log());
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
             preferred_batch_size: [ 4 ]
             max_queue_delay_microseconds: 60000000
             default_queue_policy { default_timeout_microseconds: 100000 allow_timeout_override: true }
           }"#,
    );
    let (server, client) = start(repo.path());
    // Held for a batch of four rows, the request's 100 ms queue timeout
    // expires first.
    let err = client.infer("slow", &slow_request(1.0, 1)).unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(503), "{err}");
    assert!(err.to_string().contains("waited 100000 µs in the queue (its timeout) without running"), "{err}");
    assert!(matches!(err, ClientError::Status { retry_after: Some(_), .. }));
    let err = client.infer("slow", &slow_request(1.0, 1).parameter("timeout", 20000)).unwrap_err();
    assert!(err.to_string().contains("waited 20000 µs"), "a request may shorten its timeout: {err}");
    assert_eq!(failures(&server, "slow", "REJECTED"), 2.0);
    assert_eq!(metric(&server, "nv_inference_exec_count", "slow"), 0.0, "the expired requests never ran");
}

#[test]
fn priorities_reach_the_scheduler() {
    let repo = tempfile::tempdir().unwrap();
    add_model(repo.path(), "slow", &slow_model(), HELD_QUEUE);
    let (server, client) = start(repo.path());
    let client = &client;
    // Level 2 is not limited: a fourth request goes there, and completes
    // the batch of the three held at level 1.
    std::thread::scope(|s| {
        let held: Vec<_> = (0..3).map(|i| s.spawn(move || client.infer("slow", &slow_request(i as f32, 1)))).collect();
        wait_until("three requests fill level 1", || {
            metric(&server, "nv_inference_pending_request_count", "slow") == 3.0
        });
        client.infer("slow", &slow_request(3.0, 1).parameter("priority", 2)).unwrap();
        for request in held {
            request.join().unwrap().unwrap();
        }
    });
    assert_eq!(metric(&server, "nv_inference_exec_count", "slow"), 1.0);
    let err = client.infer("slow", &slow_request(0.0, 1).parameter("priority", 3)).unwrap_err();
    assert_eq!(err.status().map(|s| s.as_u16()), Some(400), "{err}");
    assert!(err.to_string().contains("priority 3 is not a priority level of this model"), "{err}");
}

//! Throughput and latency of the scheduler on ocr_cls (the example
//! repository's direction classifier, [batch, 3, 48, 192] FP32), at
//! concurrency 1, 8 and 64: without batching, with one and two instances,
//! and with dynamic batching at several `max_queue_delay_microseconds`.
//!
//! The ceiling is plain ONNX Runtime in this process on the same model file
//! at batch size min(concurrency, 8), with its default settings, measured in
//! the same run just before the Plinth figures of that concurrency; every Plinth
//! figure is also printed as a ratio of it. Plinth's figures include HTTP,
//! JSON decoding of the 27,648-float input on the server, and the client
//! threads (each sends one request encoded once), all on the same cores.
//!
//! Usage: make bench   (or: cargo run --release -p plinth-bench --bin batching [SECONDS])

mod common;

use std::time::{Duration, Instant};

use common::{Figures, figures, in_process, input_rows};
use ort::session::Session;
use plinth_client::{Client, InferInput, InferRequest, RetryPolicy};
use plinth_tests::{Server, add_model, example_repository, ort_dylib_path};

const MAX_BATCH: usize = 8;
const CONCURRENCY: [usize; 3] = [1, 8, 64];

/// The served variants: (model name, what it shows, config.pbtxt).
const VARIANTS: [(&str, &str, &str); 5] = [
    ("off", "batching off, 1 instance", "max_batch_size: 8"),
    ("off_x2", "batching off, 2 instances", "max_batch_size: 8 instance_group [ { count: 2 } ]"),
    ("delay_0", "batching, delay 0 µs", "max_batch_size: 8 dynamic_batching { }"),
    ("delay_500", "batching, delay 500 µs", "max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: 500 }"),
    (
        "delay_2000",
        "batching, delay 2000 µs",
        "max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: 2000 }",
    ),
];

fn main() {
    let seconds: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(3);
    let window = Duration::from_secs(seconds);
    let model = example_repository().join("ocr_cls/1/model.onnx");
    assert!(model.is_file(), "{} is missing: run `make setup` first", model.display());

    let env = ort::init_from(ort_dylib_path()).expect("ONNX Runtime loads").with_name("bench").build().expect("env");
    let mut session = Session::builder(&env).expect("builder").commit_from_file(&model).expect("the model loads");

    let repo = tempfile::tempdir().expect("a temporary folder");
    for (name, _, config) in VARIANTS {
        add_model(repo.path(), name, &model, config);
    }
    let server = Server::start(repo.path(), &[]);
    let client = Client::new(server.base()).with_retry(RetryPolicy::NEVER);

    println!(
        "ocr_cls, {seconds} s per cell; ratio = Plinth rows/s ÷ ONNX Runtime in-process rows/s at the same batch size"
    );
    println!();
    println!("| configuration | concurrency | rows/s | p50 ms | p99 ms | rows per execution | ratio of ceiling |");
    println!("|---|---|---|---|---|---|---|");
    for c in CONCURRENCY {
        // Measured next to the cells it is the ceiling of: these machines are shared and noisy.
        let ceil = in_process(&mut session, c.min(MAX_BATCH), window);
        println!(
            "| ONNX Runtime in-process, batch {} | {c} | {:.0} | {:.2} | {:.2} | {} | 1.00 |",
            c.min(MAX_BATCH),
            ceil.per_second,
            ceil.p50_ms,
            ceil.p99_ms,
            c.min(MAX_BATCH)
        );
        for (name, what, _) in VARIANTS {
            let before = executions(&server, name);
            let f = over_http(&client, name, c, window);
            let (rows, runs) = executions(&server, name);
            let per_execution = (rows - before.0) / (runs - before.1).max(1.0);
            println!(
                "| {what} | {c} | {:.0} | {:.2} | {:.2} | {per_execution:.1} | {:.2} |",
                f.per_second,
                f.p50_ms,
                f.p99_ms,
                f.per_second / ceil.per_second
            );
        }
    }
}

/// `concurrency` client threads sending one-row requests for `window`.
fn over_http(client: &Client, model: &str, concurrency: usize, window: Duration) -> Figures {
    let started = Instant::now();
    let latencies: Vec<Duration> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..concurrency)
            .map(|t| {
                s.spawn(move || {
                    let input = InferInput::fp32("x", &[1, 3, 48, 192], &input_rows(t, 1));
                    let request = InferRequest::new(vec![input]).to_json();
                    let mut latencies = Vec::new();
                    while started.elapsed() < window {
                        let sent = Instant::now();
                        client.infer_json(model, &request).expect("inference succeeds");
                        latencies.push(sent.elapsed());
                    }
                    latencies
                })
            })
            .collect();
        threads.into_iter().flat_map(|t| t.join().expect("client thread")).collect()
    });
    figures(latencies.len(), started.elapsed(), latencies)
}

/// (`nv_inference_count`, `nv_inference_exec_count`) of `model`.
fn executions(server: &Server, model: &str) -> (f64, f64) {
    let series = |family: &str| server.metric(&format!("{family}{{model=\"{model}\",version=\"1\"}}"));
    (series("nv_inference_count"), series("nv_inference_exec_count"))
}

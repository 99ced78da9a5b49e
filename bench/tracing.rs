//! What tracing costs per request (issue 19), on the tiny MLP of
//! `bench/make_mlp.py` (64 -> 32 -> 10, a few microseconds to run), where
//! the server's own overhead is most of the latency. Three servers on the
//! same model, measured in alternating rounds in one run: tracing off (no
//! `--trace-config`, the default), off with a model of its own traced
//! (per-model settings make every request look at them), and on for every
//! request (`level=TIMESTAMPS rate=1`) exporting over OTLP/HTTP to a sink
//! in this process. One client thread, one-row JSON requests, closed loop.
//!
//! Usage: cargo run --release -p plinth-bench --bin tracing [SECONDS]

// Shared with the ocr_cls benchmarks; only `figures` is used here.
#[allow(dead_code)]
mod common;

use std::time::{Duration, Instant};

use common::figures;
use plinth_client::{Client, InferInput, InferRequest, RetryPolicy};
use plinth_tests::{Server, add_model, root};

/// Alternating rounds per server; each round lasts SECONDS / ROUNDS.
const ROUNDS: u32 = 5;

fn main() {
    let seconds: f64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(10.0);
    let round = Duration::from_secs_f64(seconds / f64::from(ROUNDS));
    let repo = tempfile::tempdir().expect("a temporary folder");
    let model = repo.path().join("mlp.onnx");
    let made = std::process::Command::new(root().join(".venv/bin/python"))
        .arg(root().join("bench/make_mlp.py"))
        .arg(&model)
        .status()
        .expect("run bench/make_mlp.py (make setup first)");
    assert!(made.success(), "bench/make_mlp.py failed");
    add_model(repo.path(), "mlp", &model, "max_batch_size: 8");
    add_model(repo.path(), "other", &model, "max_batch_size: 8");

    let sink = otlp_sink();
    let url = format!("--trace-config=opentelemetry,url={sink}");
    let servers = [
        ("tracing off (default)", Server::start(repo.path(), &[])),
        ("off; another model traced", Server::start(repo.path(), &[url.as_str()])),
        (
            "on, rate=1, OTLP/HTTP",
            Server::start(repo.path(), &["--trace-config=level=TIMESTAMPS", "--trace-config=rate=1", url.as_str()]),
        ),
    ];
    let other = serde_json::json!({"trace_level": ["TIMESTAMPS"], "trace_rate": "1"});
    let (status, _) = servers[1].1.post_json("/v2/models/other/trace/setting", &other);
    assert_eq!(status, 200, "per-model trace settings");

    let request = InferRequest::new(vec![InferInput::fp32("x", &[1, 64], &[0.5; 64])]).to_json();
    let clients: Vec<Client> =
        servers.iter().map(|(_, s)| Client::new(s.base()).with_retry(RetryPolicy::NEVER)).collect();
    for client in &clients {
        run(client, &request, Duration::from_millis(300)); // warm-up
    }
    let mut latencies = vec![Vec::new(); servers.len()];
    for _ in 0..ROUNDS {
        for (client, all) in clients.iter().zip(&mut latencies) {
            all.extend(run(client, &request, round));
        }
    }
    println!("tiny MLP (64->32->10), one client, {seconds} s per server in {ROUNDS} alternating rounds");
    println!();
    println!("| tracing | requests/s | p50 µs | p99 µs | p50 − off µs | requests/s ÷ off |");
    println!("|---|---|---|---|---|---|");
    let rows: Vec<_> = latencies
        .into_iter()
        .map(|l| {
            let total = round * ROUNDS;
            figures(l.len(), total, l)
        })
        .collect();
    for ((what, _), f) in servers.iter().zip(&rows) {
        println!(
            "| {what} | {:.0} | {:.1} | {:.1} | {:+.1} | {:.3} |",
            f.per_second,
            f.p50_ms * 1000.0,
            f.p99_ms * 1000.0,
            (f.p50_ms - rows[0].p50_ms) * 1000.0,
            f.per_second / rows[0].per_second
        );
    }
}

/// Requests back to back for `window`; their latencies.
fn run(client: &Client, request: &[u8], window: Duration) -> Vec<Duration> {
    let started = Instant::now();
    let mut latencies = Vec::new();
    while started.elapsed() < window {
        let sent = Instant::now();
        client.infer_json("mlp", request).expect("inference succeeds");
        latencies.push(sent.elapsed());
    }
    latencies
}

/// An OTLP/HTTP receiver that accepts every export and keeps nothing;
/// its `host:port`.
fn otlp_sink() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port for the OTLP sink");
    let address = listener.local_addr().expect("its address").to_string();
    listener.set_nonblocking(true).expect("non-blocking");
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
            let app = axum::Router::new().route("/v1/traces", axum::routing::post(|| async { "" }));
            axum::serve(listener, app).await.expect("the sink serves");
        });
    });
    address
}

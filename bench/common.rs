//! What the benchmarks share: ocr_cls inputs, the in-process ONNX Runtime
//! ceiling, and latency figures.

use std::time::{Duration, Instant};

use ort::session::Session;
use ort::value::Tensor;

/// One ocr_cls row: [3, 48, 192] FP32.
pub const ROW: usize = 3 * 48 * 192;

/// One measurement: rows per second and latencies in milliseconds.
pub struct Figures {
    /// Calls measured (requests, or in-process runs).
    #[allow(dead_code, reason = "the peers table prints it; the batching one does not")]
    pub count: usize,
    pub per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// `batch` rows of [`input_rows`] as an ONNX Runtime tensor `[batch, 3, 48, 192]`.
pub fn input_tensor(batch: usize) -> Tensor<f32> {
    Tensor::from_array(([batch, 3, 48, 192], input_rows(0, batch))).expect("a tensor")
}

/// ONNX Runtime alone: `batch` rows per run, back to back, for `window`.
pub fn in_process(session: &mut Session, batch: usize, window: Duration) -> Figures {
    let input = input_tensor(batch);
    let mut latencies = Vec::new();
    let started = Instant::now();
    while started.elapsed() < window {
        let t = Instant::now();
        session.run(ort::inputs!["x" => input.view()]).expect("ONNX Runtime runs");
        latencies.push(t.elapsed());
    }
    figures(latencies.len() * batch, started.elapsed(), latencies)
}

/// Throughput of `rows` in `elapsed`, and the median and 99th percentile
/// of `latencies`.
pub fn figures(rows: usize, elapsed: Duration, mut latencies: Vec<Duration>) -> Figures {
    latencies.sort();
    let count = latencies.len();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1000.0;
    Figures { count, per_second: rows as f64 / elapsed.as_secs_f64(), p50_ms: at(0.50), p99_ms: at(0.99) }
}

/// Rows of a text-line-like input with short exact JSON numbers.
pub fn input_rows(seed: usize, rows: usize) -> Vec<f32> {
    (0..rows * ROW).map(|i| ((i * 31 + seed * 7) % 257) as f32 / 128.0 - 1.0).collect()
}

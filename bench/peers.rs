//! The load generator of `bench/peers/run.sh`: the same one-row ocr_cls
//! KServe v2 JSON requests, at concurrency 1 and 16, against each server
//! given, and ONNX Runtime in-process on the same model file as the
//! ceiling. Prints rows/s, p50 and p99 per server, and each server's
//! throughput as a ratio of Plinth's (the first server) and of the ceiling.
//!
//! Usage: peers SECONDS MODEL.onnx NAME=URL...

mod common;

use std::time::{Duration, Instant};

use common::{Figures, figures, in_process, input_rows};
use ort::session::Session;
use plinth_client::{Client, InferInput, InferRequest, RetryPolicy};
use plinth_tests::ort_dylib_path;

const CONCURRENCY: [usize; 2] = [1, 16];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: peers SECONDS MODEL.onnx NAME=URL...";
    let window = Duration::from_secs(args.get(1).and_then(|s| s.parse().ok()).expect(usage));
    let model = args.get(2).expect(usage);
    let servers: Vec<(&str, &str)> = args[3..].iter().map(|a| a.split_once('=').expect(usage)).collect();

    let env = ort::init_from(ort_dylib_path()).expect("ONNX Runtime loads").with_name("bench").build().expect("env");
    let mut session = Session::builder(&env).expect("builder").commit_from_file(model).expect("the model loads");
    let expected = reference_output(&mut session);

    println!("ocr_cls, one-row KServe v2 JSON requests, {} s per cell, one shared Rust client", window.as_secs());
    println!();
    println!("| server | concurrency | rows/s | p50 ms | p99 ms | ÷ Plinth | ÷ ONNX Runtime in-process |");
    println!("|---|---|---|---|---|---|---|");
    for c in CONCURRENCY {
        let ceiling = in_process(&mut session, 1, window);
        let mut plinth = None;
        for &(name, url) in &servers {
            let client = Client::new(url).with_retry(RetryPolicy::NEVER);
            check_answer(&client, name, &expected);
            let f = over_http(&client, c, window);
            let base = *plinth.get_or_insert(f.per_second);
            println!(
                "| {name} | {c} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} |",
                f.per_second,
                f.p50_ms,
                f.p99_ms,
                f.per_second / base,
                f.per_second / ceiling.per_second
            );
        }
        println!(
            "| onnxruntime in-process, batch 1 | 1 | {:.0} | {:.2} | {:.2} | {:.2} | 1.00 |",
            ceiling.per_second,
            ceiling.p50_ms,
            ceiling.p99_ms,
            ceiling.per_second / plinth.unwrap_or(1.0)
        );
    }
}

fn request() -> Vec<u8> {
    InferRequest::new(vec![InferInput::fp32("x", &[1, 3, 48, 192], &input_rows(0, 1))]).to_json()
}

/// The ceiling's answer for the request every server gets.
fn reference_output(session: &mut Session) -> Vec<f32> {
    let input = ort::value::Tensor::from_array(([1usize, 3, 48, 192], input_rows(0, 1))).expect("a tensor");
    let outputs = session.run(ort::inputs!["x" => input.view()]).expect("ONNX Runtime runs");
    let (_, values) = outputs[0].try_extract_tensor::<f32>().expect("FP32 output");
    values.to_vec()
}

/// Every server must give the right answer before it is timed.
fn check_answer(client: &Client, name: &str, expected: &[f32]) {
    let response = client.infer_json("ocr_cls", &request()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let got = response.outputs[0].to_f32().unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(got.len(), expected.len(), "{name}: wrong output size");
    for (g, e) in got.iter().zip(expected) {
        assert!((g - e).abs() < 1e-4, "{name} answered {got:?}, onnxruntime {expected:?}");
    }
}

/// `concurrency` client threads sending the same request for `window`.
fn over_http(client: &Client, concurrency: usize, window: Duration) -> Figures {
    let body = request();
    let started = Instant::now();
    let latencies: Vec<Duration> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..concurrency)
            .map(|_| {
                s.spawn(|| {
                    let mut latencies = Vec::new();
                    while started.elapsed() < window {
                        let sent = Instant::now();
                        client.infer_json("ocr_cls", &body).expect("inference succeeds");
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

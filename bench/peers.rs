//! The load generator of `bench/peers/run.sh`, two workloads against each
//! server given, every server's answer checked before anything is timed:
//!
//! - `ocr_cls`: the same one-row KServe v2 JSON request (27,648 FP32) to
//!   `/v2/models/ocr_cls/infer`, at concurrency 1, 2, 4, 8 and 16, beside
//!   ONNX Runtime in-process on the same model file (batch 1, the ceiling of
//!   one row per request, and batch min(concurrency, 8), what batching could
//!   reach), measured at each level just before the servers. Prints rows/s,
//!   p50 and p99 per server, and its throughput as a ratio of Plinth's (the
//!   first server) and of the batch-1 ceiling.
//! - `ocr_line`: image bytes in, text out. One text-line PNG read by each
//!   server's OCR pipeline (Plinth's ocr_rec plugin, or the Python pipeline
//!   of bench/peers/ocr_pipeline.py in the peer's own custom model), at
//!   concurrency 1 and 16; the text must be the one `expected.json` beside
//!   the image gives. How the image travels depends on what the server
//!   offers, and is chosen by the server's name:
//!   - `plinth`: raw body, `POST /v2/models/ocr_rec/predict`;
//!   - `kserve`: raw body, `POST /v1/models/ocr_rec:predict` (a non-JSON body
//!     reaches the model's `predict` as it came);
//!   - `mlserver`: raw body, `POST /ocr_rec/predict` (a custom handler: the v2
//!     endpoints take JSON only);
//!   - `triton`: one BYTES element, `POST /v2/models/ocr_rec/infer` with the
//!     binary tensor data extension (no raw-body endpoint).
//!
//! With `--csv PATH`, every measurement is also written there, one row each:
//! `workload,server,concurrency,batch,requests,per_second,p50_ms,p99_ms`
//! (`per_second` is rows/s for ocr_cls, requests/s for ocr_line; `batch` is
//! rows per request or per in-process run). bench/peers/plot.py draws it.
//!
//! Usage: peers SECONDS MODEL.onnx [--csv PATH] [--line IMAGE.png] NAME=URL...

mod common;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Figures, figures, in_process, input_rows};
use ort::session::Session;
use plinth_client::{Client, InferInput, InferRequest, RetryPolicy};
use plinth_tests::ort_dylib_path;
use serde_json::Value;

/// The points of the latency-vs-concurrency curve of ocr_cls.
const CONCURRENCY: [usize; 5] = [1, 2, 4, 8, 16];
/// The largest batch the servers that batch (Plinth, Triton) form.
const MAX_BATCH: usize = 8;
/// The concurrency levels of the image-in, text-out workload.
const LINE_CONCURRENCY: [usize; 2] = [1, 16];

struct Args {
    window: Duration,
    model: String,
    csv: Option<PathBuf>,
    line: Option<PathBuf>,
    servers: Vec<(String, String)>,
}

fn parse_args() -> Args {
    let usage = "usage: peers SECONDS MODEL.onnx [--csv PATH] [--line IMAGE.png] NAME=URL...";
    let mut args = std::env::args().skip(1);
    let window = Duration::from_secs(args.next().and_then(|s| s.parse().ok()).expect(usage));
    let model = args.next().expect(usage);
    let (mut csv, mut line, mut servers) = (None, None, Vec::new());
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--csv" => csv = Some(PathBuf::from(args.next().expect(usage))),
            "--line" => line = Some(PathBuf::from(args.next().expect(usage))),
            _ => {
                let (name, url) = arg.split_once('=').expect(usage);
                servers.push((name.to_owned(), url.to_owned()));
            }
        }
    }
    assert!(!servers.is_empty(), "{usage}");
    Args { window, model, csv, line, servers }
}

/// One measurement, as a CSV row.
struct Row {
    workload: &'static str,
    server: String,
    concurrency: usize,
    batch: usize,
    f: Figures,
}

fn main() {
    let args = parse_args();
    let window = args.window;
    let env = ort::init_from(ort_dylib_path()).expect("ONNX Runtime loads").with_name("bench").build().expect("env");
    let mut session = Session::builder(&env).expect("builder").commit_from_file(&args.model).expect("the model loads");
    let expected = reference_output(&mut session);
    let line = args.line.as_deref().map(Line::load);

    // Every server must give the right answers before anything is timed.
    let clients: Vec<(&str, Client)> = args
        .servers
        .iter()
        .map(|(name, url)| (name.as_str(), Client::new(url).with_retry(RetryPolicy::NEVER)))
        .collect();
    for (name, client) in &clients {
        check_answer(client, name, &expected);
    }
    let http = plinth_client::http_client(None);
    let readers: Vec<LineRequest> = match &line {
        Some(line) => args.servers.iter().map(|(name, url)| LineRequest::new(name, url, line)).collect(),
        None => Vec::new(),
    };
    for reader in &readers {
        let text = reader.read(&http).unwrap_or_else(|e| panic!("{}: {e}", reader.server));
        let want = &line.as_ref().expect("a line").text;
        assert_eq!(&text, want, "{} read {text:?}, expected {want:?}", reader.server);
    }

    let mut rows = Vec::new();
    println!(
        "ocr_cls, one-row KServe v2 JSON requests, {} s per cell, one shared Rust client; \
         ÷ ONNX Runtime = rows/s over in-process batch 1",
        window.as_secs()
    );
    println!();
    println!("| server | concurrency | rows/s | p50 ms | p99 ms | ÷ Plinth | ÷ ONNX Runtime in-process |");
    println!("|---|---|---|---|---|---|---|");
    for c in CONCURRENCY {
        // Measured next to the cells it is the ceiling of: these machines are
        // shared and noisy. One caller, so its rows say concurrency 1 (the CSV
        // gives the level it was measured beside).
        let ceiling = in_process(&mut session, 1, window);
        let batched = (c > 1).then(|| in_process(&mut session, c.min(MAX_BATCH), window));
        let mut plinth = None;
        for (name, client) in &clients {
            let f = over_http(client, c, window);
            let base = *plinth.get_or_insert(f.per_second);
            println!(
                "| {name} | {c} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} |",
                f.per_second,
                f.p50_ms,
                f.p99_ms,
                f.per_second / base,
                f.per_second / ceiling.per_second
            );
            rows.push(Row { workload: "ocr_cls", server: name.to_string(), concurrency: c, batch: 1, f });
        }
        let (base, batch_1) = (plinth.unwrap_or(1.0), ceiling.per_second);
        for (batch, f) in std::iter::once((1, ceiling)).chain(batched.map(|f| (c.min(MAX_BATCH), f))) {
            println!(
                "| onnxruntime in-process, batch {batch} | 1 | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} |",
                f.per_second,
                f.p50_ms,
                f.p99_ms,
                f.per_second / base,
                f.per_second / batch_1
            );
            rows.push(Row { workload: "ocr_cls", server: "onnxruntime".into(), concurrency: c, batch, f });
        }
    }

    if let Some(line) = &line {
        println!();
        println!(
            "ocr_line: image bytes in, text out; {} ({}×{} PNG, {} bytes, {:?}), {} s per cell",
            line.name,
            line.width,
            line.height,
            line.png.len(),
            line.text,
            window.as_secs()
        );
        println!();
        println!("| server | request | concurrency | requests | requests/s | p50 ms | p99 ms | ÷ Plinth |");
        println!("|---|---|---|---|---|---|---|---|");
        for c in LINE_CONCURRENCY {
            let mut plinth = None;
            for reader in &readers {
                let f = load(c, window, || {
                    reader.read(&http).unwrap_or_else(|e| panic!("{}: {e}", reader.server));
                });
                let base = *plinth.get_or_insert(f.per_second);
                println!(
                    "| {} | {} | {c} | {} | {:.1} | {:.2} | {:.2} | {:.2} |",
                    reader.server,
                    reader.how(),
                    f.count,
                    f.per_second,
                    f.p50_ms,
                    f.p99_ms,
                    f.per_second / base
                );
                rows.push(Row { workload: "ocr_line", server: reader.server.clone(), concurrency: c, batch: 1, f });
            }
        }
    }

    if let Some(path) = &args.csv {
        let mut out = String::from("workload,server,concurrency,batch,requests,per_second,p50_ms,p99_ms\n");
        for r in &rows {
            writeln!(
                out,
                "{},{},{},{},{},{:.2},{:.3},{:.3}",
                r.workload, r.server, r.concurrency, r.batch, r.f.count, r.f.per_second, r.f.p50_ms, r.f.p99_ms
            )
            .expect("a String takes writes");
        }
        std::fs::write(path, out).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        println!();
        println!("measurements written to {}", path.display());
    }
}

fn request() -> Vec<u8> {
    InferRequest::new(vec![InferInput::fp32("x", &[1, 3, 48, 192], &input_rows(0, 1))]).to_json()
}

/// The ceiling's answer for the request every server gets.
fn reference_output(session: &mut Session) -> Vec<f32> {
    let input = common::input_tensor(1);
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

/// `concurrency` client threads sending the same ocr_cls request for `window`.
fn over_http(client: &Client, concurrency: usize, window: Duration) -> Figures {
    let body = request();
    load(concurrency, window, || {
        client.infer_json("ocr_cls", &body).expect("inference succeeds");
    })
}

/// `concurrency` threads calling `send` back to back for `window`; one row
/// per call.
fn load(concurrency: usize, window: Duration, send: impl Fn() + Sync) -> Figures {
    let started = Instant::now();
    let latencies: Vec<Duration> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..concurrency)
            .map(|_| {
                s.spawn(|| {
                    let mut latencies = Vec::new();
                    while started.elapsed() < window {
                        let sent = Instant::now();
                        send();
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

/// The text-line image and the text it holds.
struct Line {
    name: String,
    png: Vec<u8>,
    text: String,
    width: u64,
    height: u64,
}

impl Line {
    /// The image, and its entry in the `expected.json` beside it
    /// (`rec.<file name>`: text, width, height).
    fn load(path: &Path) -> Line {
        let png = std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let name = path.file_name().expect("a file name").to_string_lossy().into_owned();
        let expected_path = path.with_file_name("expected.json");
        let expected = std::fs::read(&expected_path).expect("expected.json is readable");
        let expected: Value = serde_json::from_slice(&expected).expect("expected.json is JSON");
        let entry = &expected["rec"][&name];
        let text = entry["text"].as_str().unwrap_or_else(|| panic!("no rec.{name}.text in expected.json")).to_owned();
        let (width, height) = (entry["width"].as_u64().unwrap_or(0), entry["height"].as_u64().unwrap_or(0));
        Line { name, png, text, width, height }
    }
}

/// How one server is asked to read the line: the request, built once, and
/// where the text is in the answer.
struct LineRequest {
    server: String,
    url: String,
    content_type: &'static str,
    /// `Inference-Header-Content-Length`, for the binary tensor data extension.
    json_header_len: Option<usize>,
    body: Vec<u8>,
    /// The answer is a v2 inference response (the text is output `text`),
    /// not the pipeline's own `{"text": ...}`.
    v2_answer: bool,
}

impl LineRequest {
    fn new(server: &str, base: &str, line: &Line) -> LineRequest {
        let base = base.trim_end_matches('/');
        let raw = |path: &str| LineRequest {
            server: server.to_owned(),
            url: format!("{base}{path}"),
            content_type: "image/png",
            json_header_len: None,
            body: line.png.clone(),
            v2_answer: false,
        };
        match server {
            "plinth" => raw("/v2/models/ocr_rec/predict"),
            "kserve" => raw("/v1/models/ocr_rec:predict"),
            "mlserver" => raw("/ocr_rec/predict"),
            "triton" => {
                // One BYTES element: its 4-byte little-endian length, then the bytes.
                let header = serde_json::json!({"inputs": [{
                    "name": "image", "shape": [1], "datatype": "BYTES",
                    "parameters": {"binary_data_size": line.png.len() + 4},
                }]})
                .to_string();
                let mut body = header.clone().into_bytes();
                body.extend_from_slice(&u32::try_from(line.png.len()).expect("a small image").to_le_bytes());
                body.extend_from_slice(&line.png);
                LineRequest {
                    server: server.to_owned(),
                    url: format!("{base}/v2/models/ocr_rec/infer"),
                    content_type: "application/octet-stream",
                    json_header_len: Some(header.len()),
                    body,
                    v2_answer: true,
                }
            }
            other => panic!("no image-in, text-out request is known for a server named {other:?}"),
        }
    }

    /// What the request is, for the table.
    fn how(&self) -> String {
        let path = self.url.splitn(4, '/').nth(3).unwrap_or_default();
        if self.json_header_len.is_some() {
            format!("BYTES input (binary data), `POST /{path}`")
        } else {
            format!("raw body, `POST /{path}`")
        }
    }

    /// Sends the image; the text read.
    fn read(&self, http: &reqwest::blocking::Client) -> Result<String, String> {
        let mut request = http.post(&self.url).header("Content-Type", self.content_type).body(self.body.clone());
        if let Some(len) = self.json_header_len {
            request = request.header("Inference-Header-Content-Length", len);
        }
        let response = request.send().map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response.bytes().map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&body)));
        }
        let answer: Value = serde_json::from_slice(&body).map_err(|e| format!("the answer is not JSON: {e}"))?;
        let text = if self.v2_answer {
            answer["outputs"].as_array().and_then(|o| o.iter().find(|o| o["name"] == "text")).map(|o| &o["data"][0])
        } else {
            Some(&answer["text"])
        };
        text.and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("no text in the answer {}", String::from_utf8_lossy(&body)))
    }
}

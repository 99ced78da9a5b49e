//! Plinth's own overhead per request: each figure measured in one run
//! against its floor measured in the same run, printed with the figure
//! before (the previous round's end, `docs/benchmarks.md`) and the goal.
//!
//! - the tiny MLP of `bench/make_mlp.py` at concurrency 1 (`wrk`, one
//!   connection, closed loop, v2 JSON), minus nginx answering the same
//!   bytes (`return 200`), and minus a bare axum server in this process
//!   answering them (the HTTP stack Plinth is built on), measured in turns;
//! - ocr_cls (27,648 FP32, 207 KB as JSON) at concurrency 1, as JSON and as
//!   binary tensor data, minus ONNX Runtime in this process at batch 1, and
//!   its JSON body's decoding in this process with Plinth's decoder, data
//!   read while parsing over data read from a value tree;
//! - ocr_cls from 16 connections with dynamic batching, binary data, over
//!   ONNX Runtime in this process at its best batch size, in rows per
//!   second and in CPU time per row;
//! - ocr_cls's postprocess, a plugin call that does next to nothing (in
//!   the server, and through the plugin host in this process), and
//!   image preprocessing and minilm's tokenizer in the sandbox over the
//!   same Rust natively (`plugin_stages`);
//! - start-up on the example repository with a warm plugin cache, minus
//!   its slowest single model load in the same start-up.
//!
//! Usage: cargo run --release -p plinth-bench --bin overhead [SECONDS]
//! (needs `wrk` and `nginx`, which `make setup` installs). `PLINTH_BIN`
//! picks the server binary measured (the plugin rows run in this process).

// Shared with the other benchmarks; each uses part of them.
#[allow(dead_code)]
mod common;
mod plugin_call;
mod plugin_stages;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::in_process;
use ort::session::Session;
use plinth_client::{Client, InferInput, InferRequest};
use plinth_tests::{Server, add_model, example_repository, fixture, ort_dylib_path, root, sample_photo};

/// The figures before this work: the previous round's end, measured the
/// same way (`docs/benchmarks.md`), in the units printed.
const BEFORE: Before = Before {
    tiny_us: "+54.5",
    tiny_axum_us: "not measured",
    json_ms: "+2.07",
    binary_ms: "+0.25",
    batching_ratio: "0.71",
    noop_us: "32",
    preprocess_ratio: ["1.70×", "1.95×", "2.00×"],
    tokenizer_ratio: "not measured",
    startup_s: "+0.36",
};

struct Before {
    tiny_us: &'static str,
    tiny_axum_us: &'static str,
    json_ms: &'static str,
    binary_ms: &'static str,
    batching_ratio: &'static str,
    noop_us: &'static str,
    preprocess_ratio: [&'static str; 3],
    tokenizer_ratio: &'static str,
    startup_s: &'static str,
}

fn main() {
    let seconds: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(5);
    let window = Duration::from_secs(seconds);
    let work = tempfile::tempdir().expect("a temporary folder");
    println!("| figure | now | floor (same run) | before | goal |");
    println!("|---|---|---|---|---|");
    tiny_model(work.path(), window);
    ocr_cls(work.path(), window);
    plugins();
    startup(work.path());
}

/// One `wrk` run: p50 in microseconds and requests per second.
struct Wrk {
    p50_us: f64,
    per_second: f64,
}

/// `wrk` POSTing `body` (with `headers`) to `url` from `connections`
/// connections for `window`.
fn wrk(url: &str, body: &Path, headers: &[(&str, String)], connections: usize, window: Duration) -> Wrk {
    let script = body.with_extension("lua");
    let mut lua = format!(
        "wrk.method = \"POST\"\nlocal f = io.open(\"{}\", \"rb\")\nwrk.body = f:read(\"*a\")\nf:close()\n",
        body.display()
    );
    for (name, value) in headers {
        lua.push_str(&format!("wrk.headers[\"{name}\"] = \"{value}\"\n"));
    }
    std::fs::write(&script, lua).expect("the wrk script");
    let threads = connections.min(2).to_string();
    let output = Command::new("wrk")
        .args(["--latency", "-t", &threads, "-c", &connections.to_string(), "-d", &format!("{}s", window.as_secs())])
        .arg("-s")
        .arg(&script)
        .arg(url)
        .output()
        .expect("wrk runs (make setup installs it)");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(!text.contains("Non-2xx"), "{url} answered errors:\n{text}");
    let p50 = text.lines().find_map(|l| l.trim().strip_prefix("50%")).map(|v| micros(v.trim()));
    let rate = text.lines().find_map(|l| l.strip_prefix("Requests/sec:")).map(|v| v.trim().parse().unwrap_or(0.0));
    Wrk { p50_us: p50.unwrap_or_else(|| panic!("no p50 in:\n{text}")), per_second: rate.unwrap_or(0.0) }
}

/// A wrk duration ("93.00us", "1.52ms", "1.01s") in microseconds.
fn micros(value: &str) -> f64 {
    let (number, scale) = if let Some(n) = value.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = value.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = value.strip_suffix('s') {
        (n, 1e6)
    } else {
        (value, 1.0)
    };
    number.parse::<f64>().unwrap_or(f64::NAN) * scale
}

/// nginx answering every request with `answer` (JSON), on a free port;
/// stopped when dropped.
struct Nginx {
    child: Child,
    port: u16,
}

impl Nginx {
    fn start(folder: &Path, answer: &str) -> Nginx {
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().unwrap().port();
        let conf = folder.join("nginx.conf");
        std::fs::write(
            &conf,
            format!(
                "daemon off; worker_processes 1; error_log stderr; pid {pid};\n\
                 events {{}}\n\
                 http {{ access_log off; client_body_temp_path {tmp}; \
                 server {{ listen 127.0.0.1:{port}; location / {{ default_type application/json; return 200 '{answer}'; }} }} }}\n",
                pid = folder.join("nginx.pid").display(),
                tmp = folder.display(),
            ),
        )
        .expect("nginx.conf");
        let child = Command::new("nginx")
            .arg("-c")
            .arg(&conf)
            .arg("-p")
            .arg(folder)
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx starts (make setup installs it)");
        plinth_tests::wait_until("nginx listens", || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
        Nginx { child, port }
    }
}

impl Drop for Nginx {
    /// SIGTERM, so that the master stops its worker too (a killed master
    /// leaves the worker running, holding this process's stdout open).
    fn drop(&mut self) {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
    }
}

fn row(figure: &str, now: String, floor: String, before: &str, target: &str) {
    println!("| {figure} | {now} | {floor} | {before} | {target} |");
}

/// Tiny MLP at concurrency 1, minus nginx's static answer of the same size.
fn tiny_model(work: &Path, window: Duration) {
    let repo = work.join("tiny");
    std::fs::create_dir_all(&repo).expect("a repository");
    let model = work.join("mlp.onnx");
    let made = Command::new(root().join(".venv/bin/python"))
        .arg(root().join("bench/make_mlp.py"))
        .arg(&model)
        .status()
        .expect("bench/make_mlp.py");
    assert!(made.success());
    add_model(&repo, "mlp", &model, "max_batch_size: 8");
    let server = Server::start(&repo, &[]);
    let request = InferRequest::new(vec![InferInput::fp32("x", &[1, 64], &[0.5; 64])]).to_json();
    let body = work.join("mlp.json");
    std::fs::write(&body, &request).expect("the request body");
    let answer = plinth_client::http_client(None)
        .post(server.url("/v2/models/mlp/infer"))
        .body(request)
        .send()
        .and_then(|r| r.text())
        .expect("the MLP answers");
    let nginx_dir = work.join("nginx");
    std::fs::create_dir_all(&nginx_dir).expect("nginx's folder");
    let nginx = Nginx::start(&nginx_dir, &answer);
    let axum = bare_axum(answer.clone());
    let urls = [
        server.url("/v2/models/mlp/infer"),
        format!("http://127.0.0.1:{}/v2/models/mlp/infer", nginx.port),
        format!("http://127.0.0.1:{axum}/v2/models/mlp/infer"),
    ];
    // Alternating thirds, so all three see the same machine.
    let part = window / 3;
    let mut p50s = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..3 {
        for (url, p50) in urls.iter().zip(&mut p50s) {
            p50.push(wrk(url, &body, &[("Content-Type", "application/json".into())], 1, part).p50_us);
        }
    }
    let [plinth, nginx, axum] = p50s.map(|p| mean(&p));
    row(
        &format!("tiny model, c=1, p50 minus nginx's static answer of the same size ({} bytes)", answer.len()),
        format!("{:+.1} µs (p50 {plinth:.1} µs)", plinth - nginx),
        format!("nginx p50 {nginx:.1} µs"),
        BEFORE.tiny_us,
        "≤ +25 µs",
    );
    row(
        "the same, minus a bare axum server answering the same bytes (Plinth's own part)",
        format!("{:+.1} µs", plinth - axum),
        format!("axum p50 {axum:.1} µs"),
        BEFORE.tiny_axum_us,
        "",
    );
}

/// A bare axum server in this process answering every request with
/// `answer` (JSON), on a multi-threaded tokio runtime of two workers as
/// Plinth's on this machine: the HTTP stack Plinth is built on, without
/// Plinth. Returns its port; it serves until the process ends.
fn bare_axum(answer: String) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = listener.local_addr().expect("its address").port();
    listener.set_nonblocking(true).expect("a non-blocking listener");
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
        runtime.expect("a runtime").block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
            let json = [(axum::http::header::CONTENT_TYPE, "application/json")];
            let app = axum::Router::new().fallback(move || std::future::ready((json, answer.clone())));
            axum::serve(listener, app).await.expect("the bare server serves");
        });
    });
    plinth_tests::wait_until("axum listens", || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    port
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

/// The example repository's ocr_cls in an ONNX Runtime session of this
/// process, with ONNX Runtime's default options.
fn ocr_cls_session() -> Session {
    let model = example_repository().join("ocr_cls/1/model.onnx");
    Session::builder(plugin_stages::ort_environment())
        .expect("builder")
        .commit_from_file(model)
        .expect("the model loads")
}

/// ocr_cls as JSON and binary at concurrency 1, and from 16 connections
/// with batching, against ONNX Runtime in this process.
fn ocr_cls(work: &Path, window: Duration) {
    let model = example_repository().join("ocr_cls/1/model.onnx");
    let mut session = ocr_cls_session();
    let repo = work.join("ocr_cls");
    std::fs::create_dir_all(&repo).expect("a repository");
    add_model(&repo, "cls", &model, "max_batch_size: 16 dynamic_batching { }");
    let rows = common::input_rows(0, 1);
    let json = work.join("cls.json");
    std::fs::write(&json, InferRequest::new(vec![InferInput::fp32("x", &[1, 3, 48, 192], &rows)]).to_json())
        .expect("the JSON body");
    // The same request with `data` before `datatype`: the decoder keeps
    // such data as a JSON value tree and reads it afterwards, as it read
    // every request before it learned to read data while parsing. Measured
    // before the server starts, whose ONNX Runtime threads spin.
    let data = serde_json::to_string(&rows).expect("JSON");
    let data_first = format!(r#"{{"inputs":[{{"data":{data},"name":"x","shape":[1,3,48,192],"datatype":"FP32"}}]}}"#);
    let [parsing, tree] = decode_us([&std::fs::read(&json).expect("the body"), data_first.as_bytes()]);
    let header = r#"{"inputs":[{"name":"x","shape":[1,3,48,192],"datatype":"FP32","parameters":{"binary_data_size":110592}}],"outputs":[{"name":"save_infer_model/scale_0.tmp_1","parameters":{"binary_data":true}}]}"#;
    let binary = work.join("cls.bin");
    let mut bytes = header.as_bytes().to_vec();
    bytes.extend(rows.iter().flat_map(|v| v.to_le_bytes()));
    std::fs::write(&binary, bytes).expect("the binary body");
    let binary_headers = [
        ("Content-Type", "application/octet-stream".to_owned()),
        ("Inference-Header-Content-Length", header.len().to_string()),
    ];
    let server = Server::start(&repo, &[]);
    let url = server.url("/v2/models/cls/infer");

    // Three rounds of the floor, JSON and binary in turn, medians kept: on
    // a shared 2-vCPU machine one 5-second window of the same request
    // measured 1.1 or 1.8 ms, as its threads happened to land on cores.
    let json_headers = [("Content-Type", "application/json".to_owned())];
    let (mut floors, mut jsons, mut binaries) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        floors.push(in_process(&mut session, 1, window / 3).p50_ms * 1000.0);
        jsons.push(wrk(&url, &json, &json_headers, 1, window / 3).p50_us);
        binaries.push(wrk(&url, &binary, &binary_headers, 1, window / 3).p50_us);
    }
    let [floor_us, json_us, binary_us] = [floors, jsons, binaries].map(median);
    let rounds = |values: &str| format!("p50 {values} ms, median of 3 rounds");
    row(
        "ocr_cls JSON request (27,648 FP32, 207 KB), c=1, p50 minus ONNX Runtime in-process",
        format!("{:+.3} ms ({})", (json_us - floor_us) / 1000.0, rounds(&format!("{:.3}", json_us / 1000.0))),
        format!("ONNX Runtime p50 {:.3} ms", floor_us / 1000.0),
        BEFORE.json_ms,
        "≤ +0.4 ms",
    );
    row(
        "its decoding in this process (body to tensor): data read while parsing ÷ the same body with `data` first (read from a value tree)",
        format!("{:.2} ({parsing:.0} µs)", parsing / tree),
        format!("data first {tree:.0} µs"),
        "not measured",
        "< 1",
    );
    row(
        "same tensor as binary data, c=1",
        format!("{:+.3} ms ({})", (binary_us - floor_us) / 1000.0, rounds(&format!("{:.3}", binary_us / 1000.0))),
        format!("ONNX Runtime p50 {:.3} ms", floor_us / 1000.0),
        BEFORE.binary_ms,
        "≤ +0.1 ms",
    );
    // ONNX Runtime's best batch, with the CPU time each row took in this
    // process (its pool's threads, spinning included).
    let mut best = (0, 0.0, 0.0);
    for batch in [1, 2, 4, 8, 16] {
        let cpu = cpu_seconds(std::process::id());
        let figures = in_process(&mut session, batch, window / 2);
        let cpu_per_row = (cpu_seconds(std::process::id()) - cpu) / (figures.count * batch) as f64;
        if figures.per_second > best.1 {
            best = (batch, figures.per_second, cpu_per_row);
        }
    }
    let stats_before = ModelStats::of(&server, "cls");
    let cpu = cpu_seconds(server.pid());
    let concurrent = wrk(&url, &binary, &binary_headers, 16, window);
    let cpu = cpu_seconds(server.pid()) - cpu;
    let formed = ModelStats::of(&server, "cls").since(&stats_before);
    row(
        "ocr_cls, 16 connections, dynamic batching, binary data: rows/s ÷ ONNX Runtime at its best batch",
        format!("{:.2} ({:.0} rows/s)", concurrent.per_second / best.1, concurrent.per_second),
        format!("ONNX Runtime batch {} {:.0} rows/s", best.0, best.1),
        BEFORE.batching_ratio,
        "≥ 0.9",
    );
    let server_cpu_per_row = cpu / formed.inferences as f64;
    row(
        "the same, CPU time per row: ONNX Runtime at its best batch ÷ the whole server (HTTP, decoding, batching, model; the load generator excluded)",
        format!(
            "{:.2} (server {:.0} µs per row, batches of {:.1} on average)",
            best.2 / server_cpu_per_row,
            server_cpu_per_row * 1e6,
            formed.inferences as f64 / formed.executions as f64
        ),
        format!("ONNX Runtime {:.0} µs per row", best.2 * 1e6),
        "not measured",
        "",
    );
}

/// A model's inference and execution counts from `/v2/models/M/stats`.
struct ModelStats {
    inferences: u64,
    executions: u64,
}

impl ModelStats {
    fn of(server: &Server, model: &str) -> ModelStats {
        let (status, stats) = server.get(&format!("/v2/models/{model}/stats"));
        assert_eq!(status, 200, "{stats}");
        let count = |key: &str| stats["model_stats"][0][key].as_u64().unwrap_or_else(|| panic!("no {key} in {stats}"));
        ModelStats { inferences: count("inference_count"), executions: count("execution_count") }
    }

    fn since(&self, before: &ModelStats) -> ModelStats {
        ModelStats { inferences: self.inferences - before.inferences, executions: self.executions - before.executions }
    }
}

/// CPU time process `pid` has used so far, user and system, in seconds
/// (`/proc/PID/stat`, fields 14 and 15, in clock ticks).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // The command name (field 2) may hold spaces; the fields after it don't.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("a command name") + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    // SAFETY: sysconf reads a constant of the system.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    ticks as f64 / per_second as f64
}

/// The median times Plinth's decoder takes from each JSON `/infer` body
/// to its input tensors, in microseconds, measured in turns.
fn decode_us(bodies: [&[u8]; 2]) -> [f64; 2] {
    use plinth::protocol::json::{InferRequest, from_json};
    let decode = |body: &[u8]| {
        let started = Instant::now();
        let request: InferRequest = from_json(body).expect("the body decodes");
        for input in request.inputs {
            std::hint::black_box(input.into_tensor().expect("the input converts"));
        }
        started.elapsed().as_secs_f64() * 1e6
    };
    let mut times = [Vec::new(), Vec::new()];
    for _ in 0..300 {
        for (body, times) in bodies.iter().zip(&mut times) {
            times.push(decode(body));
        }
    }
    times.map(median)
}

/// A plugin call that does next to nothing, and image preprocessing in the
/// sandbox over the same code natively.
fn plugins() {
    // In this process first: the server's ONNX Runtime threads spin.
    let in_process = plugin_call::measure(&mut ocr_cls_session());
    let server = Server::start(&example_repository(), &[]);
    let client = Client::new(server.base());
    let [cls_pre, cls_post] = plugin_stages::measure::<ocr_cls::ExportedPlugin>(
        &server,
        &client,
        "ocr_cls",
        "image/png",
        fixture("cls_rotated.png"),
    );
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    row(
        &format!("plugin call that does nothing (ocr_cls {})", cls_post.name),
        format!("{:.1} µs", us(cls_post.wasm)),
        format!("native {:.1} µs", us(cls_post.native)),
        BEFORE.noop_us,
        "≤ 8 µs",
    );
    row(
        "the same call in this process, without HTTP, from an async worker: caches warm; right after an ONNX Runtime run of ocr_cls",
        format!("{:.1} µs; {:.1} µs", us(in_process.warm), us(in_process.after_model)),
        format!("native {:.1} µs", us(cls_post.native)),
        "not measured",
        "≤ 8 µs",
    );
    let [rec_pre, _] = plugin_stages::measure::<ocr_rec::ExportedPlugin>(
        &server,
        &client,
        "ocr_rec",
        "image/png",
        fixture("line_invoice.png"),
    );
    // SAFETY: set before any thread of this process reads the environment.
    unsafe { std::env::set_var("PLINTH_MODEL_DIR", example_repository().join("mobilenet_v2/1")) };
    let [mobilenet_pre, _] = plugin_stages::measure::<image_classification::ExportedPlugin>(
        &server,
        &client,
        "mobilenet_v2",
        "image/jpeg",
        sample_photo("china.jpg"),
    );
    let stages = [("ocr_cls", cls_pre), ("ocr_rec", rec_pre), ("mobilenet_v2", mobilenet_pre)];
    for ((model, stage), before) in stages.into_iter().zip(BEFORE.preprocess_ratio) {
        row(
            &format!("image {} in the sandbox ÷ natively ({model})", stage.name),
            format!("{:.2}× ({:.0} µs)", us(stage.wasm) / us(stage.native), us(stage.wasm)),
            format!("native {:.0} µs", us(stage.native)),
            before,
            "≤ 1.3×",
        );
    }
    // SAFETY: as above; the plugins read it in `init` only.
    unsafe { std::env::set_var("PLINTH_MODEL_DIR", example_repository().join("minilm/1")) };
    // 16 texts of 3 to 59 tokens, as plugins_native sends.
    let sentences = String::from_utf8(fixture("sentences.txt")).expect("UTF-8 sentences");
    let texts: Vec<&str> = sentences.lines().step_by(3).take(16).collect();
    let body = serde_json::to_vec(&serde_json::json!({ "input": texts })).expect("JSON");
    let [tokenize, _] =
        plugin_stages::measure::<text_embedding::ExportedPlugin>(&server, &client, "minilm", "application/json", body);
    row(
        "tokenizer preprocess (16 texts) in the sandbox ÷ natively (minilm)",
        format!("{:.2}× ({:.0} µs)", us(tokenize.wasm) / us(tokenize.native), us(tokenize.wasm)),
        format!("native {:.0} µs", us(tokenize.native)),
        BEFORE.tokenizer_ratio,
        "≤ 1.3×",
    );
}

/// Start-up on the example repository with a warm plugin cache: its whole
/// time, minus the slowest single model load within it.
fn startup(work: &Path) {
    let cache = work.join("plugin-cache");
    drop(start_example(&cache)); // fills the plugin cache
    let (total, log) = start_example(&cache);
    let slowest = slowest_load(&log);
    row(
        "start-up, example repository (6 models), warm plugin cache: total minus the slowest load",
        format!("{:+.2} s (total {:.2} s)", total.as_secs_f64() - slowest, total.as_secs_f64()),
        format!("slowest load {slowest:.2} s"),
        BEFORE.startup_s,
        "≤ +1 s",
    );
}

/// Serves the example repository with the plugin cache `cache` until its
/// start-up loading finished; how long that took, and its log.
fn start_example(cache: &Path) -> (Duration, String) {
    use std::io::BufRead;
    let started = Instant::now();
    let mut child = Command::new(plinth_tests::binary())
        .env("ORT_DYLIB_PATH", ort_dylib_path())
        .args(["serve", "--http-address", "127.0.0.1", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"])
        .arg("--model-repository")
        .arg(example_repository())
        .arg("--plugin-cache-dir")
        .arg(cache)
        .stderr(Stdio::piped())
        .spawn()
        .expect("plinth starts");
    let mut log = String::new();
    for line in std::io::BufReader::new(child.stderr.take().expect("stderr")).lines().map_while(Result::ok) {
        log.push_str(&line);
        log.push('\n');
        if line.contains("start-up loading finished") {
            break;
        }
    }
    let total = started.elapsed();
    let _ = child.kill();
    let _ = child.wait();
    assert!(log.contains("start-up loading finished"), "plinth did not start:\n{log}");
    (total, log)
}

/// The longest time any model took from `load: start` to its footprint
/// (`load: footprint`, after every warm-up), in seconds, from a log.
fn slowest_load(log: &str) -> f64 {
    let mut started = std::collections::HashMap::new();
    let mut slowest: f64 = 0.0;
    for line in log.lines() {
        let Some(stamp) = line.split_whitespace().next().and_then(timestamp) else { continue };
        let Some(model) = line.split("model=").nth(1).and_then(|m| m.split_whitespace().next()) else { continue };
        if line.contains("load: start") {
            started.insert(model.to_owned(), stamp);
        } else if line.contains("load: footprint")
            && let Some(begun) = started.get(model)
        {
            slowest = slowest.max(stamp - begun);
        }
    }
    slowest
}

/// Seconds since midnight of an RFC 3339 timestamp (`...T09:40:00.123Z`).
fn timestamp(text: &str) -> Option<f64> {
    let time = text.split('T').nth(1)?.trim_end_matches('Z');
    let mut parts = time.split(':');
    let (h, m, s) =
        (parts.next()?.parse::<f64>().ok()?, parts.next()?.parse::<f64>().ok()?, parts.next()?.parse::<f64>().ok()?);
    Some(h * 3600.0 + m * 60.0 + s)
}

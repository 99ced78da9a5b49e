//! Test harness: starts the real release binary (`target/release/plinth`,
//! built by `make setup`) on a model repository and talks HTTP to it, as a
//! user would.
//!
//! Tests wait for events (a log line, a metric, a state), never for a
//! duration: every wait here ends when its event comes, and [`HANG_GUARD`]
//! only turns a hang into a failure.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The longest any wait for an event may take before the test fails: far
/// above what the event takes on a loaded two-core machine.
pub const HANG_GUARD: Duration = Duration::from_secs(120);

/// Waits until `f` holds, checking every 20 ms; fails after [`HANG_GUARD`]
/// naming `what`.
pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG_GUARD;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ is inside the repository").to_path_buf()
}

/// The example model repository (`model_repository/`).
pub fn example_repository() -> PathBuf {
    root().join("model_repository")
}

/// A committed test input from `tests/fixtures/`.
pub fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(root().join("tests/fixtures").join(name)).unwrap_or_else(|e| panic!("fixture {name}: {e}"))
}

/// A plugin built by `make setup` (`plugins/target/wasm32-wasip2/release/`).
pub fn built_plugin(file: &str) -> PathBuf {
    let path = root().join("plugins/target/wasm32-wasip2/release").join(file);
    assert!(path.is_file(), "{} is missing: run `make setup` first", path.display());
    path
}

/// Copies model folder `name` of the example repository into `repo`.
pub fn copy_example_model(name: &str, repo: &Path) {
    copy_dir(&example_repository().join(name), &repo.join(name));
}

/// Adds model `faulty` to `repo`: the ocr_cls network behind the test plugin
/// that traps, loops, over-allocates or sleeps on request (`plugins/faulty`).
pub fn add_faulty_model(repo: &Path) {
    add_model(
        repo,
        "faulty",
        &example_repository().join("ocr_cls/1/model.onnx"),
        r#"max_batch_size: 1
parameters { key: "plugin" value: { string_value: "faulty.wasm" } }"#,
    );
    std::fs::copy(built_plugin("faulty.wasm"), repo.join("faulty/faulty.wasm")).unwrap();
}

/// Adds model `name` to `repo`: version 1 holds a copy of `model_file`
/// (as `model.pt` for a `.pt` file, else `model.onnx`), and `config` is its
/// `config.pbtxt`.
pub fn add_model(repo: &Path, name: &str, model_file: &Path, config: &str) {
    let dir = repo.join(name);
    std::fs::create_dir_all(dir.join("1")).unwrap();
    // Each backend's default file name: TorchScript or ONNX.
    let file = if model_file.extension().is_some_and(|e| e == "pt") { "1/model.pt" } else { "1/model.onnx" };
    std::fs::copy(model_file, dir.join(file)).unwrap_or_else(|e| panic!("{}: {e}", model_file.display()));
    std::fs::write(dir.join("config.pbtxt"), config).unwrap();
}

/// Copies a folder and everything in it.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap_or_else(|e| panic!("{}: {e} (run `make setup`)", from.display())) {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A running `plinth serve`; killed when dropped. Its compiled plugins are
/// cached in a folder of its own, removed with it.
pub struct Server {
    child: Mutex<Child>,
    pid: u32,
    base: String,
    metrics_base: String,
    log: Arc<Mutex<String>>,
    _plugin_cache: tempfile::TempDir,
}

impl Server {
    /// Starts `plinth serve` on `repository` with `extra` flags, on a free
    /// port, and waits until its start-up loading has finished.
    pub fn start(repository: &Path, extra: &[&str]) -> Server {
        Server::start_on(0, repository, extra)
    }

    /// [`Server::start`] on HTTP port `http_port` (0: a free one), e.g. to
    /// restart a server where its clients expect it.
    pub fn start_on(http_port: u16, repository: &Path, extra: &[&str]) -> Server {
        let mut command = Command::new(binary());
        command.env("ORT_DYLIB_PATH", ort_dylib_path());
        Server::spawn(command, http_port, repository, extra)
    }

    /// Starts `command` (a `plinth` binary with its environment) as
    /// [`Server::start_on`] does.
    pub fn spawn(mut command: Command, http_port: u16, repository: &Path, extra: &[&str]) -> Server {
        let plugin_cache = tempfile::tempdir().expect("a folder for compiled plugins");
        let mut child = command
            .args([
                "serve",
                "--http-address",
                "127.0.0.1",
                "--http-port",
                &http_port.to_string(),
                "--metrics-port",
                "0",
                "--grpc-port",
                "0",
            ])
            .arg("--model-repository")
            .arg(repository)
            .arg("--plugin-cache-dir")
            .arg(plugin_cache.path())
            .args(patient_plugins(extra))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start target/release/plinth");
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().expect("piped stderr");
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let pid = child.id();
        let mut server = Server {
            child: Mutex::new(child),
            pid,
            base: String::new(),
            metrics_base: String::new(),
            log,
            _plugin_cache: plugin_cache,
        };
        let addr = server.wait_for_log("metrics listening on ");
        server.metrics_base = format!("http://{}", addr.split_whitespace().next().unwrap_or_default());
        let addr = server.wait_for_log("HTTP server listening on ");
        server.base = format!("http://{}", addr.split_whitespace().next().unwrap_or_default());
        server.wait_for_log("start-up loading finished");
        server
    }

    /// Everything the server has logged so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits for a log line containing `marker` (the first, if several);
    /// returns the rest of it.
    pub fn wait_for_log(&self, marker: &str) -> String {
        self.wait_for_log_count(marker, 1);
        let log = self.log();
        log.lines().find_map(|l| l.split_once(marker).map(|(_, r)| r.to_owned())).unwrap_or_default()
    }

    /// Waits until `n` log lines contain `marker`.
    pub fn wait_for_log_count(&self, marker: &str, n: usize) {
        let deadline = Instant::now() + HANG_GUARD;
        while self.log_count(marker) < n {
            if let Ok(Some(status)) = self.child.lock().unwrap().try_wait() {
                panic!("plinth exited with {status} before logging '{marker}' {n} times:\n{}", self.log());
            }
            assert!(Instant::now() < deadline, "plinth did not log '{marker}' {n} times in time:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's base URL (`http://127.0.0.1:PORT`), for a client.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The HTTP port.
    pub fn port(&self) -> u16 {
        self.base.rsplit(':').next().and_then(|p| p.parse().ok()).expect("http://127.0.0.1:PORT")
    }

    /// The server's process id, for signals.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The full URL of `path` on this server.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The whole text of `/metrics`.
    pub fn metrics_text(&self) -> String {
        client().get(format!("{}/metrics", self.metrics_base)).send().unwrap().text().unwrap()
    }

    /// The value of the Prometheus sample `series` (e.g.
    /// `plinth_model_loads_total{model="a"}`).
    ///
    /// # Panics
    /// When `/metrics` has no such series: a renamed or dropped metric
    /// fails the test instead of reading as 0.
    pub fn metric(&self, series: &str) -> f64 {
        let text = self.metrics_text();
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or_else(|| panic!("/metrics has no series {series}"))
    }

    /// The process's resident memory in bytes (`VmRSS` in /proc/PID/status).
    pub fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/PID/status");
        kb * 1024
    }

    /// GET `path`: status and body parsed as JSON (`null` if empty).
    pub fn get(&self, path: &str) -> (u16, serde_json::Value) {
        reply(client().get(self.url(path)).send())
    }

    /// POST a JSON body to `path`.
    pub fn post_json(&self, path: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
        reply(client().post(self.url(path)).json(body).send())
    }

    /// POST raw bytes with a content type to `path`.
    pub fn post_bytes(&self, path: &str, content_type: &str, body: Vec<u8>) -> (u16, serde_json::Value) {
        reply(client().post(self.url(path)).header("content-type", content_type).body(body).send())
    }

    /// Sends a JSON POST to `path` on a connection of its own and returns
    /// the connection unread: dropping it is a client that went away.
    pub fn open_request(&self, path: &str, body: &serde_json::Value) -> TcpStream {
        let body = body.to_string();
        let mut stream = TcpStream::connect(self.base.trim_start_matches("http://")).expect("connect to plinth");
        write!(
            stream,
            "POST {path} HTTP/1.1\r\nhost: plinth\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("send the request");
        stream
    }
}

impl Server {
    /// Sends SIGTERM, as an orchestrator stopping the pod would.
    pub fn terminate(&self) {
        let status = Command::new("kill").args(["-TERM", &self.pid.to_string()]).status().unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit and returns its status.
    pub fn wait_exit(&self) -> std::process::ExitStatus {
        let deadline = Instant::now() + HANG_GUARD;
        loop {
            if let Some(status) = self.child.lock().unwrap().try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "plinth did not exit in time:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// How many log lines contain `text`.
    pub fn log_count(&self, text: &str) -> usize {
        self.log().lines().filter(|l| l.contains(text)).count()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|p| p.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// `--plugin-timeout-ms` for test servers whose flags do not set it: the
/// plugin time limit guards against a plugin that never returns, and a test
/// of correctness must not fail because a loaded machine ran a plugin
/// slowly. Tests of the limit set their own.
fn patient_plugins(extra: &[&str]) -> Vec<&'static str> {
    if extra.contains(&"--plugin-timeout-ms") { vec![] } else { vec!["--plugin-timeout-ms", "600000"] }
}

/// A photo `make setup` unpacks from the scikit-learn wheel into
/// `.cache/samples` (`china.jpg`, `flower.jpg`).
pub fn sample_photo(name: &str) -> Vec<u8> {
    let path = root().join(".cache/samples").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (run `make setup`)", path.display()))
}

/// The binary under test: `$PLINTH_BIN` or `target/release/plinth`.
pub fn binary() -> PathBuf {
    let path = std::env::var_os("PLINTH_BIN").map_or_else(|| root().join("target/release/plinth"), PathBuf::from);
    assert!(path.is_file(), "{} is missing: run `make setup` first", path.display());
    path
}

/// The ONNX Runtime library: `$ORT_DYLIB_PATH` or the one `make setup` links.
pub fn ort_dylib_path() -> PathBuf {
    std::env::var_os("ORT_DYLIB_PATH")
        .map_or_else(|| root().join(".cache/onnxruntime/libonnxruntime.so"), PathBuf::from)
}

fn client() -> reqwest::blocking::Client {
    plinth_client::http_client(Some(Duration::from_secs(60)))
}

fn reply(r: reqwest::Result<reqwest::blocking::Response>) -> (u16, serde_json::Value) {
    let r = r.expect("HTTP request");
    let status = r.status().as_u16();
    let text = r.text().expect("response body");
    let body = if text.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("status {status}: body is not JSON: {text}"))
    };
    (status, body)
}

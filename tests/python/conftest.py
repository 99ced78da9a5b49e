"""Starts the real `target/release/plinth` binary (built by `make setup`) for
the Python tests, on a free port, and stops it afterwards.

Tests wait for events (a log line, a metric, a state), never for a duration;
HANG_GUARD_S only turns a hang into a failure."""

import os
import pathlib
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
HANG_GUARD_S = 120


def wait_until(what, condition):
    """Waits until `condition()` holds, checking every 20 ms."""
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


def free_ports(count):
    """`count` distinct free TCP ports on 127.0.0.1 (all bound at once, so
    that none is handed out twice)."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def identity_repository(path, dims=-1):
    """A repository with one identity model, `m`: INT32 `INPUT0` of
    `dims` (-1: any length) to `OUTPUT0`."""
    (path / "m" / "1").mkdir(parents=True)
    (path / "m" / "config.pbtxt").write_text(
        'backend: "identity"\nmax_batch_size: 0\n'
        f'input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ {dims} ] }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ {dims} ] }} ]\n')
    return path


def rss(server):
    """The server's resident memory in bytes (VmRSS of /proc/PID/status)."""
    status = pathlib.Path(f"/proc/{server.proc.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) * 1024


def chromium(user_data_dir, window_size="1500,700"):
    """Debian's headless Chromium under selenium. The machine has no network
    but the registries: nothing in the background may try to reach one."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as ChromeService

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--window-size={window_size}", f"--user-data-dir={user_data_dir}"]:
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=ChromeService("/usr/bin/chromedriver"))


class OutputLines:
    """The lines a child process writes to `stream`, collected by a thread
    of their own into `lines`; `wait_for` waits for one of them."""

    def __init__(self, proc, stream, name):
        self.proc, self.name, self.lines = proc, name, []
        self.reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.reader.start()

    def _read(self, stream):
        for line in stream:
            self.lines.append(line)

    def wait_for(self, pattern, guard_s=HANG_GUARD_S):
        """Waits for a line matching `pattern`; returns its first group (or
        the line). RuntimeError if the process exits first, TimeoutError
        after `guard_s`, each with the lines so far."""
        deadline = time.monotonic() + guard_s
        while time.monotonic() < deadline:
            exited = self.proc.poll() is not None
            if exited:
                self.reader.join(timeout=HANG_GUARD_S)  # its last lines
            for line in list(self.lines):
                found = re.search(pattern, line)
                if found:
                    return found.group(1) if found.groups() else line
            if exited:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{''.join(self.lines)}")
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} did not print {pattern!r}:\n{''.join(self.lines)}")


class NoSuchSeries(AssertionError):
    """A series a test reads is not on /metrics (a renamed or dropped
    metric, a wrong label): the message lists the series of its family."""


def series_value(server, series, default=None, scheme="http", context=None):
    """The value of `series` (the family's name with its labels as /metrics
    writes them, e.g. `nv_inference_count{model="m",version="1"}`) on
    `server`'s /metrics. An absent series raises NoSuchSeries listing the
    family's series, unless `default` is given: only for a series that is
    documented to appear with its first event (docs/observability.md: a
    family with labels has no series until something makes one)."""
    text = urllib.request.urlopen(f"{scheme}://{server.metrics_url}/metrics", timeout=HANG_GUARD_S,
                                  context=context).read().decode()
    prefix = series + " "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix):])
    if default is not None:
        return default
    family = series.split("{", 1)[0]
    present = [line for line in text.splitlines() if re.match(rf"{re.escape(family)}(\{{| )", line)]
    raise NoSuchSeries(f"no series {series} on /metrics; its family has "
                       + ("\n  ".join(["these:", *present]) if present else "none"))


def metric(server, family, model, version=1, default=None):
    """The value of `family`'s series for `model` and `version` on
    `server`'s /metrics; an absent series fails (NoSuchSeries) unless
    `default` is given (see `series_value`)."""
    return series_value(server, f'{family}{{model="{model}",version="{version}"}}', default=default)


def faulty_model(folder, *parameters, plugin_file="faulty.wasm", config_plugin="faulty.wasm"):
    """Writes into `folder` the ocr_cls network behind the test plugin that
    misbehaves on request (`plugins/faulty`), copied as `plugin_file` and
    named `config_plugin` in its config.pbtxt, with the (key, value)
    `parameters` added there; returns `folder`."""
    (folder / "1").mkdir(parents=True)
    shutil.copy(ROOT / "model_repository/ocr_cls/1/model.onnx", folder / "1/model.onnx")
    shutil.copy(ROOT / "plugins/target/wasm32-wasip2/release/faulty.wasm", folder / plugin_file)
    lines = [f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n'
             for k, v in [("plugin", config_plugin), *parameters]]
    (folder / "config.pbtxt").write_text("max_batch_size: 1\n" + "".join(lines))
    return folder


def patient_plugins(extra):
    """--plugin-timeout-ms unless the test sets it: the limit guards against
    a plugin that never returns, and a test of correctness must not fail
    because a loaded machine ran a plugin slowly."""
    return [] if "--plugin-timeout-ms" in extra else ["--plugin-timeout-ms", "600000"]


class Plinth:
    """A running `plinth serve`; `url`, `grpc_url` and `metrics_url` are its
    HTTP, gRPC and metrics addresses (host:port). Its compiled plugins are
    cached in a temporary folder of its own unless `plugin_cache` names one."""

    def __init__(self, repository, *extra, env=None, started=True, plugin_cache=None):
        """Serves `repository` (None: no --model-repository, for modelmesh
        mode; a string such as s3://... is passed as it is), with `env` added
        to the environment; returns once the start-up loads are done, or
        with `started=False` once it listens. `plugin_cache`: a folder of
        compiled plugins to share with other servers (kept at stop)."""
        binary = pathlib.Path(os.environ.get("PLINTH_BIN", ROOT / "target/release/plinth"))
        assert binary.is_file(), f"{binary} is missing: run `make setup` first"
        self.repository = repository and (repository if "://" in str(repository) else pathlib.Path(repository))
        repository_flags = ["--model-repository", str(repository)] if repository else []
        env = {**os.environ, **(env or {})}
        env.setdefault("ORT_DYLIB_PATH", str(ROOT / ".cache/onnxruntime/libonnxruntime.so"))
        self.plugin_cache = None if plugin_cache else tempfile.TemporaryDirectory(prefix="plinth-plugins-")
        self.proc = subprocess.Popen(
            [binary, "serve", "--http-address", "127.0.0.1", "--http-port", "0", "--metrics-port", "0", "--grpc-port", "0",
             "--plugin-cache-dir", str(plugin_cache or self.plugin_cache.name), *patient_plugins(extra), *repository_flags, *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.output = OutputLines(self.proc, self.proc.stderr, "plinth")
        self.log = self.output.lines
        metrics = self.wait_for_log(r'metrics listening on ([^\s"]+)')
        self.metrics_url = f"127.0.0.1:{metrics.rsplit(':', 1)[1]}"
        grpc = self.wait_for_log(r'gRPC server listening on ([^\s"]+)')
        self.grpc_url = f"127.0.0.1:{grpc.rsplit(':', 1)[1]}"
        address = self.wait_for_log(r'HTTP server listening on ([^\s"]+)')
        self.url = f"127.0.0.1:{address.rsplit(':', 1)[1]}"
        if started:
            self.wait_for_log(r"start-up loading finished")

    def wait_for_log(self, pattern):
        """Waits for a log line matching `pattern`; returns its first group
        (or the line)."""
        return self.output.wait_for(pattern)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=HANG_GUARD_S)
        if self.plugin_cache:
            self.plugin_cache.cleanup()


@pytest.fixture(scope="module")
def example_server():
    """Plinth serving the example repository (`model_repository/`)."""
    server = Plinth(ROOT / "model_repository")
    yield server
    server.stop()

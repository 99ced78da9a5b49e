"""Starts the real `target/release/plinth` binary (built by `make setup`) for
the Python tests, on a free port, and stops it afterwards.

Tests wait for events (a log line, a metric, a state), never for a duration;
HANG_GUARD_S only turns a hang into a failure."""

import os
import pathlib
import re
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


def metric(server, family, model, version=1):
    """The value of `family`'s series for `model` and `version` on
    `server`'s /metrics; 0 when it has none."""
    text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=HANG_GUARD_S).read().decode()
    prefix = f'{family}{{model="{model}",version="{version}"}} '
    return next((float(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix)), 0.0)


def patient_plugins(extra):
    """--plugin-timeout-ms unless the test sets it: the limit guards against
    a plugin that never returns, and a test of correctness must not fail
    because a loaded machine ran a plugin slowly."""
    return [] if "--plugin-timeout-ms" in extra else ["--plugin-timeout-ms", "600000"]


class Plinth:
    """A running `plinth serve`; `url`, `grpc_url` and `metrics_url` are its
    HTTP, gRPC and metrics addresses (host:port). Its compiled plugins are
    cached in a temporary folder of its own."""

    def __init__(self, repository, *extra):
        """Serves `repository` (None: no --model-repository, for modelmesh mode)."""
        binary = pathlib.Path(os.environ.get("PLINTH_BIN", ROOT / "target/release/plinth"))
        assert binary.is_file(), f"{binary} is missing: run `make setup` first"
        self.repository = repository and pathlib.Path(repository)
        repository_flags = ["--model-repository", str(repository)] if repository else []
        env = dict(os.environ)
        env.setdefault("ORT_DYLIB_PATH", str(ROOT / ".cache/onnxruntime/libonnxruntime.so"))
        self.plugin_cache = tempfile.TemporaryDirectory(prefix="plinth-plugins-")
        self.proc = subprocess.Popen(
            [binary, "serve", "--http-address", "127.0.0.1", "--http-port", "0", "--metrics-port", "0", "--grpc-port", "0",
             "--plugin-cache-dir", self.plugin_cache.name, *patient_plugins(extra), *repository_flags, *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.log = []
        threading.Thread(target=self._read_log, daemon=True).start()
        metrics = self._wait_for(r'metrics listening on ([^\s"]+)')
        self.metrics_url = f"127.0.0.1:{metrics.rsplit(':', 1)[1]}"
        grpc = self._wait_for(r'gRPC server listening on ([^\s"]+)')
        self.grpc_url = f"127.0.0.1:{grpc.rsplit(':', 1)[1]}"
        address = self._wait_for(r'HTTP server listening on ([^\s"]+)')
        self.url = f"127.0.0.1:{address.rsplit(':', 1)[1]}"
        self._wait_for(r"start-up loading finished")

    def _read_log(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def _wait_for(self, pattern):
        deadline = time.monotonic() + HANG_GUARD_S
        while time.monotonic() < deadline:
            for line in list(self.log):
                found = re.search(pattern, line)
                if found:
                    return found.group(1) if found.groups() else line
            if self.proc.poll() is not None:
                raise RuntimeError(f"plinth exited with {self.proc.returncode}:\n{''.join(self.log)}")
            time.sleep(0.05)
        raise TimeoutError(f"plinth did not log {pattern!r}:\n{''.join(self.log)}")

    def wait_for_log(self, pattern):
        """Waits for a log line matching `pattern`; returns its first group
        (or the line)."""
        return self._wait_for(pattern)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=HANG_GUARD_S)
        self.plugin_cache.cleanup()


@pytest.fixture(scope="module")
def example_server():
    """Plinth serving the example repository (`model_repository/`)."""
    server = Plinth(ROOT / "model_repository")
    yield server
    server.stop()

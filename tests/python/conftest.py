"""Starts the real `target/release/plinth` binary (built by `make setup`) for
the Python tests, on a free port, and stops it afterwards."""

import os
import pathlib
import re
import subprocess
import threading
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120


class Plinth:
    """A running `plinth serve`; `url`, `grpc_url` and `metrics_url` are its
    HTTP, gRPC and metrics addresses (host:port)."""

    def __init__(self, repository, *extra):
        """Serves `repository` (None: no --model-repository, for modelmesh mode)."""
        binary = pathlib.Path(os.environ.get("PLINTH_BIN", ROOT / "target/release/plinth"))
        assert binary.is_file(), f"{binary} is missing: run `make setup` first"
        self.repository = repository and pathlib.Path(repository)
        repository_flags = ["--model-repository", str(repository)] if repository else []
        env = dict(os.environ)
        env.setdefault("ORT_DYLIB_PATH", str(ROOT / ".venv/libonnxruntime.so"))
        self.proc = subprocess.Popen(
            [binary, "serve", "--http-address", "127.0.0.1", "--http-port", "0", "--metrics-port", "0", "--grpc-port", "0",
             *repository_flags, *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.log = []
        threading.Thread(target=self._read_log, daemon=True).start()
        metrics = self._wait_for(r"metrics listening on (\S+)")
        self.metrics_url = f"127.0.0.1:{metrics.rsplit(':', 1)[1]}"
        grpc = self._wait_for(r"gRPC server listening on (\S+)")
        self.grpc_url = f"127.0.0.1:{grpc.rsplit(':', 1)[1]}"
        address = self._wait_for(r"HTTP server listening on (\S+)")
        self.url = f"127.0.0.1:{address.rsplit(':', 1)[1]}"
        self._wait_for(r"start-up loading finished")

    def _read_log(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def _wait_for(self, pattern):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for line in list(self.log):
                found = re.search(pattern, line)
                if found:
                    return found.group(1) if found.groups() else line
            if self.proc.poll() is not None:
                raise RuntimeError(f"plinth exited with {self.proc.returncode}:\n{''.join(self.log)}")
            time.sleep(0.05)
        raise TimeoutError(f"plinth did not log {pattern!r}:\n{''.join(self.log)}")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def example_server():
    """Plinth serving the example repository (`model_repository/`)."""
    server = Plinth(ROOT / "model_repository")
    yield server
    server.stop()

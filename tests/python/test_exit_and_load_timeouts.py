"""Two timeouts the guide promises, against the real binary.

`--exit-timeout-secs` (docs/lifecycle.md, Shutdown): after SIGTERM the
requests already accepted finish, and the process exits 0; if some are still
running at the timeout it exits at once with status 1. The requests are two
rows of an identity model whose batch waits in its queue until both are
there and then sleeps ten minutes in its backend (`execute_delay_ms`), so
at SIGTERM both are known to be running, and stay so far past the timeout.

`--model-load-timeout-secs` in on_demand mode (docs/residency.md, docs/cli.md):
a request for a model that is not resident waits at most that long for its
load and gets a 503 naming the flag; the load goes on, and the model then
answers, loaded once. The load is held by the test plugin's `init_wait`
until the test creates a file, so it outlasts the timeout for certain."""

import http.client
import json
import signal
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

from conftest import HANG_GUARD_S, Plinth, faulty_model, metric, series_value, wait_until


def post(server, path, body, content_type="application/json"):
    """(status, headers, JSON body) of a POST; (None, None, the error) when
    the connection ends without an answer."""
    request = urllib.request.Request(f"http://{server.url}{path}", data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=HANG_GUARD_S) as answer:
            return answer.status, answer.headers, json.load(answer)
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.load(e)
    except (urllib.error.URLError, ConnectionError, http.client.HTTPException) as e:
        return None, None, e


def rows(values):
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "INT32",
                                   "data": values}]}).encode()


def sleeping_repository(path, delay_ms):
    """`sleepy`: identity over INT32 rows of 4; a batch goes when two rows are
    queued (the queue delay is only a hang guard) and its execution sleeps
    `delay_ms`."""
    (path / "sleepy" / "1").mkdir(parents=True)
    (path / "sleepy" / "config.pbtxt").write_text(
        'backend: "identity"\nmax_batch_size: 2\ninstance_group [ { count: 1 kind: KIND_CPU } ]\n'
        'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]\n'
        'dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 600000000 }\n'
        f'parameters {{ key: "execute_delay_ms" value: {{ string_value: "{delay_ms}" }} }}\n')
    return path


class TwoRunning:
    """Two requests to `sleepy` sent on threads of their own; returns once
    both are running (their batch left the queue). `answers` holds what
    each got."""

    def __init__(self, server):
        self.answers = [None, None]
        self.threads = []
        for n, values in enumerate([[1, 2, 3, 4], [5, 6, 7, 8]]):
            thread = threading.Thread(target=self._send, args=(server, n, values), daemon=True)
            thread.start()
            self.threads.append(thread)
            # The first waits in the queue for the second (pending 1); the
            # second completes the batch, which leaves the queue to run
            # (pending 0, which nothing else can make it).
            wait_until("the first request waits in the queue" if n == 0 else "the batch of two runs",
                       lambda: metric(server, "nv_inference_pending_request_count", "sleepy") == 1 - n)

    def _send(self, server, n, values):
        self.answers[n] = post(server, "/v2/models/sleepy/infer", rows(values))

    def join(self):
        for thread in self.threads:
            thread.join(timeout=HANG_GUARD_S)
            assert not thread.is_alive(), "a request got no end"


def test_requests_still_running_at_the_exit_timeout_make_the_process_exit_1(tmp_path):
    server = Plinth(sleeping_repository(tmp_path / "repo", 600_000), "--exit-timeout-secs", "1")
    try:
        running = TwoRunning(server)
        assert metric(server, "nv_inference_exec_count", "sleepy") == 0, "the batch is still running"
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=HANG_GUARD_S) == 1, "".join(server.log)
        server.output.reader.join(timeout=HANG_GUARD_S)
        warning = [line for line in server.log if "exit timeout reached" in line]
        assert len(warning) == 1, "".join(server.log)
        assert "exit timeout reached with requests still running; exiting without them unfinished=2" in warning[0]
        assert not any(line.rstrip().endswith("plinth::server: stopped") for line in server.log), \
            "it exited without its orderly end"
        running.join()
        for status, _, error in running.answers:
            assert status is None, (status, error)  # no answer: the process went without them
    finally:
        end(server)


def test_requests_that_finish_within_the_exit_timeout_are_answered_and_the_process_exits_0(tmp_path):
    # An execution of 2 s against a 600 s exit timeout.
    server = Plinth(sleeping_repository(tmp_path / "repo", 2_000), "--exit-timeout-secs", "600")
    try:
        running = TwoRunning(server)
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=HANG_GUARD_S) == 0, "".join(server.log)
        running.join()
        assert [(status, body["outputs"][0]["data"]) for status, _, body in running.answers] == [
            (200, [1, 2, 3, 4]), (200, [5, 6, 7, 8])]
        server.output.reader.join(timeout=HANG_GUARD_S)
        assert not any("exit timeout reached" in line for line in server.log), "".join(server.log)
        assert server.log[-1].rstrip().endswith("plinth::server: stopped"), "".join(server.log[-3:])
    finally:
        end(server)


def end(server):
    """Kills `server` if a failed check left it running; removes its plugin cache."""
    if server.proc.poll() is None:
        server.proc.kill()
        server.proc.wait(timeout=HANG_GUARD_S)
    server.plugin_cache.cleanup()


@pytest.fixture
def held_repository(tmp_path):
    """`held`: the test plugin's model, whose init (part of the load) waits
    for the file `1/release`."""
    return faulty_model(tmp_path / "repo" / "held", ("faulty.init_wait", "release"),
                        ("plugin.timeout_ms", "600000"))


def test_on_demand_a_request_waits_at_most_the_load_timeout_and_the_load_goes_on(held_repository):
    server = Plinth(held_repository.parent, "--model-control-mode", "on_demand", "--model-load-timeout-secs", "1")
    try:
        loads = lambda: series_value(server, 'plinth_model_loads_total{model="held"}', default=0.0)  # noqa: E731
        assert loads() == 0, "nothing loads before a request"
        status, headers, body = post(server, "/v2/models/held/predict", b"ok", "application/octet-stream")
        assert status == 503, body
        assert body == {"error": "model 'held' did not finish loading within 1 s (--model-load-timeout-secs); "
                                 "try again"}, body
        assert headers["Retry-After"] == "1"
        # The load goes on.
        wait_until("the load goes on", lambda: series_value(server, "plinth_model_loads_in_progress") == 1)
        assert loads() == 1
        # A second request waits on the same load, and also gives up.
        status, _, body = post(server, "/v2/models/held/predict", b"ok", "application/octet-stream")
        assert status == 503 and "--model-load-timeout-secs" in body["error"], body
        assert loads() == 1, "the second request started no second load"
        (held_repository / "1/release").write_bytes(b"")
        server.wait_for_log(r"load: ready model=held ")
        wait_until("the load is over", lambda: series_value(server, "plinth_model_loads_in_progress") == 0)
        status, _, body = post(server, "/v2/models/held/predict", b"ok", "application/octet-stream")
        assert status == 200, body
        (want,) = __import__("onnxruntime").InferenceSession(str(held_repository / "1/model.onnx")).run(
            None, {"x": np.zeros((1, 3, 1, 1), np.float32)})
        np.testing.assert_allclose(body["outputs"][0]["data"], want.ravel(), rtol=0, atol=1e-6)
        assert loads() == 1, "loaded once"
        assert sum("load: ready model=held " in line for line in server.log) == 1, "".join(server.log)
    finally:
        server.stop()

"""What the remote backend tries again, against the real binary
(docs/model-repository.md, Remote): a refused connection and a 503 or 429
are tried again (`remote.retries`); a request that timed out is not, since
it may have run; a malformed answer and any other failure are a 502, tried
once.

The remote is a second Plinth where it can show the case: a relay in front
of it refuses connections (a bound socket that does not listen yet) until
the kernel has refused two of the front's attempts, then forwards, and the
second Plinth's metrics count one execution; a second Plinth whose model
sleeps past the front's timeout receives the request once. A small Python
server plays the remote for the answers a Plinth does not give on demand
(503, 429, 500 and a malformed body in a given order), counting every
request it receives."""

import http.server
import json
import socket
import threading
import urllib.error
import urllib.request

import pytest

from conftest import HANG_GUARD_S, Plinth, identity_repository, metric, series_value, wait_until


def infer(server, model, values):
    """(status, JSON body) of an inference of INT32 `values` on `server`."""
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [len(values)], "datatype": "INT32",
                                   "data": values}]}).encode()
    request = urllib.request.Request(f"http://{server.url}/v2/models/{model}/infer", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=HANG_GUARD_S) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def front_model(repo, name, url, remote_model, retries, timeout_ms=60_000):
    """`name` in `repo`: `remote_model` at `url`, INT32 INPUT0 to OUTPUT0."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(f"""
backend: "remote"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
parameters {{ key: "remote.url" value {{ string_value: "{url}" }} }}
parameters {{ key: "remote.model" value {{ string_value: "{remote_model}" }} }}
parameters {{ key: "remote.retries" value {{ string_value: "{retries}" }} }}
parameters {{ key: "remote.timeout_ms" value {{ string_value: "{timeout_ms}" }} }}
""")


def refused_connections():
    """TCP resets this network namespace has sent (/proc/net/snmp OutRsts):
    a SYN to a port with no listener is answered by one."""
    lines = [line.split() for line in open("/proc/net/snmp").read().splitlines() if line.startswith("Tcp:")]
    return int(lines[1][lines[0].index("OutRsts")])


class Relay:
    """A TCP relay on a fixed port to `upstream` (host:port). `refuse()`
    leaves the port bound but not listening, so the kernel refuses
    connections to it; `forward()` listens again and relays."""

    def __init__(self, upstream):
        self.upstream = upstream.rsplit(":", 1)
        self.sockets, self.listener = [], None
        self.port = self._bind().getsockname()[1]
        self.forward()

    def _bind(self, port=0):
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", port))
        return self.listener

    def forward(self):
        self.listener.listen()
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def refuse(self):
        """Closes the listener and every relayed connection, and binds the
        port again without listening."""
        listener, self.listener = self.listener, None
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        for s in self.sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self.sockets = []
        self._bind(self.port)

    def _accept(self, listener):
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection((self.upstream[0], int(self.upstream[1])), timeout=HANG_GUARD_S)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source, sink):
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self):
        if self.listener:
            self.listener.close()
        for s in self.sockets:
            s.close()


class ScriptedRemote(http.server.ThreadingHTTPServer):
    """A KServe v2 server for any model with INT32 INPUT0 and OUTPUT0 of
    any length: its metadata is right, and each inference of model M gets
    the next answer of `script[M]`: a status (503, 429, 500: an error body),
    "ok" (OUTPUT0 = [7, 8, 9]) or "malformed" (a 200 whose body is not a v2
    answer). `calls[M]` counts the inferences received."""

    def __init__(self, script):
        self.script = {model: list(answers) for model, answers in script.items()}
        self.calls = {model: 0 for model in script}
        self.lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def reply(self, status, body, content_type="application/json"):
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                model = self.path.split("/")[3]
                tensor = {"datatype": "INT32", "shape": [-1]}
                self.reply(200, json.dumps({"name": model, "versions": ["1"], "platform": "scripted",
                                            "inputs": [{"name": "INPUT0", **tensor}],
                                            "outputs": [{"name": "OUTPUT0", **tensor}]}).encode())

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                model = self.path.split("/")[3]
                with self.server.lock:
                    self.server.calls[model] += 1
                    answer = self.server.script[model].pop(0)
                if answer == "ok":
                    self.reply(200, json.dumps({"model_name": model, "outputs": [
                        {"name": "OUTPUT0", "datatype": "INT32", "shape": [3], "data": [7, 8, 9]}]}).encode())
                elif answer == "malformed":
                    self.reply(200, b"<html>not a v2 answer</html>", "text/html")
                else:
                    self.reply(answer, json.dumps({"error": f"scripted {answer}"}).encode())

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"


def received(server, model):
    """Requests `model` on `server` has taken in: succeeded or failed for
    any reason (each failure reason's series appears with its first one)."""
    reasons = ["REJECTED", "CANCELED", "BACKEND", "OTHER"]
    return metric(server, "nv_inference_request_success", model) + sum(
        series_value(server, f'nv_inference_request_failure{{model="{model}",reason="{r}",version="1"}}', default=0.0)
        for r in reasons)


@pytest.fixture(scope="module")
def callee(tmp_path_factory):
    """The second Plinth: `m` (identity) and `slow` (identity whose every
    execution sleeps 3 s, one at a time)."""
    repo = identity_repository(tmp_path_factory.mktemp("callee"))
    (repo / "slow" / "1").mkdir(parents=True)
    (repo / "slow" / "config.pbtxt").write_text(
        'backend: "identity"\nmax_batch_size: 0\ninstance_group [ { count: 1 kind: KIND_CPU } ]\n'
        'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        'parameters { key: "execute_delay_ms" value: { string_value: "3000" } }\n')
    server = Plinth(repo)
    yield server
    server.stop()


def test_a_refused_connection_is_tried_again_and_runs_once(callee, tmp_path):
    relay = Relay(callee.url)
    front_model(tmp_path, "relayed", f"http://127.0.0.1:{relay.port}", "m", retries=10)
    front = Plinth(tmp_path)  # loads `relayed`: its metadata comes through the relay
    try:
        relay.refuse()
        before = refused_connections()
        answer = {}
        sending = threading.Thread(target=lambda: answer.update(result=infer(front, "relayed", [4, 5, 6])))
        sending.start()
        wait_until("two of the front's connections are refused", lambda: refused_connections() >= before + 2)
        assert "result" not in answer, answer
        relay.forward()
        sending.join(timeout=HANG_GUARD_S)
        status, body = answer["result"]
        assert status == 200, body
        assert body["outputs"][0]["data"] == [4, 5, 6]
        assert metric(callee, "nv_inference_exec_count", "m") == 1
        assert received(callee, "m") == 1
    finally:
        front.stop()
        relay.close()


def test_a_timed_out_request_is_not_tried_again(callee, tmp_path):
    # The remote answers after 3 s at the earliest, the front waits 1 s.
    front_model(tmp_path, "timed", f"http://{callee.url}", "slow", retries=3, timeout_ms=1000)
    front = Plinth(tmp_path)
    try:
        status, body = infer(front, "timed", [1, 2])
        assert status == 503, body
        assert body["error"].endswith(
            f"remote model 'slow' at http://{callee.url} did not answer within remote.timeout_ms = 1000 ms"), body
        wait_until("the request ran once on the remote", lambda: metric(callee, "nv_inference_exec_count", "slow") == 1)
        # One request after it, straight to the remote, runs after anything
        # queued before it (one instance, in order): a retry would be
        # counted by the time it is answered.
        status, body = infer(callee, "slow", [3])
        assert status == 200 and body["outputs"][0]["data"] == [3], body
        assert metric(callee, "nv_inference_exec_count", "slow") == 2
        assert received(callee, "slow") == 2, "the front sent its request once"
    finally:
        front.stop()


@pytest.mark.parametrize("model, script, retries, status, words, calls", [
    ("overloaded_then_ok", [503, 429, "ok"], 2, 200, None, 3),
    ("always_overloaded", [503, 503, 503, "ok"], 2, 503, "cannot serve (HTTP 503): scripted 503", 3),
    ("too_many", [429], 0, 503, "cannot serve (HTTP 429): scripted 429", 1),
    ("failing", [500, "ok"], 2, 502, "failed (HTTP 500): scripted 500", 1),
    ("malformed", ["malformed", "ok"], 2, 502, "sent a malformed answer", 1),
])
def test_503_and_429_are_tried_again_and_other_failures_are_a_502_tried_once(
        tmp_path, model, script, retries, status, words, calls):
    remote = ScriptedRemote({model: script})
    front_model(tmp_path, "front", remote.url, model, retries=retries)
    front = Plinth(tmp_path)
    try:
        got, body = infer(front, "front", [1, 2, 3])
        assert got == status, body
        if status == 200:
            assert body["outputs"][0]["data"] == [7, 8, 9], body
        else:
            assert f"remote model '{model}' at {remote.url} {words}" in body["error"], body
        # Every attempt is made before the front answers.
        assert remote.calls[model] == calls, remote.calls
    finally:
        front.stop()
        remote.shutdown()

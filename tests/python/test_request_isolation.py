"""One request cannot stop the others, through the real binary: a rollout
plan with a number past its range (a dwell of 1e20 s once panicked inside
the rollouts' lock on the first answer it judged, and from then on every
request to every model got no answer) is refused naming the field, over
the API and declared in a poll-mode config.pbtxt; a panic forced inside one
request (the test-only fault hook, PLINTH_TEST_FAULTS=1) fails that request
alone with a 500 saying so, and the next requests to every model, over
HTTP and gRPC, and the repository routes answer; while a request holds
the core's lock, readiness says the server cannot serve, and says so no
longer once it lets go."""

import json
import shutil
import threading
import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as grpcclient
import numpy as np

from conftest import HANG_GUARD_S, Plinth, wait_until

CONFIG = """backend: "identity"
max_batch_size: 0
version_policy {{ all {{}} }}
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
{extra}"""


def model(repo, name, versions=(1,), extra=""):
    for v in versions:
        (repo / name / str(v)).mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(extra=extra))


def call(server, method, path, body=None, headers=None):
    """(status, JSON body, headers) of a request to `server`."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    request = urllib.request.Request(f"http://{server.url}{path}", data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=HANG_GUARD_S) as answer:
            text = answer.read()
            return answer.status, json.loads(text) if text else None, answer.headers
    except urllib.error.HTTPError as e:
        text = e.read()
        return e.code, json.loads(text) if text else None, e.headers


INPUT = {"inputs": [{"name": "INPUT0", "shape": [3], "datatype": "INT32", "data": [1, 2, 3]}]}


def infer(server, name, headers=None):
    return call(server, "POST", f"/v2/models/{name}/infer", INPUT, headers)


def answers_right(server, name):
    status, body, _ = infer(server, name)
    return status == 200 and body["outputs"][0]["data"] == [1, 2, 3]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("isolation")
    model(repo, "m", versions=(1, 2))
    model(repo, "n")
    plinth = Plinth(repo, env={"PLINTH_TEST_FAULTS": "1"})
    yield plinth
    plinth.stop()


@pytest.mark.parametrize("plan, words", [
    ({"candidate": 2, "dwell_secs": 1e20}, "'dwell_secs' must be in [0, 2592000], got 100000000000000000000"),
    ({"candidate": 2, "p99_slack_ms": 1e308}, "'p99_slack_ms' must be in [0, 3600000]"),
    ({"candidate": 2, "max_p99_ratio": 1e300}, "'max_p99_ratio' must be in [1, 1000]"),
    ({"candidate": 2, "shadow": []}, "'shadow' must be a JSON object, got []"),
    ({"candidate": 2, "sticky_header": "bad header\n"}, "'sticky_header' must be a header name"),
    ({"candidate": 2, "sticky_header": ":authority"}, "'sticky_header' must be a header name"),
    ({"candidate": 2, "sticky_header": "x" * (10 << 20)}, "'sticky_header' is 10485760 bytes long, more than 256"),
    ({"candidate": 2, "steps": [s / 1000 for s in range(1, 100_000)] + [100]}, "'steps' has 100000 steps, more than 100"),
], ids=["dwell", "slack", "ratio", "shadow", "newline", "pseudo", "long", "steps"])
def test_a_plan_past_its_ranges_is_refused_naming_the_field_and_everything_serves(server, plan, words):
    status, body, _ = call(server, "POST", "/v2/repository/models/m/rollout", plan)
    assert status == 400, body
    assert words in body["error"], body
    for name in ("m", "n"):
        assert answers_right(server, name)


def test_a_declared_plan_past_its_range_fails_only_that_load(tmp_path):
    """Poll mode: a new version whose config declares a dwell of 1e20 s is
    refused, naming the field, and the serving version goes on."""
    model(tmp_path, "m")
    model(tmp_path, "n")
    plinth = Plinth(tmp_path, "--model-control-mode", "poll", "--repository-poll-secs", "1")
    try:
        plan = json.dumps({"dwell_secs": 1e20, "steps": [100]}).replace('"', '\\"')
        model(tmp_path, "m", versions=(1, 2), extra=f'parameters {{ key: "rollout" value: {{ string_value: "{plan}" }} }}\n')
        index = lambda: call(plinth, "POST", "/v2/repository/index", {})[1]
        reason = lambda: next((r.get("reason", "") for r in index() if r["name"] == "m" and "dwell_secs" in r.get("reason", "")), None)
        wait_until("the new configuration is refused", reason)
        assert "'dwell_secs' must be in [0, 2592000]" in reason(), reason()
        for name in ("m", "n"):
            assert answers_right(plinth, name)
    finally:
        plinth.stop()


def test_a_panic_inside_one_request_fails_it_alone(server):
    status, body, _ = infer(server, "m", {"plinth-test-fault": "panic"})
    assert status == 500, body
    assert "a panic: a fault injected by 'plinth-test-fault: panic'" in body["error"], body
    # The lock it held is not poisoned: every route that takes it answers.
    for name in ("m", "n"):
        assert answers_right(server, name)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", [3], "INT32")
    tensor.set_data_from_numpy(np.array([4, 5, 6], np.int32))
    for name in ("m", "n"):
        assert client.infer(name, [tensor]).as_numpy("OUTPUT0").tolist() == [4, 5, 6]
    status, body, _ = call(server, "POST", "/v2/repository/models/m/rollout", {"candidate": 2, "steps": [100]})
    assert (status, body["phase"]) == (200, "CANARY"), body
    assert call(server, "DELETE", "/v2/repository/models/m/rollout")[0] == 200
    assert call(server, "POST", "/v2/repository/index", {})[0] == 200
    assert call(server, "GET", "/v2/health/ready")[0] == 200


def test_readiness_says_the_core_cannot_serve_while_a_request_holds_its_lock(server):
    held = threading.Thread(target=infer, args=(server, "n", {"plinth-test-fault": "hold=20"}))
    held.start()
    try:
        wait_until("readiness is 503", lambda: call(server, "GET", "/v2/health/ready")[0] == 503)
        assert server.wait_for_log(r"not ready: the rollouts' lock has been held for over 1s")
    finally:
        held.join(timeout=HANG_GUARD_S)
    wait_until("readiness is 200 again", lambda: call(server, "GET", "/v2/health/ready")[0] == 200)
    assert answers_right(server, "m")

"""Rollouts inside one server, through the real binary under concurrent
traffic: a candidate that fails a fifth of its requests and one three times
slower are rolled back on their own evidence; one whose answers differ is
refused in the shadow phase before it answers anybody; a good one is
promoted through shadowing and every step with no failed request; a sticky
header keeps one client on one version. The models are ONNX graphs written here: version 1
answers its input as it came; each candidate version 2 does too, but
fails, or works three times as long, or not, as the test needs."""

import json
import os
import pathlib
import shutil
import threading
import urllib.error
import urllib.request

import numpy as np
from onnx import TensorProto, helper, numpy_helper, save

from conftest import HANG_GUARD_S, ROOT, Plinth, chromium, wait_until

CONFIG = """name: "ro"
backend: "onnxruntime"
max_batch_size: 0
version_policy { all {} }
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
# X[0] is 4 in a good request; 5 makes the failing candidate's Reshape fail.
GOOD, BAD = [4.0, 1.0, 2.0, 3.0], [5.0, 1.0, 2.0, 3.0]


def save_graph(path, nodes, initializers=()):
    graph = helper.make_graph(nodes, "ro", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    path.parent.mkdir(parents=True, exist_ok=True)
    save(model, path)


def identity(path):
    save_graph(path, [helper.make_node("Identity", ["X"], ["Y"])])


def failing(path):
    """Y = X reshaped to [X[0]]: fails at run time unless X[0] is 4."""
    save_graph(path, [
        helper.make_node("Slice", ["X", "zero", "one"], ["first"]),
        helper.make_node("Cast", ["first"], ["shape"], to=TensorProto.INT64),
        helper.make_node("Reshape", ["X", "shape"], ["Y"]),
    ], [numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "one")])


def off_by_one(path):
    """Y = X + 1: answers that differ from version 1's."""
    save_graph(path, [helper.make_node("Add", ["X", "one"], ["Y"])],
               [numpy_helper.from_array(np.array(1.0, np.float32), "one")])


def working(products):
    """Y = X + 0 * sum(W^products): `products` 256x256 matrix products per
    request, so that run time grows with `products`."""

    def write(path):
        # W scaled by X[0]: the products depend on the input, so ONNX
        # Runtime cannot fold them into a constant when it loads the model.
        nodes = [helper.make_node("Slice", ["X", "first_at", "first_end"], ["first"]),
                 helper.make_node("Mul", ["W", "first"], ["scaled"])]
        previous = "scaled"
        for i in range(products):
            nodes.append(helper.make_node("MatMul", [previous, "W"], [f"p{i}"]))
            previous = f"p{i}"
        nodes += [helper.make_node("ReduceSum", [previous], ["total"], keepdims=0),
                  helper.make_node("Mul", ["total", "zero"], ["nothing"]),
                  helper.make_node("Add", ["X", "nothing"], ["Y"])]
        w = np.full((256, 256), 1e-3, np.float32)
        save_graph(path, nodes, [numpy_helper.from_array(w, "W"),
                                 numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
                                 numpy_helper.from_array(np.array([0], np.int64), "first_at"),
                                 numpy_helper.from_array(np.array([1], np.int64), "first_end")])

    return write


def repository(tmp_path, candidate, serving=identity):
    repo = tmp_path / "repo"
    (repo / "ro").mkdir(parents=True)
    (repo / "ro/config.pbtxt").write_text(CONFIG)
    serving(repo / "ro/1/model.onnx")
    candidate(repo / "ro/2/model.onnx")
    return repo


def call(server, path, body=None, headers=None, method=None):
    request = urllib.request.Request(f"http://{server.url}{path}", data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=HANG_GUARD_S) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def infer(server, x, headers=None):
    body = json.dumps({"inputs": [{"name": "X", "shape": [4], "datatype": "FP32", "data": x}]}).encode()
    return call(server, "/v2/models/ro/infer", body, {"Content-Type": "application/json", **(headers or {})})


def rollout(server):
    return call(server, "/v2/repository/models/ro/rollout")[1]


class Traffic:
    """`clients` threads sending requests to `ro` until stopped; every fifth
    request of each is BAD when `bad_share` asks. Records each answer as
    (was it BAD, status, version that answered)."""

    def __init__(self, server, clients=4, bad_share=False, headers=lambda i: None):
        self.server, self.answers, self.done = server, [], threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i, bad_share, headers(i)), daemon=True)
                        for i in range(clients)]
        for thread in self.threads:
            thread.start()

    def _run(self, i, bad_share, headers):
        n = 0
        while not self.done.is_set():
            bad = bad_share and n % 5 == 4
            status, body = infer(self.server, BAD if bad else GOOD, headers)
            with self.lock:
                self.answers.append((i, bad, status, (body or {}).get("model_version")))
            n += 1

    def count(self):
        with self.lock:
            return len(self.answers)

    def stop(self):
        self.done.set()
        for thread in self.threads:
            thread.join(timeout=HANG_GUARD_S)
            assert not thread.is_alive(), "a client hangs"
        return list(self.answers)


def start(server, plan):
    status, body = call(server, "/v2/repository/models/ro/rollout", json.dumps(plan).encode(),
                        {"Content-Type": "application/json"})
    assert status == 200, body
    return body


def explicit_server(repo):
    server = Plinth(repo, "--model-control-mode", "explicit")
    assert call(server, "/v2/repository/models/ro/load", b"")[0] == 200
    return server


def test_a_candidate_that_fails_a_fifth_of_its_requests_is_rolled_back(tmp_path):
    server = explicit_server(repository(tmp_path, failing))
    try:
        plan = {"candidate": 2, "serving": 1, "steps": [10, 50, 100], "dwell_secs": 1, "min_requests": 50,
                "max_error_rate": 0.05}
        start(server, plan)
        traffic = Traffic(server, bad_share=True)
        wait_until("the rollout rolls back", lambda: rollout(server)["phase"] == "ROLLED_BACK")
        at_rollback = traffic.count()
        wait_until("traffic goes on", lambda: traffic.count() >= at_rollback + 200)
        answers = traffic.stop()
    finally:
        server.stop()
    failed = [a for a in answers if a[2] != 200]
    # Only the candidate fails, only BAD requests, and only while it had its
    # first step's share: at most the rule's allowance (more than 5 % of 50
    # is 3) plus one request in flight per client.
    assert all(bad and version in (None, "2") for _, bad, _, version in failed), failed[:3]
    print(f"failing candidate: {len(failed)} failed of {len(answers)} answers")
    assert 0 < len(failed) <= 3 + 4, len(failed)
    assert all(a[2] == 200 for a in answers[at_rollback + 4:]), "no failure after the rollback"


def test_the_rolled_back_candidate_says_why_in_the_index_and_the_metrics(tmp_path):
    server = explicit_server(repository(tmp_path, failing))
    try:
        start(server, {"candidate": 2, "steps": [50, 100], "min_requests": 10, "max_error_rate": 0.1})
        for _ in range(40):
            infer(server, BAD)
        status = rollout(server)
        assert status["phase"] == "ROLLED_BACK" and status["percent"] == 0, status
        assert status["reason"].startswith("error rate: 2 of "), status
        rows = {r.get("version"): r for r in call(server, "/v2/repository/index", b"{}")[1]}
        assert rows["2"]["reason"].startswith("rolled back: error rate"), rows["2"]
        assert rows["2"]["rollout"] == {"role": "candidate", "phase": "ROLLED_BACK", "percent": 0.0}
        assert rows["1"]["rollout"]["percent"] == 100.0
        assert all(infer(server, BAD)[1]["model_version"] == "1" for _ in range(20)), "version 1 takes it all"
        text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=HANG_GUARD_S).read().decode()
        assert 'plinth_rollout_phase{model="ro",phase="ROLLED_BACK"} 1' in text
        assert 'plinth_rollout_requests_total{model="ro",outcome="failure",role="candidate"} 2' in text
        server.wait_for_log(r"rollout rolled back: error rate")
    finally:
        server.stop()


def test_a_candidate_three_times_slower_is_rolled_back_on_p99(tmp_path):
    server = explicit_server(repository(tmp_path, working(24), serving=working(8)))
    try:
        start(server, {"candidate": 2, "steps": [50, 100], "dwell_secs": 0, "min_requests": 50})
        traffic = Traffic(server)
        wait_until("the rollout ends", lambda: rollout(server)["phase"] != "CANARY")
        answers = traffic.stop()
        status = rollout(server)
    finally:
        server.stop()
    assert status["phase"] == "ROLLED_BACK", status
    assert status["reason"].startswith("p99 latency: version 2 took"), status
    print(f"three times slower candidate: p99 ratio {status['p99_ratio']:.1f}", status["candidate_window"], status["serving_window"])
    assert status["p99_ratio"] > 1.5, status
    assert all(a[2] == 200 for a in answers), "a slow answer is still an answer"


def test_a_good_candidate_is_promoted_through_every_step_with_no_failed_request(tmp_path):
    server = explicit_server(repository(tmp_path, identity))
    try:
        # Identical models: only noise could break the latency rule, and
        # a machine shared with other tests makes noise of milliseconds.
        plan = {"candidate": 2, "steps": [10, 50, 100], "dwell_secs": 0.5, "min_requests": 50, "p99_slack_ms": 1000}
        # The plan comes with the load, as a load parameter.
        body = json.dumps({"parameters": {"rollout": json.dumps(plan)}}).encode()
        assert call(server, "/v2/repository/models/ro/load", body)[0] == 200
        traffic = Traffic(server)
        seen = set()

        def promoted():
            status = rollout(server)
            seen.add(status["step"])
            return status["phase"] == "PROMOTED"

        wait_until("the candidate is promoted", promoted)
        wait_until("version 1 is gone", lambda: call(server, "/v2/models/ro")[1]["versions"] == ["2"])
        answers = traffic.stop()
    finally:
        server.stop()
    assert seen >= {3}, seen
    assert [a for a in answers if a[2] != 200] == []
    assert {a[3] for a in answers} == {"1", "2"}
    assert answers[-1][3] == "2"


def test_one_sticky_header_value_meets_one_version_during_a_step(tmp_path):
    server = explicit_server(repository(tmp_path, identity))
    try:
        # Identical models: a generous latency slack keeps noise from
        # rolling the candidate back in the middle of the count.
        start(server, {"candidate": 2, "steps": [50, 100], "dwell_secs": 3600, "sticky_header": "x-user",
                       "p99_slack_ms": 1000})
        met = {}
        for i in range(200):
            for _ in range(3):
                status, body = infer(server, GOOD, {"x-user": f"user-{i}"})
                assert status == 200
                met.setdefault(i, set()).add(body["model_version"])
        assert all(len(versions) == 1 for versions in met.values()), "one user, one version"
        shares = sum(versions == {"2"} for versions in met.values())
        assert 60 < shares < 140, f"about half the users meet version 2: {shares}"
        assert (rollout(server)["phase"], rollout(server)["step"]) == ("CANARY", 1)
    finally:
        server.stop()


def test_a_plan_with_an_unknown_field_or_versions_not_ready_is_refused(tmp_path):
    server = explicit_server(repository(tmp_path, identity))
    try:
        status, body = call(server, "/v2/repository/models/ro/rollout", b'{"candidate": 2, "stepz": [100]}')
        assert status == 400 and "unknown field `stepz`" in body["error"], body
        status, body = call(server, "/v2/repository/models/ro/rollout", b'{"candidate": 3}')
        assert status == 400 and "candidate version 3 is not READY" in body["error"], body
        status, body = call(server, "/v2/repository/models/nope/rollout", b'{"candidate": 2}')
        assert status == 404, body
        assert call(server, "/v2/repository/models/ro/rollout")[0] == 404
        start(server, {"candidate": 2})
        status, body = call(server, "/v2/repository/models/ro/rollout", method="DELETE")
        assert status == 200 and body["phase"] == "ROLLED_BACK" and body["reason"] == "cancelled through the API"
    finally:
        server.stop()


def test_the_status_page_shows_a_rollout_in_a_browser(tmp_path):
    """In Debian's Chromium: the rollouts table names both versions, the
    phase, the step and the candidate's share. PLINTH_SCREENSHOT=PATH keeps
    a picture of the page (the one in docs/ was taken so)."""
    from selenium.webdriver.support.ui import WebDriverWait

    server = explicit_server(repository(tmp_path, identity))
    browser = chromium(tmp_path / "chromium", window_size="1500,500")
    try:
        start(server, {"candidate": 2, "steps": [10, 50, 100], "dwell_secs": 3600, "min_requests": 20,
                       "p99_slack_ms": 1000})
        for _ in range(100):
            assert infer(server, GOOD)[0] == 200
        browser.get(f"http://{server.url}/")
        read = """
        if (document.readyState !== 'complete') return null;
        const row = document.querySelector('#rollouts tbody tr');
        return row && [...row.querySelectorAll('td')].map(td => td.innerText.trim());
        """
        cells = WebDriverWait(browser, HANG_GUARD_S).until(lambda b: b.execute_script(read))
        assert cells[:5] == ["ro", "1 → 2", "CANARY", "1 of 3", "10"], cells
        assert cells[5].startswith("10 requests, 0 failed"), cells
        assert cells[6].startswith("90 requests, 0 failed"), cells
        if os.environ.get("PLINTH_SCREENSHOT"):
            pathlib.Path(os.environ["PLINTH_SCREENSHOT"]).write_bytes(browser.get_screenshot_as_png())
    finally:
        browser.quit()
        server.stop()


def test_a_candidate_whose_answers_differ_is_refused_in_the_shadow_phase(tmp_path):
    server = explicit_server(repository(tmp_path, off_by_one))
    try:
        start(server, {"candidate": 2, "min_requests": 20, "shadow": {"requests": 100}})
        assert rollout(server)["phase"] == "SHADOW"
        traffic = Traffic(server)
        wait_until("the rollout ends", lambda: rollout(server)["phase"] != "SHADOW")
        answers = traffic.stop()
        status = rollout(server)
        text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=HANG_GUARD_S).read().decode()
    finally:
        server.stop()
    assert status["phase"] == "ROLLED_BACK", status
    assert status["reason"].startswith("answers: 1 of 1 shadowed requests differed on version 2"), status
    assert "first: output 'Y' element 0: 5 against 4 (tolerance 0)" in status["reason"], status
    assert status["candidate_window"]["requests"] == 0
    assert {a[3] for a in answers} == {"1"}, "version 2 answered nobody"
    assert all(a[2] == 200 for a in answers)
    assert 'plinth_rollout_shadow_total{model="ro",result="disagreed"} 1' in text


def test_a_good_candidate_goes_from_shadow_to_promoted_with_no_failed_request(tmp_path):
    server = explicit_server(repository(tmp_path, identity))
    try:
        start(server, {"candidate": 2, "steps": [50, 100], "dwell_secs": 0, "min_requests": 20,
                       "p99_slack_ms": 1000, "shadow": {"requests": 50}})
        traffic = Traffic(server)
        wait_until("the candidate is promoted", lambda: rollout(server)["phase"] == "PROMOTED")
        answers = traffic.stop()
        status = rollout(server)
    finally:
        server.stop()
    assert status["shadow"]["compared"] >= 50 and status["shadow"]["disagreed"] == 0, status
    assert [a for a in answers if a[2] != 200] == []


def test_one_sequence_meets_one_version(tmp_path):
    """A sequence's requests carry state: under a rollout with no sticky
    header they are keyed by the sequence id. The example VAD model
    (sequence_batching, implicit state), its version 1 copied as 2."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "model_repository/vad", repo / "vad")
    shutil.copytree(repo / "vad/1", repo / "vad/2")
    with open(repo / "vad/config.pbtxt", "a") as config:
        config.write("version_policy { all {} }\n")
    server = Plinth(repo, "--model-control-mode", "explicit", "--load-model", "vad")
    try:
        plan = {"candidate": 2, "steps": [50, 100], "dwell_secs": 3600, "p99_slack_ms": 100000}
        status, body = call(server, "/v2/repository/models/vad/rollout", json.dumps(plan).encode())
        assert status == 200 and body["phase"] == "CANARY", body
        met = {}
        for sequence in range(1, 41):
            for step in range(3):
                parameters = {"sequence_id": sequence, "sequence_start": step == 0, "sequence_end": step == 2}
                request = {"parameters": parameters, "inputs": [
                    {"name": "input", "shape": [1, 576], "datatype": "FP32", "data": [0.0] * 576},
                    {"name": "sr", "shape": [], "datatype": "INT64", "data": [16000]}]}
                status, body = call(server, "/v2/models/vad/infer", json.dumps(request).encode(),
                                    {"Content-Type": "application/json"})
                assert status == 200, body
                met.setdefault(sequence, set()).add(body["model_version"])
        # Through the plugin: each /predict runs a sequence of its own on
        # the version its request reached, windows included.
        silence = (repo / "vad/warmup/silence.wav").read_bytes()
        for _ in range(20):
            status, body = call(server, "/v2/models/vad/predict", silence, {"Content-Type": "audio/wav"})
            assert status == 200, body
    finally:
        server.stop()
    assert all(len(versions) == 1 for versions in met.values()), met
    assert {v for versions in met.values() for v in versions} == {"1", "2"}, "both versions answer sequences"


def declaring(plan):
    """`ro`'s configuration with the default version_policy (the latest
    version) and `plan` declared as its rollout."""
    config = CONFIG.replace("version_policy { all {} }\n", "")
    return config + f'parameters {{ key: "rollout" value: {{ string_value: {json.dumps(json.dumps(plan))} }} }}\n'


def versions(server):
    return call(server, "/v2/models/ro")[1]["versions"]


def test_copying_a_version_folder_in_poll_mode_rolls_it_out_as_the_config_declares(tmp_path):
    """A safe deploy by copying folders: a good version 2 is promoted under
    traffic with no failed request; a failing version 3 is rolled back, and
    version 2 keeps every request; removing folder 3 unloads it."""
    repo = tmp_path / "repo"
    (repo / "ro").mkdir(parents=True)
    (repo / "ro/config.pbtxt").write_text(declaring(
        {"steps": [25, 100], "dwell_secs": 0.5, "min_requests": 30, "max_error_rate": 0.05, "p99_slack_ms": 1000}))
    identity(repo / "ro/1/model.onnx")
    server = Plinth(repo, "--model-control-mode", "poll", "--repository-poll-secs", "1")
    try:
        traffic = Traffic(server)
        # Written beside the repository and moved in whole, as a deploy would.
        identity(tmp_path / "staging/2/model.onnx")
        (tmp_path / "staging/2").rename(repo / "ro/2")
        server.wait_for_log(r"rollout started model=ro serving=1 candidate=2")
        wait_until("version 2 is promoted", lambda: rollout(server)["phase"] == "PROMOTED")
        wait_until("version 1 is gone", lambda: versions(server) == ["2"])
        promoted = traffic.stop()

        traffic = Traffic(server, bad_share=True)
        failing(tmp_path / "staging/3/model.onnx")
        (tmp_path / "staging/3").rename(repo / "ro/3")
        wait_until("version 3 rolls out", lambda: rollout(server)["candidate"] == 3)
        wait_until("version 3 is rolled back", lambda: rollout(server)["phase"] == "ROLLED_BACK")
        at_rollback = traffic.count()
        wait_until("traffic goes on", lambda: traffic.count() >= at_rollback + 200)
        rolled_back = traffic.stop()
        rows = {r.get("version"): r for r in call(server, "/v2/repository/index", b"{}")[1]}

        shutil.rmtree(repo / "ro/3")
        wait_until("version 3 is unloaded", lambda: versions(server) == ["2"])
    finally:
        server.stop()
    assert [a for a in promoted if a[2] != 200] == []
    assert {a[3] for a in promoted} == {"1", "2"} and promoted[-1][3] == "2"
    assert rollout_serving(rows) == ("2", "3")
    assert rows["3"]["reason"].startswith("rolled back: error rate"), rows["3"]
    failed = [a for a in rolled_back if a[2] != 200]
    assert all(bad and version in (None, "3") for _, bad, _, version in failed), failed[:3]
    # More than 5 % of 30 is 2 failures; plus one request in flight per client.
    assert 0 < len(failed) <= 2 + 4, len(failed)
    assert {a[3] for a in rolled_back[at_rollback + 4:]} == {"2"}, "version 2 takes every request back"


def rollout_serving(rows):
    """The (serving, candidate) versions the index rows name."""
    role = {r["rollout"]["role"]: v for v, r in rows.items() if "rollout" in r}
    return role.get("serving"), role.get("candidate")


def test_a_declared_plan_that_does_not_parse_refuses_the_model_by_name(tmp_path):
    repo = tmp_path / "repo"
    (repo / "ro").mkdir(parents=True)
    (repo / "ro/config.pbtxt").write_text(declaring({"candidate": 2, "steps": [100]}))
    identity(repo / "ro/1/model.onnx")
    server = Plinth(repo, "--model-control-mode", "explicit")
    try:
        status, body = call(server, "/v2/repository/models/ro/load", b"")
    finally:
        server.stop()
    assert status == 400, body
    assert "parameter 'rollout': rollout plan: a plan in config.pbtxt names no 'candidate'" in body["error"], body


def test_ensemble_steps_reach_the_version_the_rollout_picks(tmp_path):
    """An ensemble whose step names no version of `ro`: its requests are
    split between `ro`'s versions and counted in the rollout's figures."""
    repo = repository(tmp_path, identity)
    (repo / "ens/1").mkdir(parents=True)
    (repo / "ens/config.pbtxt").write_text("""name: "ens"
platform: "ensemble"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "ro" model_version: -1
  input_map { key: "X" value: "X" } output_map { key: "Y" value: "Y" } } ] }
""")
    server = Plinth(repo, "--model-control-mode", "explicit", "--load-model", "ens")
    try:
        start(server, {"candidate": 2, "steps": [50, 100], "dwell_secs": 3600, "p99_slack_ms": 1000})
        body = json.dumps({"inputs": [{"name": "X", "shape": [4], "datatype": "FP32", "data": GOOD}]}).encode()
        for _ in range(100):
            status, answer = call(server, "/v2/models/ens/infer", body, {"Content-Type": "application/json"})
            assert status == 200 and answer["outputs"][0]["data"] == GOOD, answer
        status = rollout(server)
    finally:
        server.stop()
    assert (status["candidate_window"]["requests"], status["serving_window"]["requests"]) == (50, 50), status


def poll_repository(tmp_path, plan, policy=""):
    """`ro` declaring `plan`, version 1 only, served in poll mode."""
    repo = tmp_path / "repo"
    (repo / "ro").mkdir(parents=True)
    (repo / "ro/config.pbtxt").write_text(declaring(plan) + policy)
    identity(repo / "ro/1/model.onnx")
    return repo, Plinth(repo, "--model-control-mode", "poll", "--repository-poll-secs", "1")


def copy_in(tmp_path, repo, version, write):
    """Writes a version folder beside the repository and moves it in whole."""
    write(tmp_path / f"staging/{version}/model.onnx")
    (tmp_path / f"staging/{version}").rename(repo / f"ro/{version}")


def test_a_declared_rollout_keeps_its_candidate_when_a_newer_version_fails_and_ends_when_its_serving_folder_goes(
        tmp_path):
    repo, server = poll_repository(tmp_path, {"steps": [50, 100], "dwell_secs": 3600, "p99_slack_ms": 1000})
    try:
        copy_in(tmp_path, repo, 2, identity)
        wait_until("version 2 rolls out", lambda: (rollout(server) or {}).get("candidate") == 2)
        (tmp_path / "staging/3").mkdir(parents=True)
        (tmp_path / "staging/3/model.onnx").write_bytes(b"not onnx")
        (tmp_path / "staging/3").rename(repo / "ro/3")
        server.wait_for_log(r"load failed.*version=3|version=3.*load failed")
        assert versions(server) == ["1", "2"], "the candidate in canary stays"
        assert (rollout(server)["phase"], rollout(server)["candidate"]) == ("CANARY", 2)
        shutil.rmtree(repo / "ro/3")

        shutil.rmtree(repo / "ro/1")
        wait_until("version 1 is unloaded", lambda: versions(server) == ["2"])
        status = rollout(server)
        assert status["phase"] == "ROLLED_BACK" and status["reason"] == "the serving version 1 was unloaded", status
        assert all(infer(server, GOOD)[1]["model_version"] == "2" for _ in range(10))
    finally:
        server.stop()


def test_promotion_unloads_the_serving_version_and_no_other(tmp_path):
    """Under `version_policy { all {} }` versions 1 and 2 serve, 2 answering;
    version 3 rolls out from 2 and, promoted, replaces 2 only."""
    plan = {"steps": [50, 100], "dwell_secs": 0, "min_requests": 10, "p99_slack_ms": 1000}
    repo, server = poll_repository(tmp_path, plan, "version_policy { all {} }\n")
    try:
        copy_in(tmp_path, repo, 2, identity)
        wait_until("version 2 loads", lambda: versions(server) == ["1", "2"])
        traffic = Traffic(server)
        wait_until("version 2 is promoted", lambda: (rollout(server) or {}).get("phase") == "PROMOTED")
        wait_until("version 1 is unloaded", lambda: versions(server) == ["2"])
        copy_in(tmp_path, repo, 3, identity)
        wait_until("version 3 rolls out", lambda: rollout(server)["candidate"] == 3)
        wait_until("version 3 is promoted", lambda: rollout(server)["phase"] == "PROMOTED")
        wait_until("version 2 is unloaded", lambda: versions(server) == ["1", "3"])
        answers = traffic.stop()
    finally:
        server.stop()
    assert [a for a in answers if a[2] != 200] == []

"""On-demand residency with a model of known size (64 MiB of weights, made
here): one too large for the whole budget is refused without evicting
anything, and evicting it really gives its memory back."""

import json
import shutil
import urllib.error
import urllib.request

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper, save

from conftest import ROOT, Plinth, rss, wait_until

MIB = 1 << 20
SIZE = 4096  # weights: SIZE x SIZE FP32 = 64 MiB


def big_model(folder):
    """y [N, SIZE] = x [N, SIZE] @ W, W a SIZE x SIZE identity scaled by 2."""
    weights = numpy_helper.from_array(np.eye(SIZE, dtype=np.float32) * 2, name="W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", SIZE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", SIZE])],
        initializer=[weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    (folder / "1").mkdir(parents=True)
    save(model, folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text("max_batch_size: 1\n")


def add_classifier(repo, name):
    shutil.copytree(ROOT / "model_repository/ocr_cls", repo / name)
    config = repo / name / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "ocr_cls"', f'name: "{name}"'))


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    big_model(repo / "big")
    add_classifier(repo, "small")
    return repo


def call(server, path, body):
    request = urllib.request.Request(f"http://{server.url}{path}", data=body, method="POST")
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def infer_big(server):
    x = [1.0] * SIZE
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, SIZE], "datatype": "FP32", "data": x}]}).encode()
    return call(server, "/v2/models/big/infer", body)


def classify(server):
    return call(server, "/v2/models/small/predict", (ROOT / "tests/fixtures/cls_upright.png").read_bytes())


def resident(server):
    _, index = call(server, "/v2/repository/index", b"{}")
    return {r["name"]: r["resident_bytes"] for r in index if r["state"] == "READY"}


def loads(server, model):
    text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics").read().decode()
    line = next((l for l in text.splitlines() if l.startswith(f'plinth_model_loads_total{{model="{model}"}}')), None)
    return float(line.split()[-1]) if line else 0.0


def test_a_model_too_large_for_the_budget_is_refused_and_evicts_nothing(repo):
    server = Plinth(repo, "--model-control-mode", "on_demand", "--model-memory-budget", "48MiB")
    try:
        assert classify(server) == (200, {"angle": 0, "confidence": pytest.approx(1.0, abs=1e-6)})
        for _ in range(2):
            status, answer = infer_big(server)
            assert status == 503
            assert "'big'" in answer["error"] and "--model-memory-budget" in answer["error"]
        assert list(resident(server)) == ["small"], "nothing was evicted for it"
        _, index = call(server, "/v2/repository/index", b"{}")
        row = next(r for r in index if r["name"] == "big")
        assert row["state"] == "UNAVAILABLE" and "--model-memory-budget" in row["reason"], row
        assert loads(server, "big") == 0, "its weights alone exceed the budget: refused before any load"
    finally:
        server.stop()


def test_eviction_gives_the_memory_back(repo):
    server = Plinth(repo, "--model-control-mode", "on_demand", "--max-loaded-models", "1")
    try:
        status, answer = infer_big(server)
        assert status == 200 and answer["outputs"][0]["data"][:3] == [2.0, 2.0, 2.0]
        footprint = resident(server)["big"]
        assert footprint >= 64 * MIB, "the footprint covers at least the weights"
        before = rss(server)
        assert classify(server)[0] == 200
        now = resident(server)
        assert list(now) == ["small"], "big was evicted for small"
        # The evicted model is freed off the request path, on a blocking
        # thread: its memory leaves shortly after.
        wait_until(f"evicting {footprint // MIB} MiB to lower resident memory by half of it",
                   lambda: before - rss(server) + now["small"] >= footprint / 2)
    finally:
        server.stop()

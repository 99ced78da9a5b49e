"""A request the model refuses does not take its batch down with it: when
ONNX Runtime rejects a combined batch, each request runs alone and only the
one at fault gets the 400. Also: requested outputs come back in the order
the request names them."""

import json
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper, save

from conftest import Plinth

TABLE = np.arange(10, dtype=np.float32) * 1.5


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`lookup`: y = TABLE[i], z = -TABLE[i] for INT64 indices i [batch, 2]."""
    repo = tmp_path_factory.mktemp("repo")
    folder = repo / "lookup"
    (folder / "1").mkdir(parents=True)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "i"], ["y"]), helper.make_node("Neg", ["y"], ["z"])],
        "lookup",
        [helper.make_tensor_value_info("i", TensorProto.INT64, ["batch", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 2])],
        initializer=[numpy_helper.from_array(TABLE, "table")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    save(model, folder / "1" / "model.onnx")
    # Four requests make a preferred batch; fewer wait up to 10 s.
    (folder / "config.pbtxt").write_text(
        "max_batch_size: 8\n"
        "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 60000000 }\n")
    plinth = Plinth(repo)
    yield plinth
    plinth.stop()


def infer(server, indices, outputs=None):
    body = {"inputs": [{"name": "i", "shape": [1, 2], "datatype": "INT64", "data": indices}]}
    if outputs:
        body["outputs"] = [{"name": name} for name in outputs]
    request = urllib.request.Request(f"http://{server.url}/v2/models/lookup/infer", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def metric(server, family):
    text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics").read().decode()
    prefix = f'{family}{{model="lookup",version="1"}} '
    return next(float(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix))


def test_only_the_request_at_fault_fails_its_batch(server):
    requests = [[0, 1], [2, 3], [4, 99], [8, 9]]
    answers = [None] * len(requests)

    def send(n):
        answers[n] = infer(server, requests[n])

    threads = [threading.Thread(target=send, args=(n,)) for n in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    for indices, (status, body) in zip(requests, answers):
        if 99 in indices:
            assert status == 400, body
            assert "99" in body["error"], body
        else:
            assert status == 200, body
            y = next(o for o in body["outputs"] if o["name"] == "y")
            assert y["data"] == TABLE[indices].tolist(), (indices, body)
    # One batch of 4 refused, then each request alone.
    assert metric(server, "nv_inference_exec_count") == 5
    assert metric(server, "nv_inference_count") == 3


def test_requested_outputs_come_back_in_the_order_asked(server):
    results = []
    threads = [threading.Thread(target=lambda: results.append(infer(server, [1, 2], ["z", "y"]))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for status, body in results:
        assert status == 200, body
        assert [o["name"] for o in body["outputs"]] == ["z", "y"]
        assert body["outputs"][0]["data"] == (-TABLE[[1, 2]]).tolist()

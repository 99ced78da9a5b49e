"""Triton's ragged batching through the real binary: an ONNX model, made
here with the `onnx` package, takes one ragged input `x` (flat: every
request's elements one after another) and the six kinds of batch input,
doubles `x` into the batch output `y` (cut back per request by the shape of
its `x`), and returns each batch input to every batch item, so that the test
sees exactly what the model was given.

Requests of different shapes are queued one after another (each waits
until the server counts the one before as pending), so the batch they form
and its order are known; the batch runs when it is full, never on a timer.
"""

import json
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
from onnx import TensorProto, helper, save

from conftest import HANG_GUARD_S, Plinth, metric, wait_until

# Batch input target, kind, data type (as the model declares the input).
BATCH_INPUTS = [
    ("count", "BATCH_ELEMENT_COUNT", "INT32"),
    ("acc", "BATCH_ACCUMULATED_ELEMENT_COUNT", "FP32"),
    ("acc0", "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "INT32"),
    ("maxshape", "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", "FP32"),
    ("items", "BATCH_ITEM_SHAPE", "INT32"),
    ("flat", "BATCH_ITEM_SHAPE_FLATTEN", "FP32"),
]
ONNX_TYPE = {"INT32": TensorProto.INT32, "FP32": TensorProto.FLOAT}


def ragged_graph(x_shape=("N",)):
    """y = 2 x; for each batch input b, `b_out` = b as one row per batch
    item (rows counted by `items`), `max_out` = the length of `maxshape`,
    `items_out` = `items` itself."""
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    for name, kind, dtype in BATCH_INPUTS:
        shape = ["R", 2] if kind == "BATCH_ITEM_SHAPE" else [f"{name}_len"]
        inputs.append(helper.make_tensor_value_info(name, ONNX_TYPE[dtype], shape))
    nodes = [
        helper.make_node("Constant", [], ["two"], value=helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])),
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])),
        helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])),
        helper.make_node("Constant", [], ["row"], value=helper.make_tensor("row", TensorProto.INT64, [2], [1, -1])),
        helper.make_node("Mul", ["x", "two"], ["y"]),
        # One 1 per batch item: [R, 1].
        helper.make_node("Cast", ["items"], ["items_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["items_f", "zero"], ["items_zero"]),
        helper.make_node("Add", ["items_zero", "one"], ["items_one"]),
        helper.make_node("ReduceMax", ["items_one"], ["ones"], axes=[1], keepdims=1),
        helper.make_node("Identity", ["items_f"], ["items_out"]),
        helper.make_node("Shape", ["maxshape"], ["max_len"]),
        helper.make_node("Cast", ["max_len"], ["max_f"], to=TensorProto.FLOAT),
        helper.make_node("Reshape", ["max_f", "row"], ["max_row"]),
        helper.make_node("MatMul", ["ones", "max_row"], ["max_out"]),
    ]
    for name in ("count", "acc", "acc0", "flat"):
        nodes += [
            helper.make_node("Cast", [name], [f"{name}_f"], to=TensorProto.FLOAT),
            helper.make_node("Reshape", [f"{name}_f", "row"], [f"{name}_row"]),
            helper.make_node("MatMul", ["ones", f"{name}_row"], [f"{name}_out"]),
        ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x_shape))]
    for name in ("count_out", "acc_out", "acc0_out", "max_out", "items_out", "flat_out"):
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["R", f"{name}_len"]))
    return helper.make_graph(nodes, "ragged", inputs, outputs)


def write_onnx(path, graph):
    # IR version 8: the onnx package writes newer ones than ONNX Runtime 1.31
    # reads.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    save(model, path)


def config(name, batching="dynamic_batching { max_queue_delay_microseconds: 600000000 }", batch_inputs=None):
    outputs = ", ".join(
        [f'{{ name: "y" data_type: TYPE_FP32 dims: [ -1, -1 ] }}']
        + [f'{{ name: "{n}" data_type: TYPE_FP32 dims: {d} }}'
           for n, d in [("count_out", "[ -1 ]"), ("acc_out", "[ -1 ]"), ("acc0_out", "[ -1 ]"),
                        ("max_out", "[ 1 ]"), ("items_out", "[ 2 ]"), ("flat_out", "[ -1 ]")]])
    if batch_inputs is None:
        batch_inputs = ", ".join(
            f'{{ kind: {kind} target_name: "{name}" data_type: TYPE_{dtype} source_input: "x" }}'
            for name, kind, dtype in BATCH_INPUTS)
    return f"""name: "{name}"
backend: "onnxruntime"
max_batch_size: 4
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ -1, -1 ] allow_ragged_batch: true }} ]
output [ {outputs} ]
batch_input [ {batch_inputs} ]
batch_output [ {{ target_name: "y" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "x" }} ]
{batching}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("ragged")
    models = {
        # Requests wait for a full batch (4 rows) however long it takes.
        "ragged": config("ragged"),
        # Each request runs alone; a warm-up sample runs through the same
        # flattening and batch inputs before the model is READY.
        "ragged_alone": config("ragged_alone", batching=(
            'model_warmup [ { name: "w" batch_size: 1 inputs { key: "x" value: '
            '{ data_type: TYPE_FP32 dims: [ 2, 3 ] zero_data: true } } } ]')),
        # Configurations Plinth refuses, while the others serve.
        "ragged_unknown_source": config("ragged_unknown_source", batch_inputs=(
            '{ kind: BATCH_ELEMENT_COUNT target_name: "count" data_type: TYPE_INT32 source_input: "UNKNOWN_INPUT" }')),
        "ragged_two_dimensional": config("ragged_two_dimensional"),
    }
    for name, text in models.items():
        (repo / name).mkdir()
        (repo / name / "config.pbtxt").write_text(text)
        x_shape = ("N", "M") if name == "ragged_two_dimensional" else ("N",)
        write_onnx(repo / name / "1" / "model.onnx", ragged_graph(x_shape))
    plinth = Plinth(repo, "--strict-readiness", "false")
    yield plinth
    plinth.stop()


def infer(server, model, x):
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                                   "data": x.flatten().tolist()}]}).encode()
    request = urllib.request.Request(f"http://{server.url}/v2/models/{model}/infer", data=body,
                                     headers={"Content-Type": "application/json"})
    answer = json.load(urllib.request.urlopen(request, timeout=HANG_GUARD_S))
    return {o["name"]: np.array(o["data"], dtype=np.float32).reshape(o["shape"]) for o in answer["outputs"]}


def x_of(shape, start):
    return np.arange(start, start + np.prod(shape), dtype=np.float32).reshape(shape)


def test_requests_of_different_shapes_batch_and_each_gets_its_own_part(server):
    # Shapes (batch dimension first): 2 + 1 + 1 rows fill max_batch_size 4.
    xs = [x_of([2, 1, 3], 1), x_of([1, 2, 2], 100), x_of([1, 3, 1], 200)]
    answers, errors = [None] * len(xs), []

    def send(i):
        try:
            answers[i] = infer(server, "ragged", xs[i])
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = []
    for i in range(len(xs)):
        threads.append(threading.Thread(target=send, args=(i,)))
        threads[-1].start()
        if i < len(xs) - 1:
            # The next request queues behind this one: the batch's order is known.
            wait_until(f"{i + 1} requests are pending",
                       lambda: metric(server, "nv_inference_pending_request_count", "ragged") == i + 1)
    for t in threads:
        t.join(HANG_GUARD_S)
    assert not errors, errors
    # Element counts (every dimension): 6, 4 and 3.
    batch = {
        "count_out": [6, 4, 3],
        "acc_out": [6, 10, 13],
        "acc0_out": [0, 6, 10, 13],
        "max_out": [6],
        "flat_out": [1, 3, 1, 3, 2, 2, 3, 1],
    }
    items = [[[1, 3], [1, 3]], [[2, 2]], [[3, 1]]]
    for x, answer, own_items in zip(xs, answers, items):
        rows = x.shape[0]
        np.testing.assert_array_equal(answer["y"], 2 * x)
        assert answer["y"].shape == x.shape
        for name, values in batch.items():
            np.testing.assert_array_equal(answer[name], np.array([values] * rows, np.float32), err_msg=name)
        np.testing.assert_array_equal(answer["items_out"], np.array(own_items, np.float32))
    assert metric(server, "nv_inference_exec_count", "ragged") == 1, "the three requests ran as one execution"
    assert metric(server, "nv_inference_count", "ragged") == 4


def test_a_request_alone_gets_the_batch_inputs_of_a_batch_of_one(server):
    x = x_of([1, 2, 2], 7)
    answer = infer(server, "ragged_alone", x)
    np.testing.assert_array_equal(answer["y"], 2 * x)
    expected = {"count_out": [[4]], "acc_out": [[4]], "acc0_out": [[0, 4]], "max_out": [[4]],
                "items_out": [[2, 2]], "flat_out": [[2, 2]]}
    for name, values in expected.items():
        np.testing.assert_array_equal(answer[name], np.array(values, np.float32), err_msg=name)


def test_bad_ragged_configurations_are_refused_and_the_rest_serve(server):
    request = urllib.request.Request(f"http://{server.url}/v2/repository/index", data=b"{}", method="POST")
    index = {row["name"]: row for row in json.load(urllib.request.urlopen(request, timeout=HANG_GUARD_S))}
    assert index["ragged"]["state"] == "READY"
    assert index["ragged_alone"]["state"] == "READY"
    unknown = index["ragged_unknown_source"]
    assert unknown["state"] == "UNAVAILABLE" and "unknown source input name 'UNKNOWN_INPUT'" in unknown["reason"], unknown
    two = index["ragged_two_dimensional"]
    assert two["state"] == "UNAVAILABLE", two
    assert "expects model provides input with shape [-1] for ragged input 'x'" in two["reason"], two

"""Every v2 datatype that JSON can carry goes through /infer and ONNX
Runtime unchanged (an identity model made here), with no config.pbtxt:
inputs and outputs are completed from the model file."""

import json
import urllib.request

import numpy as np
import pytest
from onnx import TensorProto, helper, save

from conftest import Plinth

# v2 datatype -> (ONNX element type, sample values at the edges of the range)
CASES = {
    "BOOL": (TensorProto.BOOL, [True, False, True]),
    "UINT8": (TensorProto.UINT8, [0, 7, 255]),
    "UINT16": (TensorProto.UINT16, [0, 7, 65535]),
    "UINT32": (TensorProto.UINT32, [0, 7, 4294967295]),
    "UINT64": (TensorProto.UINT64, [0, 7, 18446744073709551615]),
    "INT8": (TensorProto.INT8, [-128, 0, 127]),
    "INT16": (TensorProto.INT16, [-32768, 0, 32767]),
    "INT32": (TensorProto.INT32, [-2147483648, 0, 2147483647]),
    "INT64": (TensorProto.INT64, [-9223372036854775808, 0, 9223372036854775807]),
    "FP32": (TensorProto.FLOAT, [0.1, -2.5, 3.4028234663852886e38]),
    "FP64": (TensorProto.DOUBLE, [0.1, -2.5, 1e300]),
    "BYTES": (TensorProto.STRING, ["", "héllo", "a b"]),
}


@pytest.fixture(scope="module")
def identity_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    folder = repo / "identity"
    (folder / "1").mkdir(parents=True)
    inputs, outputs, nodes = [], [], []
    for dt, (onnx_type, _) in CASES.items():
        inputs.append(helper.make_tensor_value_info(f"in_{dt}", onnx_type, [3]))
        outputs.append(helper.make_tensor_value_info(f"out_{dt}", onnx_type, [3]))
        nodes.append(helper.make_node("Identity", [f"in_{dt}"], [f"out_{dt}"]))
    model = helper.make_model(helper.make_graph(nodes, "identity", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    save(model, folder / "1" / "model.onnx")
    server = Plinth(repo)
    yield server
    server.stop()


def post(server, path, body):
    request = urllib.request.Request(f"http://{server.url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        return json.load(response)


def test_every_json_datatype_round_trips_through_onnx_runtime(identity_server):
    meta = json.load(urllib.request.urlopen(f"http://{identity_server.url}/v2/models/identity"))
    assert {t["name"]: t["datatype"] for t in meta["inputs"]} == {f"in_{dt}": dt for dt in CASES}

    body = {"inputs": [{"name": f"in_{dt}", "shape": [3], "datatype": dt, "data": values}
                       for dt, (_, values) in CASES.items()]}
    answer = post(identity_server, "/v2/models/identity/infer", body)
    outputs = {o["name"]: o for o in answer["outputs"]}
    for dt, (_, values) in CASES.items():
        out = outputs[f"out_{dt}"]
        assert out["datatype"] == dt and out["shape"] == [3]
        if dt == "FP32":
            np.testing.assert_array_equal(np.array(out["data"], dtype=np.float32), np.array(values, dtype=np.float32))
        else:
            assert out["data"] == values, dt


def test_only_the_requested_outputs_come_back(identity_server):
    body = {"inputs": [{"name": f"in_{dt}", "shape": [3], "datatype": dt, "data": values}
                       for dt, (_, values) in CASES.items()],
            "outputs": [{"name": "out_INT16"}]}
    answer = post(identity_server, "/v2/models/identity/infer", body)
    assert [o["name"] for o in answer["outputs"]] == ["out_INT16"]
    assert answer["outputs"][0]["data"] == [-32768, 0, 32767]

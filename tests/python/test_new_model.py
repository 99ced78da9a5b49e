"""Adding a model needs no rebuild: a new folder with an ONNX model made
here, its config.pbtxt and an existing plugin (.wasm), served by the same
binary."""

import io
import json
import shutil
import urllib.request

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from PIL import Image

from conftest import ROOT, Plinth

SCALE = 3.0


def brightness_model(path):
    """x [N,3,48,192] -> probs [N,2] = softmax(SCALE * [mean(x), -mean(x)]):
    class 0 ("upright" to the ocr-cls plugin) for bright images, class 1
    ("180") for dark ones."""
    nodes = [
        helper.make_node("ReduceMean", ["pixels", "axes"], ["mean"], keepdims=0),
        helper.make_node("Unsqueeze", ["mean", "one"], ["mean_col"]),
        helper.make_node("Neg", ["mean_col"], ["neg_col"]),
        helper.make_node("Concat", ["mean_col", "neg_col"], ["logits"], axis=1),
        helper.make_node("Mul", ["logits", "scale"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["probs"], axis=1),
    ]
    graph = helper.make_graph(
        nodes, "brightness",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["N", 3, 48, 192])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 2])],
        initializer=[
            helper.make_tensor("axes", TensorProto.INT64, [3], [1, 2, 3]),
            helper.make_tensor("one", TensorProto.INT64, [1], [1]),
            helper.make_tensor("scale", TensorProto.FLOAT, [], [SCALE]),
        ])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, path)


CONFIG = """
name: "brightness"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "pixels" data_type: TYPE_FP32 dims: [ 3, 48, 192 ] } ]
output [ { name: "probs" data_type: TYPE_FP32 dims: [ 2 ] } ]
parameters { key: "plugin" value: { string_value: "ocr_cls.wasm" } }
"""


def png(gray_level):
    """A 192x48 image of one grey level: the plugin keeps its size, so every
    normalised pixel is exactly (level/255 - 0.5) / 0.5."""
    buf = io.BytesIO()
    Image.new("RGB", (192, 48), (gray_level,) * 3).save(buf, format="PNG")
    return buf.getvalue()


def expected(gray_level):
    m = np.float32((gray_level / 255.0 - 0.5) / 0.5)
    logits = np.array([m, -m], dtype=np.float32) * np.float32(SCALE)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    return (0, float(p[0])) if p[0] >= p[1] else (180, float(p[1]))


@pytest.fixture(scope="module")
def fresh_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    folder = repo / "brightness"
    (folder / "1").mkdir(parents=True)
    brightness_model(folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text(CONFIG)
    shutil.copy(ROOT / "model_repository/ocr_cls/ocr_cls.wasm", folder / "ocr_cls.wasm")
    server = Plinth(repo)
    yield server
    server.stop()


@pytest.mark.parametrize("gray_level", [255, 0, 160])
def test_a_new_model_folder_is_served_without_a_rebuild(fresh_server, gray_level):
    request = urllib.request.Request(
        f"http://{fresh_server.url}/v2/models/brightness/predict",
        data=png(gray_level), headers={"Content-Type": "image/png"})
    with urllib.request.urlopen(request) as response:
        answer = json.load(response)
    angle, confidence = expected(gray_level)
    assert answer["angle"] == angle
    assert abs(answer["confidence"] - confidence) < 1e-5

"""A configuration that does not match its model fails with an error that
names the tensor and both values, both through `plinth check` and through
the load API (explicit mode)."""

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request

import pytest
from onnx import TensorProto, helper, save

from conftest import ROOT, Plinth

BINARY = ROOT / "target/release/plinth"
CLS_CONFIG = (ROOT / "model_repository/ocr_cls/config.pbtxt").read_text()

# model name -> (config.pbtxt, words the error must contain)
BROKEN = {
    "wrong_name": (CLS_CONFIG.replace('name: "x"', 'name: "image"').replace('"ocr_cls"', '"wrong_name"'),
                   ["'image'", '"x"']),
    "wrong_type": (CLS_CONFIG.replace("TYPE_FP32", "TYPE_INT64", 1).replace('"ocr_cls"', '"wrong_type"'),
                   ["input 'x'", "INT64", "FP32"]),
    "wrong_dim": (CLS_CONFIG.replace("dims: [ 3, 48, 192 ]", "dims: [ 4, 48, 192 ]").replace('"ocr_cls"', '"wrong_dim"'),
                  ["input 'x'", "is 4", "but 3"]),
    "no_batch": ('max_batch_size: 4\ninput [ { name: "v" data_type: TYPE_FP32 dims: [ 4 ] } ]',
                 ["input 'v'", "batch", "[1, 4]"]),
}


def fixed_shape_model(path):
    """v [1, 4] -> w [1, 4]: a first dimension that is not a batch dimension."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["v"], ["w"])], "fixed",
        [helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("w", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    save(model, path)


@pytest.fixture(scope="module")
def broken_repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    for name, (config, _) in BROKEN.items():
        (repo / name / "1").mkdir(parents=True)
        if name == "no_batch":
            fixed_shape_model(repo / name / "1" / "model.onnx")
        else:
            shutil.copy(ROOT / "model_repository/ocr_cls/1/model.onnx", repo / name / "1" / "model.onnx")
            shutil.copy(ROOT / "model_repository/ocr_cls/ocr_cls.wasm", repo / name / "ocr_cls.wasm")
        (repo / name / "config.pbtxt").write_text(config)
    return repo


def test_plinth_check_names_every_mismatch(broken_repo):
    env = dict(os.environ, ORT_DYLIB_PATH=str(ROOT / ".cache/onnxruntime/libonnxruntime.so"))
    result = subprocess.run([BINARY, "check", "--model-repository", broken_repo],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode != 0
    lines = result.stdout.splitlines()
    assert len(lines) == len(BROKEN), result.stdout
    for name, (_, words) in BROKEN.items():
        line = next(l for l in lines if f"model '{name}' version 1" in l)
        for word in words:
            assert word in line, (word, line)


def test_plinth_check_passes_the_example_repository():
    env = dict(os.environ, ORT_DYLIB_PATH=str(ROOT / ".cache/onnxruntime/libonnxruntime.so"))
    result = subprocess.run([BINARY, "check", "--model-repository", ROOT / "model_repository"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_load_api_names_every_mismatch(broken_repo):
    server = Plinth(broken_repo, "--model-control-mode", "explicit")
    try:
        for name, (_, words) in BROKEN.items():
            request = urllib.request.Request(
                f"http://{server.url}/v2/repository/models/{name}/load", data=b"{}", method="POST")
            with pytest.raises(urllib.error.HTTPError) as failure:
                urllib.request.urlopen(request)
            assert failure.value.code == 400
            message = json.load(failure.value)["error"]
            for word in words:
                assert word in message, (word, message)
    finally:
        server.stop()

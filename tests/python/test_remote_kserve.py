"""Delegation to a real peer: the KServe Python model server (pip `kserve`,
in .cache/bench/kserve, made by `make setup`) serves ocr_cls through a
kserve.Model wrapping onnxruntime (bench/peers/kserve_server.py); Plinth
serves it as `backend: "remote"` with the ocr_cls plugin. Plinth's answers
equal onnxruntime's, and a stopped peer gives a 503 naming it."""

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import numpy as np
import onnxruntime
import pytest

from conftest import ROOT, Plinth, free_ports

MODEL = ROOT / "model_repository/ocr_cls/1/model.onnx"
KSERVE_PYTHON = ROOT / ".cache/bench/kserve/bin/python"
OUTPUT = "save_infer_model/scale_0.tmp_1"


def call(url, body=None, content_type="application/json"):
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def kserve():
    """The KServe model server on free ports; yields its base URL."""
    http_port, grpc_port = free_ports(2)
    proc = subprocess.Popen(
        [KSERVE_PYTHON, ROOT / "bench/peers/kserve_server.py", MODEL, str(http_port), str(grpc_port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{http_port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if call(f"{url}/v2/models/ocr_cls/ready")[0] == 200:
                break
        except (urllib.error.URLError, ConnectionError):
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "the KServe model server did not start"
        time.sleep(0.2)
    yield url, proc
    proc.kill()
    proc.wait()


def front_repository(tmp_path, url):
    """remote_cls: ocr_cls at `url`, declared in full (the KServe server's
    metadata lists no tensors), with the ocr_cls plugin."""
    model = tmp_path / "remote_cls"
    (model / "1").mkdir(parents=True)
    shutil.copy(ROOT / "model_repository/ocr_cls/ocr_cls.wasm", model)
    (model / "config.pbtxt").write_text(f"""
backend: "remote"
max_batch_size: 8
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 3, 48, 192 ] }} ]
output [ {{ name: "{OUTPUT}" data_type: TYPE_FP32 dims: [ 2 ] }} ]
parameters {{ key: "remote.url" value {{ string_value: "{url}" }} }}
parameters {{ key: "remote.model" value {{ string_value: "ocr_cls" }} }}
parameters {{ key: "remote.timeout_ms" value {{ string_value: "60000" }} }}
parameters {{ key: "plugin" value {{ string_value: "ocr_cls.wasm" }} }}
""")
    return tmp_path


def test_plinth_delegates_to_the_kserve_model_server(kserve, tmp_path):
    url, proc = kserve
    plinth = Plinth(front_repository(tmp_path, url))
    try:
        base = f"http://{plinth.url}"
        rotated = (ROOT / "tests/fixtures/cls_rotated.png").read_bytes()
        status, body = call(f"{base}/v2/models/remote_cls/predict", rotated, "image/png")
        assert (status, body["angle"]) == (200, 180), body

        x = np.random.default_rng(7).uniform(-1, 1, (3, 3, 48, 192)).astype(np.float32)
        request = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
        status, body = call(f"{base}/v2/models/remote_cls/infer", json.dumps(request).encode())
        assert status == 200, body
        (output,) = body["outputs"]
        assert (output["name"], output["shape"]) == (OUTPUT, [3, 2])
        (want,) = onnxruntime.InferenceSession(str(MODEL)).run([OUTPUT], {"x": x})
        np.testing.assert_allclose(np.array(output["data"], dtype=np.float32).reshape(3, 2), want, atol=1e-6)

        proc.kill()
        proc.wait()
        status, body = call(f"{base}/v2/models/remote_cls/predict", rotated, "image/png")
        assert status == 503, body
        assert url in body["error"] and "cannot be reached" in body["error"], body
    finally:
        plinth.stop()

"""A composed call's failure keeps its class through the plugin boundary
(`plinth:plugin@0.3.0`) and through an ensemble: with `ocr_rec` unloaded,
the `ocr` page pipeline answers 503 as `ocr_rec` itself does (a client
retries it), not 500; an ensemble whose step is unloaded answers 503 too;
each such 503 carries `Retry-After`, so a client that backs off by it does
not retry at once; once the callee is back, both answer 200. Real binary, explicit model
control, the example repository's models."""

import json
import shutil
import urllib.error
import urllib.request

import pytest

from conftest import HANG_GUARD_S, ROOT, Plinth
from test_ensembles import argmax_model, ensemble

PAGE = (ROOT / "tests/fixtures/page.png").read_bytes()
LINE = (ROOT / "tests/fixtures/line_hello.png").read_bytes()


def post(server, path, body, content_type="application/octet-stream"):
    """(status, JSON body, headers) of a POST."""
    request = urllib.request.Request(f"http://{server.url}{path}", data=body,
                                     headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=HANG_GUARD_S) as response:
            return response.status, json.loads(response.read()), response.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), e.headers


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    for name in ["ocr", "ocr_cls", "ocr_rec"]:
        shutil.copytree(ROOT / "model_repository" / name, repo / name)
    shutil.copytree(ROOT / "model_repository/ocr_cls", repo / "cls")
    (repo / "cls/config.pbtxt").write_text((repo / "cls/config.pbtxt").read_text().replace('"ocr_cls"', '"cls"'))
    argmax_model(repo / "angle_of")
    ensemble(repo / "direction", "cls")
    models = ["ocr", "ocr_cls", "ocr_rec", "cls", "angle_of", "direction"]
    plinth = Plinth(repo, "--model-control-mode", "explicit", *[f"--load-model={m}" for m in models])
    yield plinth
    plinth.stop()


def test_a_plugin_passes_an_unavailable_callee_on_as_503(server):
    status, body, _ = post(server, "/v2/models/ocr/predict", PAGE, "image/png")
    assert status == 200 and body["lines"], body

    assert post(server, "/v2/repository/models/ocr_rec/unload", b"{}")[0] == 200
    status, direct, headers = post(server, "/v2/models/ocr_rec/predict", LINE, "image/png")
    assert (status, headers["Retry-After"]) == (503, "1"), direct
    status, body, headers = post(server, "/v2/models/ocr/predict", PAGE, "image/png")
    assert (status, headers["Retry-After"]) == (503, "1"), body
    assert "plugin 'ocr.wasm' of model 'ocr'" in body["error"] and "model 'ocr_rec'" in body["error"], body
    assert "UNAVAILABLE" in body["error"], body

    assert post(server, "/v2/repository/models/ocr_rec/load", b"{}")[0] == 200
    status, body, _ = post(server, "/v2/models/ocr/predict", PAGE, "image/png")
    assert status == 200 and body["lines"], body


def test_an_ensemble_whose_step_is_unloaded_answers_503(server):
    request = json.dumps({"inputs": [{"name": "IMAGE", "datatype": "FP32", "shape": [1, 3, 48, 192],
                                      "data": [0.5] * (3 * 48 * 192)}]}).encode()
    status, body, _ = post(server, "/v2/models/direction/infer", request, "application/json")
    assert status == 200, body

    assert post(server, "/v2/repository/models/angle_of/unload", b"{}")[0] == 200
    status, body, headers = post(server, "/v2/models/direction/infer", request, "application/json")
    assert (status, headers["Retry-After"]) == (503, "1"), body
    assert body["error"].startswith("in ensemble 'direction', ") and "angle_of" in body["error"], body

    assert post(server, "/v2/repository/models/angle_of/load", b"{}")[0] == 200
    status, body, _ = post(server, "/v2/models/direction/infer", request, "application/json")
    assert status == 200, body

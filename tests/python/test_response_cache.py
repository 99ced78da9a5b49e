"""Triton's response cache through the real binary: `--cache-config
local,size=BYTES` and `response_cache { enable: true }`. A repeated request
is answered from the cache without running the model (statistics and
`nv_cache_*` metrics show it), a different input or another version is a
miss, a plugin model caches on the tensors its plugin made, and a model
that asks for a cache the server does not have is refused naming the
flag."""

import json
import shutil
import subprocess
import sys
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import ROOT, Plinth, metric, wait_until

sys.path.insert(0, str(ROOT / "tests/fixtures"))
import make_triton_models  # noqa: E402

CACHED = "response_cache { enable: true }\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("cache_models")
    make_triton_models.add_sub_model(repo, "cached", True, "int32", "int32", "int32", [1, 2])
    make_triton_models.simple(repo, "uncached")
    with open(repo / "cached" / "config.pbtxt", "a") as config:
        config.write(CACHED)
    shutil.copytree(ROOT / "model_repository/ocr_cls", repo / "ocr_cls")
    with open(repo / "ocr_cls" / "config.pbtxt", "a") as config:
        config.write(CACHED)
    plinth = Plinth(repo, "--cache-config", "local,size=1048576")
    yield plinth
    plinth.stop()


def stats(server, model, version):
    url = f"http://{server.url}/v2/models/{model}/versions/{version}/stats"
    with urllib.request.urlopen(url, timeout=120) as r:
        return json.load(r)["model_stats"][0]


def counts(server, model, version=1):
    s = stats(server, model, version)
    i = s["inference_stats"]
    return i["cache_hit"]["count"], i["cache_miss"]["count"], s["execution_count"]


def add_sub(server, model, a, b, version=""):
    client = httpclient.InferenceServerClient(server.url)
    inputs = [httpclient.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in (0, 1)]
    for x, data in zip(inputs, (a, b)):
        x.set_data_from_numpy(data)
    result = client.infer(model, inputs, model_version=version)
    return result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")


def test_a_repeated_request_is_answered_from_the_cache(server):
    a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.full((1, 16), 2, dtype=np.int32)
    first = add_sub(server, "cached", a, b, version="1")
    assert counts(server, "cached") == (0, 1, 1)
    again = add_sub(server, "cached", a, b, version="1")
    assert all(np.array_equal(x, y) for x, y in zip(first, again))
    assert np.array_equal(again[0], a + b)
    assert counts(server, "cached") == (1, 1, 1), "a hit runs nothing"
    assert metric(server, "nv_cache_num_hits_per_model", "cached") == 1
    assert metric(server, "nv_cache_num_misses_per_model", "cached") == 1
    assert stats(server, "cached", 1)["inference_stats"]["success"]["count"] == 2

    add_sub(server, "cached", a, b + 1, version="1")
    assert counts(server, "cached") == (1, 2, 2), "another input is a miss"
    # Version 2 swaps its outputs: the cache must not answer it with version 1's.
    swapped = add_sub(server, "cached", a, b, version="2")
    assert np.array_equal(swapped[0], a - b)
    assert counts(server, "cached", 2) == (0, 1, 1)

    add_sub(server, "uncached", a, b)
    add_sub(server, "uncached", a, b)
    assert counts(server, "uncached") == (0, 0, 2), "a model without response_cache runs every request"
    assert metric(server, "nv_cache_num_hits_per_model", "uncached") == 0


def test_a_plugin_model_caches_on_its_plugin_s_tensors(server):
    def predict(image):
        body = (ROOT / "tests/fixtures" / image).read_bytes()
        request = urllib.request.Request(f"http://{server.url}/v2/models/ocr_cls/predict", data=body,
                                         headers={"Content-Type": "image/png"})
        with urllib.request.urlopen(request, timeout=120) as r:
            return json.load(r)

    # The model's plugin warm-up (warmup/cls_rotated.png) ran before READY
    # and already filled the cache with that image: count from here.
    before = counts(server, "ocr_cls")[:2]
    since = lambda: tuple(n - b for n, b in zip(counts(server, "ocr_cls")[:2], before))  # noqa: E731
    upright = predict("cls_upright.png")
    assert predict("cls_upright.png") == upright
    assert since() == (1, 1)
    rotated = predict("cls_rotated.png")
    assert rotated != upright
    assert since() == (2, 1), "the warm-up's image is a hit"


def test_a_model_asking_for_a_cache_the_server_lacks_is_refused(tmp_path):
    make_triton_models.simple(tmp_path, "cached")
    with open(tmp_path / "cached" / "config.pbtxt", "a") as config:
        config.write(CACHED)
    plinth = Plinth(tmp_path, "--strict-readiness", "false")
    try:
        client = httpclient.InferenceServerClient(plinth.url)
        wait_until("the load has failed",
                   lambda: [r.get("state") for r in client.get_model_repository_index()] == ["UNAVAILABLE"])
        reason = client.get_model_repository_index()[0]["reason"]
        assert "response_cache.enable is set, but the server has no response cache" in reason, reason
        assert "--cache-config local,size=BYTES" in reason, reason
    finally:
        plinth.stop()


@pytest.mark.parametrize("flag, message", [
    ("redis,host=cache", "unknown cache 'redis'"),
    ("local,size=1MiB", "local cache size must be a whole number of bytes"),
])
def test_a_cache_flag_plinth_cannot_honour_stops_start_up(tmp_path, flag, message):
    binary = ROOT / "target/release/plinth"
    done = subprocess.run([binary, "serve", "--model-repository", tmp_path, "--http-port", "0", "--grpc-port", "0",
                           "--metrics-port", "0", "--cache-config", flag], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_a_version_reloaded_from_a_changed_file_does_not_get_the_old_answers(tmp_path):
    make_triton_models.simple(tmp_path, "cached")
    with open(tmp_path / "cached" / "config.pbtxt", "a") as config:
        config.write(CACHED)
    plinth = Plinth(tmp_path, "--cache-config", "local,size=65536", "--model-control-mode", "explicit",
                    "--load-model", "cached")
    try:
        a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.ones((1, 16), dtype=np.int32)
        assert np.array_equal(add_sub(plinth, "cached", a, b)[0], a + b)
        assert np.array_equal(add_sub(plinth, "cached", a, b)[0], a + b)
        # The same version 1, now computing the difference as OUTPUT0.
        graph = make_triton_models.add_sub_graph("cached", True, "int32", "int32", "int32", swap=True)
        make_triton_models.onnx_file(tmp_path / "cached" / "1" / "model.onnx", graph)
        httpclient.InferenceServerClient(plinth.url).load_model("cached")
        assert np.array_equal(add_sub(plinth, "cached", a, b)[0], a - b)
    finally:
        plinth.stop()

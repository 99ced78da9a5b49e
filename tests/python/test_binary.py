"""Triton's HTTP client with binary tensor data (its default), FP16 and
BYTES tensors, compressed bodies, the model configuration and statistics
extensions, Server-Timing, and the Prometheus counters — all against the
running binary, checked against onnxruntime in Python."""

import gzip
import http.client
import json
import re
import urllib.request

import numpy as np
import onnxruntime
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper, save

from conftest import ROOT, Plinth

CLS = ROOT / "model_repository/ocr_cls/1/model.onnx"
CLS_OUT = "save_infer_model/scale_0.tmp_1"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """ocr_cls, plus `halves` (FP16 y = x * 2 and BYTES s echoed) without a config.pbtxt."""
    repo = tmp_path_factory.mktemp("repo")
    (repo / "ocr_cls" / "1").mkdir(parents=True)
    (repo / "ocr_cls" / "1" / "model.onnx").write_bytes(CLS.read_bytes())
    (repo / "ocr_cls" / "config.pbtxt").write_text("max_batch_size: 8\ndynamic_batching { }\n")
    (repo / "halves" / "1").mkdir(parents=True)
    two = helper.make_tensor("two", TensorProto.FLOAT16, [], np.array([2], np.float16).view(np.uint16).tolist())
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"]), helper.make_node("Identity", ["s"], ["t"])],
        "halves",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 3]),
         helper.make_tensor_value_info("s", TensorProto.STRING, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 3]),
         helper.make_tensor_value_info("t", TensorProto.STRING, [2])],
        initializer=[two],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    save(model, repo / "halves" / "1" / "model.onnx")
    plinth = Plinth(repo)
    yield plinth
    plinth.stop()


def cls_input(seed):
    return np.random.default_rng(seed).uniform(-1, 1, size=(2, 3, 48, 192)).astype(np.float32)


def test_binary_infer_matches_onnxruntime(server):
    client = httpclient.InferenceServerClient(url=server.url)
    x = cls_input(1)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)  # binary_data=True is tritonclient's default
    result = client.infer("ocr_cls", [inp], outputs=[httpclient.InferRequestedOutput(CLS_OUT)])
    (want,) = onnxruntime.InferenceSession(str(CLS)).run([CLS_OUT], {"x": x})
    np.testing.assert_allclose(result.as_numpy(CLS_OUT), want, rtol=0, atol=1e-5)


def test_fp16_and_bytes_tensors_in_binary(server):
    client = httpclient.InferenceServerClient(url=server.url)
    x = np.array([[0.5, -1.25, 3], [65504 / 2, 0.1, -0.0]], dtype=np.float16)
    s = np.array([b"hello", "wörld".encode()], dtype=np.object_)
    inputs = [httpclient.InferInput("x", [2, 3], "FP16"), httpclient.InferInput("s", [2], "BYTES")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(s)
    result = client.infer("halves", inputs)
    y, t = result.as_numpy("y"), result.as_numpy("t")
    assert y.dtype == np.float16
    want_y, want_t = onnxruntime.InferenceSession(str(server.repository / "halves/1/model.onnx")).run(
        None, {"x": x, "s": np.array(["hello", "wörld"], dtype=object)})
    np.testing.assert_array_equal(y, want_y)
    assert [v.decode() for v in t] == list(want_t)


def test_compressed_request_and_response(server):
    client = httpclient.InferenceServerClient(url=server.url)
    x = cls_input(2)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("ocr_cls", [inp], request_compression_algorithm="gzip",
                          response_compression_algorithm="deflate")
    (want,) = onnxruntime.InferenceSession(str(CLS)).run([CLS_OUT], {"x": x})
    np.testing.assert_allclose(result.as_numpy(CLS_OUT), want, rtol=0, atol=1e-5)


def post(server, body, headers):
    conn = http.client.HTTPConnection(server.url)
    conn.request("POST", "/v2/models/halves/infer", body, headers)
    response = conn.getresponse()
    return response.status, json.loads(response.read())


BAD_BINARY = [
    # (what, JSON header, binary part, header length override, expected words)
    ("header longer than the body", {"inputs": []}, b"", 999, "to the body's length"),
    ("binary_data_size past the end",
     {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP16", "parameters": {"binary_data_size": 12}}]},
     b"\0" * 8, None, "only 8 bytes"),
    ("leftover bytes",
     {"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP16", "parameters": {"binary_data_size": 12}}]},
     b"\0" * 14, None, "left over"),
    ("both data and binary_data_size",
     {"inputs": [{"name": "x", "shape": [1], "datatype": "INT8", "data": [1], "parameters": {"binary_data_size": 1}}]},
     b"\0", None, "both 'data' and 'binary_data_size'"),
    ("BYTES element past the end",
     {"inputs": [{"name": "s", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 6}}]},
     b"\x09\0\0\0hi", None, "malformed BYTES"),
]


@pytest.mark.parametrize("what,header,binary,length,words", BAD_BINARY, ids=[c[0] for c in BAD_BINARY])
def test_bad_binary_requests_get_a_clear_400(server, what, header, binary, length, words):
    text = json.dumps(header).encode()
    status, body = post(server, text + binary, {"Inference-Header-Content-Length": str(length or len(text))})
    assert status == 400, (what, body)
    assert words in body["error"], (what, body)


def test_fp16_output_as_json_is_refused_before_running(server):
    before = scrape_halves(server)
    failed_before = refused_count(server)
    body = json.dumps({"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP16",
                                   "parameters": {"binary_data_size": 12}},
                                  {"name": "s", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}]}).encode()
    status, answer = post(server, body + bytes(12), {"Inference-Header-Content-Length": str(len(body))})
    assert status == 400, answer
    assert "output 'y' is FP16" in answer["error"], answer
    assert scrape_halves(server) == before, "the model ran for a request it had to refuse"
    assert refused_count(server) == failed_before + 1, "the refused request is not counted as a failure"


def refused_count(server):
    text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics").read().decode()
    series = 'nv_inference_request_failure{model="halves",reason="OTHER",version="1"} '
    return next((float(line[len(series):]) for line in text.splitlines() if line.startswith(series)), 0.0)


def scrape_halves(server):
    text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics").read().decode()
    return [line for line in text.splitlines() if line.startswith("nv_inference_exec_count{model=\"halves\"")]


def test_unknown_content_encoding_says_why(server):
    status, body = post(server, b"{}", {"Content-Encoding": "br", "Content-Type": "application/json"})
    assert status == 415, body
    assert "Content-Encoding" in body["error"], body


def test_bad_gzip_is_a_400(server):
    status, body = post(server, b"not gzip", {"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert status == 400, body
    assert "error" in body


def test_config_and_stats_extensions(server):
    client = httpclient.InferenceServerClient(url=server.url)
    config = client.get_model_config("halves")
    assert config["name"] == "halves"
    assert config["platform"] == "onnxruntime_onnx"
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("x", "TYPE_FP16", [2, 3]), ("s", "TYPE_STRING", [2])]

    before = client.get_inference_statistics("ocr_cls")["model_stats"][0]
    x = cls_input(3)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    for _ in range(3):
        client.infer("ocr_cls", [inp])
    after = client.get_inference_statistics("ocr_cls")["model_stats"][0]
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 3
    assert after["inference_count"] - before["inference_count"] == 6
    assert after["execution_count"] - before["execution_count"] == 3
    assert any(b["batch_size"] == 2 for b in after["batch_stats"])
    assert after["inference_stats"]["compute_infer"]["ns"] > 0


def scrape(server):
    text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics").read().decode()
    values = {}
    for line in text.splitlines():
        found = re.match(r'^(\w+)\{model="ocr_cls",version="1"\} (\S+)$', line)
        if found:
            values[found.group(1)] = float(found.group(2))
    return values, text


def test_counters_move_by_exactly_the_requests_sent(server):
    client = httpclient.InferenceServerClient(url=server.url)
    before, _ = scrape(server)
    x = cls_input(4)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    for _ in range(5):
        client.infer("ocr_cls", [inp])
    after, text = scrape(server)
    assert after["nv_inference_request_success"] - before.get("nv_inference_request_success", 0) == 5
    assert after["nv_inference_count"] - before.get("nv_inference_count", 0) == 10
    assert after["nv_inference_exec_count"] - before.get("nv_inference_exec_count", 0) == 5
    assert after["nv_inference_request_duration_us"] > before.get("nv_inference_request_duration_us", 0)
    assert 'plinth_inference_request_duration_seconds_bucket{model="ocr_cls",version="1",le="+Inf"}' in text
    for family in ("nv_cpu_utilization", "nv_cpu_memory_used_bytes", "nv_cpu_memory_total_bytes",
                   "nv_model_load_duration_secs"):
        assert family in text, family


def test_server_timing_says_where_the_time_went(server):
    conn = http.client.HTTPConnection(server.url)
    body = json.dumps({"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP16",
                                   "parameters": {"binary_data_size": 12}},
                                  {"name": "s", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}],
                       "outputs": [{"name": "t"}]}).encode()
    conn.request("POST", "/v2/models/halves/infer", body + np.zeros(6, np.float16).tobytes(),
                 {"Inference-Header-Content-Length": str(len(body))})
    response = conn.getresponse()
    assert response.status == 200, response.read()
    timing = response.getheader("Server-Timing")
    names = [part.split(";")[0].strip() for part in timing.split(",")]
    assert names == ["queue", "compute_input", "compute_infer", "compute_output"], timing
    assert all(float(part.split("dur=")[1]) >= 0 for part in timing.split(","))
    answer = json.loads(response.read())
    assert answer["outputs"][0]["data"] == ["a", "b"]

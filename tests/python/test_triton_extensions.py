"""Triton's protocol extensions and the texts its clients match, through
tritonclient against the real binary: the gRPC stream (ModelStreamInfer),
the classification extension over HTTP and gRPC, duplicate requested
outputs, and the messages for unknown models and versions."""

import json
import queue
import shutil
import urllib.error
import urllib.request

import numpy as np
import onnxruntime
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, Plinth, metric, wait_until

CLS = ROOT / "model_repository/ocr_cls/1/model.onnx"
CLS_OUT = "save_infer_model/scale_0.tmp_1"
ANGLES = ["up", "down"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`cls`: ocr_cls with labels for its output; `held`: the same network,
    whose one-row requests wait in the queue for a batch of four."""
    repo = tmp_path_factory.mktemp("repo")
    for name, extra in [("cls", "dynamic_batching { }"),
                        ("held", "dynamic_batching { preferred_batch_size: [ 4 ] "
                                 "max_queue_delay_microseconds: 60000000 }")]:
        (repo / name / "1").mkdir(parents=True)
        shutil.copy(CLS, repo / name / "1" / "model.onnx")
        (repo / name / "angles.txt").write_text("\n".join(ANGLES) + "\n")
        (repo / name / "config.pbtxt").write_text(
            f'max_batch_size: 8\n{extra}\n'
            f'output [ {{ name: "{CLS_OUT}" data_type: TYPE_FP32 dims: [ 2 ] label_filename: "angles.txt" }} ]\n')
    plinth = Plinth(repo)
    yield plinth
    plinth.stop()


def rows(seed, n=1):
    return np.random.default_rng(seed).uniform(-1, 1, size=(n, 3, 48, 192)).astype(np.float32)


def expected(x):
    (probs,) = onnxruntime.InferenceSession(str(CLS)).run([CLS_OUT], {"x": x})
    return probs


def canceled(server, model):
    text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics").read().decode()
    series = f'nv_inference_request_failure{{model="{model}",reason="CANCELED",version="1"}} '
    return next((float(line[len(series):]) for line in text.splitlines() if line.startswith(series)), 0.0)


def grpc_input(x):
    inp = grpcclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return inp


def test_the_stream_answers_each_request_with_its_id_and_errors_in_band(server):
    client = grpcclient.InferenceServerClient(url=server.grpc_url)
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        inputs = {f"r{i}": rows(i, 1 + i % 3) for i in range(8)}
        for request_id, x in inputs.items():
            client.async_stream_infer("cls", [grpc_input(x)], request_id=request_id)
        bad = grpcclient.InferInput("x", [1, 3, 48, 192], "INT32")
        bad.set_data_from_numpy(np.zeros((1, 3, 48, 192), np.int32))
        client.async_stream_infer("cls", [bad], request_id="bad")
        client.async_stream_infer("no_such_model", [grpc_input(rows(9))], request_id="unknown")
        got, errors = {}, {}
        for _ in range(len(inputs) + 2):
            result, error = answers.get(timeout=120)
            if error is None:
                got[result.get_response().id] = result.as_numpy(CLS_OUT)
            else:
                errors[len(errors)] = error.message()
        assert set(got) == set(inputs)
        for request_id, x in inputs.items():
            np.testing.assert_allclose(got[request_id], expected(x), rtol=0, atol=1e-5, err_msg=request_id)
        messages = sorted(errors.values())
        assert "must be FP32, got INT32" in messages[1], messages
        assert messages[0] == "Request for unknown model: 'no_such_model' is not found", messages
        # The stream survived its errors.
        client.async_stream_infer("cls", [grpc_input(rows(10))], request_id="after")
        result, error = answers.get(timeout=120)
        assert error is None and result.get_response().id == "after", error
    finally:
        client.stop_stream()


def test_a_cancelled_stream_takes_its_queued_requests_out(server):
    client = grpcclient.InferenceServerClient(url=server.grpc_url)
    client.start_stream(callback=lambda result, error: None)
    client.async_stream_infer("held", [grpc_input(rows(11))], request_id="held")
    wait_until("the request waits in the queue", lambda: metric(server, "nv_inference_pending_request_count", "held") == 1)
    client.stop_stream(cancel_requests=True)
    wait_until("the request is counted as cancelled", lambda: canceled(server, "held") == 1)
    assert metric(server, "nv_inference_pending_request_count", "held") == 0
    assert metric(server, "nv_inference_exec_count", "held") == 0, "the cancelled request ran"


def top(probs, k):
    """Triton's classification strings for one row: "%f:index:label"."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])[:k]
    return [f"{probs[i]:f}:{i}:{ANGLES[i]}" for i in order]


def texts(classes):
    """Each row's classes as text (binary BYTES come back as bytes, JSON as str)."""
    return [[c.decode() if isinstance(c, bytes) else c for c in row] for row in classes]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_classification_returns_the_top_classes_with_labels(server, protocol):
    x = rows(12, 3)
    want = expected(x)
    if protocol == "http":
        client = httpclient.InferenceServerClient(url=server.url)
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        for binary in (True, False):
            output = httpclient.InferRequestedOutput(CLS_OUT, binary_data=binary, class_count=1)
            classes = client.infer("cls", [inp], outputs=[output]).as_numpy(CLS_OUT)
            assert classes.shape == (3, 1)
            assert texts(classes) == [top(row, 1) for row in want], binary
    else:
        client = grpcclient.InferenceServerClient(url=server.grpc_url)
        output = grpcclient.InferRequestedOutput(CLS_OUT, class_count=5)
        classes = client.infer("cls", [grpc_input(x)], outputs=[output]).as_numpy(CLS_OUT)
        assert classes.shape == (3, 2), "at most as many classes as the output has"
        assert texts(classes) == [top(row, 2) for row in want]


def post(server, path, body):
    request = urllib.request.Request(f"http://{server.url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_an_output_asked_for_twice_is_refused(server):
    body = {"inputs": [{"name": "x", "shape": [1, 3, 48, 192], "datatype": "FP32",
                        "data": np.zeros(3 * 48 * 192).tolist()}],
            "outputs": [{"name": CLS_OUT}, {"name": CLS_OUT}]}
    status, answer = post(server, "/v2/models/cls/infer", body)
    assert status == 400
    assert f"output '{CLS_OUT}' already exists in request" in answer["error"], answer


def test_unknown_models_and_versions_say_so_as_triton_does(server):
    http = httpclient.InferenceServerClient(url=server.url)
    grpc_client = grpcclient.InferenceServerClient(url=server.grpc_url)
    x = rows(13)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    cases = [("nothing", "", "Request for unknown model: 'nothing' is not found"),
             ("cls", "7", "Request for unknown model: 'cls' version 7 is not found")]
    for model, version, message in cases:
        with pytest.raises(InferenceServerException) as failure:
            http.infer(model, [inp], model_version=version)
        assert failure.value.message() == message
        with pytest.raises(InferenceServerException) as failure:
            grpc_client.infer(model, [grpc_input(x)], model_version=version)
        assert failure.value.message() == message


def test_log_settings_change_the_log_and_refuse_what_plinth_cannot_do(server):
    http = httpclient.InferenceServerClient(url=server.url)
    grpc_client = grpcclient.InferenceServerClient(url=server.grpc_url)
    assert http.get_log_settings() == {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
                                      "log_verbose_level": 0, "log_format": "default"}
    assert http.update_log_settings({"log_verbose_level": 1})["log_verbose_level"] == 1
    # The new level is in force: a debug line for each request.
    grpc_client.infer("cls", [grpc_input(rows(14))])
    server.wait_for_log("infer: accepted")
    settings = grpc_client.get_log_settings(as_json=True)["settings"]
    assert settings["log_verbose_level"] == {"uint32_param": 1}, settings
    grpc_client.update_log_settings({"log_verbose_level": 0})
    assert http.get_log_settings()["log_verbose_level"] == 0
    for update, message in [({"log_file": "/tmp/x.log"}, "cannot be set: Plinth logs to stderr"),
                            ({"log_format": "ISO8601"}, "cannot change while serving"),
                            ({"log_warning": False}, "log levels nest"),
                            ({"log_colour": True}, "unknown log setting 'log_colour'")]:
        with pytest.raises(InferenceServerException) as failure:
            http.update_log_settings(update)
        assert message in failure.value.message(), update
    assert http.get_log_settings()["log_verbose_level"] == 0, "a refused update changes nothing"


def test_trace_settings_through_tritonclient_and_metadata_lists_what_is_implemented(server):
    http_client = httpclient.InferenceServerClient(url=server.url)
    grpc_client = grpcclient.InferenceServerClient(url=server.grpc_url)
    assert http_client.get_trace_settings()["trace_level"] == ["OFF"]
    try:
        updated = http_client.update_trace_settings(model_name="cls", settings={"trace_rate": "7"})
        assert updated["trace_rate"] == "7" and updated["trace_level"] == ["OFF"], updated
        model = grpc_client.get_trace_settings(model_name="cls", as_json=True)["settings"]
        assert model["trace_rate"]["value"] == ["7"] and model["trace_mode"]["value"] == ["opentelemetry"]
        assert http_client.get_trace_settings()["trace_rate"] == "1000", "the server's own settings are unchanged"
        with pytest.raises(InferenceServerException, match="trace files"):
            http_client.update_trace_settings(settings={"trace_file": "/tmp/trace.json"})
    finally:
        http_client.update_trace_settings(model_name="cls", settings={})
    assert http_client.get_trace_settings(model_name="cls")["trace_rate"] == "1000"
    extensions = http_client.get_server_metadata()["extensions"]
    assert extensions == ["binary_tensor_data", "classification", "logging", "model_configuration",
                          "model_repository", "schedule_policy", "statistics", "system_shared_memory", "trace"]

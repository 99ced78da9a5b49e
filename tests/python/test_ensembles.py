"""Ensembles through the real binary, driven by tritonclient over HTTP,
gRPC and the gRPC stream: ocr_cls followed by a small ONNX post-model
(ArgMax of its two angle scores), the same with ocr_cls served by a second
Plinth as a remote step, and both reloaded (the ensemble and its steps)
while requests flow, none failing; each answer checked against onnxruntime
in Python."""

import json
import queue
import shutil
import threading

import numpy as np
import onnxruntime
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper, save

from conftest import ROOT, Plinth, wait_until

CLS = ROOT / "model_repository/ocr_cls/1/model.onnx"
CLS_OUT = "save_infer_model/scale_0.tmp_1"


def argmax_model(folder):
    """`angle_of`: scores [N, 2] FP32 -> class [N, 1] INT64 (ArgMax)."""
    graph = helper.make_graph(
        [helper.make_node("ArgMax", ["scores"], ["class"], axis=1, keepdims=1)], "angle_of",
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("class", TensorProto.INT64, ["N", 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (folder / "1").mkdir(parents=True)
    save(model, folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text("max_batch_size: 8\n")


def ensemble(folder, classifier):
    """`direction`: IMAGE -> (SCORES, CLASS), `classifier` then `angle_of`."""
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(f'''
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "IMAGE" data_type: TYPE_FP32 dims: [ 3, 48, 192 ] }} ]
output [ {{ name: "SCORES" data_type: TYPE_FP32 dims: [ 2 ] }},
         {{ name: "CLASS" data_type: TYPE_INT64 dims: [ 1 ] }} ]
ensemble_scheduling {{ step [
  {{ model_name: "{classifier}" model_version: -1
     input_map {{ key: "x" value: "IMAGE" }} output_map {{ key: "{CLS_OUT}" value: "SCORES" }} }},
  {{ model_name: "angle_of" model_version: -1
     input_map {{ key: "scores" value: "SCORES" }} output_map {{ key: "class" value: "CLASS" }} }} ] }}
''')


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """A remote Plinth serving ocr_cls, and the front: `cls` (ocr_cls),
    `remote_cls` (the remote's), `angle_of`, and the ensembles `direction`
    (cls, angle_of) and `remote_direction` (remote_cls, angle_of)."""
    remote_repo = tmp_path_factory.mktemp("remote")
    (remote_repo / "ocr_cls" / "1").mkdir(parents=True)
    shutil.copy(CLS, remote_repo / "ocr_cls" / "1" / "model.onnx")
    remote = Plinth(remote_repo)
    repo = tmp_path_factory.mktemp("front")
    (repo / "cls" / "1").mkdir(parents=True)
    shutil.copy(CLS, repo / "cls" / "1" / "model.onnx")
    (repo / "cls" / "config.pbtxt").write_text("max_batch_size: 8\ndynamic_batching { }\n")
    (repo / "remote_cls" / "1").mkdir(parents=True)
    (repo / "remote_cls" / "config.pbtxt").write_text(f'''
backend: "remote"
max_batch_size: 8
parameters {{ key: "remote.url" value {{ string_value: "http://{remote.url}" }} }}
parameters {{ key: "remote.model" value {{ string_value: "ocr_cls" }} }}
parameters {{ key: "remote.timeout_ms" value {{ string_value: "60000" }} }}
''')
    argmax_model(repo / "angle_of")
    ensemble(repo / "direction", "cls")
    ensemble(repo / "remote_direction", "remote_cls")
    front = Plinth(repo, "--model-control-mode", "explicit", "--load-model", "direction",
                   "--load-model", "remote_direction")
    yield remote, front
    front.stop()
    remote.stop()


def images(seed, n):
    return np.random.default_rng(seed).uniform(-1, 1, size=(n, 3, 48, 192)).astype(np.float32)


def check(x, scores, classes):
    (want,) = onnxruntime.InferenceSession(str(CLS)).run([CLS_OUT], {"x": x})
    np.testing.assert_allclose(scores, want, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(classes, want.argmax(axis=1).reshape(-1, 1))


def http_infer(front, model, x):
    client = httpclient.InferenceServerClient(url=front.url)
    inp = httpclient.InferInput("IMAGE", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer(model, [inp])
    return result.as_numpy("SCORES"), result.as_numpy("CLASS")


def grpc_input(x):
    inp = grpcclient.InferInput("IMAGE", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return inp


@pytest.mark.parametrize("model", ["direction", "remote_direction"])
def test_an_ensemble_answers_like_its_steps_run_by_hand(servers, model):
    _, front = servers
    x = images(1, 3)
    check(x, *http_infer(front, model, x))
    client = grpcclient.InferenceServerClient(url=front.grpc_url)
    result = client.infer(model, [grpc_input(x)])
    check(x, result.as_numpy("SCORES"), result.as_numpy("CLASS"))
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i in range(4):
            client.async_stream_infer(model, [grpc_input(images(10 + i, 1))], request_id=str(i))
        for _ in range(4):
            result, error = answers.get(timeout=120)
            assert error is None, error
            check(images(10 + int(result.get_response().id), 1), result.as_numpy("SCORES"), result.as_numpy("CLASS"))
    finally:
        client.stop_stream()


def test_ensemble_metadata_config_statistics_and_readiness(servers):
    _, front = servers
    client = httpclient.InferenceServerClient(url=front.url)
    assert client.is_model_ready("direction")
    metadata = client.get_model_metadata("direction")
    assert metadata["platform"] == "ensemble"
    assert [(o["name"], o["datatype"], o["shape"]) for o in metadata["outputs"]] == [
        ("SCORES", "FP32", [-1, 2]), ("CLASS", "INT64", [-1, 1])]
    config = client.get_model_config("direction")
    assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == ["cls", "angle_of"]
    index = {row["name"]: row["state"] for row in client.get_model_repository_index()}
    assert index["cls"] == index["angle_of"] == index["remote_cls"] == "READY", "loading it loaded its steps"
    before = client.get_inference_statistics("direction")["model_stats"][0]["inference_stats"]["success"]["count"]
    http_infer(front, "direction", images(2, 1))
    after = client.get_inference_statistics("direction")["model_stats"][0]["inference_stats"]["success"]["count"]
    assert after == before + 1


def test_reloads_under_traffic_fail_no_request(servers):
    """The steps and the ensemble itself reloaded three times each, through
    the load API with a new configuration every time (so each load really
    swaps the model), while four clients keep asking: every answer right."""
    _, front = servers
    client = httpclient.InferenceServerClient(url=front.url)
    stop, failures, answered = threading.Event(), [], [0]

    def traffic(model, seed):
        while not stop.is_set():
            x = images(seed, 2)
            try:
                check(x, *http_infer(front, model, x))
                answered[0] += 1
            except Exception as e:  # noqa: BLE001 - every failure is the test's finding
                failures.append(f"{model}: {e}")

    threads = [threading.Thread(target=traffic, args=(m, s)) for s, m in enumerate(["direction", "remote_direction"] * 2)]
    for t in threads:
        t.start()
    try:
        wait_until("the first ensemble answers", lambda: answered[0] > 0)
        ensemble_config = client.get_model_config("direction")
        for i in range(3):
            delay = {"dynamic_batching": {"max_queue_delay_microseconds": i}}
            client.load_model("cls", config=json.dumps({"max_batch_size": 8, **delay}))
            client.load_model("angle_of", config=json.dumps({"max_batch_size": 8, **delay}))
            client.load_model("direction", config=json.dumps({**ensemble_config, "parameters": {"reload": {"string_value": str(i)}}}))
        seen = answered[0]
        wait_until("answers after the last reload", lambda: answered[0] > seen)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not failures, failures[:5]

"""Triton's gRPC client against Plinth's KServe v2 gRPC service: health,
metadata, config, infer (FP16 and BYTES), statistics, and the repository
index / load / unload (over HTTP too), checked against onnxruntime in
Python; plus the standard gRPC health service."""

import urllib.error
import urllib.request

import grpc
import numpy as np
import onnxruntime
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from conftest import ROOT, Plinth, wait_until
from test_binary import CLS, CLS_OUT, server as binary_server  # noqa: F401  (the halves + ocr_cls repository)


@pytest.fixture(scope="module")
def client(binary_server):  # noqa: F811
    return grpcclient.InferenceServerClient(url=binary_server.grpc_url)


def test_health_and_metadata(client, binary_server):  # noqa: F811
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("ocr_cls")
    assert not client.is_model_ready("no_such_model")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "plinth"
    assert "binary_tensor_data" in meta["extensions"]
    model = client.get_model_metadata("ocr_cls", as_json=True)
    assert model["platform"] == "onnxruntime_onnx"
    # This repository's ocr_cls has no inputs in config.pbtxt: the model file's shape.
    assert model["inputs"][0] == {"name": "x", "datatype": "FP32", "shape": ["-1", "3", "-1", "-1"]}
    config = client.get_model_config("halves", as_json=True)["config"]
    assert [i["name"] for i in config["input"]] == ["x", "s"]

    # The health service follows readiness.
    stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(binary_server.grpc_url))
    serving = health_pb2.HealthCheckResponse.SERVING
    wait_until("the gRPC health service says SERVING",
               lambda: stub.Check(health_pb2.HealthCheckRequest(service="")).status == serving)


def test_infer_matches_onnxruntime(client):
    x = np.random.default_rng(5).uniform(-1, 1, size=(3, 3, 48, 192)).astype(np.float32)
    inp = grpcclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("ocr_cls", [inp], outputs=[grpcclient.InferRequestedOutput(CLS_OUT)], request_id="g-1")
    (want,) = onnxruntime.InferenceSession(str(CLS)).run([CLS_OUT], {"x": x})
    np.testing.assert_allclose(result.as_numpy(CLS_OUT), want, rtol=0, atol=1e-5)
    assert result.get_response().id == "g-1"


def test_compressed_messages(client):
    x = np.random.default_rng(6).uniform(-1, 1, size=(1, 3, 48, 192)).astype(np.float32)
    inp = grpcclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    for algorithm in ("gzip", "deflate"):
        result = client.infer("ocr_cls", [inp], compression_algorithm=algorithm)
        (want,) = onnxruntime.InferenceSession(str(CLS)).run([CLS_OUT], {"x": x})
        np.testing.assert_allclose(result.as_numpy(CLS_OUT), want, rtol=0, atol=1e-5)


def test_raw_and_typed_contents_together_are_refused(binary_server):  # noqa: F811
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(binary_server.grpc_url))
    request = service_pb2.ModelInferRequest(model_name="ocr_cls")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 3, 48, 192])
    tensor.contents.fp32_contents.extend([0.0] * (3 * 48 * 192))
    request.raw_input_contents.append(np.zeros(3 * 48 * 192, np.float32).tobytes())
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(request)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "both typed contents and raw_input_contents" in e.value.details()

    del request.raw_input_contents[:]
    tensor.contents.int_contents.extend([1])
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(request)
    assert "FP32 data goes in fp32_contents, but int_contents is set" in e.value.details()


def test_fp16_and_bytes(client, binary_server):  # noqa: F811
    x = np.array([[1.5, -2, 0.25], [8, 16, -0.5]], dtype=np.float16)
    s = np.array([b"grpc", "ünïcode".encode()], dtype=np.object_)
    inputs = [grpcclient.InferInput("x", [2, 3], "FP16"), grpcclient.InferInput("s", [2], "BYTES")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(s)
    result = client.infer("halves", inputs)
    want_y, want_t = onnxruntime.InferenceSession(str(binary_server.repository / "halves/1/model.onnx")).run(
        None, {"x": x, "s": np.array(["grpc", "ünïcode"], dtype=object)})
    np.testing.assert_array_equal(result.as_numpy("y"), want_y)
    assert [v.decode() for v in result.as_numpy("t")] == list(want_t)


def test_errors_are_grpc_statuses(client):
    inp = grpcclient.InferInput("x", [1, 3, 48, 192], "INT32")
    inp.set_data_from_numpy(np.zeros((1, 3, 48, 192), np.int32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("ocr_cls", [inp])
    assert "StatusCode.INVALID_ARGUMENT" in str(e.value.status())
    assert "must be FP32, got INT32" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        client.infer("no_such_model", [inp])
    assert "StatusCode.NOT_FOUND" in str(e.value.status())


def test_statistics(client):
    x = np.zeros((1, 3, 48, 192), np.float32)
    inp = grpcclient.InferInput("x", [1, 3, 48, 192], "FP32")
    inp.set_data_from_numpy(x)
    before = client.get_inference_statistics("ocr_cls", as_json=True)["model_stats"][0]
    client.infer("ocr_cls", [inp])
    after = client.get_inference_statistics("ocr_cls", as_json=True)["model_stats"][0]
    count = lambda s: int(s["inference_stats"]["success"].get("count", 0))  # noqa: E731
    assert count(after) - count(before) == 1


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_repository_index_load_and_unload(tmp_path, protocol):
    (tmp_path / "ocr_cls" / "1").mkdir(parents=True)
    (tmp_path / "ocr_cls" / "1" / "model.onnx").write_bytes(CLS.read_bytes())
    server = Plinth(tmp_path, "--model-control-mode", "explicit")
    try:
        if protocol == "grpc":
            client = grpcclient.InferenceServerClient(url=server.grpc_url)
            index = lambda: client.get_model_repository_index(as_json=True)["models"]  # noqa: E731
        else:
            client = httpclient.InferenceServerClient(url=server.url)
            index = client.get_model_repository_index
        assert not client.is_model_ready("ocr_cls")
        client.load_model("ocr_cls")
        assert client.is_model_ready("ocr_cls")
        assert {"name": "ocr_cls", "version": "1", "state": "READY"} in [
            {k: m[k] for k in ("name", "version", "state")} for m in index()]
        client.unload_model("ocr_cls")
        assert not client.is_model_ready("ocr_cls")
        with pytest.raises(InferenceServerException):
            client.load_model("no_such_model")
        # A name is one folder of the repository, never a path out of it.
        (tmp_path.parent / "outside" / "1").mkdir(parents=True, exist_ok=True)
        (tmp_path.parent / "outside" / "1" / "model.onnx").write_bytes(CLS.read_bytes())
        for name in ("../outside", str(tmp_path.parent / "outside")):
            with pytest.raises(InferenceServerException) as e:
                client.load_model(name)
            # tritonclient.http sends the slashes unencoded: the path is no route at all.
            assert "not a model name" in e.value.message() or protocol == "http", e.value.message()
        encoded = urllib.request.Request(f"http://{server.url}/v2/repository/models/..%2Foutside/load", method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(encoded)
        assert e.value.code == 400 and "not a model name" in e.value.read().decode()
    finally:
        server.stop()

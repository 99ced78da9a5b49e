"""Plays ModelMesh against `plinth serve --model-control-mode=modelmesh`,
through stubs generated from Plinth's own runtime/proto/model_runtime.proto
(checked against ModelMesh's published one by test_modelmesh_proto.py):
runtimeStatus, three loads laid out as ModelMesh's puller leaves them (two
model folders and one bare ONNX file), inference routed by the `mm-model-id`
header with the outputs checked against onnxruntime, unloads, a load
cancelled mid-way, the purge when ModelMesh restarts, a Plinth restart, a
memory budget that refuses rather than evicts, unloads that wait for the
requests still running, and a load that runtimeStatus aborts."""

import concurrent.futures
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import onnxruntime
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper, save
from PIL import Image
from tritonclient.utils import InferenceServerException

from conftest import HANG_GUARD_S, ROOT, Plinth, faulty_model, rss, series_value, wait_until

MIB = 1 << 20
BUDGET = 2048 * MIB
INFER = "inference.GRPCInferenceService/ModelInfer"
CLS_OUT = "save_infer_model/scale_0.tmp_1"
REC_OUT = "softmax_11.tmp_0"


@pytest.fixture(scope="module")
def mmesh(tmp_path_factory):
    """The generated `model_runtime_pb2` and `model_runtime_pb2_grpc` modules."""
    out = tmp_path_factory.mktemp("stubs")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'runtime/proto'}",
                    f"--python_out={out}", f"--grpc_python_out={out}", "model_runtime.proto"], check=True)
    sys.path.insert(0, str(out))
    import model_runtime_pb2
    import model_runtime_pb2_grpc
    return model_runtime_pb2, model_runtime_pb2_grpc


@pytest.fixture(scope="module")
def pulled(tmp_path_factory):
    """Model files as the puller leaves them: `<root>/<id>/<name>`."""
    root = tmp_path_factory.mktemp("models")
    models = {}
    for model_id, source in [("ocr-cls__isvc-0001", "ocr_cls"), ("ocr-rec__isvc-0002", "ocr_rec")]:
        models[model_id] = shutil.copytree(ROOT / "model_repository" / source, root / model_id / source)
    (root / "mobilenet__isvc-0003").mkdir()
    models["mobilenet__isvc-0003"] = shutil.copy(ROOT / ".cache/mobilenet_v2/model.onnx",
                                                 root / "mobilenet__isvc-0003" / "mobilenet.onnx")
    return models


def held_model(folder):
    """A model folder whose load stays LOADING until `release(folder)`: the
    test plugin's init waits for the file `1/release` (the time limit is
    only a guard against a hang: the test releases it)."""
    return faulty_model(folder, ("faulty.init_wait", "release"), ("plugin.timeout_ms", "600000"))


def waiting_model(folder):
    """A model folder whose requests with the body `wait:go` stay in its
    plugin until the file `1/go` exists."""
    return faulty_model(folder)


def predict(server, model_id, body):
    """(status, JSON body) of /predict for `model_id` over HTTP."""
    request = urllib.request.Request(f"http://{server.url}/v2/models/{model_id}/predict", data=body)
    try:
        with urllib.request.urlopen(request, timeout=HANG_GUARD_S) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def plugin_instances(server, model_id):
    """Plugin instances `model_id` has started: the first at load, then one
    for each call that found every other instance busy."""
    return series_value(server, f'plinth_plugin_instance_starts_total{{model="{model_id}",version="1"}}')


def release(folder):
    (folder / "1/release").write_bytes(b"")


class Mesh:
    """What ModelMesh does to a runtime, over one channel."""

    def __init__(self, server, mmesh):
        self.pb, grpc_mod = mmesh
        self.channel = grpc.insecure_channel(server.grpc_url)
        self.stub = grpc_mod.ModelRuntimeStub(self.channel)
        self.server = server

    def status(self):
        deadline = time.monotonic() + HANG_GUARD_S
        while True:
            status = self.stub.runtimeStatus(self.pb.RuntimeStatusRequest())
            if status.status == self.pb.RuntimeStatusResponse.READY or time.monotonic() > deadline:
                return status
            time.sleep(0.1)

    def load_request(self, model_id, path, model_type="onnx"):
        key = {"model_type": {"name": model_type, "version": "1"}, "disk_size_bytes": disk_size(path),
               "storage_params": {"type": "s3"}}
        return self.pb.LoadModelRequest(modelId=model_id, modelType=model_type, modelPath=str(path),
                                        modelKey=json.dumps(key))

    def load(self, model_id, path):
        return self.stub.loadModel(self.load_request(model_id, path), timeout=120).sizeInBytes

    def start_load(self, model_id, path):
        """Starts loadModel of a `held_model` and returns its call once the
        model shows as LOADING (where it stays until released)."""
        call = self.stub.loadModel.future(self.load_request(model_id, path))
        wait_until("the load shows as LOADING",
                   lambda: any(r["name"] == model_id and r.get("state") == "LOADING" for r in self.index()))
        assert not call.done(), call
        return call

    def unload(self, model_id):
        self.stub.unloadModel(self.pb.UnloadModelRequest(modelId=model_id), timeout=120)

    def size(self, model_id):
        return self.stub.modelSize(self.pb.ModelSizeRequest(modelId=model_id)).sizeInBytes

    def predicted(self, model_id, path):
        r = self.load_request(model_id, path)
        request = self.pb.PredictModelSizeRequest(modelId=r.modelId, modelType=r.modelType, modelPath=r.modelPath,
                                                  modelKey=r.modelKey)
        return self.stub.predictModelSize(request).sizeInBytes

    def index(self):
        request = urllib.request.Request(f"http://{self.server.url}/v2/repository/index", data=b"{}", method="POST")
        with urllib.request.urlopen(request) as response:
            return json.load(response)


def disk_size(path):
    path = pathlib.Path(path)
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def infer(server, model_id, model_name, x, output, input_name="x"):
    """ModelInfer as ModelMesh forwards it: the id in the `mm-model-id`
    header; `model_name` is whatever the client sent."""
    client = grpcclient.InferenceServerClient(url=server.grpc_url)
    inp = grpcclient.InferInput(input_name, list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer(model_name, [inp], outputs=[grpcclient.InferRequestedOutput(output)],
                          headers={"mm-model-id": model_id})
    return result.as_numpy(output)


def photo(path):
    """torchvision's ImageNet preprocessing: shorter side 256, centre 224, normalised, NCHW."""
    image = Image.open(path).convert("RGB")
    w, h = image.size
    scale = 256 / min(w, h)
    image = image.resize((round(w * scale), round(h * scale)), Image.BILINEAR)
    left, top = (image.width - 224) // 2, (image.height - 224) // 2
    x = np.asarray(image.crop((left, top, left + 224, top + 224)), np.float32) / 255
    x = (x - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
    return x.transpose(2, 0, 1)[None].astype(np.float32)


def expect_not_found(server, model_id):
    with pytest.raises(InferenceServerException) as failure:
        infer(server, model_id, "any", np.zeros((1, 3, 48, 192), np.float32), CLS_OUT)
    assert failure.value.status() == "StatusCode.NOT_FOUND", failure.value
    assert model_id in failure.value.message()


def test_modelmesh_conformance(mmesh, pulled, tmp_path):
    # A first server compiles the models' plugins into the cache that the
    # measured one reads: compiling takes memory that is the process's, not
    # a model's, and a load and unload in the measured server would leave
    # allocator fragments that the measured loads reuse (RSS then grew by
    # 0.79-1.0 of the sizes; measured as here, by 1.00-1.03).
    flags = ["--model-control-mode", "modelmesh", "--model-memory-budget", f"{BUDGET // MIB}MiB"]
    compiler = Plinth(None, *flags, plugin_cache=tmp_path / "plugins")
    try:
        for model_id, path in pulled.items():
            Mesh(compiler, mmesh).load(model_id, path)
    finally:
        compiler.stop()
    server = Plinth(None, *flags, plugin_cache=tmp_path / "plugins")
    try:
        mesh = Mesh(server, mmesh)
        status = mesh.status()
        assert status.status == mesh.pb.RuntimeStatusResponse.READY
        assert status.capacityInBytes == BUDGET
        assert status.maxLoadingConcurrency >= 1
        assert status.modelLoadingTimeoutMs == 60_000
        assert status.defaultModelSizeInBytes >= 16 * MIB
        assert list(status.methodInfos[INFER].idInjectionPath) == [1]
        assert not status.allowAnyMethod and status.runtimeVersion

        # Three loads. Each size is the one Plinth measured and budgets; all
        # together they are the resident memory the loads added, once a
        # first model (kept loaded) paid what the process pays once: ONNX
        # Runtime's and wasmtime's code and set-up, about 15 MiB.
        warmup = "warmup__isvc-0000"
        mesh.load(warmup, pulled["ocr-cls__isvc-0001"])
        sizes = {}
        before = rss(server)
        for model_id, path in pulled.items():
            predicted = mesh.predicted(model_id, path)
            sizes[model_id] = mesh.load(model_id, path)
            assert sizes[model_id] == mesh.size(model_id) > 0
            assert predicted >= sizes[model_id], f"predictModelSize is not conservative for {model_id}"
        grown = rss(server) - before
        assert abs(sum(sizes.values()) - grown) <= 0.25 * grown, (sizes, grown)
        mesh.unload(warmup)
        index = {row["name"]: row for row in mesh.index()}
        assert set(index) == set(pulled)
        for model_id, size in sizes.items():
            assert index[model_id]["state"] == "READY"
            assert abs(size - index[model_id]["resident_bytes"]) <= 0.25 * index[model_id]["resident_bytes"]

        # Inference through mm-model-id, checked against onnxruntime.
        rng = np.random.default_rng(9)
        cls_x = rng.uniform(-1, 1, size=(2, 3, 48, 192)).astype(np.float32)
        rec_x = rng.uniform(-1, 1, size=(1, 3, 48, 320)).astype(np.float32)
        for model_id, x, output, file in [
            ("ocr-cls__isvc-0001", cls_x, CLS_OUT, pulled["ocr-cls__isvc-0001"] / "1/model.onnx"),
            ("ocr-rec__isvc-0002", rec_x, REC_OUT, pulled["ocr-rec__isvc-0002"] / "1/model.onnx"),
        ]:
            got = infer(server, model_id, "ocr", x, output)
            (want,) = onnxruntime.InferenceSession(str(file)).run([output], {"x": x})
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
        session = onnxruntime.InferenceSession(str(pulled["mobilenet__isvc-0003"]))
        input_name, logits_name = session.get_inputs()[0].name, session.get_outputs()[0].name
        x = photo(ROOT / ".cache/samples/china.jpg")
        got = infer(server, "mobilenet__isvc-0003", "mobilenet", x, logits_name, input_name)
        (want,) = session.run([logits_name], {input_name: x})
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-3)
        assert int(got.argmax()) == 698, "china.jpg is a palace"

        # Unloads are idempotent and leave nothing behind.
        mesh.unload("ocr-rec__isvc-0002")
        mesh.unload("ocr-rec__isvc-0002")
        mesh.unload("never-loaded")
        expect_not_found(server, "ocr-rec__isvc-0002")
        with pytest.raises(grpc.RpcError) as failure:
            mesh.size("ocr-rec__isvc-0002")
        assert failure.value.code() == grpc.StatusCode.NOT_FOUND
        assert "ocr-rec__isvc-0002" not in {row["name"] for row in mesh.index()}

        # A load cancelled mid-way, then unloadModel: unloadModel waits for
        # the load, then undoes it; the model is absent, and stays so.
        held = held_model(tmp_path / "held")
        call = mesh.start_load("held__isvc-0004", held)
        assert call.cancel()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            unloading = pool.submit(mesh.unload, "held__isvc-0004")
            release(held)
            unloading.result()
        server.wait_for_log(r"load: ready.*held__isvc-0004")
        assert "held__isvc-0004" not in {row["name"] for row in mesh.index()}
        expect_not_found(server, "held__isvc-0004")

        # ModelMesh restarting asks runtimeStatus again: everything is purged.
        assert mesh.status().status == mesh.pb.RuntimeStatusResponse.READY
        assert mesh.index() == []
        expect_not_found(server, "ocr-cls__isvc-0001")
    finally:
        server.stop()

    # Plinth restarting: it reports READY with nothing loaded.
    server = Plinth(None, "--model-control-mode", "modelmesh", "--model-memory-budget", f"{BUDGET // MIB}MiB")
    try:
        mesh = Mesh(server, mmesh)
        assert mesh.status().status == mesh.pb.RuntimeStatusResponse.READY
        assert mesh.index() == []
        for model_id in pulled:
            expect_not_found(server, model_id)
    finally:
        server.stop()


def test_the_budget_refuses_loads_and_evicts_nothing(mmesh, pulled, tmp_path):
    # y = x + w, with 40 MiB of weights.
    n = 10 * MIB
    weights = helper.make_tensor("w", TensorProto.FLOAT, [n], np.ones(n, np.float32).tobytes(), raw=True)
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "big",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])], initializer=[weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    save(model, tmp_path / "big.onnx")

    server = Plinth(None, "--model-control-mode", "modelmesh", "--model-memory-budget", "48MiB")
    try:
        mesh = Mesh(server, mmesh)
        assert mesh.status().capacityInBytes == 48 * MIB
        mobilenet = mesh.load("mobilenet__isvc-0003", pulled["mobilenet__isvc-0003"])
        assert 13 * MIB < mobilenet < 34 * MIB
        # Its 40 MiB of weights alone exceed what is left: refused before any
        # load, and nothing is evicted to make room.
        with pytest.raises(grpc.RpcError) as failure:
            mesh.load("big__isvc-0005", tmp_path / "big.onnx")
        assert failure.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "--model-memory-budget is free" in failure.value.details()
        assert {row["name"] for row in mesh.index()} == {"mobilenet__isvc-0003"}
        x = photo(ROOT / ".cache/samples/china.jpg")
        assert int(infer(server, "mobilenet__isvc-0003", "any", x, "OUTPUT__0", "INPUT__0").argmax()) == 698

        # Paths that are not models are refused with the reason, nothing tried.
        with pytest.raises(grpc.RpcError) as failure:
            mesh.stub.loadModel(mesh.pb.LoadModelRequest(modelId="x", modelPath="/nonexistent", modelKey="{}"))
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "does not exist" in failure.value.details()
        with pytest.raises(grpc.RpcError) as failure:
            mesh.stub.loadModel(mesh.pb.LoadModelRequest(modelId="x", modelPath=str(tmp_path), modelKey="not json"))
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "modelKey is not JSON" in failure.value.details()
    finally:
        server.stop()


def test_unloads_wait_for_requests_and_a_purge_aborts_loads(mmesh, pulled, tmp_path):
    # Four plugin calls at once, whatever the number of cores.
    server = Plinth(None, "--model-control-mode", "modelmesh", "--model-memory-budget", f"{BUDGET // MIB}MiB",
                    "--plugin-concurrency", "4")
    try:
        mesh = Mesh(server, mmesh)
        mesh.status()
        mobilenet = pulled["mobilenet__isvc-0003"]
        mesh.load("mobilenet__isvc-0003", mobilenet)
        # The same id from another path is refused; from the same path it is a no-op.
        with pytest.raises(grpc.RpcError) as failure:
            mesh.load("mobilenet__isvc-0003", pulled["ocr-cls__isvc-0001"])
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "loaded already" in failure.value.details()
        assert mesh.load("mobilenet__isvc-0003", mobilenet) == mesh.size("mobilenet__isvc-0003")

        mesh.unload("mobilenet__isvc-0003")
        expect_not_found(server, "mobilenet__isvc-0003")

        # unloadModel returns only after the requests on the model have
        # finished, each with its answer: four requests held in the model's
        # plugin until the test creates a file, all four inside before the
        # unload begins (the plugin started an instance for each).
        waiting = waiting_model(tmp_path / "waiting")
        model_id = "waiting__isvc-0005"
        mesh.load(model_id, waiting)
        # The plugin sends zeros, its variable dimensions (height, width) 1.
        zeros = np.zeros((1, 3, 1, 1), np.float32)
        (want,) = onnxruntime.InferenceSession(str(waiting / "1/model.onnx")).run([CLS_OUT], {"x": zeros})
        with concurrent.futures.ThreadPoolExecutor(5) as pool:
            requests = [pool.submit(predict, server, model_id, b"wait:go") for _ in range(4)]
            wait_until("the four requests are in the plugin", lambda: plugin_instances(server, model_id) == 4)
            unloading = pool.submit(mesh.unload, model_id)
            wait_until("the unload has begun: the model no longer serves",
                       lambda: [row.get("state") for row in mesh.index() if row["name"] == model_id] != ["READY"])
            assert not unloading.done(), "unloadModel returned while four requests were still held"
            assert not any(r.done() for r in requests), [r.result() for r in requests if r.done()]
            (waiting / "1/go").write_bytes(b"")
            answers = [r.result(timeout=HANG_GUARD_S) for r in requests]
            unloading.result(timeout=HANG_GUARD_S)
        for status, body in answers:
            assert status == 200, body
            np.testing.assert_allclose(body["outputs"][0]["data"], want.ravel(), rtol=0, atol=1e-6)
        server.wait_for_log(rf"modelmesh: unloaded model={model_id}")
        assert not any("drain timeout" in line for line in server.log), "".join(server.log[-5:])
        expect_not_found(server, model_id)

        # runtimeStatus while a load runs: it waits for the load, undoes it,
        # and the load says so.
        held = held_model(tmp_path / "held")
        call = mesh.start_load("held__isvc-0002", held)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            status = pool.submit(mesh.status)
            server.wait_for_log("runtimeStatus: unloading every model")
            release(held)
            assert status.result().status == mesh.pb.RuntimeStatusResponse.READY
        with pytest.raises(grpc.RpcError) as failure:
            call.result()
        assert failure.value.code() == grpc.StatusCode.ABORTED, failure.value
        assert "runtimeStatus" in failure.value.details()
        assert mesh.index() == []
    finally:
        server.stop()


def test_ids_beyond_ascii_and_the_start_up_checks(mmesh, pulled):
    server = Plinth(None, "--model-control-mode", "modelmesh", "--grpc-address", "127.0.0.1")
    try:
        mesh = Mesh(server, mmesh)
        mesh.status()
        # A non-ASCII id travels in ModelMesh's binary header, mm-model-id-bin.
        mesh.load("classifieur-ü", pulled["ocr-cls__isvc-0001"])
        client = grpcclient.InferenceServerClient(url=server.grpc_url)
        inp = grpcclient.InferInput("x", [1, 3, 48, 192], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 3, 48, 192), np.float32))
        result = client.infer("any", [inp], headers={"mm-model-id-bin": "classifieur-ü".encode()})
        assert result.get_response().model_name == "classifieur-ü"
    finally:
        server.stop()
    # ModelMesh would place ONNX models on a runtime that cannot load them.
    env = {k: v for k, v in os.environ.items() if k != "ORT_DYLIB_PATH"}
    started = subprocess.run([ROOT / "target/release/plinth", "serve", "--model-control-mode", "modelmesh",
                              "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"],
                             env=env, capture_output=True, text=True, timeout=60)
    assert started.returncode != 0 and "ORT_DYLIB_PATH" in started.stderr, started.stderr

"""Triton's QA model families, as tests/fixtures/make_triton_models.py
writes them, driven by tritonclient through the real binary over HTTP
(JSON and binary), gRPC and the gRPC stream: the sum and difference models
of every datatype with and without batching, versions, classification,
reshape, the identity backend, and ensembles (one step, identity steps
around a model, labels taken from a step, and only the steps a requested
output needs)."""

import json
import queue
import shutil
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype

from conftest import ROOT, Plinth

sys.path.insert(0, str(ROOT / "tests/fixtures"))
import make_triton_models  # noqa: E402

ADD_SUB = [f"onnx_{'' if batch else 'nobatch_'}{a}_{b}_{c}"
           for a, b, c in make_triton_models.TRIPLES for batch in (True, False)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("triton_models")
    make_triton_models.write(repo)
    # A configuration with fields Plinth does not act on: refused, naming them.
    refused = repo / "refused_fields"
    shutil.copytree(repo / "onnx_float32_float32_float32", refused)
    with open(refused / "config.pbtxt", "a") as config:
        config.write("model_metrics { }\nmodel_transaction_policy { decoupled: true }\n"
                     "instance_group [ { passive: true } ]\n")
    config = (refused / "config.pbtxt").read_text().replace('name: "onnx_float32_float32_float32"', "")
    (refused / "config.pbtxt").write_text(config)
    # Strings through TorchScript: List[str] in and out.
    for name, batch, dims in [("libtorch_nobatch_object_object_object", 0, "[ -1 ]"),
                              ("libtorch_object_object_object", 8, "[ 1 ] reshape: { shape: [ ] }")]:
        (repo / name / "1").mkdir(parents=True)
        shutil.copy(ROOT / "tests/fixtures/string_model.pt", repo / name / "1" / "model.pt")
        io = lambda kind, n: f'{kind} [ {{ name: "{n}" data_type: TYPE_STRING dims: {dims} }} ]\n'
        (repo / name / "config.pbtxt").write_text(
            f'platform: "pytorch_libtorch"\nmax_batch_size: {batch}\n' + io("input", "INPUT__0") + io("input", "INPUT__1")
            + io("output", "OUTPUT__0") + io("output", "OUTPUT__1"))
    plinth = Plinth(repo, "--strict-readiness", "false")
    yield plinth
    plinth.stop()


def types(model):
    """The numpy types of (INPUT, OUTPUT0, OUTPUT1) a model's name gives."""
    names = model.replace("nobatch_", "").split("_")[1:]
    return [make_triton_models.TYPES[n][2] for n in names]


def add_sub_inputs(model, seed, rows=2):
    """INPUT0, INPUT1 for `model`, with small values, so that sums and
    differences fit even int8."""
    t_in = types(model)[0]
    shape = [rows, 16] if "nobatch" not in model else [16]
    rng = np.random.default_rng(seed)
    a, b = (rng.integers(-50, 50, size=shape) for _ in range(2))
    if t_in == np.object_:
        return [np.array([str(v) for v in x.flat], dtype=np.object_).reshape(shape) for x in (a, b)]
    return [a.astype(t_in), b.astype(t_in)]


def expected(model, a, b, swap=False):
    _, t0, t1 = types(model)
    if t0 == np.object_:
        ints = [x.astype(np.int32) for x in (a, b)]
        total, diff = ints[0] + ints[1], ints[0] - ints[1]
        as_bytes = lambda x: np.array([str(v).encode() for v in x.flat], dtype=np.object_).reshape(x.shape)
        total, diff = as_bytes(total), as_bytes(diff)
    else:
        total, diff = (a + b).astype(t0), (a - b).astype(t1)
    return (diff, total) if swap else (total, diff)


def inputs(module, xs, binary=None):
    made = []
    for i, x in enumerate(xs):
        inp = module.InferInput(f"INPUT{i}", list(x.shape), np_to_triton_dtype(x.dtype))
        if binary is None:
            inp.set_data_from_numpy(x)
        else:
            inp.set_data_from_numpy(x, binary_data=binary)
        made.append(inp)
    return made


def answers(result, names=("OUTPUT0", "OUTPUT1")):
    return [result.as_numpy(n) for n in names]


def same(got, want):
    """Equal shape, type and values; BYTES elements compare as text (JSON
    answers hold str, binary ones bytes)."""
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.dtype == np.object_:
        text = np.vectorize(lambda v: v.decode() if isinstance(v, bytes) else v, otypes=[object])
        got, want = text(got), text(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


def stream_infer(server, model, xs, version=""):
    client = grpcclient.InferenceServerClient(url=server.grpc_url)
    results = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer(model, inputs(grpcclient, xs), model_version=version, request_id="s1")
        result, error = results.get(timeout=120)
    finally:
        client.stop_stream()
    assert error is None, error
    assert result.get_response().id == "s1"
    return result


@pytest.mark.parametrize("model", ADD_SUB)
def test_sum_and_difference_over_every_front_end(server, model):
    """Version 1 of each (the float32 and int32 models have later ones)."""
    a, b = add_sub_inputs(model, seed=len(model))
    want = expected(model, a, b)
    http = httpclient.InferenceServerClient(url=server.url)
    fp16 = types(model)[0] == np.float16
    # FP16 has no JSON form: it travels as binary data only.
    for binary in ([True] if fp16 else [True, False]):
        outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
        result = http.infer(model, inputs(httpclient, [a, b], binary), outputs=outputs, model_version="1")
        for got, w in zip(answers(result), want):
            same(got, w)
    grpc = grpcclient.InferenceServerClient(url=server.grpc_url)
    for got, w in zip(answers(grpc.infer(model, inputs(grpcclient, [a, b]), model_version="1")), want):
        same(got, w)
    for got, w in zip(answers(stream_infer(server, model, [a, b], "1")), want):
        same(got, w)


@pytest.mark.parametrize("model", ["onnx_float32_float32_float32", "onnx_nobatch_int32_int32_int32"])
def test_versions_two_and_three_swap_the_outputs(server, model):
    http = httpclient.InferenceServerClient(url=server.url)
    assert http.get_model_metadata(model)["versions"] == ["1", "2", "3"]
    a, b = add_sub_inputs(model, seed=7)
    for version in ("1", "2", "3"):
        want = expected(model, a, b, swap=version != "1")
        result = http.infer(model, inputs(httpclient, [a, b]), model_version=version)
        assert result.get_response()["model_version"] == version
        for got, w in zip(answers(result), want):
            same(got, w)
        for got, w in zip(answers(stream_infer(server, model, [a, b], version)), want):
            same(got, w)
    # The latest version answers when none is named.
    result = http.infer(model, inputs(httpclient, [a, b]))
    assert result.get_response()["model_version"] == "3"


def top_classes(scores, k):
    """`score:index:label` of the k largest scores of each row, as Triton's
    classification extension orders them."""
    rows = []
    for row in scores.reshape(-1, 16):
        order = sorted(range(16), key=lambda i: -row[i])[:k]
        rows.append([(float(row[i]), i, f"label{i}") for i in order])
    return rows


def parsed(classes):
    out = []
    for row in classes.reshape(-1, classes.shape[-1]):
        entries = []
        for c in row:
            value, index, label = c.decode().split(":")
            entries.append((float(value), int(index), label))
        out.append(entries)
    return out


@pytest.mark.parametrize("model", ["onnx_int32_int32_int32", "onnx_float32_float32_float32",
                                   "simple_onnx_float32_float32_float32"])
def test_classification_returns_the_top_classes_with_their_labels(server, model):
    """The ensemble has no label file: its OUTPUT0 takes the labels of the
    step output that writes it, as in Triton."""
    a, b = add_sub_inputs(model.removeprefix("simple_"), seed=3)
    total = (a + b).astype(np.float64)
    http = httpclient.InferenceServerClient(url=server.url)
    result = http.infer(model, inputs(httpclient, [a, b]), model_version="1",
                        outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=3)])
    classes = result.as_numpy("OUTPUT0")
    assert classes.shape == (2, 3)
    # Equal scores may come in either order: compare scores, and labels
    # with the indices they name.
    for got, want in zip(parsed(classes), top_classes(total, 3)):
        assert [g[0] for g in got] == [w[0] for w in want]
        assert all(label == f"label{index}" for _, index, label in got), got
    grpc = grpcclient.InferenceServerClient(url=server.grpc_url)
    result = grpc.infer(model, inputs(grpcclient, [a, b]), model_version="1",
                        outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=3)])
    assert parsed(result.as_numpy("OUTPUT0")) == parsed(classes)


def test_reshape_serves_the_configuration_s_dims(server):
    """onnx_zero_2_float32: INPUTi dims [4, 4] reach the model as [16];
    its [16] outputs come back as OUTPUTi dims [2, 8], values unchanged."""
    model = "onnx_zero_2_float32"
    http = httpclient.InferenceServerClient(url=server.url)
    metadata = http.get_model_metadata(model)
    assert [i["shape"] for i in metadata["inputs"]] == [[-1, 4, 4], [-1, 4, 4]]
    assert [o["shape"] for o in metadata["outputs"]] == [[-1, 2, 8], [-1, 2, 8]]
    xs = [np.arange(48, dtype=np.float32).reshape(3, 4, 4) + 100 * i for i in range(2)]
    result = http.infer(model, inputs(httpclient, xs))
    for i, x in enumerate(xs):
        same(result.as_numpy(f"OUTPUT{i}"), x.reshape(3, 2, 8))
    result = grpcclient.InferenceServerClient(url=server.grpc_url).infer(model, inputs(grpcclient, xs))
    same(result.as_numpy("OUTPUT1"), xs[1].reshape(3, 2, 8))


def test_a_raw_binary_body_is_the_only_input_and_is_answered_in_binary(server):
    """Triton's raw request: Inference-Header-Content-Length: 0, the body is
    onnx_zero_1_float32's INPUT0 ([4, 4] per row: two rows here)."""
    x = np.arange(32, dtype=np.float32)
    request = urllib.request.Request(f"http://{server.url}/v2/models/onnx_zero_1_float32/infer", data=x.tobytes(),
                                     headers={"Inference-Header-Content-Length": "0"})
    with urllib.request.urlopen(request) as response:
        header_length = int(response.headers["Inference-Header-Content-Length"])
        body = response.read()
    header = httpclient.InferenceServerClient.parse_response_body(body, header_length=header_length)
    same(header.as_numpy("OUTPUT0"), x.reshape(2, 2, 8))


def test_the_identity_backend_answers_its_inputs(server):
    model = "nop_float32"
    xs = [np.random.default_rng(i).normal(size=(2, 5)).astype(np.float32) for i in range(2)]
    result = httpclient.InferenceServerClient(url=server.url).infer(model, inputs(httpclient, xs))
    for i, x in enumerate(xs):
        same(result.as_numpy(f"OUTPUT{i}"), x)
    metadata = httpclient.InferenceServerClient(url=server.url).get_model_metadata(model)
    assert metadata["platform"] == "identity"


@pytest.mark.parametrize("model", ["simple_onnx_float32_float32_float32", "fan_onnx_float32_float32_float32"])
def test_ensembles_answer_as_their_model(server, model):
    a, b = add_sub_inputs("onnx_float32_float32_float32", seed=11)
    want = expected("onnx_float32_float32_float32", a, b)
    http = httpclient.InferenceServerClient(url=server.url)
    for got, w in zip(answers(http.infer(model, inputs(httpclient, [a, b]))), want):
        same(got, w)
    for got, w in zip(answers(stream_infer(server, model, [a, b])), want):
        same(got, w)


def success_count(client, model):
    stats = client.get_inference_statistics(model)["model_stats"]
    return sum(s["inference_stats"]["success"]["count"] for s in stats)


def test_an_ensemble_runs_only_the_steps_the_requested_outputs_need(server):
    """add_sub_one_output: OUTPUT0 comes from `simple`, OUTPUT1 from
    `simple_copy`; asking for OUTPUT0 alone runs `simple` only."""
    http = httpclient.InferenceServerClient(url=server.url)
    a, b = add_sub_inputs("onnx_int32_int32_int32", seed=5)
    before = {m: success_count(http, m) for m in ("simple", "simple_copy")}
    result = http.infer("add_sub_one_output", inputs(httpclient, [a, b]),
                        outputs=[httpclient.InferRequestedOutput("OUTPUT0")])
    same(result.as_numpy("OUTPUT0"), a + b)
    assert result.as_numpy("OUTPUT1") is None
    after = {m: success_count(http, m) for m in ("simple", "simple_copy")}
    assert after == {"simple": before["simple"] + 1, "simple_copy": before["simple_copy"]}
    result = http.infer("add_sub_one_output", inputs(httpclient, [a, b]))
    same(result.as_numpy("OUTPUT1"), a - b)
    assert success_count(http, "simple_copy") == before["simple_copy"] + 1


def test_configuration_fields_plinth_does_not_act_on_are_refused_by_name(server):
    """The model stays UNAVAILABLE with every refused field in its reason;
    the others serve."""
    http = httpclient.InferenceServerClient(url=server.url)
    rows = [r for r in http.get_model_repository_index() if r["name"] == "refused_fields"]
    assert rows and rows[0]["state"] == "UNAVAILABLE", rows
    for field in ("'model_metrics'", "'model_transaction_policy.decoupled'", "'passive'"):
        assert field in rows[0]["reason"], rows[0]["reason"]
    assert http.is_model_ready("simple")


def post_infer(server, model, body):
    request = urllib.request.Request(f"http://{server.url}/v2/models/{model}/infer", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


@pytest.mark.parametrize("where, parameters, named", [
    ("request", {"sequence_id": 7}, "model 'simple' has no sequence_batching: the request parameters 'sequence_id'"),
    ("request", {"my_flag": True}, "unknown request parameter 'my_flag'"),
    ("request", {"shared_memory_region": "r"}, "unknown request parameter 'shared_memory_region'"),
    ("input", {"binary_data": True}, "unknown input 'INPUT0' parameter 'binary_data'"),
    ("output", {"binary": True}, "unknown output 'OUTPUT0' parameter 'binary'"),
])
def test_request_parameters_plinth_does_not_act_on_are_refused_by_name(server, where, parameters, named):
    x = list(range(16))
    body = {"inputs": [{"name": f"INPUT{i}", "shape": [1, 16], "datatype": "INT32", "data": x} for i in (0, 1)],
            "outputs": [{"name": "OUTPUT0"}]}
    target = {"request": body, "input": body["inputs"][0], "output": body["outputs"][0]}[where]
    target["parameters"] = parameters
    status, answer = post_infer(server, "simple", body)
    assert (status, answer["error"][:len(named)]) == (400, named), answer


def test_grpc_refuses_the_sequence_parameters_for_a_model_without_sequence_batching(server):
    a, b = add_sub_inputs("onnx_int32_int32_int32", seed=1)
    grpc = grpcclient.InferenceServerClient(url=server.grpc_url)
    with pytest.raises(Exception) as e:
        grpc.infer("simple", inputs(grpcclient, [a, b]), sequence_id=9, sequence_start=True)
    assert "has no sequence_batching" in str(e.value) and "'sequence_id'" in str(e.value), e.value


@pytest.mark.parametrize("model, shape", [("libtorch_nobatch_object_object_object", [5]),
                                          ("libtorch_object_object_object", [3, 1])])
def test_strings_through_torchscript(server, model, shape):
    """BYTES tensors reach a TorchScript model as List[str] and come back
    from it the same way, as in Triton's PyTorch backend."""
    rng = np.random.default_rng(2)
    a, b = (rng.integers(-99, 99, size=shape) for _ in range(2))
    xs = [np.array([str(v) for v in x.flat], dtype=np.object_).reshape(shape) for x in (a, b)]
    names = [("INPUT__0", "OUTPUT__0"), ("INPUT__1", "OUTPUT__1")]
    as_text = lambda x: np.array([str(v) for v in x.flat], dtype=np.object_).reshape(shape)
    for module, url in [(httpclient, server.url), (grpcclient, server.grpc_url)]:
        client = module.InferenceServerClient(url=url)
        made = []
        for (name, _), x in zip(names, xs):
            inp = module.InferInput(name, shape, "BYTES")
            inp.set_data_from_numpy(x)
            made.append(inp)
        result = client.infer(model, made)
        same(result.as_numpy("OUTPUT__0"), as_text(a + b))
        same(result.as_numpy("OUTPUT__1"), as_text(a - b))

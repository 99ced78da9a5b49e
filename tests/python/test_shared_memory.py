"""Triton's system shared memory extension through the real binary, driven
by tritonclient's own shared memory module (POSIX objects in /dev/shm):
inputs read from and outputs written to registered regions over HTTP, gRPC
and the gRPC stream, for numbers, strings and FP16; registration, status
and unregistration with Triton's texts and statuses; every bad place a
request can name; and the flag that allows it all."""

import json
import os
import queue
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from conftest import ROOT, Plinth, metric, wait_until

sys.path.insert(0, str(ROOT / "tests/fixtures"))
import make_triton_models  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")
# The rows the `held` model waits for before it runs its batch.
HELD_BATCH = 51


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("shm_models")
    make_triton_models.simple(repo, "simple")
    for t in ("object", "float16"):
        make_triton_models.add_sub_model(repo, f"onnx_{t}_{t}_{t}", True, t, t, t, [1])
    # Requests wait in its queue until HELD_BATCH rows are there, then run
    # as one execution (the queue delay is only a hang guard).
    (repo / "held" / "1").mkdir(parents=True)
    (repo / "held" / "config.pbtxt").write_text(
        f'backend: "identity"\nmax_batch_size: {HELD_BATCH}\ninstance_group [ {{ count: 1 kind: KIND_CPU }} ]\n'
        'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'
        f'dynamic_batching {{ preferred_batch_size: [ {HELD_BATCH} ] max_queue_delay_microseconds: 600000000 }}\n')
    plinth = Plinth(repo, "--allow-client-shm=true")
    yield plinth
    plinth.stop()


class Regions:
    """Shared memory objects of this test, registered with the server under
    their names, all destroyed and unregistered at the end."""

    def __init__(self, client):
        self.client, self.handles = client, {}

    def create(self, name, byte_size, offset=0, register=True):
        key = f"/plinth_test_{os.getpid()}_{name}"
        self.handles[name] = shm.create_shared_memory_region(name, key, offset + byte_size)
        if register:
            self.client.register_system_shared_memory(name, key, byte_size, offset=offset)
        return self.handles[name]

    def close(self):
        self.client.unregister_system_shared_memory()
        for handle in self.handles.values():
            shm.destroy_shared_memory_region(handle)


@pytest.fixture
def regions(server):
    r = Regions(httpclient.InferenceServerClient(server.url))
    yield r
    r.close()


def client_of(server, front):
    return httpclient.InferenceServerClient(server.url) if front == "http" else grpcclient.InferenceServerClient(
        server.grpc_url)


def infer(server, front, model, inputs, outputs):
    """One inference over `front` (http, grpc or stream)."""
    if front != "stream":
        return client_of(server, front).infer(model, inputs, outputs=outputs)
    client, answers = grpcclient.InferenceServerClient(server.grpc_url), queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, outputs=outputs)
        result, error = answers.get(timeout=120)
    finally:
        client.stop_stream()
    if error:
        raise error
    return result


def module(front):
    return httpclient if front == "http" else grpcclient


def shm_input(front, name, datatype, shape, region, byte_size, offset=0):
    i = module(front).InferInput(name, shape, datatype)
    i.set_shared_memory(region, byte_size, offset=offset)
    return i


def shm_output(front, name, region, byte_size, offset=0):
    o = module(front).InferRequestedOutput(name)
    o.set_shared_memory(region, byte_size, offset=offset)
    return o


@pytest.mark.parametrize("front", ["http", "grpc", "stream"])
def test_inputs_and_outputs_go_through_regions(server, regions, front):
    a, b = np.arange(16, dtype=np.int32).reshape(1, 16), np.full((1, 16), 3, dtype=np.int32)
    # A region that starts a page into its object, as Triton's large-offset test registers it.
    shm.set_shared_memory_region(regions.create("in0", 64, offset=PAGE), [a], offset=PAGE)
    shm.set_shared_memory_region(regions.create("in1", 64), [b])
    out = regions.create("out", 128)
    inputs = [shm_input(front, "INPUT0", "INT32", [1, 16], "in0", 64),
              shm_input(front, "INPUT1", "INT32", [1, 16], "in1", 64)]
    outputs = [shm_output(front, "OUTPUT0", "out", 64), shm_output(front, "OUTPUT1", "out", 64, offset=64)]
    result = infer(server, front, "simple", inputs, outputs)
    assert np.array_equal(shm.get_contents_as_numpy(out, np.int32, [1, 16]), a + b)
    assert np.array_equal(shm.get_contents_as_numpy(out, np.int32, [1, 16], offset=64), a - b)
    described = result.get_output("OUTPUT0")
    if front == "http":
        assert described == {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]}, "no data in the response"
    else:
        assert (described.datatype, list(described.shape)) == ("INT32", [1, 16])
        assert result.get_response().raw_output_contents == [b"", b""], "an empty entry for each output"


def test_an_http_answer_for_shared_memory_describes_the_outputs(server, regions):
    """Each output in shared memory comes back as name, datatype and shape:
    no data, no binary part; the other outputs as usual."""
    a = np.ones((1, 16), dtype=np.int32)
    shm.set_shared_memory_region(regions.create("in0", 64), [a])
    regions.create("out", 64)
    body = {"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32",
         "parameters": {"shared_memory_region": "in0", "shared_memory_byte_size": 64}},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": 64}},
                    {"name": "OUTPUT1"}]}
    status, answer = post(server, "/v2/models/simple/infer", body)
    assert status == 200, answer
    assert answer["outputs"][0] == {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]}
    assert answer["outputs"][1]["data"] == [1 - i for i in range(16)]
    assert np.array_equal(shm.get_contents_as_numpy(regions.handles["out"], np.int32, [16]), 1 + np.arange(16))


@pytest.mark.parametrize("front", ["http", "grpc"])
def test_strings_and_fp16_go_through_regions_serialised_as_binary_data(server, regions, front):
    words = np.array([[str(i) for i in range(16)]], dtype=np.object_)
    serialized = serialize_byte_tensor(words)  # one object: each element's 4-byte length and bytes
    size = len(serialized.item())
    shm.set_shared_memory_region(regions.create("s0", size), [serialized])
    shm.set_shared_memory_region(regions.create("s1", size), [serialized])
    out = regions.create("sout", 256)
    infer(server, front, "onnx_object_object_object",
          [shm_input(front, "INPUT0", "BYTES", [1, 16], "s0", size),
           shm_input(front, "INPUT1", "BYTES", [1, 16], "s1", size)],
          [shm_output(front, "OUTPUT0", "sout", 256)])
    sums = shm.get_contents_as_numpy(out, np.object_, [1, 16])
    assert [int(s) for s in sums.flat] == [2 * i for i in range(16)]

    halves = np.linspace(0, 1, 16, dtype=np.float16).reshape(1, 16)
    shm.set_shared_memory_region(regions.create("h", 32), [halves])
    hout = regions.create("hout", 32)
    # FP16 has no JSON form, but in shared memory it needs none.
    infer(server, front, "onnx_float16_float16_float16",
          [shm_input(front, "INPUT0", "FP16", [1, 16], "h", 32), shm_input(front, "INPUT1", "FP16", [1, 16], "h", 32)],
          [shm_output(front, "OUTPUT0", "hout", 32)])
    assert np.array_equal(shm.get_contents_as_numpy(hout, np.float16, [1, 16]), halves + halves)


def post(server, path, body):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{server.url}{path}", data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    return answer_of(request)


def get(server, path, headers=None):
    return answer_of(urllib.request.Request(f"http://{server.url}{path}", headers=headers or {}))


def answer_of(request):
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            body = r.read()
            return r.status, json.loads(body) if body else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_registration_status_and_unregistration_over_http(server, regions):
    handle = regions.create("reg", 64, register=False)
    key = f"/plinth_test_{os.getpid()}_reg"
    register = lambda name, body: post(server, f"/v2/systemsharedmemory/region/{name}/register", body)
    assert register("reg", {"key": key, "offset": 0, "byte_size": 64}) == (200, None)
    status, listed = get(server, "/v2/systemsharedmemory/status")
    assert (status, listed) == (200, [{"name": "reg", "key": key, "offset": 0, "byte_size": 64}])
    assert get(server, "/v2/systemsharedmemory/region/reg/status")[1] == listed
    cases = [
        (register("reg", {"key": key, "byte_size": 64}), 400, "shared memory region 'reg' already in manager"),
        (register("big", {"key": key, "offset": 1, "byte_size": 64}), 400,
         "failed to register shared memory region 'big': invalid args"),
        (register("k", {"key": "/", "byte_size": 1}), 400, "cannot register shared memory region 'k' - invalid shm key '/'"),
        (register("k", {"key": "/plinth_no_such_object", "byte_size": 1}), 500,
         "Unable to open shared memory region: '/plinth_no_such_object'"),
        (register("k", {"byte_size": 1}), 400, "Shared memory register request has no 'key' field"),
        (post(server, "/v2/systemsharedmemory/register", {"key": key, "byte_size": 1}), 400,
         "'region name' is necessary to register system shared memory region"),
        (get(server, "/v2/systemsharedmemory/region/nope/status"), 404,
         "Unable to find system shared memory region: 'nope'"),
        (get(server, "/v2/cudasharedmemory/status"), 501, "CUDA shared memory is not supported"),
    ]
    for (status, body), expected_status, message in cases:
        assert status == expected_status and body["error"].startswith(message), (body, message)
    assert post(server, "/v2/systemsharedmemory/region/never/unregister", b"") == (200, None)
    # There are never CUDA regions: unregistering them has nothing to do.
    assert post(server, "/v2/cudasharedmemory/unregister", b"") == (200, None)
    assert post(server, "/v2/cudasharedmemory/region/never/unregister", b"") == (200, None)
    assert post(server, "/v2/cudasharedmemory/region/c/register", {"raw_handle": {"b64": ""}, "device_id": 0,
                                                                 "byte_size": 1})[0] == 501
    assert post(server, "/v2/systemsharedmemory/region/reg/unregister", b"") == (200, None)
    assert get(server, "/v2/systemsharedmemory/status") == (200, [])
    shm.destroy_shared_memory_region(handle)
    del regions.handles["reg"]


def test_registration_status_and_unregistration_over_grpc(server, regions):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    regions.create("g1", 64, register=False)
    regions.create("g2", 32, register=False)
    key = lambda name: f"/plinth_test_{os.getpid()}_{name}"
    client.register_system_shared_memory("g1", key("g1"), 64)
    client.register_system_shared_memory("g2", key("g2"), 16, offset=16)
    status = client.get_system_shared_memory_status(as_json=True)["regions"]
    assert status["g2"] == {"name": "g2", "key": key("g2"), "offset": "16", "byte_size": "16"}
    assert sorted(status) == ["g1", "g2"]
    with pytest.raises(InferenceServerException, match="already in manager") as e:
        client.register_system_shared_memory("g1", key("g1"), 64)
    assert e.value.status() == "StatusCode.ALREADY_EXISTS"
    with pytest.raises(InferenceServerException, match="Unable to find system shared memory region: 'x'") as e:
        client.get_system_shared_memory_status("x")
    assert e.value.status() == "StatusCode.NOT_FOUND"
    client.unregister_system_shared_memory("g1")
    assert list(client.get_system_shared_memory_status(as_json=True)["regions"]) == ["g2"]
    client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}


def test_bad_places_are_refused_before_the_model_runs(server, regions):
    a = np.ones((1, 16), dtype=np.int32)
    shm.set_shared_memory_region(regions.create("in", 64), [a])
    regions.create("small", 64)
    at = lambda region, size, offset=0: {"shared_memory_region": region, "shared_memory_byte_size": size,
                                         **({"shared_memory_offset": offset} if offset else {})}
    json_input = {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [0] * 16}

    def request(input0, outputs=None):
        return post(server, "/v2/models/simple/infer", {"inputs": [input0, json_input], "outputs": outputs or []})

    shm_in = lambda params, **extra: {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "parameters": params,
                                      **extra}
    cases = [
        (request(shm_in(at("nope", 64))), 404, "Unable to find shared memory region: 'nope'"),
        (request(shm_in(at("in", 64, 64))), 400, "Invalid offset for shared memory region: 'in'"),
        (request(shm_in(at("in", 64, 2**64 - 32))), 400, "Invalid offset for shared memory region: 'in'"),
        (request(shm_in(at("in", 64, 1))), 400, "Invalid offset + byte size for shared memory region: 'in'"),
        (request(shm_in(at("in", 2**64 - 32, 32))), 400, "Integer overflow detected: byte_size (18446744073709551584)"),
        (request(shm_in(at("in", 32))), 400, "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 32"),
        (request(shm_in(at("in", 64), data=[1] * 16)), 400,
         "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
         "'shared_memory_region' in 'parameters'. But set 'data' 'shared_memory_region'"),
        (request(shm_in({"shared_memory_byte_size": 64}, data=[1] * 16)), 400,
         "'shared_memory_byte_size' can not be specified without 'shared_memory_region' parameter for tensor 'INPUT0'"),
        (request(shm_in({"shared_memory_region": "in"})), 400,
         "'shared_memory_byte_size' must be specified along with 'shared_memory_region'"),
        (request(shm_in(at("in", 64)), [{"name": "OUTPUT0", "parameters": {**at("small", 64), "classification": 2}}]),
         400, "Output can't set both 'shared_memory_region' and 'classification'"),
        (request(shm_in(at("in", 64)), [{"name": "OUTPUT0", "parameters": {**at("small", 64), "binary_data": True}}]),
         400, "Output can't set both 'shared_memory_region' and 'binary_data'"),
        (request(shm_in(at("in", 64)), [{"name": "OUTPUT0", "parameters": at("small", 32)}]), 500,
         "shared memory size specified with the request for output 'OUTPUT0' (32 bytes) should be at least 64 bytes"),
    ]
    for (status, body), expected_status, message in cases:
        assert status == expected_status and body["error"].startswith(message), (body, message)

    # Over gRPC, typed contents beside a region, and a value of the wrong kind.
    client = grpcclient.InferenceServerClient(server.grpc_url)
    both = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
    both.set_shared_memory("in", 64)
    both._input.contents.int_contents.extend([1] * 16)
    other = grpcclient.InferInput("INPUT1", [1, 16], "INT32").set_data_from_numpy(a)
    with pytest.raises(InferenceServerException,
                       match="unexpected 'content' provided when using shared memory for input tensor 'INPUT0'"):
        client.infer("simple", [both, other])
    wrong = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
    wrong.set_shared_memory("in", 64)
    wrong._input.parameters["shared_memory_region"].int64_param = 3
    with pytest.raises(InferenceServerException, match="invalid value type for 'shared_memory_region' parameter "
                                                       "for tensor 'INPUT0', expected a string, got 3"):
        client.infer("simple", [wrong, other])


def test_registration_needs_the_flag_and_the_restricted_header(tmp_path):
    make_triton_models.simple(tmp_path, "simple")
    plinth = Plinth(tmp_path, "--http-restricted-api", "shared-memory:shm-key=secret")
    try:
        status, body = get(plinth, "/v2/systemsharedmemory/status")
        assert (status, body) == (403, {"error": "This API is restricted, expecting header 'shm-key'"})
        assert get(plinth, "/v2/systemsharedmemory/status", {"shm-key": "secret"}) == (200, [])
        disabled = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
        request = urllib.request.Request(f"http://{plinth.url}/v2/systemsharedmemory/region/r/register",
                                         data=b'{"key": "/k", "byte_size": 1}', method="POST",
                                         headers={"shm-key": "secret"})
        assert answer_of(request) == (501, {"error": disabled})
        client = grpcclient.InferenceServerClient(plinth.grpc_url)
        with pytest.raises(InferenceServerException, match=r"Client shared memory is disabled\.") as e:
            client.unregister_system_shared_memory()
        assert e.value.status() == "StatusCode.UNIMPLEMENTED"
        assert "system_shared_memory" in client.get_server_metadata(as_json=True)["extensions"]
        with pytest.raises(InferenceServerException, match="CUDA shared memory is not supported") as e:
            client.get_cuda_shared_memory_status()
        assert e.value.status() == "StatusCode.UNIMPLEMENTED"
    finally:
        plinth.stop()


def test_unregistering_during_50_requests_waits_for_them(server, regions):
    """Unregistering regions that 50 queued requests read and write
    succeeds at once; the output region stays listed and working until the
    last request is done, and is then freed; every answer is right. The 50
    wait in the queue of `held` until a 51st request completes its batch."""
    n = HELD_BATCH - 1
    rows = np.arange(n * 16, dtype=np.int32).reshape(n, 16)
    shm.set_shared_memory_region(regions.create("many_in", n * 64), [rows])
    out = regions.create("many_out", n * 64)
    client = httpclient.InferenceServerClient(server.url, concurrency=n)
    executions = metric(server, "nv_inference_exec_count", "held")
    done = metric(server, "nv_inference_count", "held")
    pending = []
    for i in range(n):
        inputs = [shm_input("http", "INPUT0", "INT32", [1, 16], "many_in", 64, offset=i * 64)]
        outputs = [shm_output("http", "OUTPUT0", "many_out", 64, offset=i * 64)]
        pending.append(client.async_infer("held", inputs, outputs=outputs))
    # Each request is decoded (its regions resolved and held) before it queues.
    wait_until("the 50 requests are queued", lambda: metric(server, "nv_inference_pending_request_count", "held") == n)
    # The other calls go through a client of their own: the 50 connections
    # of `client` are all taken, and one of them taken again would close the
    # request it carries (which the server then cancels).
    control = httpclient.InferenceServerClient(server.url)
    control.unregister_system_shared_memory()
    # Inputs are read when a request is decoded, so their region is free at
    # once; the 50 queued requests hold the output region.
    assert [r["name"] for r in control.get_system_shared_memory_status()] == ["many_out"]
    assert metric(server, "nv_inference_exec_count", "held") == executions, "a held request ran"
    # The 51st row completes the batch.
    last = httpclient.InferInput("INPUT0", [1, 16], "INT32")
    last.set_data_from_numpy(np.full((1, 16), -1, np.int32))
    assert control.infer("held", [last]).as_numpy("OUTPUT0").tolist() == [[-1] * 16]
    for request in pending:
        request.get_result()
    assert np.array_equal(shm.get_contents_as_numpy(out, np.int32, [n, 16]), rows)
    assert metric(server, "nv_inference_exec_count", "held") == executions + 1, "all 51 ran as one execution"
    assert metric(server, "nv_inference_count", "held") == done + HELD_BATCH
    wait_until("the regions are freed", lambda: control.get_system_shared_memory_status() == [])

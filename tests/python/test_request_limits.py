"""The limits that bound what one request can make the server allocate,
against the real binary: a client that registers a 4 GiB system shared
memory region and sends a request naming all of it gets a 400 naming
--shm-max-input-bytes, over HTTP and gRPC, and the server's resident
memory does not grow by the region's size (read from /proc before and
after); a place larger than its input's shape is refused before a byte is
copied; the bytes a request holds are counted per region and let go.
A binary request of 16 M empty strings peaks within twice its body,
requests at once are bounded by --http-max-inflight-body-bytes (each peak
read from VmHWM), and a large request's memory is given back."""

import json
import os
import pathlib
import threading
import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from conftest import HANG_GUARD_S, Plinth, identity_repository, rss, wait_until

GIB = 1 << 30
REGION = 4 * GIB


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = identity_repository(tmp_path_factory.mktemp("limits"))
    plinth = Plinth(repo, "--allow-client-shm=true", "--shm-max-input-bytes", "64MiB")
    yield plinth
    plinth.stop()


@pytest.fixture(scope="module")
def big_region(server):
    """A 4 GiB shared memory object (sparse: nothing is written to it),
    registered whole as region `big`."""
    key = f"/plinth_test_{os.getpid()}_big"
    handle = shm.create_shared_memory_region("big", key, REGION)
    client = httpclient.InferenceServerClient(server.url)
    client.register_system_shared_memory("big", key, REGION)
    yield
    client.unregister_system_shared_memory("big")
    shm.destroy_shared_memory_region(handle)


def held_bytes(server, region):
    text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=HANG_GUARD_S).read().decode()
    prefix = f'plinth_shared_memory_held_bytes{{region="{region}"}} '
    return next(float(l[len(prefix):]) for l in text.splitlines() if l.startswith(prefix))


def infer_from_region(server, front, elements, byte_size):
    """An inference whose INT32 input of `elements` elements names
    `byte_size` bytes of region `big`; the error it gets."""
    module = httpclient if front == "http" else grpcclient
    client = module.InferenceServerClient(server.url if front == "http" else server.grpc_url)
    tensor = module.InferInput("INPUT0", [elements], "INT32")
    tensor.set_shared_memory("big", byte_size)
    with pytest.raises(InferenceServerException) as refused:
        client.infer("m", [tensor])
    return refused.value


@pytest.mark.parametrize("front", ["http", "grpc"])
def test_a_request_naming_a_whole_4_gib_region_is_refused_naming_the_limit(server, big_region, front):
    before = rss(server)
    error = infer_from_region(server, front, REGION // 4, REGION)
    assert error.status() in ("400", "StatusCode.INVALID_ARGUMENT"), error
    assert error.message() == (
        f"reading {REGION} bytes from shared memory region 'big' would bring this request's inputs from shared "
        f"memory to {REGION} bytes, more than the {64 << 20} bytes one request may read (--shm-max-input-bytes)"
    ), error.message()
    grown = rss(server) - before
    assert grown < 256 << 20, f"RSS grew by {grown} bytes for a refused 4 GiB read"
    assert held_bytes(server, "big") == 0


def test_a_place_larger_than_its_shape_is_refused_before_it_is_copied(server, big_region):
    before = rss(server)
    error = infer_from_region(server, "http", 16, REGION)
    assert error.message().startswith(
        f"input byte size mismatch for input 'INPUT0' for model 'm'. Expected 64, got {REGION}"), error.message()
    assert rss(server) - before < 256 << 20


def test_reads_within_the_limit_are_served_and_let_go(server, big_region):
    client = httpclient.InferenceServerClient(server.url)
    tensor = httpclient.InferInput("INPUT0", [1024], "INT32")
    tensor.set_shared_memory("big", 4096, offset=GIB)
    answer = client.infer("m", [tensor])
    assert answer.as_numpy("OUTPUT0").tolist() == [0] * 1024, "the sparse object reads as zeros"
    assert held_bytes(server, "big") == 0


def peak_since_reset(server, action):
    """Runs `action` and returns how far the server's peak resident memory
    (VmHWM, its high-water mark reset just before) rose above its resident
    memory before, in bytes."""
    pathlib.Path(f"/proc/{server.proc.pid}/clear_refs").write_text("5")
    before = rss(server)
    action()
    status = pathlib.Path(f"/proc/{server.proc.pid}/status").read_text()
    peak = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) * 1024
    return peak - before


def empty_strings(count, shape):
    """A binary-data request of `count` empty BYTES elements (4 bytes
    each) declared with `shape`, for model `s`: (headers, body)."""
    data = b"\0" * (4 * count)
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "BYTES",
                                     "parameters": {"binary_data_size": len(data)}}],
                         "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    headers = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}
    return headers, header + data


@pytest.fixture(scope="module")
def strings_server(tmp_path_factory):
    """An identity model `s` of BYTES, and at most 128 MiB of request bodies
    read and decoded at once."""
    repo = tmp_path_factory.mktemp("strings")
    (repo / "s" / "1").mkdir(parents=True)
    (repo / "s" / "config.pbtxt").write_text(
        'backend: "identity"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]\n')
    plinth = Plinth(repo, "--http-max-inflight-body-bytes", "128MiB")
    yield plinth
    plinth.stop()


def post_strings(server, count, shape):
    headers, body = empty_strings(count, shape)
    request = urllib.request.Request(f"http://{server.url}/v2/models/s/infer", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=HANG_GUARD_S) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


COUNT = 16_000_000  # 61 MiB of empty elements


def test_empty_strings_for_a_shape_they_do_not_fill_cost_twice_their_body_at_most(strings_server):
    """16 M empty BYTES elements (61 MiB) declared as [1000000000]: 400,
    and the peak stays within twice the body (it was six times: a slice
    per element to count them)."""
    answers = []
    grown = peak_since_reset(strings_server, lambda: answers.append(post_strings(strings_server, COUNT, [10**9])))
    status, body = answers[0]
    assert status == 400, body[:200]
    assert json.loads(body)["error"] == (
        "binary data of tensor 'INPUT0' of shape [1000000000] needs 1000000000 BYTES elements, got 16000000")
    assert grown < 2.5 * 4 * COUNT, f"the peak rose {grown >> 20} MiB for a {4 * COUNT >> 20} MiB body"


def test_requests_at_once_are_bounded_by_the_bodies_in_flight(strings_server):
    """Four such requests at once: at most 128 MiB of bodies are read and
    decoded together (two of these), each costing up to about three times
    its body while decoded (the body as it arrived, gathered into one
    buffer, its tensor), so the peak stays within 3.5 times the pool (it
    was 736 MiB for four, unbounded in their number)."""
    answers = []

    def four():
        threads = [threading.Thread(target=lambda: answers.append(post_strings(strings_server, COUNT, [10**9])))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=HANG_GUARD_S)

    grown = peak_since_reset(strings_server, four)
    assert sorted(status for status, _ in answers) == [400] * 4, [b[:200] for _, b in answers]
    assert grown < 3.5 * (128 << 20), f"the peak rose {grown >> 20} MiB for four {4 * COUNT >> 20} MiB bodies"


def test_a_large_valid_request_gives_its_memory_back(strings_server):
    before = rss(strings_server)
    status, body = post_strings(strings_server, COUNT, [COUNT])
    assert status == 200 and len(body) > 4 * COUNT, body[:200]
    wait_until("the memory is given back", lambda: rss(strings_server) < before + (64 << 20))

"""The limits that bound what one request can make the server allocate,
against the real binary: a client that registers a 4 GiB system shared
memory region and sends a request naming all of it gets a 400 naming
--shm-max-input-bytes, over HTTP and gRPC, and the server's resident
memory does not grow by the region's size (read from /proc before and
after); a place larger than its input's shape is refused before a byte is
copied; the bytes a request holds are counted per region and let go."""

import os
import urllib.request

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from conftest import HANG_GUARD_S, Plinth, identity_repository, rss

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

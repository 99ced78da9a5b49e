"""The edges of the HTTP and gRPC front ends (issue 18, part 5), over raw
sockets against the real binary: the answers hyper gives a request it
cannot parse (400, 414, 431) carry a JSON error saying what was wrong, as
every failure does; a Content-Length over --http-max-body-bytes is refused
with 413 as soon as the headers arrive (and no 100 Continue); a gRPC
message over the limit is RESOURCE_EXHAUSTED, as in gRPC's other
implementations."""

import json
import socket

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.service_pb2 as pb
import tritonclient.grpc.service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from conftest import HANG_GUARD_S, Plinth, identity_repository

MAX_BODY = 4096
# More elements than fit in MAX_BODY bytes however they are encoded.
TOO_MANY = MAX_BODY


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = identity_repository(tmp_path_factory.mktemp("repo"))
    plinth = Plinth(repo, "--http-max-body-bytes", str(MAX_BODY))
    yield plinth
    plinth.stop()


def exchange(server, data):
    """Sends `data` on a new connection and reads until the server closes
    it; the bytes read."""
    host, port = server.url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=HANG_GUARD_S) as conn:
        conn.sendall(data)
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
    return received


def answers(received):
    """The (status, headers, body) of each answer in `received`."""
    found = []
    while received:
        head, _, rest = received.partition(b"\r\n\r\n")
        status_line, *lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
        length = int(headers["content-length"])
        found.append((int(status_line.split()[1]), headers, rest[:length]))
        received = rest[length:]
    return found


def only_answer(server, data):
    (answer,) = answers(exchange(server, data))
    return answer


def error_of(status, headers, body):
    assert headers["content-type"] == "application/json", (status, headers, body)
    return status, json.loads(body)["error"]


def test_a_malformed_request_line_is_a_400_saying_why(server):
    for request in (b"GARBAGE\r\n\r\n", b"GET /v2 HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
                    b"GET /v2 HTTP/1.1\r\nHost: x\r\nContent-Length: many\r\n\r\n"):
        status, message = error_of(*only_answer(server, request))
        assert status == 400, request
        assert message.startswith("malformed HTTP/1.1 request: its request line or a header"), message


def test_a_malformed_request_after_a_good_one_on_the_same_connection_is_explained_too(server):
    (ok, _, metadata), (status, headers, body) = answers(
        exchange(server, b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\nGARBAGE\r\n\r\n"))
    assert ok == 200 and json.loads(metadata)["name"] == "plinth"
    assert error_of(status, headers, body)[0] == 400


def test_a_uri_too_long_is_a_414_saying_why(server):
    # Past hyper's URI limit, and past its buffer (a request line cut
    # before its end is a URI too long too, not too many headers).
    for length in (70_000, 10 << 20):
        request = b"GET /v2/" + b"a" * length + b" HTTP/1.1\r\nHost: x\r\n\r\n"
        assert error_of(*only_answer(server, request)) == (414, "the request URI is longer than 65534 bytes")


def test_too_many_or_too_large_headers_are_a_431_saying_why(server):
    many = b"".join(b"X-%d: y\r\n" % i for i in range(101))
    large = b"X-Large: " + b"y" * 500_000 + b"\r\n"
    # Just over hyper's 417792 bytes: hyper alone would sometimes serve it
    # (hyperium/hyper#4081); the listener keeps the limit exact.
    just_over = b"X-Large: " + b"y" * 417_800 + b"\r\n"
    for headers in (many, large, just_over):
        status, message = error_of(*only_answer(server, b"GET /v2 HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n"))
        assert (status, message) == (
            431, "the request has more than 100 headers, or more than 417792 bytes of request line and headers")


def too_large(length):
    return (f"request JSON size of {length} bytes (Content-Length) exceeds the maximum allowed input size "
            f"of {MAX_BODY} bytes (--http-max-body-bytes)")


def test_a_content_length_over_the_limit_is_a_413_before_any_body_byte(server):
    # Only the headers: the answer must come without the body.
    request = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n"
    status, headers, body = only_answer(server, request)
    assert error_of(status, headers, body) == (413, too_large(1000000000))
    assert headers["connection"] == "close"


def test_the_413_reaches_a_client_that_sends_the_body_anyway(server):
    # The server answers before reading the body and then reads what still
    # comes, so closing does not reset the connection under the answer.
    body = b"x" * (8 << 20)
    request = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    assert error_of(*only_answer(server, request + body)) == (413, too_large(len(body)))


def test_expect_100_continue_over_the_limit_gets_413_and_no_100(server):
    request = (b"POST /v2/models/m/predict HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
               b"Content-Length: 4097\r\n\r\n")
    received = exchange(server, request)
    assert received.startswith(b"HTTP/1.1 413 "), received[:200]
    assert b"100 Continue" not in received
    assert error_of(*only_answer(server, request)) == (413, too_large(4097))


def test_a_body_within_the_limit_is_still_served_with_expect_100_continue(server):
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [3], "datatype": "INT32", "data": [1, 2, 3]}]}).encode()
    host, port = server.url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=HANG_GUARD_S) as conn:
        conn.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
        assert conn.recv(4096).startswith(b"HTTP/1.1 100 Continue\r\n")
        conn.sendall(body)
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
    status, _, answer = answers(received)[0]
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [1, 2, 3]


def big_input():
    values = np.arange(TOO_MANY, dtype=np.int32)
    tensor = grpcclient.InferInput("INPUT0", [TOO_MANY], "INT32")
    tensor.set_data_from_numpy(values)
    return tensor


def test_a_grpc_message_over_the_limit_is_resource_exhausted(server):
    client = grpcclient.InferenceServerClient(url=server.grpc_url)
    with pytest.raises(InferenceServerException) as refused:
        client.infer("m", [big_input()])
    assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED", refused.value
    assert "decoded message length too large" in refused.value.message()
    small = grpcclient.InferInput("INPUT0", [3], "INT32")
    small.set_data_from_numpy(np.array([1, 2, 3], dtype=np.int32))
    assert client.infer("m", [small]).as_numpy("OUTPUT0").tolist() == [1, 2, 3]


def test_a_streamed_grpc_message_over_the_limit_ends_the_stream_resource_exhausted(server):
    values = list(range(TOO_MANY))
    tensor = pb.ModelInferRequest.InferInputTensor(
        name="INPUT0", datatype="INT32", shape=[TOO_MANY], contents=pb.InferTensorContents(int_contents=values))
    with grpc.insecure_channel(server.grpc_url) as channel:
        stream = pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(
            iter([pb.ModelInferRequest(model_name="m", inputs=[tensor])]), timeout=HANG_GUARD_S)
        with pytest.raises(grpc.RpcError) as refused:
            list(stream)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
    assert "decoded message length too large" in refused.value.details()

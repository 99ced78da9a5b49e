"""Slow and idle clients, over raw sockets against the real binary: a
request head that never ends, a connection that sends nothing, half an
HTTP/2 preface on the gRPC port, an idle keep-alive connection and a body
that stops arriving or trickles in are each ended by their timeout
(counted in plinth_connections_slow_client_total); so are a client that
never reads its answer (the answer is dropped with the connection), and
HTTP/2 and gRPC connections that only answer pings; connections over a
listener's limit are each answered 503 while the metrics port, with its
own budget, still answers; and with the server's file limit low and more
slow connections than it allows, readiness stays reachable.

No assertion is on elapsed time: each test waits for the server to close
the socket, or for a metric, under the hang guard."""

import json
import resource
import socket
import struct
import subprocess
import urllib.error
import urllib.request

import pytest

from conftest import HANG_GUARD_S, Plinth, identity_repository, rss, series_value, wait_until


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Plinth with one-second client timeouts and at most 16 HTTP connections."""
    repo = identity_repository(tmp_path_factory.mktemp("repo"))
    plinth = Plinth(repo, "--http-header-read-timeout", "1", "--http-body-read-timeout", "1",
                    "--grpc-handshake-timeout", "1", "--http-max-connections", "16",
                    "--metrics-max-connections", "4")
    yield plinth
    plinth.stop()


def connect(address):
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=HANG_GUARD_S)


def read_until_closed(conn):
    """Everything the server sends until it closes the connection (a reset
    counts as a close)."""
    received = b""
    try:
        while chunk := conn.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return received


def slow_clients(server, listener, reason):
    text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=HANG_GUARD_S).read().decode()
    prefix = f'plinth_connections_slow_client_total{{listener="{listener}",reason="{reason}"}} '
    return next(float(l[len(prefix):]) for l in text.splitlines() if l.startswith(prefix))


def test_a_request_head_that_never_ends_is_closed_after_the_header_timeout(server):
    before = slow_clients(server, "http", "header_timeout")
    with connect(server.url) as conn:
        conn.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: plinth\r\n")
        assert read_until_closed(conn) == b"", "closed without an answer"
    wait_until("the slow head is counted", lambda: slow_clients(server, "http", "header_timeout") > before)


def test_a_connection_that_sends_nothing_is_closed(server):
    before = slow_clients(server, "http", "handshake_timeout")
    with connect(server.url) as conn:
        assert read_until_closed(conn) == b""
    wait_until("the silent connection is counted",
               lambda: slow_clients(server, "http", "handshake_timeout") > before)


def test_half_an_http2_preface_on_the_grpc_port_is_closed(server):
    before = slow_clients(server, "grpc", "handshake_timeout")
    with connect(server.grpc_url) as conn:
        conn.sendall(b"PRI * HTTP/2.0\r\n")
        # The server's own SETTINGS frame, then the close.
        received = read_until_closed(conn)
        assert received[3:4] == b"\x04", f"a SETTINGS frame: {received!r}"
    wait_until("the half preface is counted", lambda: slow_clients(server, "grpc", "handshake_timeout") > before)


def test_an_idle_keep_alive_connection_is_closed_after_its_answer(server):
    with connect(server.url) as conn:
        conn.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: plinth\r\n\r\n")
        received = read_until_closed(conn)
    assert received.startswith(b"HTTP/1.1 200 OK\r\n"), received
    assert received.count(b"HTTP/1.1") == 1, "one answer, then the idle connection closed"


def test_a_body_that_stops_arriving_gets_408_naming_the_flag(server):
    before = slow_clients(server, "http", "body_timeout")
    with connect(server.url) as conn:
        conn.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: plinth\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"inputs\": [")
        received = read_until_closed(conn)
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), received
    error = json.loads(body)["error"]
    assert error == "the request body stopped arriving: no byte for 1 s (--http-body-read-timeout)", error
    assert slow_clients(server, "http", "body_timeout") == before + 1


def test_a_body_that_trickles_in_gets_408_naming_the_minimum_rate(tmp_path):
    """A byte every 0.2 s: no pause comes near the 5 s read timeout, but
    once the body has been arriving for 5 s it is far below 1024 bytes a
    second."""
    server = Plinth(identity_repository(tmp_path / "repo"), "--http-body-read-timeout", "5")
    try:
        trickle(server)
    finally:
        server.stop()


def trickle(server):
    before = slow_clients(server, "http", "body_timeout")
    with connect(server.url) as conn:
        conn.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: plinth\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n")
        conn.settimeout(0.2)
        received = b""
        while not received:
            try:
                conn.sendall(b" ")
                received = conn.recv(65536)
            except socket.timeout:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        conn.settimeout(HANG_GUARD_S)
        received += read_until_closed(conn)
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), received
    error = json.loads(body)["error"]
    assert error.startswith("the request body arrives too slowly: "), error
    assert error.endswith("less than 1024 bytes a second (--http-body-min-rate)"), error
    assert slow_clients(server, "http", "body_timeout") == before + 1


def binary_request(model, values):
    """A binary-data inference request for `model`'s INT32 `INPUT0`
    holding `values`, asking for the output as JSON."""
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [len(values)], "datatype": "INT32",
                                     "parameters": {"binary_data_size": 4 * len(values)}}],
                         "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}]}).encode()
    data = header + struct.pack(f"<{len(values)}i", *values)
    return (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: plinth\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(data)}\r\n\r\n").encode() + data


def test_an_answer_the_client_never_reads_is_dropped_with_its_connection(tmp_path):
    """A 4 M-element request whose 32 MB JSON answer the client never
    reads: the connection is closed after --http-write-timeout, counted,
    and what the client finally reads ends there, short of the answer."""
    plinth = Plinth(identity_repository(tmp_path / "repo"), "--http-write-timeout", "1")
    try:
        with socket.socket() as conn:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            host, port = plinth.url.rsplit(":", 1)
            conn.settimeout(HANG_GUARD_S)
            conn.connect((host, int(port)))
            before = rss(plinth)
            conn.sendall(binary_request("m", [1_000_000] * 4_000_000))
            wait_until("the unread answer is dropped", lambda: slow_clients(plinth, "http", "write_timeout") == 1)
            wait_until("its memory is given back", lambda: rss(plinth) < before + (32 << 20))
            received = read_until_closed(conn)
        assert received.startswith(b"HTTP/1.1 200 OK\r\n"), received[:200]
        assert len(received) < 32_000_000, len(received)
        # The server goes on.
        assert ready_status(plinth.url) == 200
    finally:
        plinth.stop()


def frame(kind, flags, payload=b"", stream=0):
    """An HTTP/2 frame (RFC 9113, 4.1)."""
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def test_an_http2_connection_that_only_answers_pings_is_closed_when_idle(tmp_path):
    """An HTTP/2 client that opens a connection, sends no request, and
    answers each of the server's pings (sent every second here) is closed
    after --http-idle-timeout."""
    plinth = Plinth(identity_repository(tmp_path / "repo"), "--http-header-read-timeout", "1",
                    "--http-idle-timeout", "3")
    try:
        pings = 0
        with connect(plinth.url) as conn:
            conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0))
            buffered = b""
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                buffered += chunk
                while len(buffered) >= 9 and len(buffered) >= 9 + int.from_bytes(buffered[:3], "big"):
                    length, kind, flags = int.from_bytes(buffered[:3], "big"), buffered[3], buffered[4]
                    payload, buffered = buffered[9:9 + length], buffered[9 + length:]
                    if kind == 4 and not flags & 1:
                        conn.sendall(frame(4, 1))  # SETTINGS ACK
                    elif kind == 6 and not flags & 1:
                        conn.sendall(frame(6, 1, payload))  # PING ACK
                        pings += 1
        assert pings >= 1, "the server pinged and was answered"
        wait_until("the idle close is counted", lambda: slow_clients(plinth, "http", "idle_timeout") == 1)
    finally:
        plinth.stop()


def test_an_idle_grpc_connection_is_closed_and_the_client_reconnects(tmp_path):
    import tritonclient.grpc as grpcclient
    plinth = Plinth(identity_repository(tmp_path / "repo"), "--grpc-idle-timeout", "1")
    try:
        client = grpcclient.InferenceServerClient(plinth.grpc_url)
        assert client.is_server_live()
        wait_until("the idle gRPC connection is closed", lambda: slow_clients(plinth, "grpc", "idle_timeout") == 1)
        assert client.is_server_live(), "the next call reconnects"
        client.close()
    finally:
        plinth.stop()


def ready_status(url):
    """The status of GET /v2/health/ready on `url`; None when the
    connection is refused or closed without an answer."""
    try:
        return urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=HANG_GUARD_S).status
    except urllib.error.HTTPError as e:
        return e.code
    except (ConnectionError, urllib.error.URLError, OSError):
        return None


def test_connections_over_the_limit_are_refused_at_once_and_metrics_still_answer(tmp_path):
    # Timeouts far beyond the test: the held connections stay until closed.
    repo = identity_repository(tmp_path / "repo")
    plinth = Plinth(repo, "--http-header-read-timeout", "600", "--http-max-connections", "8")
    try:
        held = [connect(plinth.url) for _ in range(8)]
        for conn in held:
            conn.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: plinth\r\n")
        wait_until("8 connections are open", lambda: open_connections(plinth, "http") == 8)
        # Each excess connection gets its 503, also when its request (with
        # a body) arrives only after the server has refused it: a close with
        # the request still arriving would reset the connection and the
        # 503 with it.
        body = b"{" + b" " * 65536 + b"}"
        for n in range(1, 11):
            with connect(plinth.url) as excess:
                wait_until("the connection is refused", lambda: refused(plinth, "http") == n)
                try:
                    excess.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: plinth\r\n"
                                   b"Content-Length: %d\r\n\r\n" % len(body) + body)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                answer = read_until_closed(excess)
            assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
            assert b"retry-after: 1\r\n" in answer and b"maximum of connections" in answer, answer
        assert plinth.wait_for_log(r"refused \d+ connection\(s\) at accept: the listener holds its maximum of 8 "
                                   r"\(--http-max-connections\)")
        # The metrics port has a budget of its own.
        assert "plinth_connections_open" in metrics_text(plinth)
        held.pop().close()
        wait_until("readiness answers again", lambda: ready_status(plinth.url) == 200)
        for conn in held:
            conn.close()
    finally:
        plinth.stop()


def metrics_text(server):
    return urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=HANG_GUARD_S).read().decode()


def family_value(server, series):
    """The value of `series`: the connection families exist at zero from
    start, so an absent series fails."""
    return series_value(server, series)


def open_connections(server, listener):
    return family_value(server, f'plinth_connections_open{{listener="{listener}"}}')


def refused(server, listener):
    return family_value(server, f'plinth_connections_refused_total{{listener="{listener}"}}')


# How long a readiness probe may take before it counts as hanging: far
# above an answer given at once on a loaded machine, far below
# HEADER_TIMEOUT_S, when the slow connections would close and free a slot.
PROBE_S = 5
HEADER_TIMEOUT_S = 20


def probe_ready(url):
    """The status of GET /v2/health/ready on `url`, which must answer
    within PROBE_S; a timeout, a refused or a reset connection fail."""
    try:
        return urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=PROBE_S).status
    except urllib.error.HTTPError as e:
        return e.code
    except (TimeoutError, socket.timeout) as e:
        pytest.fail(f"the readiness probe got no answer within {PROBE_S} s: it hangs ({e!r})")
    except urllib.error.URLError as e:
        if isinstance(e.reason, (TimeoutError, socket.timeout)):
            pytest.fail(f"the readiness probe got no answer within {PROBE_S} s: it hangs ({e!r})")
        raise


class LowFileLimit(Plinth):
    """Plinth started with an open-file limit of FILES."""
    FILES = 700

    def __init__(self, *args):
        original = subprocess.Popen

        def popen(*a, **kw):
            kw["preexec_fn"] = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (self.FILES, self.FILES))
            return original(*a, **kw)

        subprocess.Popen = popen
        try:
            super().__init__(*args)
        finally:
            subprocess.Popen = original


def test_more_slow_clients_than_the_file_limit_allows_leave_readiness_reachable(tmp_path):
    """The scenario of a server whose file limit is below the slow
    connections thrown at it: each sends a request line and one header,
    then nothing. The default limits keep descriptors for the server, so
    the excess is refused at accept; a readiness probe sent while every
    connection the listener allows is held gets its 503 at once (a probe
    left hanging fails at PROBE_S); the metrics port answers; once the slow
    connections are closed by the header timeout, readiness answers 200.
    The header timeout is long enough that no slow connection is closed
    before the probe (checked), so the probe's answer can only be the 503."""
    repo = identity_repository(tmp_path / "repo")
    plinth = LowFileLimit(repo, "--http-header-read-timeout", str(HEADER_TIMEOUT_S))
    slow = []
    try:
        for _ in range(LowFileLimit.FILES + 100):
            conn = connect(plinth.url)
            conn.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: plinth\r\n")
            slow.append(conn)
        wait_until("the excess is refused", lambda: refused(plinth, "http") > 0)
        # Readiness is refused at once with a 503: the probe never hangs.
        assert probe_ready(plinth.url) == 503
        header_timeouts = 'plinth_connections_slow_client_total{listener="http",reason="header_timeout"}'
        assert family_value(plinth, header_timeouts) == 0, "a slow connection was closed before the probe"
        assert "plinth_connections_open" in metrics_text(plinth)
        wait_until("readiness answers 200 once the slow connections are closed",
                   lambda: ready_status(plinth.url) == 200)
        assert family_value(plinth, header_timeouts) > 0
    finally:
        for conn in slow:
            conn.close()
        plinth.stop()

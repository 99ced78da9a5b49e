"""Clients that open a new connection for every request, hammering the real
binary through SIGTERM with a drain delay (issue 18, part 3): each request
is answered (200, or the documented 503 / UNAVAILABLE "the server is
shutting down") or refused at connect. None may be accepted and then reset
or closed without an answer: the client could not know whether it ran."""

import http.client
import json
import signal
import struct
import threading
import time

import grpc
import tritonclient.grpc.service_pb2 as pb
import tritonclient.grpc.service_pb2_grpc as pb_grpc

from conftest import HANG_GUARD_S, Plinth, identity_repository, wait_until

DRAIN_DELAY = "2"
CLIENTS = 8
# Shutdowns per test: the race is a matter of microseconds, each round
# another chance for a reset to show.
ROUNDS = 3
# Answers the clients see, all together, before the signal and again after
# it (during the drain), so the signal and the drain fall inside traffic.
BEFORE, DURING = 80, 20
VALUES = list(range(16))
HTTP_BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [16], "datatype": "INT32", "data": VALUES}]})
# The same request padded with whitespace past what one read takes in: a
# 503 given before the body is read must still reach a client that is
# sending it.
PADDED_BODY = HTTP_BODY + " " * (1 << 20)


class Hammer:
    """CLIENTS threads, each calling `once(its number)` in a loop, every
    call on a new connection, until it is refused at connect. Each outcome
    is recorded: "ok", "shutting down", "refused", or anything else (a
    failure)."""

    def __init__(self, once):
        self.once = once
        self.outcomes = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(CLIENTS)]
        for t in self.threads:
            t.start()

    def _run(self, client):
        deadline = time.monotonic() + HANG_GUARD_S
        while time.monotonic() < deadline:
            outcome = self.once(client)
            with self.lock:
                self.outcomes.append(outcome)
            if outcome == "refused":
                return

    def count(self, outcome):
        with self.lock:
            return sum(1 for o in self.outcomes if o == outcome)

    def join(self):
        for t in self.threads:
            t.join(timeout=HANG_GUARD_S)
            assert not t.is_alive(), "a client hung"

    def failures(self):
        return [o for o in self.outcomes if o not in ("ok", "shutting down", "refused")]


def run_through_sigterm(start, once):
    """ROUNDS times: a server from `start()`, hammered with
    `once(server, client)` through its SIGTERM."""
    for _ in range(ROUNDS):
        server = start()
        try:
            one_shutdown(server, lambda client: once(server, client))
        finally:
            if server.proc.poll() is None:
                server.proc.kill()
            server.plugin_cache.cleanup()


def one_shutdown(server, once):
    hammer = Hammer(once)
    wait_until("traffic flows", lambda: hammer.count("ok") >= BEFORE)
    server.proc.send_signal(signal.SIGTERM)
    server.wait_for_log("still serving for the drain delay")
    served = hammer.count("ok")
    wait_until("traffic flows during the drain", lambda: hammer.count("ok") >= served + DURING)
    hammer.join()
    assert server.proc.wait(timeout=HANG_GUARD_S) == 0, "".join(server.log)
    counts = {o: hammer.count(o) for o in ("ok", "shutting down", "refused")}
    failures = hammer.failures()
    print(f"outcomes: {counts}, failures: {len(failures)}")
    assert not failures, (counts, failures[:20])
    assert counts["refused"] == CLIENTS, counts


def test_new_http_connections_through_sigterm_are_answered_or_refused(tmp_path):
    repo = identity_repository(tmp_path / "repo", dims=16)

    def once(server, client):
        host, port = server.url.rsplit(":", 1)
        body = PADDED_BODY if client % 2 else HTTP_BODY
        conn = http.client.HTTPConnection(host, int(port), timeout=HANG_GUARD_S)
        try:
            conn.connect()
        except ConnectionRefusedError:
            return "refused"
        try:
            conn.request("POST", "/v2/models/m/infer", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as e:
            return f"{type(e).__name__}: {e}"
        finally:
            conn.close()
        if response.status == 200 and json.loads(body)["outputs"][0]["data"] == VALUES:
            return "ok"
        if response.status == 503 and json.loads(body) == {"error": "the server is shutting down"}:
            return "shutting down"
        return f"{response.status}: {body[:200]!r}"

    run_through_sigterm(lambda: Plinth(repo, "--drain-delay-secs", DRAIN_DELAY), once)


def test_new_grpc_connections_through_sigterm_are_answered_or_refused(tmp_path):
    repo = identity_repository(tmp_path / "repo", dims=16)
    tensor = pb.ModelInferRequest.InferInputTensor(
        name="INPUT0", datatype="INT32", shape=[16], contents=pb.InferTensorContents(int_contents=VALUES))
    request = pb.ModelInferRequest(model_name="m", inputs=[tensor])

    def once(server, _client):
        # A local subchannel pool: a new connection for each channel, none
        # shared with the other clients' channels.
        channel = grpc.insecure_channel(server.grpc_url, options=[("grpc.use_local_subchannel_pool", 1)])
        try:
            answer = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=HANG_GUARD_S)
        except grpc.RpcError as e:
            code, details = e.code(), e.details() or ""
            if code == grpc.StatusCode.UNAVAILABLE and details == "the server is shutting down":
                return "shutting down"
            if code == grpc.StatusCode.UNAVAILABLE and "failed to connect" in details.lower() \
                    and "connection refused" in details.lower():
                return "refused"
            return f"{code}: {details}"
        finally:
            channel.close()
        values = list(struct.unpack("<16i", answer.raw_output_contents[0]))
        return "ok" if values == VALUES else f"wrong answer {answer}"

    run_through_sigterm(lambda: Plinth(repo, "--drain-delay-secs", DRAIN_DELAY), once)

"""What a rollout costs a request, in one run: one client sends the same
small request (4 FP32 through an ONNX identity model, as JSON) to a model
with two READY versions, first with no rollout, then while a rollout
splits its requests 50/50 by count, then while it splits them by a sticky
header, then while every request is also run on the candidate in a shadow
phase. Prints p50 and p99 of each and their ratios to the first; the
rollout adds a routing choice under one lock and one histogram entry per
answer, shadowing a copy of the inputs and the answer and a second run
of the request beside the client's next one.

Usage: .venv/bin/python bench/rollout.py   (after `make setup`)
"""

import json
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/python"))
from test_rollouts import GOOD, call, explicit_server, identity, infer, repository  # noqa: E402

ROUNDS = 2000


def timed(server, headers=None):
    """p50 and p99 in milliseconds of ROUNDS requests, after 200 to warm up."""
    for _ in range(200):
        infer(server, GOOD, headers)
    times = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        status, _ = infer(server, GOOD, headers)
        times.append((time.perf_counter() - start) * 1000)
        assert status == 200
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.99)]


def main():
    with tempfile.TemporaryDirectory() as folder:
        server = explicit_server(repository(pathlib.Path(folder), identity))
        try:
            plan = {"candidate": 2, "steps": [50, 100], "dwell_secs": 86400}
            rows = [("no rollout", timed(server))]
            call(server, "/v2/repository/models/ro/rollout", json.dumps(plan).encode())
            rows.append(("rollout, split by count", timed(server)))
            sticky = {**plan, "sticky_header": "x-user"}
            call(server, "/v2/repository/models/ro/rollout", json.dumps(sticky).encode())
            rows.append(("rollout, sticky header", timed(server, {"x-user": "client-7"})))
            shadow = {"candidate": 2, "shadow": {"percent": 100, "requests": 10**9}}
            call(server, "/v2/repository/models/ro/rollout", json.dumps(shadow).encode())
            rows.append(("shadowing every request", timed(server)))
            compared = call(server, "/v2/repository/models/ro/rollout")[1]["shadow"]
        finally:
            server.stop()
    print(f"shadow: {compared['compared']} compared, {compared['disagreed']} differed, "
          f"{compared['dropped']} dropped")
    base_p50, base_p99 = rows[0][1]
    for name, (p50, p99) in rows:
        print(f"{name:26s} p50 {p50:6.3f} ms  p99 {p99:6.3f} ms  "
              f"p50 ratio {p50 / base_p50:4.2f}  p99 ratio {p99 / base_p99:4.2f}")


if __name__ == "__main__":
    main()

"""A 4 MB FP32 tensor through Plinth three ways, in one run: as JSON, as
binary tensor data, and through system shared memory (input read from a
registered region, output written to one). The model is the identity
backend (output = input), so the figures are the cost of moving the
tensor in and out. Prints p50 latency and sequential throughput for each,
and each one's ratio to JSON measured in the same run.

Usage: .venv/bin/python bench/shared_memory.py   (after `make setup`)
"""

import os
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/python"))
from conftest import Plinth  # noqa: E402

ELEMENTS = 1 << 20  # 4 MiB of FP32
ROUNDS = {"json": 10, "binary": 50, "shared memory": 50}


def repository(folder):
    model = pathlib.Path(folder) / "identity_fp32"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(
        'backend: "identity"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')
    return folder


def timed(call, rounds):
    call()  # warm-up
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def main():
    data = np.random.default_rng(0).random(ELEMENTS, dtype=np.float32)
    size = data.nbytes
    with tempfile.TemporaryDirectory() as folder:
        server = Plinth(repository(folder), "--allow-client-shm=true")
        client = httpclient.InferenceServerClient(server.url, connection_timeout=600, network_timeout=600)
        key = f"/plinth_bench_{os.getpid()}"
        regions = {name: shm.create_shared_memory_region(name, f"{key}_{name}", size) for name in ("in", "out")}
        try:
            shm.set_shared_memory_region(regions["in"], [data])
            for name in regions:
                client.register_system_shared_memory(name, f"{key}_{name}", size)

            def over(binary):
                i = httpclient.InferInput("INPUT0", [ELEMENTS], "FP32")
                i.set_data_from_numpy(data, binary_data=binary)
                out = client.infer("identity_fp32", [i],
                                   outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)])
                assert np.array_equal(out.as_numpy("OUTPUT0"), data)

            def through_shm():
                i = httpclient.InferInput("INPUT0", [ELEMENTS], "FP32")
                i.set_shared_memory("in", size)
                o = httpclient.InferRequestedOutput("OUTPUT0")
                o.set_shared_memory("out", size)
                client.infer("identity_fp32", [i], outputs=[o])
                assert np.array_equal(shm.get_contents_as_numpy(regions["out"], np.float32, [ELEMENTS]), data)

            calls = {"json": lambda: over(False), "binary": lambda: over(True), "shared memory": through_shm}
            results = {name: timed(call, ROUNDS[name]) for name, call in calls.items()}
        finally:
            client.unregister_system_shared_memory()
            for handle in regions.values():
                shm.destroy_shared_memory_region(handle)
            server.stop()
    base_p50 = statistics.median(results["json"])
    base_rate = 1 / statistics.mean(results["json"])
    print(f"4 MiB FP32 in and out of the identity model, HTTP, one client, {ELEMENTS} elements")
    print(f"{'':>14} {'p50 ms':>9} {'req/s':>8} {'p50 vs JSON':>12} {'req/s vs JSON':>14}")
    for name, times in results.items():
        p50, rate = statistics.median(times), 1 / statistics.mean(times)
        print(f"{name:>14} {p50 * 1000:9.2f} {rate:8.1f} {p50 / base_p50:11.3f}x {rate / base_rate:13.1f}x")


if __name__ == "__main__":
    main()

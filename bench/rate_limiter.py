"""Triton's rate limiter in Plinth (--rate-limit=execution_count): two
identity models whose one instance each needs the one copy of a shared
resource, priorities 1 and 2, kept saturated (16 requests in flight on
each); prints how many executions each ran while both had requests
waiting, and their ratio (Triton's design: 2), then the same without the
rate limiter (both run at once: about 1).

Usage: .venv/bin/python bench/rate_limiter.py   (after `make setup`)
"""

import pathlib
import sys
import tempfile
import threading

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/python"))
from conftest import Plinth  # noqa: E402

DELAY_MS = 10
IN_FLIGHT = 16
EXECUTIONS = 600  # both models together, while saturated


def repository(folder):
    for name, priority in (("first", 1), ("second", 2)):
        model = pathlib.Path(folder) / name
        (model / "1").mkdir(parents=True)
        (model / "config.pbtxt").write_text(
            'backend: "identity"\nmax_batch_size: 0\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'instance_group [ { kind: KIND_CPU count: 1 rate_limiter { resources [ { name: "device" count: 1 } ] '
            f"priority: {priority} }} }} ]\n"
            f'parameters {{ key: "execute_delay_ms" value: {{ string_value: "{DELAY_MS}" }} }}\n')
    return folder


def successes(server, models):
    client = httpclient.InferenceServerClient(server.url)
    return {m: client.get_inference_statistics(m)["model_stats"][0]["inference_stats"]["success"]["count"]
            for m in models}


def saturate(server, models):
    """Executions of each model while both have requests waiting, until
    they ran EXECUTIONS together."""
    stop = threading.Event()
    at_stop = {}
    lock = threading.Lock()

    def sender(model):
        client = grpcclient.InferenceServerClient(server.grpc_url)
        tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.ones([1], np.float32))
        while not stop.is_set():
            client.infer(model, [tensor])
            with lock:
                if not stop.is_set():
                    counts = successes(server, models)
                    if sum(counts.values()) >= EXECUTIONS:
                        at_stop.update(counts)
                        stop.set()

    threads = [threading.Thread(target=sender, args=(m,)) for m in models for _ in range(IN_FLIGHT)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return at_stop


def main():
    models = ["first", "second"]
    for flags, what in ((["--rate-limit=execution_count"], "rate limiter, one copy"), ([], "rate limiter off")):
        with tempfile.TemporaryDirectory() as folder:
            server = Plinth(repository(folder), *flags)
            try:
                counts = saturate(server, models)
            finally:
                server.stop()
        ratio = counts["first"] / counts["second"]
        print(f"{what:24} priority 1: {counts['first']:4} executions, priority 2: {counts['second']:4}, "
              f"ratio {ratio:.2f}")


if __name__ == "__main__":
    main()

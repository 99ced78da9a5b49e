"""The response cache's hit latency against its miss latency, in one run:
MobileNetV2 (ONNX, 1x3x224x224 FP32 as binary tensor data) served with
`response_cache { enable: true }` and `--cache-config local,size=...`. A
miss sends an input never seen (the model runs and the answer is kept); a
hit repeats one (answered from the cache). Prints p50 and p99 of each and
the hit/miss ratio, and checks the statistics counted what was sent.

Usage: .venv/bin/python bench/response_cache.py   (after `make setup`)
"""

import json
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request

import numpy as np
import tritonclient.http as httpclient

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/python"))
from conftest import Plinth  # noqa: E402

ROUNDS = 100


def main():
    with tempfile.TemporaryDirectory() as folder:
        model = pathlib.Path(folder) / "mobilenet_v2"
        shutil.copytree(ROOT / "model_repository/mobilenet_v2", model)
        with open(model / "config.pbtxt", "a") as config:
            config.write("response_cache { enable: true }\n")
        server = Plinth(folder, "--cache-config", f"local,size={256 << 20}")
        try:
            client = httpclient.InferenceServerClient(server.url)
            rng = np.random.default_rng(0)
            output = client.get_model_metadata("mobilenet_v2")["outputs"][0]["name"]
            input_name = client.get_model_metadata("mobilenet_v2")["inputs"][0]["name"]

            def infer(x):
                i = httpclient.InferInput(input_name, list(x.shape), "FP32")
                i.set_data_from_numpy(x, binary_data=True)
                start = time.perf_counter()
                client.infer("mobilenet_v2", [i], outputs=[httpclient.InferRequestedOutput(output, binary_data=True)])
                return time.perf_counter() - start

            fresh = [rng.random((1, 3, 224, 224), dtype=np.float32) for _ in range(ROUNDS + 1)]
            infer(fresh[0])  # warm-up, and the input the hits repeat
            misses = [infer(x) for x in fresh[1:]]
            hits = [infer(fresh[0]) for _ in range(ROUNDS)]
            url = f"http://{server.url}/v2/models/mobilenet_v2/stats"
            counted = json.load(urllib.request.urlopen(url))["model_stats"][0]["inference_stats"]
            assert counted["cache_hit"]["count"] == ROUNDS, counted
            assert counted["cache_miss"]["count"] == ROUNDS + 1, counted
        finally:
            server.stop()
    q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(p * len(xs)))] * 1000  # noqa: E731
    print(f"MobileNetV2, 1x3x224x224 FP32 binary over HTTP, one client, {ROUNDS} requests each")
    print(f"{'':>6} {'p50 ms':>8} {'p99 ms':>8}")
    for name, xs in (("miss", misses), ("hit", hits)):
        print(f"{name:>6} {statistics.median(xs) * 1000:8.2f} {q(xs, 0.99):8.2f}")
    print(f"hit p50 / miss p50: {statistics.median(hits) / statistics.median(misses):.3f}")


if __name__ == "__main__":
    main()

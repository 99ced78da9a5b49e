"""On-demand residency under a skewed request mix: 10 models of mixed sizes
(3 text recognizers of 11 MB of weights, 7 direction classifiers of 0.6 MB)
requested with Zipf-distributed popularity, at most 3 resident. Prints the
hit rate, loads, evictions, and p50 / p99 latency of hits and of misses.
Then a load storm: 20 cold models requested at once while a resident model
takes steady traffic; prints that model's p50 / p99 before and during it.

Usage: make bench   (or: .venv/bin/python bench/residency.py [--requests N])
"""

import argparse
import collections
import concurrent.futures
import threading
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/python"))
from conftest import Plinth  # noqa: E402

RESIDENT = 3
MODELS = [(f"rec{i}", "ocr_rec", "line_hello.png") for i in range(3)] + \
         [(f"cls{i}", "ocr_cls", "cls_upright.png") for i in range(7)]


def metric(server, name):
    text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics").read().decode()
    return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--zipf", type=float, default=1.2, help="Zipf exponent of model popularity")
    args = parser.parse_args()
    repo = pathlib.Path(tempfile.mkdtemp())
    for name, source, _ in MODELS:
        shutil.copytree(ROOT / "model_repository" / source, repo / name)
        config = repo / name / "config.pbtxt"
        config.write_text(config.read_text().replace(f'name: "{source}"', f'name: "{name}"'))
    rng = np.random.default_rng(42)
    order = rng.permutation(len(MODELS))  # popularity rank -> model
    weights = 1.0 / np.arange(1, len(MODELS) + 1) ** args.zipf
    picks = order[rng.choice(len(MODELS), size=args.requests, p=weights / weights.sum())]
    bodies = {name: (ROOT / "tests/fixtures" / image).read_bytes() for name, _, image in MODELS}

    server = Plinth(repo, "--model-control-mode", "on_demand", "--max-loaded-models", str(RESIDENT))
    latencies = collections.defaultdict(list)
    lru = collections.OrderedDict()  # the client's view of what is resident (sequential requests)
    try:
        for pick in picks:
            name = MODELS[pick][0]
            kind = "hit" if name in lru else "miss"
            lru[name] = True
            lru.move_to_end(name)
            while len(lru) > RESIDENT:
                lru.popitem(last=False)
            request = urllib.request.Request(f"http://{server.url}/v2/models/{name}/predict", data=bodies[name])
            start = time.perf_counter()
            with urllib.request.urlopen(request) as response:
                response.read()
            latencies[kind].append((time.perf_counter() - start) * 1000)
        hits, misses = metric(server, "plinth_residency_hits_total"), metric(server, "plinth_residency_misses_total")
        loads, evictions = metric(server, "plinth_model_loads_total"), metric(server, "plinth_model_evictions_total")
    finally:
        server.stop()
    print(f"{args.requests} sequential /predict requests over {len(MODELS)} models "
          f"(Zipf {args.zipf}), at most {RESIDENT} resident")
    print(f"hit rate {hits / (hits + misses):.1%} (client-side LRU expects "
          f"{len(latencies['hit']) / args.requests:.1%}), loads {loads:.0f}, evictions {evictions:.0f}")
    for kind in ("hit", "miss"):
        q = statistics.quantiles(latencies[kind], n=100)
        print(f"{kind:<5} {len(latencies[kind]):4d} requests  p50 {q[49]:7.2f} ms  p99 {q[98]:7.2f} ms")


def quantiles(values):
    q = statistics.quantiles(values, n=100)
    return f"p50 {q[49]:7.2f} ms  p99 {q[98]:7.2f} ms"


def storm():
    repo = pathlib.Path(tempfile.mkdtemp())
    names = ["hot"] + [f"cold{i}" for i in range(20)]
    for name in names:
        source = "ocr_rec" if name == "hot" else "ocr_cls"
        shutil.copytree(ROOT / "model_repository" / source, repo / name)
        config = repo / name / "config.pbtxt"
        config.write_text(config.read_text().replace(f'name: "{source}"', f'name: "{name}"'))
    line = (ROOT / "tests/fixtures/line_hello.png").read_bytes()
    upright = (ROOT / "tests/fixtures/cls_upright.png").read_bytes()
    server = Plinth(repo, "--model-control-mode", "on_demand", "--max-loaded-models", "6",
                    "--model-load-concurrency", "2")

    def predict(name, body):
        start = time.perf_counter()
        try:
            urllib.request.urlopen(urllib.request.Request(f"http://{server.url}/v2/models/{name}/predict", data=body)).read()
            ok = True
        except urllib.error.HTTPError:
            ok = False
        return time.perf_counter() - start, ok

    hot = []  # (started at, latency ms)
    stop = threading.Event()

    def steady():
        while not stop.is_set():
            start = time.perf_counter()
            predict("hot", line)
            hot.append((start, (time.perf_counter() - start) * 1000))

    try:
        predict("hot", line)
        sender = threading.Thread(target=steady)
        sender.start()
        time.sleep(3)
        storm_start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(max_workers=20) as pool:
            results = list(pool.map(lambda n: predict(n, upright), names[1:]))
        storm_end = time.perf_counter()
        stop.set()
        sender.join()
    finally:
        server.stop()
    answered = sum(ok for _, ok in results)
    print(f"load storm: 20 cold models at once (2 loads at a time, 6 resident): {answered} answered, "
          f"{20 - answered} got 503, in {storm_end - storm_start:.2f} s")
    print(f"hot model before the storm  {quantiles([l for t, l in hot if t < storm_start])}")
    print(f"hot model during the storm  {quantiles([l for t, l in hot if storm_start <= t <= storm_end] or [0, 0])}")


if __name__ == "__main__":
    main()
    storm()

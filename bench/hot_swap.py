"""Hot swap under a steady request rate: Plinth in poll mode serves ocr_cls
while a new version folder is copied in five times. Prints the requests
sent and failed and the p50 / p99 latency before and during the swaps.

Usage: make bench   (or: .venv/bin/python bench/hot_swap.py [--rate 50])
"""

import argparse
import concurrent.futures
import json
import pathlib
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/python"))
from conftest import Plinth  # noqa: E402

IMAGE = (ROOT / "tests/fixtures/cls_upright.png").read_bytes()
POLL_SECS = 1
SWAPS = 5


def request(url):
    """One /predict; returns (latency ms, answered correctly)."""
    start = time.perf_counter()
    try:
        req = urllib.request.Request(f"http://{url}/v2/models/ocr_cls/predict", data=IMAGE,
                                     headers={"Content-Type": "image/png"})
        with urllib.request.urlopen(req, timeout=10) as response:
            ok = json.load(response).get("angle") == 0
    except (urllib.error.URLError, OSError):
        ok = False
    return (time.perf_counter() - start) * 1000, ok


def ready(url, version):
    try:
        return urllib.request.urlopen(f"http://{url}/v2/models/ocr_cls/versions/{version}/ready").status == 200
    except urllib.error.URLError:
        return False


def summary(label, results):
    latencies = sorted(r[1] for r in results)
    failed = sum(1 for r in results if not r[2])
    q = statistics.quantiles(latencies, n=100)
    print(f"{label:<16} sent {len(results):5d}  failed {failed:3d}  p50 {q[49]:6.2f} ms  p99 {q[98]:6.2f} ms")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=50, help="requests per second")
    args = parser.parse_args()
    repo = pathlib.Path(tempfile.mkdtemp())
    shutil.copytree(ROOT / "model_repository/ocr_cls", repo / "ocr_cls")
    server = Plinth(repo, "--model-control-mode", "poll", "--repository-poll-secs", str(POLL_SECS))
    results = []  # (sent at, latency ms, ok)
    stop = threading.Event()

    def load():
        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
            start, i = time.perf_counter(), 0
            futures = []
            while not stop.is_set():
                delay = start + i / args.rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                sent = time.perf_counter()
                futures.append((sent, pool.submit(request, server.url)))
                i += 1
            for sent, f in futures:
                latency, ok = f.result()
                results.append((sent, latency, ok))

    try:
        sender = threading.Thread(target=load)
        sender.start()
        time.sleep(5)
        swaps_start = time.perf_counter()
        for version in range(2, 2 + SWAPS):
            shutil.copytree(repo / "ocr_cls/1", repo / f"ocr_cls/{version}")
            while not ready(server.url, version):
                time.sleep(0.05)
            print(f"swap to version {version}: READY after {time.perf_counter() - swaps_start:.1f} s")
        swaps_end = time.perf_counter()
        time.sleep(1)
        stop.set()
        sender.join()
    finally:
        server.stop()
    print(f"{args.rate:.0f} requests/s to /v2/models/ocr_cls/predict, poll every {POLL_SECS} s, {SWAPS} swaps")
    summary("before swaps", [r for r in results if r[0] < swaps_start])
    summary("during swaps", [r for r in results if swaps_start <= r[0] <= swaps_end])


if __name__ == "__main__":
    main()

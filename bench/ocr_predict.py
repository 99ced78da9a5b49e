"""Latency of reading one text line: Plinth's /predict (HTTP + Wasm plugin
pre/post-processing + ONNX Runtime) against the same pipeline written in
Python in-process (Pillow + NumPy + onnxruntime), measured in the same run.

Usage: make bench   (or: .venv/bin/python bench/ocr_predict.py [--requests N])
Prints median and p90 per request in milliseconds and the ratio Plinth / Python.
"""

import argparse
import http.client
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/python"))
sys.path.insert(0, str(ROOT / "bench/peers"))
from conftest import Plinth  # noqa: E402
from ocr_pipeline import LineReader  # noqa: E402  (the pipeline every peer's model runs too)

IMAGE = ROOT / "tests/fixtures/line_serif.png"
MODEL = ROOT / "model_repository/ocr_rec/1/model.onnx"


def python_pipeline():
    reader = LineReader(MODEL)
    return lambda body: reader.read(body)["text"]


def timed(fn, n):
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), statistics.quantiles(times, n=10)[-1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    body = IMAGE.read_bytes()

    read = python_pipeline()
    text = read(body)
    py = timed(lambda: read(body), args.requests)

    server = Plinth(ROOT / "model_repository")
    try:
        host, port = server.url.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port))

        def predict():
            conn.request("POST", "/v2/models/ocr_rec/predict", body, {"Content-Type": "image/png"})
            response = conn.getresponse()
            answer = response.read()
            assert response.status == 200, answer

        predict()
        plinth = timed(predict, args.requests)
    finally:
        server.stop()

    print(f"line: {IMAGE.name} ({text!r}), {args.requests} sequential requests")
    print(f"python in-process (Pillow+NumPy+onnxruntime): median {py[0]:.2f} ms, p90 {py[1]:.2f} ms")
    print(f"plinth /predict over HTTP (Wasm pre/post):    median {plinth[0]:.2f} ms, p90 {plinth[1]:.2f} ms")
    print(f"ratio plinth / python (median): {plinth[0] / py[0]:.2f}")


if __name__ == "__main__":
    main()

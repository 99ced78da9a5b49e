"""Heap allocations per tiny /infer request: the server's malloc-family calls
(counted by bench/alloc_count.c, preloaded) over N keep-alive JSON requests
to the tiny MLP of bench/make_mlp.py after 2,000 warm-up ones, less the
server's idle rate, divided by N. Compare two servers in one run.

Usage: .venv/bin/python bench/allocations.py BINARY... [--requests N]"""
import argparse
import http.client
import json
import os
import pathlib
import socket
import subprocess
import tempfile
import time

root = pathlib.Path(__file__).resolve().parents[1]


def counter() -> pathlib.Path:
    """bench/alloc_count.c built into a shared library (gcc)."""
    out = pathlib.Path(tempfile.mkdtemp()) / "libcount.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(out), str(root / "bench/alloc_count.c"),
                    "-ldl", "-lpthread"], check=True)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port: int):
    for _ in range(600):
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/v2/health/ready")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("the server did not become ready in 60 s")


def measure(binary: str, n: int, library: pathlib.Path) -> float:
    """Allocations per request of `binary` over `n` requests."""
    work = pathlib.Path(tempfile.mkdtemp())
    (work / "repo/mlp/1").mkdir(parents=True)
    subprocess.run([str(root / ".venv/bin/python"), str(root / "bench/make_mlp.py"),
                    str(work / "repo/mlp/1/model.onnx")], check=True)
    (work / "repo/mlp/config.pbtxt").write_text("max_batch_size: 8\n")
    port, count_file = free_port(), work / "count"
    env = dict(os.environ, LD_PRELOAD=str(library), ALLOC_COUNT_FILE=str(count_file),
               ORT_DYLIB_PATH=str(root / ".cache/onnxruntime/libonnxruntime.so"))
    server = subprocess.Popen([binary, "serve", "--model-repository", str(work / "repo"), "--http-port", str(port),
                               "--grpc-port", "0", "--metrics-port", "0", "--plugin-cache-dir", "none"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]})
    try:
        wait_ready(port)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

        def send(k):
            for _ in range(k):
                connection.request("POST", "/v2/models/mlp/infer", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                assert response.status == 200, response.status

        def count():
            time.sleep(0.2)  # the counter file is rewritten every 50 ms
            return int(count_file.read_text())

        send(2000)
        idle_start = count()
        time.sleep(1.0)
        idle_rate = (count() - idle_start) / 1.2  # per second (the counter's own writes)
        before, started = count(), time.time()
        send(n)
        elapsed, after = time.time() - started, count()
        return (after - before - idle_rate * (elapsed + 0.2)) / n
    finally:
        server.terminate()
        server.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binaries", nargs="+")
    parser.add_argument("--requests", type=int, default=20000)
    args = parser.parse_args()
    library = counter()
    for binary in args.binaries:
        print(f"{binary}: {measure(binary, args.requests, library):.1f} allocations per request")


if __name__ == "__main__":
    main()

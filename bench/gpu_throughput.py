"""mobilenet_v2 through Plinth against the same TorchScript file run by
PyTorch in this process, on the same device, measured in the same run.
Checks the answers first. Called by bench/gpu.sh.

usage: gpu_throughput.py PLINTH_URL MODEL_PT SECONDS KIND_GPU|KIND_CPU
"""

import concurrent.futures
import http.client
import json
import pathlib
import sys
import time
import urllib.parse

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
BATCHES = (1, 32)
CLIENTS = 4  # concurrent HTTP connections to Plinth
SHAPE = (3, 224, 224)


class Plinth:
    """One keep-alive HTTP connection; tensors travel as KServe v2 binary data."""

    def __init__(self, url):
        parsed = urllib.parse.urlparse(url)
        self.conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)

    def post(self, path, body, headers):
        self.conn.request("POST", path, body, headers)
        response = self.conn.getresponse()
        return response.status, response.getheader("Inference-Header-Content-Length"), response.read()

    def predict(self, photo):
        status, _, body = self.post("/v2/models/mobilenet_v2/predict?top_k=1", photo, {"Content-Type": "image/jpeg"})
        assert status == 200, body
        return json.loads(body)["classes"][0]["label"]

    def infer(self, x):
        header = json.dumps({
            "inputs": [{"name": "INPUT__0", "shape": list(x.shape), "datatype": "FP32",
                        "parameters": {"binary_data_size": x.nbytes}}],
            "outputs": [{"name": "OUTPUT__0", "parameters": {"binary_data": True}}],
        }).encode()
        headers = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}
        status, length, body = self.post("/v2/models/mobilenet_v2/infer", header + x.tobytes(), headers)
        assert status == 200, body
        return np.frombuffer(body[int(length):], dtype=np.float32).reshape(x.shape[0], 1000)


def images(batch, seed=0):
    return np.random.default_rng(seed).standard_normal((batch, *SHAPE), dtype=np.float32)


def plinth_throughput(url, batch, seconds):
    """Images per second from CLIENTS connections sending `batch`-image requests."""
    x = images(batch)

    def client(deadline):
        plinth, done = Plinth(url), 0
        while time.monotonic() < deadline:
            plinth.infer(x)
            done += batch
        return done

    Plinth(url).infer(x)  # warm-up
    deadline = time.monotonic() + seconds
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        total = sum(pool.map(client, [deadline] * CLIENTS))
    return total / seconds


def torch_throughput(module, device, batch, seconds):
    """Images per second from PyTorch: host tensor to device, forward, back."""
    x = torch.from_numpy(images(batch))
    with torch.no_grad():
        module(x.to(device)).cpu()  # warm-up
        done, deadline = 0, time.monotonic() + seconds
        while time.monotonic() < deadline:
            module(x.to(device)).cpu()
            done += batch
    return done / seconds


def main(url, model_path, seconds, kind):
    seconds = float(seconds)
    device = torch.device("cuda:0" if kind == "KIND_GPU" else "cpu")
    if device.type == "cuda":
        print(f"GPU: {torch.cuda.get_device_name(0)}, PyTorch {torch.__version__}")
    plinth = Plinth(url)
    for photo, label in (("china.jpg", "palace"), ("flower.jpg", "honeycomb")):
        got = plinth.predict((ROOT / ".cache/samples" / photo).read_bytes())
        assert got == label, f"{photo}: {got}, expected {label}"
        print(f"answer ok: {photo} -> {got}")
    module = torch.jit.load(model_path, map_location=device).eval()
    x = images(4, seed=1)
    with torch.no_grad():
        want = module(torch.from_numpy(x).to(device)).cpu().numpy()
    difference = float(np.abs(plinth.infer(x) - want).max())
    assert difference <= 1e-3, f"Plinth and PyTorch logits differ by {difference}"
    print(f"answer ok: logits of 4 images within {difference:.2e} of PyTorch's")

    print(f"\n{'batch':>5} {'Plinth img/s':>13} {'PyTorch img/s':>14} {'ratio':>6}   ({seconds:g} s each, {CLIENTS} HTTP clients)")
    for batch in BATCHES:
        served = plinth_throughput(url, batch, seconds)
        direct = torch_throughput(module, device, batch, seconds)
        print(f"{batch:>5} {served:>13.1f} {direct:>14.1f} {served / direct:>6.2f}")


if __name__ == "__main__":
    main(*sys.argv[1:])

"""MobileNetV2 through Plinth on the GPU against the same files run in this
process by the frameworks, on the same GPU, measured in the same run:
the ONNX copy against ONNX Runtime-GPU (CUDAExecutionProvider) and the
TorchScript copy against PyTorch. Checks the answers first (the sample
photos' labels, logits within 1e-3), then prints images/s at batch 1 and 32
and Plinth's ratio. Called by bench/gpu.sh.

usage: gpu_throughput.py PLINTH_URL REPOSITORY SECONDS
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

    def __init__(self, url, model, tensors):
        parsed = urllib.parse.urlparse(url)
        self.conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)
        self.model, (self.input, self.output) = model, tensors

    def post(self, path, body, headers):
        self.conn.request("POST", path, body, headers)
        response = self.conn.getresponse()
        return response.status, response.getheader("Inference-Header-Content-Length"), response.read()

    def predict(self, photo):
        path = f"/v2/models/{self.model}/predict?top_k=1"
        status, _, body = self.post(path, photo, {"Content-Type": "image/jpeg"})
        assert status == 200, body
        return json.loads(body)["classes"][0]["label"]

    def infer(self, x):
        header = json.dumps({
            "inputs": [{"name": self.input, "shape": list(x.shape), "datatype": "FP32",
                        "parameters": {"binary_data_size": x.nbytes}}],
            "outputs": [{"name": self.output, "parameters": {"binary_data": True}}],
        }).encode()
        headers = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}
        status, length, body = self.post(f"/v2/models/{self.model}/infer", header + x.tobytes(), headers)
        assert status == 200, body
        return np.frombuffer(body[int(length):], dtype=np.float32).reshape(x.shape[0], 1000)


def images(batch, seed=0):
    return np.random.default_rng(seed).standard_normal((batch, *SHAPE), dtype=np.float32)


def rate(run, batch, seconds):
    """Images per second of `run(x)` on `batch` images, after one warm-up."""
    x = images(batch)
    run(x)
    done, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        run(x)
        done += batch
    return done / seconds


def plinth_rate(url, model, tensors, batch, seconds):
    """Images per second from CLIENTS connections sending `batch`-image requests."""
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        rates = pool.map(lambda _: rate(Plinth(url, model, tensors).infer, batch, seconds), range(CLIENTS))
        return sum(rates)


def onnx_runner(path):
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CUDAExecutionProvider"])
    assert session.get_providers()[0] == "CUDAExecutionProvider", session.get_providers()
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x})[0], f"ONNX Runtime {onnxruntime.__version__} (CUDA)"


def torch_runner(path):
    module = torch.jit.load(str(path), map_location="cuda:0").eval()

    def run(x):
        with torch.no_grad():
            return module(torch.from_numpy(x).to("cuda:0")).cpu().numpy()

    return run, f"PyTorch {torch.__version__}"


BACKENDS = {
    # model folder: (input, output), model file, in-process runner
    "mobilenet_v2": (("INPUT__0", "OUTPUT__0"), "model.onnx", onnx_runner),
    "mobilenet_v2_torchscript": (("INPUT__0", "OUTPUT__0"), "model.pt", torch_runner),
}


def main(url, repository, seconds):
    seconds = float(seconds)
    print(f"GPU: {torch.cuda.get_device_name(0)}")
    rows = []
    for model, (tensors, file, runner) in BACKENDS.items():
        folder = pathlib.Path(repository) / model
        if not folder.exists():
            print(f"{model}: skipped (no onnxruntime-gpu 1.31.1 in this Python)")
            continue
        plinth = Plinth(url, model, tensors)
        for photo, label in (("china.jpg", "palace"), ("flower.jpg", "honeycomb")):
            got = plinth.predict((ROOT / ".cache/samples" / photo).read_bytes())
            assert got == label, f"{model}, {photo}: {got}, expected {label}"
        run, framework = runner(folder / "1" / file)
        x = images(4, seed=1)
        difference = float(np.abs(plinth.infer(x) - run(x)).max())
        assert difference <= 1e-3, f"{model}: Plinth and {framework} logits differ by {difference}"
        print(f"{model}: photos named right; logits of 4 images within {difference:.2e} of {framework}'s")
        for batch in BATCHES:
            served = plinth_rate(url, model, tensors, batch, seconds)
            direct = rate(run, batch, seconds)
            rows.append((model, framework, batch, served, direct))

    print(f"\n{'model':<26} {'batch':>5} {'Plinth img/s':>13} {'framework img/s':>16} {'ratio':>6}"
          f"   ({seconds:g} s each, {CLIENTS} HTTP clients, binary tensors)")
    for model, framework, batch, served, direct in rows:
        print(f"{model:<26} {batch:>5} {served:>13.1f} {direct:>16.1f} {served / direct:>6.2f}   {framework}")


if __name__ == "__main__":
    main(*sys.argv[1:])

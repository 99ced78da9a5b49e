"""Device memory on GPU 0 through Plinth's own metrics: what each model's
load took (`plinth_model_gpu_memory_bytes`, measured by NVML around the
load) and what the device holds (`nv_gpu_memory_used_bytes`).

1. Unload: each backend's MobileNetV2 is loaded, run at batch 32, unloaded;
   the device must get back at least 90 % of what the load took.
2. Eviction: on_demand with --model-load-gpu-limit room for one copy and a
   half; a request for a second copy evicts the first, whose memory returns.
3. Hot swap on a full GPU: a new version that does not fit beside the one
   serving is refused and the old one keeps answering; with
   `gpu_swap_policy: unload_first` the swap goes through.

Each wait is for an event (a metric, a state) with a hang guard. Called by
bench/gpu.sh.

usage: gpu_memory.py PLINTH_BINARY REPOSITORY PORT
"""

import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import numpy as np

GUARD = 120  # seconds any one wait may take before the check fails


class Server:
    def __init__(self, binary, repository, port, *flags):
        self.base, self.metrics_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 2}/metrics"
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log")
        self.process = subprocess.Popen(
            [binary, "serve", "--model-repository", str(repository), "--http-address", "127.0.0.1",
             "--http-port", str(port), "--grpc-port", str(port + 1), "--metrics-port", str(port + 2), *flags],
            stdout=subprocess.DEVNULL, stderr=self.log)

        def started():
            log = pathlib.Path(self.log.name).read_text()
            assert self.process.poll() is None, f"plinth exited:\n{log}"
            return "start-up loading finished" in log

        wait_for(started, "start-up")

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=GUARD) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def metric(self, name, **labels):
        text = urllib.request.urlopen(self.metrics_url, timeout=GUARD).read().decode()
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        return None

    def used(self):
        """Device memory in use on GPU 0 (the first GPU listed)."""
        return self.metric("nv_gpu_memory_used_bytes")

    def took(self, model):
        return self.metric("plinth_model_gpu_memory_bytes", model=model, gpu="0")

    def infer(self, model, batch):
        """One request of `batch` images as binary tensor data (a batch of 32
        as JSON would pass the 64 MiB body limit)."""
        x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224), dtype=np.float32)
        header = json.dumps({"inputs": [{"name": "INPUT__0", "datatype": "FP32", "shape": list(x.shape),
                                         "parameters": {"binary_data_size": x.nbytes}}]}).encode()
        request = urllib.request.Request(
            f"{self.base}/v2/models/{model}/infer", data=header + x.tobytes(), method="POST",
            headers={"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"})
        with urllib.request.urlopen(request, timeout=GUARD) as response:
            assert response.status == 200, response.read()

    def stop(self):
        self.process.terminate()
        self.process.wait(GUARD)


def wait_for(condition, what):
    deadline = time.monotonic() + GUARD
    while not condition():
        assert time.monotonic() < deadline, f"waited {GUARD} s for {what}"
        time.sleep(0.05)


def mib(b):
    return f"{b / 2**20:.1f} MiB"


def copy_model(repository, source, name, extra=""):
    """`source`'s ONNX or TorchScript files under `name`, without its plugin."""
    folder = repository / name
    shutil.copytree(source, folder)
    config = (folder / "config.pbtxt").read_text()
    config = re.sub(r'name: "[^"]*"', f'name: "{name}"', config, count=1)
    config = re.sub(r'parameters \{[^{}]*("plugin[^"]*")[^{}]*\{[^{}]*\}\s*\}', "", config)
    (folder / "config.pbtxt").write_text(config + "\n" + extra + "\n")
    for wasm in folder.glob("*.wasm"):
        wasm.unlink()
    return folder


def check_unload(binary, repository, port):
    work = pathlib.Path(tempfile.mkdtemp())
    for model in ("mobilenet_v2", "mobilenet_v2_torchscript"):
        if (repository / model).exists():
            copy_model(work, repository / model, model)
    server = Server(binary, work, port, "--model-control-mode", "explicit")
    try:
        for model in sorted(p.name for p in work.iterdir()):
            status, answer = server.call("POST", f"/v2/repository/models/{model}/load", {})
            assert status == 200, answer
            took = server.took(model)
            server.infer(model, 32)
            before = server.used()
            assert server.call("POST", f"/v2/repository/models/{model}/unload", {})[0] == 200
            wait_for(lambda: server.used() <= before - 0.9 * took, f"{model}'s device memory to return")
            returned = before - server.used()
            print(f"unload {model}: the load took {mib(took)}; unloading returned {mib(returned)} "
                  f"({returned / took:.0%}, at least 90 % required)")
    finally:
        server.stop()


def limit_for(server, bytes_):
    total = server.metric("nv_gpu_memory_total_bytes")
    return f"0:{bytes_ / total:.12f}"


def check_eviction_and_swap(binary, repository, port):
    work = pathlib.Path(tempfile.mkdtemp())
    source = repository / "mobilenet_v2"
    if not source.exists():
        source = repository / "mobilenet_v2_torchscript"
    for name in ("first", "second"):
        copy_model(work, source, name)
    probe = Server(binary, work, port, "--model-control-mode", "explicit", "--load-model", "first")
    took, limit = probe.took("first"), limit_for(probe, 1.5 * probe.took("first"))
    probe.stop()

    server = Server(binary, work, port, "--model-control-mode", "on_demand", "--model-load-gpu-limit", limit)
    try:
        server.infer("first", 1)
        before = server.used()
        server.infer("second", 1)  # loads, measures, and evicts "first" to stay within the limit
        wait_for(lambda: server.took("first") is None, "the eviction of 'first'")
        expected = before + server.took("second")
        wait_for(lambda: server.used() <= expected - 0.9 * took, "the evicted model's memory to return")
        returned = expected - server.used()
        print(f"eviction under --model-load-gpu-limit {limit}: 'first' took {mib(took)}, "
              f"its eviction returned {mib(returned)} ({returned / took:.0%})")
    finally:
        server.stop()

    server = Server(binary, work, port, "--model-control-mode", "explicit", "--load-model", "first",
                    "--model-load-gpu-limit", limit)
    try:
        shutil.copytree(work / "first" / "1", work / "first" / "2")
        status, answer = server.call("POST", "/v2/repository/models/first/load", {})
        assert status != 200 and "does not fit beside" in answer["error"], answer
        assert server.call("GET", "/v2/models/first/versions/1/ready")[0] == 200
        server.infer("first", 1)
        print(f"swap refused, version 1 still serving: {answer['error']}")
        config = work / "first" / "config.pbtxt"
        config.write_text(config.read_text()
                          + '\nparameters { key: "gpu_swap_policy" value: { string_value: "unload_first" } }\n')
        status, answer = server.call("POST", "/v2/repository/models/first/load", {})
        assert status == 200, answer
        assert server.call("GET", "/v2/models/first/versions/2/ready")[0] == 200
        server.infer("first", 1)
        print("swap with gpu_swap_policy unload_first: version 2 READY and answering")
    finally:
        server.stop()


def main(binary, repository, port):
    repository, port = pathlib.Path(repository), int(port)
    check_unload(binary, repository, port)
    check_eviction_and_swap(binary, repository, port)


if __name__ == "__main__":
    main(*sys.argv[1:])

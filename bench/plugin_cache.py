"""Plugin start-up with and without the compile cache: the example
repository (every plugin: OCR, direction, recogniser, full-page OCR, VAD,
image classification) plus the Python plugin on a small model, served twice
with the same fresh `--plugin-cache-dir`. The first start compiles each
component with Cranelift; the second loads the compiled artefacts. Prints
each plugin's compile time from the server's `plugin ready` log line and
the ratio, measured in the same run. A second model with the same .wasm
already finds it in the cache during the first start.

Usage: .venv/bin/python bench/plugin_cache.py   (after `make setup`)
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
BINARY = ROOT / "target/release/plinth"
PYTHON_PLUGIN = ROOT / "plugins/target/wasm32-wasip2/release/python_doubler.wasm"


def repository(work):
    repo = work / "repo"
    shutil.copytree(ROOT / "model_repository", repo)
    doubler = repo / "python_doubler"
    (doubler / "1").mkdir(parents=True)
    shutil.copy(ROOT / "tests/fixtures/slow_model.onnx", doubler / "1/model.onnx")
    shutil.copy(PYTHON_PLUGIN, doubler)
    (doubler / "config.pbtxt").write_text(
        'max_batch_size: 4\nparameters { key: "plugin" value: { string_value: "python_doubler.wasm" } }\n')
    return repo


def start(repo, cache):
    """Serves `repo` until start-up loading finishes; returns the seconds it
    took and each plugin's compile time in ms."""
    env = dict(os.environ, ORT_DYLIB_PATH=str(ROOT / ".cache/onnxruntime/libonnxruntime.so"))
    started = time.monotonic()
    proc = subprocess.Popen(
        [BINARY, "serve", "--model-repository", repo, "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
         "--plugin-cache-dir", cache, "--log-format", "json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    compile_ms = {}
    for line in proc.stderr:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        fields = event.get("fields", {})
        if fields.get("message") == "plugin ready":
            compile_ms[fields["plugin"]] = int(fields["compile_us"]) / 1000
        if fields.get("message") == "start-up loading finished":
            break
    seconds = time.monotonic() - started
    proc.terminate()
    proc.wait(timeout=30)
    return seconds, compile_ms


def main():
    for path in (BINARY, PYTHON_PLUGIN):
        if not path.is_file():
            sys.exit(f"{path} is missing: run `make setup` first")
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        repo = repository(work)
        cache = work / "cache"
        cold_s, cold = start(repo, cache)
        warm_s, warm = start(repo, cache)
    print(f"{'plugin':<72} {'cold ms':>9} {'warm ms':>9} {'ratio':>7}")
    for name in sorted(cold):
        ratio = cold[name] / max(warm.get(name, 0), 0.001)
        print(f"{name:<72} {cold[name]:>9.1f} {warm.get(name, 0):>9.1f} {ratio:>6.0f}x")
    total_cold, total_warm = sum(cold.values()), max(sum(warm.values()), 0.001)
    print(f"{'all plugins':<72} {total_cold:>9.1f} {total_warm:>9.1f} {total_cold / total_warm:>6.0f}x")
    print(f"whole start-up (models included): cold {cold_s:.1f} s, warm {warm_s:.1f} s")


if __name__ == "__main__":
    main()

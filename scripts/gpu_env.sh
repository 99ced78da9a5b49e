#!/usr/bin/env bash
# Prints the environment that serves models on the GPU, for `eval`:
#   ORT_DYLIB_PATH   onnxruntime-gpu's libonnxruntime.so (its CUDA provider library beside it)
#   CUDA_DEVICE_ORDER=PCI_BUS_ID, so CUDA numbers GPUs as NVML does (Plinth's GPU indices)
#   LD_LIBRARY_PATH  torch/lib (libtorch_cuda.so, which Plinth loads at start, and the libtorch
#                    it was built against) and every NVIDIA wheel's lib folder (CUDA 13 runtime,
#                    cuBLAS, cuDNN 9, cuFFT, cuRAND, ...), ahead of what was there
# from PYTHON (default: the venv of scripts/setup_gpu.sh), which must hold torch 2.11.0 and,
# for ONNX models, onnxruntime-gpu 1.31.1. Fails with a message naming what is missing.
#
# usage: eval "$(scripts/gpu_env.sh [PYTHON])"
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-.cache/gpu/venv/bin/python}
[[ -x $python ]] || { echo "$python is missing: run \`make setup-gpu\`" >&2; exit 1; }
"$python" - <<'PY'
import importlib.metadata as metadata
import pathlib
import shlex
import sys

def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None

torch_version = version("torch")
if torch_version is None or torch_version.split("+")[0] != "2.11.0":
    sys.exit(f"{sys.executable} has torch {torch_version}; Plinth is built against 2.11.0 (make setup-gpu)")
import torch  # noqa: E402  (after the version check)

site = pathlib.Path(torch.__file__).parent.parent
folders = [pathlib.Path(torch.__file__).parent / "lib"]
folders += sorted(p for p in (site / "nvidia").glob("**/lib") if any(p.glob("*.so*")))
print("export CUDA_DEVICE_ORDER=PCI_BUS_ID")
print("export LD_LIBRARY_PATH=" + shlex.quote(":".join(map(str, folders))) + '${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}')
if version("onnxruntime-gpu") == "1.31.1":
    library = next((site / "onnxruntime" / "capi").glob("libonnxruntime.so.1.31.1"))
    print("export ORT_DYLIB_PATH=" + shlex.quote(str(library)))
else:
    print(f"echo 'no onnxruntime-gpu 1.31.1 in {sys.executable}: ONNX models stay on the CPU' >&2")
PY

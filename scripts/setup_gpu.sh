#!/usr/bin/env bash
# GPU extras for a machine with an NVIDIA GPU and driver, on top of `make setup`
# (`make setup-gpu`); only the package registries are needed:
#   .cache/gpu/venv/   Python with onnxruntime-gpu==1.31.1 (the CUDA build of the library Plinth loads,
#                      with libonnxruntime_providers_cuda.so beside it), torch==2.11.0 (full, with
#                      libtorch_cuda.so) and the CUDA 13, cuBLAS, cuDNN 9, cuFFT and cuRAND libraries
#                      from NVIDIA's wheels that both need; numpy for bench/gpu.sh
# `scripts/gpu_env.sh` then prints the ORT_DYLIB_PATH and LD_LIBRARY_PATH that
# point Plinth at them (`make serve GPU=1` and bench/gpu.sh use it). About 6 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.cache/gpu/venv
want="onnxruntime-gpu[cuda,cudnn]==1.31.1 torch==2.11.0 numpy==2.4.6"
if [[ ! -f $venv/.done || $(cat "$venv/.done") != "$want" ]]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    # shellcheck disable=SC2086 # the list is word-split on purpose
    "$venv/bin/python" -m pip install --quiet $want
    echo "$want" > "$venv/.done"
fi
scripts/gpu_env.sh "$venv/bin/python" >/dev/null
echo "GPU extras ready in $venv; \`eval \"\$(scripts/gpu_env.sh)\"\` points Plinth at them"

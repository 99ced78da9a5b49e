#!/usr/bin/env bash
# MobileNetV2 on an NVIDIA GPU: Plinth's TorchScript backend (KIND_GPU)
# against the same TorchScript file run by PyTorch in Python on the same GPU.
#
# Builds nothing. Run it on the GPU machine from a checkout where `make
# setup` ran on the build machine: target/release/plinth (feature libtorch),
# model_repository/mobilenet_v2_torchscript and .cache/samples come from
# there. The GPU machine needs python3 with torch==2.11.0 (a CUDA build) and
# numpy; its torch/lib (libtorch_cuda.so) goes on LD_LIBRARY_PATH, which
# Plinth loads at start. Not run in CI.
#
# Usage: bench/gpu.sh [SECONDS]
#   KIND=KIND_CPU PYTHON=/path/to/python bench/gpu.sh   a dry run without a GPU
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
kind=${KIND:-KIND_GPU}
python=${PYTHON:-python3}
port=${PORT:-18600}

version=$("$python" -c 'import torch; print(torch.__version__.split("+")[0])')
[[ $version == 2.11.0 ]] || { echo "PyTorch $version here; Plinth is built against 2.11.0" >&2; exit 1; }
torch_lib=$("$python" -c 'import pathlib, torch; print(pathlib.Path(torch.__file__).parent / "lib")')
export LD_LIBRARY_PATH=$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

source=model_repository/mobilenet_v2_torchscript
for file in target/release/plinth "$source/1/model.pt" .cache/samples/china.jpg; do
    [[ -f $file ]] || { echo "$file is missing: run \`make setup\` on the build machine first" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
model=$work/repo/mobilenet_v2
mkdir -p "$model/1"
cp "$source/1/model.pt" "$source/1/categories.txt" "$model/1/"
cp "$source/image_classification.wasm" "$model/"
sed 's/name: "mobilenet_v2_torchscript"/name: "mobilenet_v2"/; s/dynamic_batching { }/dynamic_batching { max_queue_delay_microseconds: 1000 }/' \
    "$source/config.pbtxt" > "$model/config.pbtxt"
echo "instance_group [ { kind: $kind count: 1 } ]" >> "$model/config.pbtxt"

target/release/plinth serve --model-repository "$work/repo" --http-address 127.0.0.1 --http-port "$port" \
    --grpc-port $((port + 1)) --metrics-port $((port + 2)) > "$work/plinth.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
    grep -q "start-up loading finished" "$work/plinth.log" && break
    kill -0 "$pid" 2>/dev/null || { cat "$work/plinth.log"; exit 1; }
    sleep 0.1
done
grep -E "libtorch|load failed" "$work/plinth.log" || true
"$python" bench/gpu_throughput.py "http://127.0.0.1:$port" "$model/1/model.pt" "$seconds" "$kind"

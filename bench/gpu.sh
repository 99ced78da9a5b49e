#!/usr/bin/env bash
# MobileNetV2 on an NVIDIA GPU, both backends: Plinth's ONNX Runtime (CUDA
# execution provider) and libtorch models on KIND_GPU against the same files
# run by ONNX Runtime-GPU and PyTorch in Python on the same GPU (logits,
# images/s at batch 1 and 32, the ratio), then the device-memory checks:
# unload and eviction hand the model's memory back, a hot swap that does not
# fit is refused while the old version serves, and `unload_first` swaps.
#
# Builds nothing: run it from a checkout where `make setup` ran (the binary,
# model_repository/mobilenet_v2*, .cache/samples). PYTHON is a Python with
# torch==2.11.0 (a CUDA build) and onnxruntime-gpu==1.31.1; by default the venv
# `make setup-gpu` makes. Without onnxruntime-gpu the ONNX half is skipped and
# says so. Not run in CI (no GPU there).
#
# Usage: bench/gpu.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
python=${PYTHON:-.cache/gpu/venv/bin/python}
port=${PORT:-18600}

[[ -x $python ]] || scripts/setup_gpu.sh
gpu_env=$(scripts/gpu_env.sh "$python")  # a failure stops here, not inside eval
eval "$gpu_env"
for file in target/release/plinth model_repository/mobilenet_v2/1/model.onnx \
    model_repository/mobilenet_v2_torchscript/1/model.pt .cache/samples/china.jpg; do
    [[ -f $file ]] || { echo "$file is missing: run \`make setup\` first" >&2; exit 1; }
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

work=$(mktemp -d)
pid=
trap 'kill "$pid" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
# Both copies with their plugin, on GPU 0, batching up to 32.
for model in mobilenet_v2 mobilenet_v2_torchscript; do
    mkdir -p "$work/repo/$model"
    cp -r "model_repository/$model/." "$work/repo/$model/"
    sed -i 's/dynamic_batching { }/dynamic_batching { max_queue_delay_microseconds: 1000 }/' "$work/repo/$model/config.pbtxt"
    echo 'instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ] } ]' >> "$work/repo/$model/config.pbtxt"
done
[[ -n ${ORT_DYLIB_PATH:-} && $ORT_DYLIB_PATH == *onnxruntime/capi* ]] || rm -rf "$work/repo/mobilenet_v2"

target/release/plinth serve --model-repository "$work/repo" --http-address 127.0.0.1 --http-port "$port" \
    --grpc-port $((port + 1)) --metrics-port $((port + 2)) > "$work/plinth.log" 2>&1 &
pid=$!
for _ in $(seq 1200); do
    grep -q "start-up loading finished" "$work/plinth.log" && break
    kill -0 "$pid" 2>/dev/null || { cat "$work/plinth.log"; exit 1; }
    sleep 0.1
done
grep -E "CUDA|libtorch|NVML|load failed|footprint" "$work/plinth.log" || true
"$python" bench/gpu_throughput.py "http://127.0.0.1:$port" "$work/repo" "$seconds"
kill "$pid"
wait "$pid" 2>/dev/null || true

"$python" bench/gpu_memory.py target/release/plinth "$work/repo" $((port + 10))

#!/usr/bin/env bash
# A flame graph of Plinth's tiny-model path: the 64 -> 32 -> 10 MLP of
# bench/make_mlp.py served by target/profiling/plinth (the release build with
# full debug info, built here if missing), one wrk connection
# POSTing the same v2 JSON request for SECONDS while `perf record` samples
# the server's threads (software cpu-clock event: shared and virtual
# machines rarely expose hardware counters). The stacks are folded and drawn
# with inferno (installed at its pinned version if missing) into
# docs/flamegraph-tiny.svg.
#
# Usage: bench/flamegraph.sh [SECONDS]   (after make setup; installs Debian's
#        linux-perf if perf is missing)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
seconds=${1:-10}
if ! command -v perf >/dev/null; then
    sudo=$([[ $(id -u) == 0 ]] || echo sudo)
    $sudo apt-get install -y -q linux-perf >/dev/null
fi
version=0.12.8
if ! inferno-flamegraph --version 2>/dev/null | grep -q " $version"; then
    cargo install inferno --locked --version "$version"
fi
export ORT_DYLIB_PATH=$root/.cache/onnxruntime/libonnxruntime.so
cargo build --profile profiling --locked -p plinth

work=$(mktemp -d)
trap 'kill "$server" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -p "$work/repo/mlp/1"
.venv/bin/python bench/make_mlp.py "$work/repo/mlp/1/model.onnx"
printf 'name: "mlp"\nbackend: "onnxruntime"\nmax_batch_size: 8\n' > "$work/repo/mlp/config.pbtxt"
target/profiling/plinth serve --model-repository "$work/repo" --http-port 18300 --grpc-port 18301 \
    --metrics-port 18302 > "$work/plinth.log" 2>&1 &
server=$!
for _ in $(seq 300); do
    curl -sf http://127.0.0.1:18300/v2/models/mlp/ready >/dev/null && break
    sleep 0.1
done
curl -sf http://127.0.0.1:18300/v2/models/mlp/ready >/dev/null || { cat "$work/plinth.log" >&2; exit 1; }

python3 - "$work/body.json" <<'PY'
import json, sys
json.dump({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]},
          open(sys.argv[1], "w"))
PY
cat > "$work/post.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("$work/body.json", "rb")
wrk.body = f:read("*a")
f:close()
LUA
# Warm up (the first requests measure the model for the scheduler).
wrk -t1 -c1 -d1s -s "$work/post.lua" http://127.0.0.1:18300/v2/models/mlp/infer >/dev/null
perf record -e cpu-clock -F 4999 -g -p "$server" -o "$work/perf.data" -- sleep "$seconds" 2>"$work/perf.log" &
recorder=$!
wrk -t1 -c1 -d"${seconds}s" --latency -s "$work/post.lua" http://127.0.0.1:18300/v2/models/mlp/infer
wait "$recorder"
perf script -i "$work/perf.data" 2>/dev/null | inferno-collapse-perf > "$work/folded"
inferno-flamegraph --title "plinth: tiny MLP, v2 JSON, one wrk connection, ${seconds} s" \
    --subtitle "perf record -e cpu-clock -g on the server process" < "$work/folded" > docs/flamegraph-tiny.svg
echo "docs/flamegraph-tiny.svg: $(wc -l < "$work/folded") distinct stacks"

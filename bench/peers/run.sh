#!/usr/bin/env bash
# Side-by-side: ocr_cls from the example repository served by Plinth, by
# the KServe Python model server and by MLServer (each a small wrapper
# around onnxruntime, in its own venv under .cache/bench/), and run by
# onnxruntime in-process as the ceiling. One Rust load generator
# (bench/peers.rs, the plinth-client crate) drives every server with the
# same KServe v2 JSON requests at concurrency 1 and 16.
#
# Usage: make bench-peers   (or: bench/peers/run.sh [SECONDS])
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
seconds=${1:-5}
model=$root/model_repository/ocr_cls/1/model.onnx
[[ -f $model && -f .venv/libonnxruntime.so ]] || { echo "run \`make setup\` first" >&2; exit 1; }
export ORT_DYLIB_PATH=$root/.venv/libonnxruntime.so

venv() {  # venv NAME PACKAGES...: a venv under .cache/bench, made once
    local dir=.cache/bench/$1; shift
    if [[ ! -f $dir/.done ]]; then
        python3 -m venv "$dir"
        "$dir/bin/python" -m pip install --quiet "$@"
        touch "$dir/.done"
    fi
}
venv kserve kserve==0.21.0 onnxruntime==1.31.1
venv mlserver mlserver==1.7.1 onnxruntime==1.31.1 uvloop==0.21.0  # uvloop 0.22+ breaks mlserver 1.7.1 start-up
cargo build --release --locked --quiet -p plinth -p plinth-bench

work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

# Plinth on the example configuration (dynamic batching on), no plugin needed.
mkdir -p "$work/repo/ocr_cls/1"
cp "$model" "$work/repo/ocr_cls/1/"
grep -v plugin model_repository/ocr_cls/config.pbtxt | sed '/^parameters {/,/^}/d' > "$work/repo/ocr_cls/config.pbtxt"
target/release/plinth serve --model-repository "$work/repo" --http-port 18000 --grpc-port 18001 \
    --metrics-port 18002 > "$work/plinth.log" 2>&1 &
pids+=($!)

.cache/bench/kserve/bin/python bench/peers/kserve_server.py "$model" 18080 18081 > "$work/kserve.log" 2>&1 &
pids+=($!)

mkdir -p "$work/mlserver"
cp bench/peers/mlserver/runtime.py "$work/mlserver/"
cat > "$work/mlserver/settings.json" <<JSON
{"http_port": 18090, "grpc_port": 18091, "metrics_port": 18092}
JSON
cat > "$work/mlserver/model-settings.json" <<JSON
{"name": "ocr_cls", "implementation": "runtime.OcrCls", "parameters": {"uri": "$model"}}
JSON
(cd "$work/mlserver" && exec "$root/.cache/bench/mlserver/bin/mlserver" start . > "$work/mlserver.log" 2>&1) &
pids+=($!)

for port in 18000 18080 18090; do
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$port/v2/models/ocr_cls/ready" >/dev/null && break
        sleep 0.2
    done
    curl -sf "http://127.0.0.1:$port/v2/models/ocr_cls/ready" >/dev/null || {
        echo "the server on port $port did not get ready; logs in $work" >&2
        tail -n 20 "$work"/*.log >&2
        exit 1
    }
done

target/release/peers "$seconds" "$model" \
    plinth=http://127.0.0.1:18000 kserve=http://127.0.0.1:18080 mlserver=http://127.0.0.1:18090

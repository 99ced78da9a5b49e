# The two commands of the README:
#   make serve   set everything up and serve model_repository/ on port 8000
#   make test    set everything up and run every test
.PHONY: setup setup-gpu serve test bench bench-peers soak dist fuzz

export ORT_DYLIB_PATH := $(CURDIR)/.venv/libonnxruntime.so
# torch-sys links the slim libtorch that scripts/setup.sh unzips.
export LIBTORCH := $(CURDIR)/.cache/libtorch
HTTP_PORT ?= 8000

setup:
	scripts/setup.sh

# GPU=1 serves with onnxruntime-gpu and a full PyTorch (make setup-gpu), so that
# instance_group KIND_GPU and KIND_AUTO run models on the GPU.
ifeq ($(GPU),1)
serve: setup setup-gpu
	gpu_env=$$(scripts/gpu_env.sh) && eval "$$gpu_env" && target/release/plinth serve --model-repository model_repository --http-port $(HTTP_PORT)
else
serve: setup
	target/release/plinth serve --model-repository model_repository --http-port $(HTTP_PORT)
endif

# On a machine with an NVIDIA GPU: onnxruntime-gpu, PyTorch and NVIDIA's CUDA
# libraries in .cache/gpu/venv (scripts/setup_gpu.sh).
setup-gpu: setup
	scripts/setup_gpu.sh

test: setup
	python3 scripts/check_layers.py
	cargo test --release --workspace --all-features --locked
# The text-embedding plugin's own unit tests, natively (input forms, buckets, pooling).
	cd plugins && cargo test --locked --target $$(rustc -vV | sed -n 's/^host: //p') -p text-embedding
	.venv/bin/python -m pytest -q tests/python

# The self-contained bundle in dist/plinth (binary, ONNX Runtime, libtorch).
dist: setup
	scripts/dist.sh

# Benchmarks (bench/): /predict against the same pipeline in Python, latency
# and failures while versions are swapped under load, residency, and the
# scheduler against ONNX Runtime in-process, and a 4 MiB tensor as JSON,
# binary data and through system shared memory, response cache hits
# against misses, and sentence embeddings through /v1/embeddings against
# sentence-transformers, ONNX Runtime and fastembed in-process.
bench: setup
	.venv/bin/python bench/ocr_predict.py
	.venv/bin/python bench/hot_swap.py
	.venv/bin/python bench/residency.py
	.venv/bin/python bench/plugin_cache.py
	.venv/bin/python bench/shared_memory.py
	.venv/bin/python bench/response_cache.py
	.venv/bin/python bench/vad_stream.py
	.venv/bin/python bench/text_embeddings.py
	cargo run --release --locked -p plinth-bench --bin batching
	cargo run --release --locked -p plinth-bench --bin plugins_native
	cargo run --release --locked -p plinth-bench --bin tracing
	cargo run --release --locked -p plinth-bench --bin overhead

# Soak and chaos (bench/): memory over unload/load cycles under traffic, 500
# version reloads, a load/unload storm under traffic, kill -9 during loads
# and a restart, model files lost while serving. Each prints its figures.
soak: setup
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
bench-peers: setup
	bench/peers/run.sh

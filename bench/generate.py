"""Generated tokens per second and time to first token: SmolLM2-135M-Instruct
(int4, ONNX Runtime GenAI's model builder's export in .cache/smollm2/int4)
served by Plinth (`POST /v1/completions`, streamed; the decode loop and KV
cache in the server, the tokenizer in the `text-generation` plugin) with 1,
4 and 16 concurrent streams, against the same export in-process in ONNX
Runtime GenAI (one prompt at a time, and static batches of 16) and the fp32
Hugging Face folder (.cache/smollm2/hf) in transformers' `generate` (1 and
16 at a time); then aiperf's profile of Plinth's `/v1/chat/completions`.
All in one run, on one machine.

Request i is prompt i % 10 of tests/fixtures/llm_prompts.json's
completions, greedy (temperature 0), at most MAX_TOKENS tokens (fewer where
the model ends the text: Plinth has no `ignore_eos`, so every engine counts
the tokens it generated). Each row sends ROUNDS x 16 requests. Plinth's
clients each start at a random offset within the first second (fixed
seed), then send their requests one after another; a request's first token
is its first SSE chunk with text, its tokens the usage's
`completion_tokens`. In-process peers have no clients: "16" is static
batches of 16, their best case, and a batch's first token is every
request's. Decode tokens/s is a request's tokens after the first over the
time from its first token to its last (median of the row); aggregate
tokens/s is the row's tokens over its wall time. The last column counts the
requests whose greedy text equals ONNX Runtime GenAI's alone (the same int4
export; transformers runs fp32, so its texts may differ).

Usage: make bench   (or: .venv/bin/python bench/generate.py [--quick] [--rounds N])
--quick: 16 tokens a request, 1 round, a shorter aiperf run (for trying it
out). The first run makes .cache/bench/generate-peers (torch, transformers,
onnxruntime-genai, aiperf) from PyPI.
"""

import argparse
import http.client
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/python"))
from conftest import Plinth  # noqa: E402

PROMPTS = ROOT / "tests/fixtures/llm_prompts.json"
INT4 = ROOT / ".cache/smollm2/int4"
HF = ROOT / ".cache/smollm2/hf"
WASM = ROOT / "plugins/target/wasm32-wasip2/release/text_generation.wasm"
MODEL = "smollm2"
CONTEXT = 512
MAX_SEQUENCES = 16
PREFILL_CHUNK = 256
STREAMS = (1, 4, 16)
SEED = 7
PEERS_VENV = ROOT / ".cache/bench/generate-peers"
PEER_PACKAGES = ["torch==2.11.0", "transformers==5.24.0", "tokenizers==0.23.2", "gguf==0.19.0", "accelerate==1.16.0",
                 "onnxruntime==1.31.1", "onnxruntime-genai==0.18.0", "aiperf==0.13.0"]
PLINTH = "Plinth /v1/completions (streamed)"
GENAI = "ONNX Runtime GenAI (in-process)"


def peers_python():
    """The peers' venv, made once (its .done lists its packages). torch's
    wheel comes from .cache/wheels where scripts/setup.sh left it."""
    done = PEERS_VENV / ".done"
    if not done.exists() or done.read_text() != " ".join(PEER_PACKAGES):
        subprocess.run(["python3", "-m", "venv", str(PEERS_VENV)], check=True)
        subprocess.run([PEERS_VENV / "bin/python", "-m", "pip", "install", "--quiet", "--find-links",
                        ROOT / ".cache/wheels", *PEER_PACKAGES], check=True)
        done.write_text(" ".join(PEER_PACKAGES))
    return PEERS_VENV / "bin/python"


def repository(folder):
    """A repository with the int4 export as `smollm2`: the weights linked,
    what the sandboxed plugin reads copied (it sees its version folder only)."""
    version = folder / MODEL / "1"
    version.mkdir(parents=True)
    for file in INT4.iterdir():
        if file.name.startswith("model.onnx"):
            (version / file.name).symlink_to(file)
        else:
            shutil.copy(file, version / file.name)
    shutil.copy(WASM, folder / MODEL / "text_generation.wasm")
    (folder / MODEL / "config.pbtxt").write_text(f"""
        backend: "onnxruntime"
        model_transaction_policy {{ decoupled: true }}
        parameters {{ key: "plugin" value: {{ string_value: "text_generation.wasm" }} }}
        parameters {{ key: "generation.context_length" value: {{ string_value: "{CONTEXT}" }} }}
        parameters {{ key: "generation.max_sequences" value: {{ string_value: "{MAX_SEQUENCES}" }} }}
        parameters {{ key: "generation.prefill_chunk" value: {{ string_value: "{PREFILL_CHUNK}" }} }}
    """)
    return folder


def stream(conn, prompt, max_tokens):
    """One streamed completion: [ttft, tokens, decode seconds] and its text."""
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"{response.status}: {response.read().decode()}")
    first = last = tokens = None
    text = []
    for line in response:
        if not line.startswith(b"data: "):
            continue
        data = line[len(b"data: "):].strip()
        if data == b"[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            raise RuntimeError(event["error"])
        if event.get("choices") and event["choices"][0].get("text"):
            last = time.perf_counter()
            first = first or last
            text.append(event["choices"][0]["text"])
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
    response.read()
    if first is None or tokens is None:
        raise RuntimeError("a stream without text or without usage")
    return [first - start, tokens, last - first], "".join(text)


def through_plinth(server, prompts, requests, streams, max_tokens):
    """`requests` streamed completions from `streams` clients, each on its own
    keep-alive connection, starting at a random offset within the first
    second: the row's wall time (first request to last token), its
    requests' records and [prompt index, text] pairs."""
    host, port = server.url.rsplit(":", 1)
    offsets = random.Random(SEED).sample(range(1000), streams)
    next_request = iter(range(requests))
    lock = threading.Lock()
    records, texts, failures, spans = [], [], [], []

    def client(offset):
        time.sleep(offset / 1000)  # an arrival time, not a wait for an event
        conn = http.client.HTTPConnection(host, int(port))
        while True:
            with lock:
                i = next(next_request, None)
            if i is None:
                return
            start = time.perf_counter()
            try:
                record, text = stream(conn, prompts[i % len(prompts)], max_tokens)
            except Exception as e:  # noted, and the row fails below
                failures.append(f"{type(e).__name__}: {e}")
                return
            with lock:
                spans.append((start, time.perf_counter()))
                records.append(record)
                texts.append([i % len(prompts), text])

    threads = [threading.Thread(target=client, args=(offset,)) for offset in offsets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise RuntimeError(f"{len(failures)} of {requests} requests failed, e.g. {failures[0]}")
    return max(end for _, end in spans) - min(start for start, _ in spans), records, texts


def aiperf(server, requests, max_tokens):
    """aiperf's profile of `/v1/chat/completions` (streamed, concurrency 4,
    synthetic 64-token user messages, token counts from the usage, the model's
    own tokenizer): its console summary, or why it could not run. It runs
    without HF_HUB_OFFLINE: aiperf 0.13 offline looks a tokenizer folder up
    as a Hub repository and fails, while online it loads a local folder
    without asking the Hub."""
    with tempfile.TemporaryDirectory(prefix="aiperf-") as artifacts:
        command = [PEERS_VENV / "bin/aiperf", "profile", "--model", MODEL, "--url", f"http://{server.url}",
                   "--endpoint-type", "chat", "--streaming", "--tokenizer", HF, "--isl", "64", "--osl", str(max_tokens),
                   "--request-count", str(requests), "--concurrency", "4", "--random-seed", str(SEED),
                   "--extra-inputs", "temperature:0", "--use-server-token-count", "--ui-type", "none",
                   "--no-server-metrics", "--no-gpu-telemetry", "--artifact-dir", artifacts]
        env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
        try:
            done = subprocess.run(command, cwd=artifacts, env={**env, "COLUMNS": "160"}, capture_output=True,
                                  text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"aiperf could not run: {type(e).__name__}: {e}"
        console = pathlib.Path(artifacts) / "profile_export_console.txt"
        if done.returncode != 0 or not console.exists():
            return f"aiperf could not run (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}"
        return console.read_text()


def plinth_rows(prompts, requests, max_tokens, aiperf_requests):
    rows = []
    with tempfile.TemporaryDirectory(prefix="plinth-generate-") as folder:
        server = Plinth(repository(pathlib.Path(folder)))
        try:
            through_plinth(server, prompts, 16, 16, 4)  # warm: the plugin, and a batch growing to 16
            for streams in STREAMS:
                seconds, records, texts = through_plinth(server, prompts, requests, streams, max_tokens)
                rows.append({"peer": PLINTH, "streams": streams, "seconds": seconds,
                             "requests": records, "texts": texts})
            summary = aiperf(server, aiperf_requests, max_tokens)
        finally:
            server.stop()
    return rows, summary


def stats(row, reference):
    """The row's figures: requests, tokens, TTFT p50 and p99 (ms), median
    decode tokens/s per stream, aggregate tokens/s, and how many of its
    texts equal the reference's for the same prompt."""
    records = np.asarray(row["requests"], np.float64)
    ttft = records[:, 0] * 1000
    decoding = records[records[:, 1] > 1]
    same = sum(1 for i, text in row["texts"] if reference and reference.get(i) == text)
    return {"requests": len(records), "tokens": int(records[:, 1].sum()),
            "ttft_p50": float(np.percentile(ttft, 50)), "ttft_p99": float(np.percentile(ttft, 99)),
            "decode": float(np.median((decoding[:, 1] - 1) / decoding[:, 2])) if len(decoding) else float("nan"),
            "aggregate": float(records[:, 1].sum() / row["seconds"]), "same": f"{same}/{len(row['texts'])}"}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="16 tokens a request, 1 round, 8 aiperf requests")
    parser.add_argument("--rounds", type=int, help="requests per row, in sixteens (default 2; --quick: 1)")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 2)
    max_tokens = 16 if args.quick else 64
    aiperf_requests = 8 if args.quick else 32
    prompts = json.loads(PROMPTS.read_text())["completions"]
    requests = rounds * 16

    python = peers_python()
    load = os.getloadavg()[0]
    started = time.perf_counter()
    rows, summary = plinth_rows(prompts, requests, max_tokens, aiperf_requests)
    peers = subprocess.run([python, "-W", "ignore", ROOT / "bench/peers/generate_peers.py", INT4, HF, PROMPTS,
                            str(max_tokens), str(rounds)], capture_output=True, text=True,
                           env={**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"})
    notes = []
    for line in peers.stdout.splitlines():
        row = json.loads(line)
        if "error" in row:
            notes.append(f"{row['peer']}: could not run ({row['error']})")
        else:
            rows.append(row)
    if peers.returncode != 0:
        notes.append(f"the in-process peers exited with {peers.returncode}:\n{peers.stderr[-3000:]}")
    alone = next((r["texts"] for r in rows if r["peer"] == GENAI and r["streams"] == 1), [])
    reference = {i: text for i, text in reversed(alone)}
    figures = {(r["peer"], r["streams"]): stats(r, reference) for r in rows}

    print(f"SmolLM2-135M-Instruct int4 (transformers: fp32), {requests} requests a row of at most {max_tokens} tokens, "
          f"greedy, prompts of tests/fixtures/llm_prompts.json; one machine, {os.cpu_count()} cores, "
          f"load average {load:.2f} at the start; {time.perf_counter() - started:.0f} s")
    print(f"{'':34} {'streams/batch':>13} {'requests':>8} {'tokens':>6} {'TTFT p50 ms':>11} {'TTFT p99 ms':>11} "
          f"{'decode tok/s':>12} {'aggregate tok/s':>15} {'text = ORT GenAI':>16}")
    for (peer, streams), f in figures.items():
        print(f"{peer:34} {streams:>13} {f['requests']:>8} {f['tokens']:>6} {f['ttft_p50']:>11.1f} "
              f"{f['ttft_p99']:>11.1f} {f['decode']:>12.1f} {f['aggregate']:>15.1f} {f['same']:>16}")
    for note in notes:
        print(note)

    print()
    plinth = {s: figures.get((PLINTH, s)) for s in STREAMS}
    genai = {s: figures.get((GENAI, s)) for s in (1, 16)}
    goals = [("Plinth 1-stream decode tok/s / ORT GenAI 1-stream", plinth[1], genai[1], "decode", ">= 0.9",
              lambda r: r >= 0.9),
             ("Plinth 16-stream aggregate tok/s / Plinth 1-stream", plinth[16], plinth[1], "aggregate", ">= 3",
              lambda r: r >= 3),
             ("Plinth 16-stream aggregate tok/s / ORT GenAI batch of 16", plinth[16], genai[16], "aggregate", "> 1",
              lambda r: r > 1),
             ("TTFT p99, Plinth 16 streams / ORT GenAI batch of 16", plinth[16], genai[16], "ttft_p99", "< 1 (lower)",
              lambda r: r < 1)]
    for label, ours, theirs, figure, target, met in goals:
        if ours and theirs:
            ratio = ours[figure] / theirs[figure]
            print(f"{label:58} {ratio:>6.2f}   goal {target:<12} {'met' if met(ratio) else 'not met'}")
        else:
            print(f"{label:58} {'-':>6}   goal {target:<12} not measured")

    print(f"\naiperf 0.13.0, Plinth /v1/chat/completions streamed, {aiperf_requests} requests, concurrency 4, "
          f"synthetic 64-token user messages, at most {max_tokens} tokens:")
    print(summary, end="" if summary.endswith("\n") else "\n")


if __name__ == "__main__":
    main()

"""The in-process peers of bench/generate.py, run in their own venv
(.cache/bench/generate-peers): ONNX Runtime GenAI on the int4 export that
Plinth serves (`og.Generator`'s token loop, greedy), one prompt at a time
and static batches of 16 (its tokenizer pads the batch, `batch_size` in the
search options), and transformers' `generate` on the fp32 Hugging Face
folder, one prompt at a time and 16 at a time (left-padded), greedy.

Request i is prompt i % len(PROMPTS); each row generates ROUNDS x 16 of
them, MAX_TOKENS tokens at most (fewer if the model ends the text). A
token's time is when the loop has it: after `generate_next_token` (ONNX
Runtime GenAI), at the logits processor's call (transformers). A batch's
first token is every request's first token.

usage: generate_peers.py INT4 HF PROMPTS MAX_TOKENS ROUNDS
Prints one JSON object per line: {"peer", "streams", "seconds" (the row's
wall time), "requests": [[ttft_s, tokens, decode_s], ...] (decode_s: first
token to last), "texts": [[prompt index, generated text], ...]}, or {"peer",
"error"} for a peer that could not run.
"""

import json
import pathlib
import sys
import time

BATCH = 16


def report(peer, streams, seconds, requests, texts):
    print(json.dumps({"peer": peer, "streams": streams, "seconds": seconds, "requests": requests, "texts": texts}),
          flush=True)


def until_eos(ids, eos):
    """The generated ids before the first end-of-sequence id."""
    ids = [int(i) for i in ids]
    ends = [k for k, i in enumerate(ids) if i in eos]
    return ids[:ends[0]] if ends else ids


def batch_of(prompts, r):
    """Requests r x 16 to r x 16 + 15: the prompts of batch r."""
    return [prompts[i % len(prompts)] for i in range(r * BATCH, (r + 1) * BATCH)]


def record(start, times, tokens):
    """[ttft, tokens, decode seconds] of a request whose k-th token came at
    times[k]."""
    return [times[0] - start, tokens, times[tokens - 1] - times[0]]


def ort_genai(int4, prompts, max_tokens, rounds):
    import onnxruntime_genai as og

    model = og.Model(str(int4))
    tokenizer = og.Tokenizer(model)
    eos = set(tokenizer.eos_token_ids)

    def one(prompt, tokens):
        start = time.perf_counter()
        ids = tokenizer.encode(prompt)
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(ids) + tokens, batch_size=1)
        generator = og.Generator(model, params)
        generator.append_tokens(ids)
        times = []
        while not generator.is_done():
            generator.generate_next_token()
            times.append(time.perf_counter())
        out = until_eos(generator.get_sequence(0)[len(ids):], eos)
        return record(start, times, len(out)), tokenizer.decode(out)

    def batch(chunk, tokens):
        start = time.perf_counter()
        ids = tokenizer.encode_batch(chunk)
        length = ids.as_numpy().shape[1]
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=length + tokens, batch_size=len(chunk))
        generator = og.Generator(model, params)
        generator.append_tokens(ids)
        times = []
        while not generator.is_done():
            generator.generate_next_token()
            times.append(time.perf_counter())
        outs = [until_eos(generator.get_sequence(i)[length:], eos) for i in range(len(chunk))]
        return [record(start, times, len(out)) for out in outs], [tokenizer.decode(out) for out in outs]

    one(prompts[0], 4)  # warm
    requests, texts = [], []
    start = time.perf_counter()
    for i in range(rounds * BATCH):
        request, text = one(prompts[i % len(prompts)], max_tokens)
        requests.append(request)
        texts.append([i % len(prompts), text])
    report("ONNX Runtime GenAI (in-process)", 1, time.perf_counter() - start, requests, texts)

    batches("ONNX Runtime GenAI (in-process)", batch, prompts, max_tokens, rounds)


def hf_transformers(hf, prompts, max_tokens, rounds):
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(hf, padding_side="left")
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos]) | {tokenizer.eos_token_id}

    class Clock(transformers.LogitsProcessor):
        """Notes when each token's logits are ready (the greedy pick follows at once)."""

        def __init__(self):
            self.times = []

        def __call__(self, input_ids, scores):
            self.times.append(time.perf_counter())
            return scores

    def generate(chunk, tokens):
        start = time.perf_counter()
        inputs = tokenizer(chunk, return_tensors="pt", padding=True)
        clock = Clock()
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=tokens, do_sample=False,
                                 logits_processor=transformers.LogitsProcessorList([clock]),
                                 pad_token_id=tokenizer.pad_token_id)
        length = inputs["input_ids"].shape[1]
        outs = [until_eos(row[length:].tolist(), eos) for row in out]
        return ([record(start, clock.times, len(ids)) for ids in outs],
                [tokenizer.decode(ids, skip_special_tokens=True) for ids in outs])

    generate(prompts[:1], 4)  # warm
    requests, texts = [], []
    start = time.perf_counter()
    for i in range(rounds * BATCH):
        answered, generated = generate([prompts[i % len(prompts)]], max_tokens)
        requests += answered
        texts.append([i % len(prompts), generated[0]])
    report("transformers fp32 (in-process)", 1, time.perf_counter() - start, requests, texts)

    batches("transformers fp32 (in-process)", generate, prompts, max_tokens, rounds)


def batches(name, run, prompts, max_tokens, rounds):
    """`rounds` static batches of BATCH prompts through `run(prompts,
    max_tokens) -> (requests, texts)`, after a short warm-up batch; reported
    as `name`'s batch row."""
    run(batch_of(prompts, 0), 4)  # warm
    requests, texts = [], []
    start = time.perf_counter()
    for r in range(rounds):
        answered, generated = run(batch_of(prompts, r), max_tokens)
        requests += answered
        texts += [[(r * BATCH + i) % len(prompts), text] for i, text in enumerate(generated)]
    report(name, BATCH, time.perf_counter() - start, requests, texts)


def main(int4, hf, prompts, max_tokens, rounds):
    prompts = json.loads(pathlib.Path(prompts).read_text())["completions"]
    for peer, run, folder in (("ONNX Runtime GenAI (in-process)", ort_genai, int4),
                              ("transformers fp32 (in-process)", hf_transformers, hf)):
        try:
            run(folder, prompts, int(max_tokens), int(rounds))
        except Exception as e:  # a peer that cannot run is reported, not fatal
            print(json.dumps({"peer": peer, "error": f"{type(e).__name__}: {e}"}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])

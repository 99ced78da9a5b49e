"""Sequence batching through the real binary, with ONNX accumulators built
here: `OUTPUT = INPUT + READY * (1 - START) * INPUT_STATE`, `OUTPUT_STATE =
OUTPUT` (the state the host carries, as Triton's QA sequence models have
it) and `CORR_OUT = CORRID`. Checked: state kept per sequence and never
mixed, integer and string correlation ids, the CORRID control, `oldest`
running two sequences in one execution, the idle timeout with its error,
an initial state read from a file, order on a gRPC stream and a dropped
stream ending its sequence, Triton's errors, and a request that fails in
the model (alone, or in one execution with another sequence's) leaving its
sequence's state as it was."""

import json
import queue
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper, numpy_helper, save

from conftest import Plinth, metric, wait_until

CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: %s } ] }
  ]"""
STATE = """
  state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] %s } ]"""
IO = """
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def accumulator(folder, corrid_type, with_controls=True, checked=False):
    """Writes the accumulator to folder/1/model.onnx. `checked`: INPUT goes
    through a Gather from 0..99 first (the same value), so an INPUT of 100
    or more fails the execution (ONNX Runtime refuses the index)."""
    (folder / "1").mkdir(parents=True)
    value = lambda name, kind: helper.make_tensor_value_info(name, kind, ["batch", 1])  # noqa: E731
    inputs = [value("INPUT", TensorProto.INT32), value("INPUT_STATE", TensorProto.INT32)]
    outputs = [value("OUTPUT", TensorProto.INT32), value("OUTPUT_STATE", TensorProto.INT32)]
    if with_controls:
        inputs += [value("START", TensorProto.INT32), value("READY", TensorProto.INT32), value("CORRID", corrid_type)]
        outputs.append(value("CORR_OUT", corrid_type))
        nodes = [
            helper.make_node("Sub", ["one", "START"], ["not_start"]),
            helper.make_node("Mul", ["READY", "not_start"], ["keep"]),
            helper.make_node("Mul", ["INPUT_STATE", "keep"], ["carried"]),
            helper.make_node("Add", ["VALUE", "carried"], ["OUTPUT"]),
            helper.make_node("Identity", ["CORRID"], ["CORR_OUT"]),
        ]
    else:
        nodes = [helper.make_node("Add", ["VALUE", "INPUT_STATE"], ["OUTPUT"])]
    nodes.insert(0, helper.make_node("Gather", ["table", "INPUT"], ["VALUE"], axis=0) if checked
                 else helper.make_node("Identity", ["INPUT"], ["VALUE"]))
    nodes.append(helper.make_node("Identity", ["OUTPUT"], ["OUTPUT_STATE"]))
    initializers = [numpy_helper.from_array(np.ones([1], np.int32), "one")] if with_controls else []
    if checked:
        initializers.append(numpy_helper.from_array(np.arange(100, dtype=np.int32), "table"))
    graph = helper.make_graph(nodes, "acc", inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    save(model, folder / "1" / "model.onnx")


def add_model(repo, name, corrid_type, config, with_controls=True, checked=False):
    accumulator(repo / name, corrid_type, with_controls, checked)
    (repo / name / "config.pbtxt").write_text(config)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    uint64 = CONTROLS % "TYPE_UINT64"
    corr_io = 'output [ { name: "CORR_OUT" data_type: %s dims: [ 1 ] } ]\n'
    add_model(repo, "acc", TensorProto.UINT64,
              f"max_batch_size: 2\n{IO}{corr_io % 'TYPE_UINT64'}"
              f"sequence_batching {{ max_sequence_idle_microseconds: 60000000 {uint64} {STATE % ''} }}\n")
    add_model(repo, "acc_text", TensorProto.STRING,
              f"max_batch_size: 1\n{IO}{corr_io % 'TYPE_STRING'}"
              f"sequence_batching {{ max_sequence_idle_microseconds: 60000000 {CONTROLS % 'TYPE_STRING'} {STATE % ''} }}\n")
    # A batch forms only when two sequences are ready (the delay is a hang guard).
    add_model(repo, "acc_oldest", TensorProto.UINT64,
              f"max_batch_size: 2\n{IO}"
              "sequence_batching { max_sequence_idle_microseconds: 60000000 "
              "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 120000000 }"
              f" {uint64} {STATE % ''} }}\n")
    # The same with `checked` (an INPUT of 100 or more fails its execution),
    # alone or two sequences in one execution.
    add_model(repo, "acc_checked", TensorProto.UINT64,
              f"max_batch_size: 1\n{IO}sequence_batching {{ max_sequence_idle_microseconds: 60000000 "
              f"{uint64} {STATE % ''} }}\n", checked=True)
    add_model(repo, "acc_checked_pair", TensorProto.UINT64,
              f"max_batch_size: 2\n{IO}"
              "sequence_batching { max_sequence_idle_microseconds: 60000000 "
              "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] "
              f"max_queue_delay_microseconds: 120000000 }} {uint64} {STATE % ''} }}\n", checked=True)
    add_model(repo, "acc_idle", TensorProto.UINT64,
              f"max_batch_size: 1\n{IO}sequence_batching {{ max_sequence_idle_microseconds: 1000 {uint64} {STATE % ''} }}\n")
    initial = 'initial_state { data_type: TYPE_INT32 dims: [ 1 ] data_file: "hundred" }'
    add_model(repo, "acc_file", TensorProto.INT32,
              f"max_batch_size: 1\n{IO}sequence_batching {{ max_sequence_idle_microseconds: 60000000 {STATE % initial} }}\n",
              with_controls=False)
    (repo / "acc_file" / "initial_state").mkdir()
    (repo / "acc_file" / "initial_state" / "hundred").write_bytes(np.array([100], np.int32).tobytes())
    warm_up = ('model_warmup [ { name: "zeros" batch_size: 2 inputs { key: "INPUT" value: '
               '{ data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } } ]\n')
    add_model(repo, "acc_warm", TensorProto.UINT64,
              f"max_batch_size: 2\n{IO}{corr_io % 'TYPE_UINT64'}{warm_up}"
              f"sequence_batching {{ max_sequence_idle_microseconds: 60000000 {uint64} {STATE % ''} }}\n")
    bad = CONTROLS.replace('"READY"', '"NOPE"') % "TYPE_UINT64"
    add_model(repo, "acc_bad", TensorProto.UINT64, f"max_batch_size: 2\n{IO}sequence_batching {{ {bad} {STATE % ''} }}\n")
    plain = repo / "plain" / "1"
    plain.mkdir(parents=True)
    graph = helper.make_graph([helper.make_node("Identity", ["INPUT"], ["OUTPUT"])], "plain",
                              [helper.make_tensor_value_info("INPUT", TensorProto.INT32, ["batch", 1])],
                              [helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, ["batch", 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    save(model, plain / "model.onnx")
    (repo / "plain" / "config.pbtxt").write_text("max_batch_size: 2\n")
    plinth = Plinth(repo, "--strict-readiness", "false")
    yield plinth
    plinth.stop()


def infer(server, model, value, sequence_id=None, start=False, end=False):
    body = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [value]}],
            "parameters": {}}
    if sequence_id is not None:
        body["parameters"]["sequence_id"] = sequence_id
    if start:
        body["parameters"]["sequence_start"] = True
    if end:
        body["parameters"]["sequence_end"] = True
    request = urllib.request.Request(f"http://{server.url}/v2/models/{model}/infer", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            outputs = {o["name"]: o["data"][0] for o in json.load(response)["outputs"]}
            return 200, outputs
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)["error"]


def test_each_sequence_keeps_its_own_state_and_correlation_id(server):
    assert infer(server, "acc", 10, 1, start=True) == (200, {"OUTPUT": 10, "CORR_OUT": 1})
    assert infer(server, "acc", 100, 2**40, start=True) == (200, {"OUTPUT": 100, "CORR_OUT": 2**40})
    assert infer(server, "acc", 1, 1)[1]["OUTPUT"] == 11
    assert infer(server, "acc", 5, 2**40, end=True)[1]["OUTPUT"] == 105
    assert infer(server, "acc", 2, 1, end=True)[1]["OUTPUT"] == 13
    # A new START on the same id begins from nothing.
    assert infer(server, "acc", 7, 1, start=True, end=True)[1]["OUTPUT"] == 7
    stats = json.load(urllib.request.urlopen(f"http://{server.url}/v2/models/acc/stats"))["model_stats"][0]
    assert stats["inference_count"] == 6, stats


def test_string_correlation_ids_reach_a_string_corrid_control(server):
    assert infer(server, "acc_text", 3, "call-7", start=True) == (200, {"OUTPUT": 3, "CORR_OUT": "call-7"})
    assert infer(server, "acc_text", 4, "call-7", end=True)[1]["OUTPUT"] == 7
    status, error = infer(server, "acc", 1, "call-8", start=True)
    assert status == 400 and "takes integer correlation IDs" in error and "UINT64" in error, error


def test_triton_s_errors_for_requests_outside_a_sequence(server):
    status, error = infer(server, "acc", 1, 37469245)
    assert status == 400 and error.startswith(
        "inference request for sequence 37469245 to model 'acc' must specify the START flag on the first request"), error
    status, error = infer(server, "acc", 1, start=True)
    assert status == 400 and error.startswith(
        "inference request to model 'acc' must specify a non-zero or non-empty correlation ID"), error
    body = {"inputs": [{"name": "INPUT", "shape": [2, 1], "datatype": "INT32", "data": [1, 2]}],
            "parameters": {"sequence_id": 9, "sequence_start": True}}
    request = urllib.request.Request(f"http://{server.url}/v2/models/acc/infer", data=json.dumps(body).encode())
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert "must specify batch-size 1 due to requirements of sequence batcher" in json.load(refused.value)["error"]
    status, error = infer(server, "plain", 1, 5, start=True)
    assert status == 400 and "has no sequence_batching" in error and "'sequence_id'" in error, error


def test_oldest_runs_the_requests_of_two_sequences_in_one_execution(server):
    answers = {}

    def step(sequence_id, value, **flags):
        answers[(sequence_id, value)] = infer(server, "acc_oldest", value, sequence_id, **flags)[1]["OUTPUT"]

    for values, flags in (((1, 10), {"start": True}), ((2, 20), {}), ((3, 30), {"end": True})):
        pair = [threading.Thread(target=step, args=(sequence_id, value), kwargs=flags)
                for sequence_id, value in zip((11, 12), values)]
        for t in pair:
            t.start()
        for t in pair:
            t.join()
    assert answers[(11, 3)] == 6 and answers[(12, 30)] == 60, answers
    stats = json.load(urllib.request.urlopen(f"http://{server.url}/v2/models/acc_oldest/stats"))["model_stats"][0]
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in stats["batch_stats"]] == [(2, 3)], stats


def test_an_idle_sequence_is_released_and_a_late_request_says_why(server):
    assert infer(server, "acc_idle", 1, 5, start=True)[1]["OUTPUT"] == 1
    wait_until("the idle sequence is released", lambda: metric(server, "plinth_sequence_active", "acc_idle") == 0)
    status, error = infer(server, "acc_idle", 2, 5)
    assert status == 400 and "must specify the START flag" in error, error
    assert "released after 1000 µs without a request (max_sequence_idle_microseconds)" in error, error
    text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics").read().decode()
    assert 'plinth_sequence_ended_total{model="acc_idle",reason="IDLE",version="1"} 1' in text, text


def test_the_initial_state_comes_from_its_file(server):
    assert infer(server, "acc_file", 1, 3, start=True)[1]["OUTPUT"] == 101
    assert infer(server, "acc_file", 2, 3, end=True)[1]["OUTPUT"] == 103
    assert infer(server, "acc_file", 5, 4, start=True, end=True)[1]["OUTPUT"] == 105


def test_warm_up_runs_a_sequence_model_with_the_host_s_controls_and_state(server):
    # acc_warm is READY only if its warm-up sample (two rows) ran.
    assert infer(server, "acc_warm", 4, 1, start=True) == (200, {"OUTPUT": 4, "CORR_OUT": 1})
    assert infer(server, "acc_warm", 5, 1, end=True)[1]["OUTPUT"] == 9


def test_a_control_the_model_lacks_keeps_the_model_from_loading(server):
    index = json.load(urllib.request.urlopen(urllib.request.Request(
        f"http://{server.url}/v2/repository/index", data=b"{}", method="POST")))
    bad = next(m for m in index if m["name"] == "acc_bad")
    assert bad["state"] == "UNAVAILABLE", bad
    assert "control names input 'NOPE'" in bad["reason"], bad


def test_a_stream_keeps_a_sequence_s_order_and_a_dropped_stream_ends_it(server):
    answers = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    values = [1, 2, 3, 4, 5, 6, 7, 8]
    for i, v in enumerate(values):
        x = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        x.set_data_from_numpy(np.array([[v]], np.int32))
        # Sent without waiting: the stream must keep them in order.
        client.async_stream_infer("acc", [x], sequence_id=77, sequence_start=i == 0, sequence_end=False)
    sums = []
    for _ in values:
        result, error = answers.get(timeout=120)
        assert error is None, error
        sums.append(int(result.as_numpy("OUTPUT")[0][0]))
    assert sums == list(np.cumsum(values)), sums
    assert metric(server, "plinth_sequence_active", "acc") >= 1
    client.stop_stream()  # without the sequence's END
    wait_until("the stream's sequence ends", lambda: metric(server, "plinth_sequence_active", "acc") == 0)
    status, error = infer(server, "acc", 1, 77)
    assert status == 400 and "cancelled" in error, error
    client.close()


def test_a_failed_request_leaves_its_sequence_s_state_as_it_was(server):
    """docs/scheduling.md: a failed request leaves the state as it was. The
    sequence goes on from the state before the failure; the failure is the
    model's own (ONNX Runtime refuses the index), not a refusal before the
    request reached the sequence batcher."""
    assert infer(server, "acc_checked", 10, 31, start=True) == (200, {"OUTPUT": 10})
    for _ in range(2):
        status, error = infer(server, "acc_checked", 500, 31)
        assert status == 400 and "500" in error, (status, error)
    assert infer(server, "acc_checked", 5, 31)[1]["OUTPUT"] == 15, "the failures changed the state"
    assert infer(server, "acc_checked", 1, 31, end=True)[1]["OUTPUT"] == 16
    stats = json.load(urllib.request.urlopen(f"http://{server.url}/v2/models/acc_checked/stats"))["model_stats"][0]
    assert (stats["inference_stats"]["success"]["count"], stats["inference_stats"]["fail"]["count"]) == (3, 2), stats


def run_pairs(server, model, ids, steps):
    """Runs `steps` (values for the two sequences `ids`, and flags) one
    after another, the two requests of each step at once; the answers by
    (sequence id, value)."""
    answers = {}

    def step(sequence_id, value, **flags):
        answers[(sequence_id, value)] = infer(server, model, value, sequence_id, **flags)

    for values, flags in steps:
        pair = [threading.Thread(target=step, args=(sequence_id, value), kwargs=flags)
                for sequence_id, value in zip(ids, values)]
        for t in pair:
            t.start()
        for t in pair:
            t.join()
    return answers


def test_a_failed_request_in_a_shared_execution_moves_each_state_by_its_answered_requests_only(server):
    """Two sequences whose requests run in one execution (`oldest`, a
    batch of two): one request fails. Each state moves on by exactly the
    requests of its sequence that were answered: the failed one's not at
    all, the other's by its request if that was answered (see the next
    test for whether it is)."""
    answers = run_pairs(server, "acc_checked_pair", (41, 42),
                        [((1, 10), {"start": True}), ((2, 500), {}), ((3, 30), {"end": True})])
    assert answers[(41, 1)] == (200, {"OUTPUT": 1}) and answers[(42, 10)] == (200, {"OUTPUT": 10}), answers
    assert answers[(42, 500)][0] == 400 and "idx=500" in answers[(42, 500)][1], answers
    assert answers[(42, 30)] == (200, {"OUTPUT": 40}), "the failed request changed its sequence's state"
    carried = 1 + (2 if answers[(41, 2)][0] == 200 else 0)
    assert answers[(41, 3)] == (200, {"OUTPUT": carried + 3}), answers
    stats = json.load(urllib.request.urlopen(f"http://{server.url}/v2/models/acc_checked_pair/stats"))["model_stats"][0]
    shared = [b for b in stats["batch_stats"] if b["batch_size"] == 2]
    assert stats["execution_count"] >= 3 and shared, f"the pairs shared executions: {stats['batch_stats']}"


def test_only_the_request_at_fault_fails_a_shared_sequence_execution(server):
    """docs/scheduling.md (Overload): when the model refuses a batch's
    input, each request runs alone, so only the one at fault gets the 400;
    the other sequence's request is answered and its state moves on."""
    answers = run_pairs(server, "acc_checked_pair", (43, 44),
                        [((1, 10), {"start": True}), ((2, 500), {}), ((3, 30), {"end": True})])
    assert answers[(44, 500)][0] == 400, answers
    assert answers[(43, 2)] == (200, {"OUTPUT": 3}), answers
    assert answers[(43, 3)] == (200, {"OUTPUT": 6}), answers

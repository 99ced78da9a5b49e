"""Triton's rate limiter (--rate-limit=execution_count) against the real
binary, with Triton's L0_rate_limiter cases rebuilt on Plinth's identity
backend (Triton's custom_zero_1_float32 echoes its input after
execute_delay_ms, as the identity backend does; its instances are on the
CPU here) and its sequence case on an ONNX accumulator: the load failures
with Triton's texts, cross-model prioritization with limited (explicit and
implicit) and plenty of resources, two instances of one model, and a
sequence kept on one instance. Then the acceptance of Plinth's own: two
models sharing one resource of count 1 never execute at once, asserted
from the execution timestamps of every request (the `compute` spans of
request tracing), and the wait shows in the metrics; with two copies, or
with the rate limiter off (its settings and flag accepted, not applied),
they do run at once, as does an instance whose group lists no resources.
The same acceptance over real ONNX Runtime sessions doing real work.

Triton's dynamic batching case is not rebuilt: it relies on Triton's
TRITONSERVER_DELAY_SCHEDULER test hook, which holds Triton's scheduler
until 8 requests are queued; Plinth has no such hook."""

import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import HANG_GUARD_S, Plinth, metric, wait_until
from test_sequences import CONTROLS, STATE, accumulator
from test_tracing import http_collector, tracing_flags  # noqa: F401 (a fixture)
from onnx import TensorProto, helper, numpy_helper, save

# Triton's L0 client: 80 requests per model, 8 in flight, stop when one model has sent 80.
INFERENCE_COUNT = 80
CONCURRENCY = 8
DELAY_MS = 50

FIRST = "custom_zero_1_float32"
SECOND = "custom_zero_1_float32_v2"


def zero_model(repo, name, groups):
    """Triton's custom_zero_1_float32 as an identity model: INPUT0 → OUTPUT0
    (FP32, dims [-1], max_batch_size 4) after DELAY_MS, with `groups`'
    instance groups, each a rate_limiter text."""
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    instance_groups = ", ".join(f"{{ kind: KIND_CPU count: {count} rate_limiter {{ {limiter} }} }}"
                                for count, limiter in groups)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "identity"\nmax_batch_size: 4\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        f"instance_group [ {instance_groups} ]\n"
        f'parameters {{ key: "execute_delay_ms" value: {{ string_value: "{DELAY_MS}" }} }}\n')


FIRST_LIMITER = 'resources [ { name: "resource1" count: 4 } ]'
SECOND_LIMITER = 'resources [ { name: "resource1" count: 2 }, { name: "resource2" global: true count: 2 } ] priority: 2'


def two_models(repo):
    zero_model(repo, FIRST, [(1, FIRST_LIMITER)])
    zero_model(repo, SECOND, [(1, SECOND_LIMITER)])
    return repo


def reason(server, model):
    index = httpclient.InferenceServerClient(server.url).get_model_repository_index()
    return next(row.get("reason", "") for row in index if row["name"] == model)


def start(repo, *flags):
    return Plinth(repo, "--rate-limit=execution_count", *flags)


@pytest.mark.parametrize("flags, model, message", [
    # Case 1: both resources lesser than required.
    (["--rate-limit-resource=resource1:1"], FIRST,
     'Resource count for "resource1" is limited to 1 which will prevent scheduling of one or more model instances, '
     "the minimum required count is 4"),
    # Case 2: resources sufficient only for one model.
    (["--rate-limit-resource=resource1:3", "--rate-limit-resource=resource2:2"], FIRST,
     'Resource count for "resource1" is limited to 3 which will prevent scheduling of one or more model instances, '
     "the minimum required count is 4"),
    # Case 3: the resource given only for another device.
    (["--rate-limit-resource=resource1:10:10", "--rate-limit-resource=resource2:2"], FIRST,
     'Resource count for "resource1" is limited to 0 which will prevent scheduling of one or more model instances, '
     "the minimum required count is 4"),
])
def test_l0_models_the_resources_cannot_serve_fail_to_load(tmp_path, flags, model, message):
    server = start(two_models(tmp_path), *flags)
    try:
        assert message in reason(server, model), reason(server, model)
    finally:
        server.stop()


def test_l0_conflicting_resource_types_fail_to_load(tmp_path):
    # Case 4: resource2 global in one model, per device in another.
    repo = two_models(tmp_path)
    zero_model(repo, "custom_zero_1_float32_v3", [(1, SECOND_LIMITER.replace("global: true", "global: false"))])
    server = start(repo)
    try:
        reasons = [reason(server, m) for m in (SECOND, "custom_zero_1_float32_v3")]
        message = ('Resource "resource2" is present as both global and device-specific resource in the model '
                   "configuration.")
        assert any(message in r for r in reasons), reasons
    finally:
        server.stop()


def stress(server, models):
    """Triton's L0 client: each model gets requests with CONCURRENCY in
    flight until one of them has sent INFERENCE_COUNT; every answer must
    echo its input. The successful inferences of each model from its
    statistics: once every request is answered (Triton's counts), and at
    the moment the sending stopped, while every model still had requests
    waiting (the share under saturation)."""
    stop = threading.Event()
    sent = {m: 0 for m in models}
    failures = []
    at_stop = {}
    lock = threading.Lock()

    def successes():
        client = httpclient.InferenceServerClient(server.url)
        counts = {}
        for m in models:
            stats = client.get_inference_statistics(m)["model_stats"][0]
            counts[m] = stats["inference_stats"]["success"]["count"]
        return counts

    before = successes()

    def sender(model):
        client = grpcclient.InferenceServerClient(server.grpc_url)
        while True:
            with lock:
                if stop.is_set():
                    return
                sent[model] += 1
                if sent[model] == INFERENCE_COUNT:
                    stop.set()
                    at_stop.update(successes())
            data = np.random.random_sample([1, 1]).astype(np.float32)
            tensor = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
            tensor.set_data_from_numpy(data)
            try:
                answer = client.infer(model, [tensor], client_timeout=HANG_GUARD_S).as_numpy("OUTPUT0")
                if not np.array_equal(answer, data):
                    failures.append((model, "the output does not match the input"))
            except Exception as e:  # every failure is the test's finding
                failures.append((model, repr(e)))

    threads = [threading.Thread(target=sender, args=(m,)) for m in models for _ in range(CONCURRENCY)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=HANG_GUARD_S * 2)
    assert not any(t.is_alive() for t in threads), "a client is still waiting for its answer"
    assert not failures, failures[:3]
    after = successes()
    final = {m: after[m] - before[m] for m in models}
    saturated = {m: at_stop[m] - before[m] for m in models}
    return final, saturated


@pytest.mark.parametrize("flags", [
    ["--rate-limit-resource=resource1:4", "--rate-limit-resource=resource2:2"],  # CASE1: explicit, limited
    [],  # CASE2: implicit, limited (the largest need, 4, is the count)
], ids=["explicit", "implicit"])
def test_l0_cross_model_prioritization_limited_resource(tmp_path, flags):
    server = start(two_models(tmp_path), *flags)
    try:
        counts, saturated = stress(server, [FIRST, SECOND])
        ratio = saturated[FIRST] / saturated[SECOND]
        print(f"limited resource: {counts} (ratio {counts[FIRST] / counts[SECOND]:.2f} with the requests in flight "
              f"at the end), {saturated} while both had requests waiting (ratio {ratio:.2f})")
        assert ratio > 1.80, f"got infer ratio across models {ratio}, expected closer to 2 ({saturated})"
    finally:
        server.stop()


def test_l0_cross_model_prioritization_plenty_resource(tmp_path):
    # CASE3: resources for both at once: priorities do not matter.
    server = start(two_models(tmp_path), "--rate-limit-resource=resource1:6", "--rate-limit-resource=resource2:2")
    try:
        counts, _ = stress(server, [FIRST, SECOND])
        print(f"plenty resource: {counts}")
        assert abs(counts[FIRST] - counts[SECOND]) < 10, counts
    finally:
        server.stop()


def one_model_two_instances(repo):
    zero_model(repo, FIRST, [(1, FIRST_LIMITER), (1, SECOND_LIMITER)])
    return repo


@pytest.mark.parametrize("flags, overlap", [
    ([], False),  # limited: only one instance at a time
    (["--rate-limit-resource=resource1:6", "--rate-limit-resource=resource2:2"], True),  # plenty: both at once
], ids=["limited", "plenty"])
def test_l0_single_model_with_two_instances(tmp_path, http_collector, flags, overlap):
    """Triton compares the run's duration with limited and plenty of
    resources; here the execution timestamps show whether the two
    instances ever ran at once."""
    server = start(one_model_two_instances(tmp_path), *flags, *tracing_flags(http_collector))
    try:
        since = len(http_collector.spans)
        counts, _ = stress(server, [FIRST])
        assert counts[FIRST] == INFERENCE_COUNT, counts
        intervals = compute_intervals(http_collector, since, counts[FIRST])
        assert overlapping(intervals[FIRST], intervals[FIRST]) == overlap
    finally:
        server.stop()


def test_l0_single_model_instances_the_resources_cannot_serve_fail_to_load(tmp_path):
    # Case 3 of the multi-instance cases.
    server = start(one_model_two_instances(tmp_path), "--rate-limit-resource=resource1:3",
                   "--rate-limit-resource=resource2:2")
    try:
        assert ('Resource count for "resource1" is limited to 3 which will prevent scheduling of one or more model '
                "instances, the minimum required count is 4") in reason(server, FIRST)
    finally:
        server.stop()


def test_l0_a_sequence_stays_on_one_instance_whatever_the_priorities(tmp_path):
    """Triton's sequence case: four instances in three groups of different
    priorities; one sequence of 1..9 accumulates to 45 and every request
    runs."""
    model = "custom_sequence_int32"
    accumulator(tmp_path / model, TensorProto.INT32)
    groups = [(1, FIRST_LIMITER), (1, SECOND_LIMITER), (2, SECOND_LIMITER.replace("priority: 2", "priority: 3"))]
    instance_groups = ", ".join(f"{{ kind: KIND_CPU count: {c} rate_limiter {{ {l} }} }}" for c, l in groups)
    (tmp_path / model / "config.pbtxt").write_text(
        'max_batch_size: 1\ninput [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        f"instance_group [ {instance_groups} ]\n"
        f"sequence_batching {{ max_sequence_idle_microseconds: 60000000 {CONTROLS % 'TYPE_INT32'} {STATE % ''} }}\n")
    server = start(tmp_path)
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        for value in range(1, 10):
            tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
            answer = client.infer(model, [tensor], sequence_id=4000, sequence_start=value == 1,
                                  sequence_end=value == 9)
            total = answer.as_numpy("OUTPUT")[0][0]
        assert total == 45
        stats = client.get_inference_statistics(model).model_stats[0]
        assert (stats.inference_count, stats.execution_count, stats.inference_stats.success.count) == (9, 9, 9)
    finally:
        server.stop()


def compute_intervals(collector, since, at_least):
    """(start, end) in ns of each execution among the spans received after
    the first `since`, by model: the `compute` span of each request (its
    parent is the request's model span, named after the model)."""
    def collected():
        with collector.lock:
            spans = collector.spans[since:]
        return sum(1 for s in spans if s["name"] == "compute") >= at_least

    wait_until("the executions' spans are exported", collected)
    with collector.lock:
        spans = collector.spans[since:]
    by_id = {s["id"]: s for s in spans}
    intervals = {}
    for s in spans:
        if s["name"] == "compute" and s["parent"] in by_id:
            intervals.setdefault(by_id[s["parent"]]["name"], []).append((s["start"], s["end"]))
    return intervals


# Timestamps are the request's arrival plus durations measured apart: a
# millisecond of slack, against executions of DELAY_MS.
SLACK_NS = 1_000_000


def overlapping(a, b):
    """Whether an interval of `a` and one of `b` (other than itself) run at
    the same time for more than SLACK_NS."""
    return any(x is not y and x[0] < y[1] - SLACK_NS and y[0] < x[1] - SLACK_NS for x in a for y in b)


@pytest.mark.parametrize("mode, copies, together", [
    ("execution_count", 1, False),
    ("execution_count", 2, True),
    # Off, as in Triton: the rate_limiter settings and the flag are accepted and not applied.
    ("off", 1, True),
], ids=["one-copy", "two-copies", "off"])
def test_two_models_sharing_one_copy_never_execute_at_once(tmp_path, http_collector, mode, copies, together):
    """With one copy of the resource both models need, no execution of
    one overlaps an execution of the other, by their timestamps; with two
    copies, or with the rate limiter off, they do overlap, so the check can
    see it. The wait is reported in the queue time and in its own series."""
    for name in ("a", "b"):
        zero_model(tmp_path, name, [(1, 'resources [ { name: "gpu_mem" count: 1 } ]')])
    server = Plinth(tmp_path, f"--rate-limit={mode}", f"--rate-limit-resource=gpu_mem:{copies}",
                    *tracing_flags(http_collector))
    try:
        if mode == "off":
            assert server.wait_for_log(r"--rate-limit-resource not applied: --rate-limit is off")
            assert server.wait_for_log(r"rate_limiter settings not applied: --rate-limit is off")
        since = len(http_collector.spans)
        counts, _ = stress(server, ["a", "b"])
        intervals = compute_intervals(http_collector, since, sum(counts.values()))
        assert len(intervals["a"]) >= counts["a"] and len(intervals["b"]) >= counts["b"]
        assert overlapping(intervals["a"], intervals["b"]) == together, counts
        for model in ("a", "b"):
            waited = metric(server, "plinth_inference_rate_limiter_wait_us", model)
            queued = metric(server, "nv_inference_queue_duration_us", model)
            if mode == "off":
                assert waited == 0, (model, waited)
            elif not together:
                assert 0 < waited <= queued, (model, waited, queued)
    finally:
        server.stop()


def busy_onnx_model(repo, name, limiter):
    """An ONNX model with the zero model's tensors whose execution is real
    work for ONNX Runtime: twenty 256x256 matrix products on weights that
    depend on the input (so nothing is folded at load), added to the input
    times zero; OUTPUT0 equals INPUT0. One instance, `limiter` its
    rate_limiter text."""
    (repo / name / "1").mkdir(parents=True)
    value = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "n"])  # noqa: E731
    weights = np.random.RandomState(0).rand(256, 256).astype(np.float32) / 256
    nodes = [helper.make_node("ReduceSum", ["INPUT0"], ["total"], keepdims=0),
             helper.make_node("Mul", ["total", "zero"], ["nothing"]),
             helper.make_node("Add", ["W", "nothing"], ["m0"])]
    nodes += [helper.make_node("MatMul", [f"m{i}", "W"], [f"m{i + 1}"]) for i in range(20)]
    nodes += [helper.make_node("ReduceSum", ["m20"], ["product"], keepdims=0),
              helper.make_node("Mul", ["product", "zero"], ["none"]),
              helper.make_node("Add", ["INPUT0", "none"], ["OUTPUT0"])]
    initializers = [numpy_helper.from_array(weights, "W"), numpy_helper.from_array(np.zeros((), np.float32), "zero")]
    graph = helper.make_graph(nodes, name, [value("INPUT0")], [value("OUTPUT0")], initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    save(model, repo / name / "1/model.onnx")
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        f"instance_group [ {{ kind: KIND_CPU count: 1 rate_limiter {{ {limiter} }} }} ]\n")


@pytest.mark.parametrize("copies, together", [(1, False), (2, True)], ids=["one-copy", "two-copies"])
def test_onnx_runtime_instances_sharing_one_copy_never_execute_at_once(tmp_path, http_collector, copies, together):
    """The acceptance above over real ONNX Runtime sessions instead of the
    identity backend's sleep: with one copy of the resource both models'
    instances need, no session run of one overlaps a run of the other;
    with two, they do."""
    for name in ("a", "b"):
        busy_onnx_model(tmp_path, name, 'resources [ { name: "cores" count: 1 } ]')
    server = Plinth(tmp_path, "--rate-limit=execution_count", f"--rate-limit-resource=cores:{copies}",
                    *tracing_flags(http_collector))
    try:
        since = len(http_collector.spans)
        counts, _ = stress(server, ["a", "b"])
        intervals = compute_intervals(http_collector, since, sum(counts.values()))
        assert len(intervals["a"]) >= counts["a"] and len(intervals["b"]) >= counts["b"]
        assert overlapping(intervals["a"], intervals["b"]) == together, counts
    finally:
        server.stop()


def test_the_rate_limiter_is_off_by_default(tmp_path):
    for name in ("a", "b"):
        zero_model(tmp_path, name, [(1, 'resources [ { name: "gpu_mem" count: 1 } ]')])
    server = Plinth(tmp_path)
    try:
        assert server.wait_for_log(r"rate_limiter settings not applied: --rate-limit is off")
        assert httpclient.InferenceServerClient(server.url).is_model_ready("a")
    finally:
        server.stop()


def test_an_instance_that_lists_no_resources_is_not_limited(tmp_path, http_collector):
    """Model `a` needs the one copy of `gpu_mem`; model `b`'s group has a
    rate_limiter with a priority and no resources, so it runs whenever it
    has work, alongside `a`."""
    zero_model(tmp_path, "a", [(1, 'resources [ { name: "gpu_mem" count: 1 } ]')])
    zero_model(tmp_path, "b", [(1, "priority: 5")])
    server = start(tmp_path, *tracing_flags(http_collector))
    try:
        since = len(http_collector.spans)
        counts, _ = stress(server, ["a", "b"])
        intervals = compute_intervals(http_collector, since, sum(counts.values()))
        assert overlapping(intervals["a"], intervals["b"]), counts
        assert metric(server, "plinth_inference_rate_limiter_wait_us", "b") == 0
    finally:
        server.stop()


def test_a_resource_name_keeps_its_case_and_an_empty_name_or_no_copies_stop_start_up(tmp_path):
    """`--rate-limit-resource R:1` gives `R` (as written, as Triton reads
    it) its copy; `:1` and `R:0` are refused at start, naming why."""
    import os
    import subprocess
    from conftest import ROOT
    zero_model(tmp_path, "upper", [(1, 'resources [ { name: "R" count: 1 } ]')])
    server = start(tmp_path, "--rate-limit-resource=R:1")
    try:
        client = httpclient.InferenceServerClient(server.url)
        tensor = httpclient.InferInput("INPUT0", [1, 3], "FP32")
        tensor.set_data_from_numpy(np.array([[1, 2, 3]], np.float32))
        assert client.infer("upper", [tensor]).as_numpy("OUTPUT0").tolist() == [[1, 2, 3]]
    finally:
        server.stop()
    binary = os.environ.get("PLINTH_BIN", str(ROOT / "target/release/plinth"))
    for flag, words in [(":1", "the resource name is empty"), ("R:0", "count must be 1 or more")]:
        result = subprocess.run([binary, "serve", "--model-repository", str(tmp_path), "--rate-limit=execution_count",
                                 f"--rate-limit-resource={flag}"], capture_output=True, text=True, timeout=HANG_GUARD_S)
        assert result.returncode != 0, result.stderr
        assert words in result.stderr and "--rate-limit-resource" in result.stderr, result.stderr

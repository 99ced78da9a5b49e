"""`plinth check` says what `plinth serve` does, for the families of Triton's
qa/L0_model_config besides the ensembles (test_check_agrees.py has those),
as those cases describe them, written afresh here:

- configurations refused on their own (the noautofill_platform cases:
  dims and reshape, batch sizes, priority levels and queue policies,
  instance groups, sequence controls, fields of the wrong platform), each
  without a version folder, as there, so that the configuration alone
  decides;
- configurations refused against their model file (the autofill onnx
  cases: unknown, missing and extra tensors, data types, dimensions, a model
  that does not batch);
- configurations both accept (the autofill success cases);
- a model whose load depends on a flag (a response cache), which check
  passes exactly when serve, given the same flag, serves it.

The repository is checked, then served in control mode `none`: every model
check refuses is one the repository index shows UNAVAILABLE, with the line
check prints made of the index row, and each refusal carries the words of
Triton's message for the case."""

import json
import os
import subprocess
import urllib.request

import pytest
from onnx import TensorProto, helper, save

from conftest import HANG_GUARD_S, ROOT, Plinth

BINARY = os.environ.get("PLINTH_BIN", str(ROOT / "target/release/plinth"))

IO = ('input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
      'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')


def control(name, kind, values="int32_false_true: [ 0, 1 ]"):
    return f'{{ name: "{name}" control [ {{ kind: CONTROL_SEQUENCE_{kind} {values} }} ] }}'


def sequence(*controls):
    return f"sequence_batching {{ control_input [ {', '.join(controls)} ] }}\n"


def tensor(name, dims, extra="", dtype="TYPE_FP32"):
    return f'{{ name: "{name}" data_type: {dtype} dims: {dims} {extra} }}'


# Configurations refused before any model file is read: name ->
# (config.pbtxt after `platform: "onnxruntime_onnx"`, words of Triton's
# message that Plinth's must carry).
CONFIG_REFUSED = {
    "zero_dims": (f"max_batch_size: 4\ninput [ {tensor('input', '[ 4, 0 ]')} ]\n"
                  f"output [ {tensor('output', '[ 1 ]')} ]\n",
                  ["input 'input'", "dimension", "-1", "variable"]),
    "zero_reshape": (f"max_batch_size: 4\ninput [ {tensor('input', '[ 4 ]', 'reshape { shape: [ 2, 0 ] }')} ]\n"
                     f"output [ {tensor('output', '[ 1 ]')} ]\n",
                     ["input 'input'", "reshape dimension", "variable-size dimension"]),
    "reshape_other_size": (f"max_batch_size: 4\ninput [ {tensor('input', '[ 2, 3 ]')} ]\n"
                           f"output [ {tensor('output', '[ 6 ]', 'reshape { shape: [ 7 ] }')} ]\n",
                           ["output 'output'", "different", "'dims'", "'reshape'"]),
    "reshape_more_variable": (f"max_batch_size: 4\ninput [ {tensor('input', '[ 3, -1 ]', 'reshape { shape: [ -1, 3, -1 ] }')} ]\n"
                              f"output [ {tensor('output', '[ 1 ]')} ]\n",
                              ["input 'input'", "different numbers of variable-size dimensions"]),
    "empty_reshape_no_batch": (f"max_batch_size: 0\ninput [ {tensor('input', '[ 1 ]')} ]\n"
                               f"output [ {tensor('output', '[ 1 ]', 'reshape { shape: [ ] }')} ]\n",
                               ["output 'output'", "empty 'reshape'", "scalar"]),
    "negative_batch": ("max_batch_size: -3\n" + IO, ["'max_batch_size'", "non-negative"]),
    # Plinth's own parameters (Triton has no such keys): every bad one named.
    "bad_parameters": (IO + "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in [
                           ("pinned", "yes"), ("plugin.timout_ms", "5"), ("gpu_swap_policy", "swap"),
                           ("remote.retries", "many"), ("labels", "a plugin's own key")]),
                       ["'pinned'", "'plugin.timout_ms'", "'gpu_swap_policy'", "'remote.retries'"]),
    "default_level_outside": ("max_batch_size: 8\ndynamic_batching { priority_levels: 4 default_priority_level: 6 }\n" + IO,
                              ["default priority level", "range [1, 4]"]),
    "queue_policy_level_outside": ("max_batch_size: 8\ndynamic_batching { priority_levels: 2 default_priority_level: 1 "
                                   "priority_queue_policy { key: 5 value: { max_queue_size: 2 } } }\n" + IO,
                                   ["priority queue policy", "priority level", "range [1, 2]"]),
    "ordering_with_levels": ("max_batch_size: 8\ndynamic_batching { preserve_ordering: true priority_levels: 2 "
                             "default_priority_level: 2 }\n" + IO,
                             ["one priority level", "'preserve_ordering'"]),
    "ordering_with_delay": ("max_batch_size: 8\ndynamic_batching { preserve_ordering: true default_queue_policy { "
                            "timeout_action: DELAY default_timeout_microseconds: 50 } }\n" + IO,
                            ["queue policy", "DELAY", "timeout action", "'preserve_ordering'"]),
    "cpu_group_with_gpus": ("max_batch_size: 8\ninstance_group [ { kind: KIND_CPU gpus: [ 1 ] } ]\n" + IO,
                            ["instance group", "KIND_CPU", "GPUs"]),
    "negative_gpu_id": ("max_batch_size: 8\ninstance_group [ { count: 2 kind: KIND_GPU gpus: [ 0, -2 ] } ]\n" + IO,
                        ["instance group", "gpu id -2", "invalid"]),
    "steps_outside_an_ensemble": ("max_batch_size: 8\nensemble_scheduling { step [ { model_name: \"other\" "
                                  "model_version: -1 input_map { key: \"x\" value: \"INPUT\" } output_map { key: \"y\" "
                                  "value: \"OUTPUT\" } } ] }\n" + IO,
                                  ["ensemble scheduling cannot be set", "platform"]),
    "no_data_type": ('max_batch_size: 4\ninput [ { name: "input" dims: [ 3 ] } ]\n'
                     f"output [ {tensor('output', '[ 3 ]')} ]\n",
                     ["input 'input'", "'data_type'"]),
    "two_end_controls": ("max_batch_size: 8\n" + sequence(control("S", "START"), control("E1", "END"),
                                                          control("E2", "END")) + IO,
                         ["multiple", "CONTROL_SEQUENCE_END", "tensors"]),
    "one_tensor_two_controls": ("max_batch_size: 8\n" + sequence(control("S", "START"), control("S", "READY")) + IO,
                                ["'S'", "multiple control kinds"]),
    "control_without_values": ("max_batch_size: 8\n" + sequence(control("S", "START"), control("R", "READY", "")) + IO,
                               ["CONTROL_SEQUENCE_READY", "'int32_false_true', 'fp32_false_true' or 'bool_false_true'"]),
}

# The same with a platform of its own: name -> (whole config, words).
CONFIG_REFUSED_PLATFORM = {
    "misspelt_platform": ('platform: "onnxruntime_onx"\nmax_batch_size: 8\n' + IO,
                          ["'onnxruntime_onx'", "platform", "backend", "pair"]),
}


def add_sub_model(path, batch):
    """INPUT0, INPUT1 INT32 [16] (batched: [-1, 16]) -> OUTPUT0 = their sum,
    OUTPUT1 = their difference, as INT8: the tensors of the ONNX model in
    Triton's autofill cases."""
    shape = ["N", 16] if batch else [16]
    nodes = [helper.make_node("Add", ["INPUT0", "INPUT1"], ["SUM"]),
             helper.make_node("Sub", ["INPUT0", "INPUT1"], ["DIFF"]),
             helper.make_node("Cast", ["SUM"], ["OUTPUT0"], to=TensorProto.INT8),
             helper.make_node("Cast", ["DIFF"], ["OUTPUT1"], to=TensorProto.INT8)]
    graph = helper.make_graph(
        nodes, "add_sub",
        [helper.make_tensor_value_info(n, TensorProto.INT32, shape) for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, TensorProto.INT8, shape) for n in ("OUTPUT0", "OUTPUT1")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # ONNX Runtime 1.31 reads no newer
    path.parent.mkdir(parents=True, exist_ok=True)
    save(model, path)


def io_config(batch=4, inputs=("INPUT0", "INPUT1"), outputs=("OUTPUT0", "OUTPUT1"), dims=None, types=None):
    """A configuration of the add/sub model with the tensors named; `dims` and
    `types` override a tensor's dims or data type by name."""
    dims, types = dims or {}, types or {}
    def one(name, default_type):
        return tensor(name, dims.get(name, "[ 16 ]"), dtype=types.get(name, default_type))
    return (f"max_batch_size: {batch}\n"
            f"input [ {', '.join(one(n, 'TYPE_INT32') for n in inputs)} ]\n"
            f"output [ {', '.join(one(n, 'TYPE_INT8') for n in outputs)} ]\n")


# Configurations refused against the model file: name -> (config.pbtxt
# without a platform, as Triton's autofill cases have none, whether the model
# batches, words of Triton's message).
MODEL_REFUSED = {
    "unknown_input": (io_config(inputs=("INPUT0", "INPUT_UNKNOWN")), True,
                      ["unexpected", "input 'INPUT_UNKNOWN'", "INPUT0", "INPUT1"]),
    "unknown_output": (io_config(outputs=("OUTPUT_UNKNOWN",)), True,
                       ["unexpected", "output 'OUTPUT_UNKNOWN'", "OUTPUT0", "OUTPUT1"]),
    "too_many_inputs": (io_config(inputs=("INPUT0", "INPUT1", "INPUT_EXTRA")), True,
                        ["the model provides 2 inputs", "expects 3"]),
    "too_few_inputs": (io_config(inputs=("INPUT1",)), True, ["the model provides 2 inputs", "expects 1"]),
    "bad_input_dims": (io_config(dims={"INPUT0": "[ 16, 1 ]"}), True,
                       ["input 'INPUT0'", "expects 2 dimensions", "[-1, 16]", "complete shape [-1, 16, 1]"]),
    "bad_output_dims": (io_config(dims={"OUTPUT1": "[ 1 ]"}), True,
                        ["output 'OUTPUT1'", "expects shape [-1, 16]", "complete shape [-1, 1]"]),
    "bad_input_type": (io_config(types={"INPUT1": "TYPE_FP16"}), True,
                       ["input 'INPUT1'", "unexpected datatype", "TYPE_FP16", "TYPE_INT32"]),
    "batch_on_a_model_without": (io_config(batch=1), False, ["does not support batching", "max_batch_size"]),
}

# Accepted by Triton and by both: name -> (config.pbtxt or None, whether the
# model batches).
ACCEPTED = {
    "no_config": (None, True),
    "empty_config": ("", True),
    "no_batch_cpu": ('instance_group [ { kind: KIND_CPU } ]\n', False),
    "full_config": ('platform: "onnxruntime_onnx"\nversion_policy: { latest { num_versions: 1 } }\n'
                    + io_config(batch=8) + 'instance_group [ { kind: KIND_CPU count: 2 } ]\n'
                    'dynamic_batching { priority_levels: 2 default_priority_level: 2 preferred_batch_size: [ 4 ] }\n',
                    True),
    "in_order": (io_config(batch=8) + "dynamic_batching { preserve_ordering: true }\n", True),
}

INVALID = {**CONFIG_REFUSED, **CONFIG_REFUSED_PLATFORM, **MODEL_REFUSED}


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("configs")
    for name, (config, _) in CONFIG_REFUSED.items():
        (repo / name).mkdir()
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nplatform: "onnxruntime_onnx"\n{config}')
    for name, (config, _) in CONFIG_REFUSED_PLATFORM.items():
        (repo / name).mkdir()
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}')
    for name, (config, batch, _) in MODEL_REFUSED.items():
        add_sub_model(repo / name / "1" / "model.onnx", batch)
        (repo / name / "config.pbtxt").write_text(config)
    for name, (config, batch) in ACCEPTED.items():
        add_sub_model(repo / name / "1" / "model.onnx", batch)
        if config is not None:
            (repo / name / "config.pbtxt").write_text(config)
    return repo


def check(repository, *flags):
    env = dict(os.environ, ORT_DYLIB_PATH=str(ROOT / ".cache/onnxruntime/libonnxruntime.so"))
    return subprocess.run([BINARY, "check", "--model-repository", str(repository), "--plugin-cache-dir", "none", *flags],
                          capture_output=True, text=True, env=env, timeout=HANG_GUARD_S)


def index(repository, *flags):
    server = Plinth(repository, *flags)
    try:
        request = urllib.request.Request(f"http://{server.url}/v2/repository/index", data=b"{}", method="POST")
        return json.load(urllib.request.urlopen(request, timeout=HANG_GUARD_S))
    finally:
        server.stop()


def line_of(row):
    """The line `plinth check` prints for a row of the index that is not READY."""
    version = f" version {row['version']}" if row.get("version") else ""
    return f"model '{row['name']}'{version}: {row['reason']}"


@pytest.fixture(scope="module")
def checked(repository):
    result = check(repository)
    assert result.returncode == 1, result.stdout + result.stderr
    return result.stdout.splitlines()


@pytest.fixture(scope="module")
def served(repository):
    return index(repository)


def test_check_prints_the_index_rows_serve_does_not_serve_and_nothing_else(checked, served):
    assert sorted(checked) == sorted(line_of(row) for row in served if row["state"] != "READY")
    unavailable = {row["name"] for row in served if row["state"] != "READY"}
    assert unavailable == set(INVALID)
    assert {row["name"] for row in served} == set(INVALID) | set(ACCEPTED)


@pytest.mark.parametrize("name", sorted(CONFIG_REFUSED) + sorted(CONFIG_REFUSED_PLATFORM))
def test_a_configuration_is_refused_before_any_version_in_tritons_words(name, checked):
    words = INVALID[name][-1]
    line = next(l for l in checked if l.startswith(f"model '{name}'"))
    assert line.startswith(f"model '{name}': "), "refused as a model, before its versions: " + line
    for word in words:
        assert word in line, (word, line)


@pytest.mark.parametrize("name", sorted(MODEL_REFUSED))
def test_a_configuration_is_refused_against_its_model_in_tritons_words(name, checked):
    words = INVALID[name][-1]
    line = next(l for l in checked if l.startswith(f"model '{name}'"))
    assert line.startswith(f"model '{name}' version 1: "), line
    for word in words:
        assert word in line, (word, line)


def test_a_model_that_needs_a_flag_passes_check_exactly_when_serve_serves_it(tmp_path):
    """A response cache is the server's (`--cache-config`): without the flag
    serve leaves such a model UNAVAILABLE, and so must check."""
    (tmp_path / "cached" / "1").mkdir(parents=True)
    (tmp_path / "cached" / "config.pbtxt").write_text(
        'backend: "identity"\nmax_batch_size: 8\n' + IO + "response_cache { enable: true }\n")
    without = check(tmp_path)
    [row] = index(tmp_path)
    assert row["state"] == "UNAVAILABLE"
    assert "--cache-config" in row["reason"]
    assert (without.returncode, without.stdout.splitlines()) == (1, [line_of(row)])

    flag = ["--cache-config", "local,size=1048576"]
    with_flag = check(tmp_path, *flag)
    assert (with_flag.returncode, with_flag.stdout) == (0, "ok: every model in the repository loads\n")
    assert [row["state"] for row in index(tmp_path, *flag)] == ["READY"]

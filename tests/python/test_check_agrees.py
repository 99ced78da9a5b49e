"""`plinth check` says what `plinth serve` does: one repository of invalid
ensembles (as Triton's qa/L0_model_config/autofill_noplatform/ensemble
cases describe them, written afresh here) and a valid one is checked, then
served in control mode `none`; every model check refuses is one the
repository index shows UNAVAILABLE, for the same reason, and each refusal
carries the words Triton's own message uses."""

import json
import os
import re
import subprocess
import urllib.request

import pytest

from conftest import HANG_GUARD_S, ROOT, Plinth

BINARY = os.environ.get("PLINTH_BIN", str(ROOT / "target/release/plinth"))


def step_model(name, dtype="TYPE_FP32", dims="[ 16 ]", batch=4, inputs=1):
    """An identity model: INPUT<i> to OUTPUT<i>."""
    tensors = lambda kind: ", ".join(
        f'{{ name: "{kind}{i}" data_type: {dtype} dims: {dims} }}' for i in range(inputs))
    return (f'name: "{name}"\nbackend: "identity"\nmax_batch_size: {batch}\n'
            f"input [ {tensors('INPUT')} ]\noutput [ {tensors('OUTPUT')} ]\n")


def ensemble(name, steps, batch=4, out_dims="[ 16 ]", in_type="TYPE_FP32", out_type="TYPE_FP32", in_dims="[ 16 ]",
             reshape=""):
    """An ensemble from `data` to `prob` running `steps`: (model, version,
    {model input: tensor}, {model output: tensor}); `reshape` (e.g.
    "[ 4, 4 ]") reshapes both."""
    reshape = f" reshape: {{ shape: {reshape} }}" if reshape else ""
    text = (f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {batch}\n'
            f'input [ {{ name: "data" data_type: {in_type} dims: {in_dims}{reshape} }} ]\n'
            f'output [ {{ name: "prob" data_type: {out_type} dims: {out_dims}{reshape} }} ]\n'
            "ensemble_scheduling { step [\n")
    for model, version, inputs, outputs in steps:
        maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
        maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
        text += f'  {{ model_name: "{model}" model_version: {version}{maps} }},\n'
    return text.rstrip(",\n") + "\n] }\n"


IN, OUT = {"INPUT0": "data"}, {"OUTPUT0": "prob"}

STEPS = {
    "fp32_b4": step_model("fp32_b4"),
    "fp32_b2": step_model("fp32_b2", batch=2),
    "int32_b4": step_model("int32_b4", dtype="TYPE_INT32"),
    "fp32_3d_b4": step_model("fp32_3d_b4", dims="[ 16, 16, 16 ]"),
    "fp32_two_b4": step_model("fp32_two_b4", inputs=2),
    "fp32_any_b4": step_model("fp32_any_b4", dims="[ -1 ]"),
    "fp32_4x4_b4": step_model("fp32_4x4_b4", dims="[ 4, 4 ]"),
}

# Ensemble name: (configuration, a word of Triton's message for it).
INVALID = {
    "circular_a": (ensemble("circular_a", [("circular_b", -1, IN, OUT)]), "circular dependency between ensembles"),
    "circular_b": (ensemble("circular_b", [("circular_a", -1, IN, OUT)]), "circular dependency between ensembles"),
    "self_circular": (ensemble("self_circular", [("self_circular", -1, IN, OUT)]),
                      "circular dependency between ensembles"),
    "inconsistent_type": (ensemble("inconsistent_type", [("fp32_b4", -1, IN, {"OUTPUT0": "t"}),
                                                         ("int32_b4", -1, {"INPUT0": "t"}, OUT)],
                                   out_type="TYPE_INT32"), "inconsistent data type"),
    "inconsistent_shape": (ensemble("inconsistent_shape", [("fp32_b4", -1, IN, {"OUTPUT0": "t"}),
                                                           ("fp32_3d_b4", -1, {"INPUT0": "t"}, OUT)],
                                    out_dims="[ 16, 16, 16 ]"), "inconsistent shape"),
    "batch_too_large": (ensemble("batch_too_large", [("fp32_b2", -1, IN, OUT)], batch=3),
                        "allows maximum batch size 3, but it contains model fp32_b2"),
    "invalid_input_map": (ensemble("invalid_input_map", [("fp32_b4", -1, {"INPUT0": "data", "nope": "data"}, OUT)]),
                          "is mapping to non-existing input nope"),
    "invalid_output_map": (ensemble("invalid_output_map", [("fp32_b4", -1, IN, {"nope": "t"}),
                                                         ("fp32_b4", -1, {"INPUT0": "t"}, OUT)]),
                           "is mapped from non-existing output nope"),
    "unmapped_input": (ensemble("unmapped_input", [("fp32_two_b4", -1, IN, OUT)]),
                       "input INPUT1 in model fp32_two_b4 is not mapped to any ensemble tensors"),
    "no_required_version": (ensemble("no_required_version", [("fp32_b4", 2, IN, OUT)]),
                            "whose required version 2 is not loaded"),
    "non_existing_model": (ensemble("non_existing_model", [("not_in_repository", -1, IN, OUT)]),
                           "contains models that are not available"),
}

# As Triton's QA ensembles (qa/common/gen_ensemble_model_utils.py) have
# them: a non-batching ensemble over batching steps, its [16] meeting a
# step's [-1] by the dims and its [-1, 16] a step's [16] by the full shapes;
# and a reshaped ensemble, whose steps see its reshape.
VALID = {
    "chain": ensemble("chain", [("fp32_b4", -1, IN, {"OUTPUT0": "t"}), ("fp32_b2", -1, {"INPUT0": "t"}, OUT)],
                      batch=2),
    "nobatch_over_any": ensemble("nobatch_over_any", [("fp32_any_b4", -1, IN, OUT)], batch=0),
    "nobatch_over_batching": ensemble("nobatch_over_batching", [("fp32_b4", -1, IN, OUT)], batch=0,
                                      in_dims="[ -1, 16 ]", out_dims="[ -1, 16 ]"),
    "reshaped": ensemble("reshaped", [("fp32_4x4_b4", -1, IN, OUT)], reshape="[ 4, 4 ]"),
}
# The shape each valid ensemble is asked with.
SHAPES = {"chain": [1, 16], "nobatch_over_any": [16], "nobatch_over_batching": [1, 16], "reshaped": [2, 16]}


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("ensembles")
    configs = {**STEPS, **VALID, **{name: config for name, (config, _) in INVALID.items()}}
    for name, config in configs.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
    return repo


@pytest.fixture(scope="module")
def checked(repository):
    env = dict(os.environ, ORT_DYLIB_PATH=str(ROOT / ".cache/onnxruntime/libonnxruntime.so"))
    result = subprocess.run([BINARY, "check", "--model-repository", repository],
                            capture_output=True, text=True, env=env, timeout=HANG_GUARD_S)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    return {re.match(r"model '([^']+)'", line).group(1): line for line in lines}


@pytest.fixture(scope="module")
def served(repository):
    server = Plinth(repository)
    try:
        request = urllib.request.Request(f"http://{server.url}/v2/repository/index", data=b"{}", method="POST")
        index = json.load(urllib.request.urlopen(request, timeout=HANG_GUARD_S))
        answers = {name: infer(server, name, shape) for name, shape in SHAPES.items()}
    finally:
        server.stop()
    return {row["name"]: row for row in index if row["state"] != "READY"}, {row["name"] for row in index}, answers


def infer(server, name, shape):
    """The output `prob` of ensemble `name` for `data` of `shape` holding
    0, 1, 2, ...: (shape, data)."""
    count = 1
    for d in shape:
        count *= d
    body = {"inputs": [{"name": "data", "shape": shape, "datatype": "FP32", "data": list(range(count))}]}
    request = urllib.request.Request(f"http://{server.url}/v2/models/{name}/infer", data=json.dumps(body).encode())
    output = json.load(urllib.request.urlopen(request, timeout=HANG_GUARD_S))["outputs"][0]
    return output["shape"], output["data"]


def test_check_refuses_what_serve_refuses_and_nothing_else(checked, served):
    unavailable, known, _ = served
    assert set(checked) == set(unavailable) == set(INVALID)
    assert known == set(STEPS) | set(VALID) | set(INVALID)


@pytest.mark.parametrize("name", sorted(INVALID))
def test_each_refusal_gives_the_reason_of_serve_in_tritons_words(name, checked, served):
    unavailable, _, _ = served
    line = checked[name]
    assert unavailable[name]["reason"] in line, (line, unavailable[name])
    assert INVALID[name][1] in line, line


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_each_valid_ensemble_answers_its_input_in_its_shape(name, served):
    _, _, answers = served
    shape, data = answers[name]
    count = len(data)
    assert (shape, data) == (SHAPES[name], [float(i) for i in range(count)]), answers[name]

"""Writes the benchmarks' tiny model: a 64 -> 32 -> 10 MLP (ReLU between,
weights seeded), input `x` [N, 64] FP32, output `y` [N, 10] FP32, as ONNX
IR 10 / opset 21. Its run takes a few microseconds, so what a benchmark
measures on it is the server's own overhead per request.

Usage: .venv/bin/python bench/make_mlp.py OUT.onnx"""

import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper, save

rng = np.random.default_rng(64)
weights = [
    numpy_helper.from_array(rng.normal(0, 0.2, (64, 32)).astype(np.float32), "w1"),
    numpy_helper.from_array(rng.normal(0, 0.1, 32).astype(np.float32), "b1"),
    numpy_helper.from_array(rng.normal(0, 0.2, (32, 10)).astype(np.float32), "w2"),
    numpy_helper.from_array(rng.normal(0, 0.1, 10).astype(np.float32), "b2"),
]
nodes = [
    helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
    helper.make_node("Relu", ["h"], ["r"]),
    helper.make_node("Gemm", ["r", "w2", "b2"], ["y"]),
]
graph = helper.make_graph(
    nodes, "mlp",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
    initializer=weights)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
model.ir_version = 10
save(model, sys.argv[1])

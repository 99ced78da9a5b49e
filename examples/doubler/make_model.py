#!/usr/bin/env python3
"""Writes model.onnx beside this file: the model of the plugin walkthrough
in docs/plugins.md.

  input  x [batch, 4] FP32  ->  output y [batch, 4] FP32 = 2 * x

usage: python3 examples/doubler/make_model.py   (needs the `onnx` package)
"""

import pathlib

import onnx
from onnx import TensorProto, helper


def main():
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"])],
        "doubler",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    # IR version 9: what ONNX Runtime 1.31 reads (onnx 1.23 writes newer by default).
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, pathlib.Path(__file__).with_name("model.onnx"))


if __name__ == "__main__":
    main()

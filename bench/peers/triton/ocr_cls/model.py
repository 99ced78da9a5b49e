"""ocr_cls served by Triton's Python backend: onnxruntime in a
TritonPythonModel, as a Triton user would write it. The requests of one
dynamic batch arrive together in `execute`; their rows run as one batch."""

import os

import numpy as np
import onnxruntime
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = onnxruntime.InferenceSession(path)
        self.output = self.session.get_outputs()[0].name

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "x").as_numpy() for r in requests]
        (y,) = self.session.run([self.output], {"x": np.concatenate(inputs)})
        responses, start = [], 0
        for x in inputs:
            rows = y[start : start + len(x)]
            start += len(x)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(self.output, rows)]))
        return responses

"""Image bytes in, text out on Triton's Python backend: the PNG arrives as
one BYTES element, the shared pipeline reads it (ocr_pipeline.py, found on
the PYTHONPATH that run.sh gives tritonserver)."""

import os

import numpy as np
import triton_python_backend_utils as pb_utils
from ocr_pipeline import LineReader


class TritonPythonModel:
    def initialize(self, args):
        self.reader = LineReader(os.path.join(args["model_repository"], args["model_version"], "model.onnx"))

    def execute(self, requests):
        responses = []
        for request in requests:
            image = pb_utils.get_input_tensor_by_name(request, "image").as_numpy()[0]
            line = self.reader.read(image)
            text = pb_utils.Tensor("text", np.array([line["text"].encode()], dtype=np.object_))
            confidence = pb_utils.Tensor("confidence", np.array([line["confidence"]], dtype=np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[text, confidence]))
        return responses

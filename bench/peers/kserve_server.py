"""ocr_cls served by the KServe Python model server: a kserve.Model that
runs onnxruntime, as a KServe user would write it. Started by run.sh.

Usage: python kserve_server.py MODEL.onnx HTTP_PORT GRPC_PORT
"""

import sys
import uuid

import onnxruntime
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer


class OcrCls(Model):
    def __init__(self, name, path):
        super().__init__(name)
        self.session = onnxruntime.InferenceSession(path)
        self.output = self.session.get_outputs()[0].name
        self.ready = True

    def predict(self, request: InferRequest, headers=None) -> InferResponse:
        x = request.inputs[0].as_numpy()
        (y,) = self.session.run([self.output], {"x": x})
        out = InferOutput(name=self.output, shape=list(y.shape), datatype="FP32")
        out.set_data_from_numpy(y, binary_data=False)
        return InferResponse(model_name=self.name, infer_outputs=[out], response_id=request.id or str(uuid.uuid4()))


if __name__ == "__main__":
    path, http_port, grpc_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    ModelServer(http_port=http_port, grpc_port=grpc_port, enable_docs_url=False).start([OcrCls("ocr_cls", path)])

"""ocr_cls and the OCR text-line pipeline served by the KServe Python model
server: kserve.Models, as a KServe user would write them. Started by run.sh.

- ocr_cls runs onnxruntime behind the v2 `/infer` endpoint.
- ocr_rec reads one text line: the image's bytes in, its text out, on
  KServe's v1 endpoint `POST /v1/models/ocr_rec:predict`, which hands a body
  whose Content-Type is not JSON to `predict` as it came (a raw body); the
  shared Python pipeline (ocr_pipeline.py, beside this file) does the work.

Usage: python kserve_server.py OCR_CLS.onnx HTTP_PORT GRPC_PORT [OCR_REC.onnx]
(without OCR_REC.onnx, ocr_cls only, as tests/python/test_remote_kserve.py runs it)
"""

import sys
import uuid

import onnxruntime
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer
from ocr_pipeline import LineReader


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


class OcrRec(Model):
    def __init__(self, name, path):
        super().__init__(name)
        self.reader = LineReader(path)
        self.ready = True

    def predict(self, image: bytes, headers=None) -> dict:
        return self.reader.read(image)


if __name__ == "__main__":
    cls_path, http_port, grpc_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    models = [OcrCls("ocr_cls", cls_path)] + [OcrRec("ocr_rec", path) for path in sys.argv[4:5]]
    ModelServer(http_port=http_port, grpc_port=grpc_port, enable_docs_url=False).start(models)

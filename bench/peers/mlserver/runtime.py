"""ocr_cls and the OCR text-line pipeline served by MLServer: custom
MLModels, as an MLServer user would write them. Started by run.sh.

- OcrCls runs onnxruntime behind the v2 `/infer` endpoint.
- OcrRec reads one text line: the image's bytes in, its text out. MLServer's
  v2 endpoints take JSON only (BYTES as base64 text), so it takes the raw
  body on a custom REST endpoint, `POST /ocr_rec/predict`, the cheapest way
  MLServer offers; the shared Python pipeline (ocr_pipeline.py) does the work.
"""

import onnxruntime
from fastapi import Body
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.handlers import custom_handler
from mlserver.types import InferenceRequest, InferenceResponse
from ocr_pipeline import LineReader


class OcrCls(MLModel):
    async def load(self) -> bool:
        self.session = onnxruntime.InferenceSession(self.settings.parameters.uri)
        self.output = self.session.get_outputs()[0].name
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        (y,) = self.session.run([self.output], {"x": x})
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output(self.output, y)])


class OcrRec(MLModel):
    async def load(self) -> bool:
        self.reader = LineReader(self.settings.parameters.uri)
        return True

    # The handler runs in MLServer's inference worker process, so its
    # argument must pickle: the body as bytes (FastAPI hands over the raw
    # body of a non-JSON request), not the request object.
    @custom_handler(rest_path="/ocr_rec/predict")
    async def read_line(self, image: bytes = Body(..., media_type="image/png")) -> dict:
        return self.reader.read(image)

"""ocr_cls served by MLServer: a custom MLModel that runs onnxruntime, as
an MLServer user would write it. Started by run.sh."""

import onnxruntime
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OcrCls(MLModel):
    async def load(self) -> bool:
        self.session = onnxruntime.InferenceSession(self.settings.parameters.uri)
        self.output = self.session.get_outputs()[0].name
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        (y,) = self.session.run([self.output], {"x": x})
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output(self.output, y)])

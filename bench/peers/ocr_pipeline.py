"""The OCR text-line pipeline in Python (Pillow + NumPy + onnxruntime), the
same steps as Plinth's ocr_rec plugin: decode the image, resize it to 48
pixels high, BGR, (x/255-0.5)/0.5, pad right to at least 320 columns, run
PP-OCRv4 recognition, greedy CTC decoding. Written once here and imported
by bench/ocr_predict.py and by every peer's model in bench/peers/ (KServe,
MLServer, Triton's Python backend), so every server runs the same code.
"""

import io
import math

import numpy as np
import onnxruntime
from PIL import Image


class LineReader:
    """Reads the text of one image of a text line."""

    def __init__(self, model_path):
        self.session = onnxruntime.InferenceSession(str(model_path))
        dictionary = self.session.get_modelmeta().custom_metadata_map["character"]
        # Class 0 is the CTC blank and the last class a space.
        self.classes = ["blank"] + dictionary.split("\n") + [" "]

    def read(self, image: bytes):
        """The text of a PNG or JPEG text line and the mean probability of
        its characters: {"text": str, "confidence": float}, as Plinth's
        ocr_rec plugin answers."""
        img = Image.open(io.BytesIO(image)).convert("RGB")
        w = math.ceil(48 * img.width / img.height)
        x = np.asarray(img.resize((w, 48), Image.BILINEAR), dtype=np.float32)[:, :, ::-1]
        x = (x.transpose(2, 0, 1) / 255.0 - 0.5) / 0.5
        padded = np.zeros((1, 3, 48, max(320, w)), dtype=np.float32)
        padded[0, :, :, :w] = x
        (probs,) = self.session.run(None, {"x": padded})
        best = probs[0].argmax(axis=1)
        keep = (best != 0) & np.concatenate(([True], best[1:] != best[:-1]))
        text = "".join(self.classes[i] for i in best[keep])
        confidence = float(probs[0].max(axis=1)[keep].mean()) if keep.any() else 0.0
        return {"text": text, "confidence": confidence}

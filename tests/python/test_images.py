"""Images that are large, truncated or in unusual encodings: each is read
or refused with a 400 that says why, never a 500."""

import io
import json
import urllib.error
import urllib.request

import pytest
from PIL import Image

from conftest import ROOT

HELLO = ROOT / "tests/fixtures/line_hello.png"


def predict(server, body, model="ocr_rec"):
    request = urllib.request.Request(f"http://{server.url}/v2/models/{model}/predict", data=body,
                                     headers={"Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def encoded(image, fmt, **options):
    buf = io.BytesIO()
    image.save(buf, format=fmt, **options)
    return buf.getvalue()


@pytest.mark.parametrize("mode,fmt", [("L", "PNG"), ("I;16", "PNG"), ("RGBA", "PNG"), ("P", "PNG"),
                                      ("L", "JPEG"), ("CMYK", "JPEG")])
def test_other_encodings_of_the_same_line_read_the_same(example_server, mode, fmt):
    image = Image.open(HELLO).convert("RGB").convert(mode)
    status, answer = predict(example_server, encoded(image, fmt, **({"quality": 95} if fmt == "JPEG" else {})))
    assert (status, answer.get("text")) == (200, "Hello World"), answer


def test_an_image_too_large_to_decode_is_a_400(example_server):
    status, answer = predict(example_server, encoded(Image.new("L", (8000, 8000), 255), "PNG"))
    assert status == 400
    assert "8000x8000" in answer["error"] and "at most" in answer["error"]


def test_a_truncated_jpeg_is_a_400(example_server):
    whole = (ROOT / "tests/fixtures/line_receipt.jpg").read_bytes()
    status, answer = predict(example_server, whole[:3000])
    assert status == 400
    assert "truncated" in answer["error"]
    status, answer = predict(example_server, whole)
    assert (status, answer["text"]) == (200, "Total due: 318.75 EUR")

"""Triton's own HTTP client works against Plinth unchanged."""

import numpy as np
import onnxruntime
import tritonclient.http as httpclient

from conftest import ROOT


def test_tritonclient_health_metadata_and_json_infer(example_server):
    client = httpclient.InferenceServerClient(url=example_server.url)
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("ocr_cls")
    assert not client.is_model_ready("no_such_model")

    meta = client.get_model_metadata("ocr_cls")
    assert meta["name"] == "ocr_cls"
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3, 48, 192]}]
    output_name = meta["outputs"][0]["name"]

    rng = np.random.default_rng(7)
    x = rng.uniform(-1.0, 1.0, size=(1, 3, 48, 192)).astype(np.float32)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=False)
    out = httpclient.InferRequestedOutput(output_name, binary_data=False)
    result = client.infer("ocr_cls", [inp], outputs=[out], request_id="tc-1")
    got = result.as_numpy(output_name)
    assert result.get_response()["id"] == "tc-1"

    session = onnxruntime.InferenceSession(str(ROOT / "model_repository/ocr_cls/1/model.onnx"))
    (want,) = session.run([output_name], {"x": x})
    assert got.shape == want.shape == (1, 2)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)

"""A model's metric series leave /metrics with it (issue 19): after an
unload through the repository API nothing labelled with the model is
left, and loading it again starts its series anew."""

import urllib.request

from conftest import HANG_GUARD_S, ROOT, Plinth, wait_until

PNG = (ROOT / "tests/fixtures/cls_upright.png").read_bytes()


def post(server, path, body=b"{}"):
    request = urllib.request.Request(f"http://{server.url}{path}", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=HANG_GUARD_S) as response:
        return response.status


def series_of(server, model):
    text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=HANG_GUARD_S).read().decode()
    return [l for l in text.splitlines() if not l.startswith("#") and f'model="{model}"' in l]


def test_an_unloaded_model_leaves_no_series_behind():
    server = Plinth(ROOT / "model_repository", "--model-control-mode", "explicit", "--load-model", "ocr_cls")
    try:
        assert post(server, "/v2/models/ocr_cls/predict", PNG) == 200
        families = {l.split("{")[0] for l in series_of(server, "ocr_cls")}
        for family in ["nv_inference_request_success", "nv_inference_count", "plinth_model_loads_total",
                       "plinth_model_resident_bytes", "plinth_plugin_duration_us",
                       "plinth_inference_request_duration_seconds_bucket"]:
            assert family in families, family
        assert post(server, "/v2/repository/models/ocr_cls/unload") == 200
        wait_until("ocr_cls's series are gone", lambda: series_of(server, "ocr_cls") == [])
        assert post(server, "/v2/repository/models/ocr_cls/load") == 200
        success = [l for l in series_of(server, "ocr_cls") if l.startswith("nv_inference_request_success")]
        assert success == ['nv_inference_request_success{model="ocr_cls",version="1"} 1'], \
            "counted anew: the plugin warm-up's one request"
    finally:
        server.stop()

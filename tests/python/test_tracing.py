"""OpenTelemetry tracing (`--trace-config`, issue 19): a small OTLP receiver
(HTTP/protobuf and gRPC, from the `opentelemetry-proto` package) collects
what Plinth exports, and each test checks the span tree of its requests:
names, parents, the trace id a `traceparent` gives, nothing for a request
whose `traceparent` is not sampled, the trace settings extension, and the
trace id in JSON log lines."""

import http.server
import json
import shutil
import threading
import urllib.error
import urllib.request
from concurrent import futures

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from conftest import ROOT, Plinth, wait_until

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
PNG = (ROOT / "tests/fixtures/cls_upright.png").read_bytes()
LINE = (ROOT / "tests/fixtures/line_hello.png").read_bytes()


class Collector:
    """Spans received over OTLP, as dicts with hex ids."""

    def __init__(self):
        self.spans = []
        self.lock = threading.Lock()

    def add(self, request):
        with self.lock:
            for resource in request.resource_spans:
                attributes = {a.key: a.value.string_value for a in resource.resource.attributes}
                for scope in resource.scope_spans:
                    for s in scope.spans:
                        self.spans.append({
                            "trace": s.trace_id.hex(), "id": s.span_id.hex(), "parent": s.parent_span_id.hex(),
                            "name": s.name, "events": [e.name for e in s.events], "status": s.status.code,
                            "attributes": {a.key: a.value.string_value or a.value.int_value for a in s.attributes},
                            "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
                            "service": attributes.get("service.name"),
                        })

    def trace(self, trace_id):
        with self.lock:
            return [s for s in self.spans if s["trace"] == trace_id]

    def wait_for_root(self, predicate):
        """The spans of the first trace whose root span satisfies
        `predicate`, once its root arrived (a root ends last)."""
        found = []

        def arrived():
            with self.lock:
                roots = [s for s in self.spans if s["name"] == "InferRequest" and predicate(s)]
            found[:] = roots[:1]
            return bool(found)

        wait_until("the request's spans are exported", arrived)
        return self.trace(found[0]["trace"])


def children(spans, parent):
    return sorted(s["name"] for s in spans if s["parent"] == parent["id"])


def one(spans, name):
    matches = [s for s in spans if s["name"] == name]
    assert len(matches) == 1, (name, [s["name"] for s in spans])
    return matches[0]


@pytest.fixture(scope="module")
def http_collector():
    collector = Collector()

    class Receiver(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers["content-length"]))
            assert self.path == "/v1/traces" and self.headers["content-type"] == "application/x-protobuf"
            collector.add(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.end_headers()
            self.wfile.write(trace_service_pb2.ExportTraceServiceResponse().SerializeToString())

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    collector.url = f"127.0.0.1:{server.server_address[1]}"
    yield collector
    server.shutdown()


@pytest.fixture(scope="module")
def grpc_collector():
    collector = Collector()

    class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            collector.add(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Receiver(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    collector.url = f"127.0.0.1:{port}"
    yield collector
    server.stop(None)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """ocr (which composes ocr_cls and ocr_rec), and `pair`: an ensemble of
    two identity steps."""
    repo = tmp_path_factory.mktemp("repo")
    for name in ["ocr", "ocr_cls", "ocr_rec"]:
        shutil.copytree(ROOT / "model_repository" / name, repo / name)
    for name in ["first", "second"]:
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "identity"\nmax_batch_size: 8\n'
            'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
            'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')
    (repo / "pair").mkdir()
    (repo / "pair" / "1").mkdir()
    (repo / "pair" / "config.pbtxt").write_text('''name: "pair"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "first" model_version: -1 input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "MID" } },
  { model_name: "second" model_version: -1 input_map { key: "IN" value: "MID" } output_map { key: "OUT" value: "Y" } } ] }
''')
    return repo


def tracing_flags(collector, *extra):
    return ["--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
            "--trace-config", f"opentelemetry,url={collector.url}",
            "--trace-config", "opentelemetry,bsp_schedule_delay=20",
            "--trace-config", "opentelemetry,resource=deployment.environment=test", *extra]


@pytest.fixture(scope="module")
def server(repo, http_collector):
    server = Plinth(repo, "--log-format", "json", "--log-verbose", "1", *tracing_flags(http_collector))
    yield server
    server.stop()


def post(server, path, body, headers=None):
    request = urllib.request.Request(f"http://{server.url}{path}", data=body, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(request) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def get(server, path):
    with urllib.request.urlopen(f"http://{server.url}{path}") as response:
        return json.load(response)


def test_a_plugin_model_s_request_is_one_tree_in_triton_s_shape(server, http_collector):
    status, body = post(server, "/v2/models/ocr_cls/predict", PNG)
    assert status == 200 and json.loads(body)["angle"] == 0
    spans = http_collector.wait_for_root(lambda s: s["attributes"].get("url.path") == "/v2/models/ocr_cls/predict")
    root = one(spans, "InferRequest")
    assert root["parent"] == "" and root["service"] == "plinth"
    assert root["attributes"]["http.response.status_code"] == 200
    assert children(spans, root) == ["ocr_cls"]
    model = one(spans, "ocr_cls")
    assert model["attributes"]["model_name"] == "ocr_cls" and model["attributes"]["model_version"] == 1
    assert model["events"] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert children(spans, model) == ["compute", "postprocess", "preprocess", "queue"]
    compute = one(spans, "compute")
    assert children(spans, compute) == ["compute_infer", "compute_input", "compute_output"]
    assert compute["events"] == ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"]
    queue = one(spans, "queue")
    assert root["start"] <= model["start"] <= queue["start"] <= queue["end"] <= compute["start"] <= model["end"]


def test_a_traceparent_is_continued_and_an_unsampled_one_exports_nothing(server, http_collector):
    unsampled = "1" * 32
    assert post(server, "/v2/models/ocr_cls/predict", PNG, {"traceparent": f"00-{unsampled}-{PARENT_ID}-00"})[0] == 200
    assert post(server, "/v2/models/ocr_cls/predict", PNG, {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})[0] == 200
    spans = http_collector.wait_for_root(lambda s: s["trace"] == TRACE_ID)
    root = one(spans, "InferRequest")
    assert root["parent"] == PARENT_ID, "the root continues the caller's span"
    assert len(spans) == 9, [s["name"] for s in spans]
    # Spans are exported in the order they end: the unsampled request's
    # would have come first.
    assert http_collector.trace(unsampled) == []


def test_composed_calls_go_under_the_plugin_stage_that_made_them(server, http_collector):
    status, body = post(server, "/v2/models/ocr/predict", LINE)
    assert status == 200 and json.loads(body)["lines"][0]["text"] == "Hello World"
    spans = http_collector.wait_for_root(lambda s: s["attributes"].get("url.path") == "/v2/models/ocr/predict")
    ocr = one(spans, "ocr")
    assert children(spans, ocr) == ["compute", "postprocess", "preprocess", "queue"]
    postprocess = next(s for s in spans if s["name"] == "postprocess" and s["parent"] == ocr["id"])
    callees = children(spans, postprocess)
    assert set(callees) == {"ocr_cls", "ocr_rec"}, callees
    for callee in (s for s in spans if s["parent"] == postprocess["id"]):
        assert children(spans, callee) == ["compute", "postprocess", "preprocess", "queue"]
        assert postprocess["start"] <= callee["start"] <= callee["end"] <= postprocess["end"]


def test_an_ensemble_s_steps_are_model_spans_under_its_own(server, http_collector):
    x = [1.0, 2.0, 3.0, 4.0]
    body = json.dumps({"id": "req-7", "inputs": [{"name": "X", "shape": [1, 4], "datatype": "FP32", "data": x}]})
    status, answer = post(server, "/v2/models/pair/infer", body.encode())
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == x
    spans = http_collector.wait_for_root(lambda s: s["attributes"].get("url.path") == "/v2/models/pair/infer")
    root = one(spans, "InferRequest")
    assert root["attributes"]["request_id"] == "req-7"
    pair = one(spans, "pair")
    assert children(spans, root) == ["pair"] and children(spans, pair) == ["first", "second"]
    for step in ("first", "second"):
        span = one(spans, step)
        assert span["attributes"]["request_id"] == "req-7" and span["attributes"]["batch_size"] == 1
        assert children(spans, span) == ["compute", "queue"]


def test_grpc_requests_continue_their_metadata_s_traceparent(server, http_collector):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = grpcclient.InferInput("X", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), np.float32))
    trace_id = "2" * 32
    result = client.infer("pair", [x], headers={"traceparent": f"00-{trace_id}-{PARENT_ID}-01"})
    assert result.as_numpy("Y").tolist() == [[1.0] * 4]
    spans = http_collector.wait_for_root(lambda s: s["trace"] == trace_id)
    root = one(spans, "InferRequest")
    assert root["parent"] == PARENT_ID
    assert root["attributes"]["rpc.method"] == "ModelInfer" and root["attributes"]["rpc.grpc.status_code"] == 0
    assert children(spans, one(spans, "pair")) == ["first", "second"]


def test_a_failed_request_marks_its_model_span(server, http_collector):
    status, _ = post(server, "/v2/models/ocr_cls/predict", b"not an image", {"traceparent": f"00-{'3' * 32}-{PARENT_ID}-01"})
    assert status == 400
    spans = http_collector.wait_for_root(lambda s: s["trace"] == "3" * 32)
    assert one(spans, "ocr_cls")["status"] == 2, "STATUS_CODE_ERROR"
    assert one(spans, "preprocess")["status"] == 2
    assert one(spans, "InferRequest")["status"] == 0, "a 4xx leaves a server span's status unset"


def test_trace_settings_change_at_run_time_globally_and_per_model(server, http_collector):
    assert get(server, "/v2/trace/setting") == {
        "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1", "trace_mode": "opentelemetry"}
    # ocr_cls alone off; the server's settings still trace the others.
    status, body = post(server, "/v2/models/ocr_cls/trace/setting", json.dumps({"trace_level": ["OFF"]}).encode())
    assert status == 200 and json.loads(body)["trace_level"] == ["OFF"]
    assert get(server, "/v2/models/ocr_rec/trace/setting")["trace_level"] == ["TIMESTAMPS"]
    before = len(http_collector.spans)
    assert post(server, "/v2/models/ocr_cls/predict", PNG)[0] == 200
    x = json.dumps({"id": "after-off", "inputs": [{"name": "X", "shape": [1, 4], "datatype": "FP32", "data": [0] * 4}]})
    assert post(server, "/v2/models/pair/infer", x.encode())[0] == 200
    http_collector.wait_for_root(lambda s: s["attributes"].get("request_id") == "after-off")
    assert not any(s["name"] == "ocr_cls" for s in http_collector.spans[before:]), "ocr_cls is not traced"
    # {} removes the model's settings: it follows the server's again.
    assert json.loads(post(server, "/v2/models/ocr_cls/trace/setting", b"{}")[1])["trace_level"] == ["TIMESTAMPS"]
    # One request in three.
    status, body = post(server, "/v2/trace/setting", json.dumps({"trace_rate": "3"}).encode())
    assert status == 200 and json.loads(body)["trace_rate"] == "3"
    try:
        ids = [f"rate-{i}" for i in range(6)]
        for request_id in ids:
            body = json.dumps({"id": request_id, "inputs": [{"name": "X", "shape": [1, 4], "datatype": "FP32", "data": [0] * 4}]})
            assert post(server, "/v2/models/pair/infer", body.encode())[0] == 200
        http_collector.wait_for_root(lambda s: s["attributes"].get("request_id") == "rate-5")
        traced = {s["attributes"].get("request_id") for s in http_collector.spans if s["name"] == "InferRequest"}
        assert [i for i in ids if i in traced] == ["rate-2", "rate-5"]
    finally:
        post(server, "/v2/trace/setting", json.dumps({"trace_rate": "1"}).encode())
    for bad, message in [({"trace_level": ["TENSORS"]}, "TENSORS is not supported"),
                         ({"trace_file": "/tmp/t.json"}, "does not write Triton's trace files"),
                         ({"trace_rate": "often"}, "trace_rate must be a whole number"),
                         ({"trace_rates": "1"}, "unknown trace setting 'trace_rates'")]:
        status, body = post(server, "/v2/trace/setting", json.dumps(bad).encode())
        assert status == 400 and message in json.loads(body)["error"], body
    status, body = post(server, "/v2/models/nothing/trace/setting", b"{}")
    assert status == 404 and "nothing" in json.loads(body)["error"]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert client.get_trace_settings(as_json=True)["settings"]["trace_rate"]["value"] == ["1"]


def test_log_lines_of_a_traced_request_carry_its_trace_id(server, http_collector):
    trace_id = "4" * 32
    assert post(server, "/v2/models/ocr_cls/predict", PNG, {"traceparent": f"00-{trace_id}-{PARENT_ID}-01"})[0] == 200

    def logged():
        lines = [json.loads(line) for line in list(server.log) if line.startswith("{")]
        return [l for l in lines if l.get("span", {}).get("trace_id") == trace_id]

    wait_until("a log line with the trace id", lambda: logged())
    assert any("predict: accepted" in l["fields"]["message"] for l in logged())


def test_spans_go_over_otlp_grpc_too(repo, grpc_collector):
    server = Plinth(repo, *tracing_flags(grpc_collector, "--trace-config", "opentelemetry,protocol=grpc"))
    try:
        assert post(server, "/v2/models/ocr_cls/predict", PNG, {"traceparent": f"00-{'5' * 32}-{PARENT_ID}-01"})[0] == 200
        spans = grpc_collector.wait_for_root(lambda s: s["trace"] == "5" * 32)
        assert children(spans, one(spans, "InferRequest")) == ["ocr_cls"]
    finally:
        server.stop()


def test_nothing_is_traced_by_default_and_bad_flags_are_refused(repo, http_collector, tmp_path):
    server = Plinth(repo, "--trace-config", f"opentelemetry,url={http_collector.url}",
                    "--trace-config", "opentelemetry,bsp_schedule_delay=20")
    try:
        assert get(server, "/v2/trace/setting")["trace_level"] == ["OFF"]
        assert post(server, "/v2/models/ocr_cls/predict", PNG, {"traceparent": f"00-{'6' * 32}-{PARENT_ID}-01"})[0] == 200
    finally:
        server.stop()
    assert http_collector.trace("6" * 32) == [], "level OFF traces nothing, sampled or not"
    with pytest.raises(RuntimeError, match="does not write Triton's trace files"):
        Plinth(repo, "--trace-config", "triton,file=/tmp/trace.json")

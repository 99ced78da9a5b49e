"""The errors a plugin author meets first, against the real binary: a typo
in config.pbtxt, a plugin named after its crate, and a plugin that panics.

A model that failed to load answers Triton's text for a model with no
available versions (`Request for unknown model: 'NAME' has no available
versions`, which clients match), followed by Plinth's reason for a person:
the line, the field and the name meant. A panicking plugin's answer names
the model, plugin, phase and source location; its panic message (which can
quote the client's input) is in the log, on one line, and in the answer
only with `--plugin-panic-details`."""

import json
import os
import re
import shutil
import subprocess
import urllib.error
import urllib.request

import pytest

from conftest import HANG_GUARD_S, ROOT, Plinth, faulty_model

PREFIX = "Request for unknown model: '{}' has no available versions: it is UNAVAILABLE: "
# Every record of the default log format begins with its timestamp.
RECORD = re.compile(r"^\S*\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")


def post(server, path, body):
    """(status, JSON body) of a POST."""
    request = urllib.request.Request(f"http://{server.url}{path}", data=body, headers={"Content-Type": "text/plain"})
    try:
        with urllib.request.urlopen(request, timeout=HANG_GUARD_S) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    (repo / "typo").mkdir()
    shutil.copy(ROOT / "model_repository/ocr_cls/1/model.onnx", repo / "typo")
    (repo / "typo/1").mkdir()
    shutil.move(repo / "typo/model.onnx", repo / "typo/1/model.onnx")
    (repo / "typo/config.pbtxt").write_text('platform: "onnxruntime_onnx"\nmax_batch_sise: 8\n')
    faulty_model(repo / "hyphen", plugin_file="csv_doubler.wasm", config_plugin="csv-doubler.wasm")
    faulty_model(repo / "faulty")
    return repo


@pytest.fixture(scope="module")
def server(repository):
    server = Plinth(repository)
    yield server
    server.stop()


def test_a_config_typo_names_the_line_and_the_field_meant(server, repository):
    status, body = post(server, "/v2/models/typo/infer", b"{}")
    assert status == 503, body
    reason = (f"{repository / 'typo/config.pbtxt'}: line 2: unknown field 'max_batch_sise' in the model "
              "configuration; did you mean 'max_batch_size'?")
    assert body["error"] == PREFIX.format("typo") + reason, body
    assert "inference.ModelConfig" not in body["error"]


def test_plinth_check_reports_the_typo_before_any_load(repository):
    env = {"ORT_DYLIB_PATH": str(ROOT / ".cache/onnxruntime/libonnxruntime.so"), "PATH": "/usr/bin:/bin"}
    binary = os.environ.get("PLINTH_BIN", ROOT / "target/release/plinth")
    check = subprocess.run([binary, "check", "--model-repository", repository],
                           capture_output=True, text=True, env=env, timeout=HANG_GUARD_S)
    assert check.returncode == 1, check.stdout + check.stderr
    assert "line 2: unknown field 'max_batch_sise' in the model configuration; did you mean 'max_batch_size'?" \
        in check.stdout + check.stderr


def test_a_plugin_named_after_its_crate_hints_at_the_underscore(server):
    status, body = post(server, "/v2/models/hyphen/predict", b"ok")
    assert status == 503, body
    assert body["error"].endswith(
        "; did you mean 'csv_doubler.wasm'? (cargo writes a crate's '-' as '_' in its .wasm name)"), body


def test_a_panic_names_its_location_and_logs_its_message_on_one_line(server):
    status, body = post(server, "/v2/models/faulty/predict", b"trap")
    assert status == 500, body
    error = body["error"]
    assert error.startswith("plugin 'faulty.wasm' of model 'faulty' trapped in preprocess: "), error
    assert "it panicked at faulty/src/lib.rs:36:" in error, error
    assert "deliberate trap" not in error and "RUST_BACKTRACE" not in error, "the message stays in the log"
    logged = server.wait_for_log(
        r"plugin 'faulty.wasm' of model 'faulty' trapped in preprocess: .*deliberate trap requested by the test")
    assert "RUST_BACKTRACE" not in logged
    strays = [line for line in server.log if not RECORD.match(line)]
    assert strays == [], f"log lines that are not records of their own: {strays}"


def test_panic_details_quote_the_message_in_the_answer(repository):
    server = Plinth(repository, "--plugin-panic-details")
    try:
        status, body = post(server, "/v2/models/faulty/predict", b"trap")
        assert status == 500 and body["error"].endswith(": deliberate trap requested by the test"), body
    finally:
        server.stop()

"""The status page (`GET /`, issue 19) in a real headless browser (Debian's
Chromium and ChromeDriver, driven by selenium): it lists the example
repository's models READY with their sizes, and in explicit mode its
Unload button takes a model out, which the repository index confirms.

Set PLINTH_SCREENSHOT=PATH to keep a screenshot of the page (the one in
docs/ was taken so)."""

import html
import json
import os
import pathlib
import urllib.request

import pytest
from selenium.common.exceptions import JavascriptException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from conftest import HANG_GUARD_S, ROOT, Plinth, chromium

EXAMPLE_MODELS = {"minilm", "minilm_torchscript", "mobilenet_v2", "mobilenet_v2_torchscript", "ocr", "ocr_cls", "ocr_rec",
                  "smollm2", "smollm2_fp32", "spam_classifier", "vad"}


@pytest.fixture(scope="module")
def server():
    server = Plinth(ROOT / "model_repository", "--model-control-mode", "explicit", "--load-model", "*")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = chromium(tmp_path_factory.mktemp("chromium"))
    yield driver
    driver.quit()


# The models table as {model: {column: text}}, read in one script once the
# page has finished loading (null before): a page that reloads while it is
# read can show a row whose cells are not parsed yet.
READ_TABLE = """
if (document.readyState !== 'complete') return null;
const table = {};
for (const row of document.querySelectorAll('#models tbody tr')) {
  const cells = [...row.querySelectorAll('td')].map(td => td.innerText.trim());
  table[row.dataset.model] = {state: cells[2], platform: cells[3], resident: cells[4]};
}
return table;
"""


def read_table(browser):
    """The table, or None while the page (re)loads."""
    try:
        return browser.execute_script(READ_TABLE)
    except (StaleElementReferenceException, JavascriptException):
        return None


def rows(browser):
    """Each row of the models table: {model: {column: text}}, once the page
    has loaded."""
    return WebDriverWait(browser, HANG_GUARD_S).until(read_table)


def until_state(browser, model, state):
    """Waits until the page (reloaded by the button's script) shows
    `model` in `state`."""
    WebDriverWait(browser, HANG_GUARD_S).until(
        lambda b: (read_table(b) or {}).get(model, {}).get("state") == state)


def index(server):
    request = urllib.request.Request(f"http://{server.url}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=HANG_GUARD_S) as response:
        return {r["name"]: r for r in json.load(response)}


def test_the_page_lists_every_model_ready_with_its_size(server, browser):
    browser.get(f"http://{server.url}/")
    assert browser.title == "Plinth"
    assert browser.find_element(By.ID, "readiness").text == "ready"
    table = rows(browser)
    assert set(table) == EXAMPLE_MODELS
    sizes = index(server)
    for name, row in table.items():
        assert row["state"] == "READY", (name, row)
        mib = sizes[name]["resident_bytes"] / (1 << 20)
        assert row["resident"] == f"{mib:.1f} MiB", (name, row, mib)
        assert mib > 1
    assert table["mobilenet_v2_torchscript"]["platform"] == "pytorch_libtorch"
    assert table["ocr_cls"]["platform"] == "onnxruntime_onnx"
    if os.environ.get("PLINTH_SCREENSHOT"):
        pathlib.Path(os.environ["PLINTH_SCREENSHOT"]).write_bytes(browser.get_screenshot_as_png())


def test_the_unload_button_makes_a_model_unavailable(server, browser):
    browser.get(f"http://{server.url}/")
    browser.find_element(By.CSS_SELECTOR, 'button.unload[data-model="ocr_rec"]').click()
    # The button's script reloads the page once the unload is done.
    until_state(browser, "ocr_rec", "UNAVAILABLE")
    assert index(server)["ocr_rec"]["state"] == "UNAVAILABLE"
    assert rows(browser)["ocr_rec"]["resident"] == "—"
    # And its Load button brings it back.
    browser.find_element(By.CSS_SELECTOR, 'button.load[data-model="ocr_rec"]').click()
    until_state(browser, "ocr_rec", "READY")
    assert index(server)["ocr_rec"]["state"] == "READY"


def test_the_page_shows_only_what_the_restricted_apis_would(tmp_path):
    """With model-repository and statistics restricted (as docs/security.md
    advises), the page without the key shows no model, state, failure
    reason (with its file path) or rate; with the key it shows them."""
    repo = tmp_path / "repo"
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text('backend: "onnxruntime"\nmax_batch_size: 0\n')
    (repo / "served" / "1").mkdir(parents=True)
    (repo / "served" / "config.pbtxt").write_text(
        'backend: "identity"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]\n')
    server = Plinth(repo, "--strict-readiness", "false",
                    "--http-restricted-api", "model-repository,statistics:admin-key=secret")
    try:
        def page(headers):
            request = urllib.request.Request(f"http://{server.url}/", headers=headers)
            with urllib.request.urlopen(request, timeout=HANG_GUARD_S) as response:
                return html.unescape(response.read().decode())

        hidden, shown = page({}), page({"admin-key": "secret"})
        failure_path = str(repo / "broken" / "1")
        for secret in ("served", "broken", ">UNAVAILABLE<", failure_path, "requests/s", "p99 ms"):
            assert secret not in hidden, secret
            assert secret in shown, secret
        assert ("models, their states and rollouts: the 'model-repository' API is restricted; "
                "send its header 'admin-key'") in hidden
        assert "request rates, latencies and queues: the 'statistics' API is restricted" in hidden
        assert "is restricted" not in shown
    finally:
        server.stop()

"""The status page (`GET /`, issue 19) in a real headless browser (Debian's
Chromium and ChromeDriver, driven by selenium): it lists the example
repository's models READY with their sizes, and in explicit mode its
Unload button takes a model out, which the repository index confirms.

Set PLINTH_SCREENSHOT=PATH to keep a screenshot of the page (the one in
docs/ was taken so)."""

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
                  "spam_classifier", "vad"}


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

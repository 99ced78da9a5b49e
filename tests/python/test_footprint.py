"""A model's accounted size is a property of the model (issue 18.2):
identical copies of ocr_cls measure the same whether they load on a quiet
server or while other requests decode large images, and under a budget a
load evicts only what the budget needs."""

import io
import json
import shutil
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
from PIL import Image

from conftest import HANG_GUARD_S, ROOT, Plinth, wait_until

COPIES = ["cls_1", "cls_2", "cls_3", "cls_4"]
CLIENTS = 4


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    for name in COPIES:
        shutil.copytree(ROOT / "model_repository/ocr_cls", repo / name)
        config = repo / name / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "ocr_cls"', f'name: "{name}"'))
    shutil.copytree(ROOT / "model_repository/mobilenet_v2", repo / "mobilenet_v2")
    return repo


@pytest.fixture(scope="module")
def large_image():
    """A 2400x1800 photo-sized PNG of noise: tens of MB decoded, in the
    plugin and in the host, for every request."""
    pixels = np.random.default_rng(18).integers(0, 256, size=(1800, 2400, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG", compress_level=1)
    return out.getvalue()


def post(server, path, body=b"{}"):
    request = urllib.request.Request(f"http://{server.url}{path}", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=HANG_GUARD_S) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def index(server):
    _, rows = post(server, "/v2/repository/index")
    return {r["name"]: r for r in rows}


def resident(server):
    return {name: row["resident_bytes"] for name, row in index(server).items() if row["state"] == "READY"}


def evictions(server, model):
    text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=HANG_GUARD_S).read().decode()
    prefix = f'plinth_model_evictions_total{{model="{model}"}} '
    return next((float(l[len(prefix):]) for l in text.splitlines() if l.startswith(prefix)), 0.0)


class Traffic:
    """CLIENTS threads posting the large image to mobilenet_v2's /predict
    until stopped; `answered` counts the answers, all of which must be
    200."""

    def __init__(self, server, image):
        self.stopping = threading.Event()
        self.answered = 0
        self.failures = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(server, image)) for _ in range(CLIENTS)]
        for t in self.threads:
            t.start()
        wait_until("the traffic is answered", lambda: self.answered >= CLIENTS)

    def _run(self, server, image):
        while not self.stopping.is_set():
            status, answer = post(server, "/v2/models/mobilenet_v2/predict", image)
            with self.lock:
                self.answered += 1
                if status != 200:
                    self.failures.append((status, answer))

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(HANG_GUARD_S)
        assert not self.failures, self.failures[:3]


def test_identical_copies_measure_alike_with_and_without_traffic(repo, large_image):
    server = Plinth(repo, "--model-control-mode", "explicit", "--load-model", "mobilenet_v2")
    try:
        assert post(server, "/v2/repository/models/cls_1/load")[0] == 200
        sizes = {"cls_1": resident(server)["cls_1"]}
        traffic = Traffic(server, large_image)
        try:
            for name in COPIES[1:]:
                before = traffic.answered
                assert post(server, f"/v2/repository/models/{name}/load")[0] == 200
                sizes[name] = resident(server)[name]
                # The load ran while the clients' requests kept going.
                wait_until("traffic goes on after the load", lambda: traffic.answered > before)
        finally:
            traffic.stop()
        quiet = sizes["cls_1"]
        assert quiet > 1 << 20, sizes
        for name, size in sizes.items():
            assert 0.8 * quiet <= size <= 1.2 * quiet, f"{name}: {sizes}"
    finally:
        server.stop()


def test_a_load_under_traffic_evicts_only_what_the_budget_needs(repo, large_image):
    # The sizes, measured on a quiet server: a property of each model.
    quiet = Plinth(repo, "--model-control-mode", "explicit", "--load-model", "mobilenet_v2", "--load-model", "cls_1")
    try:
        sizes = resident(quiet)
    finally:
        quiet.stop()
    copy, mobilenet = sizes["cls_1"], sizes["mobilenet_v2"]
    # Room for mobilenet_v2 and two and a half copies.
    budget = mobilenet + copy * 5 // 2
    server = Plinth(repo, "--model-control-mode", "on_demand", "--model-memory-budget", str(budget))
    try:
        traffic = Traffic(server, large_image)
        try:
            for name in COPIES[:2]:
                assert post(server, f"/v2/models/{name}/predict", (ROOT / "tests/fixtures/cls_upright.png").read_bytes())[0] == 200
            assert set(resident(server)) == {"mobilenet_v2", "cls_1", "cls_2"}, "all three fit"
            # One more copy: exactly one idle copy, the least recently used,
            # makes room; the busy mobilenet_v2 stays.
            status, answer = post(server, "/v2/models/cls_3/predict", (ROOT / "tests/fixtures/cls_upright.png").read_bytes())
            assert status == 200 and answer["angle"] == 0, answer
            assert set(resident(server)) == {"mobilenet_v2", "cls_2", "cls_3"}
            assert [evictions(server, m) for m in ("cls_1", "cls_2", "mobilenet_v2")] == [1, 0, 0]
        finally:
            traffic.stop()
        # Nothing was refused or remembered as too large: every copy loads.
        for name in COPIES:
            assert post(server, f"/v2/models/{name}/predict", (ROOT / "tests/fixtures/cls_upright.png").read_bytes())[0] == 200
        for name, row in index(server).items():
            assert "--model-memory-budget" not in row.get("reason", ""), row
    finally:
        server.stop()

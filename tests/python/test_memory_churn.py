"""Memory after churn (issue 18, part 6): unloading and loading a model
again and again under traffic must not make the server's memory grow, and
a version that is gone takes its metric series with it.

The growth this guards against came from glibc's malloc opening an arena
for each new thread (eight per core by default): loads run on short-lived
threads, and each arena kept its own fragments of what the loads had
allocated. `plinth serve` bounds the arenas; the test checks the RSS after
the cycles against the RSS once warm (after the first cycles, not from a
cold start), and the number of malloc heaps in the process."""

import pathlib
import shutil
import threading
import urllib.error
import urllib.request

from conftest import ROOT, Plinth, wait_until

CYCLES = 30
FIXTURES = ROOT / "tests/fixtures"
# The bound `plinth serve` sets on glibc's arenas (runtime/src/main.rs).
MALLOC_ARENAS = 2


def post(url, path, body=b"{}", content_type="application/json"):
    request = urllib.request.Request(f"http://{url}{path}", data=body, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def rss_kib(pid):
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))


def malloc_heaps(pid):
    """glibc malloc's heaps in the process: the main arena's `[heap]` and
    each other arena's 64 MiB-aligned heap (an anonymous read-write mapping
    with the reserved rest of its 64 MiB behind it)."""
    heap_max = 64 << 20
    maps = []
    for line in pathlib.Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        maps.append((start, end, fields[1], fields[5] if len(fields) > 5 else ""))
    heaps = 0
    for i, (start, end, perms, name) in enumerate(maps):
        after = maps[i + 1] if i + 1 < len(maps) else None
        arena = (not name and perms == "rw-p" and start % heap_max == 0
                 and (end - start == heap_max
                      or after and after[0] == end and after[2] == "---p" and after[1] - start == heap_max))
        heaps += name == "[heap]" or arena
    return heaps


def series_of(server, model):
    """The /metrics lines of `model`'s per-version series."""
    text = urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=120).read().decode()
    return [line for line in text.splitlines() if f'model="{model}",' in line and "version=" in line]


class Traffic:
    """Clients sending /predict to the models without pause until stopped;
    counts the answers by status."""

    def __init__(self, url, bodies, clients=4):
        self.url, self.bodies, self.statuses = url, bodies, {}
        self.lock, self.done = threading.Lock(), threading.Event()
        self.threads = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(clients)]
        for t in self.threads:
            t.start()

    def client(self, i):
        models = list(self.bodies)
        while not self.done.is_set():
            model = models[i % len(models)]
            i += 1
            status = post(self.url, f"/v2/models/{model}/predict", self.bodies[model], "image/png")
            with self.lock:
                self.statuses[status] = self.statuses.get(status, 0) + 1

    def answers(self):
        with self.lock:
            return sum(self.statuses.values())

    def stop(self):
        self.done.set()
        for t in self.threads:
            t.join()


def test_unload_load_cycles_under_traffic_keep_memory_flat(tmp_path):
    for model in ("ocr_cls", "ocr_rec"):
        shutil.copytree(ROOT / "model_repository" / model, tmp_path / model)
    server = Plinth(tmp_path, "--model-control-mode", "explicit", "--load-model", "ocr_cls", "--load-model", "ocr_rec")
    bodies = {"ocr_cls": (FIXTURES / "cls_upright.png").read_bytes(), "ocr_rec": (FIXTURES / "line_hello.png").read_bytes()}
    traffic = Traffic(server.url, bodies)
    pid = server.proc.pid

    def cycle():
        assert post(server.url, "/v2/repository/models/ocr_rec/unload") == 200
        assert post(server.url, "/v2/repository/models/ocr_rec/load") == 200

    try:
        wait_until("the traffic is warm", lambda: traffic.answers() >= 100)
        for _ in range(2):
            cycle()
        warm = rss_kib(pid)
        for _ in range(CYCLES):
            cycle()
        after, heaps = rss_kib(pid), malloc_heaps(pid)
        traffic.stop()
        assert after <= warm * 1.10, (
            f"RSS {warm / 1024:.1f} MiB once warm, {after / 1024:.1f} MiB after {CYCLES} more unload/load cycles "
            f"(+{after / warm - 1:.1%}); {heaps} malloc heaps")
        assert heaps <= MALLOC_ARENAS + 2, f"{heaps} malloc heaps: are the arenas bounded? ({traffic.statuses})"
        assert set(traffic.statuses) <= {200, 503}, traffic.statuses

        # Unloaded, the model's series go once its last request finished.
        assert series_of(server, "ocr_rec")
        assert post(server.url, "/v2/repository/models/ocr_rec/unload") == 200
        wait_until("ocr_rec's series are gone", lambda: not series_of(server, "ocr_rec"))
        assert series_of(server, "ocr_cls"), "the other model's series stay"
    finally:
        traffic.stop()
        server.stop()


def test_a_replaced_version_takes_its_series_with_it(tmp_path):
    shutil.copytree(ROOT / "model_repository/ocr_cls", tmp_path / "ocr_cls")
    server = Plinth(tmp_path, "--model-control-mode", "explicit", "--load-model", "ocr_cls")
    body = (FIXTURES / "cls_upright.png").read_bytes()
    try:
        assert post(server.url, "/v2/models/ocr_cls/predict", body, "image/png") == 200
        assert any('version="1"' in line for line in series_of(server, "ocr_cls"))
        (tmp_path / "ocr_cls/2").mkdir()
        shutil.copy(tmp_path / "ocr_cls/1/model.onnx", tmp_path / "ocr_cls/2/model.onnx")
        assert post(server.url, "/v2/repository/models/ocr_cls/load") == 200
        assert post(server.url, "/v2/models/ocr_cls/predict", body, "image/png") == 200
        wait_until("version 1's series are gone",
                   lambda: not any('version="1"' in line for line in series_of(server, "ocr_cls")))
        success = 'nv_inference_request_success{model="ocr_cls",version="2"} '
        assert any(line.startswith(success) and float(line[len(success):]) >= 1 for line in series_of(server, "ocr_cls"))
    finally:
        server.stop()

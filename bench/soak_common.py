"""What the soak and chaos scripts share (bench/memory_churn.py,
bench/soak.py, bench/storm.py, bench/kill_restart.py, bench/file_loss.py):
the server's resident memory, the repository API, a copy of an example
model under another name, and light background traffic that records every
answer's status.
"""

import collections
import json
import pathlib
import re
import shutil
import sys
import threading
import time
import urllib.error
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/python"))
from conftest import Plinth, wait_until  # noqa: E402,F401

FIXTURES = ROOT / "tests/fixtures"
# The request body each example model answers.
BODIES = {"ocr_cls": "cls_upright.png", "ocr_rec": "line_hello.png", "ocr": "page.png"}


def rss_mb(pid):
    """The resident set size of process `pid`, in MB (10^6 bytes)."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError(f"no VmRSS for {pid}")


def copy_model(source, repo, name=None):
    """Copies example model `source` into `repo` as `name` (default: the
    same name); returns its folder."""
    name = name or source
    dest = pathlib.Path(repo) / name
    shutil.copytree(ROOT / "model_repository" / source, dest)
    if name != source:
        config = dest / "config.pbtxt"
        config.write_text(config.read_text().replace(f'name: "{source}"', f'name: "{name}"'))
    return dest


def call(url, path, body=None, content_type="application/json", timeout=120):
    """POSTs `body` (or GETs without one) to http://`url``path`; returns
    (status, body text). A connection failure is status 0."""
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{url}{path}", data=data, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as e:
        return 0, f"{type(e).__name__}: {e}"


def load(url, model, body=None):
    """POST /v2/repository/models/`model`/load; returns (status, body)."""
    return call(url, f"/v2/repository/models/{model}/load", body or {})


def unload(url, model):
    """POST /v2/repository/models/`model`/unload; returns (status, body)."""
    return call(url, f"/v2/repository/models/{model}/unload", {})


def ready(url, model, version=None):
    """Whether `model` (or one version of it) answers ready."""
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/ready"
    return call(url, path, timeout=10)[0] == 200


def metrics_text(server):
    """The server's /metrics text."""
    return call(server.metrics_url, "/metrics", timeout=60)[1]


class Traffic:
    """Light background traffic: `threads` clients, each sending one
    /predict to one of `models` in turn, then pausing `pause_s`; `models`
    maps each model's name to the example model it is a copy of. Every
    answer is recorded as (sent at, latency ms, model, status, body) in
    `results`; status 0 is a connection failure."""

    def __init__(self, url, models, threads=2, pause_s=0.02, timeout=60):
        self.url, self.models, self.pause_s, self.timeout = url, list(models), pause_s, timeout
        self.bodies = {m: (FIXTURES / BODIES[source]).read_bytes() for m, source in models.items()}
        self.results = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(threads)]

    def __enter__(self):
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        """Stops the clients and waits for their last answers."""
        self._stop.set()
        for t in self._threads:
            t.join()

    def _client(self, i):
        n = i
        while not self._stop.is_set():
            model = self.models[n % len(self.models)]
            n += 1
            sent = time.perf_counter()
            status, body = call(self.url, f"/v2/models/{model}/predict", self.bodies[model], "image/png",
                                timeout=self.timeout)
            with self._lock:
                self.results.append((sent, (time.perf_counter() - sent) * 1000, model, status, body))
            self._stop.wait(self.pause_s)

    def since(self, start, end=float("inf")):
        """The results of requests sent from `start` up to `end`
        (time.perf_counter() values)."""
        with self._lock:
            return [r for r in self.results if start <= r[0] < end]

    def count(self):
        """How many answers have come back."""
        with self._lock:
            return len(self.results)


def tally(values):
    """{value: how many times}, in value order."""
    return dict(sorted(collections.Counter(values).items()))


def by_status(results):
    """{status: count} of Traffic `results`, in status order."""
    return tally(r[3] for r in results)


class _KeptFolder:
    """A TemporaryDirectory look-alike for a folder that outlives the server."""

    def __init__(self, name):
        self.name = str(name)

    def cleanup(self):
        pass


def serve_keeping_plugins(repository, plugin_cache, *extra):
    """Plinth serving `repository` with its compiled plugins in
    `plugin_cache`, which is kept afterwards, so a later server (a restart)
    finds what this one wrote there."""
    import conftest

    real = conftest.tempfile.TemporaryDirectory
    conftest.tempfile.TemporaryDirectory = lambda **_: _KeptFolder(plugin_cache)
    try:
        return Plinth(repository, *extra)
    finally:
        conftest.tempfile.TemporaryDirectory = real


def malloc_heaps(pid):
    """(heaps, MB resident in them) of glibc's malloc in process `pid`: the
    main arena's `[heap]` and every other arena's 64 MiB-aligned heap
    (a readable and writable anonymous mapping, with the reserved rest of
    its 64 MiB behind it), read from /proc/PID/smaps."""
    heap_max = 64 << 20
    maps = []  # (start, end, perms, name, rss kB)
    for line in pathlib.Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            maps.append([start, end, fields[1], fields[5] if len(fields) > 5 else "", 0])
        elif fields[0] == "Rss:":
            maps[-1][4] = int(fields[1])
    heaps, kb = 0, 0
    for i, (start, end, perms, name, rss) in enumerate(maps):
        reserved = maps[i + 1] if i + 1 < len(maps) else None
        arena = (not name and perms == "rw-p" and start % heap_max == 0
                 and (end - start == heap_max
                      or reserved and reserved[0] == end and reserved[2] == "---p" and reserved[1] - start == heap_max))
        if name == "[heap]" or arena:
            heaps += 1
            kb += rss
    return heaps, kb * 1024 / 1e6


def wait_for_new_log(server, pattern, since):
    """Waits for a line of `server`'s log after its first `since` lines
    that matches `pattern`; returns its first group (or the line)."""
    found = []

    def seen():
        for line in server.log[since:]:
            match = re.search(pattern, line)
            if match:
                found.append(match.group(1) if match.groups() else line)
                return True
        return False

    wait_until(f"the log says {pattern!r}", seen)
    return found[0]

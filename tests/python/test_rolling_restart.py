"""A rolling restart on one machine: two Plinth processes behind a small
round-robin client that sends only to processes whose /v2/health/ready it
last saw answer 200 (as a Kubernetes Service does with readiness). The
second process starts and loads while the first serves; once it is ready,
the first gets SIGTERM and, no longer ready, keeps serving for its
--drain-delay-secs while the client notices. No request fails, none goes to
a process the client has not seen ready, and the first exits cleanly."""

import http.client
import itertools
import shutil
import signal
import threading
import time

from conftest import ROOT, Plinth, wait_until

BODY = (ROOT / "tests/fixtures/cls_rotated.png").read_bytes()
POLL_S = 0.02
# Long enough for the balancer, polling every POLL_S, to see the process
# unready before it refuses: a load balancer's own margin, not a test's wait.
DRAIN_DELAY = "3"


class Balancer:
    """Round robin over the backends last seen ready; polls readiness."""

    def __init__(self):
        self.ready = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def watch(self, url):
        def poll():
            conn = None
            while not self.stop.is_set():
                try:
                    conn = conn or http.client.HTTPConnection(url, timeout=2)
                    conn.request("GET", "/v2/health/ready")
                    response = conn.getresponse()
                    response.read()
                    ok = response.status == 200
                except OSError:
                    ok, conn = False, None
                with self.lock:
                    self.ready[url] = ok
                time.sleep(POLL_S)
        threading.Thread(target=poll, daemon=True).start()

    def pick(self, turn):
        with self.lock:
            ready = sorted(url for url, ok in self.ready.items() if ok)
        return ready[turn % len(ready)] if ready else None


def test_a_rolling_restart_loses_no_request(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "model_repository/ocr_cls", repo / "ocr_cls")
    old = Plinth(repo, "--drain-delay-secs", DRAIN_DELAY)
    balancer = Balancer()
    balancer.watch(old.url)
    results, sent_to = [], []

    def client():
        connections = {}
        for turn in itertools.count():
            if balancer.stop.is_set():
                return
            url = balancer.pick(turn)
            if url is None:
                time.sleep(POLL_S)
                continue
            conn = connections.setdefault(url, http.client.HTTPConnection(url, timeout=30))
            try:
                conn.request("POST", "/v2/models/ocr_cls/predict", BODY, {"Content-Type": "image/png"})
                response = conn.getresponse()
                results.append((url, response.status, response.read()))
            except OSError as e:
                connections.pop(url)
                results.append((url, None, str(e).encode()))
            sent_to.append(url)

    def answers_from(url):
        return sum(1 for u, status, _ in list(results) if u == url and status == 200)

    clients = [threading.Thread(target=client) for _ in range(4)]
    for c in clients:
        c.start()
    wait_until("the old process serves", lambda: answers_from(old.url) >= 10)
    new = Plinth(repo, "--drain-delay-secs", DRAIN_DELAY)  # loads while the old one serves
    balancer.watch(new.url)
    wait_until("the new process serves", lambda: answers_from(new.url) >= 10)
    old.proc.send_signal(signal.SIGTERM)
    assert old.proc.wait(timeout=60) == 0, "".join(old.log)
    after = answers_from(new.url)
    wait_until("the new process serves on alone", lambda: answers_from(new.url) >= after + 10)
    balancer.stop.set()
    for c in clients:
        c.join()
    new.stop()

    failed = [(url, status, body[:200]) for url, status, body in results if status != 200]
    assert not failed, failed
    served_by = {url: sum(1 for u in sent_to if u == url) for url in (old.url, new.url)}
    assert served_by[old.url] > 0 and served_by[new.url] > 0, served_by
    assert any("still serving for the drain delay" in line for line in old.log), "".join(old.log)

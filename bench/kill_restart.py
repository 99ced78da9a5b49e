"""`kill -9` during a load, then a restart on the same repository: Plinth in
explicit mode serves ocr_cls; ocr_rec, ocr and mobilenet_v2 are loaded
through the repository API at once, and the server is killed with SIGKILL
when one of them reaches a stage of its load (a log line). A new server
then starts on the same repository and the same compiled-plugin cache in
the default mode (every model) and must serve everything READY, each model
answering correctly. One round per stage; each prints what was loading when
the kill came, what the kill left in the plugin cache, and what the restart
serves.

Usage: make soak   (or: .venv/bin/python bench/kill_restart.py)
"""

import json
import os
import pathlib
import re
import signal
import tempfile
import threading
import time

from soak_common import ROOT, call, copy_model, load, serve_keeping_plugins, tally

LOADED = ["ocr_rec", "ocr", "mobilenet_v2"]
MODELS = ["ocr_cls"] + LOADED
# (model, the log line its load reaches when the kill comes)
ROUNDS = [("ocr_rec", "load: start"), ("mobilenet_v2", "load: session created"), ("ocr", "load: start"),
          ("ocr_rec", "load: warm-up done")]
BODIES = {"ocr_cls": ROOT / "tests/fixtures/cls_upright.png", "ocr_rec": ROOT / "tests/fixtures/line_hello.png",
          "ocr": ROOT / "tests/fixtures/page.png", "mobilenet_v2": ROOT / ".cache/samples/china.jpg"}


def correct(model, status, body):
    """Whether `body` is the right answer of `model` to its sample."""
    if status != 200:
        return False
    answer = json.loads(body)
    return {
        "ocr_cls": lambda: answer.get("angle") == 0,
        "ocr_rec": lambda: answer.get("text") == "Hello World",
        "ocr": lambda: any("Invoice" in line.get("text", "") for line in answer.get("lines", [])),
        "mobilenet_v2": lambda: answer.get("classes", [{}])[0].get("label") == "palace",
    }[model]()


def loading(log, models):
    """The last load stage the log shows for each of `models`."""
    stages = {}
    for line in log:
        found = re.search(r"(load: [a-z -]+?)\s+model=(\S+)", line)
        if found and found.group(2) in models:
            stages[found.group(2)] = found.group(1)
    return {m: stages.get(m, "not started") for m in models}


def round_trip(repo, cache, model, stage):
    server = serve_keeping_plugins(repo, cache, "--model-control-mode", "explicit", "--load-model", "ocr_cls")
    threads = [threading.Thread(target=load, args=(server.url, m), daemon=True) for m in LOADED]
    for t in threads:
        t.start()
    server.wait_for_log(rf"{re.escape(stage)}\s+model={model}\b")
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(timeout=60)
    killed_during = loading(server.log, LOADED)
    leftovers = sorted(p.name for p in pathlib.Path(cache).iterdir() if not p.name.endswith(".cwasm"))
    artefacts = len(list(pathlib.Path(cache).glob("*.cwasm")))
    start = time.perf_counter()
    restarted = serve_keeping_plugins(repo, cache)
    try:
        took = time.perf_counter() - start
        index = json.loads(call(restarted.url, "/v2/repository/index", {})[1])
        states = {row["name"]: row.get("state") for row in index}
        health = call(restarted.url, "/v2/health/ready")[0]
        answers = {m: correct(m, *call(restarted.url, f"/v2/models/{m}/predict", BODIES[m].read_bytes(),
                                       "application/octet-stream")) for m in MODELS}
    finally:
        restarted.stop()
    print(f"killed once {model} logged '{stage}'; the last stage each load had logged: {killed_during}")
    print(f"  plugin cache after the kill: {artefacts} compiled plugins, other files {leftovers or 'none'}")
    print(f"  restart (default mode, same repository and cache): start-up loading finished after {took:.1f} s; "
          f"states {tally(states.values())}, ready {health}, correct answers "
          f"{sum(answers.values())}/{len(answers)}{'' if all(answers.values()) else f' {answers}'}")
    return all(s == "READY" for s in states.values()) and health == 200 and all(answers.values())


def main():
    repo = tempfile.mkdtemp()
    for model in MODELS:
        copy_model(model, repo)
    cache = tempfile.mkdtemp(prefix="plinth-plugins-")  # empty: the first round compiles every plugin
    ok = [round_trip(repo, cache, model, stage) for model, stage in ROUNDS]
    print(f"{sum(ok)} of {len(ok)} restarts served every model READY and correctly")


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"took {time.perf_counter() - start:.0f} s")

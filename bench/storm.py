"""A load/unload storm under traffic: Plinth in explicit mode serves four
copies of ocr_cls and one of ocr_rec; `--operators` threads load and unload
random models through the repository API (duplicate and crossing calls
included) for `--seconds`, while `--clients` threads request random models.
Prints the requests' and the repository calls' outcomes by status, every
5xx other than 503 (there should be none), and whether the server is still
healthy afterwards: live, ready once every model is loaded again, and every
model answering correctly.

Usage: make soak   (or: .venv/bin/python bench/storm.py [--seconds 60])
"""

import argparse
import collections
import json
import random
import tempfile
import threading
import time

from soak_common import Plinth, Traffic, by_status, call, copy_model, load, tally, unload

MODELS = {f"cls_{i}": "ocr_cls" for i in range(4)} | {"rec_0": "ocr_rec"}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--operators", type=int, default=3, help="threads loading and unloading")
    parser.add_argument("--clients", type=int, default=4, help="threads sending /predict")
    args = parser.parse_args()
    repo = tempfile.mkdtemp()
    for name, source in MODELS.items():
        copy_model(source, repo, name)
    server = Plinth(repo, "--model-control-mode", "explicit", *[f"--load-model={m}" for m in MODELS])
    calls = collections.Counter()  # (action, status)
    odd = []  # repository calls answering neither 200 nor a 4xx/503 with a reason
    lock = threading.Lock()
    stop = threading.Event()

    def operator(seed):
        rng = random.Random(seed)
        while not stop.is_set():
            model = rng.choice(list(MODELS))
            action = rng.choice((load, unload))
            status, body = action(server.url, model)
            with lock:
                calls[(action.__name__, status)] += 1
                if status >= 500 and status != 503 or status == 0:
                    odd.append(f"{action.__name__} {model}: {status} {body[:200]}")
            stop.wait(rng.uniform(0, 0.2))

    try:
        with Traffic(server.url, MODELS, threads=args.clients, pause_s=0.005) as traffic:
            operators = [threading.Thread(target=operator, args=(i,)) for i in range(args.operators)]
            for t in operators:
                t.start()
            stop.wait(args.seconds)
            stop.set()
            for t in operators:
                t.join()
        results = traffic.results
        # Afterwards: every model loaded again, then the server's health.
        reloads = {m: load(server.url, m)[0] for m in MODELS}
        live = call(server.url, "/v2/health/live")[0]
        health = call(server.url, "/v2/health/ready")[0]
        index = json.loads(call(server.url, "/v2/repository/index", {})[1])
        answers = {m: call(server.url, f"/v2/models/{m}/predict", traffic.bodies[m], "image/png")[0] for m in MODELS}
        alive = server.proc.poll() is None
    finally:
        server.stop()
    print(f"{args.seconds:g} s storm: {args.operators} threads loading/unloading {len(MODELS)} models "
          f"(explicit mode), {args.clients} clients requesting them")
    print(f"  requests: {len(results)}, by status {by_status(results)}")
    for status in sorted({r[3] for r in results} - {200, 503}):
        sample = next(r for r in results if r[3] == status)
        print(f"    status {status}, e.g. {sample[2]}: {sample[4][:200]}")
    unavailable = [r for r in results if r[3] == 503]
    if unavailable:
        reasons = collections.Counter(json.loads(r[4]).get("error", "")[:90] for r in unavailable)
        print(f"    503 reasons: {dict(reasons.most_common(3))}")
    five = [r for r in results if r[3] >= 500 and r[3] != 503]
    print(f"  5xx other than 503 among requests: {len(five)}")
    print("  repository calls: " + ", ".join(f"{a} {s}: {n}" for (a, s), n in sorted(calls.items())))
    print(f"  repository calls answering 5xx other than 503 or no answer: {len(odd)}")
    for line in odd[:5]:
        print(f"    {line}")
    states = collections.Counter(row.get("state") for row in index)
    print(f"  afterwards: process alive {alive}, live {live}, loads {tally(reloads.values())}, ready {health}, "
          f"index states {dict(states)}, /predict {tally(answers.values())}")


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"took {time.perf_counter() - start:.0f} s")

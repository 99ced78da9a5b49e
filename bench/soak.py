"""The reload soak: Plinth in explicit mode serves ocr_cls under light
traffic while a new version of it is rolled out `--reloads` times (version
N+1's folder is written, POST /v2/repository/models/ocr_cls/load makes it
READY and retires version N; the folders of versions retired
`--keep-folders` reloads ago are deleted, so none is deleted while a request
may still run on it: with `--keep-folders 0`, version N's folder goes as
soon as the load returns, while N may still be draining). Prints the
server's RSS after 10, 100, 250 and 500 reloads and its growth per reload,
the size of /metrics, the ratio of the mean latency of the requests sent
during the last 50 reloads to that of the first 50, and the failed
requests (anything but a correct 200; there must be none).

Usage: make soak   (or: .venv/bin/python bench/soak.py [--reloads 500])
"""

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

from soak_common import Plinth, Traffic, by_status, copy_model, load, metrics_text, rss_mb, wait_until

MARKS = (10, 100, 250, 500)
MODEL = "ocr_cls"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reloads", type=int, default=500)
    parser.add_argument("--threads", type=int, default=2, help="traffic clients")
    parser.add_argument("--keep-folders", type=int, default=2, help="retired version folders kept on disk")
    args = parser.parse_args()
    repo = tempfile.mkdtemp()
    folder = copy_model(MODEL, repo)
    weights = folder / "1/model.onnx"
    server = Plinth(repo, "--model-control-mode", "explicit", "--load-model", MODEL)
    pid = server.proc.pid
    rss, metrics_size, spans = {}, {}, []  # spans: (first sent, last sent) of each reload
    try:
        with Traffic(server.url, {MODEL: MODEL}, threads=args.threads) as traffic:
            wait_until("the traffic is warm", lambda: traffic.count() >= 50)
            rss[0], metrics_size[0] = rss_mb(pid), len(metrics_text(server))
            for reload in range(1, args.reloads + 1):
                start = time.perf_counter()
                version = folder / str(reload + 1)
                version.mkdir()
                os.link(weights, version / "model.onnx")
                status, body = load(server.url, MODEL)
                assert status == 200, f"reload {reload}: load answered {status}: {body}"
                if reload - args.keep_folders >= 1:
                    shutil.rmtree(folder / str(reload - args.keep_folders))
                weights = version / "model.onnx"
                spans.append((start, time.perf_counter()))
                if reload in MARKS or reload == args.reloads:
                    rss[reload], metrics_size[reload] = rss_mb(pid), len(metrics_text(server))
        results = traffic.results
    finally:
        server.stop()

    def correct(r):
        return r[3] == 200 and json.loads(r[4]).get("angle") == 0

    def mean_latency(reloads):
        return statistics.mean(r[1] for r in traffic.since(reloads[0][0], reloads[-1][1]))

    print(f"{args.reloads} version reloads of {MODEL} (explicit mode, a new version folder and a load each; "
          f"retired folders deleted {args.keep_folders} reloads later), {args.threads} clients")
    for reload, mb in rss.items():
        growth = "" if reload == 0 else f"  {(mb - rss[0]) * 1000 / reload:6.1f} KB per reload since the start"
        print(f"  after reload {reload:4d}: RSS {mb:7.1f} MB  /metrics {metrics_size[reload]:7d} bytes{growth}")
    marks = sorted(rss)
    if len(marks) > 2:
        a, b = marks[-2], marks[-1]
        print(f"  from reload {a} to {b}: {(rss[b] - rss[a]) * 1000 / (b - a):.1f} KB RSS, "
              f"{(metrics_size[b] - metrics_size[a]) / (b - a):.0f} bytes of /metrics per reload")
    window = min(50, len(spans))
    first, last = mean_latency(spans[:window]), mean_latency(spans[-window:])
    print(f"  mean latency: first {window} reloads {first:.2f} ms, last {window} {last:.2f} ms "
          f"(ratio last/first {last / first:.2f})")
    failed = [r for r in results if not correct(r)]
    print(f"  requests: {len(results)} sent, {len(failed)} failed; by status {by_status(results)}")
    for r in failed[:5]:
        print(f"    failed: status {r[3]}: {r[4][:200]}")


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"took {time.perf_counter() - start:.0f} s")

"""Memory after churn: Plinth in explicit mode serves ocr_cls and ocr_rec
under traffic while one of them (`--model`) is unloaded and loaded again
through the repository API, `--cycles` times. Prints the server's RSS after the first
load and at points through the cycles, its growth from the start and from
cycle 5 (warm), glibc malloc's heaps (one per arena, or more) and the memory
resident in them, the size of /metrics, and the requests' outcomes by status
(503 is expected for the cycled model while it is unloaded).

The allocator's environment passes through to the server, so a variant is
one more run, e.g. `MALLOC_ARENA_MAX=16 .venv/bin/python bench/memory_churn.py`
(glibc's default on two cores; `plinth serve` sets 2 when the environment
does not), or `LD_PRELOAD=.../libjemalloc.so.2`. `--gdb-trim` shows how much
`malloc_trim(0)` would give back after the cycles.

Usage: make soak   (or: .venv/bin/python bench/memory_churn.py [--cycles 100])
"""

import argparse
import os
import subprocess
import tempfile
import time

from soak_common import (Plinth, Traffic, by_status, copy_model, load, malloc_heaps, metrics_text, rss_mb, unload,
                         wait_until)

MARKS = (1, 5, 10, 25, 50, 100, 250, 500)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--model", default="ocr_rec", choices=["ocr_cls", "ocr_rec"], help="the model cycled")
    parser.add_argument("--threads", type=int, default=4, help="traffic clients")
    parser.add_argument("--pause-ms", type=float, default=0, help="each client's pause between requests")
    parser.add_argument("--gdb-trim", action="store_true",
                        help="after the cycles, call malloc_trim(0) in the server through gdb and measure again")
    args = parser.parse_args()
    cycled = args.model
    repo = tempfile.mkdtemp()
    for model in ("ocr_cls", "ocr_rec"):
        copy_model(model, repo)
    server = Plinth(repo, "--model-control-mode", "explicit", "--load-model", "ocr_cls", "--load-model", "ocr_rec")
    pid = server.proc.pid
    rss, heaps = {}, {}
    try:
        with Traffic(server.url, {"ocr_cls": "ocr_cls", "ocr_rec": "ocr_rec"}, threads=args.threads,
                     pause_s=args.pause_ms / 1000) as traffic:
            wait_until("the traffic is warm", lambda: traffic.count() >= 100)
            metrics_start = metrics_text(server)
            rss[0], heaps[0] = rss_mb(pid), malloc_heaps(pid)
            for cycle in range(1, args.cycles + 1):
                for action in (unload, load):
                    status, body = action(server.url, cycled)
                    assert status == 200, f"cycle {cycle}: {action.__name__} answered {status}: {body}"
                if cycle in MARKS or cycle == args.cycles:
                    # A few answers from the reloaded model before measuring.
                    seen = traffic.count()
                    wait_until("the model answers again", lambda: traffic.count() >= seen + 10)
                    rss[cycle], heaps[cycle] = rss_mb(pid), malloc_heaps(pid)
            metrics_end = metrics_text(server)
            if args.gdb_trim:
                subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "call (int) malloc_trim(0)"],
                               capture_output=True, check=True, timeout=120)
                rss["trim"], heaps["trim"] = rss_mb(pid), malloc_heaps(pid)
        results = traffic.results
    finally:
        server.stop()
    arenas = os.environ.get("MALLOC_ARENA_MAX", "unset")
    other = "ocr_rec" if cycled == "ocr_cls" else "ocr_cls"
    print(f"{args.cycles} unload/load cycles of {cycled} (explicit mode) beside {other}, {args.threads} clients "
          f"pausing {args.pause_ms:g} ms; MALLOC_ARENA_MAX {arenas}")
    warm = rss.get(5, rss[0])
    for cycle, mb in rss.items():
        when = "then malloc_trim(0)" if cycle == "trim" else f"after cycle {cycle:4d}"
        print(f"  {when}: RSS {mb:7.1f} MB  ({mb / rss[0] - 1:+6.1%} from the start, "
              f"{mb / warm - 1:+6.1%} from cycle 5); {heaps[cycle][0]} malloc heaps holding {heaps[cycle][1]:.1f} MB")
    print(f"/metrics: {len(metrics_start)} bytes, {len(metrics_start.splitlines())} lines at the start; "
          f"{len(metrics_end)} bytes, {len(metrics_end.splitlines())} lines at the end")
    for model in ("ocr_cls", "ocr_rec"):
        print(f"  {model} requests by status: {by_status([r for r in results if r[2] == model])}")


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"took {time.perf_counter() - start:.0f} s")

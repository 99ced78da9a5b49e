"""Draws the ocr_cls figures of `make bench-peers` (the CSV that
bench/peers.rs writes) as two PNGs:

- latency-vs-concurrency.png: p50 (solid) and p99 (dashed) latency per
  server against the number of concurrent clients, both axes logarithmic;
- throughput.png: rows/s per server at each concurrency, with ONNX Runtime
  in-process (batch 1, and batch min(concurrency, 8)) as lines.

Usage: .venv/bin/python bench/peers/plot.py PEERS.csv OUT_DIR
"""

import csv
import os
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLOURS = {"plinth": "#1f5fbf", "kserve": "#e07b00", "mlserver": "#2e9e44", "triton": "#c0392b"}
CEILING = "#555555"


def load(path):
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["workload"] == "ocr_cls"]
    for r in rows:
        for key in ("concurrency", "batch", "requests"):
            r[key] = int(r[key])
        for key in ("per_second", "p50_ms", "p99_ms"):
            r[key] = float(r[key])
    return rows


def servers_of(rows):
    """The servers in the order they were measured."""
    names = []
    for r in rows:
        if r["server"] != "onnxruntime" and r["server"] not in names:
            names.append(r["server"])
    return names


def series(rows, server, key, batch=None):
    points = [(r["concurrency"], r[key]) for r in rows
              if r["server"] == server and (batch is None or r["batch"] == batch)]
    return [c for c, _ in points], [v for _, v in points]


def colour(i, name):
    return COLOURS.get(name, f"C{i}")


def latency_plot(rows, out, subtitle):
    fig, ax = plt.subplots(figsize=(9, 6), dpi=120)
    for i, name in enumerate(servers_of(rows)):
        c = colour(i, name)
        x, p50 = series(rows, name, "p50_ms")
        _, p99 = series(rows, name, "p99_ms")
        ax.plot(x, p50, "-o", color=c, label=f"{name} p50", linewidth=2)
        ax.plot(x, p99, "--s", color=c, label=f"{name} p99", linewidth=1.2, markersize=4, alpha=0.8)
    x, p50 = series(rows, "onnxruntime", "p50_ms", batch=1)
    ax.plot(x, p50, ":", color=CEILING, label="ONNX Runtime in-process, batch 1, p50")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sorted({r["concurrency"] for r in rows}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.get_yaxis().set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.get_yaxis().set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("latency per request, ms (log scale)")
    ax.set_title(f"ocr_cls latency against concurrency\n{subtitle}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.13))
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def throughput_plot(rows, out, subtitle):
    names = servers_of(rows)
    levels = sorted({r["concurrency"] for r in rows})
    fig, ax = plt.subplots(figsize=(9, 6), dpi=120)
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        x, rate = series(rows, name, "per_second")
        pos = [levels.index(c) - 0.4 + width * (i + 0.5) for c in x]
        ax.bar(pos, rate, width, color=colour(i, name), label=name)
    x, rate = series(rows, "onnxruntime", "per_second", batch=1)
    ax.plot([levels.index(c) for c in x], rate, "-", color=CEILING, marker="_", markersize=20,
            label="ONNX Runtime in-process, batch 1")
    # Batch min(c, 8): batch 1 at concurrency 1.
    batched = [r for r in rows if r["server"] == "onnxruntime" and r["batch"] == min(r["concurrency"], 8)]
    if any(r["batch"] > 1 for r in batched):
        ax.plot([levels.index(r["concurrency"]) for r in batched], [r["per_second"] for r in batched], "--",
                color=CEILING, marker="_", markersize=20, label="ONNX Runtime in-process, batch min(c, 8)")
    ax.set_xticks(range(len(levels)), [str(c) for c in levels])
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("rows/s (one row per request)")
    ax.set_title(f"ocr_cls throughput against concurrency\n{subtitle}", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.13))
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    rows = load(sys.argv[1])
    if not rows:
        sys.exit(f"no ocr_cls rows in {sys.argv[1]}")
    out = pathlib.Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    subtitle = (f"one-row KServe v2 JSON requests (27,648 FP32) from one Rust client;\n"
                f"{os.cpu_count()} cores shared by the clients and all servers")
    latency_plot(rows, out / "latency-vs-concurrency.png", subtitle)
    throughput_plot(rows, out / "throughput.png", subtitle)
    print(f"plots written to {out / 'latency-vs-concurrency.png'} and {out / 'throughput.png'}")


if __name__ == "__main__":
    main()

"""perf_analyzer over HTTP at concurrency 16 against Plinth: does it stall?

Plinth serves the tiny MLP of bench/make_mlp.py (64 FP32 in, 10 out) and
ocr_cls (27,648 FP32 in; the example configuration without its plugin:
dynamic batching, max_batch_size 8). perf_analyzer
(`make setup` installs it) runs RUNS times at `--concurrency-range 16` over
HTTP, each run under a hang guard, first with its defaults, then with each
of the settings in AVOID. A run that exceeds the guard is a stall: before
killing it the script prints how many bytes sit unread in the receive
queues of perf_analyzer's sockets (`ss`: answers Plinth sent that the
client has not read) and its threads' CPU time and state.

Usage: .venv/bin/python bench/perf_analyzer_c16.py [RUNS]
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/python"))
from conftest import Plinth  # noqa: E402

PA = ROOT / ".cache/perf-analyzer"
GUARD_S = 90
# A run measures 3 windows of 400 requests at concurrency 16.
RUN = ["--concurrency-range", "16", "--measurement-mode", "count_windows",
       "--measurement-request-count", "400", "--stability-percentage", "1000", "--max-trials", "3"]
AVOID = {
    "--async (one thread, callbacks)": ["--async"],
    "--max-threads 2 (threads for the 2 cores)": ["--max-threads", "2"],
}
def evidence(pid):
    """Bytes unread in perf_analyzer's sockets, and its busiest threads."""
    ss = subprocess.run(["ss", "-tnpH"], capture_output=True, text=True).stdout
    queued = [int(line.split()[1]) for line in ss.splitlines() if f"pid={pid}," in line]
    threads = subprocess.run(["ps", "-L", "-o", "tid,pcpu,time,stat", "-p", str(pid)],
                             capture_output=True, text=True).stdout.strip().splitlines()
    return (f"{len(queued)} sockets, {sum(1 for q in queued if q)} with unread bytes "
            f"({sum(queued)} bytes); threads:\n    " + "\n    ".join(threads[:20]))


def run_pa(url, model, extra):
    """One perf_analyzer run; (finished, detail)."""
    cudart = next(PA.glob("lib/python*/site-packages/nvidia/cuda_runtime/lib"))
    env = dict(os.environ, LD_LIBRARY_PATH=str(cudart))
    proc = subprocess.Popen([PA / "bin/perf_analyzer", "-m", model, "-u", url, "-i", "http", *RUN, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        out, _ = proc.communicate(timeout=GUARD_S)
    except subprocess.TimeoutExpired:
        detail = evidence(proc.pid)
        proc.kill()
        proc.communicate()
        return False, detail
    found = re.search(r"Concurrency: 16, throughput: ([\d.]+) infer/sec", out)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"perf_analyzer failed against {url}:\n{out}")
    return True, f"{float(found.group(1)):.0f} infer/s"


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    with tempfile.TemporaryDirectory() as folder:
        folder = pathlib.Path(folder)
        (folder / "repo/mlp/1").mkdir(parents=True)
        subprocess.run([ROOT / ".venv/bin/python", ROOT / "bench/make_mlp.py", folder / "repo/mlp/1/model.onnx"],
                       check=True)
        (folder / "repo/mlp/config.pbtxt").write_text('backend: "onnxruntime"\nmax_batch_size: 8\n')
        (folder / "repo/ocr_cls/1").mkdir(parents=True)
        shutil.copy(ROOT / "model_repository/ocr_cls/1/model.onnx", folder / "repo/ocr_cls/1/")
        config = (ROOT / "model_repository/ocr_cls/config.pbtxt").read_text()
        # Without its plugin: the parameters that name it or its warm-up go.
        config = re.sub(r"(?m)^parameters \{ key: \"plugin.*\n", "", config)
        (folder / "repo/ocr_cls/config.pbtxt").write_text(re.sub(r"(?ms)^parameters \{.*?^\}\n?", "", config))
        server = Plinth(folder / "repo")
        try:
            print(f"perf_analyzer -i http --concurrency-range 16 against Plinth, {runs} runs per setting, "
                  f"a run stalled if it takes over {GUARD_S} s")
            print()
            print("| model | perf_analyzer settings | runs finished | stalled | throughput of the finished |")
            print("|---|---|---|---|---|")
            for model in ["mlp", "ocr_cls"]:
                for setting, extra in {"default (sync, a thread per request)": [], **AVOID}.items():
                    results = [run_pa(server.url, model, extra) for _ in range(runs)]
                    done = [d for ok, d in results if ok]
                    stalls = [d for ok, d in results if not ok]
                    print(f"| {model} | {setting} | {len(done)} | {len(stalls)} | {', '.join(done)} |", flush=True)
                    for detail in stalls:
                        print(f"    stalled: {detail}", file=sys.stderr)
        finally:
            server.stop()


if __name__ == "__main__":
    main()

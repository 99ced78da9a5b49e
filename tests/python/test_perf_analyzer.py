"""Triton's perf_analyzer (from the tritonclient 2.51.0 wheel that
`make setup` installs into .cache/perf-analyzer) drives the example
repository's models over HTTP and gRPC and finishes without error."""

import os
import subprocess

import pytest

from conftest import ROOT

VENV = ROOT / ".cache/perf-analyzer"
BINARY = VENV / "bin/perf_analyzer"


def run(server_url, protocol, model, *extra):
    cudart = next(VENV.glob("lib/python*/site-packages/nvidia/cuda_runtime/lib"))
    env = dict(os.environ, LD_LIBRARY_PATH=str(cudart))
    result = subprocess.run(
        # A shared, noisy machine: any spread between windows is accepted,
        # since the test checks that it runs, not how fast.
        [BINARY, "-m", model, "-u", server_url, "-i", protocol, "--concurrency-range", "1:2",
         "--measurement-mode", "count_windows", "--measurement-request-count", "50",
         "--stability-percentage", "1000", "--max-trials", "5", *extra],
        capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Concurrency: 2, throughput:" in result.stdout, result.stdout
    return result.stdout


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_runs_against_plinth(example_server, protocol):
    assert BINARY.is_file(), f"{BINARY} is missing: run `make setup`"
    url = example_server.url if protocol == "http" else example_server.grpc_url
    out = run(url, protocol, "ocr_cls")
    # perf_analyzer read Plinth's statistics extension for the server side.
    assert "Execution count:" in out, out
    run(url, protocol, "ocr_rec", "--shape", "x:3,48,320")

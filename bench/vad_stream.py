"""Chunk latency of a streamed sequence, in one run: a 10-second WAV (speech
from espeak-ng between silences) streamed to the `vad` example model over
gRPC `ModelStreamInfer` as one sequence, one 512-sample window per request,
each sent after the answer to the one before (examples/vad_stream.py). The
server carries Silero VAD's state (implicit state). The baseline is the
same windows through ONNX Runtime in this process, the state carried by
hand. Prints p50 and p99 of each, their ratio and the difference (Plinth's
per-chunk overhead: gRPC, the sequence batcher, state in and out), and
checks that both give the same probabilities.

Usage: .venv/bin/python bench/vad_stream.py   (after `make setup`)
"""

import pathlib
import subprocess
import sys
import tempfile
import time
import wave

import numpy as np
import onnxruntime as ort

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/python"))
sys.path.insert(0, str(ROOT / "examples"))
import vad_stream  # noqa: E402
from conftest import Plinth  # noqa: E402

RATE = 16000
SEQUENCES = 5


def audio():
    """About 10 s of 16 kHz speech and silence."""
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "speech.wav"
        text = "Plinth streams audio to a stateful model, window by window, and answers each window at once"
        subprocess.run(["espeak-ng", "-w", str(path), text], check=True)
        with wave.open(str(path)) as w:
            source = w.getframerate()
            voice = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768.0
    times = np.arange(0, len(voice) / source, 1 / RATE)
    voice = np.interp(times, np.arange(len(voice)) / source, voice).astype(np.float32)
    silence = np.zeros(RATE * 2, np.float32)
    clip = np.concatenate([silence, voice, silence])
    return np.tile(clip, int(np.ceil(10 * RATE / len(clip))))[: 10 * RATE]


def in_process(samples):
    """The windows through ONNX Runtime here, one intra-op thread."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(ROOT / "model_repository/vad/1/model.onnx"), options)
    state = np.zeros((2, 1, 128), np.float32)
    sr = np.array(RATE, dtype=np.int64)
    probabilities, latencies = [], []
    for window in vad_stream.windows(samples, RATE):
        start = time.perf_counter()
        output, state = session.run(["output", "stateN"], {"input": window, "state": state, "sr": sr})
        latencies.append(time.perf_counter() - start)
        probabilities.append(float(output.reshape(-1)[0]))
    return probabilities, latencies


def q(xs, p):
    return sorted(xs)[min(len(xs) - 1, int(p * len(xs)))] * 1000


def main():
    samples = audio()
    server = Plinth(ROOT / "model_repository")
    try:
        vad_stream.stream(server.grpc_url, samples[:RATE], RATE, sequence_id=1)  # warm-up
        streamed, local = [], []
        for n in range(SEQUENCES):
            probabilities, latencies = vad_stream.stream(server.grpc_url, samples, RATE, sequence_id=100 + n)
            expected, baseline = in_process(samples)
            np.testing.assert_allclose(probabilities, expected, rtol=0, atol=1e-5)
            streamed += latencies
            local += baseline
    finally:
        server.stop()
    chunks = len(streamed) // SEQUENCES
    print(f"vad over gRPC ModelStreamInfer: {SEQUENCES} sequences of {chunks} windows (512 samples = 32 ms each)")
    print(f"  streamed through Plinth : p50 {q(streamed, 0.5):7.3f} ms   p99 {q(streamed, 0.99):7.3f} ms")
    print(f"  ONNX Runtime in-process : p50 {q(local, 0.5):7.3f} ms   p99 {q(local, 0.99):7.3f} ms")
    print(f"  ratio (Plinth / in-process) p50: {q(streamed, 0.5) / q(local, 0.5):.2f}x;"
          f" overhead p50 {q(streamed, 0.5) - q(local, 0.5):+.3f} ms per window")
    print(f"  real-time factor p50: {q(streamed, 0.5) / 32:.3f} (window latency / window duration)")


if __name__ == "__main__":
    main()

"""Streams a WAV through the `vad` example model as one sequence over gRPC
`ModelStreamInfer`, window by window, and prints each window's speech
probability as it comes back. The server carries Silero VAD's recurrent
state between the windows (implicit state in model_repository/vad/
config.pbtxt), so the client sends audio only.

Each request holds one window of 512 new samples (256 at 8 kHz) preceded
by the last 64 (32) samples of the window before, zeros before the first
and after the last sample, as the model expects: input `input` FP32
[1, 576] and `sr` INT64 (a scalar). The first request carries
`sequence_start`, the last `sequence_end`.

    .venv/bin/python examples/vad_stream.py speech.wav [--url localhost:8001]
"""

import argparse
import queue
import time
import wave

import numpy as np
import tritonclient.grpc as grpcclient


def read_wav(path):
    """The samples of a mono 16-bit PCM WAV, scaled to [-1, 1], and its rate."""
    with wave.open(str(path)) as w:
        if w.getnchannels() != 1 or w.getsampwidth() != 2:
            raise SystemExit(f"{path}: send a mono 16-bit PCM WAV")
        rate = w.getframerate()
        samples = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768.0
    return samples, rate


def windows(samples, rate):
    """Each window's model input: the window's new samples with the
    context samples in front, shape [1, window + context]."""
    size, context = (512, 64) if rate == 16000 else (256, 32)
    padded = np.concatenate([np.zeros(context, np.float32), samples, np.zeros(size, np.float32)])
    count = -(-len(samples) // size)
    return [padded[i * size:i * size + size + context][np.newaxis, :] for i in range(count)]


def stream(url, samples, rate, sequence_id, model="vad"):
    """Sends the windows of `samples` as sequence `sequence_id`, one at a
    time, each after the answer to the one before (as a live source sends
    them); returns the speech probabilities and each window's round trip
    in seconds."""
    answers = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    probabilities, latencies = [], []
    try:
        chunks = windows(samples, rate)
        for i, chunk in enumerate(chunks):
            audio = grpcclient.InferInput("input", list(chunk.shape), "FP32")
            audio.set_data_from_numpy(chunk)
            sr = grpcclient.InferInput("sr", [], "INT64")
            sr.set_data_from_numpy(np.array(rate, dtype=np.int64))
            sent = time.perf_counter()
            client.async_stream_infer(model, [audio, sr], sequence_id=sequence_id,
                                      sequence_start=i == 0, sequence_end=i == len(chunks) - 1)
            result, error = answers.get(timeout=60)
            latencies.append(time.perf_counter() - sent)
            if error is not None:
                raise RuntimeError(f"window {i}: {error}")
            probabilities.append(float(result.as_numpy("output").reshape(-1)[0]))
    finally:
        client.stop_stream()
        client.close()
    return probabilities, latencies


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wav")
    parser.add_argument("--url", default="localhost:8001", help="Plinth's gRPC address")
    parser.add_argument("--sequence-id", type=int, default=1)
    args = parser.parse_args()
    samples, rate = read_wav(args.wav)
    probabilities, _ = stream(args.url, samples, rate, args.sequence_id)
    size = 512 if rate == 16000 else 256
    for i, p in enumerate(probabilities):
        print(f"{i * size / rate:8.3f} s  {p:.3f}")


if __name__ == "__main__":
    main()

"""Voice activity detection end to end: speech made with espeak-ng (Debian's
package, installed by `make setup`) between stretches of silence, through
the `vad` model (Silero VAD run window by window by its plugin through the
host, which carries the model's state as implicit state). Segments cover
the speech and none falls in the silence; a sine tone has none; other
rates, stereo and non-WAV bodies get a clear 400. The same audio streamed
window by window over gRPC as one sequence (examples/vad_stream.py) gets
the whole-file answer's probabilities, window for window; two sequences
streamed at once never mix their state."""

import io
import json
import pathlib
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import wave

import numpy as np
import pytest

from conftest import metric

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
import vad_stream  # noqa: E402

SILENCE_S = 1.5


def wav_bytes(samples, rate, channels=1):
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.asarray(samples, dtype=np.int16).tobytes())
    return out.getvalue()


def speech(rate, tmp_path):
    """espeak-ng's speech (22050 Hz) resampled to `rate`, between two
    stretches of silence; returns the WAV, where the clip lies and where its
    loud part lies, in seconds."""
    path = tmp_path / "speech.wav"
    subprocess.run(["espeak-ng", "-w", str(path), "Plinth detects speech between stretches of silence"], check=True)
    with wave.open(str(path)) as w:
        source_rate = w.getframerate()
        voice = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32)
    times = np.arange(0, len(voice) / source_rate, 1 / rate)
    voice = np.interp(times, np.arange(len(voice)) / source_rate, voice)
    loud = np.flatnonzero(np.abs(voice) > 0.05 * np.abs(voice).max())
    first, last = loud[0] / rate + SILENCE_S, loud[-1] / rate + SILENCE_S
    silence = np.zeros(int(SILENCE_S * rate))
    clip = (SILENCE_S, SILENCE_S + len(voice) / rate)
    return wav_bytes(np.concatenate([silence, voice, silence]), rate), clip, (first, last)


def post(server, body, query=""):
    request = urllib.request.Request(f"http://{server.url}/v2/models/vad/predict{query}", data=body,
                                     headers={"Content-Type": "audio/wav"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("rate", [16000, 8000])
def test_segments_cover_the_speech_and_not_the_silence(example_server, tmp_path, rate):
    body, (clip_start, clip_end), (first, last) = speech(rate, tmp_path)
    status, answer = post(example_server, body)
    assert status == 200, answer
    assert answer["sample_rate"] == rate
    segments = answer["segments"]
    assert segments, answer
    for s in segments:
        # None in the silence before or after the clip (Silero pads 30 ms).
        assert clip_start - 0.05 <= s["start"] < s["end"] <= clip_end + 0.05, (segments, clip_start, clip_end)
    covered = sum(s["end"] - s["start"] for s in segments)
    assert covered >= 0.7 * (last - first), (segments, first, last)


def test_a_sine_tone_has_no_speech(example_server):
    tone = 0.3 * 32767 * np.sin(2 * np.pi * 440 * np.arange(3 * 16000) / 16000)
    status, answer = post(example_server, wav_bytes(tone, 16000))
    assert (status, answer["segments"]) == (200, []), answer


@pytest.mark.parametrize("body, message", [
    (wav_bytes(np.zeros(44100), 44100), "sampled at 44100 Hz; Silero VAD takes 16000 or 8000 Hz"),
    (wav_bytes(np.zeros(2 * 16000), 16000, channels=2), "2 channels; send mono audio"),
    (b"RIFF not really a wav", "not a readable WAV file"),
])
def test_audio_it_cannot_take_is_a_clear_400(example_server, body, message):
    status, answer = post(example_server, body)
    assert status == 400 and message in answer["error"], answer


def samples_of(body):
    with wave.open(io.BytesIO(body)) as w:
        rate = w.getframerate()
        return np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768.0, rate


def test_streamed_windows_equal_the_whole_file_answer(example_server, tmp_path):
    body, _, _ = speech(16000, tmp_path)
    status, answer = post(example_server, body, "?probabilities=true")
    assert status == 200, answer
    whole = answer["probabilities"]
    assert max(whole) > 0.5 > min(whole), "the clip has speech and silence"
    samples, rate = samples_of(body)
    streamed, _ = vad_stream.stream(example_server.grpc_url, samples, rate, sequence_id=4242)
    assert len(streamed) == len(whole)
    np.testing.assert_allclose(streamed, whole, rtol=0, atol=1e-6)


def test_two_streams_at_once_keep_their_own_state(example_server, tmp_path):
    speech_body, _, _ = speech(16000, tmp_path)
    tone = 0.3 * 32767 * np.sin(2 * np.pi * 440 * np.arange(3 * 16000) / 16000)
    expected, got = {}, {}
    for name, body in (("speech", speech_body), ("tone", wav_bytes(tone, 16000))):
        status, answer = post(example_server, body, "?probabilities=true")
        assert status == 200, answer
        expected[name] = answer["probabilities"]

    def run(name, body, sequence_id):
        samples, rate = samples_of(body)
        got[name] = vad_stream.stream(example_server.grpc_url, samples, rate, sequence_id)[0]

    threads = [threading.Thread(target=run, args=("speech", speech_body, 1)),
               threading.Thread(target=run, args=("tone", wav_bytes(tone, 16000), "tone-sequence"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=0, atol=1e-6, err_msg=name)
    assert metric(example_server, "plinth_sequence_active", "vad") == 0, "every sequence ended"


def test_a_window_outside_a_sequence_is_refused_naming_the_parameters(example_server):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(example_server.grpc_url)
    audio = grpcclient.InferInput("input", [1, 576], "FP32")
    audio.set_data_from_numpy(np.zeros((1, 576), np.float32))
    sr = grpcclient.InferInput("sr", [], "INT64")
    sr.set_data_from_numpy(np.array(16000, dtype=np.int64))
    with pytest.raises(InferenceServerException, match="must specify a non-zero or non-empty correlation ID"):
        client.infer("vad", [audio, sr])
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        client.infer("vad", [audio, sr], sequence_id=77)

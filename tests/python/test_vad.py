"""Voice activity detection end to end: speech made with espeak-ng (Debian's
package, installed by `make setup`) between stretches of silence, through
the `vad` model (Silero VAD run window by window by its plugin through the
host). Segments cover the speech and none falls in the silence; a sine
tone has none; other rates, stereo and non-WAV bodies get a clear 400."""

import io
import json
import subprocess
import urllib.error
import urllib.request
import wave

import numpy as np
import pytest

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


def post(server, body):
    request = urllib.request.Request(f"http://{server.url}/v2/models/vad/predict", data=body,
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

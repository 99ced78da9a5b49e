//! Voice activity detection with Silero VAD. The model's recurrent state
//! (`state` in, `stateN` out, [2, 1, 128]) is implicit state in
//! `config.pbtxt`: the host carries it between the windows of one request,
//! which the host runs as one sequence, so this plugin never sees it. The
//! body is a WAV file: mono PCM (integer or float) at 16 kHz or 8 kHz. The
//! audio is cut into windows of 512 samples (256 at 8 kHz), each preceded
//! by the last 64 (32) samples of the one before, and run in order:
//! `preprocess` returns the first window, `postprocess` runs the rest
//! through the host (`plinth_plugin_sdk::infer` on this same model) and
//! turns the speech probabilities into segments the way Silero's
//! `get_speech_timestamps` does. Answers
//! `{"sample_rate": 16000, "duration": 4.2, "segments": [{"start": 1.47, "end": 3.1}]}`
//! in seconds. Query parameter `threshold` (default 0.5) sets the speech
//! probability; `probabilities=true` adds each window's speech probability
//! (`"probabilities": [...]`, one per window, in order).

use plinth_plugin_sdk::{Error, ModelInfo, Plugin, Request, Response, Tensor, export_plugin, find_output};

/// Speech lasting less than this is ignored (`min_speech_duration_ms`).
const MIN_SPEECH_MS: u64 = 250;
/// Silence must last this long to end a segment (`min_silence_duration_ms`).
const MIN_SILENCE_MS: u64 = 100;
/// Each segment is widened by this on both sides (`speech_pad_ms`).
const SPEECH_PAD_MS: u64 = 30;
/// The longest audio accepted, in seconds.
const MAX_SECONDS: u64 = 600;

struct Vad {
    name: String,
    version: u64,
}

/// Decoded audio: samples in [-1, 1] and their rate.
struct Audio {
    rate: u32,
    samples: Vec<f32>,
}

impl Audio {
    /// Samples per window and of context, for this rate.
    fn window(&self) -> (usize, usize) {
        if self.rate == 16_000 { (512, 64) } else { (256, 32) }
    }

    fn windows(&self) -> usize {
        self.samples.len().div_ceil(self.window().0)
    }

    /// Window `i` with its context in front, zero-padded at both ends.
    fn window_input(&self, i: usize) -> Vec<f32> {
        let (size, context) = self.window();
        let start = (i * size) as isize - context as isize;
        (start..start + (size + context) as isize)
            .map(|j| if j < 0 { 0.0 } else { self.samples.get(j as usize).copied().unwrap_or(0.0) })
            .collect()
    }

    fn ms_to_samples(&self, ms: u64) -> usize {
        (u64::from(self.rate) * ms / 1000) as usize
    }
}

impl Plugin for Vad {
    fn init(info: &ModelInfo) -> Result<Self, Error> {
        let names: Vec<&str> = info.inputs.iter().map(|i| i.name.as_str()).collect();
        if names != ["input", "sr"] {
            return Err(Error::internal(format!(
                "expected Silero VAD's inputs [input, sr] (with 'state' as implicit state in config.pbtxt), got {names:?}"
            )));
        }
        Ok(Vad { name: info.name.clone(), version: info.version })
    }

    fn preprocess(&mut self, req: &Request) -> Result<Vec<Tensor>, Error> {
        let audio = decode(&req.body)?;
        Ok(model_inputs(&audio, 0))
    }

    fn postprocess(&mut self, req: &Request, outputs: Vec<Tensor>) -> Result<Response, Error> {
        let audio = decode(&req.body)?;
        let threshold = match req.param("threshold") {
            None => 0.5,
            Some(v) => v
                .parse::<f32>()
                .ok()
                .filter(|t| (0.0..=1.0).contains(t))
                .ok_or_else(|| Error::bad_input(format!("threshold must be a number from 0 to 1, got '{v}'")))?,
        };
        let with_probabilities = match req.param("probabilities") {
            None | Some("false") => false,
            Some("true") => true,
            Some(v) => return Err(Error::bad_input(format!("probabilities must be true or false, got '{v}'"))),
        };
        let mut probabilities = vec![read_probability(&outputs)?];
        for i in 1..audio.windows() {
            let outputs = plinth_plugin_sdk::infer(&self.name, Some(self.version), &model_inputs(&audio, i), &[])?;
            probabilities.push(read_probability(&outputs)?);
        }
        let segments: Vec<_> = segments(&audio, &probabilities, threshold)
            .into_iter()
            .map(|(start, end)| serde_json::json!({ "start": seconds(&audio, start), "end": seconds(&audio, end) }))
            .collect();
        let mut answer = serde_json::json!({
            "sample_rate": audio.rate,
            "duration": seconds(&audio, audio.samples.len()),
            "segments": segments,
        });
        if with_probabilities {
            answer["probabilities"] = serde_json::json!(probabilities);
        }
        Ok(Response::json(&answer))
    }
}

/// Reads a mono 16 or 8 kHz PCM WAV body.
fn decode(body: &[u8]) -> Result<Audio, Error> {
    let mut reader = hound::WavReader::new(body)
        .map_err(|e| Error::bad_input(format!("the body is not a readable WAV file: {e}")))?;
    let spec = reader.spec();
    if spec.channels != 1 {
        return Err(Error::bad_input(format!("the WAV has {} channels; send mono audio", spec.channels)));
    }
    if !matches!(spec.sample_rate, 16_000 | 8_000) {
        return Err(Error::bad_input(format!(
            "the WAV is sampled at {} Hz; Silero VAD takes 16000 or 8000 Hz, so resample it first",
            spec.sample_rate
        )));
    }
    if u64::from(reader.duration()) > MAX_SECONDS * u64::from(spec.sample_rate) {
        return Err(Error::bad_input(format!("the WAV is longer than {MAX_SECONDS} s")));
    }
    let bad = |e: hound::Error| Error::bad_input(format!("the WAV's samples cannot be read: {e}"));
    let samples = match spec.sample_format {
        hound::SampleFormat::Float => reader.samples::<f32>().collect::<Result<Vec<_>, _>>().map_err(bad)?,
        hound::SampleFormat::Int => {
            let scale = (1u64 << (spec.bits_per_sample - 1)) as f32;
            reader.samples::<i32>().map(|s| s.map(|v| v as f32 / scale)).collect::<Result<Vec<_>, _>>().map_err(bad)?
        }
    };
    Ok(Audio { rate: spec.sample_rate, samples })
}

/// The model's inputs for window `i`: samples [1, window + context] and
/// the rate as an INT64 scalar (the host adds the state).
fn model_inputs(audio: &Audio, i: usize) -> Vec<Tensor> {
    let window = audio.window_input(i);
    vec![
        Tensor::from_slice("input", &[1, window.len() as i64], &window),
        Tensor::from_slice("sr", &[], &[i64::from(audio.rate)]),
    ]
}

/// The speech probability of one window.
fn read_probability(outputs: &[Tensor]) -> Result<f32, Error> {
    find_output(outputs, "output")?.to_vec::<f32>()?.first().copied().ok_or_else(|| Error::internal("empty 'output'"))
}

/// Speech segments as sample ranges, from one probability per window:
/// speech starts at a window at or above `threshold` and ends after
/// [`MIN_SILENCE_MS`] below `threshold - 0.15`; segments shorter than
/// [`MIN_SPEECH_MS`] are dropped and the rest padded by [`SPEECH_PAD_MS`].
fn segments(audio: &Audio, probabilities: &[f32], threshold: f32) -> Vec<(usize, usize)> {
    let (size, _) = audio.window();
    let (min_speech, min_silence) = (audio.ms_to_samples(MIN_SPEECH_MS), audio.ms_to_samples(MIN_SILENCE_MS));
    let pad = audio.ms_to_samples(SPEECH_PAD_MS);
    let quiet = (threshold - 0.15).max(0.01);
    let mut found = Vec::new();
    let (mut start, mut silence_from): (Option<usize>, Option<usize>) = (None, None);
    for (i, &p) in probabilities.iter().enumerate() {
        let at = i * size;
        if p >= threshold {
            silence_from = None;
            start.get_or_insert(at);
        } else if p < quiet
            && let Some(s) = start
        {
            let from = *silence_from.get_or_insert(at);
            if at + size - from >= min_silence {
                if from - s >= min_speech {
                    found.push((s, from));
                }
                (start, silence_from) = (None, None);
            }
        }
    }
    if let Some(s) = start
        && audio.samples.len() - s >= min_speech
    {
        found.push((s, audio.samples.len()));
    }
    found.into_iter().map(|(s, e)| (s.saturating_sub(pad), (e + pad).min(audio.samples.len()))).collect()
}

fn seconds(audio: &Audio, samples: usize) -> f64 {
    (samples as f64 / f64::from(audio.rate) * 1000.0).round() / 1000.0
}

export_plugin!(Vad);

//! Warm-up from `model_warmup` in `config.pbtxt` (Triton's semantics): each
//! sample runs `count` times through the backend before the version is
//! READY, so the first real request does not pay for lazy initialisation.
//! A model with a plugin may also name raw request bodies
//! (`plugin.warmup`), which run through its plugin and model as a client's
//! `/predict` would, so a plugin that fails on every request never makes
//! its model READY.

use std::path::Path;
use std::sync::Arc;

use crate::config::proto::ModelWarmup;
use crate::config::proto::model_warmup::Input;
use crate::config::proto::model_warmup::input::InputDataType;
use crate::config::{Signature, datatype_from_config};
use crate::error::Error;
use crate::plugin::ModelRunner;
use crate::tensor::{DataType, Tensor, element_count, push_bytes_element};

use super::check::check_inputs;
use super::{Batcher, Engine, Model, reshape};

/// The folder, inside the model folder, that holds `input_data_file`s.
pub const WARMUP_DIR: &str = "warmup";

/// Builds the input tensors of one warm-up sample. With `max_batch_size >
/// 0` each input gets a leading batch dimension of `batch_size` (at least 1).
///
/// # Errors
/// A message naming the sample and input for an invalid `data_type`, a
/// negative dimension, or a data file that is missing or of the wrong size.
pub fn sample_inputs(sample: &ModelWarmup, sig: &Signature, model_dir: &Path) -> Result<Vec<Tensor>, String> {
    let mut inputs = Vec::new();
    for (name, input) in &sample.inputs {
        let fail = |m: String| format!("warm-up sample '{}', input '{name}': {m}", sample.name);
        let datatype = datatype_from_config(input.data_type).ok_or_else(|| fail("no valid data_type".into()))?;
        if input.dims.iter().any(|&d| d < 0) {
            return Err(fail(format!("dims {:?} must all be >= 0", input.dims)));
        }
        let mut shape = input.dims.clone();
        if sig.max_batch_size > 0 {
            shape.insert(0, i64::from(sample.batch_size.max(1)));
        }
        let count = element_count(&shape).ok_or_else(|| fail(format!("shape {shape:?} has too many elements")))?;
        let data = sample_data(input, datatype, count, model_dir).map_err(fail)?;
        inputs.push(Tensor { name: name.clone(), datatype, shape, data });
    }
    Ok(inputs)
}

fn sample_data(input: &Input, datatype: DataType, count: usize, model_dir: &Path) -> Result<Vec<u8>, String> {
    let size = datatype.element_size();
    match &input.input_data_type {
        None | Some(InputDataType::ZeroData(_)) => Ok(match size {
            Some(size) => vec![0; count * size],
            None => std::iter::repeat_n([0u8; 4], count).flatten().collect(),
        }),
        Some(InputDataType::RandomData(_)) => Ok(match size {
            // Random bytes for integers; floats stay in [0, 1) so no NaN or
            // infinity reaches the model.
            Some(4) if datatype == DataType::Fp32 => (0..count).flat_map(|_| fastrand::f32().to_le_bytes()).collect(),
            Some(8) if datatype == DataType::Fp64 => (0..count).flat_map(|_| fastrand::f64().to_le_bytes()).collect(),
            Some(_) if matches!(datatype, DataType::Fp16 | DataType::Bf16) => vec![0; count * 2],
            Some(size) => (0..count * size).map(|_| fastrand::u8(..)).collect(),
            None => {
                let mut data = Vec::new();
                for _ in 0..count {
                    let item: Vec<u8> = (0..fastrand::usize(1..8)).map(|_| fastrand::alphanumeric() as u8).collect();
                    push_bytes_element(&mut data, &item);
                }
                data
            }
        }),
        Some(InputDataType::InputDataFile(file)) => {
            let path = model_dir.join(WARMUP_DIR).join(file);
            let data = std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            if let Some(size) = size
                && data.len() != count * size
            {
                return Err(format!("{} has {} bytes; the shape needs {}", path.display(), data.len(), count * size));
            }
            Ok(data)
        }
    }
}

/// One raw request a model's warm-up sends through its plugin.
#[derive(Clone, Debug)]
pub struct PluginSample {
    /// The file the body came from, for messages.
    pub file: String,
    /// The body and its content type, as a client would send them.
    pub request: crate::plugin::RawRequest,
}

/// Reads the samples `plugin.warmup` names (`files`, each checked by the
/// validation to name a file inside `warmup/`) from `model_dir/warmup/`,
/// with `content_type` (`plugin.warmup_content_type`).
///
/// # Errors
/// A message naming the parameter for a file that cannot be read.
pub fn plugin_samples(
    files: &[String],
    content_type: Option<&str>,
    model_dir: &Path,
) -> Result<Vec<PluginSample>, String> {
    let folder = model_dir.join(WARMUP_DIR);
    files
        .iter()
        .map(|file| {
            let path = folder.join(file);
            let body = std::fs::read(&path)
                .map_err(|e| format!("parameter 'plugin.warmup': cannot read {}: {e}", path.display()))?;
            let request = crate::plugin::RawRequest {
                content_type: content_type.unwrap_or_default().to_owned(),
                body,
                parameters: Vec::new(),
            };
            Ok(PluginSample { file: file.clone(), request })
        })
        .collect()
}

impl Model {
    /// Runs the configuration's `model_warmup` samples through every
    /// instance, each `count` times (at least once); returns the number of
    /// runs.
    /// Blocks: call it off the async executor.
    ///
    /// # Errors
    /// A message naming the sample when its inputs cannot be built, do not
    /// fit the signature, or the backend fails on them.
    pub fn warm_up(&self, model_dir: &Path) -> Result<usize, String> {
        // An ensemble has no model_warmup (config::validate refuses it).
        let Engine::Backends { instances, batcher } = &*self.engine else { return Ok(0) };
        let mut runs = 0;
        for sample in &self.config.model_warmup {
            let inputs = sample_inputs(sample, &self.signature, model_dir)?;
            check_inputs(&self.signature, &self.name, &inputs)
                .map_err(|e| format!("warm-up sample '{}': {e}", sample.name))?;
            let inputs = reshape::inputs(&self.signature, inputs);
            let inputs = match batcher {
                Batcher::Dynamic(scheduler) => scheduler.warm_up_inputs(inputs),
                Batcher::Sequence(scheduler) => scheduler.warm_up_inputs(inputs),
            }
            .map_err(|e| format!("warm-up sample '{}': {e}", sample.name))?;
            for instance in instances {
                for _ in 0..sample.count.max(1) {
                    instance
                        .execute(inputs.clone())
                        .map_err(|e| format!("warm-up sample '{}' failed: {e}", sample.name))?;
                    runs += 1;
                }
            }
        }
        Ok(runs)
    }

    /// Sends each `plugin.warmup` sample through the plugin and model as a
    /// client's `/predict` would (preprocess, inference, postprocess), with
    /// `runner` for the plugin's composed calls; returns the number that
    /// ran to the end. A sample whose composed call finds its callee
    /// unknown, not READY or overloaded did not fail here: the warm-up
    /// stops at that call, and the callee's state is logged.
    ///
    /// # Errors
    /// A message naming the sample when the plugin fails on it (traps,
    /// returns an internal error, produces tensors the model refuses) or
    /// refuses it as bad input: a sample the plugin cannot read is a wrong
    /// configuration.
    pub async fn warm_up_plugin(&self, runner: Arc<dyn ModelRunner>) -> Result<usize, String> {
        let mut completed = 0;
        for sample in &self.plugin_samples {
            match self.predict(sample.request.clone(), runner.clone()).await {
                Ok(_) => completed += 1,
                Err(e @ (Error::NotFound(_) | Error::Unavailable(_) | Error::Overloaded(_))) => {
                    tracing::warn!(
                        model = %self.name, version = self.version, sample = %sample.file,
                        "plugin warm-up stopped at a composed call whose callee cannot serve now: {e}"
                    );
                }
                Err(e) => return Err(format!("plugin warm-up sample '{}' failed: {e}", sample.file)),
            }
        }
        Ok(completed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse;

    #[test]
    fn samples_get_the_batch_dimension_and_their_data() {
        let config = parse(
            r#"max_batch_size: 4
            model_warmup [ { name: "z" batch_size: 2 count: 3
              inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 3 ] random_data: true } }
              inputs { key: "s" value: { data_type: TYPE_STRING dims: [ 1 ] zero_data: true } } } ]"#,
        )
        .unwrap();
        let sig = Signature { max_batch_size: 4, inputs: vec![], outputs: vec![] };
        let mut inputs = sample_inputs(&config.model_warmup[0], &sig, Path::new("/nonexistent")).unwrap();
        inputs.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(inputs[0].shape, vec![2, 1]);
        assert_eq!(inputs[0].data, vec![0; 8], "two empty strings");
        assert_eq!(inputs[1].shape, vec![2, 3]);
        assert!(inputs[1].check_data().is_ok());
        assert!(inputs[1].data.chunks(4).all(|c| (0.0..1.0).contains(&f32::from_le_bytes(c.try_into().unwrap()))));
    }

    #[test]
    fn plugin_samples_are_files_of_the_warmup_folder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(WARMUP_DIR)).unwrap();
        std::fs::write(dir.path().join("warmup/a.png"), b"png").unwrap();
        std::fs::write(dir.path().join("warmup/b.wav"), b"wav").unwrap();
        let files = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        let samples = plugin_samples(&files(&["a.png", "b.wav"]), Some("image/png"), dir.path()).unwrap();
        let read: Vec<_> = samples.iter().map(|s| (s.file.as_str(), s.request.body.as_slice())).collect();
        assert_eq!(read, [("a.png", &b"png"[..]), ("b.wav", &b"wav"[..])]);
        assert_eq!(samples[0].request.content_type, "image/png");
        assert!(plugin_samples(&[], None, dir.path()).unwrap().is_empty());
        let missing = plugin_samples(&files(&["c.png"]), None, dir.path()).unwrap_err();
        assert!(missing.contains("'plugin.warmup'") && missing.contains("c.png"), "{missing}");
    }

    #[test]
    fn a_missing_data_file_names_the_sample_and_input() {
        let config = parse(
            r#"model_warmup [ { name: "f" inputs { key: "x" value: { data_type: TYPE_INT32 dims: [ 2 ] input_data_file: "x.bin" } } } ]"#,
        )
        .unwrap();
        let sig = Signature { max_batch_size: 0, inputs: vec![], outputs: vec![] };
        let err = sample_inputs(&config.model_warmup[0], &sig, Path::new("/nonexistent")).unwrap_err();
        assert!(err.contains("sample 'f', input 'x'") && err.contains("x.bin"), "{err}");
    }
}

//! How one model version becomes a [`Model`]: the seam between the
//! lifecycle, which decides what to load, and the runtimes that load it.
//! The server loads with [`RuntimeLoader`]; tests give the lifecycle a
//! loader over fake backends.

use std::time::Instant;

use crate::config::{ModelConfig, Parameters};
use crate::drain;
use crate::error::LoadError;
use crate::model::{Model, Runtimes};
use crate::repository::{Fingerprint, ModelDir};

/// Loads model versions.
pub trait Loader: Send + Sync {
    /// Loads and warms up version `version` of `dir` with `config` and its
    /// validated `parameters`, and returns it with the least memory it can
    /// hold, in bytes (the size of its weight files); its footprint is the
    /// larger of that and what
    /// [`Model::resident_bytes`] accounts once its plugin warmed up too.
    /// Blocks: the lifecycle calls it off the async executor.
    ///
    /// # Errors
    /// [`LoadError::Failed`] with the reason the version cannot serve.
    fn load(
        &self,
        dir: &ModelDir,
        version: u64,
        config: &ModelConfig,
        parameters: &Parameters,
    ) -> Result<(Model, u64), LoadError>;

    /// Device memory free on GPU `gpu` now, in bytes, for every process;
    /// `None` when that cannot be known (no NVML, no such GPU).
    fn gpu_free_bytes(&self, gpu: u32) -> Option<u64> {
        let _ = gpu;
        None
    }
}

/// Loads with the real runtimes: ONNX Runtime, libtorch, remote servers and
/// the plugin sandbox.
pub struct RuntimeLoader {
    runtimes: Runtimes,
}

impl RuntimeLoader {
    /// A loader over `runtimes`.
    pub fn new(runtimes: Runtimes) -> RuntimeLoader {
        RuntimeLoader { runtimes }
    }
}

impl Loader for RuntimeLoader {
    /// Logs each stage (`load: start`, `session created`, `warm-up done`,
    /// `ready`) with the milliseconds since the start.
    fn load(
        &self,
        dir: &ModelDir,
        version: u64,
        config: &ModelConfig,
        parameters: &Parameters,
    ) -> Result<(Model, u64), LoadError> {
        let started = Instant::now();
        let ms = || started.elapsed().as_millis() as u64;
        // A plugin compiles into the cache (once per process and file)
        // first, so the load itself only maps the compiled code. A failure
        // here is reported by the load itself.
        if let Some(own) = parameters.plugin.as_ref().filter(|p| !p.file.is_empty()) {
            let wasm = dir.path.join(&own.file);
            if wasm.is_file() && crate::repository::is_within(&wasm, &dir.path) {
                let _ = self.runtimes.plugins.precompile(&wasm);
            }
        }
        tracing::info!(model = %dir.name, version, "load: start");
        let loaded = Model::load(dir, version, config, parameters, &self.runtimes).and_then(|model| {
            tracing::info!(model = %dir.name, version, ms = ms(), "load: session created");
            let runs = model.warm_up(&dir.path)?;
            tracing::info!(model = %dir.name, version, ms = ms(), runs, "load: warm-up done");
            Ok(model)
        });
        let model = loaded.map_err(LoadError::Failed).inspect_err(|_| {
            tracing::info!(model = %dir.name, version, ms = ms(), "load: failed");
            // What the failed load allocated goes back to the system.
            drain::release_freed_memory();
        })?;
        // What the load allocated and freed (model files parsed, trial
        // runs) goes back to the system.
        drain::release_freed_memory();
        let weights = Fingerprint::of(&dir.version_path(version), true).bytes();
        tracing::info!(model = %dir.name, version, ms = ms(), weights, "load: ready");
        self.runtimes.metrics.load_duration(&dir.name, version, started.elapsed().as_secs_f64());
        Ok((model, weights))
    }

    fn gpu_free_bytes(&self, gpu: u32) -> Option<u64> {
        let sample = self.runtimes.gpus.sample(gpu)?;
        Some(sample.memory_total.saturating_sub(sample.memory_used))
    }
}

//! The frameworks and the sandbox every model's load draws on.

use std::path::Path;
use std::sync::Arc;

use crate::backend::Frameworks;
use crate::metrics::Metrics;
use crate::plugin::PluginHost;

use super::cache::ResponseCache;

/// What loading a model needs: the frameworks and the plugin sandbox.
pub struct Runtimes {
    /// The frameworks that load models (ONNX Runtime, libtorch, remote,
    /// identity); ONNX models fail to load, saying why, when no
    /// `ORT_DYLIB_PATH` was given.
    pub frameworks: Frameworks,
    /// The machine's GPUs as NVML lists them (none without a driver).
    pub gpus: Arc<crate::gpu::Gpus>,
    /// The wasmtime sandbox, for model plugins.
    pub plugins: PluginHost,
    /// Where each model's inference metrics are registered.
    pub metrics: Arc<Metrics>,
    /// The server's response cache (`--cache-config`), for the models that
    /// enable it.
    pub response_cache: Option<Arc<ResponseCache>>,
    /// The rate limiter every model's instances pass through
    /// (`--rate-limit=execution_count`); `None` when it is off.
    pub rate_limiter: Option<Arc<crate::scheduler::rate_limiter::RateLimiter>>,
}

impl Runtimes {
    /// Starts ONNX Runtime from `ort_dylib` (`ORT_DYLIB_PATH`), or else from
    /// `lib/libonnxruntime.so` beside the binary's folder (the bundle `make
    /// dist` builds), libtorch when built with the `libtorch` feature, and
    /// the plugin sandbox.
    ///
    /// # Errors
    /// A message when the given ONNX Runtime library cannot be loaded or
    /// wasmtime cannot start.
    pub fn start(
        ort_dylib: Option<&Path>,
        plugin_limits: crate::plugin::PluginLimits,
        plugin_cache_dir: Option<std::path::PathBuf>,
    ) -> Result<Runtimes, String> {
        let gpus = Arc::new(crate::gpu::Gpus::probe());
        match gpus.absence() {
            None => tracing::info!(gpus = ?gpus.devices(), "NVML lists the GPUs"),
            Some(why) => {
                tracing::info!("no NVIDIA GPU found; serving on the CPU");
                tracing::debug!(%why, "why NVML lists no GPU");
            }
        }
        Ok(Runtimes {
            frameworks: Frameworks::start(ort_dylib.map(Path::to_path_buf).or_else(bundled_onnxruntime).as_deref())?,
            plugins: PluginHost::new(plugin_limits, plugin_cache_dir)?,
            metrics: Arc::new(Metrics::with_gpus(gpus.clone())),
            gpus,
            response_cache: None,
            rate_limiter: None,
        })
    }
}

/// `../lib/libonnxruntime.so` relative to the running binary, if it exists.
fn bundled_onnxruntime() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let lib = exe.parent()?.parent()?.join("lib/libonnxruntime.so");
    lib.is_file().then_some(lib)
}

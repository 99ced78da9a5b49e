//! The runtimes and the lifecycle over them, from the flags that decide
//! whether a model loads: the one start-up path of `plinth serve` and
//! `plinth check`, so that a check runs exactly the loads a server runs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::{ControlMode, Lifecycle, LoadLimits, RuntimeLoader};
use crate::model::{ResponseCache, Runtimes};
use crate::plugin::PluginLimits;
use crate::registry::Registry;
use crate::repository::{Location, Repositories};
use crate::scheduler::rate_limiter::{Mode as RateLimitMode, RateLimiter, ResourceCount};

/// What loading the models needs (the flags `plinth serve` and `plinth
/// check` share).
#[derive(Clone, Debug)]
pub struct LoadingOptions {
    /// The model repositories: folders, or paths in object storage.
    pub model_repositories: Vec<Location>,
    /// `--repository-cache-dir`: where remote repositories are mirrored.
    pub repository_cache_dir: Option<PathBuf>,
    /// How the loaded models change after start.
    pub control_mode: ControlMode,
    /// Load concurrency, load timeout and the residency budget.
    pub load_limits: LoadLimits,
    /// `--model-load-gpu-limit`: (GPU index, fraction of its memory) for
    /// models, turned into the budget's bytes once NVML lists the GPUs.
    pub gpu_load_limits: Vec<(u32, f64)>,
    /// Path of `libonnxruntime.so` (`ORT_DYLIB_PATH`).
    pub ort_dylib_path: Option<PathBuf>,
    /// Memory, time and concurrency limits of plugin calls.
    pub plugin_limits: PluginLimits,
    /// Where compiled plugins are cached; `None` disables the cache.
    pub plugin_cache_dir: Option<PathBuf>,
    /// `--cache-config local,size=BYTES`: the response cache's capacity;
    /// `None`, no cache (a model that enables it does not load).
    pub response_cache_bytes: Option<usize>,
    /// `--rate-limit`: whether executions wait for the rate limiter.
    pub rate_limit: RateLimitMode,
    /// `--rate-limit-resource`: the resources' copies given explicitly.
    pub rate_limit_resources: Vec<ResourceCount>,
}

impl Lifecycle {
    /// Starts the runtimes (ONNX Runtime, libtorch, the plugin host, the
    /// response cache) and a lifecycle over them, nothing loaded yet.
    ///
    /// # Errors
    /// A message when a local repository is not a folder, a remote one's
    /// store or mirror cannot be set up, ONNX Runtime or wasmtime cannot
    /// start, modelmesh mode has no ONNX Runtime, or a
    /// `--model-load-gpu-limit` names a GPU that cannot be measured.
    pub fn from_options(opts: &LoadingOptions) -> Result<Lifecycle, String> {
        let mut runtimes =
            Runtimes::start(opts.ort_dylib_path.as_deref(), opts.plugin_limits, opts.plugin_cache_dir.clone())?;
        runtimes.response_cache = opts.response_cache_bytes.map(|bytes| Arc::new(ResponseCache::new(bytes)));
        if opts.rate_limit == RateLimitMode::ExecutionCount {
            runtimes.rate_limiter = Some(RateLimiter::new(opts.rate_limit_resources.clone()));
        } else if !opts.rate_limit_resources.is_empty() {
            // Triton accepts the flag with the rate limiter off and applies nothing.
            tracing::warn!("--rate-limit-resource not applied: --rate-limit is off");
        }
        if opts.control_mode == ControlMode::ModelMesh {
            // ModelMesh would place ONNX models here and see every load fail.
            if !runtimes.frameworks.has_onnx() {
                return Err(format!("modelmesh mode serves ONNX models: {}", crate::backend::onnx::HINT));
            }
            let capacity = opts.load_limits.budget.bytes.unwrap_or(0);
            tracing::info!(capacity_bytes = capacity, "modelmesh mode: ModelMesh loads and unloads models");
        }
        let metrics = runtimes.metrics.clone();
        let repositories =
            Repositories::open(&opts.model_repositories, opts.repository_cache_dir.as_deref(), &metrics.repository)?;
        let mut limits = opts.load_limits.clone();
        limits.budget.gpu = gpu_budget(&opts.gpu_load_limits, &runtimes.gpus)?;
        Ok(Lifecycle::new(
            Arc::new(RuntimeLoader::new(runtimes)),
            Arc::new(Registry::default()),
            repositories,
            opts.control_mode,
            limits,
            metrics,
        ))
    }
}

/// `--model-load-gpu-limit`'s fractions as bytes of each GPU's memory.
///
/// # Errors
/// A message naming the flag for a GPU NVML does not list or whose memory
/// it cannot read.
fn gpu_budget(limits: &[(u32, f64)], gpus: &crate::gpu::Gpus) -> Result<BTreeMap<u32, u64>, String> {
    limits
        .iter()
        .map(|&(index, fraction)| {
            let device = gpus.devices().iter().find(|d| d.index == index).ok_or_else(|| {
                let why = gpus.absence().map_or_else(|| format!("NVML lists {}", gpus.count()), str::to_owned);
                format!("--model-load-gpu-limit names GPU {index}, which does not exist ({why})")
            })?;
            if device.memory_total == 0 {
                return Err(format!("--model-load-gpu-limit names GPU {index}, whose memory NVML cannot read"));
            }
            Ok((index, (device.memory_total as f64 * fraction) as u64))
        })
        .collect()
}

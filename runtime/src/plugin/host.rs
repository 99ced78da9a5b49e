//! The plugin host: the wasmtime engine, its pooling allocator and epoch
//! ticker, the linker with WASI and Plinth's contract, and compiling a
//! plugin into a [`Plugin`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::Semaphore;
use wasmtime::Engine;
use wasmtime::component::{Component, Linker};

use super::*;
use crate::config::parameters::{PLUGIN_MAX_INSTANCES, PLUGIN_MAX_MEMORY_BYTES};

/// Compiles plugins and owns what all plugin instances share: the engine,
/// the linker with WASI, the limits and the concurrency bound.
pub struct PluginHost {
    engine: Engine,
    linker: Linker<InstanceState>,
    limits: PluginLimits,
    cache_dir: Option<PathBuf>,
    permits: Arc<Semaphore>,
}

impl PluginHost {
    /// Creates the engine and starts the thread that advances its epoch.
    /// `cache_dir` keeps compiled plugins between runs (`None`: compile at
    /// every load).
    ///
    /// # Errors
    /// A message when wasmtime cannot be configured.
    pub fn new(limits: PluginLimits, cache_dir: Option<PathBuf>) -> Result<PluginHost, String> {
        let mut config = wasmtime::Config::new();
        config.epoch_interruption(true);
        config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool()));
        let engine = Engine::new(&config).map_err(|e| format!("cannot start wasmtime: {e}"))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(|e| format!("cannot link WASI: {e}"))?;
        contract::add_to_linker(&mut linker).map_err(|e| format!("cannot link plinth:plugin/inference: {e}"))?;
        let ticker = engine.clone();
        std::thread::Builder::new()
            .name("plinth-epoch".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(EPOCH_TICK);
                    ticker.increment_epoch();
                }
            })
            .map_err(|e| format!("cannot start the plugin deadline thread: {e}"))?;
        let permits = Arc::new(Semaphore::new(limits.concurrency.max(1)));
        Ok(PluginHost { engine, linker, limits, cache_dir, permits })
    }

    /// The server-wide limits, which models' parameters adjust.
    pub fn limits(&self) -> PluginLimits {
        self.limits
    }

    /// Loads the plugin at `wasm` for a model version whose folder is
    /// `model_dir`, and starts one instance (calling its `init`) so that a
    /// broken plugin fails the load rather than the first request. Its calls
    /// run within `limits` and are counted in `metrics`. It waits for the
    /// instance's start: call it from a blocking thread or outside any
    /// runtime, never from a current-thread runtime's own thread.
    ///
    /// # Errors
    /// A message naming the plugin when it cannot be read or compiled,
    /// implements none of the supported `plinth:plugin/handler` versions, or
    /// its `init` fails.
    pub fn load(
        &self,
        wasm: &Path,
        model_dir: &Path,
        info: ModelInfo,
        limits: PluginLimits,
        metrics: PluginMetrics,
    ) -> Result<Plugin, String> {
        let file = wasm.file_name().map_or_else(|| wasm.display().to_string(), |f| f.to_string_lossy().into_owned());
        let label = format!("plugin '{file}' of model '{}'", info.name);
        let started = std::time::Instant::now();
        let component = self.compile(wasm).map_err(|e| format!("{label}: {e}"))?;
        let compile_us = started.elapsed().as_micros() as u64;
        let version = ContractVersion::of(&self.engine, &component).ok_or_else(|| {
            format!("{label} exports no plinth:plugin/handler interface of a version this host runs ({})", runs())
        })?;
        let not_a_plugin = |e: wasmtime::Error| format!("{label} is not a plinth:plugin@{version} component: {e}");
        let instance_pre = self.linker.instantiate_pre(&component).map_err(not_a_plugin)?;
        let pre = Pre::new(version, instance_pre).map_err(not_a_plugin)?;
        let image = component.image_range();
        let code_bytes = (image.end as usize).saturating_sub(image.start as usize) as u64;
        let plugin = Plugin {
            label,
            code_bytes,
            timing: CallTiming::default(),
            engine: self.engine.clone(),
            pre,
            info,
            model_dir: model_dir.to_path_buf(),
            limits,
            slots: (limits.instances > 0).then(|| Arc::new(Semaphore::new(limits.instances))),
            metrics,
            idle: Mutex::new(Vec::new()),
            permits: self.permits.clone(),
        };
        let first = wait(plugin.start_instance()).map_err(|e| match e {
            PluginError::Refused(e) => e.to_string(),
            PluginError::Failed(m) => m,
        })?;
        plugin.idle.lock().push(first);
        // compile_us is what the on-disk cache saves (bench/plugin_cache.py).
        tracing::info!(plugin = %plugin.label, contract = %version, compile_us, "plugin ready");
        Ok(plugin)
    }

    /// Which contract version the component at `wasm` was built against,
    /// once it is known to compile and link in this host.
    ///
    /// # Errors
    /// A message when the file cannot be read, is not a component, exports
    /// no supported `plinth:plugin/handler`, or imports what this host does
    /// not provide.
    pub fn inspect(&self, wasm: &Path) -> Result<ContractVersion, String> {
        let component = self.compile(wasm)?;
        let version = ContractVersion::of(&self.engine, &component).ok_or_else(|| {
            let exports: Vec<String> =
                component.component_type().exports(&self.engine).map(|(name, _)| name.to_owned()).collect();
            format!(
                "it exports no plinth:plugin/handler of a version this host runs ({}); its exports are {exports:?}",
                runs()
            )
        })?;
        self.linker
            .instantiate_pre(&component)
            .map_err(|e| format!("built against plinth:plugin@{version}, but it cannot be linked here: {e}"))?;
        Ok(version)
    }

    /// Compiles the plugin at `wasm` into the on-disk cache unless it is
    /// there already, so that a model's load only loads the artefact: the
    /// compiler's one-time memory (about 11 MB the first time in a process)
    /// then belongs to no model's measured footprint. Without a cache
    /// folder it does nothing, and the compile happens in the load.
    ///
    /// # Errors
    /// A message when the file cannot be read, does not compile or the
    /// artefact cannot be written; the load that follows reports the same.
    pub fn precompile(&self, wasm: &Path) -> Result<(), String> {
        let Some(dir) = &self.cache_dir else { return Ok(()) };
        let bytes = std::fs::read(wasm).map_err(|e| format!("cannot read {}: {e}", wasm.display()))?;
        cache::ensure_cached(&self.engine, &bytes, dir)
    }

    fn compile(&self, wasm: &Path) -> Result<Component, String> {
        let bytes = std::fs::read(wasm).map_err(|e| format!("cannot read {}: {e}", wasm.display()))?;
        match &self.cache_dir {
            Some(dir) => cache::compile_cached(&self.engine, &bytes, dir),
            None => {
                let compiled = cache::precompile_apart(&self.engine, &bytes)?;
                // SAFETY: `compiled` was produced by this engine a moment ago.
                unsafe { Component::deserialize(&self.engine, &compiled) }
                    .map_err(|e| format!("cannot load the compiled plugin: {e}"))
            }
        }
    }
}

/// The largest linear memory: a 32-bit one's size, the largest
/// `plugin.memory_limit`.
const MAX_MEMORY_BYTES: usize = PLUGIN_MAX_MEMORY_BYTES as usize;

/// The most instances alive at once across all plugins, warm ones included
/// (the largest `plugin.instances`).
const POOL_INSTANCES: u32 = PLUGIN_MAX_INSTANCES as u32;

/// The pooling allocator's slots: starting an instance (the first of a
/// model, one more under load, one replacing an instance that trapped)
/// takes pre-reserved memory instead of mapping new. The sizes fit the
/// plugins built with the SDK and componentize-py's Python components,
/// which hold several core modules; a memory may grow to 4 GiB here, and
/// each model's `plugin.memory_limit` caps it lower.
fn pool() -> wasmtime::PoolingAllocationConfig {
    let mut pool = wasmtime::PoolingAllocationConfig::new();
    pool.total_component_instances(POOL_INSTANCES)
        .total_core_instances(POOL_INSTANCES * 16)
        .total_memories(POOL_INSTANCES * 4)
        .total_tables(POOL_INSTANCES * 16)
        .max_core_instances_per_component(64)
        .max_memories_per_component(16)
        .max_tables_per_component(64)
        .table_elements(1 << 16)
        .max_memory_size(MAX_MEMORY_BYTES)
        // A call runs on a fiber stack of its own (an asynchronous call).
        .total_stacks(POOL_INSTANCES);
    pool
}

/// Drives `future` to completion from synchronous code: a model's load, on
/// one of the runtime's blocking threads, or a test or benchmark outside
/// any runtime (wasmtime-wasi's own runtime then drives it). On an async
/// worker thread the runtime first moves its other tasks away.
fn wait<F: std::future::Future>(future: F) -> F::Output {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| handle.block_on(future))
        }
        _ => wasmtime_wasi::runtime::in_tokio(future),
    }
}

/// The versions this host runs, for messages: "0.1.0, 0.2.0, 0.3.0, 0.4.0".
pub fn runs() -> String {
    ContractVersion::ALL.map(ContractVersion::as_str).join(", ")
}

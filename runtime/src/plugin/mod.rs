//! The WebAssembly sandbox for model plugins (WASI 0.2 components run by
//! wasmtime). Every released contract version stays supported
//! ([`ContractVersion`]): a component exporting
//! `plinth:plugin/handler@0.1.0` gets the 0.1 bindings, one exporting
//! `@0.2.0`, `@0.3.0` or `@0.4.0` those bindings with the `inference`
//! import, through which it runs other models ([`compose`], over a
//! [`ModelRunner`] the caller passes with each call); 0.4 adds the
//! `generation` export, a generative model's tokenizer. The version is read from the component's export
//! names, which the SDK's generated bindings fix at build time.
//!
//! Each plugin is compiled once (the compiled artefact is cached on disk),
//! and each model keeps a pool of warm instances. An instance sees its model
//! version folder read-only at `/model` and nothing else: no network, no
//! environment, no other files. Every call has a deadline (epoch
//! interruption) and every instance a memory limit; an instance that traps is
//! dropped and the next call gets a fresh one.
//!
//! Calls are asynchronous: wasmtime runs the guest on a fiber stack, WASI
//! and composed calls are awaited, and the guest yields to the runtime at
//! every epoch tick. A short call is therefore awaited on the request's own
//! thread with no hand-off, and a long one runs on a blocking thread.

mod cache;
pub mod compose;
mod contract;
mod convert;
mod host;
mod memory;
pub mod scaffold;
#[cfg(test)]
mod tests;
mod timing;
mod trap;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Semaphore;
use wasmtime::component::ResourceTable;
use wasmtime::{Engine, Store, Trap};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxView, WasiView};

use crate::config::parameters::PluginParameters;
use crate::error::Error;
use crate::metrics::{PluginMetrics, PluginStage};
use crate::tensor::Tensor;
use compose::Composition;
pub use compose::{CallContext, ModelRunner};
pub use contract::{ChatMessage, ContractVersion, Detokenized, Prompt};
use contract::{Exports, Pre};
pub use host::{PluginHost, runs};
use memory::CountingLimits;
use timing::CallTiming;
pub use timing::INLINE_CALL;

/// How often the epoch advances; the granularity of the call deadline.
const EPOCH_TICK: Duration = Duration::from_millis(5);
/// Bytes of a plugin's stderr kept per instance (panic messages land here).
const STDERR_CAPACITY: usize = 64 * 1024;
/// Bytes of stderr quoted in an error message.
const STDERR_QUOTED: usize = 1024;
/// Where the plugin sees its model version folder.
pub const MODEL_MOUNT: &str = "/model";

/// Resource limits applied to every plugin call. The defaults are those of
/// `plinth serve`: 256 MiB, 2000 ms, one call per core. A model may lower or
/// raise its own memory and time limits and cap its instances with the
/// `config.pbtxt` parameters `plugin.memory_limit`, `plugin.timeout_ms` and
/// `plugin.instances` (see [`PluginLimits::for_model`]).
#[derive(Clone, Copy, Debug)]
pub struct PluginLimits {
    /// Largest linear memory one instance may grow to, in bytes.
    pub memory_bytes: usize,
    /// How long one call may run before it is trapped (wall-clock time while
    /// the plugin executes, checked at epoch ticks).
    pub call_timeout: Duration,
    /// Plugin calls that run at the same time, across all models.
    pub concurrency: usize,
    /// The most instances (and calls at once) of one model's plugin; 0 for
    /// no limit beyond `concurrency`.
    pub instances: usize,
    /// `--plugin-panic-details`: a trapped call's error response quotes the
    /// plugin's panic message and stderr (which can hold the client's
    /// input); without it only the panic's source location (the log has
    /// everything either way).
    pub panic_details: bool,
}

impl PluginLimits {
    /// These limits with a model's `plugin.memory_limit`,
    /// `plugin.timeout_ms` and `plugin.instances` applied (each already
    /// checked against its maximum by the validation); a model's value
    /// wins over the server-wide one, higher or lower.
    pub fn for_model(mut self, own: &PluginParameters) -> PluginLimits {
        if let Some(bytes) = own.memory_bytes {
            self.memory_bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        }
        if let Some(timeout) = own.timeout {
            self.call_timeout = timeout;
        }
        if let Some(instances) = own.instances {
            self.instances = instances;
        }
        self
    }
}

impl Default for PluginLimits {
    fn default() -> Self {
        PluginLimits {
            memory_bytes: 256 << 20,
            call_timeout: Duration::from_millis(2000),
            concurrency: std::thread::available_parallelism().map_or(1, usize::from),
            instances: 0,
            panic_details: false,
        }
    }
}

/// A raw request handed to a plugin (the body of `/predict`).
#[derive(Clone, Debug, Default)]
pub struct RawRequest {
    /// The request's `Content-Type` header, or empty.
    pub content_type: String,
    /// The request body as sent.
    pub body: Vec<u8>,
    /// Query parameters of the request.
    pub parameters: Vec<(String, String)>,
}

/// A plugin's answer: an HTTP body and its content type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawResponse {
    /// The `Content-Type` of the answer.
    pub content_type: String,
    /// The answer's body.
    pub body: Vec<u8>,
}

/// What a model tells its plugin when an instance starts.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// The model's name.
    pub name: String,
    /// The version being loaded.
    pub version: u64,
    /// Declared inputs, outputs and `max_batch_size`.
    pub signature: crate::config::Signature,
    /// `config.pbtxt` parameters as key/string-value pairs.
    pub parameters: Vec<(String, String)>,
    /// Custom metadata of the model file.
    pub metadata: Vec<(String, String)>,
}

/// Why a plugin call failed; each shows as its message.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    /// The plugin refused the call with a class the client acts on: the
    /// request is malformed ([`Error::InvalidArgument`], HTTP 400), or it
    /// passed on a composed call's refusal (not found 404, unavailable 503,
    /// overloaded 503 with its `Retry-After`). The message names the plugin.
    #[error("{0}")]
    Refused(Error),
    /// The plugin failed, trapped, ran out of time or memory (HTTP 500).
    /// The message names the plugin.
    #[error("{0}")]
    Failed(String),
}

/// The state of one plugin instance's store.
struct InstanceState {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: CountingLimits,
    composition: Composition,
    /// When the running call reaches its time limit; pushed back by the
    /// time its composed calls take.
    deadline: Instant,
}

impl WasiView for InstanceState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// A started plugin instance, ready for calls.
struct Instance {
    store: Store<InstanceState>,
    exports: Exports,
    stderr: MemoryOutputPipe,
}

/// A plugin loaded for one model version, with its pool of warm instances.
pub struct Plugin {
    /// "plugin 'x.wasm' of model 'm'", the prefix of every error.
    label: String,
    /// The size of its compiled code in memory, in bytes.
    code_bytes: u64,
    /// How long its calls take: which run inline.
    timing: CallTiming,
    engine: Engine,
    pre: Pre<InstanceState>,
    info: ModelInfo,
    model_dir: PathBuf,
    limits: PluginLimits,
    /// `plugin.instances`: calls of this plugin at once, when capped.
    slots: Option<Arc<Semaphore>>,
    metrics: PluginMetrics,
    idle: Mutex<Vec<Instance>>,
    permits: Arc<Semaphore>,
}

impl Plugin {
    /// Host memory the plugin holds, in bytes: its compiled code and the
    /// linear memories of its idle instances (an instance running a call
    /// is not counted until it is back). Right after the load that is the
    /// instance it started and warmed up.
    pub fn resident_bytes(&self) -> u64 {
        let idle = self.idle.lock();
        self.code_bytes + idle.iter().map(|inst| inst.store.data().limits.bytes() as u64).sum::<u64>()
    }

    /// Runs `preprocess`: a raw request in, the model's input tensors out.
    /// `context` says where composed calls go and which models' plugins
    /// already run for this request, this one last (see [`compose`]).
    ///
    /// # Errors
    /// [`PluginError::Refused`] when the plugin refuses the request or
    /// passes on a composed call's refusal (its class kept);
    /// [`PluginError::Failed`] when it fails, traps, exceeds its time limit or
    /// memory.
    pub async fn preprocess(
        self: &Arc<Self>,
        req: Arc<RawRequest>,
        context: CallContext,
    ) -> Result<Vec<Tensor>, PluginError> {
        self.call(PluginStage::Preprocess, Some(context), move |mut inst| async move {
            let result = inst.exports.preprocess(&mut inst.store, &req).await;
            (inst, result)
        })
        .await
    }

    /// Runs `postprocess`: the request and the model's outputs in, the answer
    /// out.
    ///
    /// # Errors
    /// As [`Plugin::preprocess`].
    pub async fn postprocess(
        self: &Arc<Self>,
        req: Arc<RawRequest>,
        outputs: Vec<Tensor>,
        context: CallContext,
    ) -> Result<RawResponse, PluginError> {
        self.call(PluginStage::Postprocess, Some(context), move |mut inst| async move {
            let result = inst.exports.postprocess(&mut inst.store, &req, outputs).await;
            (inst, result)
        })
        .await
    }

    /// A generative model's prompt as token ids (`generation.encode`).
    ///
    /// # Errors
    /// [`PluginError::Refused`] with the plugin's reason (a prompt it
    /// cannot tokenize, a plugin without text generation);
    /// [`PluginError::Failed`] when it traps or fails.
    pub async fn encode(self: &Arc<Self>, prompt: Prompt) -> Result<Vec<u32>, PluginError> {
        self.call(PluginStage::Encode, None, move |mut inst| async move {
            let result = inst.exports.encode(&mut inst.store, &prompt).await;
            (inst, result)
        })
        .await
    }

    /// The final text of a window of generated ids (`generation.decode`):
    /// `window` starts where the previous step's `prefix` pointed, and its
    /// first `read` ids are already text.
    ///
    /// # Errors
    /// As [`Plugin::encode`].
    pub async fn decode(self: &Arc<Self>, window: Vec<u32>, read: usize) -> Result<Detokenized, PluginError> {
        self.call(PluginStage::Decode, None, move |mut inst| async move {
            let result = inst.exports.decode(&mut inst.store, &window, read).await;
            (inst, result)
        })
        .await
    }

    /// The token ids that end a generation (`generation.info`).
    ///
    /// # Errors
    /// As [`Plugin::encode`].
    pub async fn stop_token_ids(self: &Arc<Self>) -> Result<Vec<u32>, PluginError> {
        self.call(PluginStage::Encode, None, move |mut inst| async move {
            let result = inst.exports.stop_token_ids(&mut inst.store).await;
            (inst, result)
        })
        .await
    }

    /// Runs `call` on a warm instance and counts it (its wait for a permit
    /// included) in the plugin metrics. Requests' outermost plugin calls
    /// run at most `concurrency` at a time; a nested call (made by another
    /// plugin through composition, whose caller holds a permit and waits)
    /// takes none, so compositions cannot deadlock on permits.
    ///
    /// wasmtime runs the guest on a fiber of its own, so a call is a future.
    /// A stage whose calls take [`INLINE_CALL`] or less on average, in a
    /// plugin that has never run another model, is awaited where it was
    /// asked for, on the async runtime's thread: handing it to another
    /// thread and back would cost more than the call. Any other call runs
    /// on a blocking thread, so that a long one never stalls the runtime.
    /// A request dropped while its inline call is suspended (at a tick, in
    /// WASI or a composed call) drops the instance with it, uncounted; the
    /// pool starts another when one is needed.
    async fn call<T, F, Fut>(
        self: &Arc<Self>,
        stage: PluginStage,
        context: Option<CallContext>,
        call: F,
    ) -> Result<T, PluginError>
    where
        T: Send + 'static,
        F: FnOnce(Instance) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = (Instance, wasmtime::Result<Result<T, Error>>)> + Send,
    {
        let started = Instant::now();
        let result = async {
            let closed = |_| self.failed("the plugin host is shutting down");
            let _slot = match &self.slots {
                Some(slots) => Some(slots.acquire().await.map_err(closed)?),
                None => None,
            };
            let nested = context.as_ref().is_some_and(|c| c.chain.len() > 1);
            let _permit = if nested { None } else { Some(self.permits.acquire().await.map_err(closed)?) };
            if self.timing.runs_inline(stage) {
                return self.run(stage, context, call).await;
            }
            let (this, runtime) = (self.clone(), tokio::runtime::Handle::current());
            tokio::task::spawn_blocking(move || runtime.block_on(this.run(stage, context, call)))
                .await
                .map_err(|e| self.failed(&format!("its call panicked in the host: {e}")))?
        }
        .await;
        self.metrics.called(stage, started.elapsed(), !matches!(result, Err(PluginError::Failed(_))));
        result
    }

    /// Runs `call` on an instance taken from the pool (or a new one) with
    /// `context` for its composed calls, and remembers how long it took.
    /// The instance goes back to the pool unless it trapped.
    async fn run<T, F, Fut>(&self, stage: PluginStage, context: Option<CallContext>, call: F) -> Result<T, PluginError>
    where
        F: FnOnce(Instance) -> Fut,
        Fut: std::future::Future<Output = (Instance, wasmtime::Result<Result<T, Error>>)>,
    {
        let export = stage.label();
        let started = Instant::now();
        let taken = self.idle.lock().pop();
        let mut inst = match taken {
            Some(inst) => inst,
            None => self.start_instance().await?,
        };
        let composition = &mut inst.store.data_mut().composition;
        (composition.context, composition.host_time) = (context, Duration::ZERO);
        let stderr_before = inst.stderr.contents().len();
        self.start_clock(&mut inst.store);
        let (mut inst, result) = call(inst).await;
        self.timing.remember(stage, started.elapsed());
        match result {
            Ok(result) => {
                // An idle instance holds no runner: nothing it owns keeps the
                // server's models alive.
                let composition = &mut inst.store.data_mut().composition;
                composition.context = None;
                if std::mem::take(&mut composition.composed) {
                    self.timing.composed();
                }
                self.idle.lock().push(inst);
                result.map_err(|e| match e {
                    Error::Internal(m) => self.failed(&format!("{export} failed: {m}")),
                    refused => PluginError::Refused(refused.map_message(|m| format!("{}: {m}", self.label))),
                })
            }
            Err(trap) => {
                self.metrics.trapped();
                Err(self.trapped(export, &trap, &inst.stderr, stderr_before))
            }
        }
    }

    /// Instantiates the component in a fresh store and calls `init`.
    async fn start_instance(&self) -> Result<Instance, PluginError> {
        self.metrics.started();
        let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
        let mut wasi = WasiCtx::builder();
        // No stdin, arguments or environment (the builder's defaults), no
        // sockets, and stderr captured for error messages.
        wasi.stderr(stderr.clone()).allow_tcp(false).allow_udp(false).allow_ip_name_lookup(false);
        wasi.preopened_dir(&self.model_dir, MODEL_MOUNT, FsPerms::ReadOnly)
            .map_err(|e| self.failed(&format!("cannot open its model folder {}: {e}", self.model_dir.display())))?;
        let limits = CountingLimits::new(self.limits.memory_bytes);
        let state = InstanceState {
            wasi: wasi.build(),
            table: ResourceTable::new(),
            limits,
            composition: Composition::default(),
            deadline: Instant::now(),
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        self.start_clock(&mut store);
        // At every tick the guest runs, it yields to the async runtime (a
        // call awaited on a runtime thread lets that thread's other tasks
        // run), and is stopped once past its deadline: wall-clock time from
        // the call's start, less the time spent in composed calls (other
        // models' work).
        store.epoch_deadline_callback(|mut ctx| {
            let state = ctx.data_mut();
            state.deadline += std::mem::take(&mut state.composition.host_time);
            if Instant::now() >= state.deadline {
                return Ok(wasmtime::UpdateDeadline::Interrupt);
            }
            Ok(wasmtime::UpdateDeadline::YieldCustom(1, Box::pin(tokio::task::yield_now())))
        });
        let exports =
            self.pre.instantiate(&mut store).await.map_err(|e| self.trapped("instantiation", &e, &stderr, 0))?;
        let mut inst = Instance { store, exports, stderr };
        match inst.exports.init(&mut inst.store, &self.info).await {
            Ok(Ok(())) => Ok(inst),
            Ok(Err(e)) => Err(self.failed(&format!("init failed: {e}"))),
            Err(trap) => Err(self.trapped("init", &trap, &inst.stderr, 0)),
        }
    }

    /// Starts a call's time limit: the deadline callback runs at the next
    /// epoch tick, and at each one after it.
    fn start_clock(&self, store: &mut Store<InstanceState>) {
        store.data_mut().deadline = Instant::now() + self.limits.call_timeout;
        store.set_epoch_deadline(1);
    }

    fn failed(&self, what: &str) -> PluginError {
        PluginError::Failed(format!("{} {what}", self.label))
    }

    /// Describes a trap: the time limit, or wasmtime's reason plus what
    /// the plugin wrote to stderr during the call (panic messages, failed
    /// allocations).
    fn trapped(&self, export: &str, err: &wasmtime::Error, stderr: &MemoryOutputPipe, from: usize) -> PluginError {
        if err.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
            return self.failed(&format!(
                "exceeded its time limit of {} ms in {export} and was stopped",
                self.limits.call_timeout.as_millis()
            ));
        }
        let reason = err.downcast_ref::<Trap>().map_or_else(|| err.to_string(), Trap::to_string);
        let output = stderr.contents();
        let output = String::from_utf8_lossy(output.get(from..).unwrap_or_default());
        let output = output.trim();
        let tail = &output[output.floor_char_boundary(output.len().saturating_sub(STDERR_QUOTED))..];
        let described = trap::describe(&reason, tail, self.limits.panic_details);
        tracing::warn!("{} trapped in {export}: {}", self.label, described.logged);
        self.failed(&format!("trapped in {export}: {}", described.shown))
    }
}

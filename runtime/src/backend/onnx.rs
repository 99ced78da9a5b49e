//! ONNX Runtime through `ort`, with the library loaded at start from
//! `ORT_DYLIB_PATH`: the `onnxruntime==1.31.1` wheel's `libonnxruntime.so`
//! for the CPU, or the `onnxruntime-gpu==1.31.1` wheel's, which also runs
//! sessions on CUDA devices through its CUDA execution provider
//! (`libonnxruntime_providers_cuda.so` beside it, CUDA 13 and cuDNN 9 on
//! the library path; `make setup-gpu` places them).

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ort::AsPointer;
use ort::environment::Environment;
use ort::ep::{ArenaExtendStrategy, CUDA};
use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use ort::value::{DynTensor, DynTensorValueType, DynValue, Tensor as OrtTensor, TensorElementType, ValueType};
use parking_lot::Mutex;

use super::{Backend, BackendError, BackendKind, Description, Framework, LoadContext, ModelIo, Placement, shared};
use crate::config::parameters::OnnxParameters;
use crate::config::{self, ModelConfig};
use crate::gpu::Gpus;
use crate::tensor::{DataType, Tensor, bytes_elements, push_bytes_element};

/// How to get the ONNX Runtime library, for error messages.
pub const HINT: &str = "set ORT_DYLIB_PATH to the ONNX Runtime 1.31 library, e.g. .cache/onnxruntime/libonnxruntime.so \
    (`make setup` installs it), or run the bundle of `make dist`";

/// The CUDA execution provider's library, which the GPU build of ONNX
/// Runtime loads from its own folder.
pub const CUDA_PROVIDER_LIBRARY: &str = "libonnxruntime_providers_cuda.so";

/// What `make setup-gpu` does, for error messages.
const GPU_HINT: &str = "`make setup-gpu` installs onnxruntime-gpu==1.31.1 and its CUDA 13 libraries, \
    and `make serve GPU=1` serves with them";

/// ONNX Runtime as a framework: `None` when no library was given (ONNX
/// models then fail to load, saying how to give it).
pub struct Onnx {
    runtime: Option<Arc<OnnxRuntime>>,
}

impl Onnx {
    /// Loads the ONNX Runtime library at `library`, if given.
    ///
    /// # Errors
    /// As [`OnnxRuntime::init`].
    pub fn start(library: Option<&Path>) -> Result<Onnx, String> {
        let runtime = match library {
            Some(path) => Some(Arc::new(OnnxRuntime::init(path)?)),
            None => {
                tracing::warn!("no ORT_DYLIB_PATH: ONNX models will not load");
                None
            }
        };
        Ok(Onnx { runtime })
    }

    /// The loaded library.
    ///
    /// # Errors
    /// Says how to give it when no library was given.
    pub fn runtime(&self) -> Result<&Arc<OnnxRuntime>, String> {
        self.runtime.as_ref().ok_or_else(|| format!("ONNX Runtime is not loaded: {HINT}"))
    }
}

impl Framework for Onnx {
    fn kind(&self) -> BackendKind {
        BackendKind::OnnxRuntime
    }

    fn gpus(&self, gpus: &Gpus) -> Result<usize, String> {
        self.runtime()?.cuda().map_err(str::to_owned)?;
        match gpus.count() {
            0 => Err(format!("no GPU is usable: {}", gpus.absence().unwrap_or("NVML lists none"))),
            n => Ok(n),
        }
    }

    fn load(&self, model: &LoadContext<'_>, placements: &[Placement]) -> Result<Vec<Arc<dyn Backend>>, String> {
        let path = model.file("model.onnx");
        if let Some(hint) = not_onnx(model.name, model.version_dir, model.config, &path) {
            return Err(format!("model file {} does not exist; {hint}", path.display()));
        }
        let runtime = self.runtime()?;
        let options = session_options(model.config, model.parameters.onnx, placements.len());
        let load = |&p: &Placement| model.measured(p, || runtime.load(&path, options, p));
        placements.iter().map(load).collect::<Result<_, _>>().map(shared)
    }
}

/// The files by which Triton picks the backend of a model whose
/// configuration names none, other than ONNX Runtime's, and what each is.
const OTHER_MODEL_FILES: [(&str, &str); 6] = [
    ("model.pt", "a TorchScript model: Plinth serves it with platform \"pytorch_libtorch\" in config.pbtxt"),
    ("model.plan", "a TensorRT engine, for Triton's 'tensorrt' backend, which Plinth does not ship"),
    ("model.py", "a model of Triton's 'python' backend, which Plinth does not ship"),
    ("model.xml", "a model of Triton's 'openvino' backend, which Plinth does not ship"),
    ("model.savedmodel", "a model of Triton's 'tensorflow' backend, which Plinth does not ship"),
    ("model.graphdef", "a model of Triton's 'tensorflow' backend, which Plinth does not ship"),
];

/// Why a model whose configuration names no platform or backend, and whose
/// ONNX file `path` is missing, is no ONNX model: the file of another
/// backend in its version folder, or a name `NAME.BACKEND` (Triton's way to
/// name a custom backend). `None` when neither explains it.
fn not_onnx(name: &str, version_dir: &Path, config: &ModelConfig, path: &Path) -> Option<String> {
    if path.exists() || !config.platform.is_empty() || !config.backend.is_empty() {
        return None;
    }
    let unnamed = "config.pbtxt names no platform or backend, so Plinth looks for an ONNX model";
    if let Some((file, what)) = OTHER_MODEL_FILES.iter().find(|(file, _)| version_dir.join(file).exists()) {
        return Some(format!("{unnamed}, but the version folder holds {file}, {what}"));
    }
    let (_, backend) = name.rsplit_once('.')?;
    Some(format!(
        "{unnamed}; a model name of the form NAME.BACKEND does not pick backend '{backend}' here (Triton's custom \
         backends): name it with backend: \"{backend}\" in config.pbtxt (Plinth serves {})",
        config::served()
    ))
}

/// ONNX Runtime thread settings from the model's `parameters`: the counts
/// Triton's ONNX Runtime backend reads (`intra_op_thread_count`,
/// `inter_op_thread_count`) and `session.intra_op.allow_spinning`. Without
/// `intra_op_thread_count`, the cores are shared among the `instances`, so
/// that instances running at once do not oversubscribe the CPU. Spinning is
/// on unless set to "0", as ONNX Runtime (and so Triton's ONNX Runtime
/// backend) leaves it: without it every parallel operator wakes the pool's
/// threads from sleep, which doubled ocr_rec's run on two cores (43 ms
/// against 86 ms); "0" leaves the cores to HTTP, plugins and other models
/// between runs.
pub(crate) fn session_options(config: &ModelConfig, keys: OnnxParameters, instances: usize) -> SessionOptions {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    SessionOptions {
        intra_op_threads: keys.intra_op_threads.unwrap_or((cores / instances).max(1)),
        inter_op_threads: keys.inter_op_threads.unwrap_or(0),
        intra_op_spinning: keys.allow_spinning,
        graph_level: config.optimization.as_ref().and_then(|o| o.graph.as_ref()).map_or(0, |g| g.level),
    }
}

/// The loaded ONNX Runtime library; creates sessions.
pub struct OnnxRuntime {
    env: Environment,
    /// Whether sessions can run on CUDA devices, or why not.
    cuda: Result<(), String>,
}

/// Per-model session options, from `config.pbtxt` `parameters` (the names
/// Triton's ONNX Runtime backend uses).
#[derive(Clone, Copy, Debug, Default)]
pub struct SessionOptions {
    /// `intra_op_thread_count`: threads inside one operator; 0 = ONNX
    /// Runtime's default (one per core).
    pub intra_op_threads: usize,
    /// `inter_op_thread_count`: threads across operators; 0 = default.
    pub inter_op_threads: usize,
    /// `session.intra_op.allow_spinning` (ONNX Runtime's session config
    /// key): whether idle intra-op threads busy-wait for the next run.
    pub intra_op_spinning: bool,
    /// `optimization.graph.level`, as Triton's ONNX Runtime backend reads
    /// it: -1 basic, 1 extended, 2 none, anything else (0) all.
    pub graph_level: i32,
}

/// ONNX Runtime's optimization level for Triton's `optimization.graph.level`.
fn optimization_level(level: i32) -> GraphOptimizationLevel {
    match level {
        -1 => GraphOptimizationLevel::Level1,
        1 => GraphOptimizationLevel::Level2,
        2 => GraphOptimizationLevel::Disable,
        _ => GraphOptimizationLevel::All,
    }
}

impl OnnxRuntime {
    /// The backend its sessions are, for what runs them itself.
    pub const KIND: BackendKind = BackendKind::OnnxRuntime;

    /// Loads the ONNX Runtime shared library at `path` (`ORT_DYLIB_PATH`).
    ///
    /// # Errors
    /// A message naming `ORT_DYLIB_PATH` when the file does not exist,
    /// cannot be loaded, or is older than 1.31.
    pub fn init(path: &Path) -> Result<OnnxRuntime, String> {
        if !path.is_file() {
            return Err(format!("ONNX Runtime library {} does not exist: {HINT}", path.display()));
        }
        let env = ort::init_from(path)
            .map_err(|e| format!("cannot load ONNX Runtime from ORT_DYLIB_PATH={}: {e}", path.display()))?
            .with_name("plinth")
            .build()
            .map_err(|e| format!("cannot start ONNX Runtime: {e}"))?;
        // Failures reach the client and the log through Plinth's own errors.
        env.set_log_level(ort::logging::LogLevel::Fatal);
        let cuda = cuda_provider(path);
        match &cuda {
            Ok(()) => tracing::info!(library = %path.display(), "ONNX Runtime's CUDA execution provider can start"),
            Err(why) => tracing::debug!(%why, "ONNX Runtime sessions run on the CPU only"),
        }
        Ok(OnnxRuntime { env, cuda })
    }

    /// Whether sessions can run on CUDA devices.
    ///
    /// # Errors
    /// Why not, naming the file that is missing: the CPU build's library
    /// (no CUDA execution provider), a missing
    /// [`CUDA_PROVIDER_LIBRARY`], or a CUDA library it needs
    /// (`libcublasLt.so.13`, `libcuda.so.1`: no driver).
    pub fn cuda(&self) -> Result<(), &str> {
        self.cuda.as_ref().map(|_| ()).map_err(String::as_str)
    }

    /// Builds a session for the model file at `path`, running on
    /// `placement`'s device. A session on a GPU runs through the CUDA
    /// execution provider with its own memory arena, grown by what each
    /// allocation asks (ONNX Runtime's `kSameAsRequested`, so a session
    /// holds no more device memory than its largest run needed), and
    /// binds its inputs and outputs to host memory (IO binding): each
    /// input is copied to the device once and each output back once.
    ///
    /// # Errors
    /// ONNX Runtime's message when the file is missing or not a valid model;
    /// for a GPU placement, [`OnnxRuntime::cuda`]'s reason or the CUDA
    /// execution provider's own (no such device, out of memory).
    pub fn load(&self, path: &Path, options: SessionOptions, placement: Placement) -> Result<OnnxModel, String> {
        let session = self.session(path, options, placement)?;
        let io = |outlets: &[ort::value::Outlet]| outlets.iter().map(|o| model_io(o.name(), o.dtype())).collect();
        let inputs = io(session.inputs());
        let outputs = io(session.outputs());
        let metadata = read_metadata(&session)?;
        let file_bytes = std::fs::metadata(path).map_or(0, |m| m.len());
        let io_binding = matches!(placement, Placement::Gpu(_));
        let description = Description {
            kind: BackendKind::OnnxRuntime,
            platform: BackendKind::OnnxRuntime.platform().unwrap_or_default().into(),
            inputs,
            outputs,
            metadata,
            remote: false,
        };
        Ok(OnnxModel { session: Mutex::new(session), description, file_bytes, io_binding })
    }

    /// The ONNX Runtime session of [`OnnxRuntime::load`], for what runs it
    /// itself (a generative model's decode loop).
    ///
    /// # Errors
    /// As [`OnnxRuntime::load`].
    pub fn session(&self, path: &Path, options: SessionOptions, placement: Placement) -> Result<Session, String> {
        if !path.is_file() {
            return Err(format!("model file {} does not exist", path.display()));
        }
        let fail = |e: ort::Error<_>| format!("ONNX Runtime cannot load {}: {e}", path.display());
        let mut builder =
            Session::builder(&self.env).map_err(|e| format!("cannot create an ONNX Runtime session: {e}"))?;
        if let Placement::Gpu(device) = placement {
            self.cuda().map_err(|why| format!("cannot run on GPU {device}: {why}"))?;
            let cuda = CUDA::default()
                .with_device_id(i32::try_from(device).map_err(|_| format!("GPU {device} does not exist"))?)
                .with_arena_extend_strategy(ArenaExtendStrategy::SameAsRequested)
                .build()
                .error_on_failure();
            builder = builder
                .with_execution_providers([cuda])
                .map_err(|e| format!("ONNX Runtime's CUDA execution provider cannot start on GPU {device}: {e}"))?;
        }
        builder
            .with_optimization_level(optimization_level(options.graph_level))
            .map_err(fail)?
            .with_intra_threads(options.intra_op_threads)
            .map_err(fail)?
            .with_inter_threads(options.inter_op_threads)
            .map_err(fail)?
            .with_intra_op_spinning(options.intra_op_spinning)
            .map_err(fail)?
            .commit_from_file(path)
            .map_err(|e| format!("ONNX Runtime cannot load {}: {e}", path.display()))
    }
}

/// Whether the library at `library` can run sessions on CUDA devices: it
/// lists the CUDA execution provider (the GPU build does), the provider's
/// library is beside it, and that library and the CUDA libraries it needs
/// load. Loading them here names a missing file at start, where ONNX
/// Runtime would say only that the provider failed at a model's load.
fn cuda_provider(library: &Path) -> Result<(), String> {
    use ort::ep::ExecutionProvider;
    let listed = CUDA::is_available().map_err(|e| format!("ONNX Runtime cannot list its execution providers: {e}"))?;
    let folder = std::fs::canonicalize(library).ok().and_then(|p| p.parent().map(Path::to_path_buf));
    let folder = folder.unwrap_or_else(|| PathBuf::from("."));
    let provider = folder.join(CUDA_PROVIDER_LIBRARY);
    if !listed || !provider.is_file() {
        return Err(format!(
            "the ONNX Runtime library {} is a CPU-only build: it has no CUDAExecutionProvider ({} is not in {}); {GPU_HINT}",
            library.display(),
            CUDA_PROVIDER_LIBRARY,
            folder.display()
        ));
    }
    // ONNX Runtime loads the shared provider library globally before a
    // provider; the provider's own symbols resolve when it is used.
    open_library(&folder.join("libonnxruntime_providers_shared.so"), libc::RTLD_NOW | libc::RTLD_GLOBAL)?;
    open_library(&provider, libc::RTLD_LAZY | libc::RTLD_LOCAL).map_err(|e| {
        format!("{e}; the CUDA 13 runtime, cuBLAS, cuRAND and the driver's libcuda.so.1 must be on LD_LIBRARY_PATH ({GPU_HINT})")
    })
}

/// `dlopen`s `path` and keeps it loaded.
///
/// # Errors
/// The dynamic loader's message, which names the missing library.
fn open_library(path: &Path, flags: libc::c_int) -> Result<(), String> {
    let name =
        CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| format!("{}: bad path", path.display()))?;
    // SAFETY: a NUL-terminated path; the handle is kept for the process's
    // life (ONNX Runtime opens the same library again and shares it).
    let handle = unsafe { libc::dlopen(name.as_ptr(), flags) };
    if handle.is_null() {
        // SAFETY: dlerror returns the last error as a C string, or null.
        let error = unsafe { libc::dlerror() };
        let message = if error.is_null() {
            "unknown error".to_owned()
        } else {
            // SAFETY: non-null, NUL-terminated, valid until the next dl call.
            unsafe { std::ffi::CStr::from_ptr(error) }.to_string_lossy().into_owned()
        };
        return Err(format!("cannot load {}: {message}", path.display()));
    }
    Ok(())
}

/// One ONNX Runtime session. Runs are serialised on it.
pub struct OnnxModel {
    session: Mutex<Session>,
    description: Description,
    /// The size of the model file, in bytes.
    file_bytes: u64,
    /// Runs bind inputs and outputs to host memory (sessions on a GPU).
    io_binding: bool,
}

impl Backend for OnnxModel {
    fn description(&self) -> &Description {
        &self.description
    }

    /// The bytes the session's CPU arena took (`TotalAllocated`: weights
    /// it holds and the buffers its runs so far grew it to), plus the
    /// weights held outside it, bounded by the model file's size less what
    /// the arena holds between runs (`InUse`). Every session has an arena
    /// of its own, so other models' requests never count. Waits for a run
    /// in progress; the file's size alone when ONNX Runtime cannot say.
    fn resident_bytes(&self) -> u64 {
        let stats = ArenaStats::of(&self.session.lock());
        match stats {
            Ok(stats) => stats.total + self.file_bytes.saturating_sub(stats.in_use),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the ONNX Runtime arena's statistics");
                self.file_bytes
            }
        }
    }

    fn execute(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, BackendError> {
        let values = inputs
            .into_iter()
            .map(|t| Ok((t.name.clone(), to_ort(&t)?)))
            .collect::<Result<Vec<(String, DynValue)>, String>>()
            .map_err(BackendError::InvalidInput)?;
        let mut session = self.session.lock();
        if self.io_binding {
            return self.run_bound(&mut session, values);
        }
        let outputs = session.run(values).map_err(run_error)?;
        self.collect(outputs)
    }
}

impl OnnxModel {
    /// Runs with inputs and outputs bound to host memory: ONNX Runtime
    /// copies each input to the session's device once and writes each
    /// output straight into host memory.
    fn run_bound(&self, session: &mut Session, values: Vec<(String, DynValue)>) -> Result<Vec<Tensor>, BackendError> {
        let failed = |e: ort::Error| BackendError::Failed(format!("ONNX Runtime cannot bind the tensors: {e}"));
        let mut binding = session.create_binding().map_err(failed)?;
        for (name, value) in &values {
            binding.bind_input(name.as_str(), value).map_err(failed)?;
        }
        let host =
            MemoryInfo::new(AllocationDevice::CPU, 0, AllocatorType::Device, MemoryType::CPUOutput).map_err(failed)?;
        for output in &self.description.outputs {
            binding.bind_output_to_device(output.name.as_str(), &host).map_err(failed)?;
        }
        let outputs = session.run_binding(&binding).map_err(run_error)?;
        self.collect(outputs)
    }

    /// The declared outputs, in order, copied out of a run's values.
    fn collect(&self, mut outputs: ort::session::SessionOutputs<'_>) -> Result<Vec<Tensor>, BackendError> {
        self.description
            .outputs
            .iter()
            .map(|o| {
                let value =
                    outputs.remove(&o.name).ok_or_else(|| format!("ONNX Runtime returned no output '{}'", o.name))?;
                from_ort(&o.name, value)
            })
            .collect::<Result<_, String>>()
            .map_err(BackendError::Failed)
    }
}

/// A run's failure: the inputs' fault when ONNX Runtime calls the argument
/// invalid, else the server's.
fn run_error(e: ort::Error) -> BackendError {
    let message = format!("ONNX Runtime cannot run these inputs: {e}");
    match e.code() {
        ort::error::ErrorCode::InvalidArgument => BackendError::InvalidInput(message),
        _ => BackendError::Failed(message),
    }
}

/// A session's CPU arena as ONNX Runtime's `AllocatorGetStats` reports it
/// (keys from `onnxruntime/core/framework/allocator_stats`), in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct ArenaStats {
    /// `TotalAllocated`: what the arena took from the system. It never
    /// shrinks, so it covers the largest run so far.
    total: u64,
    /// `InUse`: what live tensors hold between runs (prepacked weights,
    /// initializers placed in the arena).
    in_use: u64,
}

impl ArenaStats {
    /// The statistics of `session`'s CPU arena.
    fn of(session: &Session) -> Result<ArenaStats, String> {
        let info = MemoryInfo::new(AllocationDevice::CPU, 0, AllocatorType::Arena, MemoryType::Default)
            .map_err(|e| e.to_string())?;
        let allocator = Allocator::new(session, info).map_err(|e| e.to_string())?;
        let api = ort::api();
        let mut pairs = std::ptr::null_mut();
        // SAFETY: the allocator belongs to the live session; on success ONNX
        // Runtime hands over `pairs`, released below.
        unsafe { ort::Error::result_from_status((api.AllocatorGetStats)(allocator.ptr(), &mut pairs)) }
            .map_err(|e| e.to_string())?;
        let (mut keys, mut values, mut count) = (std::ptr::null(), std::ptr::null(), 0usize);
        let mut stats = ArenaStats::default();
        let mut found = 0;
        // SAFETY: `pairs` is valid; the arrays it fills live as long as it
        // does and hold `count` NUL-terminated strings each.
        unsafe {
            (api.GetKeyValuePairs)(pairs, &mut keys, &mut values, &mut count);
            for i in 0..count {
                let key = std::ffi::CStr::from_ptr(*keys.add(i)).to_bytes();
                let value = std::ffi::CStr::from_ptr(*values.add(i)).to_str().ok().and_then(|v| v.parse().ok());
                match (key, value) {
                    (b"TotalAllocated", Some(v)) => (stats.total, found) = (v, found + 1),
                    (b"InUse", Some(v)) => (stats.in_use, found) = (v, found + 1),
                    _ => {}
                }
            }
            (api.ReleaseKeyValuePairs)(pairs);
        }
        if found < 2 {
            return Err("the arena's statistics lack TotalAllocated or InUse".to_owned());
        }
        Ok(stats)
    }
}

fn model_io(name: &str, dtype: &ValueType) -> ModelIo {
    match dtype {
        ValueType::Tensor { ty, shape, .. } => ModelIo {
            name: name.to_owned(),
            datatype: datatype_from_ort(*ty),
            type_name: format!("tensor of {ty}"),
            shape: shape.to_vec(),
        },
        other => ModelIo { name: name.to_owned(), datatype: None, type_name: other.to_string(), shape: Vec::new() },
    }
}

fn read_metadata(session: &Session) -> Result<Vec<(String, String)>, String> {
    let meta = session.metadata().map_err(|e| format!("cannot read model metadata: {e}"))?;
    let keys = meta.custom_keys().map_err(|e| format!("cannot read model metadata: {e}"))?;
    Ok(keys.into_iter().filter_map(|k| meta.custom(&k).map(|v| (k, v))).collect())
}

/// The v2 datatype of an ONNX element type; `None` for types the protocol
/// cannot carry (complex, 4-bit, 8-bit floats).
pub fn datatype_from_ort(ty: TensorElementType) -> Option<DataType> {
    use TensorElementType as T;
    Some(match ty {
        T::Bool => DataType::Bool,
        T::Uint8 => DataType::Uint8,
        T::Uint16 => DataType::Uint16,
        T::Uint32 => DataType::Uint32,
        T::Uint64 => DataType::Uint64,
        T::Int8 => DataType::Int8,
        T::Int16 => DataType::Int16,
        T::Int32 => DataType::Int32,
        T::Int64 => DataType::Int64,
        T::Float16 => DataType::Fp16,
        T::Float32 => DataType::Fp32,
        T::Float64 => DataType::Fp64,
        T::Bfloat16 => DataType::Bf16,
        T::String => DataType::Bytes,
        _ => return None,
    })
}

fn ort_type(dt: DataType) -> TensorElementType {
    use TensorElementType as T;
    match dt {
        DataType::Bool => T::Bool,
        DataType::Uint8 => T::Uint8,
        DataType::Uint16 => T::Uint16,
        DataType::Uint32 => T::Uint32,
        DataType::Uint64 => T::Uint64,
        DataType::Int8 => T::Int8,
        DataType::Int16 => T::Int16,
        DataType::Int32 => T::Int32,
        DataType::Int64 => T::Int64,
        DataType::Fp16 => T::Float16,
        DataType::Fp32 => T::Float32,
        DataType::Fp64 => T::Float64,
        DataType::Bf16 => T::Bfloat16,
        DataType::Bytes => T::String,
    }
}

/// Copies a tensor into an ONNX Runtime value.
fn to_ort(t: &Tensor) -> Result<DynValue, String> {
    if t.datatype == DataType::Bytes {
        let items = bytes_elements(&t.data).ok_or_else(|| format!("tensor '{}' has malformed BYTES data", t.name))?;
        let strings = items
            .into_iter()
            .map(|b| String::from_utf8(b.to_vec()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| format!("tensor '{}': ONNX Runtime strings must be UTF-8", t.name))?;
        let shape: Vec<usize> = t.shape.iter().map(|&d| d as usize).collect();
        return OrtTensor::from_string_array((shape, strings.as_slice()))
            .map(|v| v.into_dyn())
            .map_err(|e| format!("tensor '{}': {e}", t.name));
    }
    let mut value = DynTensor::new(&Allocator::default(), ort_type(t.datatype), t.shape.clone())
        .map_err(|e| format!("tensor '{}': {e}", t.name))?;
    if !t.data.is_empty() {
        // SAFETY: the tensor was just allocated on the CPU with this shape and
        // element type, so its buffer holds exactly `t.data.len()` bytes
        // (`Tensor::check_data` ran on the request path).
        unsafe { std::ptr::copy_nonoverlapping(t.data.as_ptr(), value.data_ptr_mut().cast::<u8>(), t.data.len()) };
    }
    Ok(value.into_dyn())
}

/// Copies an ONNX Runtime output into a tensor.
fn from_ort(name: &str, value: DynValue) -> Result<Tensor, String> {
    let tensor = value.downcast::<DynTensorValueType>().map_err(|e| format!("output '{name}' is not a tensor: {e}"))?;
    let ty = *tensor.data_type();
    let datatype = datatype_from_ort(ty)
        .ok_or_else(|| format!("output '{name}' has element type {ty}, which the v2 protocol cannot carry"))?;
    let shape = tensor.shape().to_vec();
    let data = if datatype == DataType::Bytes {
        let (_, strings) = tensor.try_extract_strings().map_err(|e| format!("output '{name}': {e}"))?;
        let mut data = Vec::new();
        for s in &strings {
            push_bytes_element(&mut data, s.as_bytes());
        }
        data
    } else {
        let len = crate::tensor::element_count(&shape).and_then(|n| ty.byte_size(n)).unwrap_or(0);
        let ptr = tensor.data_ptr().cast::<u8>();
        if len == 0 || ptr.is_null() {
            Vec::new()
        } else {
            // SAFETY: a CPU tensor of this shape and element type owns `len`
            // contiguous bytes at `ptr`, alive while `tensor` is.
            unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec()
        }
    };
    Ok(Tensor { name: name.to_owned(), datatype, shape, data })
}

#[cfg(test)]
pub(crate) mod tests;

//! TorchScript models (`pytorch_libtorch`) through libtorch (`tch` 0.24,
//! PyPI `torch==2.11.0`), on the CPU, or on CUDA where `libtorch_cuda.so`
//! could be loaded at start and a GPU exists.
//!
//! A TorchScript file records neither element types nor shapes, so the
//! configuration declares every input and output. Names follow Triton's
//! libtorch convention: `<name>__<index>` is the forward argument (input) or
//! the element of the returned tuple (output) at `index`; an input may also
//! be named after its forward argument.

use std::ffi::CStr;
use std::mem::ManuallyDrop;
use std::path::Path;
use std::sync::Arc;

use tch::{CModule, Device, IValue, Kind};

use super::{Backend, BackendError, BackendKind, Description, Framework, LoadContext, ModelIo, Placement};
use crate::gpu::Gpus;
use crate::tensor::{DataType, Tensor, TensorSpec};

/// The libtorch libraries the binary runs on; creates modules.
pub struct Libtorch {
    cuda_devices: usize,
}

/// The library that holds libtorch's CUDA kernels. Loaded, not linked, so one
/// binary runs on machines with and without CUDA.
const CUDA_LIBRARY: &CStr = c"libtorch_cuda.so";

unsafe extern "C" {
    /// `at::accelerator::emptyCache()`, from `empty_cache.cpp`.
    fn plinth_empty_accelerator_cache();
}

impl Libtorch {
    /// Loads `libtorch_cuda.so` from the library path when it is there
    /// (a full PyTorch's `torch/lib`), which registers libtorch's CUDA
    /// backend; counts the CUDA devices.
    pub fn init() -> Libtorch {
        // SAFETY: dlopen with a valid C string; the handle is kept open for
        // the life of the process on purpose.
        let handle = unsafe { libc::dlopen(CUDA_LIBRARY.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        let cuda_devices = if handle.is_null() { 0 } else { usize::try_from(tch::Cuda::device_count()).unwrap_or(0) };
        tracing::info!(cuda_loaded = !handle.is_null(), cuda_devices, "libtorch 2.11.0 ready");
        Libtorch { cuda_devices }
    }

    /// Loads the TorchScript file at `path` onto `placement` for the
    /// configured tensors. `inputs` and `outputs` are the configuration's
    /// (dims, or their reshape, without the batch dimension when
    /// `batching`). When every input dimension is fixed, runs the module once
    /// on zeros (batch 1) and checks its outputs against the configuration.
    ///
    /// # Errors
    /// A message when the file is missing or not TorchScript, the GPU does
    /// not exist, an input is neither `<name>__<index>` nor a forward
    /// argument, an output is not `<name>__<index>`, or the trial run fails
    /// or disagrees with the configuration (naming the tensor and both
    /// values).
    pub fn load(
        &self,
        path: &Path,
        inputs: &[TensorSpec],
        outputs: &[TensorSpec],
        batching: bool,
        placement: Placement,
    ) -> Result<TorchModel, String> {
        if !path.is_file() {
            return Err(format!("model file {} does not exist", path.display()));
        }
        if inputs.is_empty() || outputs.is_empty() {
            let given = match (inputs.is_empty(), outputs.is_empty()) {
                (true, true) => "no input and no output",
                (true, false) => "no input",
                _ => "no output",
            };
            return Err(format!(
                "config.pbtxt specifies {given}; a TorchScript model needs at least one input and one output in its \
                 configuration, as a TorchScript file does not record its tensors' types and shapes: declare every \
                 input and output in config.pbtxt"
            ));
        }
        let device = match placement {
            Placement::Cpu => Device::Cpu,
            Placement::Gpu(i) if i < self.cuda_devices => Device::Cuda(i),
            Placement::Gpu(i) => {
                return Err(format!("GPU {i} does not exist; libtorch sees {} CUDA devices", self.cuda_devices));
            }
        };
        let mut module = CModule::load_on_device(path, device)
            .map_err(|e| format!("libtorch cannot load {} as TorchScript: {}", path.display(), summary(&e)))?;
        module.set_eval();
        check_string_ranks(inputs.iter().chain(outputs), batching)?;
        let (input_io, input_positions) = signature(inputs, batching, Some(&mut || forward_arguments(path)))?;
        check_positions(&input_io, &input_positions)?;
        let (output_io, output_indices) = signature(outputs, batching, None)?;
        let host_bytes = if device == Device::Cpu { parameter_bytes(&module) } else { 0 };
        let model = TorchModel {
            host_bytes,
            module: ManuallyDrop::new(module),
            device,
            description: Description {
                kind: BackendKind::Pytorch,
                platform: BackendKind::Pytorch.platform().unwrap_or_default().into(),
                inputs: input_io,
                outputs: output_io,
                metadata: Vec::new(),
                remote: false,
            },
            input_positions,
            output_indices,
        };
        // Zeros are no string a model could parse: string models are not
        // tried.
        let fixed = inputs.iter().all(|s| s.model_dims().iter().all(|&d| d >= 0));
        if fixed && inputs.iter().all(|s| s.datatype != DataType::Bytes) {
            model.trial_run(batching)?;
        }
        Ok(model)
    }
}

impl Framework for Libtorch {
    fn kind(&self) -> BackendKind {
        BackendKind::Pytorch
    }

    fn gpus(&self, _: &Gpus) -> Result<usize, String> {
        match self.cuda_devices {
            0 => Err("libtorch sees no CUDA device (a GPU and a PyTorch torch/lib with libtorch_cuda.so on \
                      LD_LIBRARY_PATH are needed; `make setup-gpu` places them)"
                .to_owned()),
            n => Ok(n),
        }
    }

    fn load(&self, model: &LoadContext<'_>, placements: &[Placement]) -> Result<Vec<Arc<dyn Backend>>, String> {
        let (path, signature) = (model.file("model.pt"), model.signature);
        let batching = signature.max_batch_size > 0;
        placements
            .iter()
            .map(|&p| {
                let load = || self.load(&path, &signature.inputs, &signature.outputs, batching, p);
                Ok(Arc::new(model.measured(p, load)?) as Arc<dyn Backend>)
            })
            .collect()
    }
}

/// The bytes of `module`'s parameters (elements times element size); 0 when
/// libtorch cannot list them.
fn parameter_bytes(module: &CModule) -> u64 {
    let parameters = module.named_parameters().unwrap_or_default();
    parameters.iter().map(|(_, t)| (t.numel() * t.kind().elt_size_in_bytes()) as u64).sum()
}

/// One TorchScript module on one device.
pub struct TorchModel {
    module: ManuallyDrop<CModule>,
    /// The bytes of its parameters in host memory (0 on a GPU).
    host_bytes: u64,
    device: Device,
    description: Description,
    /// The forward argument position of each input.
    input_positions: Vec<usize>,
    /// The index in the returned tuple of each output.
    output_indices: Vec<usize>,
}

impl Backend for TorchModel {
    fn description(&self) -> &Description {
        &self.description
    }

    /// The bytes of the module's parameters when it runs on the CPU (on a
    /// GPU they are device memory, not host memory).
    fn resident_bytes(&self) -> u64 {
        self.host_bytes
    }

    fn execute(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, BackendError> {
        let _no_grad = tch::no_grad_guard();
        let mut args: Vec<Option<IValue>> = (0..self.description.inputs.len()).map(|_| None).collect();
        for t in inputs {
            let i = self
                .description
                .inputs
                .iter()
                .position(|io| io.name == t.name)
                .ok_or_else(|| BackendError::InvalidInput(format!("the model has no input '{}'", t.name)))?;
            let value = to_torch(&t, self.device).map_err(BackendError::InvalidInput)?;
            args[self.input_positions[i]] = Some(value);
        }
        let args = args
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| BackendError::InvalidInput("every input of a TorchScript model is required".to_owned()))?;
        let result = self.module.forward_is(&args).map_err(|e| {
            let message = format!("libtorch cannot run these inputs: {}", summary(&e));
            // Inputs already fit the signature, so a refusal is about their
            // sizes or values; running out of memory is the server's fault.
            if message.contains("out of memory") || message.contains("can't allocate memory") {
                BackendError::Failed(message)
            } else {
                BackendError::InvalidInput(message)
            }
        })?;
        let returned = returned_tensors(result).map_err(BackendError::Failed)?;
        self.description
            .outputs
            .iter()
            .zip(&self.output_indices)
            .map(|(io, &index)| {
                let t = returned.get(index).ok_or_else(|| {
                    format!(
                        "output '{}' is element {index}, but the model returned {} tensors",
                        io.name,
                        returned.len()
                    )
                })?;
                match t {
                    Returned::Tensor(t) => from_torch(&io.name, t),
                    Returned::Strings(items) => Ok(strings_tensor(&io.name, items)),
                }
            })
            .collect::<Result<_, String>>()
            .map_err(BackendError::Failed)
    }
}

impl TorchModel {
    /// Runs the module once on zeros of the configured inputs (batch 1 when
    /// batching) and checks each output's datatype and shape against the
    /// configuration, so a wrong `config.pbtxt` fails at load, not on the
    /// first request.
    fn trial_run(&self, batching: bool) -> Result<(), String> {
        let inputs = self
            .description
            .inputs
            .iter()
            .map(|io| {
                let datatype = io.datatype.expect("configured inputs have a datatype");
                let shape: Vec<i64> = io.shape.iter().map(|&d| if d < 0 { 1 } else { d }).collect();
                let bytes = crate::tensor::element_count(&shape).unwrap_or(0) * datatype.element_size().unwrap_or(0);
                Tensor { name: io.name.clone(), datatype, shape, data: vec![0; bytes] }
            })
            .collect();
        let outputs = self.execute(inputs).map_err(|e| {
            format!("the TorchScript model fails on zeros of the inputs config.pbtxt declares (check their data_type and dims): {e}")
        })?;
        for (io, t) in self.description.outputs.iter().zip(&outputs) {
            let want = io.datatype.expect("configured outputs have a datatype");
            if t.datatype != want {
                return Err(format!(
                    "output '{}': config.pbtxt says data_type {want}, but the model returns {}",
                    io.name, t.datatype
                ));
            }
            let fits = t.shape.len() == io.shape.len()
                && io
                    .shape
                    .iter()
                    .zip(&t.shape)
                    .enumerate()
                    .all(|(i, (&d, &got))| if batching && i == 0 { got == 1 } else { d < 0 || d == got });
            if !fits {
                return Err(format!(
                    "output '{}': config.pbtxt declares shape {:?}{}, but the model returns {:?} for a batch of 1",
                    io.name,
                    io.shape,
                    if batching { " (with the batch dimension)" } else { "" },
                    t.shape
                ));
            }
        }
        Ok(())
    }
}

impl Drop for TorchModel {
    fn drop(&mut self) {
        // SAFETY: the module is not used again.
        unsafe { ManuallyDrop::drop(&mut self.module) };
        if self.device != Device::Cpu {
            // The weights went back to libtorch's caching allocator; hand its
            // cached blocks to the driver so other models and processes can
            // use the GPU memory.
            // SAFETY: a C function without arguments (empty_cache.cpp).
            unsafe { plinth_empty_accelerator_cache() };
        }
    }
}

/// The served description of each configured tensor, and its position:
/// the index of a `<name>__<index>` name (Triton's libtorch convention), or
/// else, for inputs, the name's place among the forward method's
/// `arguments` (read from the file only when some name needs them).
fn signature(
    specs: &[TensorSpec],
    batching: bool,
    mut arguments: Option<&mut dyn FnMut() -> Result<Vec<String>, String>>,
) -> Result<(Vec<ModelIo>, Vec<usize>), String> {
    let mut read: Option<Vec<String>> = None;
    let mut pairs = Vec::with_capacity(specs.len());
    for s in specs {
        let indexed = s.name.rsplit_once("__").and_then(|(_, i)| i.parse::<usize>().ok());
        let position = match (indexed, arguments.as_mut()) {
            (Some(i), _) => i,
            (None, None) => {
                return Err(format!(
                    "output '{}': TorchScript outputs are named <name>__<index> (e.g. OUTPUT__0), \
                     the index being the element of the returned tuple",
                    s.name
                ));
            }
            (None, Some(read_arguments)) => {
                if read.is_none() {
                    read = Some(read_arguments()?);
                }
                let names = read.as_deref().unwrap_or_default();
                names.iter().position(|a| *a == s.name).ok_or_else(|| {
                    format!(
                        "input '{}': TorchScript inputs are named <name>__<index> (e.g. INPUT__0) or after \
                         the forward method's arguments, which are {names:?}",
                        s.name
                    )
                })?
            }
        };
        pairs.push((ModelIo::from_spec(s, batching), position));
    }
    Ok(pairs.into_iter().unzip())
}

/// The forward method's argument names, `self` left out. A TorchScript file
/// is a zip archive whose `data.pkl` begins by naming the module's class
/// (pickle protocol 2: `PROTO 2`, then `GLOBAL "module\nclass\n"`); that
/// class's source under `code/` declares `def forward(self: Class, x: T, ...)`.
fn forward_arguments(path: &Path) -> Result<Vec<String>, String> {
    let unreadable =
        |e: &dyn std::fmt::Display| format!("cannot read the forward arguments of {}: {e}", path.display());
    let file = std::fs::File::open(path).map_err(|e| unreadable(&e))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| unreadable(&e))?;
    let pickle = archive
        .file_names()
        .find(|n| n.ends_with("/data.pkl") && n.matches('/').count() == 1)
        .ok_or_else(|| unreadable(&"no data.pkl"))?
        .to_owned();
    let root = pickle.trim_end_matches("data.pkl").to_owned();
    let head = read_entry(&mut archive, &pickle, 512).map_err(|e| unreadable(&e))?;
    let class = head.strip_prefix(b"\x80\x02c").ok_or_else(|| unreadable(&"data.pkl does not start with a class"))?;
    let mut lines = class.split(|&b| b == b'\n').map(String::from_utf8_lossy);
    let (module, class) = (lines.next().unwrap_or_default(), lines.next().unwrap_or_default());
    let code_path = format!("{root}code/{}.py", module.replace('.', "/"));
    let code = read_entry(&mut archive, &code_path, u64::MAX).map_err(|e| unreadable(&e))?;
    let code = String::from_utf8_lossy(&code);
    let marker = format!("def forward(self: {module}.{class}");
    let after =
        code.find(&marker).map(|i| &code[i + marker.len()..]).ok_or_else(|| unreadable(&"no forward method"))?;
    let declared = &after[..after.find(") ->").ok_or_else(|| unreadable(&"unexpected forward signature"))?];
    // Split at commas outside brackets: `Tuple[Tensor, Tensor]` is one type.
    let (mut names, mut depth, mut current) = (Vec::new(), 0i32, String::new());
    for c in declared.chars().chain([',']) {
        match c {
            '[' | '(' => depth += 1,
            ']' | ')' => depth -= 1,
            ',' if depth == 0 => {
                if let Some((name, _)) = current.split_once(':') {
                    names.push(name.trim().to_owned());
                }
                current.clear();
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    Ok(names)
}

/// Up to `limit` bytes of the archive entry `name`.
fn read_entry(archive: &mut zip::ZipArchive<std::fs::File>, name: &str, limit: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let entry = archive.by_name(name).map_err(|e| format!("{name}: {e}"))?;
    let mut bytes = Vec::new();
    entry.take(limit).read_to_end(&mut bytes).map_err(|e| format!("{name}: {e}"))?;
    Ok(bytes)
}

/// Inputs must name each forward argument 0..n exactly once.
fn check_positions(inputs: &[ModelIo], positions: &[usize]) -> Result<(), String> {
    let mut sorted = positions.to_vec();
    sorted.sort_unstable();
    if sorted.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(());
    }
    let names: Vec<_> = inputs.iter().map(|io| io.name.as_str()).collect();
    Err(format!("TorchScript inputs {names:?} must number the forward arguments 0 to {} once each", names.len() - 1))
}

/// One output of a forward call: a tensor, or a `List[str]` (a BYTES
/// output, as Triton's PyTorch backend returns strings).
enum Returned {
    Tensor(tch::Tensor),
    Strings(Vec<String>),
}

/// The outputs a forward call returned: one tensor or list of strings, or a
/// tuple or list of them.
fn returned_tensors(value: IValue) -> Result<Vec<Returned>, String> {
    match value {
        IValue::Tuple(items) => items.into_iter().map(one_returned).collect(),
        IValue::TensorList(ts) => Ok(ts.into_iter().map(Returned::Tensor).collect()),
        IValue::GenericList(items) if !items.iter().all(|v| matches!(v, IValue::String(_))) || items.is_empty() => {
            items.into_iter().map(one_returned).collect()
        }
        one => Ok(vec![one_returned(one)?]),
    }
}

/// One returned output: a tensor, or strings (a `List[str]`, which may come
/// back as a generic list of strings).
fn one_returned(value: IValue) -> Result<Returned, String> {
    match value {
        IValue::Tensor(t) => Ok(Returned::Tensor(t)),
        IValue::StringList(items) => Ok(Returned::Strings(items)),
        IValue::GenericList(items) if items.iter().all(|v| matches!(v, IValue::String(_))) => Ok(Returned::Strings(
            items.into_iter().filter_map(|v| if let IValue::String(s) = v { Some(s) } else { None }).collect(),
        )),
        other => Err(format!(
            "the model returned {}; Plinth serves tensors, lists of strings, and tuples and lists of them",
            kind_of(&other)
        )),
    }
}

/// Strings reach and leave a TorchScript model as a 1-dimensional
/// `List[str]`, so a BYTES tensor may have one dimension in all, the batch
/// dimension included (Triton's PyTorch backend has the same rule).
fn check_string_ranks<'a>(specs: impl Iterator<Item = &'a TensorSpec>, batching: bool) -> Result<(), String> {
    for spec in specs.filter(|s| s.datatype == DataType::Bytes) {
        if spec.model_dims().len() + usize::from(batching) > 1 {
            return Err(format!(
                "'{}': a TorchScript model takes and returns strings as a 1-dimensional List[str], but its dims {:?}{} \
                 have more dimensions",
                spec.name,
                spec.model_dims(),
                if batching { " and the batch dimension" } else { "" }
            ));
        }
    }
    Ok(())
}

/// A returned `List[str]` as a BYTES tensor of shape `[len]`.
fn strings_tensor(name: &str, items: &[String]) -> Tensor {
    let mut data = Vec::with_capacity(items.iter().map(|s| s.len() + 4).sum());
    for item in items {
        crate::tensor::push_bytes_element(&mut data, item.as_bytes());
    }
    Tensor { name: name.to_owned(), datatype: DataType::Bytes, shape: vec![items.len() as i64], data }
}

fn kind(dt: DataType) -> Result<Kind, String> {
    Ok(match dt {
        DataType::Bool => Kind::Bool,
        DataType::Uint8 => Kind::Uint8,
        DataType::Int8 => Kind::Int8,
        DataType::Int16 => Kind::Int16,
        DataType::Int32 => Kind::Int,
        DataType::Int64 => Kind::Int64,
        DataType::Fp16 => Kind::Half,
        DataType::Fp32 => Kind::Float,
        DataType::Fp64 => Kind::Double,
        DataType::Bf16 => Kind::BFloat16,
        other => return Err(format!("libtorch has no {other} tensors")),
    })
}

fn datatype(kind: Kind) -> Option<DataType> {
    Some(match kind {
        Kind::Bool => DataType::Bool,
        Kind::Uint8 => DataType::Uint8,
        Kind::Int8 => DataType::Int8,
        Kind::Int16 => DataType::Int16,
        Kind::Int => DataType::Int32,
        Kind::Int64 => DataType::Int64,
        Kind::Half => DataType::Fp16,
        Kind::Float => DataType::Fp32,
        Kind::Double => DataType::Fp64,
        Kind::BFloat16 => DataType::Bf16,
        _ => return None,
    })
}

/// Copies a tensor into libtorch, on `device`: a BYTES tensor becomes a
/// `List[str]` of its elements, which must be UTF-8.
fn to_torch(t: &Tensor, device: Device) -> Result<IValue, String> {
    if t.datatype == DataType::Bytes {
        let elements =
            crate::tensor::bytes_elements(&t.data).ok_or_else(|| format!("tensor '{}': malformed BYTES", t.name))?;
        let strings = elements
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                String::from_utf8(e.to_vec()).map_err(|_| {
                    format!("tensor '{}': element {i} is not UTF-8, which a TorchScript str must be", t.name)
                })
            })
            .collect::<Result<_, _>>()?;
        return Ok(IValue::StringList(strings));
    }
    let value = tch::Tensor::f_from_data_size(&t.data, &t.shape, kind(t.datatype)?)
        .map_err(|e| format!("tensor '{}': {e}", t.name))?;
    Ok(IValue::Tensor(if device == Device::Cpu { value } else { value.to_device(device) }))
}

/// The variant of a returned value, for messages (its contents can be huge).
fn kind_of(value: &IValue) -> &'static str {
    match value {
        IValue::None => "None",
        IValue::Tensor(_) => "a tensor",
        IValue::Double(_) | IValue::Int(_) | IValue::Bool(_) => "a number",
        IValue::Tuple(_) => "a tuple",
        IValue::IntList(_) | IValue::DoubleList(_) | IValue::BoolList(_) => "a list of numbers",
        IValue::String(_) | IValue::StringList(_) => "text",
        IValue::TensorList(_) | IValue::GenericList(_) => "a list",
        IValue::GenericDict(_) => "a dict",
        IValue::Object(_) => "an object",
        _ => "a value of another type",
    }
}

/// libtorch's message without the TorchScript traceback or C++ frames:
/// the line naming the error, at most 500 characters. The rest goes to the
/// log, not to clients.
fn summary(e: &tch::TchError) -> String {
    let full = e.to_string();
    tracing::debug!("libtorch: {full}");
    let lines: Vec<&str> = full.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let line = lines
        .iter()
        .rev()
        .find(|l| l.contains("Error: ") && !l.starts_with("frame #"))
        .or_else(|| lines.iter().find(|l| !l.starts_with("frame #") && !l.starts_with("Exception raised from")))
        .copied()
        .unwrap_or("unknown libtorch error");
    line.chars().take(500).collect()
}

/// Copies a returned tensor to the CPU, contiguous, as a v2 tensor.
fn from_torch(name: &str, t: &tch::Tensor) -> Result<Tensor, String> {
    let kind = t.f_kind().map_err(|_| format!("output '{name}' has an element type libtorch's C API does not name"))?;
    let datatype = datatype(kind)
        .ok_or_else(|| format!("output '{name}' has element type {kind:?}, which the v2 protocol cannot carry"))?;
    let t = t.to_device(Device::Cpu).contiguous();
    let numel = t.numel();
    let mut data = vec![0u8; numel * datatype.element_size().unwrap_or(0)];
    t.f_copy_data_u8(&mut data, numel).map_err(|e| format!("output '{name}': {e}"))?;
    Ok(Tensor { name: name.to_owned(), datatype, shape: t.size(), data })
}

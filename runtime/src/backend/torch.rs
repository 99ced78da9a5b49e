//! TorchScript models (`pytorch_libtorch`) through libtorch (`tch` 0.24,
//! PyPI `torch==2.11.0`), on the CPU, or on CUDA where `libtorch_cuda.so`
//! could be loaded at start and a GPU exists.
//!
//! A TorchScript file records neither element types nor shapes, so the
//! configuration declares every input and output. Names follow Triton's
//! libtorch convention: `<name>__<index>` is the forward argument (input) or
//! the element of the returned tuple (output) at `index`.

use std::ffi::CStr;
use std::mem::ManuallyDrop;
use std::path::Path;

use tch::{CModule, Device, IValue, Kind};

use super::{Backend, BackendError, ModelIo, Placement};
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

    /// The number of CUDA devices libtorch can use (0 without CUDA).
    pub fn cuda_devices(&self) -> usize {
        self.cuda_devices
    }

    /// Loads the TorchScript file at `path` onto `placement` for the
    /// configured tensors. `inputs` and `outputs` are the configuration's
    /// (dims without the batch dimension when `batching`). When every input
    /// dimension is fixed, runs the module once on zeros (batch 1) and checks
    /// its outputs against the configuration.
    ///
    /// # Errors
    /// A message when the file is missing or not TorchScript, the GPU does
    /// not exist, a tensor name does not follow the `<name>__<index>`
    /// convention, or the trial run fails or disagrees with the configuration
    /// (naming the tensor and both values).
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
            return Err("a TorchScript file does not record its tensors' types and shapes: \
                 declare every input and output in config.pbtxt"
                .to_owned());
        }
        let device = match placement {
            Placement::Cpu => Device::Cpu,
            Placement::Gpu(i) if i < self.cuda_devices => Device::Cuda(i),
            Placement::Gpu(i) => {
                return Err(format!("GPU {i} does not exist; libtorch sees {} CUDA devices", self.cuda_devices));
            }
        };
        let mut module = CModule::load_on_device(path, device)
            .map_err(|e| format!("libtorch cannot load {} as TorchScript: {e}", path.display()))?;
        module.set_eval();
        let (input_io, input_positions) = signature(inputs, batching)?;
        check_positions(&input_io, &input_positions)?;
        let (output_io, output_indices) = signature(outputs, batching)?;
        let model = TorchModel {
            module: ManuallyDrop::new(module),
            device,
            inputs: input_io,
            input_positions,
            outputs: output_io,
            output_indices,
        };
        if inputs.iter().all(|s| s.dims.iter().all(|&d| d >= 0)) {
            model.trial_run(batching)?;
        }
        Ok(model)
    }
}

/// One TorchScript module on one device.
pub struct TorchModel {
    module: ManuallyDrop<CModule>,
    device: Device,
    inputs: Vec<ModelIo>,
    /// The forward argument position of each input.
    input_positions: Vec<usize>,
    outputs: Vec<ModelIo>,
    /// The index in the returned tuple of each output.
    output_indices: Vec<usize>,
}

impl Backend for TorchModel {
    fn platform(&self) -> &str {
        "pytorch_libtorch"
    }

    fn backend(&self) -> &'static str {
        "pytorch"
    }

    fn inputs(&self) -> &[ModelIo] {
        &self.inputs
    }

    fn outputs(&self) -> &[ModelIo] {
        &self.outputs
    }

    fn metadata(&self) -> &[(String, String)] {
        &[]
    }

    fn execute(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, BackendError> {
        let _no_grad = tch::no_grad_guard();
        let mut args: Vec<Option<IValue>> = (0..self.inputs.len()).map(|_| None).collect();
        for t in inputs {
            let i = self
                .inputs
                .iter()
                .position(|io| io.name == t.name)
                .ok_or_else(|| BackendError::InvalidInput(format!("the model has no input '{}'", t.name)))?;
            let value = to_torch(&t, self.device).map_err(BackendError::InvalidInput)?;
            args[self.input_positions[i]] = Some(IValue::Tensor(value));
        }
        let args = args
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| BackendError::InvalidInput("every input of a TorchScript model is required".to_owned()))?;
        let result = self.module.forward_is(&args).map_err(|e| {
            let message = format!("libtorch cannot run these inputs: {e}");
            // Inputs already fit the signature, so a refusal is about their
            // sizes or values; running out of memory is the server's fault.
            if message.contains("out of memory") {
                BackendError::Failed(message)
            } else {
                BackendError::InvalidInput(message)
            }
        })?;
        let returned = returned_tensors(result).map_err(BackendError::Failed)?;
        self.outputs
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
                from_torch(&io.name, t)
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
        for (io, t) in self.outputs.iter().zip(&outputs) {
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

/// The served description of each configured tensor, and its position from
/// the `<name>__<index>` convention.
fn signature(specs: &[TensorSpec], batching: bool) -> Result<(Vec<ModelIo>, Vec<usize>), String> {
    let pairs = specs
        .iter()
        .map(|s| Ok((ModelIo::from_spec(s, batching), position(&s.name)?)))
        .collect::<Result<Vec<_>, String>>()?;
    Ok(pairs.into_iter().unzip())
}

/// The index in `<name>__<index>` (Triton's libtorch naming convention).
fn position(name: &str) -> Result<usize, String> {
    name.rsplit_once("__").and_then(|(_, i)| i.parse().ok()).ok_or_else(|| {
        format!(
            "tensor '{name}': TorchScript tensors are named <name>__<index> (e.g. INPUT__0, OUTPUT__1), \
             the index being the forward argument or the returned tuple element"
        )
    })
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

/// The tensors a forward call returned: one tensor, or a tuple or list of them.
fn returned_tensors(value: IValue) -> Result<Vec<tch::Tensor>, String> {
    match value {
        IValue::Tensor(t) => Ok(vec![t]),
        IValue::TensorList(ts) => Ok(ts),
        IValue::Tuple(items) | IValue::GenericList(items) => items
            .into_iter()
            .map(|v| match v {
                IValue::Tensor(t) => Ok(t),
                other => Err(format!("the model returned a {other:?} where a tensor was expected")),
            })
            .collect(),
        other => Err(format!("the model returned {other:?}; Plinth serves tensors, tuples and lists of tensors")),
    }
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

/// Copies a tensor into libtorch, on `device`.
fn to_torch(t: &Tensor, device: Device) -> Result<tch::Tensor, String> {
    let value = tch::Tensor::f_from_data_size(&t.data, &t.shape, kind(t.datatype)?)
        .map_err(|e| format!("tensor '{}': {e}", t.name))?;
    if device == Device::Cpu { Ok(value) } else { Ok(value.to_device(device)) }
}

/// Copies a returned tensor to the CPU, contiguous, as a v2 tensor.
fn from_torch(name: &str, t: &tch::Tensor) -> Result<Tensor, String> {
    let kind = t.kind();
    let datatype = datatype(kind)
        .ok_or_else(|| format!("output '{name}' has element type {kind:?}, which the v2 protocol cannot carry"))?;
    let t = t.to_device(Device::Cpu).contiguous();
    let numel = t.numel();
    let mut data = vec![0u8; numel * datatype.element_size().unwrap_or(0)];
    t.f_copy_data_u8(&mut data, numel).map_err(|e| format!("output '{name}': {e}"))?;
    Ok(Tensor { name: name.to_owned(), datatype, shape: t.size(), data })
}

//! Which backend serves a model, where its `instance_group` instances run,
//! and building them: ONNX Runtime sessions, TorchScript modules,
//! connections to a remote v2 server, or identity models.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

use super::runtimes::Runtimes;
use crate::backend::identity::{self, IdentityModel};
use crate::backend::onnx::{self, SessionOptions};
use crate::backend::remote::{RemoteConfig, RemoteModel};
use crate::backend::{Backend, BackendKind, Placement};
use crate::config::proto::model_instance_group::Kind;
use crate::config::{self, ModelConfig, Signature};
use crate::scheduler::rate_limiter::{Device, InstanceLimits};

/// The most instances one model may have: each is a full session or module,
/// so a typo in `count` must not exhaust the machine's memory.
const MAX_INSTANCES: usize = 128;

/// Requests a remote model forwards at once without an `instance_group`:
/// each instance holds one exchange, so one slow answer does not queue the
/// rest behind it.
const REMOTE_INSTANCES: usize = 8;

/// ONNX Runtime's session parameter for busy-waiting intra-op threads.
const SPINNING_PARAMETER: &str = "session.intra_op.allow_spinning";

/// A model's instances and the device memory their loads took.
pub struct Instances {
    /// One backend per instance, in `instance_group` order.
    pub backends: Vec<Arc<dyn Backend>>,
    /// What each instance asks of the rate limiter: its device and its
    /// group's `rate_limiter` (none without one), in the same order.
    pub limits: Vec<InstanceLimits>,
    /// Device memory the instances took, in bytes, by GPU index (NVML's
    /// used memory after each load less before it; empty on the CPU).
    pub device_bytes: BTreeMap<u32, u64>,
}

/// Loads onto GPUs one at a time, so that NVML's device-wide count of used
/// memory, read before and after, is this load's alone.
static GPU_LOADS: Mutex<()> = Mutex::new(());

/// Builds one backend per `instance_group` instance (one without a group)
/// for the model file in `version_dir` (or the remote the parameters name).
/// `signature` is the configuration's, before completion from the model.
///
/// # Errors
/// A message for an unsupported platform, a bad `instance_group` or
/// parameter, KIND_GPU where no GPU serves (naming the model and what is
/// missing), or the backend's own load error.
pub fn load(
    name: &str,
    version_dir: &Path,
    config: &ModelConfig,
    signature: &Signature,
    rt: &Runtimes,
) -> Result<Instances, String> {
    let framework = BackendKind::of(config)?;
    let placed = placed(config, framework, &usable_gpus(framework, rt)).map_err(|e| format!("model '{name}': {e}"))?;
    let limits = placed.iter().map(|&(at, group)| rate_limits(config, at, group)).collect();
    let placements: Vec<Placement> = placed.into_iter().map(|(at, _)| at).collect();
    let file = |default: &str| {
        let file = if config.default_model_filename.is_empty() { default } else { &config.default_model_filename };
        version_dir.join(file)
    };
    let mut device_bytes = BTreeMap::new();
    let backends = match framework {
        BackendKind::OnnxRuntime => {
            let path = file("model.onnx");
            if let Some(hint) = not_onnx(name, version_dir, config, &path) {
                return Err(format!("model file {} does not exist; {hint}", path.display()));
            }
            let onnx = rt.onnx.as_ref().ok_or_else(|| format!("ONNX Runtime is not loaded: {}", onnx::HINT))?;
            let options = session_options(config, placements.len())?;
            let load = |&p: &Placement| measured(rt, p, &mut device_bytes, || onnx.load(&path, options, p));
            placements.iter().map(load).collect::<Result<_, _>>().map(shared)?
        }
        BackendKind::Remote => {
            RemoteModel::connect(RemoteConfig::from_config(config, name)?, signature, placements.len()).map(shared)?
        }
        BackendKind::Pytorch => load_torch(&file("model.pt"), signature, &placements, rt, &mut device_bytes)?,
        BackendKind::Identity => {
            let delay = match config::parameter(config, identity::DELAY_PARAMETER) {
                None => 0,
                Some(v) => v.trim().parse::<u64>().map_err(|_| {
                    format!(
                        "parameter '{}' must be a whole number of milliseconds, got '{v}'",
                        identity::DELAY_PARAMETER
                    )
                })?,
            };
            let delay = std::time::Duration::from_millis(delay);
            placements.iter().map(|_| IdentityModel::new(signature, delay)).collect::<Result<_, _>>().map(shared)?
        }
    };
    Ok(Instances { backends, limits, device_bytes })
}

/// What the instance placed `at` by `config`'s instance group `group`
/// (`None`: the model has none) asks of the rate limiter.
fn rate_limits(config: &ModelConfig, at: Placement, group: Option<usize>) -> InstanceLimits {
    let device = match at {
        Placement::Cpu => Device::Cpu,
        Placement::Gpu(i) => Device::Gpu(u32::try_from(i).unwrap_or(u32::MAX)),
    };
    let limiter = group.and_then(|g| config.instance_group.get(g)).and_then(|g| g.rate_limiter.as_ref());
    InstanceLimits {
        device,
        resources: limiter
            .map_or_else(Vec::new, |l| l.resources.iter().map(|r| (r.name.clone(), r.global, r.count)).collect()),
        priority: limiter.map_or(0, |l| l.priority),
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

fn shared<B: Backend + 'static>(backends: Vec<B>) -> Vec<Arc<dyn Backend>> {
    backends.into_iter().map(|b| Arc::new(b) as Arc<dyn Backend>).collect()
}

/// Runs `load` for an instance on `placement`; on a GPU, adds the device
/// memory it took to `device_bytes`. The device's CUDA context is made
/// first, so that its fixed cost (hundreds of MiB that no unload returns)
/// is not charged to the first model loaded there.
fn measured<T>(
    rt: &Runtimes,
    placement: Placement,
    device_bytes: &mut BTreeMap<u32, u64>,
    load: impl FnOnce() -> Result<T, String>,
) -> Result<T, String> {
    let Placement::Gpu(index) = placement else { return load() };
    let index = u32::try_from(index).map_err(|_| format!("GPU {index} does not exist"))?;
    let _only_load = GPU_LOADS.lock();
    if let Err(e) = crate::gpu::init_context(index) {
        tracing::warn!(gpu = index, "cannot make the CUDA context before measuring a load: {e}");
    }
    let before = rt.gpus.memory_used(index);
    let loaded = load()?;
    if let (Some(before), Some(after)) = (before, rt.gpus.memory_used(index)) {
        *device_bytes.entry(index).or_default() += after.saturating_sub(before);
    }
    Ok(loaded)
}

#[cfg(feature = "libtorch")]
fn load_torch(
    path: &Path,
    signature: &Signature,
    placements: &[Placement],
    rt: &Runtimes,
    device_bytes: &mut BTreeMap<u32, u64>,
) -> Result<Vec<Arc<dyn Backend>>, String> {
    let batching = signature.max_batch_size > 0;
    placements
        .iter()
        .map(|&p| {
            let load = || rt.torch.load(path, &signature.inputs, &signature.outputs, batching, p);
            Ok(Arc::new(measured(rt, p, device_bytes, load)?) as Arc<dyn Backend>)
        })
        .collect()
}

#[cfg(not(feature = "libtorch"))]
fn load_torch(
    _: &Path,
    _: &Signature,
    _: &[Placement],
    _: &Runtimes,
    _: &mut BTreeMap<u32, u64>,
) -> Result<Vec<Arc<dyn Backend>>, String> {
    Err("platform 'pytorch_libtorch' needs a Plinth built with the cargo feature 'libtorch' \
         (`make setup` builds it)"
        .to_owned())
}

/// How many GPUs `framework` can run instances on here, or why none.
fn usable_gpus(framework: BackendKind, rt: &Runtimes) -> Result<usize, String> {
    let none = |why: String| Err(format!("{why}; use KIND_CPU or KIND_AUTO"));
    match framework {
        BackendKind::OnnxRuntime => match (rt.onnx.as_ref().map(|o| o.cuda()), rt.gpus.count()) {
            (None, _) => none(format!("ONNX Runtime is not loaded: {}", onnx::HINT)),
            (Some(Err(why)), _) => none(why.to_owned()),
            (Some(Ok(())), 0) => none(format!("no GPU is usable: {}", rt.gpus.absence().unwrap_or("NVML lists none"))),
            (Some(Ok(())), n) => Ok(n),
        },
        BackendKind::Pytorch => torch_gpus(rt).or_else(none),
        BackendKind::Remote | BackendKind::Identity => {
            Err(format!("Plinth runs {} models on the CPU only; use KIND_CPU or KIND_AUTO", framework.name()))
        }
    }
}

#[cfg(feature = "libtorch")]
fn torch_gpus(rt: &Runtimes) -> Result<usize, String> {
    match rt.torch.cuda_devices() {
        0 => Err("libtorch sees no CUDA device (a GPU and a PyTorch torch/lib with libtorch_cuda.so on \
                  LD_LIBRARY_PATH are needed; `make setup-gpu` places them)"
            .to_owned()),
        n => Ok(n),
    }
}

#[cfg(not(feature = "libtorch"))]
fn torch_gpus(_: &Runtimes) -> Result<usize, String> {
    Err("this Plinth was built without the cargo feature 'libtorch'".to_owned())
}

/// Whether `config` may put an instance on GPU `gpu` on some machine: it
/// has no `instance_group` (an instance on each usable GPU), or a KIND_GPU
/// or KIND_AUTO group whose `gpus` is empty or names it. A hot swap checks
/// for room only on the GPUs the new version may use.
pub fn may_use_gpu(config: &ModelConfig, gpu: u32) -> bool {
    let names = |group: &crate::config::proto::ModelInstanceGroup| {
        group.gpus.is_empty() || group.gpus.iter().any(|&g| u32::try_from(g) == Ok(gpu))
    };
    config.instance_group.is_empty()
        || config.instance_group.iter().any(|group| matches!(group.kind(), Kind::Gpu | Kind::Auto) && names(group))
}

/// Where each instance `instance_group` asks for runs, given how many GPUs
/// the model's framework can use here (`gpus`, or why none). Without a
/// group: one instance on each usable GPU, as Triton places a model whose
/// configuration has no `instance_group`, else one CPU instance
/// ([`REMOTE_INSTANCES`] for a remote model). KIND_AUTO runs on the GPUs
/// when one is usable, else on the CPU; KIND_MODEL (where Triton lets the
/// model place itself, which neither framework's files do) and KIND_CPU run
/// on the CPU; KIND_GPU runs `count`
/// instances on each of `gpus` (all GPUs when empty), and is refused rather
/// than silently served on the CPU where no GPU can serve. Each placement
/// comes with the index of the group that asked for it.
fn placed(
    config: &ModelConfig,
    framework: BackendKind,
    gpus: &Result<usize, String>,
) -> Result<Vec<(Placement, Option<usize>)>, String> {
    let usable = *gpus.as_ref().unwrap_or(&0);
    if config.instance_group.is_empty() {
        let ungrouped = |at: Placement| (at, None);
        return Ok(match framework {
            BackendKind::Remote => vec![ungrouped(Placement::Cpu); REMOTE_INSTANCES],
            _ if usable > 0 => (0..usable).map(|i| ungrouped(Placement::Gpu(i))).collect(),
            _ => vec![ungrouped(Placement::Cpu)],
        });
    }
    let mut all = Vec::new();
    for (index, group) in config.instance_group.iter().enumerate() {
        let name = if group.name.is_empty() { "(unnamed)" } else { &group.name };
        let count = match group.count {
            0 => 1,
            n @ 1.. => n as usize,
            n => return Err(format!("instance_group {name} has count {n}; it must be at least 1")),
        };
        let on_gpu = match group.kind() {
            Kind::Gpu => true,
            Kind::Auto => usable > 0,
            Kind::Cpu | Kind::Model => false,
        };
        // A listed GPU that cannot serve is named first, whatever the reason.
        let unusable = group.gpus.iter().find(|&&g| usize::try_from(g).map_or(true, |id| id >= usable));
        if !on_gpu {
            all.extend(std::iter::repeat_n((Placement::Cpu, Some(index)), count.min(MAX_INSTANCES + 1)));
        } else if let Some(g) = unusable {
            let why = gpus.as_ref().map_or_else(Clone::clone, |n| format!("{n} are usable (ids from 0)"));
            return Err(format!(
                "instance_group {name} asks for KIND_GPU, but gpu id {g} is invalid or unsupported: {why}"
            ));
        } else if let Err(why) = gpus {
            return Err(format!("instance_group {name} asks for KIND_GPU, but {why}"));
        } else {
            let ids: Vec<usize> = if group.gpus.is_empty() {
                (0..usable).collect()
            } else {
                group.gpus.iter().filter_map(|&g| usize::try_from(g).ok()).collect()
            };
            for id in ids {
                all.extend(std::iter::repeat_n((Placement::Gpu(id), Some(index)), count.min(MAX_INSTANCES + 1)));
            }
        }
        if all.len() > MAX_INSTANCES {
            return Err(format!(
                "instance_group asks for more than {MAX_INSTANCES} instances, the most a model may have"
            ));
        }
    }
    Ok(all)
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
fn session_options(config: &ModelConfig, instances: usize) -> Result<SessionOptions, String> {
    let count = |key: &str| match config::parameter(config, key) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<usize>()
            .map(Some)
            .map_err(|_| format!("parameter '{key}' must be a whole number, got '{v}'")),
    };
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let spinning = match config::parameter(config, SPINNING_PARAMETER).map(str::trim) {
        Some("0") => false,
        None | Some("1") => true,
        Some(v) => return Err(format!("parameter '{SPINNING_PARAMETER}' must be \"0\" or \"1\", got '{v}'")),
    };
    Ok(SessionOptions {
        intra_op_threads: count("intra_op_thread_count")?.unwrap_or((cores / instances).max(1)),
        inter_op_threads: count("inter_op_thread_count")?.unwrap_or(0),
        intra_op_spinning: spinning,
        graph_level: config.optimization.as_ref().and_then(|o| o.graph.as_ref()).map_or(0, |g| g.level),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where `config`'s instances are placed, their groups left out.
    fn placements(
        config: &ModelConfig,
        framework: BackendKind,
        gpus: &Result<usize, String>,
    ) -> Result<Vec<Placement>, String> {
        placed(config, framework, gpus).map(|all| all.into_iter().map(|(at, _)| at).collect())
    }

    fn config(text: &str) -> ModelConfig {
        config::parse(&format!("name: \"m\" {text}")).unwrap()
    }

    #[test]
    fn a_model_without_platform_and_onnx_file_is_named_by_what_its_folder_holds() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("model.onnx");
        std::fs::write(dir.path().join("model.py"), "").unwrap();
        assert_eq!(
            not_onnx("m", dir.path(), &config(""), &missing).unwrap(),
            "config.pbtxt names no platform or backend, so Plinth looks for an ONNX model, but the version folder \
             holds model.py, a model of Triton's 'python' backend, which Plinth does not ship"
        );
        assert_eq!(not_onnx("m", dir.path(), &config(r#"backend: "onnxruntime""#), &missing), None);
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(not_onnx("m", empty.path(), &config(""), &missing), None);
        let custom = not_onnx("m.identity", empty.path(), &config(""), &missing).unwrap();
        assert!(custom.contains("does not pick backend 'identity' here"), "{custom}");
        assert!(custom.contains("backend: \"identity\""), "{custom}");
    }

    #[test]
    fn gpu_instances_go_where_the_framework_can_use_a_gpu() {
        let two = Ok(2);
        let none: Result<usize, String> = Err("libtorch sees no CUDA device".to_owned());
        let gpu = config(r#"instance_group [{ name: "g" kind: KIND_GPU count: 2 gpus: [1] }]"#);
        assert_eq!(placements(&gpu, BackendKind::Pytorch, &two).unwrap(), [Placement::Gpu(1), Placement::Gpu(1)]);
        assert_eq!(placements(&gpu, BackendKind::OnnxRuntime, &two).unwrap(), [Placement::Gpu(1), Placement::Gpu(1)]);
        let refused = placements(&gpu, BackendKind::OnnxRuntime, &none).unwrap_err();
        assert_eq!(
            refused,
            "instance_group g asks for KIND_GPU, but gpu id 1 is invalid or unsupported: libtorch sees no CUDA device"
        );
        let every_gpu = config(r#"instance_group [{ name: "g" kind: KIND_GPU }]"#);
        let refused = placements(&every_gpu, BackendKind::OnnxRuntime, &none).unwrap_err();
        assert_eq!(refused, "instance_group g asks for KIND_GPU, but libtorch sees no CUDA device");
        assert_eq!(
            placements(&gpu, BackendKind::Pytorch, &Ok(1)).unwrap_err(),
            "instance_group g asks for KIND_GPU, but gpu id 1 is invalid or unsupported: 1 are usable (ids from 0)"
        );
        let auto = config(r#"instance_group [{ count: 3 }]"#);
        assert_eq!(placements(&auto, BackendKind::Pytorch, &Ok(1)).unwrap(), [Placement::Gpu(0); 3]);
        assert_eq!(placements(&auto, BackendKind::OnnxRuntime, &Ok(1)).unwrap(), [Placement::Gpu(0); 3]);
        assert_eq!(placements(&auto, BackendKind::OnnxRuntime, &none).unwrap(), [Placement::Cpu; 3]);
        let every = config("");
        assert_eq!(placements(&every, BackendKind::OnnxRuntime, &two).unwrap(), [Placement::Gpu(0), Placement::Gpu(1)]);
        assert_eq!(placements(&every, BackendKind::OnnxRuntime, &none).unwrap(), [Placement::Cpu]);
        assert!(may_use_gpu(&gpu, 1) && !may_use_gpu(&gpu, 0));
        assert!(may_use_gpu(&every, 3) && may_use_gpu(&auto, 0));
        assert!(
            !may_use_gpu(&config(r#"instance_group [{ kind: KIND_CPU }]"#), 0),
            "moving to the CPU needs no GPU room"
        );
        let huge = config(r#"instance_group [{ count: 1000000 }]"#);
        assert!(placements(&huge, BackendKind::OnnxRuntime, &none).unwrap_err().contains("more than 128"));
    }
}

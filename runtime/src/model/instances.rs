//! Which backend serves a model, where its `instance_group` instances run,
//! and building them: ONNX Runtime sessions, TorchScript modules,
//! connections to a remote v2 server, or identity models.

use std::path::Path;
use std::sync::Arc;

use super::Runtimes;
use crate::backend::identity::{self, IdentityModel};
use crate::backend::onnx::{self, SessionOptions};
use crate::backend::remote::{RemoteConfig, RemoteModel};
use crate::backend::{Backend, BackendKind, Placement};
use crate::config::proto::model_instance_group::Kind;
use crate::config::{self, ModelConfig, Signature};

/// The most instances one model may have: each is a full session or module,
/// so a typo in `count` must not exhaust the machine's memory.
const MAX_INSTANCES: usize = 128;

/// Requests a remote model forwards at once without an `instance_group`:
/// each instance holds one exchange, so one slow answer does not queue the
/// rest behind it.
const REMOTE_INSTANCES: usize = 8;

/// ONNX Runtime's session parameter for busy-waiting intra-op threads.
const SPINNING_PARAMETER: &str = "session.intra_op.allow_spinning";

/// Builds one backend per `instance_group` instance (one without a group)
/// for the model file in `version_dir` (or the remote the parameters name).
/// `signature` is the configuration's, before completion from the model.
///
/// # Errors
/// A message for an unsupported platform, a bad `instance_group` or
/// parameter, KIND_GPU where no GPU serves, or the backend's own load error.
pub fn load(
    name: &str,
    version_dir: &Path,
    config: &ModelConfig,
    signature: &Signature,
    rt: &Runtimes,
) -> Result<Vec<Arc<dyn Backend>>, String> {
    let framework = BackendKind::of(config)?;
    let placements = placements(config, framework, gpu_count(rt))?;
    let file = |default: &str| {
        let file = if config.default_model_filename.is_empty() { default } else { &config.default_model_filename };
        version_dir.join(file)
    };
    match framework {
        BackendKind::OnnxRuntime => {
            let onnx = rt.onnx.as_ref().ok_or_else(|| format!("ONNX Runtime is not loaded: {}", onnx::HINT))?;
            let options = session_options(config, placements.len())?;
            let path = file("model.onnx");
            placements.iter().map(|_| onnx.load(&path, options)).collect::<Result<_, _>>().map(shared)
        }
        BackendKind::Remote => {
            RemoteModel::connect(RemoteConfig::from_config(config, name)?, signature, placements.len()).map(shared)
        }
        BackendKind::Pytorch => load_torch(&file("model.pt"), signature, &placements, rt),
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
            placements.iter().map(|_| IdentityModel::new(signature, delay)).collect::<Result<_, _>>().map(shared)
        }
    }
}

fn shared<B: Backend + 'static>(backends: Vec<B>) -> Vec<Arc<dyn Backend>> {
    backends.into_iter().map(|b| Arc::new(b) as Arc<dyn Backend>).collect()
}

#[cfg(feature = "libtorch")]
fn load_torch(
    path: &Path,
    signature: &Signature,
    placements: &[Placement],
    rt: &Runtimes,
) -> Result<Vec<Arc<dyn Backend>>, String> {
    let batching = signature.max_batch_size > 0;
    placements
        .iter()
        .map(|&p| {
            let model = rt.torch.load(path, &signature.inputs, &signature.outputs, batching, p)?;
            Ok(Arc::new(model) as Arc<dyn Backend>)
        })
        .collect()
}

#[cfg(not(feature = "libtorch"))]
fn load_torch(_: &Path, _: &Signature, _: &[Placement], _: &Runtimes) -> Result<Vec<Arc<dyn Backend>>, String> {
    Err("platform 'pytorch_libtorch' needs a Plinth built with the cargo feature 'libtorch' \
         (`make setup` builds it)"
        .to_owned())
}

fn gpu_count(rt: &Runtimes) -> usize {
    #[cfg(feature = "libtorch")]
    return rt.torch.cuda_devices();
    #[cfg(not(feature = "libtorch"))]
    {
        let _ = rt;
        0
    }
}

/// Where each instance `instance_group` asks for runs (without a group: one
/// CPU instance, or [`REMOTE_INSTANCES`] for a remote model). KIND_AUTO and KIND_MODEL mean the CPU except for
/// TorchScript models on a machine with CUDA, as in Triton; KIND_GPU runs
/// `count` instances on each of `gpus` (all GPUs when empty), and is
/// refused rather than silently served on the CPU where no GPU can serve.
fn placements(config: &ModelConfig, framework: BackendKind, gpus: usize) -> Result<Vec<Placement>, String> {
    if config.instance_group.is_empty() {
        return Ok(match framework {
            BackendKind::Pytorch if gpus > 0 => vec![Placement::Gpu(0)],
            BackendKind::Remote => vec![Placement::Cpu; REMOTE_INSTANCES],
            _ => vec![Placement::Cpu],
        });
    }
    let mut all = Vec::new();
    for group in &config.instance_group {
        let name = if group.name.is_empty() { "(unnamed)" } else { &group.name };
        let count = match group.count {
            0 => 1,
            n @ 1.. => n as usize,
            n => return Err(format!("instance_group {name} has count {n}; it must be at least 1")),
        };
        let on_gpu = match group.kind() {
            Kind::Gpu => true,
            Kind::Auto => framework == BackendKind::Pytorch && gpus > 0,
            Kind::Cpu | Kind::Model => false,
        };
        if !on_gpu {
            all.extend(std::iter::repeat_n(Placement::Cpu, count.min(MAX_INSTANCES + 1)));
        } else if framework != BackendKind::Pytorch {
            return Err(format!(
                "instance_group {name} asks for KIND_GPU, but Plinth runs {framework:?} models on the CPU only; use KIND_CPU or KIND_AUTO"
            ));
        } else if gpus == 0 {
            return Err(format!(
                "instance_group {name} asks for KIND_GPU, but libtorch sees no CUDA device (a GPU and a PyTorch \
                 torch/lib with libtorch_cuda.so on LD_LIBRARY_PATH are needed); use KIND_CPU or KIND_AUTO"
            ));
        } else {
            let ids: Vec<usize> = if group.gpus.is_empty() {
                (0..gpus).collect()
            } else {
                group
                    .gpus
                    .iter()
                    .map(|&g| usize::try_from(g).map_err(|_| format!("instance_group {name}: gpus has {g}")))
                    .collect::<Result<_, _>>()?
            };
            for id in ids {
                all.extend(std::iter::repeat_n(Placement::Gpu(id), count.min(MAX_INSTANCES + 1)));
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

    fn config(text: &str) -> ModelConfig {
        config::parse(&format!("name: \"m\" {text}")).unwrap()
    }

    #[test]
    fn platforms_name_their_framework() {
        assert_eq!(BackendKind::of(&config("")).unwrap(), BackendKind::OnnxRuntime);
        assert_eq!(BackendKind::of(&config(r#"platform: "pytorch_libtorch""#)).unwrap(), BackendKind::Pytorch);
        assert_eq!(BackendKind::of(&config(r#"backend: "remote""#)).unwrap(), BackendKind::Remote);
        assert!(
            BackendKind::of(&config(r#"platform: "tensorflow_savedmodel""#)).unwrap_err().contains("not supported")
        );
    }

    #[test]
    fn gpu_instances_go_to_torch_models_on_machines_with_cuda() {
        let gpu = config(r#"instance_group [{ kind: KIND_GPU count: 2 gpus: [1] }]"#);
        assert_eq!(placements(&gpu, BackendKind::Pytorch, 2).unwrap(), [Placement::Gpu(1), Placement::Gpu(1)]);
        assert!(placements(&gpu, BackendKind::Pytorch, 0).unwrap_err().contains("no CUDA device"));
        assert!(placements(&gpu, BackendKind::OnnxRuntime, 2).unwrap_err().contains("CPU only"));
        let auto = config(r#"instance_group [{ count: 3 }]"#);
        assert_eq!(placements(&auto, BackendKind::Pytorch, 1).unwrap(), [Placement::Gpu(0); 3]);
        assert_eq!(placements(&auto, BackendKind::OnnxRuntime, 1).unwrap(), [Placement::Cpu; 3]);
        let huge = config(r#"instance_group [{ count: 1000000 }]"#);
        assert!(placements(&huge, BackendKind::OnnxRuntime, 0).unwrap_err().contains("more than 128"));
    }
}

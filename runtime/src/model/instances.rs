//! Where a model's `instance_group` instances run, and building them
//! through the model's framework.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::runtimes::Runtimes;
use crate::backend::{Backend, BackendKind, LoadContext, Placement};
use crate::config::proto::model_instance_group::Kind;
use crate::config::{ModelConfig, Parameters, Signature};
use crate::scheduler::rate_limiter::{Device, InstanceLimits};

/// The most instances one model may have: each is a full session or module,
/// so a typo in `count` must not exhaust the machine's memory.
const MAX_INSTANCES: usize = 128;

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

/// Builds one backend per `instance_group` instance (the framework's
/// default without a group) for the model in `version_dir`. `signature` is
/// the configuration's, before completion from the model.
///
/// # Errors
/// A message for an unsupported platform, a bad `instance_group`, KIND_GPU
/// where no GPU serves (naming the model and what is missing), or the
/// framework's own load error.
pub fn load(
    name: &str,
    version_dir: &Path,
    config: &ModelConfig,
    parameters: &Parameters,
    signature: &Signature,
    rt: &Runtimes,
) -> Result<Instances, String> {
    let framework = rt.frameworks.get(BackendKind::of(config)?);
    let gpus = framework.gpus(&rt.gpus).map_err(|why| format!("{why}; use KIND_CPU or KIND_AUTO"));
    let placed = placed(config, framework.default_instances(), &gpus).map_err(|e| format!("model '{name}': {e}"))?;
    let limits = placed.iter().map(|&(at, group)| rate_limits(config, at, group)).collect();
    let placements: Vec<Placement> = placed.into_iter().map(|(at, _)| at).collect();
    let context = LoadContext::new(name, version_dir, config, parameters, signature, &rt.gpus);
    let backends = framework.load(&context, &placements)?;
    Ok(Instances { backends, limits, device_bytes: context.device_bytes() })
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
/// configuration has no `instance_group`, else `default_instances` on the
/// CPU (the framework's: several for a remote model). KIND_AUTO runs on the GPUs
/// when one is usable, else on the CPU; KIND_MODEL (where Triton lets the
/// model place itself, which neither framework's files do) and KIND_CPU run
/// on the CPU; KIND_GPU runs `count`
/// instances on each of `gpus` (all GPUs when empty), and is refused rather
/// than silently served on the CPU where no GPU can serve. Each placement
/// comes with the index of the group that asked for it.
fn placed(
    config: &ModelConfig,
    default_instances: usize,
    gpus: &Result<usize, String>,
) -> Result<Vec<(Placement, Option<usize>)>, String> {
    let usable = *gpus.as_ref().unwrap_or(&0);
    if config.instance_group.is_empty() {
        return Ok(match usable {
            0 => vec![(Placement::Cpu, None); default_instances],
            n => (0..n).map(|i| (Placement::Gpu(i), None)).collect(),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Where `config`'s instances are placed, their groups left out.
    fn placements(
        config: &ModelConfig,
        default_instances: usize,
        gpus: &Result<usize, String>,
    ) -> Result<Vec<Placement>, String> {
        placed(config, default_instances, gpus).map(|all| all.into_iter().map(|(at, _)| at).collect())
    }

    fn config(text: &str) -> ModelConfig {
        crate::config::parse(&format!("name: \"m\" {text}")).unwrap()
    }

    #[test]
    fn gpu_instances_go_where_the_framework_can_use_a_gpu() {
        let two = Ok(2);
        let none: Result<usize, String> = Err("libtorch sees no CUDA device".to_owned());
        let gpu = config(r#"instance_group [{ name: "g" kind: KIND_GPU count: 2 gpus: [1] }]"#);
        assert_eq!(placements(&gpu, 1, &two).unwrap(), [Placement::Gpu(1), Placement::Gpu(1)]);
        assert_eq!(placements(&gpu, 1, &two).unwrap(), [Placement::Gpu(1), Placement::Gpu(1)]);
        let refused = placements(&gpu, 1, &none).unwrap_err();
        assert_eq!(
            refused,
            "instance_group g asks for KIND_GPU, but gpu id 1 is invalid or unsupported: libtorch sees no CUDA device"
        );
        let every_gpu = config(r#"instance_group [{ name: "g" kind: KIND_GPU }]"#);
        let refused = placements(&every_gpu, 1, &none).unwrap_err();
        assert_eq!(refused, "instance_group g asks for KIND_GPU, but libtorch sees no CUDA device");
        assert_eq!(
            placements(&gpu, 1, &Ok(1)).unwrap_err(),
            "instance_group g asks for KIND_GPU, but gpu id 1 is invalid or unsupported: 1 are usable (ids from 0)"
        );
        let auto = config(r#"instance_group [{ count: 3 }]"#);
        assert_eq!(placements(&auto, 1, &Ok(1)).unwrap(), [Placement::Gpu(0); 3]);
        assert_eq!(placements(&auto, 1, &Ok(1)).unwrap(), [Placement::Gpu(0); 3]);
        assert_eq!(placements(&auto, 1, &none).unwrap(), [Placement::Cpu; 3]);
        let every = config("");
        assert_eq!(placements(&every, 1, &two).unwrap(), [Placement::Gpu(0), Placement::Gpu(1)]);
        assert_eq!(placements(&every, 1, &none).unwrap(), [Placement::Cpu]);
        assert_eq!(placements(&every, 8, &none).unwrap(), [Placement::Cpu; 8], "a remote model's default");
        assert!(may_use_gpu(&gpu, 1) && !may_use_gpu(&gpu, 0));
        assert!(may_use_gpu(&every, 3) && may_use_gpu(&auto, 0));
        assert!(
            !may_use_gpu(&config(r#"instance_group [{ kind: KIND_CPU }]"#), 0),
            "moving to the CPU needs no GPU room"
        );
        let huge = config(r#"instance_group [{ count: 1000000 }]"#);
        assert!(placements(&huge, 1, &none).unwrap_err().contains("more than 128"));
    }
}

//! Triton's rules for an ensemble's configuration.

use std::collections::HashSet;

use super::Problems;
use crate::config::proto::{self, ModelConfig};

/// Triton's `ValidateEnsembleSchedulingConfig`: steps with a model and
/// both maps, no other scheduling or per-instance fields, each ensemble
/// tensor written once, every ensemble input read, every output written,
/// no tensor written and never read, and no step whose inputs never come.
pub(super) fn ensemble(config: &ModelConfig, scheduling: &proto::ModelEnsembling, p: &mut Problems) {
    p.refuse(
        config.optimization.is_some(),
        "ensemble: ",
        "optimization",
        "an ensemble's steps are optimized by their models",
    );
    p.refuse(
        !config.model_warmup.is_empty(),
        "ensemble: ",
        "model_warmup",
        "an ensemble's steps warm up in their models",
    );
    if scheduling.step.is_empty() {
        p.add("must specify 'step' for an ensemble: it needs at least one in 'ensemble_scheduling'");
        return;
    }
    let mut written: Vec<(&str, usize)> = Vec::new();
    for (i, step) in scheduling.step.iter().enumerate() {
        p.check(!step.model_name.is_empty(), || format!("must specify 'model_name' in ensemble step {i}"));
        p.check(!step.input_map.is_empty(), || format!("must specify 'input_map' in ensemble step {i}"));
        p.check(!step.output_map.is_empty(), || format!("must specify 'output_map' in ensemble step {i}"));
        p.check(step.model_version >= -1, || {
            format!(
                "ensemble step {i}: 'model_version' must be -1 (the latest) or a version, got {}",
                step.model_version
            )
        });
        for tensor in step.output_map.values() {
            if let Some((_, first)) = written.iter().find(|(t, _)| t == tensor) {
                let writers = if *first == i {
                    format!("step {i} writes it twice")
                } else {
                    format!("step {first} and step {i} write it")
                };
                p.add(format!("ensemble tensor '{tensor}' can appear in an output map only once: {writers}"));
            }
            written.push((tensor, i));
        }
    }
    // Which tensors exist, starting from the inputs, as steps can run.
    let mut available: HashSet<&str> = config.input.iter().map(|i| i.name.as_str()).collect();
    let mut ran = vec![false; scheduling.step.len()];
    while let Some(i) = (0..ran.len())
        .find(|&i| !ran[i] && scheduling.step[i].input_map.values().all(|t| available.contains(t.as_str())))
    {
        ran[i] = true;
        available.extend(scheduling.step[i].output_map.values().map(String::as_str));
    }
    for (i, step) in scheduling.step.iter().enumerate().filter(|(i, _)| !ran[*i]) {
        let mut missing: Vec<&str> =
            step.input_map.values().map(String::as_str).filter(|t| !available.contains(t)).collect();
        missing.sort_unstable();
        p.add(format!(
            "ensemble step {i} (model '{}') can never run: its inputs {missing:?} are neither ensemble inputs nor written by a step that can run",
            step.model_name
        ));
    }
    let read: HashSet<&str> = scheduling.step.iter().flat_map(|s| s.input_map.values().map(String::as_str)).collect();
    for input in &config.input {
        p.check(read.contains(input.name.as_str()), || {
            format!("ensemble input '{}' is not used: no step reads it", input.name)
        });
    }
    let outputs: HashSet<&str> = config.output.iter().map(|o| o.name.as_str()).collect();
    for output in &config.output {
        let writers: Vec<usize> = written.iter().filter(|(t, _)| *t == output.name).map(|(_, i)| *i).collect();
        if writers.is_empty() {
            p.add(format!("ensemble output '{}' is not written: no step writes it", output.name));
        } else if !available.contains(output.name.as_str()) {
            // Only steps that can never run write it: name what they wait for.
            let mut waits: Vec<&str> = writers
                .iter()
                .flat_map(|&i| scheduling.step[i].input_map.values().map(String::as_str))
                .filter(|t| !available.contains(t))
                .collect();
            waits.sort_unstable();
            waits.dedup();
            p.add(format!(
                "ensemble output '{}' is not written: the tensors it depends on {waits:?} are not connected (no \
                 ensemble input, and no step that can run, writes them)",
                output.name
            ));
        }
    }
    for (tensor, i) in &written {
        p.check(read.contains(tensor) || outputs.contains(tensor), || {
            format!("ensemble tensor '{tensor}' is unused: step {i} writes it, but no step reads it and it is no ensemble output")
        });
    }
}

//! Ensembles in the lifecycle: loading an ensemble loads the models its
//! steps run (and the ensembles among them, a cycle refused), then checks
//! each step's tensors against its model, so that a wrong `input_map`
//! fails the load, not the first request. Unloading with
//! `unload_dependents` takes the ensembles that use a model out with it,
//! and an ensemble's steps with the ensemble.

use std::collections::{BTreeSet, HashMap};

use super::core::Core;
use super::request::LoadRequest;
use crate::config::Signature;
use crate::error::LoadError;
use crate::model::Ensemble;
use crate::tensor::{DataType, TensorSpec};

/// Loads the models of `ensemble`'s steps that are not READY. `chain` names
/// the ensembles being loaded around this one, outermost first.
///
/// # Errors
/// [`LoadError::Failed`] for a step whose model is not in a repository,
/// does not load, or closes a cycle of ensembles.
pub(super) async fn load_steps(
    core: &Core,
    name: &str,
    ensemble: &Ensemble,
    chain: &[String],
) -> Result<(), LoadError> {
    let chain: Vec<String> = chain.iter().cloned().chain([name.to_owned()]).collect();
    let models: BTreeSet<&str> = ensemble.steps.iter().map(|s| s.model.as_str()).collect();
    for model in models {
        if chain.iter().any(|c| c == model) {
            return Err(LoadError::Failed(format!(
                "ensemble '{name}' would run itself: {} → {model}",
                chain.join(" → ")
            )));
        }
        if core.registry.has_ready(model) {
            continue;
        }
        if core.find(model).is_none() {
            return Err(LoadError::Failed(format!(
                "ensemble '{name}' runs model '{model}', which is not in the model repositories"
            )));
        }
        Box::pin(core.load_within(model, LoadRequest::default(), &chain)).await.map_err(|e| {
            LoadError::Failed(format!("ensemble '{name}' runs model '{model}', which failed to load: {e}"))
        })?;
    }
    Ok(())
}

/// Class labels by ensemble output, taken from the step outputs that write
/// them.
pub(super) type StepLabels = HashMap<String, Vec<String>>;

/// Checks every step against its model, which is READY: the inputs it maps
/// exist and every required one is mapped, the outputs it maps exist, and
/// each ensemble tensor has one datatype wherever it is written and read.
/// Returns the labels of the ensemble's outputs that steps write from
/// outputs with labels.
///
/// # Errors
/// [`LoadError::Failed`] with every problem, naming the step and tensor.
pub(super) fn check_steps(
    core: &Core,
    name: &str,
    signature: &Signature,
    ensemble: &Ensemble,
) -> Result<StepLabels, LoadError> {
    let mut problems = Vec::new();
    let mut labels = StepLabels::new();
    // The datatype of each ensemble tensor, as the first writer gives it.
    let mut types: Vec<(String, DataType)> = signature.inputs.iter().map(|s| (s.name.clone(), s.datatype)).collect();
    let type_of = |types: &[(String, DataType)], tensor: &str| types.iter().find(|(t, _)| t == tensor).map(|(_, d)| *d);
    // Steps in an order where each one's inputs are written first.
    let mut order: Vec<usize> = Vec::new();
    while order.len() < ensemble.steps.len() {
        let next = (0..ensemble.steps.len()).find(|i| {
            !order.contains(i) && ensemble.steps[*i].inputs.iter().all(|(_, t)| type_of(&types, t).is_some())
        });
        let Some(i) = next else { break };
        order.push(i);
        let step = &ensemble.steps[i];
        let Ok(model) = core.registry.resolve(&step.model, step.version) else {
            problems.push(format!("step {i}: model '{}' is not READY", step.model));
            continue;
        };
        let at = |what: &str| format!("ensemble '{name}' step {i} (model '{}'): {what}", step.model);
        for (input, tensor) in &step.inputs {
            match model.signature.inputs.iter().find(|s| &s.name == input) {
                None => {
                    problems.push(at(&format!("the model has no input '{input}' ({})", names(&model.signature.inputs))))
                }
                Some(spec) if Some(spec.datatype) != type_of(&types, tensor) => problems.push(at(&format!(
                    "input '{input}' is {}, but ensemble tensor '{tensor}' is {}",
                    spec.datatype,
                    type_of(&types, tensor).map_or("unknown".to_owned(), |d| d.to_string())
                ))),
                Some(_) => {}
            }
        }
        for spec in model.signature.inputs.iter().filter(|s| !s.optional) {
            if !step.inputs.iter().any(|(input, _)| input == &spec.name) {
                problems.push(at(&format!("the model's input '{}' is not in its input_map", spec.name)));
            }
        }
        for (output, tensor) in &step.outputs {
            match model.signature.outputs.iter().find(|s| &s.name == output) {
                None => problems
                    .push(at(&format!("the model has no output '{output}' ({})", names(&model.signature.outputs)))),
                Some(spec) => types.push((tensor.clone(), spec.datatype)),
            }
            if let Some(step_labels) = model.labels(output) {
                labels.insert(tensor.clone(), step_labels.to_vec());
            }
        }
    }
    for output in &signature.outputs {
        match type_of(&types, &output.name) {
            Some(d) if d != output.datatype => problems.push(format!(
                "ensemble '{name}': output '{}' is declared {}, but its step writes {d}",
                output.name, output.datatype
            )),
            _ => {}
        }
    }
    if problems.is_empty() { Ok(labels) } else { Err(LoadError::Failed(problems.join("; "))) }
}

fn names(specs: &[TensorSpec]) -> String {
    let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    format!("its tensors are {names:?}")
}

/// The READY ensembles that run `model` in a step.
pub(super) fn users(core: &Core, model: &str) -> Vec<String> {
    let ensembles = core.registry.ready_models(None);
    let uses =
        |m: &&std::sync::Arc<crate::model::Model>| m.steps().is_some_and(|e| e.steps.iter().any(|s| s.model == model));
    let mut names: Vec<String> = ensembles.iter().filter(uses).map(|m| m.name.clone()).collect();
    names.dedup();
    names
}

/// The models `ensemble`'s steps run, if it is a READY ensemble.
pub(super) fn steps(core: &Core, ensemble: &str) -> Vec<String> {
    let Ok(model) = core.registry.resolve(ensemble, None) else { return Vec::new() };
    let models: BTreeSet<String> =
        model.steps().into_iter().flat_map(|e| e.steps.iter().map(|s| s.model.clone())).collect();
    models.into_iter().collect()
}

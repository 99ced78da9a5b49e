//! Ensembles in the lifecycle, over the registry: once the core has loaded
//! the models an ensemble's steps run (`Core::load_steps`, a cycle
//! refused), each step's tensors are checked against its model, so that a wrong `input_map`
//! fails the load, not the first request. Unloading with
//! `unload_dependents` takes the ensembles that use a model out with it,
//! and an ensemble's steps with the ensemble.

use std::collections::{BTreeSet, HashMap};

use crate::config::{Signature, config_type_name};
use crate::error::LoadError;
use crate::model::Ensemble;
use crate::registry::Registry;
use crate::tensor::{DataType, TensorSpec};

/// Class labels by ensemble output, taken from the step outputs that write
/// them.
pub(super) type StepLabels = HashMap<String, Vec<String>>;

/// An ensemble tensor as its writer (the ensemble's input or a step's
/// output) gives it.
struct Written {
    tensor: String,
    datatype: DataType,
    shape: Shape,
    /// "model 'NAME'", or "the ensemble's inputs".
    by: String,
}

/// An ensemble tensor's shape as one model (a step's, or the ensemble
/// itself) declares it.
struct Shape {
    /// Without the batch dimension: a step model's `dims`, the ensemble's
    /// `reshape` where it has one (else its `dims`), as Triton's core takes
    /// them (`ValidateEnsembleConfig`, `ensemble_utils.cc`).
    dims: Vec<i64>,
    /// Whether that model batches: its full shape has -1 in front.
    batching: bool,
}

impl Shape {
    fn full(&self) -> Vec<i64> {
        let batch = self.batching.then_some(-1);
        batch.into_iter().chain(self.dims.iter().copied()).collect()
    }

    /// Whether two models' shapes can describe one tensor, by Triton's
    /// `ValidateTensorConsistency`: the dims agree (the same rank, each
    /// dimension the same or variable, -1, in either), or, where they do
    /// not, the full shapes do, so that a non-batching model's
    /// `[-1, d...]` meets a batching model's `[d...]`.
    fn agrees(&self, other: &Shape) -> bool {
        let agree =
            |a: &[i64], b: &[i64]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y || *x == -1 || *y == -1);
        agree(&self.dims, &other.dims) || agree(&self.full(), &other.full())
    }
}

/// Checks every step against its model, which is READY, with the rules and
/// message keywords of Triton's ensemble validation (core's
/// `ensemble_utils.cc`, the cases of its `qa/L0_model_config`): the inputs a
/// step maps exist and every required one is mapped, the outputs it maps
/// exist, each ensemble tensor has one data type and one shape wherever it
/// is written and read, and no batching step allows a smaller batch than
/// the ensemble. Returns the labels of the ensemble's outputs that steps
/// write from outputs with labels.
///
/// # Errors
/// [`LoadError::Failed`] with every problem, naming the step and tensor.
pub(super) fn check_steps(
    registry: &Registry,
    name: &str,
    signature: &Signature,
    ensemble: &Ensemble,
) -> Result<StepLabels, LoadError> {
    let mut problems = Vec::new();
    let mut labels = StepLabels::new();
    let mut written: Vec<Written> = signature
        .inputs
        .iter()
        .map(|s| Written {
            tensor: s.name.clone(),
            datatype: s.datatype,
            shape: Shape { dims: s.model_dims().to_vec(), batching: signature.max_batch_size > 0 },
            by: "the ensemble's inputs".to_owned(),
        })
        .collect();
    let find = |written: &[Written], tensor: &str| written.iter().position(|w| w.tensor == tensor);
    // Steps in an order where each one's inputs are written first.
    let mut order: Vec<usize> = Vec::new();
    while order.len() < ensemble.steps.len() {
        let next = (0..ensemble.steps.len())
            .find(|i| !order.contains(i) && ensemble.steps[*i].inputs.iter().all(|(_, t)| find(&written, t).is_some()));
        let Some(i) = next else { break };
        order.push(i);
        let step = &ensemble.steps[i];
        let Ok(model) = registry.resolve(&step.model, step.version) else {
            problems.push(match step.version {
                Some(v) => {
                    format!("ensemble '{name}' depends on '{}' whose required version {v} is not loaded", step.model)
                }
                None => format!("ensemble '{name}' depends on '{}', which has no READY version", step.model),
            });
            continue;
        };
        let steps_signature = &model.signature;
        let at = |what: &str| format!("in ensemble '{name}', step {i} (model '{}'): {what}", step.model);
        let batch = steps_signature.max_batch_size;
        if batch > 0 && batch < signature.max_batch_size {
            problems.push(format!(
                "ensemble {name} allows maximum batch size {}, but it contains model {} which only allows \
                 maximum batch size to be {batch}",
                signature.max_batch_size, step.model
            ));
        }
        for (input, tensor) in &step.inputs {
            let Some(spec) = steps_signature.inputs.iter().find(|s| &s.name == input) else {
                problems.push(at(&format!(
                    "ensemble tensor '{tensor}' is mapping to non-existing input {input} in model {} ({})",
                    step.model,
                    names(&steps_signature.inputs)
                )));
                continue;
            };
            let source = &written[find(&written, tensor).expect("written before its readers")];
            if spec.datatype != source.datatype {
                problems.push(at(&format!(
                    "ensemble tensor '{tensor}': inconsistent data type: {} is inferred from {} while {} is \
                     inferred from model {} (input '{input}')",
                    config_type_name(source.datatype),
                    source.by,
                    config_type_name(spec.datatype),
                    step.model
                )));
            }
            let shape = Shape { dims: spec.dims.clone(), batching: batch > 0 };
            if !shape.agrees(&source.shape) {
                problems.push(at(&format!(
                    "ensemble tensor '{tensor}': inconsistent shape: {:?} is inferred from {} while {:?} is \
                     inferred from model {} (input '{input}')",
                    source.shape.full(),
                    source.by,
                    shape.full(),
                    step.model
                )));
            }
        }
        for spec in steps_signature.inputs.iter().filter(|s| !s.optional) {
            if !step.inputs.iter().any(|(input, _)| input == &spec.name) {
                problems.push(at(&format!(
                    "input {} in model {} is not mapped to any ensemble tensors (its input_map)",
                    spec.name, step.model
                )));
            }
        }
        for (output, tensor) in &step.outputs {
            match steps_signature.outputs.iter().find(|s| &s.name == output) {
                None => problems.push(at(&format!(
                    "ensemble tensor '{tensor}' is mapped from non-existing output {output} in model {} ({})",
                    step.model,
                    names(&steps_signature.outputs)
                ))),
                Some(spec) => written.push(Written {
                    tensor: tensor.clone(),
                    datatype: spec.datatype,
                    shape: Shape { dims: spec.dims.clone(), batching: batch > 0 },
                    by: format!("model {}", step.model),
                }),
            }
            if let Some(step_labels) = model.labels(output) {
                labels.insert(tensor.clone(), step_labels.to_vec());
            }
        }
    }
    for output in &signature.outputs {
        let Some(source) = find(&written, &output.name).map(|w| &written[w]) else { continue };
        if source.datatype != output.datatype {
            problems.push(format!(
                "in ensemble '{name}', ensemble tensor '{}': inconsistent data type: {} is inferred from {} while \
                 the ensemble declares {}",
                output.name,
                config_type_name(source.datatype),
                source.by,
                config_type_name(output.datatype)
            ));
        }
        let shape = Shape { dims: output.model_dims().to_vec(), batching: signature.max_batch_size > 0 };
        if !shape.agrees(&source.shape) {
            problems.push(format!(
                "in ensemble '{name}', ensemble tensor '{}': inconsistent shape: {:?} is inferred from {} while the \
                 ensemble declares {:?}",
                output.name,
                source.shape.full(),
                source.by,
                shape.full()
            ));
        }
    }
    if problems.is_empty() { Ok(labels) } else { Err(LoadError::Failed(problems.join("; "))) }
}

fn names(specs: &[TensorSpec]) -> String {
    let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    format!("its tensors are {names:?}")
}

/// The READY ensembles that run `model` in a step.
pub(super) fn users(registry: &Registry, model: &str) -> Vec<String> {
    let ensembles = registry.ready_models(None);
    let uses =
        |m: &&std::sync::Arc<crate::model::Model>| m.steps().is_some_and(|e| e.steps.iter().any(|s| s.model == model));
    let mut names: Vec<String> = ensembles.iter().filter(uses).map(|m| m.name.clone()).collect();
    names.dedup();
    names
}

/// The models `ensemble`'s steps run, if it is a READY ensemble.
pub(super) fn steps(registry: &Registry, ensemble: &str) -> Vec<String> {
    let Ok(model) = registry.resolve(ensemble, None) else { return Vec::new() };
    let models: BTreeSet<String> =
        model.steps().into_iter().flat_map(|e| e.steps.iter().map(|s| s.model.clone())).collect();
    models.into_iter().collect()
}

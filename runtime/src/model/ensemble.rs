//! Ensembles (Triton's `platform: "ensemble"`, `docs/user_guide/ensemble_models.md`):
//! a graph of steps, each a request to another model whose inputs and
//! outputs `input_map` / `output_map` connect to the ensemble's tensors. A
//! request runs as a DAG in the host: each step starts as soon as its
//! inputs exist, all ready steps at once, and each goes through its model's
//! own scheduler and batching (through the [`ModelRunner`], as a client's
//! request would). Only the steps the requested outputs depend on run, and
//! tensors passed between models that batch and models that do not gain or
//! lose a batch of one, as in Triton's ensemble scheduler.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::config::proto::model_config::SchedulingChoice;
use crate::config::{ModelConfig, Signature};
use crate::error::Error;
use crate::plugin::ModelRunner;
use crate::scheduler::policy::RequestOptions;
use crate::tensor::Tensor;

/// One step: a model and how its tensors connect to the ensemble's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The model the step runs.
    pub model: String,
    /// Its version; `None` is the latest (`model_version: -1`).
    pub version: Option<u64>,
    /// (the model's input, the ensemble tensor it takes), sorted.
    pub inputs: Vec<(String, String)>,
    /// (the model's output, the ensemble tensor it writes), sorted.
    pub outputs: Vec<(String, String)>,
}

/// An ensemble's steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ensemble {
    /// The steps, in configuration order.
    pub steps: Vec<Step>,
}

impl Ensemble {
    /// The steps `config`'s `ensemble_scheduling` declares (its graph was
    /// checked by `config::validate`), or `None` for a model that is not an
    /// ensemble.
    pub fn from_config(config: &ModelConfig) -> Option<Ensemble> {
        let Some(SchedulingChoice::EnsembleScheduling(scheduling)) = &config.scheduling_choice else { return None };
        let sorted = |map: &HashMap<String, String>| {
            let mut pairs: Vec<(String, String)> = map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            pairs.sort();
            pairs
        };
        let steps = scheduling
            .step
            .iter()
            .map(|s| Step {
                model: s.model_name.clone(),
                version: u64::try_from(s.model_version).ok(),
                inputs: sorted(&s.input_map),
                outputs: sorted(&s.output_map),
            })
            .collect();
        Some(Ensemble { steps })
    }

    /// Runs ensemble `name`, whose signature is `signature`, on `inputs`
    /// (its input tensors, in their `reshape` shapes) and returns its
    /// outputs that the steps wrote, fitted to their `reshape` (or `dims`)
    /// shapes. Only the steps that `wanted` (ensemble outputs) depends on
    /// run, as in Triton, whose ensemble scheduler leaves out steps whose
    /// outputs nothing requested. Steps run as soon as their inputs exist;
    /// the first failing step ends the request, and the steps still running
    /// are abandoned (their queued requests taken out).
    ///
    /// # Errors
    /// The failing step's error, of the callee's class, its message naming
    /// the step and its model; [`Error::Internal`] when a step does not
    /// return an output the ensemble maps.
    pub async fn run(
        &self,
        name: &str,
        signature: &Signature,
        inputs: Vec<Tensor>,
        wanted: &[&str],
        options: RequestOptions,
        runner: &Arc<dyn ModelRunner>,
    ) -> Result<Vec<Tensor>, Error> {
        // Each tensor, and whether it has a batch dimension (it comes from
        // a model that batches).
        let batching = signature.max_batch_size > 0;
        let mut tensors: HashMap<String, (Tensor, bool)> =
            inputs.into_iter().map(|t| (t.name.clone(), (t, batching))).collect();
        let mut waiting = self.needed_steps(wanted);
        let mut running = tokio::task::JoinSet::new();
        loop {
            let (ready, blocked): (Vec<usize>, Vec<usize>) =
                waiting.iter().partition(|&&i| self.steps[i].inputs.iter().all(|(_, t)| tensors.contains_key(t)));
            waiting = blocked;
            for i in ready {
                let step = self.steps[i].clone();
                let step_inputs: Vec<(Tensor, bool)> = step
                    .inputs
                    .iter()
                    .map(|(input, tensor)| {
                        let (t, batched) = &tensors[tensor];
                        (Tensor { name: input.clone(), ..t.clone() }, *batched)
                    })
                    .collect();
                running.spawn(run_step(runner.clone(), i, step, step_inputs, options.clone()));
            }
            let Some(done) = running.join_next().await else { break };
            let (i, result) = done.map_err(|e| Error::Internal(format!("ensemble '{name}': a step failed: {e}")))?;
            let step = &self.steps[i];
            let (mut outputs, batched) = result.map_err(|e| in_step(name, i, step, e))?;
            for (output, tensor) in &step.outputs {
                let position = outputs.iter().position(|t| &t.name == output).ok_or_else(|| {
                    Error::Internal(format!(
                        "ensemble '{name}' step {i}: model '{}' returned no output '{output}'",
                        step.model
                    ))
                })?;
                let t = outputs.swap_remove(position);
                tensors.insert(tensor.clone(), (Tensor { name: tensor.clone(), ..t }, batched));
            }
        }
        Ok(signature
            .outputs
            .iter()
            .filter_map(|spec| {
                let (mut t, batched) = tensors.remove(&spec.name)?;
                t.shape = fit(&t.shape, batched, spec.model_dims(), batching);
                Some(t)
            })
            .collect())
    }

    /// The steps that write `wanted` or a tensor a needed step reads, in
    /// configuration order.
    fn needed_steps(&self, wanted: &[&str]) -> Vec<usize> {
        let mut tensors: HashSet<&str> = wanted.iter().copied().collect();
        let mut needed = vec![false; self.steps.len()];
        let mut grew = true;
        while grew {
            grew = false;
            for (i, step) in self.steps.iter().enumerate() {
                if !needed[i] && step.outputs.iter().any(|(_, t)| tensors.contains(t.as_str())) {
                    needed[i] = true;
                    tensors.extend(step.inputs.iter().map(|(_, t)| t.as_str()));
                    grew = true;
                }
            }
        }
        (0..self.steps.len()).filter(|&i| needed[i]).collect()
    }
}

/// Runs step `i`: fits its inputs (each with whether it has a batch
/// dimension) to its model, and returns the model's outputs with whether
/// they have one.
async fn run_step(
    runner: Arc<dyn ModelRunner>,
    i: usize,
    step: Step,
    inputs: Vec<(Tensor, bool)>,
    options: RequestOptions,
) -> (usize, Result<(Vec<Tensor>, bool), Error>) {
    let call = async {
        let signature = runner.clone().signature(step.model.clone(), step.version).await?;
        let batching = signature.max_batch_size > 0;
        let inputs = inputs
            .into_iter()
            .map(|(mut t, batched)| {
                if let Some(spec) = signature.inputs.iter().find(|s| s.name == t.name) {
                    t.shape = fit(&t.shape, batched, &spec.dims, batching);
                }
                t
            })
            .collect();
        let outputs = step.outputs.iter().map(|(output, _)| output.clone()).collect();
        let outputs = runner.infer(step.model.clone(), step.version, inputs, outputs, options).await?;
        Ok((outputs, batching))
    };
    (i, call.await)
}

/// The shape a tensor passed between a model that batches and one that
/// does not takes, as Triton's ensemble scheduler converts it
/// (`ensemble_scheduler.cc`, `ReshapeTensorDims`): a tensor without a batch
/// dimension (`batched` false) going where `dims` are batched gets a batch
/// of 1 when its shape is `dims`; a batched tensor going where they are not
/// loses a batch of 1 when its shape is not `dims`. Any other tensor keeps
/// its shape (-1 in `dims` matches any size).
fn fit(shape: &[i64], batched: bool, dims: &[i64], batching: bool) -> Vec<i64> {
    let matches = |s: &[i64]| s.len() == dims.len() && dims.iter().zip(s).all(|(&d, &x)| d < 0 || d == x);
    match (batched, batching) {
        (false, true) if matches(shape) => std::iter::once(1).chain(shape.iter().copied()).collect(),
        (true, false) if !matches(shape) && shape.first() == Some(&1) => shape[1..].to_vec(),
        _ => shape.to_vec(),
    }
}

/// A step's error, of the same class, saying which step of which ensemble,
/// prefixed as Triton prefixes it (`in ensemble 'NAME', ...`, which
/// clients match on).
fn in_step(name: &str, i: usize, step: &Step, e: Error) -> Error {
    let wrap = |m: String| format!("in ensemble '{name}', {m} (step {i}, model '{}')", step.model);
    match e {
        // A step the ensemble names but cannot find leaves the ensemble
        // unable to serve, not the client's request unknown.
        Error::NotFound(m) => Error::Unavailable(wrap(m)),
        e => e.map_message(wrap),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(model: &str, inputs: &[&str], outputs: &[&str]) -> Step {
        let pairs = |names: &[&str]| names.iter().map(|t| (format!("{t}_of_{model}"), (*t).to_owned())).collect();
        Step { model: model.to_owned(), version: None, inputs: pairs(inputs), outputs: pairs(outputs) }
    }

    #[test]
    fn only_the_steps_a_wanted_output_depends_on_run() {
        // a: IN -> x; b: x -> OUT0; c: IN -> OUT1; d: y -> unused
        let ensemble = Ensemble {
            steps: vec![
                step("a", &["IN"], &["x"]),
                step("b", &["x"], &["OUT0"]),
                step("c", &["IN"], &["OUT1"]),
                step("d", &["IN"], &["y"]),
            ],
        };
        assert_eq!(ensemble.needed_steps(&["OUT0"]), [0, 1]);
        assert_eq!(ensemble.needed_steps(&["OUT1"]), [2]);
        assert_eq!(ensemble.needed_steps(&["OUT0", "OUT1"]), [0, 1, 2]);
    }

    #[test]
    fn tensors_between_batching_and_non_batching_models_fit_triton_s_way() {
        // Unbatched [16] into a batching model of dims [-1]: a batch of one.
        assert_eq!(fit(&[16], false, &[-1], true), [1, 16]);
        // Unbatched [2, 16] that does not fit dims [16]: taken as a batch.
        assert_eq!(fit(&[2, 16], false, &[16], true), [2, 16]);
        // Batched [1, 16] into a non-batching model of dims [16]: unbatched.
        assert_eq!(fit(&[1, 16], true, &[16], false), [16]);
        // ... but not when it already fits, or its batch is larger.
        assert_eq!(fit(&[1, 16], true, &[-1, -1], false), [1, 16]);
        assert_eq!(fit(&[2, 16], true, &[16], false), [2, 16]);
        // Both sides alike: unchanged.
        assert_eq!(fit(&[3, 16], true, &[16], true), [3, 16]);
    }
}

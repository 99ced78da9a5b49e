//! Ensembles (Triton's `platform: "ensemble"`, `docs/user_guide/ensemble_models.md`):
//! a graph of steps, each a request to another model whose inputs and
//! outputs `input_map` / `output_map` connect to the ensemble's tensors. A
//! request runs as a DAG in the host: each step starts as soon as its
//! inputs exist, all ready steps at once, and each goes through its model's
//! own scheduler and batching (through the [`ModelRunner`], as a client's
//! request would).

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::ModelConfig;
use crate::config::proto::model_config::SchedulingChoice;
use crate::error::Error;
use crate::plugin::ModelRunner;
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

    /// Runs ensemble `name` on `inputs` (the ensemble's input tensors) and
    /// returns every ensemble tensor the steps wrote. Steps run as soon as
    /// their inputs exist; the first failing step ends the request, and the
    /// steps still running are abandoned (their queued requests taken out).
    ///
    /// # Errors
    /// The failing step's error, of the callee's class, its message naming
    /// the step and its model; [`Error::Internal`] when a step does not
    /// return an output the ensemble maps.
    pub async fn run(
        &self,
        name: &str,
        inputs: Vec<Tensor>,
        runner: &Arc<dyn ModelRunner>,
    ) -> Result<HashMap<String, Tensor>, Error> {
        let mut tensors: HashMap<String, Tensor> = inputs.into_iter().map(|t| (t.name.clone(), t)).collect();
        let mut waiting: Vec<usize> = (0..self.steps.len()).collect();
        let mut running = tokio::task::JoinSet::new();
        loop {
            let (ready, blocked): (Vec<usize>, Vec<usize>) =
                waiting.iter().partition(|&&i| self.steps[i].inputs.iter().all(|(_, t)| tensors.contains_key(t)));
            waiting = blocked;
            for i in ready {
                let step = &self.steps[i];
                let step_inputs = step
                    .inputs
                    .iter()
                    .map(|(input, tensor)| Tensor { name: input.clone(), ..tensors[tensor].clone() })
                    .collect();
                let outputs = step.outputs.iter().map(|(output, _)| output.clone()).collect();
                let call = runner.clone().infer(step.model.clone(), step.version, step_inputs, outputs);
                running.spawn(async move { (i, call.await) });
            }
            let Some(done) = running.join_next().await else { break };
            let (i, result) = done.map_err(|e| Error::Internal(format!("ensemble '{name}': a step failed: {e}")))?;
            let step = &self.steps[i];
            let mut outputs = result.map_err(|e| in_step(name, i, step, e))?;
            for (output, tensor) in &step.outputs {
                let position = outputs.iter().position(|t| &t.name == output).ok_or_else(|| {
                    Error::Internal(format!(
                        "ensemble '{name}' step {i}: model '{}' returned no output '{output}'",
                        step.model
                    ))
                })?;
                let t = outputs.swap_remove(position);
                tensors.insert(tensor.clone(), Tensor { name: tensor.clone(), ..t });
            }
        }
        Ok(tensors)
    }
}

/// A step's error, of the same class, saying which step of which ensemble.
fn in_step(name: &str, i: usize, step: &Step, e: Error) -> Error {
    let wrap = |m: String| format!("ensemble '{name}' step {i} (model '{}'): {m}", step.model);
    match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(wrap(m)),
        Error::NotFound(m) => Error::Unavailable(wrap(m)),
        Error::Unavailable(m) => Error::Unavailable(wrap(m)),
        Error::Overloaded(m) => Error::Overloaded(wrap(m)),
        Error::BadGateway(m) => Error::BadGateway(wrap(m)),
        Error::Internal(m) => Error::Internal(wrap(m)),
        Error::Unsupported(m) => Error::Unsupported(wrap(m)),
    }
}

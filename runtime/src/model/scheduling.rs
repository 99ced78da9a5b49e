//! Which scheduler a model's configuration asks for.

use std::path::Path;

use crate::config::{ModelConfig, Signature};
use crate::scheduler::policy::Policy;
use crate::scheduler::ragged::BatchLayout;
use crate::scheduler::sequence::policy::SequencePolicy;

/// How a model's requests are scheduled, as its configuration says.
pub enum Scheduling {
    /// `dynamic_batching`, or none.
    Dynamic(Policy),
    /// `sequence_batching`.
    Sequence(SequencePolicy),
}

impl Scheduling {
    /// The scheduling of `config`; initial state files are read from
    /// `model_dir`.
    ///
    /// # Errors
    /// As [`Policy::from_config`] and [`SequencePolicy::from_config`].
    pub fn from_config(config: &ModelConfig, model_dir: &Path) -> Result<Scheduling, String> {
        match SequencePolicy::from_config(config, model_dir)? {
            Some(sequence) => Ok(Scheduling::Sequence(sequence)),
            None => Policy::from_config(config).map(Scheduling::Dynamic),
        }
    }

    /// Ragged inputs, batch inputs and batch outputs, whichever batcher
    /// schedules the model.
    pub fn layout(&self) -> &BatchLayout {
        match self {
            Scheduling::Dynamic(policy) => &policy.layout,
            Scheduling::Sequence(policy) => &policy.layout,
        }
    }

    /// The tensors the backend exchanges: the requests' (`signature`), each
    /// ragged input as one variable dimension after the batch dimension's
    /// place (the backend gets `[total elements]`), the batch inputs and,
    /// for a sequence model, the host's controls and state.
    pub(super) fn backend_signature(&self, signature: &Signature) -> Signature {
        let mut full = signature.clone();
        let layout = self.layout();
        for spec in &mut full.inputs {
            if layout.is_ragged(&spec.name) {
                spec.dims.clear();
                spec.reshape = None;
            }
        }
        full.inputs.extend(layout.host_specs());
        if let Scheduling::Sequence(policy) = self {
            let (inputs, outputs) = policy.host_specs();
            full.inputs.extend(inputs);
            full.outputs.extend(outputs);
        }
        full
    }
}

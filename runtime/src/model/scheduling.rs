//! Which scheduler a model's configuration asks for.

use std::path::Path;

use crate::config::{ModelConfig, Signature};
use crate::scheduler::policy::Policy;
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

    /// The tensors the backend exchanges: the requests' (`signature`) and,
    /// for a sequence model, the host's controls and state.
    pub(super) fn backend_signature(&self, signature: &Signature) -> Signature {
        let mut full = signature.clone();
        if let Scheduling::Sequence(policy) = self {
            let (inputs, outputs) = policy.host_specs();
            full.inputs.extend(inputs);
            full.outputs.extend(outputs);
        }
        full
    }
}

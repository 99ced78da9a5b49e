//! Triton's `identity` backend (`triton-inference-server/identity_backend`):
//! output i is a copy of input i, as the configuration lists them, with the
//! input's shape and data. There is no model file. Ensembles use it to pass
//! tensors through, and Triton's QA repositories build their `nop_*` and
//! `custom_*` models on it.

use std::sync::Arc;
use std::time::Duration;

use super::{Backend, BackendError, BackendKind, Description, Framework, LoadContext, ModelIo, Placement, shared};
use crate::config::Signature;
use crate::tensor::Tensor;

/// The identity backend: no runtime, no file.
pub struct Identity;

impl Framework for Identity {
    fn kind(&self) -> BackendKind {
        BackendKind::Identity
    }

    fn load(&self, model: &LoadContext<'_>, placements: &[Placement]) -> Result<Vec<Arc<dyn Backend>>, String> {
        // `execute_delay_ms`: a stand-in for a slow model.
        let delay = model.parameters.execute_delay;
        placements.iter().map(|_| IdentityModel::new(model.signature, delay)).collect::<Result<_, _>>().map(shared)
    }
}

/// A model that answers its inputs.
pub struct IdentityModel {
    description: Description,
    delay: Duration,
}

impl IdentityModel {
    /// The model `signature` declares, each execution waiting `delay`.
    ///
    /// # Errors
    /// A message when the configuration lists a different number of inputs
    /// and outputs, or an output whose datatype is not its input's.
    pub fn new(signature: &Signature, delay: Duration) -> Result<IdentityModel, String> {
        if signature.inputs.len() != signature.outputs.len() {
            return Err(format!(
                "the identity backend answers input i as output i, but the configuration lists {} inputs and {} outputs",
                signature.inputs.len(),
                signature.outputs.len()
            ));
        }
        for (input, output) in signature.inputs.iter().zip(&signature.outputs) {
            if input.datatype != output.datatype {
                return Err(format!(
                    "the identity backend answers input '{}' ({}) as output '{}', which is declared {}",
                    input.name, input.datatype, output.name, output.datatype
                ));
            }
        }
        let batching = signature.max_batch_size > 0;
        let io = |specs: &[crate::tensor::TensorSpec]| specs.iter().map(|s| ModelIo::from_spec(s, batching)).collect();
        let description = Description {
            kind: BackendKind::Identity,
            platform: "identity".into(),
            inputs: io(&signature.inputs),
            outputs: io(&signature.outputs),
            metadata: Vec::new(),
            remote: false,
        };
        Ok(IdentityModel { description, delay })
    }
}

impl Backend for IdentityModel {
    fn description(&self) -> &Description {
        &self.description
    }

    fn execute(&self, mut inputs: Vec<Tensor>) -> Result<Vec<Tensor>, BackendError> {
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        let Description { inputs: declared, outputs, .. } = &self.description;
        declared
            .iter()
            .zip(outputs)
            .map(|(input, output)| {
                let at = inputs
                    .iter()
                    .position(|t| t.name == input.name)
                    .ok_or_else(|| BackendError::InvalidInput(format!("input '{}' is missing", input.name)))?;
                Ok(Tensor { name: output.name.clone(), ..inputs.swap_remove(at) })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;
    use crate::tensor::DataType;

    fn signature(text: &str) -> Signature {
        Signature::from_config(&config::parse(text).unwrap()).unwrap()
    }

    #[test]
    fn each_output_is_its_input() {
        let sig = signature(
            r#"backend: "identity" max_batch_size: 4
            input [{ name: "A" data_type: TYPE_INT32 dims: [-1] }, { name: "B" data_type: TYPE_STRING dims: [1] }]
            output [{ name: "X" data_type: TYPE_INT32 dims: [-1] }, { name: "Y" data_type: TYPE_STRING dims: [1] }]"#,
        );
        let model = IdentityModel::new(&sig, Duration::ZERO).unwrap();
        let a = Tensor {
            name: "A".into(),
            datatype: DataType::Int32,
            shape: vec![1, 2],
            data: vec![1, 0, 0, 0, 2, 0, 0, 0],
        };
        let b = Tensor { name: "B".into(), datatype: DataType::Bytes, shape: vec![1, 1], data: vec![1, 0, 0, 0, b'z'] };
        let out = model.execute(vec![b.clone(), a.clone()]).unwrap();
        assert_eq!(out, [Tensor { name: "X".into(), ..a }, Tensor { name: "Y".into(), ..b }]);
    }

    #[test]
    fn unmatched_inputs_and_outputs_are_refused() {
        let sig = signature(
            r#"input [{ name: "A" data_type: TYPE_INT32 dims: [1] }]
            output [{ name: "X" data_type: TYPE_FP32 dims: [1] }]"#,
        );
        assert!(IdentityModel::new(&sig, Duration::ZERO).err().unwrap().contains("'X', which is declared FP32"));
        let sig = signature(r#"input [{ name: "A" data_type: TYPE_INT32 dims: [1] }]"#);
        assert!(IdentityModel::new(&sig, Duration::ZERO).err().unwrap().contains("1 inputs and 0 outputs"));
    }
}

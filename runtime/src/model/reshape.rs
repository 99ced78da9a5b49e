//! `reshape` (Triton's model configuration): the backend sees an input in
//! its `reshape` dimensions and produces an output in its `reshape`
//! dimensions, while clients send and receive `dims`. The data is the same
//! row-major bytes; only the shapes change, the batch dimension staying
//! first.

use crate::config::Signature;
use crate::tensor::{Tensor, reshape_dims};

/// The inputs (already checked against `dims`) in the shapes the backend
/// takes.
pub fn inputs(sig: &Signature, mut inputs: Vec<Tensor>) -> Vec<Tensor> {
    for t in &mut inputs {
        let spec = sig.inputs.iter().find(|s| s.name == t.name && s.reshape.is_some());
        if let Some(shape) = spec.and_then(|spec| map(sig, &t.shape, &spec.dims, spec.model_dims())) {
            t.shape = shape;
        }
    }
    inputs
}

/// The backend's outputs in the shapes clients receive.
///
/// # Errors
/// A message naming an output whose shape does not fit its `reshape`.
pub fn outputs(sig: &Signature, mut outputs: Vec<Tensor>) -> Result<Vec<Tensor>, String> {
    for t in &mut outputs {
        if let Some(spec) = sig.outputs.iter().find(|s| s.name == t.name && s.reshape.is_some()) {
            t.shape = map(sig, &t.shape, spec.model_dims(), &spec.dims).ok_or_else(|| {
                format!(
                    "output '{}' with shape {:?}, which does not fit its reshape {:?}",
                    t.name,
                    t.shape,
                    spec.model_dims()
                )
            })?;
        }
    }
    Ok(outputs)
}

/// `shape` (batch dimension first when the model batches) from the pattern
/// `from` to the pattern `to`.
fn map(sig: &Signature, shape: &[i64], from: &[i64], to: &[i64]) -> Option<Vec<i64>> {
    let batch = usize::from(sig.max_batch_size > 0);
    let (rows, dims) = shape.split_at_checked(batch)?;
    let mapped = reshape_dims(dims, from, to)?;
    Some(rows.iter().copied().chain(mapped).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{DataType, TensorSpec};

    fn reshaped(name: &str, dims: &[i64], reshape: &[i64]) -> TensorSpec {
        TensorSpec { reshape: Some(reshape.to_vec()), ..TensorSpec::new(name, DataType::Int32, dims) }
    }

    fn tensor(name: &str, shape: &[i64]) -> Tensor {
        let count: i64 = shape.iter().product();
        Tensor {
            name: name.into(),
            datatype: DataType::Int32,
            shape: shape.to_vec(),
            data: vec![0; 4 * count as usize],
        }
    }

    #[test]
    fn inputs_and_outputs_change_shape_and_keep_the_batch_dimension() {
        let sig = Signature {
            max_batch_size: 8,
            inputs: vec![
                reshaped("x", &[2, 4, -1, 6], &[8, -1, 1, 6]),
                TensorSpec::new("plain", DataType::Int32, &[3]),
            ],
            outputs: vec![reshaped("y", &[1], &[])],
        };
        let shaped = inputs(&sig, vec![tensor("x", &[3, 2, 4, 5, 6]), tensor("plain", &[3, 3])]);
        assert_eq!(shaped[0].shape, [3, 8, 5, 1, 6]);
        assert_eq!(shaped[1].shape, [3, 3]);
        let back = outputs(&sig, vec![tensor("y", &[3])]).unwrap();
        assert_eq!(back[0].shape, [3, 1], "an empty reshape is one element per row");
        let wrong = outputs(&sig, vec![tensor("y", &[3, 2])]).unwrap_err();
        assert!(wrong.contains("does not fit its reshape []"), "{wrong}");
    }
}

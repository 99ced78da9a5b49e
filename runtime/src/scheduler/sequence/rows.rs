//! The tensors of one sequence-batcher execution: each row's inputs and
//! state with the control inputs added, rows combined along the batch
//! dimension, and the outputs split back into each row's answer and next
//! state.

use super::CorrelationId;
use super::policy::{ControlInput, SequencePolicy, Signal, zeros};
use crate::scheduler::batch;
use crate::scheduler::ragged::BatchLayout;
use crate::tensor::{DataType, Tensor, push_bytes_element};

/// One row of an execution, before the controls are added.
pub struct RowInputs {
    /// The request's inputs, sorted by name, then the sequence's state
    /// tensors in the policy's order (each with a batch dimension of 1 for
    /// a model that batches).
    pub tensors: Vec<Tensor>,
    /// Whether the request starts its sequence.
    pub start: bool,
    /// Whether it ends it.
    pub end: bool,
    /// The sequence's correlation id; `None` for a padding row.
    pub id: Option<CorrelationId>,
}

/// What rows must share to run in one execution: every tensor's name,
/// datatype and shape (a ragged input's shape left out).
pub type RowKey = Vec<(String, DataType, Vec<i64>)>;

/// The key of a row with request `inputs` and `states`.
pub fn key(layout: &BatchLayout, inputs: &[Tensor], states: &[Tensor]) -> RowKey {
    let shape = |t: &Tensor| if layout.is_ragged(&t.name) { Vec::new() } else { t.shape.clone() };
    inputs.iter().chain(states).map(|t| (t.name.clone(), t.datatype, shape(t))).collect()
}

/// A padding row shaped like `model`: zeros (empty strings), READY false.
pub fn padding(model: &RowInputs) -> RowInputs {
    let tensors = model.tensors.iter().map(|t| zeros(&t.name, t.datatype, &t.shape)).collect();
    RowInputs { tensors, start: false, end: false, id: None }
}

/// The execution's inputs: each row's tensors with its control tensors,
/// concatenated along the batch dimension (a model that does not batch has
/// one row), ragged inputs flattened and batch inputs added as the
/// policy's layout says.
///
/// # Errors
/// As [`BatchLayout::gather`].
pub fn batch_inputs(policy: &SequencePolicy, rows: &[&RowInputs]) -> Result<Vec<Tensor>, String> {
    let per_row: Vec<Vec<Tensor>> = rows
        .iter()
        .map(|row| {
            let mut tensors = row.tensors.clone();
            tensors.extend(policy.controls.iter().map(|c| control(c, row, policy.batch_dimension)));
            tensors
        })
        .collect();
    if !policy.layout.is_plain() {
        return policy.layout.gather(&per_row);
    }
    Ok(match per_row.len() {
        1 => per_row.into_iter().next().unwrap_or_default(),
        _ => batch::concat(&per_row),
    })
}

/// One row's control tensor: shape `[1]`, or `[1, 1]` with a batch
/// dimension.
fn control(c: &ControlInput, row: &RowInputs, batch_dimension: bool) -> Tensor {
    let flag = |on: bool| c.false_true[usize::from(on)].clone();
    let data = match c.signal {
        Signal::Start => flag(row.start),
        Signal::End => flag(row.end),
        Signal::Ready => flag(row.id.is_some()),
        Signal::CorrelationId => correlation_id(c.datatype, row.id.as_ref()),
    };
    let shape = if batch_dimension { vec![1, 1] } else { vec![1] };
    Tensor { name: c.name.clone(), datatype: c.datatype, shape, data }
}

/// The correlation id as one element of `datatype` (0 or "" for padding);
/// an integer id given to a string control reads as its decimal text (a
/// string id never reaches an integer control: the scheduler refuses it).
fn correlation_id(datatype: DataType, id: Option<&CorrelationId>) -> Vec<u8> {
    let number = id.and_then(CorrelationId::as_integer).unwrap_or(0);
    match datatype {
        DataType::Bytes => {
            let mut data = Vec::new();
            push_bytes_element(&mut data, id.map(ToString::to_string).unwrap_or_default().as_bytes());
            data
        }
        DataType::Int32 | DataType::Uint32 => (number as u32).to_le_bytes().to_vec(),
        _ => number.to_le_bytes().to_vec(),
    }
}

/// A warm-up sample's inputs (`rows` rows) with the host's tensors added:
/// each row a whole sequence of one request (START, END and READY true,
/// correlation id 0) from the initial state; ragged inputs flattened and
/// batch inputs added as for one request.
///
/// # Errors
/// As [`BatchLayout::gather`].
pub fn warm_up(policy: &SequencePolicy, mut inputs: Vec<Tensor>, rows: usize) -> Result<Vec<Tensor>, String> {
    let row = RowInputs { tensors: Vec::new(), start: true, end: true, id: None };
    let shape = |t: &Tensor| if policy.batch_dimension { vec![rows as i64, 1] } else { t.shape.clone() };
    for c in &policy.controls {
        let mut one = control(c, &row, policy.batch_dimension);
        if c.signal == Signal::Ready {
            one.data = c.false_true[1].clone();
        }
        let data = one.data.repeat(rows);
        inputs.push(Tensor { shape: shape(&one), data, ..one });
    }
    for s in &policy.states {
        let mut shape = s.initial.shape.clone();
        if policy.batch_dimension {
            shape[0] = rows as i64;
        }
        inputs.push(Tensor { shape, data: s.initial.data.repeat(rows), ..s.initial.clone() });
    }
    if policy.layout.is_plain() { Ok(inputs) } else { policy.layout.gather(std::slice::from_ref(&inputs)) }
}

/// One row's answer: the outputs a client sees, and the next state (named
/// as the state inputs).
pub type RowAnswer = (Vec<Tensor>, Vec<Tensor>);

/// Splits the execution's `outputs` into `rows` answers and takes each
/// row's state outputs out as its next state.
///
/// # Errors
/// A message when an output does not have the batch's rows, or a state
/// output is missing or of another datatype than its state.
pub fn split(policy: &SequencePolicy, outputs: Vec<Tensor>, rows: &[&RowInputs]) -> Result<Vec<RowAnswer>, String> {
    let per_row = if !policy.layout.is_plain() {
        let sources: Vec<_> = rows.iter().map(|r| policy.layout.sources(&r.tensors)).collect();
        policy.layout.split(outputs, &vec![1; rows.len()], &sources)?
    } else if policy.batch_dimension {
        batch::split(outputs, &vec![1; rows.len()])?
    } else {
        vec![outputs]
    };
    per_row
        .into_iter()
        .map(|mut outputs| {
            let mut states = Vec::with_capacity(policy.states.len());
            for spec in &policy.states {
                let at = outputs.iter().position(|t| t.name == spec.output).ok_or_else(|| {
                    format!("the model returned no state output '{}' (sequence_batching state)", spec.output)
                })?;
                let mut state = outputs.remove(at);
                if state.datatype != spec.datatype {
                    return Err(format!(
                        "state output '{}' is {}, but the state is declared {}",
                        spec.output, state.datatype, spec.datatype
                    ));
                }
                state.name.clone_from(&spec.input);
                states.push(state);
            }
            Ok((outputs, states))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn fp32(name: &str, shape: &[i64], values: &[f32]) -> Tensor {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor { name: name.into(), datatype: DataType::Fp32, shape: shape.to_vec(), data }
    }

    fn numbers(t: &Tensor) -> Vec<f32> {
        match t.datatype {
            DataType::Int32 => t.data.chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f32).collect(),
            _ => t.data.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
        }
    }

    #[test]
    fn rows_of_a_ragged_sequence_model_batch_flat_with_their_batch_inputs_and_scattered_outputs() {
        let config = crate::config::parse(
            r#"max_batch_size: 4
               input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
               output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]
               batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "offsets"
                               data_type: TYPE_INT32 source_input: "x" } ]
               batch_output [ { target_name: "y" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "x" } ]
               sequence_batching { control_input [
                 { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] } ] }"#,
        )
        .unwrap();
        let policy = SequencePolicy::from_config(&config, Path::new("/nonexistent")).unwrap().unwrap();
        let row = |id: u64, values: &[f32]| RowInputs {
            tensors: vec![fp32("x", &[1, values.len() as i64], values)],
            start: true,
            end: false,
            id: Some(CorrelationId::Uint(id)),
        };
        let (a, b) = (row(1, &[1., 2.]), row(2, &[3., 4., 5.]));
        assert_eq!(key(&policy.layout, &a.tensors, &[]), key(&policy.layout, &b.tensors, &[]));
        let inputs = batch_inputs(&policy, &[&a, &b]).unwrap();
        let find = |name: &str| inputs.iter().find(|t| t.name == name).unwrap();
        assert_eq!((find("x").shape.clone(), numbers(find("x"))), (vec![5], vec![1., 2., 3., 4., 5.]));
        assert_eq!((find("READY").shape.clone(), numbers(find("READY"))), (vec![2, 1], vec![1., 1.]));
        assert_eq!((find("offsets").shape.clone(), numbers(find("offsets"))), (vec![3], vec![0., 2., 5.]));
        let answers = split(&policy, vec![fp32("y", &[5], &[10., 20., 30., 40., 50.])], &[&a, &b]).unwrap();
        assert_eq!(answers[0].0, vec![fp32("y", &[1, 2], &[10., 20.])]);
        assert_eq!(answers[1].0, vec![fp32("y", &[1, 3], &[30., 40., 50.])]);
    }
}

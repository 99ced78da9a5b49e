//! The tensors of one sequence-batcher execution: each row's inputs and
//! state with the control inputs added, rows combined along the batch
//! dimension, and the outputs split back into each row's answer and next
//! state.

use super::CorrelationId;
use super::policy::{ControlInput, SequencePolicy, Signal, zeros};
use crate::scheduler::batch;
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
/// datatype and shape.
pub type RowKey = Vec<(String, DataType, Vec<i64>)>;

/// The key of a row with request `inputs` and `states`.
pub fn key(inputs: &[Tensor], states: &[Tensor]) -> RowKey {
    inputs.iter().chain(states).map(|t| (t.name.clone(), t.datatype, t.shape.clone())).collect()
}

/// A padding row shaped like `model`: zeros (empty strings), READY false.
pub fn padding(model: &RowInputs) -> RowInputs {
    let tensors = model.tensors.iter().map(|t| zeros(&t.name, t.datatype, &t.shape)).collect();
    RowInputs { tensors, start: false, end: false, id: None }
}

/// The execution's inputs: each row's tensors with its control tensors,
/// concatenated along the batch dimension (a model that does not batch has
/// one row).
pub fn batch_inputs(policy: &SequencePolicy, rows: &[&RowInputs]) -> Vec<Tensor> {
    let per_row: Vec<Vec<Tensor>> = rows
        .iter()
        .map(|row| {
            let mut tensors = row.tensors.clone();
            tensors.extend(policy.controls.iter().map(|c| control(c, row, policy.batch_dimension)));
            tensors
        })
        .collect();
    match per_row.len() {
        1 => per_row.into_iter().next().unwrap_or_default(),
        _ => batch::concat(&per_row),
    }
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
/// correlation id 0) from the initial state.
pub fn warm_up(policy: &SequencePolicy, mut inputs: Vec<Tensor>, rows: usize) -> Vec<Tensor> {
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
    inputs
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
pub fn split(policy: &SequencePolicy, outputs: Vec<Tensor>, rows: usize) -> Result<Vec<RowAnswer>, String> {
    let per_row = if policy.batch_dimension { batch::split(outputs, &vec![1; rows])? } else { vec![outputs] };
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

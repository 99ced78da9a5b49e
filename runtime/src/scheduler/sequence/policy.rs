//! A sequence model's scheduling policy, read from `sequence_batching` in
//! `config.pbtxt` (Triton's `ModelSequenceBatching`,
//! `docs/user_guide/architecture.md` §stateful models and
//! `docs/user_guide/implicit_state_management.md`): the strategy, the
//! control inputs the host fills in, and the implicit state it carries.

use std::path::Path;
use std::time::Duration;

use crate::config::proto::model_sequence_batching::{Control, StrategyChoice, control::Kind};
use crate::config::proto::{ModelConfig, ModelSequenceBatching, model_config::SchedulingChoice};
use crate::config::{CONFIG_FILE, datatype_from_config};
use crate::scheduler::ragged::BatchLayout;
use crate::tensor::{DataType, Tensor, TensorSpec};

/// Triton's default `max_sequence_idle_microseconds`: one second.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(1);

/// The folder, inside a model's folder, that `initial_state.data_file`
/// names files in (Triton's layout).
pub const INITIAL_STATE_DIR: &str = "initial_state";

/// How requests of different sequences are combined into executions.
#[derive(Clone, Debug, PartialEq)]
pub enum Strategy {
    /// `direct`: each sequence owns one batch slot of one instance and is
    /// always at that row; rows of idle slots below a busy one are padding
    /// with READY false.
    Direct {
        /// `max_queue_delay_microseconds`: how long a ready request may wait
        /// for more slots to become ready.
        max_queue_delay: Duration,
        /// `minimum_slot_utilization`: the share of an instance's slots that
        /// must be ready before the delay is cut short.
        minimum_slot_utilization: f32,
    },
    /// `oldest`: each sequence is bound to one instance; each execution
    /// takes the oldest ready request of up to `max_batch_size` of its
    /// sequences, in no fixed rows.
    Oldest {
        /// `max_candidate_sequences`: sequences bound to each instance at
        /// once (Triton's slots per instance).
        max_candidate_sequences: usize,
        /// `max_queue_delay_microseconds`: how long the oldest ready request
        /// may wait for a fuller batch.
        max_queue_delay: Duration,
        /// `preferred_batch_size`, ascending: a batch of one of these sizes
        /// runs without waiting out the delay.
        preferred_batch_sizes: Vec<usize>,
    },
}

/// What a control input carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// `CONTROL_SEQUENCE_START`: true on a sequence's first request.
    Start,
    /// `CONTROL_SEQUENCE_END`: true on its last request.
    End,
    /// `CONTROL_SEQUENCE_READY`: true on a row that holds a request, false
    /// on a padding row.
    Ready,
    /// `CONTROL_SEQUENCE_CORRID`: the correlation id.
    CorrelationId,
}

impl Signal {
    /// The control kind's name in `config.pbtxt`.
    pub fn kind_name(self) -> &'static str {
        match self {
            Signal::Start => Kind::ControlSequenceStart.as_str_name(),
            Signal::End => Kind::ControlSequenceEnd.as_str_name(),
            Signal::Ready => Kind::ControlSequenceReady.as_str_name(),
            Signal::CorrelationId => Kind::ControlSequenceCorrid.as_str_name(),
        }
    }
}

/// One control tensor the host adds to each execution: per row, shape `[1]`
/// (`[rows, 1]` for a model that batches).
#[derive(Clone, Debug, PartialEq)]
pub struct ControlInput {
    /// The model input's name.
    pub name: String,
    /// What it carries.
    pub signal: Signal,
    /// Its datatype: that of the `*_false_true` list, or the CORRID
    /// control's `data_type`.
    pub datatype: DataType,
    /// For START, END and READY, the encoded false and true element.
    pub false_true: [Vec<u8>; 2],
}

/// One implicit state tensor: the model reads it from `input_name` and
/// writes the next value to `output_name`; the host carries it between a
/// sequence's requests.
#[derive(Clone, Debug, PartialEq)]
pub struct StateSpec {
    /// `input_name`: the model input that receives the state.
    pub input: String,
    /// `output_name`: the model output that holds the next state.
    pub output: String,
    /// `data_type`.
    pub datatype: DataType,
    /// `dims`, without the batch dimension (-1: any size).
    pub dims: Vec<i64>,
    /// The state at a sequence's start, named as the state input, with a
    /// batch dimension of 1 for a model that batches: `initial_state`'s
    /// zeros or file, or zeros of `dims` (each -1 read as 1) as Triton
    /// gives when there is no `initial_state`.
    pub initial: Tensor,
}

/// A sequence model's policy.
#[derive(Clone, Debug, PartialEq)]
pub struct SequencePolicy {
    /// The batching strategy.
    pub strategy: Strategy,
    /// `max_sequence_idle_microseconds` (default one second): a sequence
    /// with no request for this long loses its slot and state.
    pub max_idle: Duration,
    /// The control inputs, in the order the configuration lists them.
    pub controls: Vec<ControlInput>,
    /// The implicit state tensors.
    pub states: Vec<StateSpec>,
    /// Whether requests carry a batch dimension (`max_batch_size` > 0).
    pub batch_dimension: bool,
    /// Rows per execution: `max_batch_size`, or 1 for a model that does not
    /// batch.
    pub max_batch_size: usize,
    /// Ragged inputs, batch inputs and batch outputs (`allow_ragged_batch`,
    /// `batch_input`, `batch_output`), as the dynamic batcher has them.
    pub layout: BatchLayout,
}

impl SequencePolicy {
    /// The policy of `config`, if it has `sequence_batching`; initial state
    /// files are read from `model_dir/initial_state/`.
    ///
    /// # Errors
    /// A message naming the field: a control without exactly one kind of
    /// false/true pair (or a CORRID control without `data_type`), a kind
    /// given to two tensors, a tensor given two kinds, a state without `input_name`, `output_name` or
    /// `data_type`, an initial state file that is missing, outside
    /// `initial_state/` or of the wrong size, or a field Plinth does not act
    /// on (`iterative_sequence`, `oldest.preserve_ordering`,
    /// `use_same_buffer_for_input_output`, `use_growable_memory`).
    pub fn from_config(config: &ModelConfig, model_dir: &Path) -> Result<Option<SequencePolicy>, String> {
        let Some(SchedulingChoice::SequenceBatching(sb)) = &config.scheduling_choice else { return Ok(None) };
        refuse_unsupported(sb)?;
        let batch_dimension = config.max_batch_size > 0;
        let max_batch_size = usize::try_from(config.max_batch_size).unwrap_or(0).max(1);
        let controls = controls(sb)?;
        let mut states: Vec<StateSpec> = sb.state.iter().map(|s| state_spec(s, model_dir)).collect::<Result<_, _>>()?;
        if batch_dimension {
            for state in &mut states {
                state.initial.shape.insert(0, 1);
            }
        }
        Ok(Some(SequencePolicy {
            strategy: strategy(sb, max_batch_size),
            max_idle: match sb.max_sequence_idle_microseconds {
                0 => DEFAULT_IDLE,
                us => Duration::from_micros(us),
            },
            controls,
            states,
            batch_dimension,
            max_batch_size,
            layout: BatchLayout::from_config(config)?,
        }))
    }

    /// Checks what of `config`'s `sequence_batching` needs no file: its
    /// control inputs and the fields Plinth does not act on, with the rules
    /// [`SequencePolicy::from_config`] applies at load. Runs with the
    /// configuration's validation, before any version is looked at, as
    /// Triton checks them.
    ///
    /// # Errors
    /// As [`SequencePolicy::from_config`], but for the state.
    pub fn check_config(config: &ModelConfig) -> Result<(), String> {
        let Some(SchedulingChoice::SequenceBatching(sb)) = &config.scheduling_choice else { return Ok(()) };
        refuse_unsupported(sb)?;
        controls(sb).map(drop)
    }

    /// The model inputs the host provides (controls and states), which a
    /// request must not send and the signature does not list.
    pub fn host_inputs(&self) -> Vec<&str> {
        self.controls.iter().map(|c| c.name.as_str()).chain(self.states.iter().map(|s| s.input.as_str())).collect()
    }

    /// The host's tensors as the model sees them, for backends that take
    /// their tensors from the configuration (libtorch): the control inputs
    /// (dims `[1]`) and state inputs, and the state outputs.
    pub fn host_specs(&self) -> (Vec<TensorSpec>, Vec<TensorSpec>) {
        let controls = self.controls.iter().map(|c| TensorSpec::new(&c.name, c.datatype, &[1]));
        let states = self.states.iter().map(|s| TensorSpec::new(&s.input, s.datatype, &s.dims));
        let outputs = self.states.iter().map(|s| TensorSpec::new(&s.output, s.datatype, &s.dims)).collect();
        (controls.chain(states).collect(), outputs)
    }

    /// Batch slots per instance: `max_batch_size` for `direct`,
    /// `max_candidate_sequences` for `oldest` (as Triton's sequence batcher
    /// gives each instance); the other sequences wait in the backlog.
    pub fn slots_per_instance(&self) -> usize {
        match &self.strategy {
            Strategy::Direct { .. } => self.max_batch_size,
            Strategy::Oldest { max_candidate_sequences, .. } => *max_candidate_sequences,
        }
    }
}

fn refuse_unsupported(sb: &ModelSequenceBatching) -> Result<(), String> {
    let refuse = |set: bool, field: &str, why: &str| {
        if set { Err(format!("sequence_batching: '{field}' is not supported: {why}")) } else { Ok(()) }
    };
    refuse(sb.iterative_sequence, "iterative_sequence", "it is for decoupled models, which Plinth does not serve")?;
    if let Some(StrategyChoice::Oldest(oldest)) = &sb.strategy_choice {
        refuse(
            oldest.preserve_ordering,
            "oldest.preserve_ordering",
            "each sequence's answers already come in its order; answers of different sequences are not ordered",
        )?;
    }
    for state in &sb.state {
        let why = "Plinth carries state in host memory, between executions";
        refuse(state.use_same_buffer_for_input_output, "state.use_same_buffer_for_input_output", why)?;
        refuse(state.use_growable_memory, "state.use_growable_memory", why)?;
    }
    Ok(())
}

fn strategy(sb: &ModelSequenceBatching, max_batch_size: usize) -> Strategy {
    match &sb.strategy_choice {
        Some(StrategyChoice::Oldest(o)) => {
            let mut preferred: Vec<usize> =
                o.preferred_batch_size.iter().filter_map(|&p| usize::try_from(p).ok()).collect();
            preferred.sort_unstable();
            preferred.dedup();
            Strategy::Oldest {
                max_candidate_sequences: usize::try_from(o.max_candidate_sequences).unwrap_or(0).max(1),
                max_queue_delay: Duration::from_micros(o.max_queue_delay_microseconds),
                preferred_batch_sizes: preferred.into_iter().filter(|&p| p <= max_batch_size).collect(),
            }
        }
        Some(StrategyChoice::Direct(d)) => Strategy::Direct {
            max_queue_delay: Duration::from_micros(d.max_queue_delay_microseconds),
            minimum_slot_utilization: d.minimum_slot_utilization,
        },
        None => Strategy::Direct { max_queue_delay: Duration::ZERO, minimum_slot_utilization: 0.0 },
    }
}

/// The control inputs of `sb`: each control kind given to one tensor at
/// most, each tensor carrying one kind.
fn controls(sb: &ModelSequenceBatching) -> Result<Vec<ControlInput>, String> {
    let mut controls: Vec<ControlInput> = Vec::new();
    for input in &sb.control_input {
        if input.control.is_empty() {
            return Err(format!("sequence_batching control_input '{}' has no 'control'", input.name));
        }
        for control in &input.control {
            let control = control_input(&input.name, control)?;
            if let Some(twice) = controls.iter().find(|c| c.signal == control.signal) {
                return Err(format!(
                    "sequence_batching gives control kind {} to multiple tensors, '{}' and '{}'; each kind has one \
                     tensor",
                    control.signal.kind_name(),
                    twice.name,
                    control.name
                ));
            }
            if let Some(other) = controls.iter().find(|c| c.name == control.name) {
                return Err(format!(
                    "sequence_batching: tensor '{}' carries multiple control kinds, {} and {}; a control tensor \
                     carries one kind",
                    control.name,
                    other.signal.kind_name(),
                    control.signal.kind_name()
                ));
            }
            controls.push(control);
        }
    }
    Ok(controls)
}

fn control_input(name: &str, control: &Control) -> Result<ControlInput, String> {
    let what = format!("sequence_batching control_input '{name}'");
    let kind = Kind::try_from(control.kind).map_err(|_| format!("{what}: unknown control kind {}", control.kind))?;
    let signal = match kind {
        Kind::ControlSequenceStart => Signal::Start,
        Kind::ControlSequenceEnd => Signal::End,
        Kind::ControlSequenceReady => Signal::Ready,
        Kind::ControlSequenceCorrid => Signal::CorrelationId,
    };
    if signal == Signal::CorrelationId {
        let datatype = datatype_from_config(control.data_type)
            .filter(|dt| matches!(dt, DataType::Uint64 | DataType::Int64 | DataType::Uint32 | DataType::Int32 | DataType::Bytes))
            .ok_or_else(|| {
                format!("{what}: CONTROL_SEQUENCE_CORRID needs 'data_type' TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING")
            })?;
        return Ok(ControlInput { name: name.to_owned(), signal, datatype, false_true: [Vec::new(), Vec::new()] });
    }
    let pairs = [
        (!control.int32_false_true.is_empty(), "int32_false_true"),
        (!control.fp32_false_true.is_empty(), "fp32_false_true"),
        (!control.bool_false_true.is_empty(), "bool_false_true"),
    ];
    let given: Vec<&str> = pairs.iter().filter(|(set, _)| *set).map(|(_, field)| *field).collect();
    let (datatype, false_true): (DataType, Vec<Vec<u8>>) = match given.as_slice() {
        ["int32_false_true"] => {
            (DataType::Int32, control.int32_false_true.iter().map(|v| v.to_le_bytes().to_vec()).collect())
        }
        ["fp32_false_true"] => {
            (DataType::Fp32, control.fp32_false_true.iter().map(|v| v.to_le_bytes().to_vec()).collect())
        }
        ["bool_false_true"] => (DataType::Bool, control.bool_false_true.iter().map(|&v| vec![u8::from(v)]).collect()),
        _ => {
            return Err(format!(
                "{what}: {} must specify exactly one of 'int32_false_true', 'fp32_false_true' or \
                 'bool_false_true', got {given:?}",
                signal.kind_name()
            ));
        }
    };
    let [f, t]: [Vec<u8>; 2] = false_true.try_into().map_err(|v: Vec<Vec<u8>>| {
        format!("{what}: {} must hold two values, false then true, got {}", given[0], v.len())
    })?;
    Ok(ControlInput { name: name.to_owned(), signal, datatype, false_true: [f, t] })
}

fn state_spec(
    state: &crate::config::proto::model_sequence_batching::State,
    model_dir: &Path,
) -> Result<StateSpec, String> {
    let what = format!("sequence_batching state '{}'", state.input_name);
    if state.input_name.is_empty() || state.output_name.is_empty() {
        return Err("sequence_batching state needs both 'input_name' and 'output_name'".into());
    }
    let datatype = datatype_from_config(state.data_type).ok_or_else(|| format!("{what} needs a 'data_type'"))?;
    let initial = match state.initial_state.as_slice() {
        [] => zeros(&state.input_name, datatype, &state.dims.iter().map(|&d| d.max(1)).collect::<Vec<_>>()),
        [initial] => initial_state(&what, &state.input_name, datatype, initial, model_dir)?,
        more => return Err(format!("{what} has {} initial_state entries; Plinth reads one", more.len())),
    };
    Ok(StateSpec {
        input: state.input_name.clone(),
        output: state.output_name.clone(),
        datatype,
        dims: state.dims.clone(),
        initial,
    })
}

fn initial_state(
    what: &str,
    name: &str,
    datatype: DataType,
    initial: &crate::config::proto::model_sequence_batching::InitialState,
    model_dir: &Path,
) -> Result<Tensor, String> {
    use crate::config::proto::model_sequence_batching::initial_state::StateData;
    if datatype_from_config(initial.data_type) != Some(datatype) {
        return Err(format!("{what}: initial_state has a different data_type from the state"));
    }
    if initial.dims.iter().any(|&d| d < 0) {
        return Err(format!("{what}: initial_state dims {:?} must all be fixed", initial.dims));
    }
    let shape = initial.dims.clone();
    match &initial.state_data {
        Some(StateData::ZeroData(true)) => Ok(zeros(name, datatype, &shape)),
        Some(StateData::DataFile(file)) => {
            let dir = model_dir.join(INITIAL_STATE_DIR);
            let path = dir.join(file);
            if !crate::repository::is_within(&path, &dir) {
                return Err(format!("{what}: initial_state data_file '{file}' must be inside {}", dir.display()));
            }
            let data = std::fs::read(&path)
                .map_err(|e| format!("{what}: cannot read initial_state data_file {}: {e}", path.display()))?;
            let data = string_state(datatype, &shape, data);
            let tensor = Tensor { name: name.to_owned(), datatype, shape, data };
            tensor.check_data().map_err(|e| format!("{what}: initial_state data_file {}: {e}", path.display()))?;
            Ok(tensor)
        }
        _ => Err(format!(
            "{what}: initial_state needs 'zero_data: true' or a 'data_file' (in {INITIAL_STATE_DIR}/ of the model folder, see {CONFIG_FILE})"
        )),
    }
}

/// The data of a `TYPE_STRING` initial state file: the serialized form (a
/// 4-byte little-endian length before each element, as the v2 binary
/// protocol has it) as it is; for a state of one element, a file in any
/// other form is that element's bytes (a plain text file holds the initial
/// string). Other datatypes are raw little-endian elements, unchanged.
fn string_state(datatype: DataType, shape: &[i64], data: Vec<u8>) -> Vec<u8> {
    let count = crate::tensor::element_count(shape);
    let serialized = crate::tensor::bytes_elements(&data).is_some_and(|items| Some(items.len()) == count);
    if datatype != DataType::Bytes || serialized || count != Some(1) {
        return data;
    }
    let mut element = Vec::with_capacity(data.len() + 4);
    crate::tensor::push_bytes_element(&mut element, &data);
    element
}

/// A tensor of `shape` whose every element is zero (for `BYTES`, empty).
pub fn zeros(name: &str, datatype: DataType, shape: &[i64]) -> Tensor {
    let count = crate::tensor::element_count(shape).unwrap_or(0);
    let size = datatype.element_size().unwrap_or(4);
    Tensor { name: name.to_owned(), datatype, shape: shape.to_vec(), data: vec![0; count * size] }
}

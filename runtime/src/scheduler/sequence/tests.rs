//! The sequence batcher over an accumulating fake model with implicit
//! state: `OUTPUT = INPUT + (READY and not START) * INPUT_STATE`, and
//! `OUTPUT_STATE = OUTPUT`, as Triton's QA sequence models compute.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::*;
use crate::backend::fake::Gate;
use crate::backend::{Description, ModelIo};
use crate::metrics::Metrics;
use crate::tensor::DataType;

/// The accumulator; records the READY column of every execution.
struct Accumulator {
    description: Description,
    gate: Option<Arc<Gate>>,
    ready: Mutex<Vec<Vec<i32>>>,
}

fn ints(t: &Tensor) -> Vec<i32> {
    t.data.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn int_tensor(name: &str, values: &[i32]) -> Tensor {
    Tensor {
        name: name.into(),
        datatype: DataType::Int32,
        shape: vec![values.len() as i64, 1],
        data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

impl Accumulator {
    fn new(gate: Option<Arc<Gate>>) -> Accumulator {
        let io = |name: &str| ModelIo {
            name: name.into(),
            datatype: Some(DataType::Int32),
            type_name: "INT32".into(),
            shape: vec![-1, 1],
        };
        let inputs = ["INPUT", "INPUT_STATE", "START", "READY"].map(io).to_vec();
        let description = Description::of_test(inputs, vec![io("OUTPUT"), io("OUTPUT_STATE")]);
        Accumulator { description, gate, ready: Mutex::default() }
    }
}

impl Backend for Accumulator {
    fn description(&self) -> &Description {
        &self.description
    }

    fn execute(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, BackendError> {
        if let Some(gate) = &self.gate {
            gate.pass();
        }
        let get = |name: &str| ints(inputs.iter().find(|t| t.name == name).expect("every input is given"));
        let (input, state, start, ready) = (get("INPUT"), get("INPUT_STATE"), get("START"), get("READY"));
        self.ready.lock().push(ready.clone());
        // As a framework refuses an input it cannot process.
        if input.contains(&-1) {
            return Err(BackendError::InvalidInput("-1 is not a number this model takes".into()));
        }
        let out: Vec<i32> =
            (0..input.len()).map(|r| input[r] + if ready[r] == 1 && start[r] == 0 { state[r] } else { 0 }).collect();
        Ok(vec![int_tensor("OUTPUT", &out), int_tensor("OUTPUT_STATE", &out)])
    }
}

struct Fixture {
    scheduler: Arc<SequenceScheduler>,
    backend: Arc<Accumulator>,
    metrics: ModelMetrics,
}

const CONTROLS: &str = r#"
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
  state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] } ]"#;

/// One accumulator instance with `max_batch_size` and the rest of
/// `sequence_batching` (`strategy_and_idle`), gated when `gate` is given.
fn fixture(max_batch_size: usize, strategy_and_idle: &str, gate: Option<Arc<Gate>>) -> Fixture {
    let text = format!("max_batch_size: {max_batch_size} sequence_batching {{ {strategy_and_idle} {CONTROLS} }}");
    let config = crate::config::parse(&text).unwrap();
    let policy = SequencePolicy::from_config(&config, Path::new("/nonexistent")).unwrap().unwrap();
    let backend = Arc::new(Accumulator::new(gate));
    let metrics = Metrics::new().for_model("acc", 1);
    let instances: Vec<Arc<dyn Backend>> = vec![backend.clone()];
    let scheduler = Arc::new(SequenceScheduler::start("acc", policy, instances, metrics.clone(), None));
    Fixture { scheduler, backend, metrics }
}

impl Fixture {
    fn send(&self, id: u64, value: i32, flags: &str) -> tokio::task::JoinHandle<Result<i32, Error>> {
        let scheduler = self.scheduler.clone();
        let sequence = SequenceRequest {
            id: CorrelationId::Uint(id),
            start: flags.contains("start"),
            end: flags.contains("end"),
            owner: None,
        };
        tokio::spawn(async move {
            let (outputs, _) = scheduler.submit(vec![int_tensor("INPUT", &[value])], sequence).await?;
            assert_eq!(outputs.len(), 1, "the state output is the host's, not the client's");
            Ok(ints(&outputs[0])[0])
        })
    }

    async fn run(&self, id: u64, value: i32, flags: &str) -> Result<i32, Error> {
        self.send(id, value, flags).await.unwrap()
    }

    /// Waits until `n` sequences are open.
    fn wait_for_active(&self, n: i64) {
        let deadline = Instant::now() + HANG_GUARD;
        while self.metrics.sequences_active().get() != n {
            assert!(Instant::now() < deadline, "{} sequences open, not {n}", self.metrics.sequences_active().get());
            std::thread::yield_now();
        }
    }

    fn wait_for_pending(&self, n: i64) {
        let deadline = Instant::now() + HANG_GUARD;
        while self.metrics.pending().get() != n {
            assert!(Instant::now() < deadline, "{} queued, not {n}", self.metrics.pending().get());
            std::thread::yield_now();
        }
    }
}

/// docs/scheduling.md: a failed request leaves its sequence's implicit
/// state as it was, and the sequence goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_request_leaves_the_sequence_s_state_as_it_was() {
    for strategy in ["direct { }", "oldest { max_candidate_sequences: 4 }"] {
        let f = fixture(2, strategy, None);
        assert_eq!(f.run(1, 10, "start").await, Ok(10));
        assert!(f.run(1, -1, "").await.is_err(), "{strategy}: the model refuses -1");
        assert_eq!(f.run(1, 1, "").await, Ok(11), "{strategy}: the state is still 10");
        assert_eq!(f.run(1, 2, "end").await, Ok(13), "{strategy}");
        f.wait_for_active(0);
    }
}

/// docs/scheduling.md: when the model refuses a batch's input, each
/// request runs alone, so only the one at fault fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_shared_execution_fails_only_the_request_at_fault() {
    let gate = Gate::closed();
    let f = fixture(2, "oldest { max_candidate_sequences: 4 }", Some(gate.clone()));
    let first = f.send(1, 10, "start");
    gate.wait_for_waiters(1);
    let (other, faulty) = (f.send(2, 100, "start"), f.send(1, -1, ""));
    f.wait_for_pending(2);
    gate.open();
    assert_eq!(first.await.unwrap(), Ok(10));
    assert_eq!(other.await.unwrap(), Ok(100), "the other sequence's request is answered");
    assert!(faulty.await.unwrap().is_err());
    let rows: Vec<usize> = f.backend.ready.lock().iter().map(Vec::len).collect();
    assert_eq!(rows, [1, 2, 1, 1], "the pair was refused, then each ran alone");
    assert_eq!(f.run(1, 1, "end").await, Ok(11), "sequence 1's state is still 10");
    assert_eq!(f.run(2, 5, "end").await, Ok(105));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_accumulates_within_a_sequence_and_never_leaks_into_another() {
    for strategy in ["direct { }", "oldest { max_candidate_sequences: 4 }"] {
        let f = fixture(2, strategy, None);
        assert_eq!(f.run(1, 10, "start").await, Ok(10));
        assert_eq!(f.run(2, 100, "start").await, Ok(100));
        assert_eq!(f.run(1, 1, "").await, Ok(11), "{strategy}");
        assert_eq!(f.run(2, 5, "end").await, Ok(105), "{strategy}");
        assert_eq!(f.run(1, 2, "end").await, Ok(13), "{strategy}");
        // The same id starts afresh.
        assert_eq!(f.run(1, 7, "start,end").await, Ok(7), "{strategy}");
        f.wait_for_active(0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_outside_an_open_sequence_get_triton_s_errors() {
    let f = fixture(2, "", None);
    let e = f.run(37, 1, "").await.unwrap_err().to_string();
    assert!(
        e.starts_with(
            "inference request for sequence 37 to model 'acc' must specify the START flag on the first request of the sequence"
        ),
        "{e}"
    );
    let e = f.run(0, 1, "start").await.unwrap_err().to_string();
    assert!(
        e.starts_with("inference request to model 'acc' must specify a non-zero or non-empty correlation ID"),
        "{e}"
    );
    let two_rows = SequenceRequest { id: CorrelationId::Text("s".into()), start: true, end: false, owner: None };
    let e = f.scheduler.submit(vec![int_tensor("INPUT", &[1, 2])], two_rows).await.unwrap_err().to_string();
    assert!(e.starts_with("inference request to model 'acc' must specify batch-size 1"), "{e}");
    assert_eq!(f.run(3, 1, "start").await, Ok(1));
    assert_eq!(f.run(3, 2, "end").await, Ok(3));
    let e = f.run(3, 55, "").await.unwrap_err().to_string();
    assert!(e.starts_with("inference request for sequence 3 to model 'acc' must specify the START flag"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sequence_is_released_and_a_late_request_is_told_why() {
    let f = fixture(1, "max_sequence_idle_microseconds: 1000", None);
    assert_eq!(f.run(9, 1, "start").await, Ok(1));
    f.wait_for_active(0);
    let e = f.run(9, 2, "").await.unwrap_err().to_string();
    assert!(e.contains("must specify the START flag") && e.contains("max_sequence_idle_microseconds"), "{e}");
    let text = crate::metrics::Metrics::new().render();
    assert!(!text.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_keeps_each_sequence_at_its_row_and_pads_idle_slots_with_ready_false() {
    let f = fixture(2, "direct { }", None);
    assert_eq!(f.run(1, 1, "start").await, Ok(1));
    assert_eq!(f.run(2, 2, "start").await, Ok(2));
    assert_eq!(f.run(1, 1, "end").await, Ok(2));
    assert_eq!(f.run(2, 3, "end").await, Ok(5));
    let ready = f.backend.ready.lock().clone();
    assert_eq!(ready, [vec![1], vec![0, 1], vec![1], vec![0, 1]], "sequence 2 always runs at row 1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_sequence_waits_for_a_free_slot() {
    let gate = Gate::closed();
    let f = fixture(1, "", Some(gate.clone()));
    let first = f.send(1, 1, "start");
    gate.wait_for_waiters(1);
    let waiting = f.send(2, 5, "start,end");
    f.wait_for_pending(1);
    let end = f.send(1, 2, "end");
    f.wait_for_pending(2);
    gate.open();
    assert_eq!(first.await.unwrap(), Ok(1));
    assert_eq!(end.await.unwrap(), Ok(3));
    assert_eq!(waiting.await.unwrap(), Ok(5));
    let ready = f.backend.ready.lock().len();
    assert_eq!(ready, 3, "one slot: three executions, one row each");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_request_ends_its_sequence_and_frees_its_slot() {
    let gate = Gate::closed();
    let f = fixture(1, "", Some(gate.clone()));
    let running = f.send(1, 1, "start");
    gate.wait_for_waiters(1);
    let abandoned = f.send(1, 2, "");
    f.wait_for_pending(1);
    abandoned.abort();
    f.wait_for_active(0);
    gate.open();
    assert_eq!(running.await.unwrap(), Ok(1));
    let e = f.run(1, 3, "").await.unwrap_err().to_string();
    assert!(e.contains("must specify the START flag") && e.contains("cancelled"), "{e}");
    assert_eq!(f.run(2, 4, "start,end").await, Ok(4), "the slot is free again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_owner_releases_a_sequence_and_unloading_ends_the_rest() {
    let f = fixture(2, "", None);
    let start = |id: u64, owner| SequenceRequest { id: CorrelationId::Uint(id), start: true, end: false, owner };
    f.scheduler.submit(vec![int_tensor("INPUT", &[1])], start(1, Some(7))).await.unwrap();
    f.scheduler.submit(vec![int_tensor("INPUT", &[2])], start(2, None)).await.unwrap();
    f.scheduler.release(&CorrelationId::Uint(1), 8, SequenceEnd::Cancelled);
    f.scheduler.release(&CorrelationId::Uint(2), 7, SequenceEnd::Cancelled);
    assert_eq!(f.metrics.sequences_active().get(), 2, "someone else's release changes nothing");
    f.scheduler.release(&CorrelationId::Uint(1), 7, SequenceEnd::Cancelled);
    f.wait_for_active(1);
    assert_eq!(f.run(2, 5, "").await, Ok(7), "the other sequence goes on");
    let Fixture { scheduler, metrics, .. } = f;
    drop(Arc::into_inner(scheduler).expect("no other handle"));
    assert_eq!(metrics.sequences_active().get(), 0, "unloading ends the open sequences");
}

#[test]
fn a_string_id_or_a_wide_id_is_refused_by_an_integer_corrid_control() {
    let text = "max_batch_size: 1 sequence_batching { control_input [ { name: \"C\" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT32 } ] } ] }";
    let config = crate::config::parse(text).unwrap();
    let policy = SequencePolicy::from_config(&config, Path::new("/nonexistent")).unwrap().unwrap();
    let shared = Shared::new("m", policy, 1, Metrics::new().for_model("m", 1));
    let request = |id| SequenceRequest { id, start: true, end: false, owner: None };
    let input = [int_tensor("INPUT", &[1])];
    let e = shared.check_request(&input, &request(CorrelationId::Text("a".into()))).unwrap_err().to_string();
    assert!(e.contains("takes integer correlation IDs") && e.contains("INT32"), "{e}");
    let e = shared.check_request(&input, &request(CorrelationId::Uint(1 << 40))).unwrap_err().to_string();
    assert!(e.contains("takes 32-bit correlation IDs"), "{e}");
    assert!(shared.check_request(&input, &request(CorrelationId::new_host())).is_ok(), "host ids fit any control");
}

#[test]
fn control_inputs_are_checked_with_the_configuration_naming_the_kind_and_tensors() {
    let control = |name: &str, kind: &str, values: &str| {
        format!(r#"{{ name: "{name}" control [ {{ kind: CONTROL_SEQUENCE_{kind} {values} }} ] }}"#)
    };
    let pair = "int32_false_true: [ 0, 1 ]";
    let refusal = |inputs: &[String]| {
        let text = format!("max_batch_size: 8 sequence_batching {{ control_input [ {} ] }}", inputs.join(", "));
        let config = crate::config::parse(&text).unwrap();
        let checked = SequencePolicy::check_config(&config).unwrap_err();
        let loaded = SequencePolicy::from_config(&config, Path::new("/nonexistent")).unwrap_err();
        assert_eq!(checked, loaded, "the check and the load apply one rule");
        checked
    };
    let e = refusal(&[control("START", "START", pair), control("END0", "END", pair), control("END1", "END", pair)]);
    assert_eq!(
        e,
        "sequence_batching gives control kind CONTROL_SEQUENCE_END to multiple tensors, 'END0' and 'END1'; each kind \
         has one tensor"
    );
    let e = refusal(&[control("START", "START", pair), control("START", "READY", pair)]);
    assert_eq!(
        e,
        "sequence_batching: tensor 'START' carries multiple control kinds, CONTROL_SEQUENCE_START and \
         CONTROL_SEQUENCE_READY; a control tensor carries one kind"
    );
    let e = refusal(&[control("START", "START", pair), control("READY", "READY", "")]);
    assert_eq!(
        e,
        "sequence_batching control_input 'READY': CONTROL_SEQUENCE_READY must specify exactly one of \
         'int32_false_true', 'fp32_false_true' or 'bool_false_true', got []"
    );
    let ok = format!("max_batch_size: 8 sequence_batching {{ {CONTROLS} }}");
    assert_eq!(SequencePolicy::check_config(&crate::config::parse(&ok).unwrap()), Ok(()));
}

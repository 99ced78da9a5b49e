//! A backend for unit tests (only built for tests): one FP32 input `x` and
//! one FP32 output `y = 2x`, both `[-1, 1]`. It counts its executions and
//! the rows of each, refuses a batch holding the value -1 (as a framework
//! refuses an input it cannot process), and can be held at a [`Gate`] so a
//! test decides when an execution finishes, instead of waiting for time.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::{Backend, BackendError, Description, ModelIo};
use crate::tensor::{DataType, Tensor};

/// How long a unit test waits for an event before it fails: far above
/// any wait of working code on a loaded machine, far below CI's limit.
pub const HANG_GUARD: std::time::Duration = std::time::Duration::from_secs(120);

/// Holds executions until the test opens it; counts who waits.
#[derive(Default)]
pub struct Gate {
    state: Mutex<(bool, usize)>,
    changed: Condvar,
}

impl Gate {
    /// A closed gate.
    pub fn closed() -> Arc<Gate> {
        Arc::new(Gate::default())
    }

    /// Lets every waiting and later execution through.
    pub fn open(&self) {
        self.state.lock().0 = true;
        self.changed.notify_all();
    }

    /// Blocks until `n` executions wait at the gate.
    ///
    /// # Panics
    /// After [`HANG_GUARD`] without them: the code under test lost an
    /// execution, and the test fails instead of hanging `cargo test`.
    pub fn wait_for_waiters(&self, n: usize) {
        let deadline = std::time::Instant::now() + HANG_GUARD;
        let mut state = self.state.lock();
        while state.1 < n {
            if self.changed.wait_until(&mut state, deadline).timed_out() {
                panic!("{} of {n} executions reached the gate within {HANG_GUARD:?}", state.1);
            }
        }
    }

    /// Waits at the gate (counted as a waiter) until it is open.
    pub fn pass(&self) {
        let mut state = self.state.lock();
        state.1 += 1;
        self.changed.notify_all();
        while !state.0 {
            self.changed.wait(&mut state);
        }
        state.1 -= 1;
    }
}

/// The doubling backend.
pub struct Doubler {
    description: Description,
    gate: Option<Arc<Gate>>,
    /// The rows of each execution, in order.
    pub executions: Mutex<Vec<usize>>,
    /// The name of the thread of each execution, in order.
    pub threads: Mutex<Vec<Option<String>>>,
}

impl Doubler {
    /// A doubler whose executions wait at `gate` (when given).
    pub fn gated(gate: Option<Arc<Gate>>) -> Doubler {
        let io = |name: &str| ModelIo {
            name: name.into(),
            datatype: Some(DataType::Fp32),
            type_name: "FP32".into(),
            shape: vec![-1, 1],
        };
        let description = Description::of_test(vec![io("x")], vec![io("y")]);
        Doubler { description, gate, executions: Mutex::default(), threads: Mutex::default() }
    }

    /// One request's input: `values` as `x` of shape `[rows, 1]`.
    pub fn input(values: &[f32]) -> Vec<Tensor> {
        vec![Tensor {
            name: "x".into(),
            datatype: DataType::Fp32,
            shape: vec![values.len() as i64, 1],
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }]
    }

    /// The values of an FP32 tensor.
    pub fn values(t: &Tensor) -> Vec<f32> {
        t.data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    }
}

impl Default for Doubler {
    /// A doubler that runs at once.
    fn default() -> Doubler {
        Doubler::gated(None)
    }
}

impl Backend for Doubler {
    fn description(&self) -> &Description {
        &self.description
    }

    fn execute(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, BackendError> {
        if let Some(gate) = &self.gate {
            gate.pass();
        }
        let x = &inputs[0];
        let values = Doubler::values(x);
        self.executions.lock().push(x.shape[0] as usize);
        self.threads.lock().push(std::thread::current().name().map(str::to_owned));
        if values.contains(&-1.0) {
            return Err(BackendError::InvalidInput("-1 is not a number this model takes".into()));
        }
        let data = values.iter().flat_map(|v| (2.0 * v).to_le_bytes()).collect();
        Ok(vec![Tensor { name: "y".into(), datatype: DataType::Fp32, shape: x.shape.clone(), data }])
    }
}

impl Description {
    /// What a unit test's backend declares: an ONNX model with these
    /// tensors.
    pub fn of_test(inputs: Vec<ModelIo>, outputs: Vec<ModelIo>) -> Description {
        Description {
            kind: crate::backend::BackendKind::OnnxRuntime,
            platform: "onnxruntime_onnx".into(),
            inputs,
            outputs,
            metadata: Vec::new(),
            remote: false,
        }
    }
}

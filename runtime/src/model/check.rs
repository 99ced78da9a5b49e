//! Checks that keep bad tensors away from the backend: the configuration
//! against the model file at load, and each request against the signature.

use super::scheduling::Scheduling;
use crate::backend::ModelIo;
use crate::config::{CONFIG_FILE, Signature, config_type_name};
use crate::error::Error;
use crate::scheduler::ragged::BatchLayout;
use crate::scheduler::sequence::policy::SequencePolicy;
use crate::tensor::{Tensor, TensorSpec};

/// The model file's inputs and outputs as requests send and receive them
/// (`sig` is the configuration's): without the sequence controls and state
/// the host fills in and takes out, each of which must be a model input
/// (state: and output) of the datatype the host gives it; without the
/// batch inputs the host synthesises, each of which must be a model input
/// of its datatype and rank; a ragged input, which the model must take as
/// `[-1]`, and a batch output, whose shape in the model file is free, in
/// the shape the configuration gives them.
///
/// # Errors
/// A message naming the control, state or batch input the model lacks or
/// has with another datatype or rank, or the ragged input the model does
/// not take as `[-1]` (Triton's onnxruntime backend's words).
pub fn client_tensors(
    scheduling: &Scheduling,
    sig: &Signature,
    inputs: &[ModelIo],
    outputs: &[ModelIo],
) -> Result<(Vec<ModelIo>, Vec<ModelIo>), String> {
    let (mut inputs, mut outputs) = match scheduling {
        Scheduling::Sequence(policy) => sequence_tensors(policy, inputs, outputs)?,
        Scheduling::Dynamic(_) => (inputs.to_vec(), outputs.to_vec()),
    };
    ragged_tensors(scheduling.layout(), sig, &mut inputs, &mut outputs)?;
    Ok((inputs, outputs))
}

fn sequence_tensors(
    policy: &SequencePolicy,
    inputs: &[ModelIo],
    outputs: &[ModelIo],
) -> Result<(Vec<ModelIo>, Vec<ModelIo>), String> {
    let host_input =
        |name: &str, datatype, what: &str| -> Result<(), String> { host_tensor(inputs, name, datatype, what, "input") };
    for control in &policy.controls {
        host_input(&control.name, control.datatype, "sequence_batching control")?;
    }
    for state in &policy.states {
        host_input(&state.input, state.datatype, "sequence_batching state")?;
        host_tensor(outputs, &state.output, state.datatype, "sequence_batching state", "output")?;
    }
    let host_inputs = policy.host_inputs();
    let state_outputs: Vec<&str> = policy.states.iter().map(|s| s.output.as_str()).collect();
    Ok((
        inputs.iter().filter(|io| !host_inputs.contains(&io.name.as_str())).cloned().collect(),
        outputs.iter().filter(|io| !state_outputs.contains(&io.name.as_str())).cloned().collect(),
    ))
}

/// The batch inputs checked and taken out of `inputs`; ragged inputs and
/// batch outputs checked and given the shapes clients use.
fn ragged_tensors(
    layout: &BatchLayout,
    sig: &Signature,
    inputs: &mut Vec<ModelIo>,
    outputs: &mut [ModelIo],
) -> Result<(), String> {
    let batch = sig.max_batch_size > 0;
    for bi in layout.batch_inputs() {
        let what = format!("batch_input {}", bi.kind.name());
        for target in &bi.targets {
            host_tensor(inputs, target, bi.datatype, &what, "input")?;
            let Some(io) = inputs.iter().find(|io| io.name == *target) else { continue };
            let given: Vec<i64> = std::iter::once(-1).chain(bi.dims()).collect();
            let fits = io.shape.len() == given.len()
                && io.shape.iter().zip(&given).all(|(&have, &give)| have < 0 || give < 0 || have == give);
            if !fits {
                return Err(format!(
                    "{what} input '{target}' gets shape {given:?} (-1: any size), but the model's input has shape {:?}",
                    io.shape
                ));
            }
        }
    }
    inputs.retain(|io| !layout.batch_inputs().iter().any(|bi| bi.targets.contains(&io.name)));
    for io in inputs.iter_mut().filter(|io| layout.is_ragged(&io.name)) {
        if io.shape != [-1] {
            return Err(format!(
                "configuration expects model provides input with shape [-1] for ragged input '{}', model provides {:?}",
                io.name, io.shape
            ));
        }
        if let Some(spec) = sig.inputs.iter().find(|s| s.name == io.name) {
            io.shape = ModelIo::from_spec(spec, batch).shape;
        }
    }
    for io in outputs.iter_mut().filter(|io| layout.is_batch_output(&io.name)) {
        if let Some(spec) = sig.outputs.iter().find(|s| s.name == io.name) {
            io.shape = ModelIo::from_spec(spec, batch).shape;
        }
    }
    Ok(())
}

fn host_tensor(
    tensors: &[ModelIo],
    name: &str,
    datatype: crate::tensor::DataType,
    what: &str,
    kind: &str,
) -> Result<(), String> {
    let io = tensors.iter().find(|io| io.name == name).ok_or_else(|| {
        let names: Vec<_> = tensors.iter().map(|io| io.name.as_str()).collect();
        format!("{what} names {kind} '{name}', but the model's {kind}s are {names:?}")
    })?;
    match io.datatype {
        Some(dt) if dt == datatype => Ok(()),
        _ => Err(format!("{what} {kind} '{name}' is {datatype} in {CONFIG_FILE}, but the model's is {}", io.type_name)),
    }
}

/// Checks the configuration's inputs and outputs against the model file's:
/// the configuration declares all of the model's inputs or none, and every
/// configured tensor exists with the same datatype and rank, its fixed
/// dimensions (after `reshape`) agree, and a batching model really has a
/// variable first dimension. When the configuration declares no inputs
/// (or no outputs), they come from the model file (Triton's auto-complete).
///
/// # Errors
/// A message naming the tensor and both values.
pub fn complete_and_check(sig: &mut Signature, inputs: &[ModelIo], outputs: &[ModelIo]) -> Result<(), String> {
    let batch = sig.max_batch_size > 0;
    if let Some(optional) = sig.inputs.iter().find(|s| s.optional && batch) {
        return Err(format!(
            "optional input '{}' is not supported for models that batch (max_batch_size > 0)",
            optional.name
        ));
    }
    // Optional inputs are initializers of the model that a request may
    // override; the others must be the model's inputs, all of them.
    let required = sig.inputs.iter().filter(|s| !s.optional).count();
    if !sig.inputs.is_empty() && required != inputs.len() {
        let names: Vec<_> = inputs.iter().map(|io| io.name.as_str()).collect();
        return Err(format!(
            "the model provides {} inputs ({names:?}), but the configuration expects {required} required inputs: \
             declare every input in {CONFIG_FILE}, or none to take them from the model",
            inputs.len()
        ));
    }
    for (declared, actual, kind) in [(&mut sig.inputs, inputs, "input"), (&mut sig.outputs, outputs, "output")] {
        if declared.is_empty() {
            *declared = actual.iter().map(|io| spec_from_model(io, batch, kind)).collect::<Result<_, _>>()?;
            continue;
        }
        for spec in declared.iter() {
            if spec.optional && !actual.iter().any(|io| io.name == spec.name) {
                continue;
            }
            let io = actual.iter().find(|io| io.name == spec.name).ok_or_else(|| {
                let names: Vec<_> = actual.iter().map(|io| io.name.as_str()).collect();
                format!(
                    "unexpected {kind} '{}' in {CONFIG_FILE}: the {kind}s the model allows are {names:?}",
                    spec.name
                )
            })?;
            check_tensor(spec, io, batch, kind)?;
        }
    }
    Ok(())
}

/// Checks what a backend returned against the signature: no output twice,
/// each declared output with its declared datatype and rank, fixed
/// dimensions as declared, and, when `rows` is given (a batching model), a
/// first dimension of that many rows. A remote server or a TorchScript file
/// can return anything, so this runs on every answer.
///
/// # Errors
/// A message naming the output and both values.
pub fn check_outputs(sig: &Signature, outputs: &[Tensor], rows: Option<i64>) -> Result<(), String> {
    for (i, t) in outputs.iter().enumerate() {
        if outputs[..i].iter().any(|o| o.name == t.name) {
            return Err(format!("output '{}' twice", t.name));
        }
        let Some(spec) = sig.outputs.iter().find(|s| s.name == t.name) else { continue };
        if t.datatype != spec.datatype {
            return Err(format!("output '{}' as {}, but it is declared {}", t.name, t.datatype, spec.datatype));
        }
        let dims = match rows {
            Some(n) if t.shape.first() != Some(&n) => {
                return Err(format!("output '{}' with shape {:?} for a request of {n} rows", t.name, t.shape));
            }
            Some(_) => &t.shape[1..],
            None => &t.shape[..],
        };
        let fits =
            dims.len() == spec.dims.len() && spec.dims.iter().zip(dims).all(|(&want, &got)| want < 0 || want == got);
        if !fits {
            return Err(format!(
                "output '{}' with shape {:?}, but it is declared with dims {:?}",
                t.name, t.shape, spec.dims
            ));
        }
    }
    Ok(())
}

fn spec_from_model(io: &ModelIo, batch: bool, kind: &str) -> Result<TensorSpec, String> {
    let datatype = io.datatype.ok_or_else(|| {
        format!("model {kind} '{}' has type {}, which the v2 protocol cannot carry", io.name, io.type_name)
    })?;
    let dims = if batch { io.shape.get(1..).unwrap_or_default().to_vec() } else { io.shape.clone() };
    Ok(TensorSpec::new(&io.name, datatype, &dims))
}

fn check_tensor(spec: &TensorSpec, io: &ModelIo, batch: bool, kind: &str) -> Result<(), String> {
    let name = &spec.name;
    if io.datatype != Some(spec.datatype) {
        let actual = io.datatype.map_or_else(|| io.type_name.clone(), |d| config_type_name(d).to_owned());
        return Err(format!(
            "{kind} '{name}': unexpected datatype: {CONFIG_FILE} says data_type {}, but the model's {kind} is {actual}",
            config_type_name(spec.datatype)
        ));
    }
    let model_dims = if batch {
        match io.shape.first() {
            Some(-1) => &io.shape[1..],
            Some(&d) => {
                return Err(format!(
                    "{kind} '{name}': max_batch_size > 0 is specified, but the model does not support batching: that \
                     needs a variable first (batch) dimension, and the model's shape is {:?} (first dimension {d})",
                    io.shape
                ));
            }
            None => return Err(format!("{kind} '{name}': max_batch_size > 0, but the model's {kind} is a scalar")),
        }
    } else {
        &io.shape[..]
    };
    // With a reshape, the backend sees the reshape's dimensions.
    let (declared, field) = match &spec.reshape {
        Some(reshape) => (reshape.as_slice(), "reshape"),
        None => (spec.dims.as_slice(), "dims"),
    };
    // The shape the configuration gives the backend: the batch dimension
    // first when max_batch_size > 0, then dims (or reshape).
    let complete = || {
        let batch_dim = if batch { "the batch dimension, as max_batch_size > 0, then " } else { "" };
        let full: Vec<i64> = batch.then_some(-1).into_iter().chain(declared.iter().copied()).collect();
        format!("{batch_dim}{field} {declared:?}: complete shape {full:?}")
    };
    if model_dims.len() != declared.len() {
        return Err(format!(
            "{kind} '{name}': the model expects {} dimensions (shape {:?}) but the configuration specifies {} ({})",
            io.shape.len(),
            io.shape,
            declared.len() + usize::from(batch),
            complete()
        ));
    }
    for (i, (&want, &have)) in declared.iter().zip(model_dims).enumerate() {
        if have >= 0 && want != have {
            return Err(format!(
                "{kind} '{name}': the model expects shape {:?} but the configuration specifies {}; dimension {i} is \
                 {want} in {CONFIG_FILE} but {have} in the model",
                io.shape,
                complete()
            ));
        }
    }
    Ok(())
}

/// Checks request inputs against the signature: each declared input is
/// present exactly once, with the declared datatype, rank and fixed
/// dimensions, a batch size of 1 to `max_batch_size`, and data that fills
/// the shape.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the tensor, what was expected and what
/// was received.
pub fn check_inputs(sig: &Signature, model: &str, inputs: &[Tensor]) -> Result<(), Error> {
    let bad = |m: String| Error::InvalidArgument(format!("model '{model}': {m}"));
    for t in inputs {
        if inputs.iter().filter(|u| u.name == t.name).count() > 1 {
            return Err(bad(format!("input '{}' is given more than once", t.name)));
        }
        let spec = sig.inputs.iter().find(|s| s.name == t.name).ok_or_else(|| {
            let names: Vec<_> = sig.inputs.iter().map(|s| s.name.as_str()).collect();
            bad(format!("unexpected input '{}'; the model's inputs are {names:?}", t.name))
        })?;
        if t.datatype != spec.datatype {
            return Err(bad(format!("input '{}' must be {}, got {}", t.name, spec.datatype, t.datatype)));
        }
        let expected = sig.full_shape(spec);
        let fits = t.shape.len() == expected.len()
            && t.shape.iter().zip(&expected).all(|(&got, &want)| got >= 0 && (want < 0 || got == want));
        if !fits {
            return Err(bad(format!(
                "input '{}' must have shape {expected:?} (-1: any size), got {:?}",
                t.name, t.shape
            )));
        }
        if sig.max_batch_size > 0 && !(1..=i64::from(sig.max_batch_size)).contains(&t.shape[0]) {
            return Err(bad(format!(
                "input '{}' has batch size {}, but max_batch_size is {}",
                t.name, t.shape[0], sig.max_batch_size
            )));
        }
        t.check_data().map_err(bad)?;
    }
    if let Some(missing) = sig.inputs.iter().find(|s| !s.optional && !inputs.iter().any(|t| t.name == s.name)) {
        return Err(bad(format!("input '{}' is missing", missing.name)));
    }
    if sig.max_batch_size > 0 {
        let sizes: Vec<_> = inputs.iter().map(|t| (t.name.as_str(), t.shape[0])).collect();
        if sizes.iter().any(|&(_, b)| b != sizes[0].1) {
            return Err(bad(format!("inputs have different batch sizes (first dimensions) {sizes:?}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DataType;

    fn io(name: &str, shape: &[i64]) -> ModelIo {
        ModelIo {
            name: name.into(),
            datatype: Some(DataType::Fp32),
            type_name: "tensor(float)".into(),
            shape: shape.to_vec(),
        }
    }

    fn sig(dims: &[i64], batch: u32) -> Signature {
        Signature { max_batch_size: batch, inputs: vec![TensorSpec::new("x", DataType::Fp32, dims)], outputs: vec![] }
    }

    #[test]
    fn returned_outputs_must_have_the_declared_type_shape_and_rows_and_come_once() {
        let mut signature = sig(&[2], 8);
        signature.outputs = vec![TensorSpec::new("y", DataType::Fp32, &[2])];
        let y = |datatype, shape: &[i64]| Tensor { name: "y".into(), datatype, shape: shape.to_vec(), data: vec![] };
        assert!(check_outputs(&signature, &[y(DataType::Fp32, &[3, 2])], Some(3)).is_ok());
        let err = check_outputs(&signature, &[y(DataType::Int64, &[3, 2])], Some(3)).unwrap_err();
        assert!(err.contains("as INT64, but it is declared FP32"), "{err}");
        let err = check_outputs(&signature, &[y(DataType::Fp32, &[1, 2])], Some(3)).unwrap_err();
        assert!(err.contains("shape [1, 2] for a request of 3 rows"), "{err}");
        let err = check_outputs(&signature, &[y(DataType::Fp32, &[3, 5])], Some(3)).unwrap_err();
        assert!(err.contains("declared with dims [2]"), "{err}");
        let err = check_outputs(&signature, &[y(DataType::Fp32, &[3, 2]), y(DataType::Fp32, &[3, 2])], Some(3));
        assert!(err.unwrap_err().contains("twice"));
    }

    #[test]
    fn config_must_match_the_model_file() {
        let model = [io("x", &[-1, 3, -1, -1])];
        assert!(complete_and_check(&mut sig(&[3, 48, -1], 8), &model, &[]).is_ok());

        let err = complete_and_check(&mut sig(&[4, 48, -1], 8), &model, &[]).unwrap_err();
        assert_eq!(
            err,
            "input 'x': the model expects shape [-1, 3, -1, -1] but the configuration specifies the batch dimension, \
             as max_batch_size > 0, then dims [4, 48, -1]: complete shape [-1, 4, 48, -1]; dimension 0 is 4 in \
             config.pbtxt but 3 in the model"
        );

        let err = complete_and_check(&mut sig(&[3, 48], 8), &model, &[]).unwrap_err();
        assert_eq!(
            err,
            "input 'x': the model expects 4 dimensions (shape [-1, 3, -1, -1]) but the configuration specifies 3 (the \
             batch dimension, as max_batch_size > 0, then dims [3, 48]: complete shape [-1, 3, 48])"
        );
        let err = complete_and_check(&mut sig(&[3, 48], 0), &model, &[]).unwrap_err();
        assert_eq!(
            err,
            "input 'x': the model expects 4 dimensions (shape [-1, 3, -1, -1]) but the configuration specifies 2 \
             (dims [3, 48]: complete shape [3, 48])"
        );

        let fixed_batch = [io("x", &[1, 3, 48, 48])];
        let err = complete_and_check(&mut sig(&[3, 48, 48], 8), &fixed_batch, &[]).unwrap_err();
        assert!(err.contains("max_batch_size > 0 is specified, but the model does not support batching"), "{err}");

        let mut wrong_type = sig(&[3, 48, -1], 8);
        wrong_type.inputs[0].datatype = DataType::Int64;
        let err = complete_and_check(&mut wrong_type, &model, &[]).unwrap_err();
        assert!(err.contains("says data_type TYPE_INT64, but the model's input is TYPE_FP32"), "{err}");

        let mut renamed = sig(&[3, 48, -1], 8);
        renamed.inputs[0].name = "image".into();
        let err = complete_and_check(&mut renamed, &model, &[]).unwrap_err();
        assert_eq!(err, "unexpected input 'image' in config.pbtxt: the inputs the model allows are [\"x\"]");
        let mut two = sig(&[3, 48, -1], 8);
        two.inputs.push(TensorSpec::new("z", DataType::Fp32, &[1]));
        let err = complete_and_check(&mut two, &model, &[]).unwrap_err();
        assert!(
            err.starts_with("the model provides 1 inputs ([\"x\"]), but the configuration expects 2 required"),
            "{err}"
        );
    }

    #[test]
    fn missing_tensors_are_completed_from_the_model() {
        let mut s = Signature { max_batch_size: 4, inputs: vec![], outputs: vec![] };
        complete_and_check(&mut s, &[io("x", &[-1, 3])], &[io("y", &[-1, 2])]).unwrap();
        assert_eq!(s.inputs[0].dims, vec![3]);
        assert_eq!(s.outputs[0].name, "y");
    }

    #[test]
    fn requests_are_checked_against_the_signature() {
        let s = sig(&[2, -1], 4);
        let t = |shape: &[i64], dt| Tensor {
            name: "x".into(),
            datatype: dt,
            shape: shape.to_vec(),
            data: vec![0; crate::tensor::element_count(shape).unwrap() * 4],
        };
        assert!(check_inputs(&s, "m", &[t(&[1, 2, 5], DataType::Fp32)]).is_ok());
        let err = check_inputs(&s, "m", &[t(&[1, 3, 5], DataType::Fp32)]).unwrap_err().to_string();
        assert!(err.contains("input 'x'") && err.contains("[-1, 2, -1]") && err.contains("[1, 3, 5]"), "{err}");
        let err = check_inputs(&s, "m", &[t(&[1, 2, 5], DataType::Int32)]).unwrap_err().to_string();
        assert!(err.contains("must be FP32, got INT32"), "{err}");
        let err = check_inputs(&s, "m", &[t(&[5, 2, 1], DataType::Fp32)]).unwrap_err().to_string();
        assert!(err.contains("batch size 5"), "{err}");
        let err = check_inputs(&s, "m", &[]).unwrap_err().to_string();
        assert!(err.contains("'x' is missing"), "{err}");
    }
}

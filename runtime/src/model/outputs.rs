//! The outputs a request asks for: which, in what order, and those asked
//! for as classifications (the classification extension, Triton's
//! `docs/protocol/extension_classification.md`): the top N classes of each
//! batch row as BYTES `"score:index"` or `"score:index:label"`, labels from
//! the output's `label_filename`.

use std::collections::HashMap;
use std::path::Path;

use crate::config::{CONFIG_FILE, ModelConfig, Signature};
use crate::error::Error;
use crate::tensor::{DataType, Tensor, push_bytes_element};

/// One output a request asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutputRequest {
    /// The output's name.
    pub name: String,
    /// `classification` (HTTP) / `classification` int64 parameter (gRPC):
    /// the number of top classes to return instead of the tensor.
    pub classification: Option<usize>,
}

impl OutputRequest {
    /// The output `name`, as a tensor.
    pub fn named(name: &str) -> OutputRequest {
        OutputRequest { name: name.to_owned(), classification: None }
    }
}

/// The labels of each output with a `label_filename`, one per line of the
/// file in the model folder, by output name.
///
/// # Errors
/// A message naming the output and the file when it cannot be read.
pub fn load_labels(config: &ModelConfig, model_dir: &Path) -> Result<HashMap<String, Vec<String>>, String> {
    let mut labels = HashMap::new();
    for output in config.output.iter().filter(|o| !o.label_filename.is_empty()) {
        let path = model_dir.join(&output.label_filename);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            format!(
                "output '{}': label_filename '{}' in {CONFIG_FILE} cannot be read from {}: {e}",
                output.name,
                output.label_filename,
                path.display()
            )
        })?;
        labels.insert(output.name.clone(), text.lines().map(str::to_owned).collect());
    }
    Ok(labels)
}

/// Checks `requested` against the model's outputs before anything runs.
///
/// # Errors
/// [`Error::InvalidArgument`] for an output the model does not have, one
/// asked for twice, or a classification of an output whose datatype has no
/// order (BOOL, FP16, BF16, BYTES).
pub fn check(signature: &Signature, model: &str, requested: &[OutputRequest]) -> Result<(), Error> {
    for (i, r) in requested.iter().enumerate() {
        let Some(spec) = signature.outputs.iter().find(|o| o.name == r.name) else {
            let names: Vec<_> = signature.outputs.iter().map(|o| o.name.as_str()).collect();
            return Err(Error::InvalidArgument(format!(
                "model '{model}' has no output '{}'; its outputs are {names:?}",
                r.name
            )));
        };
        if requested[..i].iter().any(|earlier| earlier.name == r.name) {
            return Err(Error::InvalidArgument(format!(
                "output '{}' already exists in request; ask for each output once",
                r.name
            )));
        }
        if r.classification.is_some() && !classifiable(spec.datatype) {
            return Err(Error::InvalidArgument(format!(
                "class result not available for output '{}' due to unsupported type '{}'",
                r.name, spec.datatype
            )));
        }
    }
    Ok(())
}

/// The outputs `requested` asks for, in its order (all of `outputs`, in the
/// model's order, when it asks for none), classifications applied.
/// `batching`: the first dimension is the batch.
pub fn select(
    mut outputs: Vec<Tensor>,
    requested: &[OutputRequest],
    labels: &HashMap<String, Vec<String>>,
    batching: bool,
) -> Vec<Tensor> {
    if requested.is_empty() {
        return outputs;
    }
    requested
        .iter()
        .filter_map(|r| {
            let tensor = outputs.swap_remove(outputs.iter().position(|t| t.name == r.name)?);
            Some(match r.classification {
                Some(count) if count > 0 => classify(&tensor, count, labels.get(&r.name), batching),
                _ => tensor,
            })
        })
        .collect()
}

fn classifiable(datatype: DataType) -> bool {
    !matches!(datatype, DataType::Bool | DataType::Fp16 | DataType::Bf16 | DataType::Bytes)
}

/// The top `count` classes of each batch row of `t` (all of `t` is one row
/// without `batching`), highest score first and lower index first among
/// equal scores, as BYTES `"score:index[:label]"` of shape `[rows, k]` (or
/// `[k]`), k = min(count, classes). Scores print as Triton prints them: C's
/// `%f` for floats, whole numbers for integers.
pub fn classify(t: &Tensor, count: usize, labels: Option<&Vec<String>>, batching: bool) -> Tensor {
    let scores = scores(t);
    let rows = if batching { t.shape.first().map_or(1, |&r| r.max(0) as usize) } else { 1 };
    let per_row = scores.len().checked_div(rows).unwrap_or(0);
    let k = count.min(per_row);
    let mut data = Vec::new();
    for row in scores.chunks(per_row.max(1)).take(rows) {
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].1.total_cmp(&row[a].1));
        for &i in &order[..k] {
            let mut class = format!("{}:{i}", row[i].0);
            if let Some(label) = labels.and_then(|l| l.get(i)) {
                class.push(':');
                class.push_str(label);
            }
            push_bytes_element(&mut data, class.as_bytes());
        }
    }
    let shape = if batching { vec![rows as i64, k as i64] } else { vec![k as i64] };
    Tensor { name: t.name.clone(), datatype: DataType::Bytes, shape, data }
}

/// Each element as (its printed score, its value for ordering).
fn scores(t: &Tensor) -> Vec<(String, f64)> {
    fn each<const N: usize>(data: &[u8], f: impl Fn([u8; N]) -> (String, f64)) -> Vec<(String, f64)> {
        data.chunks_exact(N).map(|c| f(c.try_into().expect("chunks of N bytes"))).collect()
    }
    let int = |v: i128| (v.to_string(), v as f64);
    match t.datatype {
        DataType::Uint8 => each(&t.data, |b: [u8; 1]| int(b[0].into())),
        DataType::Uint16 => each(&t.data, |b| int(u16::from_le_bytes(b).into())),
        DataType::Uint32 => each(&t.data, |b| int(u32::from_le_bytes(b).into())),
        DataType::Uint64 => each(&t.data, |b| int(u64::from_le_bytes(b).into())),
        DataType::Int8 => each(&t.data, |b: [u8; 1]| int((b[0] as i8).into())),
        DataType::Int16 => each(&t.data, |b| int(i16::from_le_bytes(b).into())),
        DataType::Int32 => each(&t.data, |b| int(i32::from_le_bytes(b).into())),
        DataType::Int64 => each(&t.data, |b| int(i64::from_le_bytes(b).into())),
        DataType::Fp32 => each(&t.data, |b| {
            let v = f32::from_le_bytes(b);
            (format!("{v:.6}"), f64::from(v))
        }),
        DataType::Fp64 => each(&t.data, |b| {
            let v = f64::from_le_bytes(b);
            (format!("{v:.6}"), v)
        }),
        // Refused by `check` before the model ran.
        DataType::Bool | DataType::Fp16 | DataType::Bf16 | DataType::Bytes => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{TensorSpec, bytes_elements};

    fn fp32(shape: &[i64], values: &[f32]) -> Tensor {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor { name: "y".into(), datatype: DataType::Fp32, shape: shape.to_vec(), data }
    }

    fn strings(t: &Tensor) -> Vec<String> {
        bytes_elements(&t.data).unwrap().into_iter().map(|b| String::from_utf8(b.to_vec()).unwrap()).collect()
    }

    #[test]
    fn each_row_gets_its_top_classes_with_labels() {
        let labels = vec!["cat".to_owned(), "dog".to_owned()];
        let t = fp32(&[2, 3], &[0.1, 0.7, 0.2, 0.5, 0.25, 0.25]);
        let top = classify(&t, 2, Some(&labels), true);
        assert_eq!((top.datatype, top.shape.as_slice()), (DataType::Bytes, &[2, 2][..]));
        assert_eq!(strings(&top), ["0.700000:1:dog", "0.200000:2", "0.500000:0:cat", "0.250000:1:dog"]);
        let all = classify(&fp32(&[3], &[1.0, 3.0, 2.0]), 9, None, false);
        assert_eq!(
            (all.shape.as_slice(), strings(&all)),
            (&[3][..], vec!["3.000000:1".into(), "2.000000:2".into(), "1.000000:0".into()])
        );
        let ints = Tensor {
            name: "i".into(),
            datatype: DataType::Int32,
            shape: vec![1, 2],
            data: [7i32, -3].iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        assert_eq!(strings(&classify(&ints, 1, None, true)), ["7:0"]);
    }

    #[test]
    fn requests_are_checked_before_the_model_runs() {
        let spec = |name: &str, datatype| TensorSpec::new(name, datatype, &[2]);
        let sig = Signature {
            max_batch_size: 0,
            inputs: vec![],
            outputs: vec![spec("y", DataType::Fp32), spec("s", DataType::Bytes)],
        };
        let twice = [OutputRequest::named("y"), OutputRequest::named("y")];
        assert_eq!(
            check(&sig, "m", &twice).unwrap_err().to_string(),
            "output 'y' already exists in request; ask for each output once"
        );
        let unknown = check(&sig, "m", &[OutputRequest::named("z")]).unwrap_err().to_string();
        assert_eq!(unknown, r#"model 'm' has no output 'z'; its outputs are ["y", "s"]"#);
        let strings = [OutputRequest { name: "s".into(), classification: Some(1) }];
        assert_eq!(
            check(&sig, "m", &strings).unwrap_err().to_string(),
            "class result not available for output 's' due to unsupported type 'BYTES'"
        );
        assert!(check(&sig, "m", &[OutputRequest { name: "y".into(), classification: Some(3) }]).is_ok());
    }
}

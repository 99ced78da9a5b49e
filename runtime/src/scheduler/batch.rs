//! Combining the inputs of several requests into one batch along the first
//! (batch) dimension, and splitting the outputs back per request.

use crate::tensor::{DataType, Tensor, bytes_elements, element_count};

/// What must be equal for two requests to share a batch: each input's name,
/// datatype and shape after the batch dimension (inputs sorted by name).
pub type BatchKey = Vec<(String, DataType, Vec<i64>)>;

/// The key of a request's inputs; `inputs` must already be sorted by name.
pub fn batch_key(inputs: &[Tensor]) -> BatchKey {
    inputs.iter().map(|t| (t.name.clone(), t.datatype, t.shape.get(1..).unwrap_or_default().to_vec())).collect()
}

/// The number of rows (batch dimension) of a request; 1 for a model that
/// does not batch.
pub fn rows(inputs: &[Tensor], batching: bool) -> usize {
    match inputs.first().and_then(|t| t.shape.first()) {
        Some(&d) if batching => usize::try_from(d).unwrap_or(0),
        _ => 1,
    }
}

/// Concatenates the requests' inputs along dimension 0. Every request has
/// the same [`BatchKey`]. Fixed-size and `BYTES` data both concatenate as
/// bytes, since `BYTES` elements are self-delimiting.
pub fn concat(requests: &[Vec<Tensor>]) -> Vec<Tensor> {
    let Some(first) = requests.first() else { return Vec::new() };
    (0..first.len())
        .map(|i| {
            let mut shape = first[i].shape.clone();
            shape[0] = requests.iter().map(|r| r[i].shape[0]).sum();
            let mut data = Vec::with_capacity(requests.iter().map(|r| r[i].data.len()).sum());
            for r in requests {
                data.extend_from_slice(&r[i].data);
            }
            Tensor { name: first[i].name.clone(), datatype: first[i].datatype, shape, data }
        })
        .collect()
}

/// Splits each output along dimension 0 into consecutive slices of `rows`
/// rows, one output list per request.
///
/// # Errors
/// A message when an output's first dimension is not the batch's total row
/// count, or its data does not match its shape.
pub fn split(outputs: Vec<Tensor>, rows: &[usize]) -> Result<Vec<Vec<Tensor>>, String> {
    let total: usize = rows.iter().sum();
    let mut per_request: Vec<Vec<Tensor>> = rows.iter().map(|_| Vec::with_capacity(outputs.len())).collect();
    for out in outputs {
        if out.shape.first().and_then(|&d| usize::try_from(d).ok()) != Some(total) {
            return Err(format!(
                "output '{}' has shape {:?}, but the batch has {total} rows in its first dimension",
                out.name, out.shape
            ));
        }
        let per_row = element_count(&out.shape[1..]).ok_or_else(|| format!("output '{}' is too large", out.name))?;
        let mut offset = 0;
        for (slices, &n) in per_request.iter_mut().zip(rows) {
            let len = row_bytes(&out, offset, n * per_row)?;
            let mut shape = out.shape.clone();
            shape[0] = n as i64;
            slices.push(Tensor {
                name: out.name.clone(),
                datatype: out.datatype,
                shape,
                data: out.data[offset..offset + len].to_vec(),
            });
            offset += len;
        }
    }
    Ok(per_request)
}

/// The byte length of `count` elements of `t` starting at byte `offset`.
fn row_bytes(t: &Tensor, offset: usize, count: usize) -> Result<usize, String> {
    let malformed = || format!("output '{}' has data that does not match its shape {:?}", t.name, t.shape);
    let len = match t.datatype.element_size() {
        Some(size) => count * size,
        None => {
            let items = bytes_elements(&t.data[offset..]).ok_or_else(malformed)?;
            let items = items.get(..count).ok_or_else(malformed)?;
            items.iter().map(|i| 4 + i.len()).sum()
        }
    };
    if offset + len > t.data.len() {
        return Err(malformed());
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::push_bytes_element;

    fn fp32(name: &str, shape: &[i64], values: &[f32]) -> Tensor {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor { name: name.into(), datatype: DataType::Fp32, shape: shape.to_vec(), data }
    }

    #[test]
    fn concat_then_split_gives_each_request_its_rows() {
        let a = vec![fp32("x", &[3, 2], &[1., 2., 3., 4., 5., 6.])];
        let b = vec![fp32("x", &[1, 2], &[7., 8.])];
        assert_eq!(batch_key(&a), batch_key(&b));
        let batch = concat(&[a.clone(), b.clone()]);
        assert_eq!(batch[0].shape, vec![4, 2]);
        let parts = split(batch, &[3, 1]).unwrap();
        assert_eq!(parts, vec![a, b]);
    }

    #[test]
    fn bytes_outputs_split_by_element() {
        let mut data = Vec::new();
        for s in ["a", "bcd", "", "ef"] {
            push_bytes_element(&mut data, s.as_bytes());
        }
        let out = Tensor { name: "s".into(), datatype: DataType::Bytes, shape: vec![2, 2], data };
        let parts = split(vec![out], &[1, 1]).unwrap();
        assert_eq!(bytes_elements(&parts[0][0].data).unwrap(), vec![b"a".as_slice(), b"bcd"]);
        assert_eq!(bytes_elements(&parts[1][0].data).unwrap(), vec![b"".as_slice(), b"ef"]);
        assert_eq!(parts[1][0].shape, vec![1, 2]);
    }

    #[test]
    fn an_output_without_the_batch_rows_is_an_error() {
        let err = split(vec![fp32("y", &[2], &[1., 2.])], &[1, 2]).unwrap_err();
        assert!(err.contains("output 'y'") && err.contains("3 rows"), "{err}");
    }
}

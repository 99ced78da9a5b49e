//! Tensors as they travel through Plinth: raw little-endian row-major bytes
//! with a v2 protocol datatype, so that no stage copies into typed arrays
//! unless it must.

use std::fmt;

/// Tensor element types, named as the KServe v2 protocol names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `BOOL`, one byte, 0 or 1.
    Bool,
    /// `UINT8`.
    Uint8,
    /// `UINT16`.
    Uint16,
    /// `UINT32`.
    Uint32,
    /// `UINT64`.
    Uint64,
    /// `INT8`.
    Int8,
    /// `INT16`.
    Int16,
    /// `INT32`.
    Int32,
    /// `INT64`.
    Int64,
    /// `FP16`, IEEE half precision (binary only: no JSON form).
    Fp16,
    /// `FP32`.
    Fp32,
    /// `FP64`.
    Fp64,
    /// `BF16`, bfloat16 (binary only: no JSON form).
    Bf16,
    /// Variable-length byte strings; each element is stored as a 4-byte
    /// little-endian length followed by its bytes (KServe v2 binary tensor
    /// data extension layout).
    Bytes,
}

impl DataType {
    /// Every datatype, in the order of the v2 protocol's table.
    pub const ALL: [DataType; 14] = [
        DataType::Bool,
        DataType::Uint8,
        DataType::Uint16,
        DataType::Uint32,
        DataType::Uint64,
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::Fp16,
        DataType::Fp32,
        DataType::Fp64,
        DataType::Bf16,
        DataType::Bytes,
    ];

    /// The v2 protocol name (`"FP32"`, `"BYTES"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DataType::Bool => "BOOL",
            DataType::Uint8 => "UINT8",
            DataType::Uint16 => "UINT16",
            DataType::Uint32 => "UINT32",
            DataType::Uint64 => "UINT64",
            DataType::Int8 => "INT8",
            DataType::Int16 => "INT16",
            DataType::Int32 => "INT32",
            DataType::Int64 => "INT64",
            DataType::Fp16 => "FP16",
            DataType::Fp32 => "FP32",
            DataType::Fp64 => "FP64",
            DataType::Bf16 => "BF16",
            DataType::Bytes => "BYTES",
        }
    }

    /// Parses a v2 protocol name; `None` for anything else.
    pub fn from_name(name: &str) -> Option<DataType> {
        DataType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Size of one element in bytes; `None` for variable-length `BYTES`.
    pub fn element_size(self) -> Option<usize> {
        Some(match self {
            DataType::Bool | DataType::Uint8 | DataType::Int8 => 1,
            DataType::Uint16 | DataType::Int16 | DataType::Fp16 | DataType::Bf16 => 2,
            DataType::Uint32 | DataType::Int32 | DataType::Fp32 => 4,
            DataType::Uint64 | DataType::Int64 | DataType::Fp64 => 8,
            DataType::Bytes => return None,
        })
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A tensor with its data as little-endian, row-major bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// The input or output name.
    pub name: String,
    /// Element type.
    pub datatype: DataType,
    /// Full shape; every dimension is >= 0.
    pub shape: Vec<i64>,
    /// Fixed-size elements back to back, or for `BYTES` each element as a
    /// 4-byte little-endian length and its bytes.
    pub data: Vec<u8>,
}

impl Tensor {
    /// Checks that `data` holds exactly the elements `shape` describes.
    ///
    /// # Errors
    /// A message naming the tensor, the expected and the actual size, or a
    /// shape whose element count does not fit in memory.
    pub fn check_data(&self) -> Result<(), String> {
        let too_large = || format!("tensor '{}': shape {:?} has too many elements", self.name, self.shape);
        let count = element_count(&self.shape).ok_or_else(too_large)?;
        match self.datatype.element_size() {
            Some(size) if count.checked_mul(size).is_none() => Err(too_large()),
            Some(size) if self.data.len() != count * size => Err(format!(
                "tensor '{}' of shape {:?} and datatype {} needs {} bytes, got {}",
                self.name,
                self.shape,
                self.datatype,
                count * size,
                self.data.len()
            )),
            Some(_) => Ok(()),
            // Counted, not collected: a body of empty elements holds one
            // per 4 bytes, and a slice each would cost four times the body.
            None => match count_bytes_elements(&self.data) {
                Some(items) if items == count => Ok(()),
                Some(items) => Err(format!(
                    "tensor '{}' of shape {:?} needs {count} BYTES elements, got {items}",
                    self.name, self.shape
                )),
                None => Err(format!("tensor '{}' has malformed BYTES data", self.name)),
            },
        }
    }
}

/// The datatype of a tensor in a request, by its v2 name, with its shape
/// checked: what every request format (JSON, binary, gRPC) checks first.
///
/// # Errors
/// A message for a name the v2 protocol does not define or a negative
/// dimension.
pub fn request_datatype(datatype: &str, shape: &[i64]) -> Result<DataType, String> {
    let dt = DataType::from_name(datatype).ok_or_else(|| format!("unknown datatype '{datatype}'"))?;
    match shape.iter().find(|&&d| d < 0) {
        Some(d) => Err(format!("shape {shape:?} has a negative dimension {d}")),
        None => Ok(dt),
    }
}

/// The number of elements of `shape`; `None` when a dimension is negative
/// or the product overflows.
pub fn element_count(shape: &[i64]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?))
}

/// Splits length-prefixed `BYTES` data into its elements; `None` if the
/// lengths do not add up to the data.
pub fn bytes_elements(mut data: &[u8]) -> Option<Vec<&[u8]>> {
    let mut items = Vec::new();
    while !data.is_empty() {
        let (len, rest) = data.split_at_checked(4)?;
        let len = u32::from_le_bytes(len.try_into().ok()?) as usize;
        let (item, rest) = rest.split_at_checked(len)?;
        items.push(item);
        data = rest;
    }
    Some(items)
}

/// How many length-prefixed `BYTES` elements `data` holds, without
/// collecting them; `None` if the data is malformed.
pub fn count_bytes_elements(mut data: &[u8]) -> Option<usize> {
    let mut count = 0;
    while !data.is_empty() {
        let (len, rest) = data.split_at_checked(4)?;
        let len = u32::from_le_bytes(len.try_into().ok()?) as usize;
        data = rest.get(len..)?;
        count += 1;
    }
    Some(count)
}

/// Appends one `BYTES` element (length prefix and bytes) to `data`.
pub fn push_bytes_element(data: &mut Vec<u8>, item: &[u8]) {
    data.extend_from_slice(&(item.len() as u32).to_le_bytes());
    data.extend_from_slice(item);
}

/// A declared input or output: a name, a datatype and dimensions where -1
/// means "any size".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// The tensor's name in the model.
    pub name: String,
    /// Element type.
    pub datatype: DataType,
    /// Dimensions without the batch dimension (as `config.pbtxt` gives them):
    /// the shape clients send and receive.
    pub dims: Vec<i64>,
    /// `reshape`: the dimensions the backend sees instead, when they differ
    /// (same elements, row-major; Triton's model configuration).
    pub reshape: Option<Vec<i64>>,
    /// `optional`: a request may leave this input out.
    pub optional: bool,
}

impl TensorSpec {
    /// A required tensor without a reshape.
    pub fn new(name: &str, datatype: DataType, dims: &[i64]) -> TensorSpec {
        TensorSpec { name: name.to_owned(), datatype, dims: dims.to_vec(), reshape: None, optional: false }
    }

    /// The dimensions the backend sees: `reshape` if there is one, else
    /// `dims`.
    pub fn model_dims(&self) -> &[i64] {
        self.reshape.as_deref().unwrap_or(&self.dims)
    }
}

/// `actual` (dimensions that fit the pattern `from`, -1 in it matching any
/// size) as the pattern `to` with the same elements, row-major: `to`'s
/// variable dimensions take `from`'s actual sizes in order (Triton's
/// reshape, whose trunks between variable dimensions hold the same number of
/// elements). `None` when `actual` does not fit `from` or the counts differ.
pub fn reshape_dims(actual: &[i64], from: &[i64], to: &[i64]) -> Option<Vec<i64>> {
    let fits = actual.len() == from.len() && from.iter().zip(actual).all(|(&f, &a)| a >= 0 && (f < 0 || f == a));
    if !fits {
        return None;
    }
    let mut variable = from.iter().zip(actual).filter(|(f, _)| **f < 0).map(|(_, &a)| a);
    let shape: Vec<i64> = to.iter().map(|&t| if t < 0 { variable.next() } else { Some(t) }).collect::<Option<_>>()?;
    (element_count(&shape) == element_count(actual)).then_some(shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DataType::ALL {
            assert_eq!(DataType::from_name(d.name()), Some(d));
        }
        assert_eq!(DataType::from_name("FLOAT"), None);
    }

    #[test]
    fn reshapes_map_variable_dimensions_in_order() {
        assert_eq!(reshape_dims(&[2, 4, 5, 6], &[2, 4, -1, 6], &[8, -1, 1, 6]), Some(vec![8, 5, 1, 6]));
        assert_eq!(reshape_dims(&[8, 5, 1, 6], &[8, -1, 1, 6], &[2, 4, -1, 6]), Some(vec![2, 4, 5, 6]));
        assert_eq!(reshape_dims(&[1, 7, 1], &[1, -1, 1], &[-1]), Some(vec![7]));
        assert_eq!(reshape_dims(&[1], &[1], &[]), Some(vec![]), "an empty reshape: one element");
        assert_eq!(reshape_dims(&[4, 4], &[4, 4], &[16]), Some(vec![16]));
        assert_eq!(reshape_dims(&[4, 3], &[4, 4], &[16]), None, "does not fit the pattern");
    }

    #[test]
    fn check_data_counts_bytes_and_elements() {
        let mut t = Tensor { name: "x".into(), datatype: DataType::Fp32, shape: vec![2, 3], data: vec![0; 24] };
        assert!(t.check_data().is_ok());
        t.data.pop();
        assert!(t.check_data().unwrap_err().contains("needs 24 bytes, got 23"));

        let mut data = Vec::new();
        push_bytes_element(&mut data, b"hi");
        let s = Tensor { name: "s".into(), datatype: DataType::Bytes, shape: vec![2], data };
        assert!(s.check_data().unwrap_err().contains("needs 2 BYTES elements, got 1"));

        let huge = Tensor { name: "h".into(), datatype: DataType::Fp32, shape: vec![3, 1 << 62], data: vec![] };
        assert!(huge.check_data().unwrap_err().contains("too many elements"));
        assert_eq!(element_count(&[1 << 32, 1 << 32]), None);
    }
}

//! Typed access to [`Tensor`] data (little-endian, row-major bytes).

use crate::{Datatype, Error, Tensor};

/// A Rust number type that is one of the v2 protocol's tensor element types.
pub trait Element: Copy + Into<serde_json::Value> {
    /// The matching v2 datatype.
    const DATATYPE: Datatype;
    /// Size of one element in bytes.
    const SIZE: usize;
    /// Appends the little-endian bytes of `self` to `out`.
    fn write_le(self, out: &mut Vec<u8>);
    /// Reads one element from exactly [`Self::SIZE`] little-endian bytes.
    fn read_le(bytes: &[u8]) -> Self;
}

macro_rules! element {
    ($t:ty, $dt:ident) => {
        impl Element for $t {
            const DATATYPE: Datatype = Datatype::$dt;
            const SIZE: usize = std::mem::size_of::<$t>();
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read_le(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().expect("caller passes SIZE bytes"))
            }
        }
    };
}

element!(u8, Uint8);
element!(u16, Uint16);
element!(u32, Uint32);
element!(u64, Uint64);
element!(i8, Int8);
element!(i16, Int16);
element!(i32, Int32);
element!(i64, Int64);
element!(f32, Fp32);
element!(f64, Fp64);

impl Element for bool {
    const DATATYPE: Datatype = Datatype::Bool;
    const SIZE: usize = 1;
    fn write_le(self, out: &mut Vec<u8>) {
        out.push(u8::from(self));
    }
    fn read_le(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
}

impl Tensor {
    /// A tensor of `shape` holding `values` (row-major).
    ///
    /// # Panics
    /// If `values.len()` is not the product of `shape`.
    pub fn from_slice<T: Element>(name: &str, shape: &[i64], values: &[T]) -> Tensor {
        let count: i64 = shape.iter().product();
        assert_eq!(count as usize, values.len(), "tensor '{name}': shape {shape:?} needs {count} values");
        let mut data = Vec::with_capacity(values.len() * T::SIZE);
        for v in values {
            v.write_le(&mut data);
        }
        Tensor { name: name.into(), datatype: T::DATATYPE, shape: shape.to_vec(), data }
    }

    /// A one-dimensional `BYTES` tensor with one element per item.
    pub fn from_bytes_elements(name: &str, items: &[&[u8]]) -> Tensor {
        let mut data = Vec::new();
        for item in items {
            data.extend_from_slice(&(item.len() as u32).to_le_bytes());
            data.extend_from_slice(item);
        }
        Tensor { name: name.into(), datatype: Datatype::Bytes, shape: vec![items.len() as i64], data }
    }

    /// The elements as `T`, row-major.
    ///
    /// # Errors
    /// [`Error::Internal`] when the datatype is not `T`'s or the data length
    /// does not match the shape.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>, Error> {
        if self.datatype != T::DATATYPE {
            return Err(Error::internal(format!(
                "tensor '{}' is {:?}, expected {:?}",
                self.name,
                self.datatype,
                T::DATATYPE
            )));
        }
        let expected = self.element_count() * T::SIZE;
        if self.data.len() != expected {
            return Err(Error::internal(format!(
                "tensor '{}' of shape {:?} has {} bytes, expected {expected}",
                self.name,
                self.shape,
                self.data.len()
            )));
        }
        Ok(self.data.chunks_exact(T::SIZE).map(T::read_le).collect())
    }

    /// The elements of a `BYTES` tensor.
    ///
    /// # Errors
    /// [`Error::Internal`] when the tensor is not `BYTES` or its data is not
    /// a sequence of 4-byte lengths followed by that many bytes.
    pub fn to_bytes_elements(&self) -> Result<Vec<Vec<u8>>, Error> {
        if self.datatype != Datatype::Bytes {
            return Err(Error::internal(format!("tensor '{}' is {:?}, expected BYTES", self.name, self.datatype)));
        }
        let malformed = || Error::internal(format!("tensor '{}' has malformed BYTES data", self.name));
        let mut items = Vec::new();
        let mut rest = self.data.as_slice();
        while !rest.is_empty() {
            let (len, tail) = rest.split_at_checked(4).ok_or_else(malformed)?;
            let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
            let (item, tail) = tail.split_at_checked(len).ok_or_else(malformed)?;
            items.push(item.to_vec());
            rest = tail;
        }
        Ok(items)
    }

    /// The number of elements: the product of the shape.
    pub fn element_count(&self) -> usize {
        self.shape.iter().map(|&d| d.max(0) as usize).product()
    }

    /// The tensor as a KServe v2 JSON output tensor (flat `data`).
    ///
    /// # Errors
    /// [`Error::Internal`] for FP16/BF16 (no JSON form) or malformed data.
    pub fn to_json(&self) -> Result<serde_json::Value, Error> {
        let data: Vec<serde_json::Value> = match self.datatype {
            Datatype::Bool => json_values::<bool>(self)?,
            Datatype::Uint8 => json_values::<u8>(self)?,
            Datatype::Uint16 => json_values::<u16>(self)?,
            Datatype::Uint32 => json_values::<u32>(self)?,
            Datatype::Uint64 => json_values::<u64>(self)?,
            Datatype::Int8 => json_values::<i8>(self)?,
            Datatype::Int16 => json_values::<i16>(self)?,
            Datatype::Int32 => json_values::<i32>(self)?,
            Datatype::Int64 => json_values::<i64>(self)?,
            Datatype::Fp32 => json_values::<f32>(self)?,
            Datatype::Fp64 => json_values::<f64>(self)?,
            Datatype::Bytes => {
                self.to_bytes_elements()?.into_iter().map(|b| String::from_utf8_lossy(&b).into_owned().into()).collect()
            }
            Datatype::Fp16 | Datatype::Bf16 => {
                return Err(Error::internal(format!(
                    "tensor '{}' is {:?}, which has no JSON form",
                    self.name, self.datatype
                )));
            }
        };
        Ok(serde_json::json!({
            "name": self.name,
            "datatype": datatype_name(self.datatype),
            "shape": self.shape,
            "data": data,
        }))
    }
}

fn json_values<T: Element>(t: &Tensor) -> Result<Vec<serde_json::Value>, Error> {
    Ok(t.to_vec::<T>()?.into_iter().map(Into::into).collect())
}

/// The v2 protocol's name for `dt` (`"FP32"`, `"BYTES"`, ...).
pub fn datatype_name(dt: Datatype) -> &'static str {
    match dt {
        Datatype::Bool => "BOOL",
        Datatype::Uint8 => "UINT8",
        Datatype::Uint16 => "UINT16",
        Datatype::Uint32 => "UINT32",
        Datatype::Uint64 => "UINT64",
        Datatype::Int8 => "INT8",
        Datatype::Int16 => "INT16",
        Datatype::Int32 => "INT32",
        Datatype::Int64 => "INT64",
        Datatype::Fp16 => "FP16",
        Datatype::Fp32 => "FP32",
        Datatype::Fp64 => "FP64",
        Datatype::Bf16 => "BF16",
        Datatype::Bytes => "BYTES",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_round_trip_through_bytes() {
        let t = Tensor::from_slice("x", &[2, 2], &[1.5f32, -2.0, 0.0, 3.25]);
        assert_eq!(t.data.len(), 16);
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.5, -2.0, 0.0, 3.25]);
        assert!(t.to_vec::<i32>().is_err(), "datatype is checked");
    }

    #[test]
    fn bytes_elements_use_length_prefixes() {
        let t = Tensor::from_bytes_elements("s", &[b"ab", b""]);
        assert_eq!(t.data, vec![2, 0, 0, 0, b'a', b'b', 0, 0, 0, 0]);
        assert_eq!(t.to_bytes_elements().unwrap(), vec![b"ab".to_vec(), vec![]]);
        let bad = Tensor { data: vec![9, 0, 0, 0, 1], ..t };
        assert!(bad.to_bytes_elements().is_err());
    }

    #[test]
    fn json_form_matches_the_v2_protocol() {
        let t = Tensor::from_slice("y", &[1, 2], &[7i64, -1]);
        let j = t.to_json().unwrap();
        assert_eq!(j["datatype"], "INT64");
        assert_eq!(j["shape"], serde_json::json!([1, 2]));
        assert_eq!(j["data"], serde_json::json!([7, -1]));
    }
}

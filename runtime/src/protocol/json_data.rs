//! A JSON tensor's `data` as the tensor's bytes (the v2 protocol's "Tensor
//! Data" section): row-major elements, flat or nested as the shape.
//!
//! Clients write `shape` and `datatype` before `data`, so a tensor's
//! elements are usually read straight into its bytes while the body is
//! parsed ([`DataSeed`]), with no `serde_json::Value` tree of tens of
//! thousands of numbers in between (a `Value` costs 32 bytes and more per
//! element, 16 times the text of a small number). Data that comes before
//! its datatype is kept as its JSON text and read the same way once the
//! datatype is known ([`InputData::Raw`], [`read_raw`]). Where the direct
//! reading meets anything it does not take (an element of the wrong type or
//! range, nesting that does not follow the shape) it stops: every such
//! request is refused, and the caller parses that data again as a `Value`
//! ([`InputData::Unread`]), whose reading alone words the errors, where the
//! message is small enough ([`WORDING_LIMIT`]).

use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::tensor::{DataType, element_count, push_bytes_element};

/// An input tensor's `data` as far as parsing read it.
#[derive(Debug, Default)]
pub enum InputData {
    /// No `data`, or `null`.
    #[default]
    Absent,
    /// Read into the datatype's little-endian bytes while parsing;
    /// `elements` is how many elements they hold.
    Read {
        /// The tensor's bytes.
        bytes: Vec<u8>,
        /// Its element count.
        elements: usize,
    },
    /// Kept as parsed, to be read with the datatype and shape.
    Parsed(Value),
    /// Came before the datatype or shape: its JSON text, to be read with
    /// them ([`read_raw`]).
    Raw(Box<RawValue>),
    /// The direct reading stopped at something it does not take; the
    /// message is parsed again and this replaced by [`InputData::Parsed`].
    Unread,
}

impl InputData {
    /// Whether the tensor has no `data`.
    pub fn is_absent(&self) -> bool {
        matches!(self, InputData::Absent)
    }
}

/// The seed that reads `data` as it is parsed, given the tensor's datatype
/// and shape when they came first; without them, or for a datatype JSON
/// cannot carry or a negative dimension, it keeps the parsed `Value`.
pub struct DataSeed<'a> {
    /// The tensor's `datatype`, if read already.
    pub datatype: Option<&'a str>,
    /// Its `shape`, if read already.
    pub shape: Option<&'a [i64]>,
}

impl<'de> DeserializeSeed<'de> for DataSeed<'_> {
    type Value = InputData;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<InputData, D::Error> {
        let datatype =
            self.datatype.and_then(DataType::from_name).filter(|d| !matches!(d, DataType::Fp16 | DataType::Bf16));
        let shape = self.shape.filter(|s| s.iter().all(|&d| d >= 0));
        let (Some(datatype), Some(shape)) = (datatype, shape) else {
            let raw = Box::<RawValue>::deserialize(d)?;
            return Ok(if raw.get() == "null" { InputData::Absent } else { InputData::Raw(raw) });
        };
        read_direct(d, datatype, shape)
    }
}

/// Reads `data` from `d` straight into the bytes of `datatype`.
fn read_direct<'de, D: de::Deserializer<'de>>(d: D, datatype: DataType, shape: &[i64]) -> Result<InputData, D::Error> {
    let mut at = Cursor { datatype, bytes: Vec::new(), elements: 0 };
    let read = d.deserialize_any(Item { at: &mut at, dims: shape, kind: &mut None, top: true })?;
    Ok(match read {
        Read::Done => InputData::Read { bytes: at.bytes, elements: at.elements },
        Read::Null => InputData::Absent,
        Read::Stopped => InputData::Unread,
    })
}

/// The largest message whose refused data is parsed again as a `Value` to
/// word the error exactly; a larger one gets a general error, so that a
/// refused request never costs a `Value` tree of its size.
pub const WORDING_LIMIT: usize = 4 << 20;

/// Reads `raw`, the JSON text of data that came before its datatype, as
/// [`DataSeed`] reads data after it: straight into the bytes of
/// `datatype`, or, where that stops, from a `Value` (which words the
/// error) if the text is within [`WORDING_LIMIT`].
///
/// # Errors
/// As [`read_value`]; a general message for refused data over the limit.
pub fn read_raw(raw: &RawValue, datatype: DataType, shape: &[i64]) -> Result<(Vec<u8>, usize), String> {
    let text = raw.get();
    let direct = read_direct(&mut serde_json::Deserializer::from_str(text), datatype, shape);
    match direct.map_err(|e| format!("data: {e}"))? {
        InputData::Read { bytes, elements } => Ok((bytes, elements)),
        InputData::Absent => read_value(&Value::Null, datatype, shape),
        _ if text.len() > WORDING_LIMIT => Err(REFUSED.to_owned()),
        _ => read_value(&serde_json::from_str(text).map_err(|e| format!("data: {e}"))?, datatype, shape),
    }
}

/// The error of refused data in a message over [`WORDING_LIMIT`].
pub const REFUSED: &str = "data: an element of the wrong JSON type or range for the datatype, or nesting that does \
                           not follow the shape";

/// Converts parsed `data` to the bytes of `datatype`, returning them with
/// their element count. `data` is a flat array, or nested to follow
/// `shape` from the outside in: an array of arrays must have `shape[0]`
/// items, and an array of scalars holds the rest of the shape flat.
///
/// # Errors
/// The problem, for the caller to prefix with the tensor's name: ragged or
/// mixed nesting (`data: ...`), or an element of the wrong JSON type or
/// range (`element N: ...`).
pub fn read_value(data: &Value, datatype: DataType, shape: &[i64]) -> Result<(Vec<u8>, usize), String> {
    let mut bytes = Vec::new();
    let mut count = 0usize;
    flatten(data, shape, &mut |v| {
        encode_element(datatype, v, &mut bytes).map_err(|m| format!("element {count}: {m}"))?;
        count += 1;
        Ok(())
    })
    .map_err(|m| format!("data: {m}"))??;
    Ok((bytes, count))
}

/// Visits the scalars of `data` in row-major order (see [`read_value`]).
/// Ragged or mixed nesting is an error (outer `Err`); the visitor's own
/// errors come back in the inner `Result`.
fn flatten(
    data: &Value,
    dims: &[i64],
    visit: &mut impl FnMut(&Value) -> Result<(), String>,
) -> Result<Result<(), String>, String> {
    let Value::Array(items) = data else { return Ok(visit(data)) };
    if !items.iter().any(Value::is_array) {
        return Ok(items.iter().try_for_each(visit));
    }
    let Some((&outer, inner)) = dims.split_first() else {
        return Err("nested deeper than the shape".into());
    };
    if !items.iter().all(Value::is_array) || items.len() as i64 != outer {
        return Err(format!("a nested array must hold {outer} arrays, one per index of that dimension"));
    }
    for item in items {
        let held = visit_count(item);
        if held != element_count(inner).unwrap_or(usize::MAX) {
            return Err(format!("a nested array holds {held} elements where the shape needs {inner:?}"));
        }
        if let Err(e) = flatten(item, inner, visit)? {
            return Ok(Err(e));
        }
    }
    Ok(Ok(()))
}

/// How many scalars a JSON value holds.
fn visit_count(v: &Value) -> usize {
    match v {
        Value::Array(items) => items.iter().map(visit_count).sum(),
        _ => 1,
    }
}

fn encode_element(dt: DataType, v: &Value, out: &mut Vec<u8>) -> Result<(), String> {
    fn int<T: TryFrom<i64> + TryFrom<u64>>(v: &Value, dt: DataType) -> Result<T, String> {
        let out_of_range = || format!("{v} is out of range for {dt}");
        match (v.as_i64(), v.as_u64()) {
            (_, Some(u)) => T::try_from(u).map_err(|_| out_of_range()),
            (Some(i), None) => T::try_from(i).map_err(|_| out_of_range()),
            _ => Err(format!("expected an integer for {dt}, got {v}")),
        }
    }
    let float = || v.as_f64().ok_or_else(|| format!("expected a number for {dt}, got {v}"));
    match dt {
        DataType::Bool => {
            out.push(u8::from(v.as_bool().ok_or_else(|| format!("expected true or false for BOOL, got {v}"))?))
        }
        DataType::Uint8 => out.extend(int::<u8>(v, dt)?.to_le_bytes()),
        DataType::Uint16 => out.extend(int::<u16>(v, dt)?.to_le_bytes()),
        DataType::Uint32 => out.extend(int::<u32>(v, dt)?.to_le_bytes()),
        DataType::Uint64 => out.extend(int::<u64>(v, dt)?.to_le_bytes()),
        DataType::Int8 => out.extend(int::<i8>(v, dt)?.to_le_bytes()),
        DataType::Int16 => out.extend(int::<i16>(v, dt)?.to_le_bytes()),
        DataType::Int32 => out.extend(int::<i32>(v, dt)?.to_le_bytes()),
        DataType::Int64 => out.extend(int::<i64>(v, dt)?.to_le_bytes()),
        DataType::Fp32 => {
            let x = float()? as f32;
            if x.is_infinite() {
                return Err(format!("{v} is out of range for FP32"));
            }
            out.extend(x.to_le_bytes())
        }
        DataType::Fp64 => out.extend(float()?.to_le_bytes()),
        DataType::Bytes => {
            let s = v.as_str().ok_or_else(|| format!("expected a string for BYTES, got {v}"))?;
            push_bytes_element(out, s.as_bytes());
        }
        DataType::Fp16 | DataType::Bf16 => return Err(format!("{dt} has no JSON representation")),
    }
    Ok(())
}

/// Where the direct reading writes: the datatype's bytes so far.
struct Cursor {
    datatype: DataType,
    bytes: Vec<u8>,
    elements: usize,
}

/// One JSON element as the direct reading meets it.
#[derive(Clone, Copy)]
enum Element<'a> {
    Bool(bool),
    Unsigned(u64),
    Signed(i64),
    Float(f64),
    Text(&'a str),
}

impl Cursor {
    /// Appends one element as [`encode_element`] would; stops wherever
    /// that would refuse it, leaving the wording to the value reading.
    fn scalar(&mut self, element: Element) -> Read {
        use DataType as D;
        use Element as E;
        fn int<T: TryFrom<u64> + TryFrom<i64>>(element: Element) -> Option<T> {
            match element {
                Element::Unsigned(u) => T::try_from(u).ok(),
                Element::Signed(i) => T::try_from(i).ok(),
                _ => None,
            }
        }
        let float = match element {
            E::Unsigned(u) => Some(u as f64),
            E::Signed(i) => Some(i as f64),
            E::Float(x) => Some(x),
            E::Bool(_) | E::Text(_) => None,
        };
        let out = &mut self.bytes;
        let done = match (self.datatype, element) {
            (D::Bool, E::Bool(b)) => {
                out.push(u8::from(b));
                Some(())
            }
            (D::Uint8, _) => int::<u8>(element).map(|x| out.push(x)),
            (D::Uint16, _) => int::<u16>(element).map(|x| out.extend_from_slice(&x.to_le_bytes())),
            (D::Uint32, _) => int::<u32>(element).map(|x| out.extend_from_slice(&x.to_le_bytes())),
            (D::Uint64, _) => int::<u64>(element).map(|x| out.extend_from_slice(&x.to_le_bytes())),
            (D::Int8, _) => int::<i8>(element).map(|x| out.extend_from_slice(&x.to_le_bytes())),
            (D::Int16, _) => int::<i16>(element).map(|x| out.extend_from_slice(&x.to_le_bytes())),
            (D::Int32, _) => int::<i32>(element).map(|x| out.extend_from_slice(&x.to_le_bytes())),
            (D::Int64, _) => int::<i64>(element).map(|x| out.extend_from_slice(&x.to_le_bytes())),
            (D::Fp32, _) => {
                float.map(|x| x as f32).filter(|x| !x.is_infinite()).map(|x| out.extend_from_slice(&x.to_le_bytes()))
            }
            (D::Fp64, _) => float.map(|x| out.extend_from_slice(&x.to_le_bytes())),
            (D::Bytes, E::Text(s)) => {
                push_bytes_element(out, s.as_bytes());
                Some(())
            }
            _ => None,
        };
        if done.is_none() {
            return Read::Stopped;
        }
        self.elements += 1;
        Read::Done
    }
}

/// How the direct reading of one value ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Read {
    /// Read into the cursor.
    Done,
    /// `null` as the whole of `data`: no data.
    Null,
    /// Met something only the value reading words; the rest was skipped.
    Stopped,
}

/// One value of `data` at the level whose dimensions from here on are
/// `dims`: the whole of it (`top`), or an item of an array whose items so
/// far were all arrays (`kind` `Some(true)`) or all scalars.
struct Item<'a> {
    at: &'a mut Cursor,
    dims: &'a [i64],
    kind: &'a mut Option<bool>,
    top: bool,
}

impl Item<'_> {
    /// A scalar here: the whole of `data`, or one more item of an array of
    /// scalars.
    fn scalar(self, element: Element) -> Read {
        if !self.top && *self.kind.get_or_insert(false) {
            return Read::Stopped;
        }
        self.at.scalar(element)
    }
}

impl<'de> DeserializeSeed<'de> for Item<'_> {
    type Value = Read;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Read, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Item<'_> {
    type Value = Read;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("tensor data")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Read, E> {
        Ok(self.scalar(Element::Bool(v)))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Read, E> {
        Ok(self.scalar(Element::Signed(v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Read, E> {
        Ok(self.scalar(Element::Unsigned(v)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Read, E> {
        Ok(self.scalar(Element::Float(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Read, E> {
        Ok(self.scalar(Element::Text(v)))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Read, E> {
        Ok(if self.top { Read::Null } else { Read::Stopped })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Read, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Read::Stopped)
    }

    /// An array: the whole of `data` at the top, else one item of an array
    /// of arrays, which must hold the elements of the rest of the shape.
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Read, A::Error> {
        if self.top {
            return array(seq, self.at, self.dims);
        }
        let inner = match self.dims.split_first() {
            Some((_, inner)) if *self.kind.get_or_insert(true) => inner,
            _ => return skip(seq),
        };
        let before = self.at.elements;
        let read = array(seq, self.at, inner)?;
        let held = self.at.elements - before;
        Ok(if read == Read::Done && Some(held) != element_count(inner) { Read::Stopped } else { read })
    }
}

/// Reads the items of an array whose dimensions from here on are `dims`:
/// all scalars, or `dims[0]` arrays, each holding the rest of the shape.
fn array<'de, A: SeqAccess<'de>>(mut seq: A, at: &mut Cursor, dims: &[i64]) -> Result<Read, A::Error> {
    let mut kind = None;
    let mut items = 0i64;
    while let Some(read) = seq.next_element_seed(Item { at: &mut *at, dims, kind: &mut kind, top: false })? {
        if read == Read::Stopped {
            return skip(seq);
        }
        items += 1;
    }
    let whole = kind != Some(true) || dims.first() == Some(&items);
    Ok(if whole { Read::Done } else { Read::Stopped })
}

/// Reads past the rest of an array (a deserializer wants every item read).
fn skip<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<Read, A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(Read::Stopped)
}

//! Where a tensor lives in shared memory, as a request says it: the
//! parameters `shared_memory_region`, `shared_memory_offset` and
//! `shared_memory_byte_size` of an input or a requested output (Triton's
//! shared memory extension, `docs/protocol/extension_shared_memory.md`).
//! The regions themselves are the server's (`server::shared_memory`); this
//! layer only reads the parameters and asks for the bytes through
//! [`Regions`].

use super::parameters::{Parameters, Value};
use crate::error::Error;
use crate::tensor::{Tensor, element_count, request_datatype};

/// The parameter naming a registered region.
pub const REGION: &str = "shared_memory_region";
/// The parameter giving the tensor's first byte in the region (default 0).
pub const OFFSET: &str = "shared_memory_offset";
/// The parameter giving the tensor's size in the region, in bytes.
pub const BYTE_SIZE: &str = "shared_memory_byte_size";

/// A tensor's bytes in a registered region: `byte_size` bytes from `offset`
/// (both in bytes, from the start of the region).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionRef {
    /// The region's name, as registered.
    pub region: String,
    /// Offset of the tensor's first byte in the region.
    pub offset: u64,
    /// The tensor's size: its raw data, or for BYTES the serialised
    /// elements (each a 4-byte little-endian length and its bytes).
    pub byte_size: u64,
}

impl RegionRef {
    /// The place the `parameters` of `tensor` (an input or a requested
    /// output) give, `None` when they name no region.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a region that is not a string, an
    /// offset or size that is not a non-negative integer (Triton's gRPC text:
    /// `invalid value type for 'K' parameter for tensor 'T'`), an offset or a
    /// size without a region, or a region without a size (Triton's texts).
    pub fn from_parameters(tensor: &str, parameters: &Parameters) -> Result<Option<RegionRef>, Error> {
        let kind = |key: &str, expected: &str, value: &Value| {
            Error::InvalidArgument(format!(
                "invalid value type for '{key}' parameter for tensor '{tensor}', expected {expected}, got {value}"
            ))
        };
        let number = |key: &str| match parameters.get(key) {
            None => Ok(None),
            Some(v) => v.as_uint().map(Some).ok_or_else(|| kind(key, "a non-negative integer", v)),
        };
        let region = match parameters.get(REGION) {
            None => None,
            Some(Value::Text(s)) => Some(s.clone()),
            Some(v) => return Err(kind(REGION, "a string", v)),
        };
        let (offset, byte_size) = (number(OFFSET)?, number(BYTE_SIZE)?);
        let Some(region) = region else {
            for (key, given) in [(OFFSET, offset.is_some()), (BYTE_SIZE, byte_size.is_some())] {
                if given {
                    return Err(Error::InvalidArgument(format!(
                        "'{key}' can not be specified without '{REGION}' parameter for tensor '{tensor}'"
                    )));
                }
            }
            return Ok(None);
        };
        let byte_size = byte_size.ok_or_else(|| {
            Error::InvalidArgument(format!(
                "'{BYTE_SIZE}' must be specified along with '{REGION}' parameter for tensor '{tensor}'"
            ))
        })?;
        Ok(Some(RegionRef { region, offset: offset.unwrap_or(0), byte_size }))
    }
}

/// The input `name` of `model` (`datatype` its v2 name, `shape` its full
/// shape) whose data is the bytes `at` names.
///
/// # Errors
/// [`Error::InvalidArgument`] for an unknown datatype or bad shape, a
/// size that is not the shape's (Triton's text: `input byte size mismatch
/// for input 'X' for model 'M'. Expected E, got G`), or BYTES elements that do not fill
/// the shape; the errors of [`Regions::read`].
pub fn input_tensor(
    model: &str,
    name: String,
    datatype: &str,
    shape: Vec<i64>,
    at: &RegionRef,
    regions: &dyn Regions,
) -> Result<Tensor, Error> {
    let bad = |m: String| Error::InvalidArgument(format!("input '{name}': {m}"));
    let datatype = request_datatype(datatype, &shape).map_err(bad)?;
    // The place first, then its size, in Triton's order; both before a
    // byte is copied, so a place larger than the shape costs nothing.
    regions.check(at)?;
    if let Some(size) = datatype.element_size() {
        let expected = element_count(&shape).and_then(|n| n.checked_mul(size));
        if expected.is_none_or(|n| n as u64 != at.byte_size) {
            return Err(Error::InvalidArgument(format!(
                "input byte size mismatch for input '{name}' for model '{model}'. Expected {}, got {} (shape {shape:?} of {datatype}, \
                 from shared memory region '{}')",
                expected.map_or_else(|| "more than fits in memory".to_owned(), |n| n.to_string()),
                at.byte_size,
                at.region
            )));
        }
    }
    let data = regions.read(at)?;
    let tensor = Tensor { data, name, datatype, shape };
    tensor.check_data().map_err(|m| Error::InvalidArgument(format!("shared memory data of {m}")))?;
    Ok(tensor)
}

/// Reads tensors out of the registered regions, for one request; the
/// server's registry implements it.
pub trait Regions {
    /// Whether `at` names a registered region and a range within it.
    ///
    /// # Errors
    /// Triton's: [`Error::NotFound`] `Unable to find shared memory region:
    /// 'N'` for a region not registered, [`Error::InvalidArgument`] for an
    /// offset or size past the region's end.
    fn check(&self, at: &RegionRef) -> Result<(), Error>;

    /// A copy of the `byte_size` bytes `at` names.
    ///
    /// # Errors
    /// As [`Regions::check`]; [`Error::InvalidArgument`] when the request's
    /// inputs would read more than the server lets one request read.
    fn read(&self, at: &RegionRef) -> Result<Vec<u8>, Error>;
}

/// No region registered: decoding in unit tests, where there is no server.
#[cfg(test)]
pub struct NoRegions;

#[cfg(test)]
impl Regions for NoRegions {
    fn check(&self, at: &RegionRef) -> Result<(), Error> {
        Err(Error::NotFound(format!("Unable to find shared memory region: '{}'", at.region)))
    }

    fn read(&self, at: &RegionRef) -> Result<Vec<u8>, Error> {
        self.check(at).map(|()| Vec::new())
    }
}

//! Request parameters as both front ends carry them, and which ones Plinth
//! acts on. The v2 protocol lets a request, each input and each requested
//! output carry any `parameters`: over HTTP a JSON object, over gRPC a map
//! of `InferParameter` (or `ModelRepositoryParameter`). Each front end turns
//! its own form into [`Parameters`] and every rule that reads them is
//! written once, against that type (`request`, `repository`,
//! `shared_memory`).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer};

use crate::error::Error;

/// One parameter's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A boolean (JSON `true`/`false`, gRPC `bool_param`).
    Bool(bool),
    /// A negative integer from JSON, or any gRPC `int64_param`.
    Int(i64),
    /// A non-negative JSON integer, or a gRPC `uint64_param`.
    Uint(u64),
    /// A JSON number with a fraction or exponent, or a gRPC `double_param`.
    Double(f64),
    /// A string (JSON string, gRPC `string_param`).
    Text(String),
    /// Raw bytes (gRPC `bytes_param` of a repository request).
    Bytes(Vec<u8>),
    /// A JSON array or object (HTTP only).
    Json(serde_json::Value),
}

impl Value {
    /// The value as a non-negative integer, whichever integer kind carries
    /// it; `None` for a negative number or any other kind.
    pub fn as_uint(&self) -> Option<u64> {
        match *self {
            Value::Uint(n) => Some(n),
            Value::Int(n) => u64::try_from(n).ok(),
            _ => None,
        }
    }

    /// The JSON form of the value: the HTTP front end's value itself, or
    /// `None` for one that has no JSON form (`null` never reaches here).
    fn from_json(value: serde_json::Value) -> Option<Value> {
        use serde_json::Value as J;
        Some(match value {
            J::Null => return None,
            J::Bool(b) => Value::Bool(b),
            J::Number(n) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => Value::Uint(u),
                (None, Some(i)) => Value::Int(i),
                _ => Value::Double(n.as_f64().unwrap_or(f64::NAN)),
            },
            J::String(s) => Value::Text(s),
            other => Value::Json(other),
        })
    }
}

/// Values print the same whichever front end carried them, so that one
/// request gets one error text over HTTP and gRPC.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int(n) => write!(f, "{n}"),
            Value::Uint(n) => write!(f, "{n}"),
            Value::Double(x) => write!(f, "{x}"),
            Value::Text(s) => write!(f, "{s:?}"),
            Value::Bytes(b) => write!(f, "{} bytes", b.len()),
            Value::Json(v) => write!(f, "{v}"),
        }
    }
}

/// The parameters of a request, an input, an output or a repository
/// request, by key. A JSON `null` (and a gRPC parameter with no value set)
/// is no parameter at all, as the KServe Python server sends it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parameters(BTreeMap<String, Value>);

impl Parameters {
    /// The parameter `key`, if given.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key)
    }

    /// Whether `key` is given.
    pub fn contains(&self, key: &str) -> bool {
        self.0.contains_key(key)
    }

    /// Sets `key` (a front end reading its own form; tests).
    pub fn insert(&mut self, key: impl Into<String>, value: Value) {
        self.0.insert(key.into(), value);
    }

    /// Every parameter, by key in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `key` as a non-negative integer (an unsigned or a non-negative
    /// signed integer of either front end); `what` names whose parameter it
    /// is in the error (`request`, `output 'y'`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the parameter and the value given.
    pub fn uint(&self, key: &str, what: &str) -> Result<Option<u64>, Error> {
        self.read(key, what, "a non-negative integer", Value::as_uint)
    }

    /// `key` as a boolean.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the parameter and the value given.
    pub fn bool(&self, key: &str, what: &str) -> Result<Option<bool>, Error> {
        self.read(key, what, "a boolean", |v| match v {
            Value::Bool(b) => Some(*b),
            _ => None,
        })
    }

    /// `key` as a string.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the parameter and the value given.
    pub fn text(&self, key: &str, what: &str) -> Result<Option<&str>, Error> {
        self.read(key, what, "a string", |v| match v {
            Value::Text(s) => Some(s.as_str()),
            _ => None,
        })
    }

    /// `key` read by `read`, which returns `None` for a value that is not
    /// `expected`.
    fn read<'a, T>(
        &'a self,
        key: &str,
        what: &str,
        expected: &str,
        read: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<Option<T>, Error> {
        let Some(value) = self.get(key) else { return Ok(None) };
        read(value)
            .map(Some)
            .ok_or_else(|| Error::InvalidArgument(format!("{what} parameter '{key}' must be {expected}, got {value}")))
    }
}

impl FromIterator<(String, Value)> for Parameters {
    fn from_iter<I: IntoIterator<Item = (String, Value)>>(items: I) -> Parameters {
        Parameters(items.into_iter().collect())
    }
}

/// The HTTP front end's form: a JSON object (or `null`, which is none).
impl<'de> Deserialize<'de> for Parameters {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Parameters, D::Error> {
        let map = Option::<serde_json::Map<String, serde_json::Value>>::deserialize(d)?.unwrap_or_default();
        Ok(map.into_iter().filter_map(|(k, v)| Some((k, Value::from_json(v)?))).collect())
    }
}

/// The front end a request came through. They differ where Triton's do:
/// the binary tensor data extension (`binary_data_output`,
/// `binary_data_size`, `binary_data`) is HTTP's only
/// (`docs/protocol/extension_binary_data.md`: gRPC always sends tensors as
/// raw bytes), and a repository request's file is base64 text over HTTP
/// and a `bytes_param` over gRPC (`extension_model_repository.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Front {
    /// HTTP/REST (JSON and binary tensor data).
    Http,
    /// gRPC (`ModelInfer`, `ModelStreamInfer`).
    Grpc,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_values_read_as_the_same_kinds_as_grpc_ones() {
        let p: Parameters =
            serde_json::from_str(r#"{"a": 3, "b": -3, "c": 1.5, "d": "x", "e": true, "f": null, "g": [1]}"#).unwrap();
        assert_eq!(p.get("a"), Some(&Value::Uint(3)));
        assert_eq!(p.get("b"), Some(&Value::Int(-3)));
        assert_eq!(p.get("c"), Some(&Value::Double(1.5)));
        assert_eq!(p.get("d"), Some(&Value::Text("x".into())));
        assert_eq!(p.get("e"), Some(&Value::Bool(true)));
        assert_eq!(p.get("f"), None, "null is no parameter");
        assert_eq!(p.get("g"), Some(&Value::Json(serde_json::json!([1]))));
        assert_eq!(serde_json::from_str::<Parameters>("null").unwrap(), Parameters::default());
    }

    #[test]
    fn typed_reads_accept_either_integer_kind_and_name_the_value_otherwise() {
        let p: Parameters = [("u".into(), Value::Uint(5)), ("i".into(), Value::Int(5)), ("n".into(), Value::Int(-1))]
            .into_iter()
            .collect();
        assert_eq!(p.uint("u", "request").unwrap(), Some(5));
        assert_eq!(p.uint("i", "request").unwrap(), Some(5));
        assert_eq!(p.uint("absent", "request").unwrap(), None);
        let e = p.uint("n", "request").unwrap_err().to_string();
        assert_eq!(e, "request parameter 'n' must be a non-negative integer, got -1");
        let e = p.bool("u", "output 'y'").unwrap_err().to_string();
        assert_eq!(e, "output 'y' parameter 'u' must be a boolean, got 5");
    }
}

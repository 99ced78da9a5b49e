//! The request fields every text-generation route shares, read from a JSON
//! object with vLLM's names (which OpenAI's are a subset of): the
//! sampling parameters, `max_tokens`, `stop` and `stop_token_ids`. Each
//! field is checked and removed, so a route refuses whatever is left.

use serde_json::{Map, Value};

use crate::generate::Sampling;
use crate::generate::text::TextRequest;

/// The most `logprobs` alternatives a token may carry (OpenAI's limit).
pub const MAX_LOGPROBS: usize = 20;

/// A field that is not what it must be: its name and why.
#[derive(Debug, PartialEq, Eq)]
pub struct FieldError {
    pub field: &'static str,
    pub message: String,
}

fn bad(field: &'static str, message: impl Into<String>) -> FieldError {
    FieldError { field, message: message.into() }
}

/// Takes `field` out of `fields`; `None` when absent or `null`.
fn take(fields: &mut Map<String, Value>, field: &str) -> Option<Value> {
    fields.remove(field).filter(|v| !v.is_null())
}

/// A number of `field` within `min..=max`.
fn number(fields: &mut Map<String, Value>, field: &'static str, min: f64, max: f64) -> Result<Option<f32>, FieldError> {
    let Some(v) = take(fields, field) else { return Ok(None) };
    match v.as_f64() {
        Some(x) if (min..=max).contains(&x) => Ok(Some(x as f32)),
        _ => Err(bad(field, format!("'{field}' must be a number from {min} to {max}, got {v}"))),
    }
}

/// A whole number of `field` within `min..=max`.
fn whole(fields: &mut Map<String, Value>, field: &'static str, min: i64, max: i64) -> Result<Option<i64>, FieldError> {
    let Some(v) = take(fields, field) else { return Ok(None) };
    match v.as_i64() {
        Some(x) if (min..=max).contains(&x) => Ok(Some(x)),
        _ => Err(bad(field, format!("'{field}' must be a whole number from {min} to {max}, got {v}"))),
    }
}

/// Reads the shared fields out of `fields` into a request without a
/// prompt. `logprobs` is the route's own (OpenAI's completions take a
/// number, its chat a flag and `top_logprobs`), so it is left.
///
/// # Errors
/// The first field that is out of range or of the wrong type.
pub fn read(fields: &mut Map<String, Value>) -> Result<TextRequest, FieldError> {
    let max_tokens = match whole(fields, "max_tokens", 1, i64::from(u32::MAX))? {
        Some(n) => Some(n),
        None => whole(fields, "max_completion_tokens", 1, i64::from(u32::MAX))?,
    };
    let d = Sampling::default();
    let top_k = match whole(fields, "top_k", -1, i64::from(u32::MAX))? {
        None | Some(-1 | 0) => None,
        Some(k) => Some(k as usize),
    };
    let seed = match take(fields, "seed") {
        None => None,
        Some(v) => {
            Some(v.as_i64().ok_or_else(|| bad("seed", format!("'seed' must be a whole number, got {v}")))? as u64)
        }
    };
    let sampling = Sampling {
        temperature: number(fields, "temperature", 0.0, 100.0)?.unwrap_or(d.temperature),
        top_k,
        top_p: number(fields, "top_p", f64::MIN_POSITIVE, 1.0)?.unwrap_or(d.top_p),
        min_p: number(fields, "min_p", 0.0, 1.0)?.unwrap_or(d.min_p),
        seed,
        repetition_penalty: number(fields, "repetition_penalty", f64::MIN_POSITIVE, 100.0)?
            .unwrap_or(d.repetition_penalty),
        presence_penalty: number(fields, "presence_penalty", -2.0, 2.0)?.unwrap_or(d.presence_penalty),
        frequency_penalty: number(fields, "frequency_penalty", -2.0, 2.0)?.unwrap_or(d.frequency_penalty),
        logprobs: None,
    };
    let stop = match take(fields, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(list)) => list
            .into_iter()
            .map(|s| match s {
                Value::String(s) => Ok(s),
                other => Err(bad("stop", format!("'stop' must be a string or a list of strings, got {other}"))),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(bad("stop", format!("'stop' must be a string or a list of strings, got {other}"))),
    };
    let stop_token_ids = match take(fields, "stop_token_ids") {
        None => Vec::new(),
        Some(v) => serde_json::from_value::<Vec<u32>>(v.clone())
            .map_err(|_| bad("stop_token_ids", format!("'stop_token_ids' must be a list of token ids, got {v}")))?,
    };
    match whole(fields, "n", 1, i64::MAX)? {
        None | Some(1) => {}
        Some(n) => return Err(bad("n", format!("'n' is {n}; Plinth generates one choice per request (n = 1)"))),
    }
    Ok(TextRequest { prompt: None, max_tokens: max_tokens.map(|n| n as usize), sampling, stop, stop_token_ids })
}

/// `logprobs` as a count of alternatives (OpenAI's completions, vLLM).
///
/// # Errors
/// A count outside `0..=`[`MAX_LOGPROBS`].
pub fn logprobs_count(fields: &mut Map<String, Value>, field: &'static str) -> Result<Option<usize>, FieldError> {
    Ok(whole(fields, field, 0, MAX_LOGPROBS as i64)?.map(|n| n as usize))
}

/// The first field left, refused by name.
///
/// # Errors
/// Names the field.
pub fn nothing_left(fields: &Map<String, Value>) -> Result<(), FieldError> {
    match fields.keys().next() {
        None => Ok(()),
        Some(field) => Err(FieldError {
            field: "body",
            message: format!("unsupported field '{field}': Plinth does not act on it, so it refuses it"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::{nothing_left, read};

    fn fields(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn the_shared_fields_are_read_checked_and_removed() {
        let mut f = fields(json!({"max_tokens": 5, "temperature": 0, "top_k": 3, "seed": 9, "stop": "\n",
                                   "stop_token_ids": [7], "n": 1, "tools": []}));
        let r = read(&mut f).unwrap();
        assert_eq!(
            (r.max_tokens, r.sampling.temperature, r.sampling.top_k, r.sampling.seed),
            (Some(5), 0.0, Some(3), Some(9))
        );
        assert_eq!((r.stop, r.stop_token_ids), (vec!["\n".to_owned()], vec![7]));
        assert!(nothing_left(&f).unwrap_err().message.contains("'tools'"));
        for (body, field) in [
            (json!({"max_tokens": 0}), "max_tokens"),
            (json!({"temperature": "hot"}), "temperature"),
            (json!({"top_p": 0}), "top_p"),
            (json!({"stop": [1]}), "stop"),
            (json!({"n": 3}), "n"),
        ] {
            assert_eq!(read(&mut fields(body)).unwrap_err().field, field);
        }
    }
}

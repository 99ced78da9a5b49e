//! The texts of a request body: JSON as OpenAI's embeddings API takes its
//! `input` (one string, or a list of strings), or a `text/plain` body as one
//! text.

use plinth_plugin_sdk::{Error, Request};

/// The texts `req` carries, in order.
///
/// - `text/*` content types: the body, UTF-8, is one text.
/// - anything else: a JSON object `{"input": "text"}` or
///   `{"input": ["text", ...]}` (OpenAI's `CreateEmbeddingRequest.input`).
///   Token-id inputs (lists of integers) and any other field are refused,
///   naming what was sent, so nothing is silently ignored.
///
/// # Errors
/// [`Error::BadInput`] for a body that is not UTF-8, not JSON of that shape,
/// or an empty list.
pub fn texts(req: &Request) -> Result<Vec<String>, Error> {
    let media = req.content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    if media.starts_with("text/") {
        let text = std::str::from_utf8(&req.body)
            .map_err(|e| Error::bad_input(format!("a {media} body must be UTF-8: {e}")))?;
        return Ok(vec![text.to_owned()]);
    }
    let value: serde_json::Value = serde_json::from_slice(&req.body).map_err(|e| {
        Error::bad_input(format!(
            "send JSON {{\"input\": \"text\"}} or {{\"input\": [\"text\", ...]}}, or a text/plain body: {e}"
        ))
    })?;
    let serde_json::Value::Object(object) = value else {
        return Err(Error::bad_input("the JSON body must be an object with an \"input\" field"));
    };
    if let Some(other) = object.keys().find(|k| *k != "input") {
        return Err(Error::bad_input(format!("unsupported field '{other}': this model reads \"input\" only")));
    }
    match object.get("input") {
        None => Err(Error::bad_input("the JSON body has no \"input\" field")),
        Some(serde_json::Value::String(text)) => Ok(vec![text.clone()]),
        Some(serde_json::Value::Array(items)) if items.is_empty() => {
            Err(Error::bad_input("\"input\" is an empty list: send at least one text"))
        }
        Some(serde_json::Value::Array(items)) => items.iter().enumerate().map(|(i, item)| text_item(i, item)).collect(),
        Some(other) => {
            Err(Error::bad_input(format!("\"input\" must be a string or a list of strings, got {}", kind(other))))
        }
    }
}

fn text_item(index: usize, item: &serde_json::Value) -> Result<String, Error> {
    match item {
        serde_json::Value::String(text) => Ok(text.clone()),
        serde_json::Value::Number(_) | serde_json::Value::Array(_) => Err(Error::bad_input(format!(
            "\"input\"[{index}] is {}: token-id input is not supported, send text",
            kind(item)
        ))),
        other => Err(Error::bad_input(format!("\"input\"[{index}] must be a string, got {}", kind(other)))),
    }
}

fn kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(content_type: &str, body: &str) -> Request {
        Request { content_type: content_type.into(), body: body.as_bytes().to_vec(), parameters: Vec::new() }
    }

    fn refusal(r: Result<Vec<String>, Error>) -> String {
        match r {
            Err(Error::BadInput(m)) => m,
            other => panic!("expected bad input, got {other:?}"),
        }
    }

    #[test]
    fn reads_one_text_a_list_and_plain_text() {
        assert_eq!(texts(&request("application/json", r#"{"input": "hi"}"#)).unwrap(), ["hi"]);
        assert_eq!(texts(&request("", r#"{"input": ["a", "b"]}"#)).unwrap(), ["a", "b"]);
        assert_eq!(texts(&request("text/plain; charset=utf-8", "{not json")).unwrap(), ["{not json"]);
    }

    #[test]
    fn refuses_token_ids_other_fields_and_empty_lists_naming_them() {
        assert!(refusal(texts(&request("application/json", r#"{"input": [[1, 2]]}"#))).contains("token-id"));
        assert!(
            refusal(texts(&request("application/json", r#"{"input": "a", "dimensions": 8}"#))).contains("dimensions")
        );
        assert!(refusal(texts(&request("application/json", r#"{"input": []}"#))).contains("empty"));
        assert!(refusal(texts(&request("application/json", "plain words"))).contains("text/plain"));
    }
}

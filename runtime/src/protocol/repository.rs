//! What a repository `load` or `unload` carries besides the model's name
//! (Triton's model repository extension,
//! `docs/protocol/extension_model_repository.md`), read once for both front
//! ends from [`Parameters`]: a load's `config` override and
//! `file:<version>/<name>` files that make up an override model folder
//! ("load from memory"), an unload's `unload_dependents`.

use std::collections::BTreeMap;

use super::parameters::{Front, Parameters, Value};
use crate::error::Error;

/// A load's parameters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadRequest {
    /// `config`: a JSON model configuration used instead of `config.pbtxt`.
    pub config: Option<String>,
    /// `file:<version>/<name>`: the files of the model folder to load
    /// instead of the repository's, by path relative to the model folder.
    pub files: BTreeMap<String, Vec<u8>>,
    /// `rollout`: a JSON rollout plan started once the load is done
    /// (Plinth's; see `rollout::Plan`).
    pub rollout: Option<String>,
}

/// The prefix of a file parameter's key.
pub const FILE_PREFIX: &str = "file:";

impl LoadRequest {
    /// A load with only a configuration override (or none).
    #[cfg(test)]
    pub fn config(config: Option<String>) -> LoadRequest {
        LoadRequest { config, ..LoadRequest::default() }
    }
}

/// A load's parameters as they came through `front`. `config` is a string
/// holding JSON (over HTTP also a JSON object, which Plinth takes as its
/// text). A file's content is base64 text over HTTP and a `bytes_param`
/// over gRPC, as in Triton.
///
/// # Errors
/// [`Error::InvalidArgument`] naming a parameter that is neither, or one
/// of the wrong kind.
pub fn load_request(front: Front, parameters: &Parameters) -> Result<LoadRequest, Error> {
    use base64::Engine;
    let mut load = LoadRequest::default();
    for (key, value) in parameters.iter() {
        if key == "config" {
            load.config = Some(match value {
                Value::Text(s) => s.clone(),
                Value::Json(object @ serde_json::Value::Object(_)) if front == Front::Http => object.to_string(),
                other => {
                    return Err(Error::InvalidArgument(format!(
                        "parameter 'config' must be a string holding a JSON model configuration, got {other}"
                    )));
                }
            });
        } else if key == "rollout" {
            load.rollout = Some(match value {
                Value::Text(s) => s.clone(),
                Value::Json(object @ serde_json::Value::Object(_)) if front == Front::Http => object.to_string(),
                other => {
                    return Err(Error::InvalidArgument(format!(
                        "parameter 'rollout' must be a string holding a JSON rollout plan, got {other}"
                    )));
                }
            });
        } else if let Some(path) = key.strip_prefix(FILE_PREFIX) {
            let bytes = match (front, value) {
                (Front::Http, Value::Text(text)) => base64::engine::general_purpose::STANDARD.decode(text).ok(),
                (Front::Grpc, Value::Bytes(bytes)) => Some(bytes.clone()),
                _ => None,
            };
            let expected = match front {
                Front::Http => "in base64",
                Front::Grpc => "as a bytes_param",
            };
            let bytes = bytes.ok_or_else(|| {
                Error::InvalidArgument(format!("parameter '{key}' must be the file's content {expected}"))
            })?;
            load.files.insert(path.to_owned(), bytes);
        } else {
            return Err(Error::InvalidArgument(format!(
                "unknown load parameter '{key}'; a load takes 'config', 'rollout' and '{FILE_PREFIX}<version>/<name>'"
            )));
        }
    }
    Ok(load)
}

/// An unload's `unload_dependents` (false when absent).
///
/// # Errors
/// [`Error::InvalidArgument`] for any other parameter, or a value that is
/// not a boolean.
pub fn unload_dependents(parameters: &Parameters) -> Result<bool, Error> {
    if let Some((other, _)) = parameters.iter().find(|(key, _)| *key != "unload_dependents") {
        return Err(Error::InvalidArgument(format!(
            "unknown unload parameter '{other}'; an unload takes 'unload_dependents'"
        )));
    }
    Ok(parameters.bool("unload_dependents", "unload")?.unwrap_or(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(key: &str, value: Value) -> Parameters {
        [(key.to_owned(), value)].into_iter().collect()
    }

    #[test]
    fn files_come_as_base64_over_http_and_bytes_over_grpc() {
        let http = load_request(Front::Http, &one("file:1/model.onnx", Value::Text("d2VpZ2h0cw==".into()))).unwrap();
        let grpc = load_request(Front::Grpc, &one("file:1/model.onnx", Value::Bytes(b"weights".to_vec()))).unwrap();
        assert_eq!(http, grpc);
        assert_eq!(http.files["1/model.onnx"], b"weights");
        let e = load_request(Front::Grpc, &one("file:1/m", Value::Text("d2U=".into()))).unwrap_err().to_string();
        assert_eq!(e, "parameter 'file:1/m' must be the file's content as a bytes_param");
        let e = load_request(Front::Http, &one("file:1/m", Value::Text("%%".into()))).unwrap_err().to_string();
        assert_eq!(e, "parameter 'file:1/m' must be the file's content in base64");
    }

    #[test]
    fn config_is_json_text_or_over_http_an_object() {
        let text = load_request(Front::Grpc, &one("config", Value::Text("{}".into()))).unwrap();
        assert_eq!(text.config.as_deref(), Some("{}"));
        let object = serde_json::json!({"max_batch_size": 2});
        let http = load_request(Front::Http, &one("config", Value::Json(object.clone()))).unwrap();
        assert_eq!(http.config.as_deref(), Some(r#"{"max_batch_size":2}"#));
        let e = load_request(Front::Grpc, &one("config", Value::Json(object))).unwrap_err().to_string();
        assert!(e.starts_with("parameter 'config' must be a string holding a JSON model configuration"), "{e}");
        let e = load_request(Front::Http, &one("model", Value::Bool(true))).unwrap_err().to_string();
        assert_eq!(e, "unknown load parameter 'model'; a load takes 'config', 'rollout' and 'file:<version>/<name>'");
    }

    #[test]
    fn unload_takes_only_a_boolean_unload_dependents() {
        assert!(!unload_dependents(&Parameters::default()).unwrap());
        assert!(unload_dependents(&one("unload_dependents", Value::Bool(true))).unwrap());
        let e = unload_dependents(&one("unload_dependents", Value::Uint(1))).unwrap_err().to_string();
        assert_eq!(e, "unload parameter 'unload_dependents' must be a boolean, got 1");
        let e = unload_dependents(&one("force", Value::Bool(true))).unwrap_err().to_string();
        assert!(e.starts_with("unknown unload parameter 'force'"), "{e}");
    }
}

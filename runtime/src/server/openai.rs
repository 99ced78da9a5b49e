//! OpenAI-compatible routes over the models that opt in, so that clients
//! written for OpenAI's API (its Python and JavaScript libraries, LangChain
//! and the like, pointed at Plinth with their base URL) work unchanged:
//! `POST /v1/embeddings` and `GET /v1/models[/{model}]`, as OpenAI's API
//! reference ("Embeddings", "Models") specifies them, with its error shape.
//!
//! The server stays generic: it knows nothing of tokenizers or pooling. A
//! model opts in with the `config.pbtxt` parameter [`EMBEDDINGS_PARAMETER`]
//! set to `true`, which promises that its `/predict` takes the JSON body
//! `{"input": ...}` (OpenAI's `input`) and answers OpenAI's embedding list
//! (`{"data": [{"object": "embedding", "index": i, "embedding": [...]}],
//! "usage": {...}}`); `plugins/text-embedding` is such a plugin. This module
//! checks the request's other fields, sends `input` through the model's
//! `/predict`, names the model in the answer and encodes the vectors as the
//! request asks (`encoding_format`).

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{Map, Value, json};

use super::body;
use super::error::{ApiError, respond};
use super::service::Service;
use crate::error::Error;
use crate::model::Model;
use crate::plugin::RawRequest;

/// The `config.pbtxt` parameter by which a model opts in to
/// `/v1/embeddings` and `/v1/models`: `parameters { key: "openai.embeddings"
/// value: { string_value: "true" } }`.
pub const EMBEDDINGS_PARAMETER: &str = "openai.embeddings";

/// `owned_by` of every model `/v1/models` lists.
const OWNER: &str = "plinth";

/// An error answer in OpenAI's shape: the status, and
/// `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct OpenAiError {
    pub status: StatusCode,
    /// What went wrong, for the client.
    pub message: String,
    /// The request field at fault, if one is.
    pub param: Option<&'static str>,
    /// A machine-readable code (`model_not_found`), if one applies.
    pub code: Option<&'static str>,
    /// Seconds for `Retry-After` (an overload 503).
    pub retry_after_secs: Option<u64>,
}

impl OpenAiError {
    /// A 400 about the request field `param`.
    pub(super) fn invalid(param: &'static str, message: impl Into<String>) -> OpenAiError {
        OpenAiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: Some(param),
            code: None,
            retry_after_secs: None,
        }
    }

    /// A 404 for a model that does not exist or does not serve this API.
    pub(super) fn model_not_found(message: impl Into<String>) -> OpenAiError {
        OpenAiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            param: Some("model"),
            code: Some("model_not_found"),
            retry_after_secs: None,
        }
    }
}

impl From<ApiError> for OpenAiError {
    fn from(e: ApiError) -> OpenAiError {
        OpenAiError {
            status: e.status,
            message: e.message,
            param: None,
            code: None,
            retry_after_secs: e.retry_after_secs,
        }
    }
}

impl From<Error> for OpenAiError {
    fn from(e: Error) -> OpenAiError {
        if matches!(e, Error::NotFound(_)) {
            return OpenAiError::model_not_found(e.to_string());
        }
        ApiError::from(e).into()
    }
}

/// OpenAI's error `type` for a status: its clients read the status; the
/// type names the class as OpenAI's own answers do.
fn error_type(status: StatusCode) -> &'static str {
    match status {
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        s if s.is_server_error() => "server_error",
        _ => "invalid_request_error",
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": {
            "message": self.message,
            "type": error_type(self.status),
            "param": self.param,
            "code": self.code,
        }});
        respond(self.status, &self.message, body, self.retry_after_secs)
    }
}

/// Rewrites an error that a layer outside these handlers answered in the
/// KServe shape (`{"error": "text"}`: shutdown, a restricted API) into
/// OpenAI's, keeping its status and headers.
pub async fn error_shape(response: Response) -> Response {
    let (parts, body) = response.into_parts();
    if parts.status.is_success() {
        return Response::from_parts(parts, body);
    }
    let Ok(bytes) = axum::body::to_bytes(body, 1 << 20).await else {
        return Response::from_parts(parts, Body::empty());
    };
    let message = match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(o)) => match o.get("error") {
            Some(Value::String(message)) => message.clone(),
            _ => return Response::from_parts(parts, Body::from(bytes)),
        },
        _ => return Response::from_parts(parts, Body::from(bytes)),
    };
    let mut rewritten =
        OpenAiError { status: parts.status, message, param: None, code: None, retry_after_secs: None }.into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_LENGTH && name != header::CONTENT_TYPE {
            rewritten.headers_mut().insert(name, value.clone());
        }
    }
    rewritten
}

/// How the vectors are written in the answer (`encoding_format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncodingFormat {
    /// JSON numbers.
    Float,
    /// Base64 of the vector's FP32 values, little-endian (what OpenAI's
    /// Python library asks for by default).
    Base64,
}

/// A `POST /v1/embeddings` body, checked (OpenAI's
/// `CreateEmbeddingRequest`).
#[derive(Debug)]
pub struct EmbeddingsRequest {
    /// The model to run: a model of the repository that opts in.
    pub model: String,
    /// `input` as sent: a string or a list of strings; the model's plugin
    /// checks it.
    pub input: Value,
    /// How the answer writes the vectors.
    pub encoding_format: EncodingFormat,
}

impl EmbeddingsRequest {
    /// Reads and checks a request body. `user` (an end-user id, for abuse
    /// monitoring) is taken and logged; `dimensions` and any field OpenAI's
    /// API does not define are refused, naming the field.
    ///
    /// # Errors
    /// A 400 [`OpenAiError`] naming the field at fault.
    pub fn parse(body: &[u8]) -> Result<EmbeddingsRequest, OpenAiError> {
        let mut fields = body_object(body)?;
        let model = match fields.remove("model") {
            Some(Value::String(model)) => model,
            Some(_) => return Err(OpenAiError::invalid("model", "'model' must be a string")),
            None => return Err(OpenAiError::invalid("model", "'model' is required: the name of an embedding model")),
        };
        let input = fields.remove("input").ok_or_else(|| {
            OpenAiError::invalid("input", "'input' is required: a string or a list of strings to embed")
        })?;
        let encoding_format = match fields.remove("encoding_format") {
            None | Some(Value::Null) => EncodingFormat::Float,
            Some(Value::String(f)) if f == "float" => EncodingFormat::Float,
            Some(Value::String(f)) if f == "base64" => EncodingFormat::Base64,
            Some(other) => {
                return Err(OpenAiError::invalid(
                    "encoding_format",
                    format!("'encoding_format' must be \"float\" or \"base64\", got {other}"),
                ));
            }
        };
        match fields.remove("user") {
            None | Some(Value::Null) => {}
            Some(Value::String(user)) => tracing::debug!(%user, model = %model, "embeddings request"),
            Some(_) => return Err(OpenAiError::invalid("user", "'user' must be a string")),
        }
        if fields.contains_key("dimensions") {
            return Err(OpenAiError::invalid(
                "dimensions",
                format!(
                    "'dimensions' is not supported: model '{model}' answers vectors of its own width; leave the field out"
                ),
            ));
        }
        if let Some(field) = fields.keys().next() {
            return Err(OpenAiError::invalid("body", format!("unsupported field '{field}'")));
        }
        Ok(EmbeddingsRequest { model, input, encoding_format })
    }
}

/// A request body of OpenAI's routes: a JSON object, its fields by name.
///
/// # Errors
/// A 400 about `body` when it is not JSON or not an object.
pub(super) fn body_object(body: &[u8]) -> Result<Map<String, Value>, OpenAiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| OpenAiError::invalid("body", format!("the request body is not JSON: {e}")))?;
    match value {
        Value::Object(fields) => Ok(fields),
        _ => Err(OpenAiError::invalid("body", "the request body must be a JSON object")),
    }
}

/// Whether `model` is listed by `/v1/models`: it serves embeddings (it
/// opts in) or generates text.
pub fn opts_in(model: &Model) -> bool {
    model.parameters.openai_embeddings || model.generative().is_some()
}

/// `POST /v1/embeddings`: OpenAI's create-embeddings call, run through the
/// model's `/predict`; the answer is OpenAI's embedding list with `model`
/// and the vectors in the requested encoding.
pub async fn embeddings(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    body: Result<body::Body, ApiError>,
) -> Result<Response, OpenAiError> {
    let body::Body(body) = body?;
    let request = EmbeddingsRequest::parse(&body)?;
    let accepted = service.accept(&request.model, None, &super::routes::header_of(&headers)).await?;
    if !accepted.model().parameters.openai_embeddings {
        return Err(OpenAiError::model_not_found(format!(
            "model '{}' does not serve embeddings: its config.pbtxt does not set the parameter '{EMBEDDINGS_PARAMETER}' to \"true\"",
            request.model
        )));
    }
    let raw = RawRequest {
        content_type: "application/json".into(),
        body: serde_json::to_vec(&json!({ "input": request.input })).expect("JSON values serialise"),
        parameters: Vec::new(),
    };
    let (_, answer, _timing) = accepted.predict(raw, Vec::new(), None).await.map_err(|e| match e {
        // The model's own refusal (a bad input) is about `input`.
        Error::InvalidArgument(m) => OpenAiError::invalid("input", m),
        other => other.into(),
    })?;
    let list = embedding_list(&request, &answer.body)?;
    Ok(Json(list).into_response())
}

/// The plugin's embedding list with `object` and `model` set and the
/// vectors encoded as `request` asks.
///
/// # Errors
/// A 500 when the answer is not an embedding list (the model's plugin does
/// not keep the promise of [`EMBEDDINGS_PARAMETER`]).
fn embedding_list(request: &EmbeddingsRequest, answer: &[u8]) -> Result<Map<String, Value>, OpenAiError> {
    let broken = |why: &str| {
        OpenAiError::from(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("model '{}' sets '{EMBEDDINGS_PARAMETER}' but its /predict answer {why}", request.model),
        ))
    };
    let Ok(Value::Object(mut list)) = serde_json::from_slice::<Value>(answer) else {
        return Err(broken("is not a JSON object"));
    };
    let Some(Value::Array(data)) = list.get_mut("data") else { return Err(broken("has no \"data\" list")) };
    for item in data.iter_mut() {
        let Some(Value::Array(vector)) = item.get_mut("embedding") else {
            return Err(broken("has an item without an \"embedding\" list"));
        };
        if request.encoding_format == EncodingFormat::Base64 {
            let mut bytes = Vec::with_capacity(vector.len() * 4);
            for x in vector.iter() {
                let x = x.as_f64().ok_or_else(|| broken("has an embedding value that is not a number"))?;
                bytes.extend_from_slice(&(x as f32).to_le_bytes());
            }
            item["embedding"] = Value::String(base64::engine::general_purpose::STANDARD.encode(bytes));
        }
    }
    list.insert("object".into(), json!("list"));
    list.insert("model".into(), json!(request.model));
    Ok(list)
}

/// OpenAI's model object for `model`.
fn model_object(model: &Model) -> Value {
    let created = model.loaded_at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    json!({ "id": model.name, "object": "model", "created": created, "owned_by": OWNER })
}

/// `GET /v1/models`: the READY models that opt in, by name, each once
/// (OpenAI's model list; `created` is when the served version was loaded).
pub async fn models(State(service): State<Arc<Service>>) -> Json<Value> {
    let mut ready = service.registry().ready_models(None);
    ready.retain(|m| opts_in(m));
    // The highest READY version of each name, which a request reaches.
    ready.sort_by(|a, b| a.name.cmp(&b.name).then(b.version.cmp(&a.version)));
    ready.dedup_by(|a, b| a.name == b.name);
    Json(json!({ "object": "list", "data": ready.iter().map(|m| model_object(m)).collect::<Vec<_>>() }))
}

/// `GET /v1/models/{model}`: one model of that list.
///
/// # Errors
/// 404 (`model_not_found`) for a model that is not READY or does not opt in.
pub async fn model(State(service): State<Arc<Service>>, Path(name): Path<String>) -> Result<Json<Value>, OpenAiError> {
    let model = service.registry().resolve(&name, None)?;
    if !opts_in(&model) {
        return Err(OpenAiError::model_not_found(format!("model '{name}' serves neither embeddings nor text")));
    }
    Ok(Json(model_object(&model)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(body: &str) -> (&'static str, String) {
        let e = EmbeddingsRequest::parse(body.as_bytes()).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        (e.param.unwrap(), e.message)
    }

    #[test]
    fn a_request_needs_model_and_input_and_refuses_what_plinth_does_not_do() {
        let ok =
            EmbeddingsRequest::parse(br#"{"model": "m", "input": ["a"], "encoding_format": "base64", "user": "u"}"#)
                .unwrap();
        assert_eq!((ok.model.as_str(), ok.encoding_format), ("m", EncodingFormat::Base64));
        assert_eq!(refused(r#"{"input": "a"}"#).0, "model");
        assert_eq!(refused(r#"{"model": "m"}"#).0, "input");
        let (param, message) = refused(r#"{"model": "m", "input": "a", "dimensions": 64}"#);
        assert!(param == "dimensions" && message.contains("'dimensions'"), "{message}");
        assert!(refused(r#"{"model": "m", "input": "a", "encoding_format": "int8"}"#).1.contains("int8"));
        assert!(refused(r#"{"model": "m", "input": "a", "temperature": 1}"#).1.contains("'temperature'"));
    }

    #[test]
    fn base64_holds_the_vector_as_little_endian_fp32() {
        let request =
            EmbeddingsRequest { model: "m".into(), input: json!("a"), encoding_format: EncodingFormat::Base64 };
        let answer = br#"{"data": [{"object": "embedding", "index": 0, "embedding": [1.0, -0.5]}], "usage": {}}"#;
        let list = embedding_list(&request, answer).unwrap();
        let encoded = list["data"][0]["embedding"].as_str().unwrap();
        let bytes = base64::engine::general_purpose::STANDARD.decode(encoded).unwrap();
        assert_eq!(bytes, [1.0f32.to_le_bytes(), (-0.5f32).to_le_bytes()].concat());
        assert_eq!((&list["model"], &list["object"]), (&json!("m"), &json!("list")));
    }

    #[test]
    fn errors_have_openai_s_shape() {
        let e = OpenAiError::from(Error::NotFound("no such model".into()));
        assert_eq!((e.status, e.code), (StatusCode::NOT_FOUND, Some("model_not_found")));
        assert_eq!(error_type(StatusCode::SERVICE_UNAVAILABLE), "server_error");
        assert_eq!(error_type(StatusCode::BAD_REQUEST), "invalid_request_error");
    }
}

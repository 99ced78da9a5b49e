//! Triton's generate extension (`docs/protocol/extension_generate.md` in
//! triton-inference-server/server): `POST /v2/models/{m}[/versions/{v}]/generate`
//! answers one JSON object, `generate_stream` a stream of server-sent
//! events, one JSON object each. The request is a JSON object of the
//! model's inputs by name (here `text_input`, and `exclude_input_in_output`
//! as in Triton's vLLM backend) and `parameters` (vLLM's sampling
//! parameters, `max_tokens` and `stop`); the answer holds `model_name`,
//! `model_version` and the output `text_output`. An error before the
//! stream starts is `{"error": "..."}` with its status; one after is an
//! event `{"error": "..."}` that ends the stream, as Triton sends it.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde_json::{Map, Value, json};

use super::body;
use super::error::ApiError;
use super::generation::{self, FieldError};
use super::routes::{ModelRef, header_of};
use super::service::Service;
use crate::generate::text::{self, TextEvent, TextRequest, TextStream};
use crate::lifecycle::Accepted;
use crate::plugin::Prompt;

/// A generate request, checked.
struct GenerateRequest {
    text: TextRequest,
    prompt: String,
    /// Leave the prompt out of a non-streamed `text_output` (Triton's vLLM
    /// backend's `exclude_input_in_output`; it is in unless set).
    exclude_input: bool,
}

impl From<FieldError> for ApiError {
    fn from(e: FieldError) -> ApiError {
        ApiError::bad_request(e.message)
    }
}

/// Reads a generate body; `stream` says which route it came to.
fn parse(body: &[u8], stream: bool) -> Result<GenerateRequest, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not JSON: {e}")))?;
    let Value::Object(mut fields) = value else {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    };
    let prompt = match fields.remove("text_input") {
        Some(Value::String(s)) => s,
        Some(other) => return Err(ApiError::bad_request(format!("'text_input' must be a string, got {other}"))),
        None => return Err(ApiError::bad_request("'text_input' is required: the prompt")),
    };
    let mut parameters = match fields.remove("parameters") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(p)) => p,
        Some(other) => return Err(ApiError::bad_request(format!("'parameters' must be a JSON object, got {other}"))),
    };
    let flag = |fields: &mut Map<String, Value>, parameters: &mut Map<String, Value>, key: &str| match fields
        .remove(key)
        .or_else(|| parameters.remove(key))
    {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(b)),
        Some(other) => Err(ApiError::bad_request(format!("'{key}' must be true or false, got {other}"))),
    };
    if let Some(asked) = flag(&mut fields, &mut parameters, "stream")?
        && asked != stream
    {
        let route = if stream { "generate_stream" } else { "generate" };
        return Err(ApiError::bad_request(format!("'stream' is {asked}, but this is the {route} route")));
    }
    let exclude_input = flag(&mut fields, &mut parameters, "exclude_input_in_output")?.unwrap_or(false);
    let mut text = generation::read(&mut parameters)?;
    generation::nothing_left(&parameters).map_err(|e| ApiError::bad_request(format!("parameters: {}", e.message)))?;
    if let Some(key) = fields.keys().next() {
        return Err(ApiError::bad_request(format!(
            "unknown input '{key}': a generative model takes text_input and exclude_input_in_output, and parameters"
        )));
    }
    text.prompt = Some(Prompt::Text(prompt.clone()));
    Ok(GenerateRequest { text, prompt, exclude_input })
}

/// Routes the request to the model and starts its stream.
async fn start(
    service: &Service,
    model: &ModelRef,
    headers: &HeaderMap,
    request: TextRequest,
) -> Result<(Accepted, TextStream), ApiError> {
    let accepted = service.accept(&model.name, model.version, &header_of(headers)).await?;
    let Some((generator, plugin)) = accepted.model().generative() else {
        return Err(ApiError::bad_request(format!(
            "model '{}' is not generative: generate needs model_transaction_policy {{ decoupled: true }}",
            model.name
        )));
    };
    let stream = text::start(plugin, generator, request).await?;
    Ok((accepted, stream))
}

/// `POST .../generate`: the whole text in one answer.
pub async fn generate(
    State(service): State<Arc<Service>>,
    model: ModelRef,
    headers: HeaderMap,
    body: Result<body::Body, ApiError>,
) -> Result<Response, ApiError> {
    let body::Body(body) = body?;
    let request = parse(&body, false)?;
    let (accepted, mut stream) = start(&service, &model, &headers, request.text).await?;
    let mut output = if request.exclude_input { String::new() } else { request.prompt };
    loop {
        match stream.next().await {
            Some(TextEvent::Chunk(chunk)) => output.push_str(&chunk.text),
            Some(TextEvent::End(..)) | None => break,
            Some(TextEvent::Failed(e)) => return Err(e.into()),
        }
    }
    let m = accepted.model();
    Ok(Json(json!({ "model_name": m.name, "model_version": m.version.to_string(), "text_output": output }))
        .into_response())
}

/// `POST .../generate_stream`: one event per piece of text.
pub async fn generate_stream(
    State(service): State<Arc<Service>>,
    model: ModelRef,
    headers: HeaderMap,
    body: Result<body::Body, ApiError>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let body::Body(body) = body?;
    let request = parse(&body, true)?;
    let (accepted, stream) = start(&service, &model, &headers, request.text).await?;
    let (name, version) = (accepted.model().name.clone(), accepted.model().version.to_string());
    let events = futures_util::stream::unfold(Some((accepted, stream)), move |state| {
        let (name, version) = (name.clone(), version.clone());
        async move {
            let (accepted, mut stream) = state?;
            let data = match stream.next().await? {
                TextEvent::Chunk(chunk) => {
                    json!({ "model_name": name, "model_version": version, "text_output": chunk.text })
                }
                TextEvent::End(..) => return None,
                TextEvent::Failed(e) => {
                    let event = SseEvent::default().data(json!({ "error": e.to_string() }).to_string());
                    return Some((Ok(event), None));
                }
            };
            Some((Ok(SseEvent::default().data(data.to_string())), Some((accepted, stream))))
        }
    });
    Ok(Sse::new(events))
}

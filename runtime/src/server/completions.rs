//! OpenAI's text routes over the generative models: `POST /v1/completions`
//! and `POST /v1/chat/completions`, answered whole or streamed as
//! server-sent events (`stream`), in the shapes of OpenAI's API reference
//! ("Completions", "Chat"), with vLLM's extra sampling parameters
//! (`top_k`, `min_p`, `repetition_penalty`, `stop_token_ids`). A field
//! Plinth does not act on (`tools`, `response_format`, `echo`, `suffix`,
//! `best_of`, ...) is refused by name.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::body;
use super::error::ApiError;
use super::generation::{self, FieldError};
use super::openai::OpenAiError;
use super::routes::header_of;
use super::service::Service;
use crate::generate::Choice;
use crate::generate::text::{self, Chunk, TextEvent, TextRequest, Usage};
use crate::lifecycle::Accepted;
use crate::plugin::{ChatMessage, Plugin, Prompt};

/// Which of the two routes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Completions,
    Chat,
}

/// A request of either route, checked.
struct CompletionRequest {
    model: String,
    text: TextRequest,
    stream: bool,
    include_usage: bool,
    /// Log probabilities asked for: how many alternatives per token.
    logprobs: Option<usize>,
}

impl From<FieldError> for OpenAiError {
    fn from(e: FieldError) -> OpenAiError {
        OpenAiError::invalid(e.field, e.message)
    }
}

fn parse(body: &[u8], route: Route) -> Result<CompletionRequest, OpenAiError> {
    let mut fields = super::openai::body_object(body)?;
    let model = match fields.remove("model") {
        Some(Value::String(model)) => model,
        _ => return Err(OpenAiError::invalid("model", "'model' is required: the name of a generative model")),
    };
    let prompt = match route {
        Route::Completions => completion_prompt(fields.remove("prompt"))?,
        Route::Chat => chat_prompt(fields.remove("messages"))?,
    };
    let stream = match fields.remove("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => b,
        Some(other) => {
            return Err(OpenAiError::invalid("stream", format!("'stream' must be true or false, got {other}")));
        }
    };
    let include_usage = match fields.remove("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(mut o)) => {
            let include = matches!(o.remove("include_usage"), Some(Value::Bool(true)));
            if let Some(key) = o.keys().next() {
                return Err(OpenAiError::invalid(
                    "stream_options",
                    format!("unsupported field 'stream_options.{key}'"),
                ));
            }
            include
        }
        Some(other) => {
            return Err(OpenAiError::invalid(
                "stream_options",
                format!("'stream_options' must be an object, got {other}"),
            ));
        }
    };
    if fields.remove("user").is_some_and(|u| !u.is_string() && !u.is_null()) {
        return Err(OpenAiError::invalid("user", "'user' must be a string"));
    }
    let logprobs = match route {
        Route::Completions => generation::logprobs_count(&mut fields, "logprobs")?,
        Route::Chat => {
            let top = generation::logprobs_count(&mut fields, "top_logprobs")?;
            match fields.remove("logprobs") {
                None | Some(Value::Null) | Some(Value::Bool(false)) => None,
                Some(Value::Bool(true)) => Some(top.unwrap_or(0)),
                Some(other) => {
                    return Err(OpenAiError::invalid(
                        "logprobs",
                        format!("'logprobs' must be true or false, got {other}"),
                    ));
                }
            }
        }
    };
    let mut text = generation::read(&mut fields)?;
    generation::nothing_left(&fields)?;
    text.prompt = Some(prompt);
    text.sampling.logprobs = logprobs;
    Ok(CompletionRequest { model, text, stream, include_usage: include_usage && stream, logprobs })
}

/// `prompt`: a string, or a list holding one string.
fn completion_prompt(prompt: Option<Value>) -> Result<Prompt, OpenAiError> {
    match prompt {
        Some(Value::String(s)) => Ok(Prompt::Text(s)),
        Some(Value::Array(list)) if list.len() == 1 && list[0].is_string() => {
            Ok(Prompt::Text(list[0].as_str().unwrap_or_default().to_owned()))
        }
        Some(Value::Array(_)) => Err(OpenAiError::invalid("prompt", "'prompt' must be one string (a list of one)")),
        _ => Err(OpenAiError::invalid("prompt", "'prompt' is required: the text to continue")),
    }
}

/// `messages`: objects with `role` and `content`, a string or a list of
/// text parts.
fn chat_prompt(messages: Option<Value>) -> Result<Prompt, OpenAiError> {
    let Some(Value::Array(list)) = messages else {
        return Err(OpenAiError::invalid("messages", "'messages' is required: a list of {role, content}"));
    };
    if list.is_empty() {
        return Err(OpenAiError::invalid("messages", "'messages' is empty"));
    }
    let message = |m: Value| -> Result<ChatMessage, OpenAiError> {
        let Value::Object(mut m) = m else {
            return Err(OpenAiError::invalid("messages", "each message must be an object"));
        };
        let role = match m.remove("role") {
            Some(Value::String(r)) => r,
            _ => return Err(OpenAiError::invalid("messages", "each message needs a 'role' string")),
        };
        let content = match m.remove("content") {
            Some(Value::String(c)) => c,
            Some(Value::Array(parts)) => parts.iter().map(text_part).collect::<Result<String, _>>()?,
            _ => return Err(OpenAiError::invalid("messages", "each message needs a 'content' string")),
        };
        m.remove("name");
        if let Some(key) = m.keys().next() {
            return Err(OpenAiError::invalid("messages", format!("unsupported message field '{key}'")));
        }
        Ok(ChatMessage { role, content })
    };
    Ok(Prompt::Chat(list.into_iter().map(message).collect::<Result<_, _>>()?))
}

/// A content part: only `{"type": "text", "text": ...}` is text.
fn text_part(part: &Value) -> Result<String, OpenAiError> {
    match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
        (Some("text"), Some(text)) => Ok(text.to_owned()),
        _ => Err(OpenAiError::invalid("messages", format!("content part {part} is not text; this model reads text"))),
    }
}

/// The answer's id, with OpenAI's prefix for the route.
fn answer_id(route: Route) -> String {
    let prefix = if route == Route::Chat { "chatcmpl" } else { "cmpl" };
    format!("{prefix}-{:016x}", fastrand::u64(..))
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn usage(u: Usage) -> Value {
    json!({ "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens })
}

/// The text of one token, for log probabilities.
async fn token_text(plugin: &Arc<Plugin>, token: u32) -> String {
    plugin.decode(vec![token], 0).await.map(|d| d.text).unwrap_or_default()
}

/// A chunk's log probabilities in the route's shape: chat's `content`
/// list, or the completions' four parallel lists (`text_offset` from
/// `offset`, the text's length before the chunk).
async fn logprobs(plugin: &Arc<Plugin>, route: Route, tokens: &[Choice], offset: &mut usize) -> Value {
    let mut entries = Vec::new();
    for choice in tokens {
        let text = token_text(plugin, choice.token).await;
        let mut top = Vec::new();
        for &(token, logprob) in &choice.top {
            top.push((token_text(plugin, token).await, logprob));
        }
        entries.push((text, choice.logprob.unwrap_or(0.0), top));
    }
    match route {
        Route::Chat => {
            let item = |t: &str, l: f32| json!({ "token": t, "logprob": l, "bytes": t.as_bytes() });
            let content: Vec<Value> = entries
                .iter()
                .map(|(t, l, top)| {
                    let mut v = item(t, *l);
                    v["top_logprobs"] = top.iter().map(|(t, l)| item(t, *l)).collect();
                    v
                })
                .collect();
            json!({ "content": content })
        }
        Route::Completions => {
            let mut offsets = Vec::new();
            for (t, _, _) in &entries {
                offsets.push(*offset);
                *offset += t.len();
            }
            json!({
                "tokens": entries.iter().map(|e| e.0.clone()).collect::<Vec<_>>(),
                "token_logprobs": entries.iter().map(|e| e.1).collect::<Vec<_>>(),
                "top_logprobs": entries.iter().map(|e| e.2.iter().map(|(t, l)| (t.clone(), json!(l))).collect::<Map<_, _>>()).collect::<Vec<_>>(),
                "text_offset": offsets,
            })
        }
    }
}

/// Routes `request` to its model and starts generating.
async fn start(
    service: &Service,
    headers: &HeaderMap,
    request: &CompletionRequest,
) -> Result<(Accepted, text::TextStream), OpenAiError> {
    let accepted = service.accept(&request.model, None, &header_of(headers)).await?;
    let Some((generator, plugin)) = accepted.model().generative() else {
        return Err(OpenAiError::model_not_found(format!(
            "model '{}' does not generate text (its config.pbtxt does not make it generative)",
            request.model
        )));
    };
    let stream = text::start(plugin, generator, request.text.clone()).await?;
    Ok((accepted, stream))
}

/// `POST /v1/completions`.
pub async fn completions(
    state: State<Arc<Service>>,
    headers: HeaderMap,
    body: Result<body::Body, ApiError>,
) -> Result<Response, OpenAiError> {
    answer(state, headers, body, Route::Completions).await
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    state: State<Arc<Service>>,
    headers: HeaderMap,
    body: Result<body::Body, ApiError>,
) -> Result<Response, OpenAiError> {
    answer(state, headers, body, Route::Chat).await
}

async fn answer(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    body: Result<body::Body, ApiError>,
    route: Route,
) -> Result<Response, OpenAiError> {
    let body::Body(body) = body?;
    let request = parse(&body, route)?;
    let (accepted, stream) = start(&service, &headers, &request).await?;
    if request.stream {
        return Ok(streamed(accepted, stream, request, route).into_response());
    }
    whole(accepted, stream, request, route).await
}

/// The whole answer at once.
async fn whole(
    accepted: Accepted,
    mut stream: text::TextStream,
    request: CompletionRequest,
    route: Route,
) -> Result<Response, OpenAiError> {
    let plugin = accepted.model().generative().map(|(_, p)| p.clone()).expect("a generative model");
    let (mut output, mut tokens) = (String::new(), Vec::new());
    let (reason, used) = loop {
        match stream.next().await {
            Some(TextEvent::Chunk(Chunk { text, tokens: t })) => {
                output.push_str(&text);
                tokens.extend(t);
            }
            Some(TextEvent::End(reason, used)) => break (reason, used),
            Some(TextEvent::Failed(e)) => return Err(e.into()),
            None => return Err(crate::error::Error::Internal("the stream ended without its end".into()).into()),
        }
    };
    let logprobs = match request.logprobs {
        Some(_) => logprobs(&plugin, route, &tokens, &mut 0).await,
        None => Value::Null,
    };
    let mut choice = json!({ "index": 0, "logprobs": logprobs, "finish_reason": reason.as_str() });
    let object = match route {
        Route::Completions => {
            choice["text"] = json!(output);
            "text_completion"
        }
        Route::Chat => {
            choice["message"] = json!({ "role": "assistant", "content": output });
            "chat.completion"
        }
    };
    Ok(Json(json!({
        "id": answer_id(route), "object": object, "created": now(), "model": request.model,
        "choices": [choice], "usage": usage(used),
    }))
    .into_response())
}

/// What the event stream carries between events.
struct Streaming {
    accepted: Accepted,
    stream: text::TextStream,
    request: CompletionRequest,
    route: Route,
    id: String,
    created: u64,
    /// Chat's first event opens the assistant's message.
    opened: bool,
    /// The text's length so far (completions' `text_offset`).
    offset: usize,
    /// Events left to send after the end: usage, then `[DONE]`.
    ending: Vec<String>,
    done: bool,
}

impl Streaming {
    fn chunk(&self, choice: Value) -> String {
        let object = if self.route == Route::Chat { "chat.completion.chunk" } else { "text_completion" };
        let mut chunk = json!({ "id": self.id, "object": object, "created": self.created, "model": self.request.model,
                                "choices": [choice] });
        if self.request.include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk.to_string()
    }

    async fn next_event(&mut self) -> Option<String> {
        if let Some(event) = self.ending.pop() {
            return Some(event);
        }
        if self.done {
            return None;
        }
        if self.route == Route::Chat && !self.opened {
            self.opened = true;
            return Some(self.chunk(json!({ "index": 0, "delta": { "role": "assistant", "content": "" },
                                           "logprobs": null, "finish_reason": null })));
        }
        let plugin = self.accepted.model().generative().map(|(_, p)| p.clone())?;
        match self.stream.next().await {
            Some(TextEvent::Chunk(chunk)) => {
                let logprobs = match self.request.logprobs {
                    Some(_) => logprobs(&plugin, self.route, &chunk.tokens, &mut self.offset).await,
                    None => Value::Null,
                };
                let mut choice = json!({ "index": 0, "logprobs": logprobs, "finish_reason": null });
                match self.route {
                    Route::Completions => choice["text"] = json!(chunk.text),
                    Route::Chat => choice["delta"] = json!({ "content": chunk.text }),
                }
                Some(self.chunk(choice))
            }
            Some(TextEvent::End(reason, used)) => {
                self.done = true;
                self.ending.push("[DONE]".into());
                if self.request.include_usage {
                    let object = if self.route == Route::Chat { "chat.completion.chunk" } else { "text_completion" };
                    self.ending.push(
                        json!({ "id": self.id, "object": object, "created": self.created, "model": self.request.model,
                                "choices": [], "usage": usage(used) })
                        .to_string(),
                    );
                }
                let mut choice = json!({ "index": 0, "logprobs": null, "finish_reason": reason.as_str() });
                match self.route {
                    Route::Completions => choice["text"] = json!(""),
                    Route::Chat => choice["delta"] = json!({}),
                }
                Some(self.chunk(choice))
            }
            Some(TextEvent::Failed(e)) => {
                self.done = true;
                let e = OpenAiError::from(e);
                Some(
                    json!({ "error": { "message": e.message, "type": "server_error", "param": null, "code": null } })
                        .to_string(),
                )
            }
            None => None,
        }
    }
}

/// The answer as server-sent events, ending with `[DONE]`.
fn streamed(
    accepted: Accepted,
    stream: text::TextStream,
    request: CompletionRequest,
    route: Route,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let state = Streaming {
        accepted,
        stream,
        request,
        route,
        id: answer_id(route),
        created: now(),
        opened: false,
        offset: 0,
        ending: Vec::new(),
        done: false,
    };
    Sse::new(futures_util::stream::unfold(state, |mut state| async move {
        let data = state.next_event().await?;
        Some((Ok(SseEvent::default().data(data)), state))
    }))
}

#[cfg(test)]
mod tests {
    use super::{Route, parse};

    #[test]
    fn chat_and_completion_bodies_are_checked_and_unknown_fields_refused() {
        let chat = parse(
            br#"{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                 "stream": true, "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 2,
                 "max_completion_tokens": 8}"#,
            Route::Chat,
        )
        .unwrap();
        assert!(chat.stream && chat.include_usage && chat.logprobs == Some(2) && chat.text.max_tokens == Some(8));
        let refused = |body: &str, route| parse(body.as_bytes(), route).err().unwrap();
        assert_eq!(refused(r#"{"model": "m", "messages": [], "tools": []}"#, Route::Chat).param, Some("messages"));
        let tools =
            refused(r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": []}"#, Route::Chat);
        assert!(tools.message.contains("'tools'"), "{}", tools.message);
        let format = refused(r#"{"model": "m", "prompt": "x", "response_format": {}}"#, Route::Completions);
        assert!(format.message.contains("'response_format'"), "{}", format.message);
        assert_eq!(
            refused(r#"{"model": "m", "prompt": "x", "logprobs": 21}"#, Route::Completions).param,
            Some("logprobs")
        );
        assert_eq!(refused(r#"{"model": "m"}"#, Route::Completions).param, Some("prompt"));
    }
}

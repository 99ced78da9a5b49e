//! From a client's prompt to streamed text: the plugin encodes the prompt,
//! the decode loop generates token ids, the plugin turns them into text
//! incrementally, and stop strings end the stream here.

use std::sync::Arc;

use tokio::sync::mpsc::UnboundedReceiver;

use super::{Choice, Event, FinishReason, GenerationRequest, Generator, Sampling};
use crate::error::Error;
use crate::plugin::{Plugin, PluginError, Prompt};

/// What a client asks for, in the terms every route shares.
#[derive(Clone, Debug, Default)]
pub struct TextRequest {
    pub prompt: Option<Prompt>,
    /// `None`: the model's `generation.max_tokens`.
    pub max_tokens: Option<usize>,
    pub sampling: Sampling,
    /// Strings that end the text (not included in it).
    pub stop: Vec<String>,
    /// Token ids that end the text, besides the model's own.
    pub stop_token_ids: Vec<u32>,
}

/// Text generated since the previous chunk, and the tokens behind it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Chunk {
    pub text: String,
    pub tokens: Vec<Choice>,
}

/// Token counts, as OpenAI's `usage` gives them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

/// What a stream yields: chunks, then its end.
#[derive(Clone, Debug, PartialEq)]
pub enum TextEvent {
    Chunk(Chunk),
    End(FinishReason, Usage),
    /// The sequence failed after it started (a plugin that trapped, a
    /// decoder step that failed); the stream is over.
    Failed(Error),
}

/// One request's stream of text.
pub struct TextStream {
    plugin: Arc<Plugin>,
    events: Option<UnboundedReceiver<Event>>,
    /// Generated ids from the detokenizer's window start on.
    window: Vec<u32>,
    read: usize,
    stop: Vec<String>,
    /// Text held back because it may begin a stop string.
    held: String,
    /// Tokens not yet sent with text.
    tokens: Vec<Choice>,
    usage: Usage,
    /// The end, once the text before it is sent.
    pending_end: Option<FinishReason>,
    done: bool,
}

/// A plugin's failure as the client's error: its refusal as it is, any
/// other failure a 500.
fn plugin_error(e: PluginError) -> Error {
    match e {
        PluginError::Refused(e) => e,
        PluginError::Failed(m) => Error::Internal(m),
    }
}

/// Encodes `request`'s prompt with `plugin` and queues it on `generator`.
///
/// # Errors
/// [`Error::InvalidArgument`] for a missing prompt or one the plugin
/// refuses, or one longer than the context with `max_tokens`;
/// [`Error::Overloaded`] when the queue is full; the plugin's failure.
pub async fn start(plugin: &Arc<Plugin>, generator: &Generator, request: TextRequest) -> Result<TextStream, Error> {
    let prompt = request.prompt.ok_or_else(|| Error::InvalidArgument("the request has no prompt".into()))?;
    let ids = plugin.encode(prompt).await.map_err(plugin_error)?;
    let mut stop_ids = plugin.stop_token_ids().await.map_err(plugin_error)?;
    stop_ids.extend(request.stop_token_ids);
    let usage = Usage { prompt_tokens: ids.len(), completion_tokens: 0 };
    let max_tokens = request.max_tokens.unwrap_or(generator.limits().max_tokens);
    let events =
        generator.submit(GenerationRequest { prompt: ids, max_tokens, sampling: request.sampling, stop_ids })?;
    Ok(TextStream {
        plugin: plugin.clone(),
        events: Some(events),
        window: Vec::new(),
        read: 0,
        stop: request.stop.into_iter().filter(|s| !s.is_empty()).collect(),
        held: String::new(),
        tokens: Vec::new(),
        usage,
        pending_end: None,
        done: false,
    })
}

impl TextStream {
    /// The next chunk or the end; `None` after the end.
    pub async fn next(&mut self) -> Option<TextEvent> {
        while !self.done {
            if let Some(reason) = self.pending_end.take() {
                return Some(self.end(reason));
            }
            let event = match self.events.as_mut() {
                Some(events) => events.recv().await,
                None => None,
            };
            match event {
                Some(Event::Token(choice)) => {
                    self.usage.completion_tokens += 1;
                    self.window.push(choice.token);
                    self.tokens.push(choice);
                    let text = match self.plugin.decode(self.window.clone(), self.read).await {
                        Ok(step) => {
                            self.window.drain(..step.prefix);
                            self.read = step.read;
                            step.text
                        }
                        Err(e) => return Some(self.fail(plugin_error(e))),
                    };
                    if let Some(event) = self.add_text(&text) {
                        return Some(event);
                    }
                }
                Some(Event::Finished(reason)) => {
                    if self.held.is_empty() && self.tokens.is_empty() {
                        return Some(self.end(reason));
                    }
                    self.pending_end = Some(reason);
                    let text = std::mem::take(&mut self.held);
                    return Some(TextEvent::Chunk(Chunk { text, tokens: std::mem::take(&mut self.tokens) }));
                }
                Some(Event::Failed(m)) => return Some(self.fail(Error::Internal(m))),
                None => return Some(self.fail(Error::Unavailable("the model was unloaded while generating".into()))),
            }
        }
        None
    }

    /// Adds decoded text: a chunk of what no stop string can still claim,
    /// or the end when a stop string appears.
    fn add_text(&mut self, text: &str) -> Option<TextEvent> {
        self.held.push_str(text);
        if let Some(at) = self.stop.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            // Dropping the events frees the sequence's slot at the next step.
            self.events = None;
            self.held.truncate(at);
            self.pending_end = Some(FinishReason::Stop);
            let text = std::mem::take(&mut self.held);
            return Some(TextEvent::Chunk(Chunk { text, tokens: std::mem::take(&mut self.tokens) }));
        }
        let keep = self.stop.iter().map(|s| partial_suffix(&self.held, s)).max().unwrap_or(0);
        self.take(self.held.len() - keep).map(TextEvent::Chunk)
    }

    /// The first `len` bytes of held text and the tokens so far, as a
    /// chunk; `None` when there is no text to send yet.
    fn take(&mut self, len: usize) -> Option<Chunk> {
        if len == 0 {
            return None;
        }
        let text: String = self.held.drain(..len).collect();
        Some(Chunk { text, tokens: std::mem::take(&mut self.tokens) })
    }

    fn end(&mut self, reason: FinishReason) -> TextEvent {
        self.done = true;
        self.events = None;
        TextEvent::End(reason, self.usage)
    }

    fn fail(&mut self, e: Error) -> TextEvent {
        self.done = true;
        self.events = None;
        TextEvent::Failed(e)
    }
}

/// The length of the longest end of `text` that begins `stop` (text a
/// later token may complete into `stop`), on a character boundary.
fn partial_suffix(text: &str, stop: &str) -> usize {
    (1..stop.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && stop.as_bytes().starts_with(&text.as_bytes()[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::partial_suffix;

    #[test]
    fn a_partial_stop_string_is_held_back() {
        assert_eq!(partial_suffix("Hello\nUs", "\nUser:"), 3);
        assert_eq!(partial_suffix("Hello", "\nUser:"), 0);
        assert_eq!(partial_suffix("ab\n", "\n\n"), 1);
        assert_eq!(partial_suffix("é", "x"), 0);
    }
}

//! The tokenizer of a generative model (SmolLM2 in the example repository),
//! in the sandbox; the decode loop runs natively in the host.
//!
//! Everything model-specific comes from the version folder, as Hugging Face
//! and ONNX Runtime GenAI lay it out:
//! - `tokenizer.json`: the tokenizer (Hugging Face `tokenizers`, the Rust
//!   crate the Python library wraps). Prompts are encoded without added
//!   special tokens, as a chat template writes its own.
//! - `chat_template.jinja` (or `tokenizer_config.json`'s `chat_template`):
//!   the chat template, rendered with `minijinja` and Python's string
//!   methods (`minijinja-contrib`'s `pycompat`), with `messages`,
//!   `add_generation_prompt` (true), `bos_token` and `eos_token`.
//! - `tokenizer_config.json`'s `eos_token` and `genai_config.json`'s
//!   `model.eos_token_id` (one id or a list): the ids that end a generation.
//!
//! A new model family with a Hugging Face tokenizer is a new folder with
//! these files, not a new plugin.

use std::collections::BTreeSet;

use minijinja::Environment;
use plinth_plugin_sdk::{ChatMessage, Error, ModelInfo, Plugin, Prompt, export_plugin};
use serde_json::Value;
use tokenizers::Tokenizer;

/// Where the host mounts the version folder. A native build (a test) names
/// the folder in `PLINTH_MODEL_DIR`; the sandbox has no environment.
fn model_dir() -> String {
    std::env::var("PLINTH_MODEL_DIR").unwrap_or_else(|_| "/model".to_owned())
}

/// The plugin's state, one per instance.
pub struct TextGeneration {
    tokenizer: Tokenizer,
    /// The chat template's environment, holding the template as `chat`;
    /// `None` when the folder has no template (chats are refused).
    templates: Option<Environment<'static>>,
    bos_token: String,
    eos_token: String,
    stop: Vec<u32>,
}

impl Plugin for TextGeneration {
    fn init(_info: &ModelInfo) -> Result<Self, Error> {
        let dir = model_dir();
        let tokenizer = Tokenizer::from_file(format!("{dir}/tokenizer.json"))
            .map_err(|e| Error::internal(format!("cannot load {dir}/tokenizer.json: {e}")))?;
        let config = read_json(&format!("{dir}/tokenizer_config.json"))?.unwrap_or(Value::Null);
        let token = |key: &str| config[key].as_str().map(str::to_owned).unwrap_or_default();
        let (bos_token, eos_token) = (token("bos_token"), token("eos_token"));
        let template = match std::fs::read_to_string(format!("{dir}/chat_template.jinja")) {
            Ok(text) => Some(text),
            Err(_) => config["chat_template"].as_str().map(str::to_owned),
        };
        let templates = template.map(environment).transpose()?;
        let mut stop = BTreeSet::new();
        stop.extend(tokenizer.token_to_id(&eos_token));
        let genai = read_json(&format!("{dir}/genai_config.json"))?.unwrap_or(Value::Null);
        match &genai["model"]["eos_token_id"] {
            Value::Number(id) => stop.extend(id.as_u64().map(|id| id as u32)),
            Value::Array(ids) => stop.extend(ids.iter().filter_map(Value::as_u64).map(|id| id as u32)),
            _ => {}
        }
        if stop.is_empty() {
            return Err(Error::internal(
                "no end-of-sequence token: neither tokenizer_config.json's eos_token nor genai_config.json's \
                 model.eos_token_id names one",
            ));
        }
        Ok(TextGeneration { tokenizer, templates, bos_token, eos_token, stop: stop.into_iter().collect() })
    }

    fn encode(&mut self, prompt: &Prompt) -> Result<Vec<u32>, Error> {
        let text = match prompt {
            Prompt::Text(text) => text.clone(),
            Prompt::Chat(messages) => self.render(messages)?,
        };
        let encoding =
            self.tokenizer.encode(text, false).map_err(|e| Error::bad_input(format!("cannot tokenize: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    fn decode(&mut self, ids: &[u32]) -> Result<String, Error> {
        self.tokenizer.decode(ids, true).map_err(|e| Error::internal(format!("cannot decode {ids:?}: {e}")))
    }

    fn stop_token_ids(&self) -> Vec<u32> {
        self.stop.clone()
    }
}

impl TextGeneration {
    /// The chat as the model's template writes it, ending with the opened
    /// assistant turn.
    fn render(&self, messages: &[ChatMessage]) -> Result<String, Error> {
        let templates = self
            .templates
            .as_ref()
            .ok_or_else(|| Error::bad_input("this model has no chat template: send a prompt"))?;
        let messages: Vec<Value> =
            messages.iter().map(|m| serde_json::json!({"role": m.role, "content": m.content})).collect();
        let context = minijinja::context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        };
        let template = templates.get_template("chat").map_err(|e| Error::internal(e.to_string()))?;
        template.render(context).map_err(|e| Error::bad_input(format!("the chat template refused the messages: {e}")))
    }
}

/// A minijinja environment holding `template` as `chat`, with what Hugging
/// Face's templates call: Python's string methods and `raise_exception`.
fn environment(template: String) -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |message: String| -> Result<String, minijinja::Error> {
        Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, message))
    });
    env.add_template_owned("chat", template).map_err(|e| Error::internal(format!("the chat template: {e}")))?;
    Ok(env)
}

/// The JSON file at `path`, `None` when there is none.
fn read_json(path: &str) -> Result<Option<Value>, Error> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| Error::internal(format!("{path}: {e}"))),
        Err(_) => Ok(None),
    }
}

export_plugin!(TextGeneration);

#[cfg(test)]
mod tests {
    use plinth_plugin_sdk::detokenize;

    /// Decodes like a byte-level tokenizer whose ids are bytes: a lone
    /// byte of a multi-byte character decodes to U+FFFD.
    fn bytes(ids: &[u32]) -> Result<String, plinth_plugin_sdk::Error> {
        Ok(String::from_utf8_lossy(&ids.iter().map(|&b| b as u8).collect::<Vec<_>>()).into_owned())
    }

    #[test]
    fn incremental_text_never_splits_a_character() {
        let ids: Vec<u32> = "né 🙂!".bytes().map(u32::from).collect();
        let (mut out, mut start, mut read) = (String::new(), 0, 0);
        for end in 1..=ids.len() {
            let (text, prefix, next_read) = detokenize(&ids[start..end], read, &mut bytes).unwrap();
            assert!(!text.contains('\u{FFFD}'), "half a character sent after {end} ids");
            out.push_str(&text);
            (start, read) = (start + prefix, next_read);
        }
        assert_eq!(out, "né 🙂!");
    }
}

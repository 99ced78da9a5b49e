//! Write Plinth pre/post-processing plugins in Rust.
//!
//! A plugin is a WASI 0.2 component that ships in a model's folder and turns
//! raw requests into input tensors (`preprocess`) and output tensors into an
//! answer (`postprocess`). Implement [`Plugin`] and register it with
//! [`export_plugin!`]; build with `cargo build --release --target wasm32-wasip2`.
//!
//! # A worked example
//!
//! A sentiment model takes token ids `[batch, 16]` INT64 and returns `logits`
//! `[batch, 2]`. Its plugin turns a JSON body `{"text": "..."}` into ids with
//! a vocabulary file shipped in the version folder, and the logits into
//! `{"label": "positive", "score": 0.93}`:
//!
//! ```no_run
//! use plinth_plugin_sdk::{export_plugin, find_output, Error, ModelInfo, Plugin, Request, Response, Tensor};
//!
//! const LENGTH: usize = 16;
//!
//! struct Sentiment {
//!     input: String,
//!     vocabulary: std::collections::HashMap<String, i64>,
//! }
//!
//! impl Plugin for Sentiment {
//!     // Once per instance: check the model fits and read what is needed.
//!     fn init(info: &ModelInfo) -> Result<Self, Error> {
//!         let input = info.first_input()?;
//!         if input.dims != [LENGTH as i64] {
//!             return Err(Error::internal(format!("expected dims [16], got {:?}", input.dims)));
//!         }
//!         // The version folder is mounted read-only at /model.
//!         let words = std::fs::read_to_string("/model/vocabulary.txt")
//!             .map_err(|e| Error::internal(format!("cannot read the vocabulary: {e}")))?;
//!         let vocabulary = words.lines().zip(0..).map(|(w, i)| (w.to_owned(), i)).collect();
//!         Ok(Sentiment { input: input.name.clone(), vocabulary })
//!     }
//!
//!     // A client's mistake is `bad_input` (HTTP 400), with the reason.
//!     fn preprocess(&mut self, req: &Request) -> Result<Vec<Tensor>, Error> {
//!         let body: serde_json::Value = serde_json::from_slice(&req.body)
//!             .map_err(|e| Error::bad_input(format!("the body is not JSON: {e}")))?;
//!         let text = body["text"].as_str().ok_or_else(|| Error::bad_input("expected {\"text\": \"...\"}"))?;
//!         let mut ids: Vec<i64> = text.split_whitespace().map(|w| *self.vocabulary.get(w).unwrap_or(&1)).collect();
//!         ids.resize(LENGTH, 0);
//!         // The model batches, so one request is a batch of one row.
//!         Ok(vec![Tensor::from_slice(&self.input, &[1, LENGTH as i64], &ids)])
//!     }
//!
//!     fn postprocess(&mut self, _req: &Request, outputs: Vec<Tensor>) -> Result<Response, Error> {
//!         let logits = find_output(&outputs, "logits")?.to_vec::<f32>()?;
//!         let positive = 1.0 / (1.0 + (logits[0] - logits[1]).exp());
//!         let (label, score) = if positive >= 0.5 { ("positive", positive) } else { ("negative", 1.0 - positive) };
//!         Ok(Response::json(&serde_json::json!({ "label": label, "score": score })))
//!     }
//! }
//!
//! export_plugin!(Sentiment);
//! ```
//!
//! `plinth plugin new NAME` writes such a crate, ready to build; put the
//! `.wasm` in the model folder and name it in `config.pbtxt`
//! (`parameters { key: "plugin" value: { string_value: "NAME.wasm" } }`).
//! `plugins/` holds real ones: `ocr-cls` (image to tensor, probabilities to
//! an angle), `ocr` (composition), `vad` (its own model run many times).
//!
//! A plugin may also run other models of the repository while it works:
//! [`infer`] sends tensors through another model (or its own, e.g. once per
//! chunk of a long input), [`predict`] sends a raw request through another
//! model's plugin and model. Both go through the server's scheduler like a
//! client's request, and their failures come back as [`Error`] values.
//!
//! # Generative models
//!
//! The plugin of a generative model (`docs/generative.md`) is its tokenizer:
//! the host runs the decode loop natively and asks the plugin for a
//! prompt's token ids ([`Plugin::encode`], a raw prompt or chat messages
//! through the model's chat template), for the ids that end a generation
//! ([`Plugin::stop_token_ids`]) and for the text of generated ids
//! ([`Plugin::decode`]). The SDK makes the decoding incremental: the host
//! receives only text that later tokens cannot change, never half a UTF-8
//! character.
//!
//! The plugin contract is `plinth:plugin@0.4.0` (`wit/v0.4/plugin.wit`); this
//! crate hides the binding generator so a plugin depends on this crate alone.
//! Hosts that run 0.4 also run plugins built against 0.3, 0.2 and 0.1; those
//! of 0.2 and 0.1 have only the `bad-input` and `internal` error classes.

#![warn(missing_docs)]

// Lets the generated code name this crate by its public path, which is the
// one that also works from the plugin crates that expand `export_plugin!`.
extern crate self as plinth_plugin_sdk;

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../wit/v0.4",
        world: "plugin",
        pub_export_macro: true,
        export_macro_name: "__export_plugin_world",
        default_bindings_module: "::plinth_plugin_sdk::__private::bindings",
        runtime_path: "::plinth_plugin_sdk::__private::wit_bindgen::rt",
    });
}

#[cfg(feature = "image")]
pub mod imaging;
mod tensor;

pub use bindings::exports::plinth::plugin::generation::{ChatMessage, Prompt};
pub use bindings::plinth::plugin::types::{
    Datatype, Error, ModelInfo, Overload, Request, Response, Tensor, TensorSpec,
};
pub use tensor::Element;

/// Runs version `version` of `model` (the server's choice when `None`) on
/// `inputs` (full shapes, batch dimension included when that model batches)
/// and returns the `outputs` named, or all of them when `outputs` is empty.
/// The model's plugin, if any, does not run.
///
/// # Errors
/// The callee's failure as a value, of its class: [`Error::BadInput`] when
/// it refuses the tensors (unknown input, wrong datatype or shape),
/// [`Error::NotFound`] when there is no such model or version,
/// [`Error::Unavailable`] when it is not READY (loading, unloaded),
/// [`Error::Overloaded`] with the callee's retry hint when its queue is
/// full, [`Error::Internal`] when it fails. Returning the error unchanged
/// (`?`) gives the client the callee's status and `Retry-After`.
pub fn infer(model: &str, version: Option<u64>, inputs: &[Tensor], outputs: &[&str]) -> Result<Vec<Tensor>, Error> {
    let outputs: Vec<String> = outputs.iter().map(|&o| o.to_owned()).collect();
    bindings::plinth::plugin::inference::infer(model, version, inputs, &outputs)
}

/// Sends `req` through `model`'s plugin and model, as a client's `/predict`
/// would, and returns the answer.
///
/// # Errors
/// As [`infer`]; also [`Error::Internal`] when the call would come back to a
/// model whose plugin already runs for this request (a cycle) or pass
/// through more plugins than the host allows.
pub fn predict(model: &str, version: Option<u64>, req: &Request) -> Result<Response, Error> {
    bindings::plinth::plugin::inference::predict(model, version, req)
}

/// What a plugin implements. One value of the implementing type lives in each
/// plugin instance; the host keeps warm instances and calls them one request
/// at a time.
pub trait Plugin: Sized + 'static {
    /// Builds the plugin's state from the model it serves (signature,
    /// `config.pbtxt` parameters, model-file metadata). Called once per
    /// instance, before any other method.
    ///
    /// # Errors
    /// An [`Error`] here fails the model's load with its message.
    fn init(info: &ModelInfo) -> Result<Self, Error>;

    /// Turns a raw request body into the model's input tensors, with the
    /// batch dimension when the model batches.
    ///
    /// # Errors
    /// [`Error::BadInput`] for a body the plugin cannot read (HTTP 400).
    /// The default refuses every request: a plugin that only postprocesses
    /// is used through `/infer`-style tensors.
    fn preprocess(&mut self, _req: &Request) -> Result<Vec<Tensor>, Error> {
        Err(Error::BadInput("this model's plugin does not preprocess raw requests".into()))
    }

    /// Turns the model's output tensors into the answer.
    ///
    /// The default returns the outputs as KServe v2 JSON output tensors
    /// (`{"outputs": [{"name", "datatype", "shape", "data"}]}`).
    ///
    /// # Errors
    /// [`Error::Internal`] when the outputs are not what the plugin expects.
    fn postprocess(&mut self, _req: &Request, outputs: Vec<Tensor>) -> Result<Response, Error> {
        let outputs: Result<Vec<_>, Error> = outputs.iter().map(Tensor::to_json).collect();
        Ok(Response::json(&serde_json::json!({ "outputs": outputs? })))
    }

    /// A generative model's prompt as token ids: a raw prompt as it is,
    /// chat messages through the model's chat template with the assistant's
    /// turn opened.
    ///
    /// # Errors
    /// [`Error::BadInput`] for a prompt the plugin cannot tokenize (an
    /// unknown role, say). The default refuses: the model is not generative.
    fn encode(&mut self, _prompt: &Prompt) -> Result<Vec<u32>, Error> {
        Err(Error::BadInput("this model's plugin does not tokenize prompts (it is not a generative model's)".into()))
    }

    /// The text of `ids`, as the tokenizer decodes them (special tokens
    /// left out). The SDK calls it on short windows of the generated ids
    /// and sends the host only what later ids cannot change.
    ///
    /// # Errors
    /// [`Error::Internal`] for an id outside the vocabulary. The default
    /// refuses: the model is not generative.
    fn decode(&mut self, _ids: &[u32]) -> Result<String, Error> {
        Err(Error::BadInput("this model's plugin does not decode tokens (it is not a generative model's)".into()))
    }

    /// The ids that end a generation: the end of sequence, the chat
    /// template's end of turn. The default is none.
    fn stop_token_ids(&self) -> Vec<u32> {
        Vec::new()
    }
}

/// One step of incremental detokenization over `decode`: the text that
/// `window`'s ids after the first `read` add, once it is final. Decoding
/// from the window's start rather than from the new ids alone keeps what a
/// tokenizer does between tokens (a leading space, a merge); text that ends
/// in U+FFFD is half a UTF-8 character, held back until its other bytes
/// come.
///
/// # Errors
/// Those of `decode`.
pub fn detokenize(
    window: &[u32],
    read: usize,
    decode: &mut dyn FnMut(&[u32]) -> Result<String, Error>,
) -> Result<(String, usize, usize), Error> {
    let read = read.min(window.len());
    let before = decode(&window[..read])?;
    let now = decode(window)?;
    if now.len() <= before.len() || now.ends_with('\u{FFFD}') || !now.is_char_boundary(before.len()) {
        return Ok((String::new(), 0, read));
    }
    Ok((now[before.len()..].to_owned(), read, window.len() - read))
}

impl Error {
    /// A request the plugin cannot process: HTTP 400.
    pub fn bad_input(msg: impl Into<String>) -> Self {
        Error::BadInput(msg.into())
    }

    /// A failure of the plugin or model, not the client's fault: HTTP 500.
    pub fn internal(msg: impl Into<String>) -> Self {
        Error::Internal(msg.into())
    }

    /// Something the plugin needs cannot serve now; the client may retry:
    /// HTTP 503.
    pub fn unavailable(msg: impl Into<String>) -> Self {
        Error::Unavailable(msg.into())
    }

    /// Something the plugin needs is busy; the client should retry after
    /// `retry_after_secs` seconds: HTTP 503 with `Retry-After`.
    pub fn overloaded(msg: impl Into<String>, retry_after_secs: u32) -> Self {
        Error::Overloaded(Overload { message: msg.into(), retry_after_secs })
    }

    /// A model or version the request names does not exist: HTTP 404.
    pub fn not_found(msg: impl Into<String>) -> Self {
        Error::NotFound(msg.into())
    }
}

impl Request {
    /// The value of the query parameter `key`, if the client sent one.
    pub fn param(&self, key: &str) -> Option<&str> {
        lookup(&self.parameters, key)
    }
}

impl Response {
    /// A JSON response (`application/json`).
    pub fn json(value: &serde_json::Value) -> Self {
        Response {
            content_type: "application/json".into(),
            body: serde_json::to_vec(value).expect("a JSON value always serialises"),
        }
    }
}

impl ModelInfo {
    /// The `config.pbtxt` parameter `key` (its `string_value`).
    pub fn parameter(&self, key: &str) -> Option<&str> {
        lookup(&self.parameters, key)
    }

    /// The model-file metadata entry `key` (ONNX `metadata_props`).
    pub fn metadata(&self, key: &str) -> Option<&str> {
        lookup(&self.metadata, key)
    }

    /// The model's first declared input.
    ///
    /// # Errors
    /// [`Error::Internal`] when the model declares no input.
    pub fn first_input(&self) -> Result<&TensorSpec, Error> {
        self.inputs.first().ok_or_else(|| Error::internal("the model declares no input"))
    }

    /// The model's first declared output.
    ///
    /// # Errors
    /// [`Error::Internal`] when the model declares no output.
    pub fn first_output(&self) -> Result<&TensorSpec, Error> {
        self.outputs.first().ok_or_else(|| Error::internal("the model declares no output"))
    }
}

fn lookup<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// The tensor called `name` among a model's `outputs` (what
/// [`Plugin::postprocess`] receives, in any order).
///
/// # Errors
/// [`Error::Internal`] naming the output when the model returned none by
/// that name: the plugin and the model's configuration disagree, which is
/// no fault of the client's.
pub fn find_output<'a>(outputs: &'a [Tensor], name: &str) -> Result<&'a Tensor, Error> {
    outputs
        .iter()
        .find(|t| t.name == name)
        .ok_or_else(|| Error::internal(format!("the model returned no output '{name}'")))
}

/// Registers `$ty` (an implementation of [`Plugin`]) as the component's
/// exports: the host's `init` constructs it, its `preprocess` and
/// `postprocess` calls reach that value. Use it once per plugin crate.
#[macro_export]
macro_rules! export_plugin {
    ($ty:ty) => {
        const _: () = {
            struct Export;

            impl $crate::__private::Guest for Export {
                fn init(info: $crate::ModelInfo) -> ::std::result::Result<(), $crate::Error> {
                    $crate::__private::init::<$ty>(&info)
                }

                fn preprocess(
                    req: $crate::Request,
                ) -> ::std::result::Result<::std::vec::Vec<$crate::Tensor>, $crate::Error> {
                    $crate::__private::preprocess(&req)
                }

                fn postprocess(
                    req: $crate::Request,
                    outputs: ::std::vec::Vec<$crate::Tensor>,
                ) -> ::std::result::Result<$crate::Response, $crate::Error> {
                    $crate::__private::postprocess(&req, outputs)
                }
            }

            impl $crate::__private::GenerationGuest for Export {
                fn info() -> ::std::result::Result<$crate::__private::GenerationInfo, $crate::Error> {
                    $crate::__private::generation_info()
                }

                fn encode(prompt: $crate::Prompt) -> ::std::result::Result<::std::vec::Vec<u32>, $crate::Error> {
                    $crate::__private::encode(&prompt)
                }

                fn decode(
                    window: ::std::vec::Vec<u32>,
                    read: u32,
                ) -> ::std::result::Result<$crate::__private::Detokenized, $crate::Error> {
                    $crate::__private::decode(&window, read)
                }
            }

            // Only a component exports the contract; compiled natively (for
            // a benchmark or a test), the plugin is plain Rust.
            #[cfg(target_arch = "wasm32")]
    $crate::__private::bindings::__export_plugin_world!(Export with_types_in $crate::__private::bindings);
        };

        /// The plugin type, for native builds that call it directly.
        #[cfg(not(target_arch = "wasm32"))]
        pub type ExportedPlugin = $ty;
    };
}

/// The glue between the generated exports and a [`Plugin`], kept here so
/// that [`export_plugin!`] only names the plugin's type.
#[doc(hidden)]
pub mod __private {
    use std::cell::RefCell;

    pub use crate::bindings;
    pub use crate::bindings::exports::plinth::plugin::generation::{
        Detokenized, GenerationInfo, Guest as GenerationGuest,
    };
    pub use crate::bindings::exports::plinth::plugin::handler::Guest;
    use crate::{Error, ModelInfo, Plugin, Prompt, Request, Response, Tensor};
    pub use wit_bindgen;

    /// The calls of any plugin type, so one slot can hold it.
    trait Stages {
        fn preprocess(&mut self, req: &Request) -> Result<Vec<Tensor>, Error>;
        fn postprocess(&mut self, req: &Request, outputs: Vec<Tensor>) -> Result<Response, Error>;
        fn encode(&mut self, prompt: &Prompt) -> Result<Vec<u32>, Error>;
        fn decode(&mut self, ids: &[u32]) -> Result<String, Error>;
        fn stop_token_ids(&self) -> Vec<u32>;
    }

    impl<P: Plugin> Stages for P {
        fn preprocess(&mut self, req: &Request) -> Result<Vec<Tensor>, Error> {
            Plugin::preprocess(self, req)
        }

        fn postprocess(&mut self, req: &Request, outputs: Vec<Tensor>) -> Result<Response, Error> {
            Plugin::postprocess(self, req, outputs)
        }

        fn encode(&mut self, prompt: &Prompt) -> Result<Vec<u32>, Error> {
            Plugin::encode(self, prompt)
        }

        fn decode(&mut self, ids: &[u32]) -> Result<String, Error> {
            Plugin::decode(self, ids)
        }

        fn stop_token_ids(&self) -> Vec<u32> {
            Plugin::stop_token_ids(self)
        }
    }

    // A component instance is single-threaded: the host calls `init` once,
    // then the stages, one at a time.
    thread_local! {
        static PLUGIN: RefCell<Option<Box<dyn Stages>>> = const { RefCell::new(None) };
    }

    /// The host's `init`: constructs the plugin for this instance.
    pub fn init<P: Plugin + 'static>(info: &ModelInfo) -> Result<(), Error> {
        let plugin = P::init(info)?;
        PLUGIN.with(|slot| *slot.borrow_mut() = Some(Box::new(plugin)));
        Ok(())
    }

    /// The host's `preprocess`, on the plugin `init` made.
    pub fn preprocess(req: &Request) -> Result<Vec<Tensor>, Error> {
        with_plugin(|p| p.preprocess(req))
    }

    /// The host's `postprocess`, on the plugin `init` made.
    pub fn postprocess(req: &Request, outputs: Vec<Tensor>) -> Result<Response, Error> {
        with_plugin(|p| p.postprocess(req, outputs))
    }

    /// The host's `generation.info`.
    pub fn generation_info() -> Result<GenerationInfo, Error> {
        with_plugin(|p| Ok(GenerationInfo { stop_token_ids: p.stop_token_ids() }))
    }

    /// The host's `generation.encode`.
    pub fn encode(prompt: &Prompt) -> Result<Vec<u32>, Error> {
        with_plugin(|p| p.encode(prompt))
    }

    /// The host's `generation.decode`: one step of [`crate::detokenize`].
    pub fn decode(window: &[u32], read: u32) -> Result<Detokenized, Error> {
        with_plugin(|p| {
            let (text, prefix, read) = crate::detokenize(window, read as usize, &mut |ids| p.decode(ids))?;
            Ok(Detokenized { text, prefix: prefix as u32, read: read as u32 })
        })
    }

    fn with_plugin<T>(call: impl FnOnce(&mut dyn Stages) -> Result<T, Error>) -> Result<T, Error> {
        PLUGIN.with(|slot| match slot.borrow_mut().as_deref_mut() {
            Some(plugin) => call(plugin),
            None => Err(Error::internal("the host called the plugin before init")),
        })
    }
}

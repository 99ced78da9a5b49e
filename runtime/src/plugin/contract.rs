//! The released plugin contracts (`wit/v0.1` to `wit/v0.4`, each frozen)
//! and the dispatch of calls to the bindings of a component's version.
//!
//! Every version converts between the host's own types (tensors, raw
//! requests and answers, [`Error`]) and its bindings' types, with the
//! functions [`wit_conversions!`] expands in each bindings module; a version
//! whose types are unchanged from the one after it aliases that one's
//! types (`with`), as 0.1 does 0.2's. Errors are where the versions differ:
//! 0.3.0 carries every class a client acts on (bad input, not found,
//! unavailable, overloaded with a retry hint, internal), 0.2.0 and 0.1.0
//! only bad input and internal. 0.4.0 keeps 0.3.0's types and adds the
//! `generation` export, a generative model's tokenizer.

use wasmtime::component::{Component, InstancePre};
use wasmtime::{Engine, Store};

use super::convert::wit_conversions;
use super::{InstanceState, ModelInfo, RawRequest, RawResponse};
use crate::error::{Error, Overload};
use crate::tensor::Tensor;

/// Bindings generated from each frozen contract.
mod bindings {
    pub mod v0_4 {
        // The types are unchanged since 0.3: 0.4 uses 0.3's.
        wasmtime::component::bindgen!({
            path: "../wit/v0.4",
            world: "plugin",
            imports: { default: async },
            exports: { default: async },
            with: { "plinth:plugin/types@0.4.0": super::v0_3::plinth::plugin::types },
        });
    }
    pub mod v0_3 {
        wasmtime::component::bindgen!({
            path: "../wit/v0.3",
            world: "plugin",
            imports: { default: async },
            exports: { default: async },
        });
        super::wit_conversions!();
    }
    pub mod v0_2 {
        wasmtime::component::bindgen!({
            path: "../wit/v0.2",
            world: "plugin",
            imports: { default: async },
            exports: { default: async },
        });
        super::wit_conversions!();
    }
    pub mod v0_1 {
        // The types are unchanged since 0.1: 0.1 uses 0.2's.
        wasmtime::component::bindgen!({
            path: "../wit/v0.1",
            world: "plugin",
            imports: { default: async },
            exports: { default: async },
            with: { "plinth:plugin/types@0.1.0": super::v0_2::plinth::plugin::types },
        });
    }
    use super::wit_conversions;
}

use bindings::{v0_2, v0_3, v0_4};

/// A released `plinth:plugin` contract version, oldest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ContractVersion {
    /// `plinth:plugin@0.1.0`: `init`, `preprocess`, `postprocess`.
    V0_1,
    /// `plinth:plugin@0.2.0`: 0.1 and the `inference` import (composition).
    V0_2,
    /// `plinth:plugin@0.3.0`: 0.2 with an `error` that keeps the class of a
    /// failure (not found, unavailable, overloaded with a retry hint).
    V0_3,
    /// `plinth:plugin@0.4.0`: 0.3 and the `generation` export (a generative
    /// model's tokenizer).
    V0_4,
}

impl ContractVersion {
    /// Every version this host runs, oldest first.
    pub const ALL: [ContractVersion; 4] =
        [ContractVersion::V0_1, ContractVersion::V0_2, ContractVersion::V0_3, ContractVersion::V0_4];

    /// The version as the WIT package names it (`0.3.0`).
    pub fn as_str(self) -> &'static str {
        match self {
            ContractVersion::V0_1 => "0.1.0",
            ContractVersion::V0_2 => "0.2.0",
            ContractVersion::V0_3 => "0.3.0",
            ContractVersion::V0_4 => "0.4.0",
        }
    }

    /// The newest version whose `plinth:plugin/handler` `component` exports:
    /// the SDK's generated bindings fix that name at build time. `None` when
    /// it exports no version this host runs.
    pub fn of(engine: &Engine, component: &Component) -> Option<ContractVersion> {
        let exports: Vec<String> =
            component.component_type().exports(engine).map(|(name, _)| name.to_owned()).collect();
        let exported = |v: &ContractVersion| exports.iter().any(|e| *e == format!("plinth:plugin/handler@{v}"));
        ContractVersion::ALL.into_iter().rev().find(exported)
    }
}

impl std::fmt::Display for ContractVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Adds the imports of every version to `linker`: the `inference` of 0.2,
/// 0.3 and 0.4 (0.1 imports nothing of Plinth's).
///
/// # Errors
/// wasmtime's message when an interface cannot be linked.
pub(super) fn add_to_linker(linker: &mut wasmtime::component::Linker<InstanceState>) -> wasmtime::Result<()> {
    use wasmtime::component::HasSelf;
    v0_4::Plugin::add_to_linker::<_, HasSelf<_>>(linker, |s| s)?;
    v0_3::Plugin::add_to_linker::<_, HasSelf<_>>(linker, |s| s)?;
    v0_2::Plugin::add_to_linker::<_, HasSelf<_>>(linker, |s| s)
}

impl v0_3::plinth::plugin::types::Host for InstanceState {}
impl v0_2::plinth::plugin::types::Host for InstanceState {}

impl v0_4::plinth::plugin::inference::Host for InstanceState {
    async fn infer(
        &mut self,
        model: String,
        version: Option<u64>,
        inputs: Vec<v0_3::plinth::plugin::types::Tensor>,
        outputs: Vec<String>,
    ) -> Result<Vec<v0_3::plinth::plugin::types::Tensor>, v0_3::plinth::plugin::types::Error> {
        v0_3::plinth::plugin::inference::Host::infer(self, model, version, inputs, outputs).await
    }

    async fn predict(
        &mut self,
        model: String,
        version: Option<u64>,
        req: v0_3::plinth::plugin::types::Request,
    ) -> Result<v0_3::plinth::plugin::types::Response, v0_3::plinth::plugin::types::Error> {
        v0_3::plinth::plugin::inference::Host::predict(self, model, version, req).await
    }
}

impl v0_3::plinth::plugin::inference::Host for InstanceState {
    async fn infer(
        &mut self,
        model: String,
        version: Option<u64>,
        inputs: Vec<v0_3::plinth::plugin::types::Tensor>,
        outputs: Vec<String>,
    ) -> Result<Vec<v0_3::plinth::plugin::types::Tensor>, v0_3::plinth::plugin::types::Error> {
        let inputs = v0_3::convert::tensors_from_wit(inputs);
        let outputs = self.composition.infer(&model, version, inputs, outputs).await.map_err(error_to_v0_3)?;
        Ok(v0_3::convert::tensors_to_wit(outputs))
    }

    async fn predict(
        &mut self,
        model: String,
        version: Option<u64>,
        req: v0_3::plinth::plugin::types::Request,
    ) -> Result<v0_3::plinth::plugin::types::Response, v0_3::plinth::plugin::types::Error> {
        let req = v0_3::convert::request_from_wit(req);
        let response = self.composition.predict(&model, version, req).await.map_err(error_to_v0_3)?;
        Ok(v0_3::convert::response_to_wit(response))
    }
}

impl v0_2::plinth::plugin::inference::Host for InstanceState {
    async fn infer(
        &mut self,
        model: String,
        version: Option<u64>,
        inputs: Vec<v0_2::plinth::plugin::types::Tensor>,
        outputs: Vec<String>,
    ) -> Result<Vec<v0_2::plinth::plugin::types::Tensor>, v0_2::plinth::plugin::types::Error> {
        let inputs = v0_2::convert::tensors_from_wit(inputs);
        let outputs = self.composition.infer(&model, version, inputs, outputs).await.map_err(error_to_v0_2)?;
        Ok(v0_2::convert::tensors_to_wit(outputs))
    }

    async fn predict(
        &mut self,
        model: String,
        version: Option<u64>,
        req: v0_2::plinth::plugin::types::Request,
    ) -> Result<v0_2::plinth::plugin::types::Response, v0_2::plinth::plugin::types::Error> {
        let req = v0_2::convert::request_from_wit(req);
        let response = self.composition.predict(&model, version, req).await.map_err(error_to_v0_2)?;
        Ok(v0_2::convert::response_to_wit(response))
    }
}

/// A composed call's failure for a 0.3 plugin: its class kept. A remote's
/// failure (502) and what Plinth does not implement (501) are `internal`
/// to the plugin, as its own failure would be.
fn error_to_v0_3(e: Error) -> v0_3::plinth::plugin::types::Error {
    use v0_3::plinth::plugin::types::{Error as W, Overload as WitOverload};
    match e {
        Error::InvalidArgument(m) | Error::AlreadyExists(m) => W::BadInput(m),
        Error::NotFound(m) => W::NotFound(m),
        Error::Unavailable(m) => W::Unavailable(m),
        Error::Overloaded(o) => W::Overloaded(WitOverload { message: o.message, retry_after_secs: o.retry_after_secs }),
        Error::BadGateway(m) | Error::Internal(m) | Error::Unsupported(m) => W::Internal(m),
    }
}

/// A 0.3 plugin's error as the host's class of it.
fn error_from_v0_3(e: v0_3::plinth::plugin::types::Error) -> Error {
    use v0_3::plinth::plugin::types::Error as W;
    match e {
        W::BadInput(m) => Error::InvalidArgument(m),
        W::Internal(m) => Error::Internal(m),
        W::Unavailable(m) => Error::Unavailable(m),
        W::Overloaded(o) => Error::Overloaded(Overload { message: o.message, retry_after_secs: o.retry_after_secs }),
        W::NotFound(m) => Error::NotFound(m),
    }
}

/// A composed call's failure for a 0.2 plugin, whose contract has only two
/// classes: the request's fault stays `bad-input`, anything else is
/// `internal` (as 0.2.0 documents it).
fn error_to_v0_2(e: Error) -> v0_2::plinth::plugin::types::Error {
    use v0_2::plinth::plugin::types::Error as W;
    match e {
        Error::InvalidArgument(m) | Error::AlreadyExists(m) => W::BadInput(m),
        e => W::Internal(e.to_string()),
    }
}

/// A 0.1 or 0.2 plugin's error as the host's class of it.
fn error_from_v0_2(e: v0_2::plinth::plugin::types::Error) -> Error {
    use v0_2::plinth::plugin::types::Error as W;
    match e {
        W::BadInput(m) => Error::InvalidArgument(m),
        W::Internal(m) => Error::Internal(m),
    }
}

/// A component's bindings, ready to instantiate, for its contract version.
pub(super) enum Pre<T: Send + 'static> {
    V0_1(bindings::v0_1::PluginPre<T>),
    V0_2(v0_2::PluginPre<T>),
    V0_3(v0_3::PluginPre<T>),
    V0_4(v0_4::PluginPre<T>),
}

impl<T: Send + 'static> Pre<T> {
    /// The bindings of `version` over `instance_pre`.
    ///
    /// # Errors
    /// wasmtime's message when the component does not have that version's
    /// exports.
    pub(super) fn new(version: ContractVersion, instance_pre: InstancePre<T>) -> wasmtime::Result<Pre<T>> {
        Ok(match version {
            ContractVersion::V0_1 => Pre::V0_1(bindings::v0_1::PluginPre::new(instance_pre)?),
            ContractVersion::V0_2 => Pre::V0_2(v0_2::PluginPre::new(instance_pre)?),
            ContractVersion::V0_3 => Pre::V0_3(v0_3::PluginPre::new(instance_pre)?),
            ContractVersion::V0_4 => Pre::V0_4(v0_4::PluginPre::new(instance_pre)?),
        })
    }

    /// Instantiates the component in `store`.
    ///
    /// # Errors
    /// wasmtime's message or trap.
    pub(super) async fn instantiate(&self, store: &mut Store<T>) -> wasmtime::Result<Exports> {
        Ok(match self {
            Pre::V0_1(pre) => Exports::V0_1(pre.instantiate_async(store).await?),
            Pre::V0_2(pre) => Exports::V0_2(pre.instantiate_async(store).await?),
            Pre::V0_3(pre) => Exports::V0_3(pre.instantiate_async(store).await?),
            Pre::V0_4(pre) => Exports::V0_4(pre.instantiate_async(store).await?),
        })
    }
}

/// An instance's exports, for its contract version. Each call takes and
/// returns the host's types: the outer `Result` is a trap, the inner one
/// the plugin's own error as the host's [`Error`] class.
pub(super) enum Exports {
    V0_1(bindings::v0_1::Plugin),
    V0_2(v0_2::Plugin),
    V0_3(v0_3::Plugin),
    V0_4(v0_4::Plugin),
}

/// Runs `$call` on the handler of whichever version `$exports` is, with
/// `$convert` naming that version's conversions and `$error` its error
/// conversion, so each export is written once for all versions.
macro_rules! dispatch {
    ($exports:expr, |$handler:ident, $convert:ident, $error:ident| $call:expr) => {
        match $exports {
            Exports::V0_1(b) => {
                let $handler = b.plinth_plugin_handler();
                use v0_2::convert as $convert;
                let $error = error_from_v0_2;
                $call
            }
            Exports::V0_2(b) => {
                let $handler = b.plinth_plugin_handler();
                use v0_2::convert as $convert;
                let $error = error_from_v0_2;
                $call
            }
            Exports::V0_3(b) => {
                let $handler = b.plinth_plugin_handler();
                use v0_3::convert as $convert;
                let $error = error_from_v0_3;
                $call
            }
            Exports::V0_4(b) => {
                let $handler = b.plinth_plugin_handler();
                use v0_3::convert as $convert;
                let $error = error_from_v0_3;
                $call
            }
        }
    };
}

impl Exports {
    /// `init` with the model's description.
    pub(super) async fn init<T: Send>(
        &self,
        store: &mut Store<T>,
        info: &ModelInfo,
    ) -> wasmtime::Result<Result<(), Error>> {
        dispatch!(self, |handler, convert, error| {
            Ok(handler.call_init(store, &convert::model_info(info)).await?.map_err(error))
        })
    }

    /// `preprocess`: a raw request to input tensors.
    pub(super) async fn preprocess<T: Send>(
        &self,
        store: &mut Store<T>,
        req: &RawRequest,
    ) -> wasmtime::Result<Result<Vec<Tensor>, Error>> {
        dispatch!(self, |handler, convert, error| {
            let tensors = handler.call_preprocess(store, &convert::request(req)).await?;
            Ok(tensors.map(convert::tensors_from_wit).map_err(error))
        })
    }

    /// `postprocess`: output tensors to the answer for `req`.
    pub(super) async fn postprocess<T: Send>(
        &self,
        store: &mut Store<T>,
        req: &RawRequest,
        outputs: Vec<Tensor>,
    ) -> wasmtime::Result<Result<RawResponse, Error>> {
        dispatch!(self, |handler, convert, error| {
            let outputs = convert::tensors_to_wit(outputs);
            let response = handler.call_postprocess(store, &convert::request(req), &outputs).await?;
            Ok(response.map(convert::response_from_wit).map_err(error))
        })
    }
}

/// A chat message of a generative model's prompt.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`.
    pub role: String,
    /// The message's text.
    pub content: String,
}

/// What a client asks a generative model to continue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    /// A raw prompt, tokenized as it is.
    Text(String),
    /// Chat messages, through the model's chat template.
    Chat(Vec<ChatMessage>),
}

/// One step of incremental detokenization (`generation.decode`): final
/// text, and where the next window starts and how much of it is text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Detokenized {
    /// Text later ids cannot change.
    pub text: String,
    /// How many ids of the window the next one starts after.
    pub prefix: usize,
    /// How many ids of the next window are already text.
    pub read: usize,
}

impl Exports {
    /// The 0.4 `generation` export, or why this plugin has none.
    fn generation(&self) -> Result<&v0_4::exports::plinth::plugin::generation::Guest, Error> {
        match self {
            Exports::V0_4(b) => Ok(b.plinth_plugin_generation()),
            other => Err(Error::InvalidArgument(format!(
                "the plugin is built against plinth:plugin@{}, which has no text generation (0.4.0 adds it)",
                other.version()
            ))),
        }
    }

    fn version(&self) -> ContractVersion {
        match self {
            Exports::V0_1(_) => ContractVersion::V0_1,
            Exports::V0_2(_) => ContractVersion::V0_2,
            Exports::V0_3(_) => ContractVersion::V0_3,
            Exports::V0_4(_) => ContractVersion::V0_4,
        }
    }

    /// `generation.info`: the stop token ids.
    pub(super) async fn stop_token_ids<T: Send>(
        &self,
        store: &mut Store<T>,
    ) -> wasmtime::Result<Result<Vec<u32>, Error>> {
        let generation = match self.generation() {
            Ok(g) => g,
            Err(e) => return Ok(Err(e)),
        };
        let info = generation.call_info(store).await?;
        Ok(info.map(|i| i.stop_token_ids).map_err(error_from_v0_3))
    }

    /// `generation.encode`: a prompt's token ids.
    pub(super) async fn encode<T: Send>(
        &self,
        store: &mut Store<T>,
        prompt: &Prompt,
    ) -> wasmtime::Result<Result<Vec<u32>, Error>> {
        use v0_4::exports::plinth::plugin::generation::{ChatMessage as W, Prompt as P};
        let generation = match self.generation() {
            Ok(g) => g,
            Err(e) => return Ok(Err(e)),
        };
        let prompt = match prompt {
            Prompt::Text(text) => P::Text(text.clone()),
            Prompt::Chat(messages) => {
                P::Chat(messages.iter().map(|m| W { role: m.role.clone(), content: m.content.clone() }).collect())
            }
        };
        Ok(generation.call_encode(store, &prompt).await?.map_err(error_from_v0_3))
    }

    /// `generation.decode`: the final text of a window of generated ids.
    pub(super) async fn decode<T: Send>(
        &self,
        store: &mut Store<T>,
        window: &[u32],
        read: usize,
    ) -> wasmtime::Result<Result<Detokenized, Error>> {
        let generation = match self.generation() {
            Ok(g) => g,
            Err(e) => return Ok(Err(e)),
        };
        let read = u32::try_from(read).unwrap_or(u32::MAX);
        let out = generation.call_decode(store, window, read).await?;
        Ok(out
            .map(|d| Detokenized { text: d.text, prefix: d.prefix as usize, read: d.read as usize })
            .map_err(error_from_v0_3))
    }
}

#[cfg(test)]
mod tests {
    use super::ContractVersion;

    #[test]
    fn versions_are_ordered_and_named_as_the_wit_packages() {
        assert!(ContractVersion::V0_1 < ContractVersion::V0_2 && ContractVersion::V0_2 < ContractVersion::V0_3);
        assert!(ContractVersion::V0_3 < ContractVersion::V0_4);
        let names: Vec<String> = ContractVersion::ALL.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["0.1.0", "0.2.0", "0.3.0", "0.4.0"]);
        for v in ContractVersion::ALL {
            let folder = format!("{}/../wit/v{}", env!("CARGO_MANIFEST_DIR"), v.as_str().trim_end_matches(".0"));
            let wit = std::fs::read_to_string(format!("{folder}/plugin.wit")).unwrap();
            assert!(wit.contains(&format!("package plinth:plugin@{v};")), "{folder} declares {v}");
        }
    }
}

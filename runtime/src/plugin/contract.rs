//! The released plugin contracts (`wit/v0.1`, `wit/v0.2`, each frozen) and
//! the dispatch of calls to the bindings of a component's version.
//!
//! The newest version's types are the ones the host works with: an older
//! version whose types are unchanged aliases them in its bindings (`with`),
//! so no conversion runs. A later version that changes a type gets its own
//! bindings as the shared set, and the older ones convert into them.

use wasmtime::component::{Component, InstancePre};
use wasmtime::{Engine, Store};

/// Bindings generated from each frozen contract.
mod bindings {
    pub mod v0_2 {
        wasmtime::component::bindgen!({ path: "../wit/v0.2", world: "plugin" });
    }
    pub mod v0_1 {
        // The types are unchanged since 0.1: 0.1 uses 0.2's.
        wasmtime::component::bindgen!({
            path: "../wit/v0.1",
            world: "plugin",
            with: { "plinth:plugin/types@0.1.0": super::v0_2::plinth::plugin::types },
        });
    }
}

/// The host side of `plinth:plugin/inference` (0.2 and later).
pub(super) use bindings::v0_2::plinth::plugin::inference::Host as InferenceHost;
/// The newest contract's types, which every version's calls use.
pub(super) use bindings::v0_2::plinth::plugin::types as wit;

/// A released `plinth:plugin` contract version, oldest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ContractVersion {
    /// `plinth:plugin@0.1.0`: `init`, `preprocess`, `postprocess`.
    V0_1,
    /// `plinth:plugin@0.2.0`: 0.1 and the `inference` import (composition).
    V0_2,
}

impl ContractVersion {
    /// Every version this host runs, oldest first.
    pub const ALL: [ContractVersion; 2] = [ContractVersion::V0_1, ContractVersion::V0_2];

    /// The version as the WIT package names it (`0.2.0`).
    pub fn as_str(self) -> &'static str {
        match self {
            ContractVersion::V0_1 => "0.1.0",
            ContractVersion::V0_2 => "0.2.0",
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

/// Adds the imports of every version to `linker`: 0.2's `inference`, which
/// later versions keep.
///
/// # Errors
/// wasmtime's message when an interface cannot be linked.
pub(super) fn add_to_linker<T: InferenceHost + wit::Host + 'static>(
    linker: &mut wasmtime::component::Linker<T>,
) -> wasmtime::Result<()> {
    bindings::v0_2::Plugin::add_to_linker::<_, wasmtime::component::HasSelf<_>>(linker, |s| s)
}

/// A component's bindings, ready to instantiate, for its contract version.
pub(super) enum Pre<T: 'static> {
    V0_1(bindings::v0_1::PluginPre<T>),
    V0_2(bindings::v0_2::PluginPre<T>),
}

impl<T: 'static> Pre<T> {
    /// The bindings of `version` over `instance_pre`.
    ///
    /// # Errors
    /// wasmtime's message when the component does not have that version's
    /// exports.
    pub(super) fn new(version: ContractVersion, instance_pre: InstancePre<T>) -> wasmtime::Result<Pre<T>> {
        Ok(match version {
            ContractVersion::V0_1 => Pre::V0_1(bindings::v0_1::PluginPre::new(instance_pre)?),
            ContractVersion::V0_2 => Pre::V0_2(bindings::v0_2::PluginPre::new(instance_pre)?),
        })
    }

    /// Instantiates the component in `store`.
    ///
    /// # Errors
    /// wasmtime's message or trap.
    pub(super) fn instantiate(&self, store: &mut Store<T>) -> wasmtime::Result<Exports> {
        Ok(match self {
            Pre::V0_1(pre) => Exports::V0_1(pre.instantiate(store)?),
            Pre::V0_2(pre) => Exports::V0_2(pre.instantiate(store)?),
        })
    }
}

/// An instance's exports, for its contract version.
pub(super) enum Exports {
    V0_1(bindings::v0_1::Plugin),
    V0_2(bindings::v0_2::Plugin),
}

impl Exports {
    pub(super) fn init<T>(
        &self,
        store: &mut Store<T>,
        info: &wit::ModelInfo,
    ) -> wasmtime::Result<Result<(), wit::Error>> {
        match self {
            Exports::V0_1(b) => b.plinth_plugin_handler().call_init(store, info),
            Exports::V0_2(b) => b.plinth_plugin_handler().call_init(store, info),
        }
    }

    pub(super) fn preprocess<T>(
        &self,
        store: &mut Store<T>,
        req: &wit::Request,
    ) -> wasmtime::Result<Result<Vec<wit::Tensor>, wit::Error>> {
        match self {
            Exports::V0_1(b) => b.plinth_plugin_handler().call_preprocess(store, req),
            Exports::V0_2(b) => b.plinth_plugin_handler().call_preprocess(store, req),
        }
    }

    pub(super) fn postprocess<T>(
        &self,
        store: &mut Store<T>,
        req: &wit::Request,
        outputs: &[wit::Tensor],
    ) -> wasmtime::Result<Result<wit::Response, wit::Error>> {
        match self {
            Exports::V0_1(b) => b.plinth_plugin_handler().call_postprocess(store, req, outputs),
            Exports::V0_2(b) => b.plinth_plugin_handler().call_postprocess(store, req, outputs),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ContractVersion;

    #[test]
    fn versions_are_ordered_and_named_as_the_wit_packages() {
        assert!(ContractVersion::V0_1 < ContractVersion::V0_2);
        let names: Vec<String> = ContractVersion::ALL.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["0.1.0", "0.2.0"]);
        for v in ContractVersion::ALL {
            let folder = format!("{}/../wit/v{}", env!("CARGO_MANIFEST_DIR"), v.as_str().trim_end_matches(".0"));
            let wit = std::fs::read_to_string(format!("{folder}/plugin.wit")).unwrap();
            assert!(wit.contains(&format!("package plinth:plugin@{v};")), "{folder} declares {v}");
        }
    }
}

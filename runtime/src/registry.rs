//! The table of models the server knows, each version READY (loaded) or
//! UNAVAILABLE with the reason, and the resolution of a request's model
//! name and version to a loaded model.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use crate::error::Error;
use crate::model::Model;

/// The state of one model version, in the repository extension's terms.
pub enum VersionState {
    /// Loaded and serving.
    Ready(Arc<Model>),
    /// Tried and failed; the reason says why.
    Unavailable(String),
}

/// A model's versions, or why none could be considered (e.g. a
/// `config.pbtxt` that does not parse).
#[derive(Default)]
pub struct ModelEntry {
    /// The versions tried, by number.
    pub versions: BTreeMap<u64, VersionState>,
    /// Why the model as a whole cannot be loaded, if it cannot.
    pub error: Option<String>,
}

/// One row of the repository index (`POST /v2/repository/index`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct IndexEntry {
    /// The model's name.
    pub name: String,
    /// Empty for a model-level failure.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// `READY` or `UNAVAILABLE`.
    pub state: &'static str,
    /// Why it is UNAVAILABLE; empty when READY.
    pub reason: String,
}

/// All models, by name. Lookups take a short read lock.
#[derive(Default)]
pub struct Registry {
    models: RwLock<BTreeMap<String, ModelEntry>>,
}

impl Registry {
    /// Records `entry` as the state of model `name`, replacing any earlier one.
    pub fn set(&self, name: &str, entry: ModelEntry) {
        self.models.write().expect("registry lock").insert(name.to_owned(), entry);
    }

    /// The model a request for `name` (and `version`, if given) reaches:
    /// that exact version, or else the highest READY version.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown model or version;
    /// [`Error::Unavailable`] with the reason when it is not READY.
    pub fn resolve(&self, name: &str, version: Option<u64>) -> Result<Arc<Model>, Error> {
        let models = self.models.read().expect("registry lock");
        let entry = models.get(name).ok_or_else(|| Error::NotFound(format!("unknown model '{name}'")))?;
        if let Some(reason) = &entry.error {
            return Err(Error::Unavailable(format!("model '{name}' is UNAVAILABLE: {reason}")));
        }
        match version {
            Some(v) => match entry.versions.get(&v) {
                Some(VersionState::Ready(m)) => Ok(m.clone()),
                Some(VersionState::Unavailable(reason)) => {
                    Err(Error::Unavailable(format!("model '{name}' version {v} is UNAVAILABLE: {reason}")))
                }
                None => Err(Error::NotFound(format!("model '{name}' has no version {v}"))),
            },
            None => entry
                .versions
                .values()
                .rev()
                .find_map(|s| match s {
                    VersionState::Ready(m) => Some(m.clone()),
                    VersionState::Unavailable(_) => None,
                })
                .ok_or_else(|| Error::Unavailable(unavailable_reason(name, entry))),
        }
    }

    /// The versions of `name` that are READY, ascending.
    pub fn ready_versions(&self, name: &str) -> Vec<u64> {
        let models = self.models.read().expect("registry lock");
        models.get(name).map_or_else(Vec::new, |e| {
            e.versions.iter().filter(|(_, s)| matches!(s, VersionState::Ready(_))).map(|(v, _)| *v).collect()
        })
    }

    /// Whether every known model version is READY.
    pub fn all_ready(&self) -> bool {
        let models = self.models.read().expect("registry lock");
        models.values().all(|e| e.error.is_none() && e.versions.values().all(|s| matches!(s, VersionState::Ready(_))))
    }

    /// The repository index: one row per model version (one per model for a
    /// model-level failure), sorted by name and version.
    pub fn index(&self) -> Vec<IndexEntry> {
        let models = self.models.read().expect("registry lock");
        let mut rows = Vec::new();
        for (name, entry) in models.iter() {
            if let Some(reason) = &entry.error {
                rows.push(IndexEntry { name: name.clone(), version: String::new(), state: "UNAVAILABLE", reason: reason.clone() });
            }
            for (v, state) in &entry.versions {
                let (state, reason) = match state {
                    VersionState::Ready(_) => ("READY", String::new()),
                    VersionState::Unavailable(r) => ("UNAVAILABLE", r.clone()),
                };
                rows.push(IndexEntry { name: name.clone(), version: v.to_string(), state, reason });
            }
        }
        rows
    }
}

fn unavailable_reason(name: &str, entry: &ModelEntry) -> String {
    let reasons: Vec<String> = entry
        .versions
        .iter()
        .filter_map(|(v, s)| match s {
            VersionState::Unavailable(r) => Some(format!("version {v}: {r}")),
            VersionState::Ready(_) => None,
        })
        .collect();
    if reasons.is_empty() {
        format!("model '{name}' has no version to serve")
    } else {
        format!("model '{name}' is UNAVAILABLE: {}", reasons.join("; "))
    }
}

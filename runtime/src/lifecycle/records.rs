//! What the lifecycle last did with each model: the files its last load
//! attempt saw and why it failed, the origin of each READY version, and the
//! folder a load from memory staged. What each version holds in memory is
//! the residency's (`crate::residency`).

use std::collections::BTreeMap;

use crate::error::LoadError;
use crate::registry::Registry;
use crate::repository::{Fingerprint, ModelFiles};

/// Where a READY version came from: the model folder's own files, the
/// version folder's files and the configuration override, if any. The same
/// key means there is nothing to reload.
pub(super) type LoadKey = (Fingerprint, Fingerprint, Option<String>);

/// What the lifecycle last did with one model. Its mutex also serialises
/// the loads and unloads of that model: concurrent first requests for a cold
/// model wait on it, and find the model loaded.
#[derive(Default)]
pub(super) struct ModelRecord {
    /// The files (and override) the last load attempt saw; poll mode tries
    /// again only when they change.
    pub(super) attempted: Option<(ModelFiles, Option<String>)>,
    /// Why that attempt failed, if it did.
    pub(super) failure: Option<LoadError>,
    /// Each READY version's origin.
    pub(super) loaded: BTreeMap<u64, LoadKey>,
    /// The folder the last load's `file:` parameters made, kept while a
    /// version loaded from it may serve.
    pub(super) staged: Option<tempfile::TempDir>,
}

impl ModelRecord {
    /// Forgets the versions of `name` that `registry` no longer has READY
    /// (evicted, refused room, retired); whether any went.
    pub(super) fn keep_ready(&mut self, registry: &Registry, name: &str) -> bool {
        let before = self.loaded.len();
        self.loaded.retain(|v, _| registry.is_ready(name, *v));
        self.loaded.len() < before
    }
}

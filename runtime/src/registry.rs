//! The table of models the server knows and the state of each version, in
//! the repository extension's terms (READY, LOADING, UNLOADING,
//! UNAVAILABLE; Triton's `docs/protocol/extension_model_repository.md`),
//! and the resolution of a request's model name and version to a loaded
//! model. `lifecycle` decides what changes; this module only records it.
//!
//! The table holds `Arc<M>`, a [`Model`] in the server; it calls nothing on
//! it, so tests fill it with anything.

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, RwLock};

use crate::error::Error;
use crate::model::Model;

/// The state of one model version.
pub enum VersionState<M = Model> {
    /// Being loaded and warmed up; not serving yet.
    Loading,
    /// Loaded and serving.
    Ready(Arc<M>),
    /// Tried and failed, or removed.
    Unavailable,
}

/// A model's or version's state as the repository index names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum RepositoryState {
    /// Serving.
    Ready,
    /// Being loaded.
    Loading,
    /// Taken out of service, finishing the requests it accepted.
    Unloading,
    /// Not serving: not loaded, failed, unloaded or evicted.
    Unavailable,
}

impl RepositoryState {
    /// The name the index uses (`READY`).
    pub fn as_str(self) -> &'static str {
        match self {
            RepositoryState::Ready => "READY",
            RepositoryState::Loading => "LOADING",
            RepositoryState::Unloading => "UNLOADING",
            RepositoryState::Unavailable => "UNAVAILABLE",
        }
    }
}

/// One version of a model: its state, and why the last attempt to load it
/// failed (empty when it did not). A READY version keeps serving when a
/// reload of it fails; the reason then says so.
pub struct Slot<M = Model> {
    /// Where the version stands.
    pub state: VersionState<M>,
    /// The last failure, if any.
    pub reason: String,
}

impl<M> Slot<M> {
    fn new(state: VersionState<M>) -> Slot<M> {
        Slot { state, reason: String::new() }
    }
}

/// A model's versions and standing.
pub struct ModelEntry<M = Model> {
    /// The versions tried, by number.
    pub versions: BTreeMap<u64, Slot<M>>,
    /// Why the model could not be (re)loaded as a whole the last time it was
    /// tried (a `config.pbtxt` that does not parse, an unload), if so.
    pub error: Option<String>,
    /// Whether the server should serve this model: it counts for readiness.
    pub wanted: bool,
}

impl<M> Default for ModelEntry<M> {
    fn default() -> Self {
        ModelEntry { versions: BTreeMap::new(), error: None, wanted: false }
    }
}

impl<M> ModelEntry<M> {
    fn ready(&self) -> impl DoubleEndedIterator<Item = (u64, &Arc<M>)> {
        self.versions.iter().filter_map(|(v, s)| match &s.state {
            VersionState::Ready(m) => Some((*v, m)),
            _ => None,
        })
    }
}

/// One row of the repository index (`POST /v2/repository/index`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct IndexEntry {
    pub name: String,
    /// Empty for a row about the model as a whole.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// `READY`, `LOADING`, `UNLOADING` or `UNAVAILABLE`.
    pub state: RepositoryState,
    /// Why it is UNAVAILABLE, or why its last reload failed; else empty.
    pub reason: String,
    /// Memory the version holds while READY (accounted at load), in bytes.
    pub resident_bytes: u64,
}

/// A version taken out of service that still has requests in flight: it
/// stays in memory until the last of them drops its `Arc<Model>`.
struct Draining<M> {
    name: String,
    version: u64,
    model: Weak<M>,
}

/// All models, by name. Lookups take a short read lock.
pub struct Registry<M = Model> {
    models: RwLock<BTreeMap<String, ModelEntry<M>>>,
    draining: Mutex<Vec<Draining<M>>>,
}

impl<M> Default for Registry<M> {
    fn default() -> Self {
        Registry { models: RwLock::default(), draining: Mutex::default() }
    }
}

impl<M> Registry<M> {
    /// Whether the registry's locks can be taken within `wait` each
    /// (readiness: a lock held that long means requests are stuck).
    pub fn responsive(&self, wait: std::time::Duration) -> bool {
        self.models.try_read_for(wait).is_some() && self.draining.try_lock_for(wait).is_some()
    }

    /// Runs `f` on the entry of `name`, creating an empty one if needed.
    fn update<T>(&self, name: &str, f: impl FnOnce(&mut ModelEntry<M>) -> T) -> T {
        let mut models = self.models.write();
        f(models.entry(name.to_owned()).or_default())
    }

    /// Lists `name` as a model of the repository that is not loaded, with
    /// `reason`, unless it is known already.
    pub fn add_unloaded(&self, name: &str, reason: &str) {
        self.update(name, |e| {
            if e.versions.is_empty() && e.error.is_none() {
                e.error = Some(reason.to_owned());
            }
        });
    }

    /// A load of `name` begins: clears a model-level error and, with
    /// `wanted`, makes the model count for readiness from now on.
    pub fn begin_load(&self, name: &str, wanted: bool) {
        self.update(name, |e| {
            e.wanted |= wanted;
            e.error = None;
        });
    }

    /// Records why `name` cannot be loaded (now). Versions that are READY
    /// keep serving; the index shows the reason beside them.
    pub fn fail_model(&self, name: &str, reason: &str) {
        self.update(name, |e| e.error = Some(reason.to_owned()));
    }

    /// Version `version` of `name` starts loading. A READY version stays
    /// READY (and serving) while its replacement loads.
    pub fn set_loading(&self, name: &str, version: u64) {
        self.update(name, |e| {
            let slot = e.versions.entry(version).or_insert(Slot::new(VersionState::Loading));
            if !matches!(slot.state, VersionState::Ready(_)) {
                slot.state = VersionState::Loading;
            }
        });
    }

    /// Version `version` of `name` is loaded: it serves from now on. A
    /// model it replaces finishes its in-flight requests, then is dropped.
    pub fn set_ready(&self, name: &str, version: u64, model: Arc<M>) {
        let old = self.update(name, |e| {
            let slot = Slot::new(VersionState::Ready(model));
            e.versions.insert(version, slot).map(|s| s.state)
        });
        if let Some(VersionState::Ready(old)) = old {
            self.drain(name, version, &old);
        }
    }

    /// A load of `version` failed with `reason`. A READY version stays
    /// READY and serving; otherwise the version becomes UNAVAILABLE.
    pub fn set_failed(&self, name: &str, version: u64, reason: &str) {
        self.update(name, |e| {
            let slot = e.versions.entry(version).or_insert(Slot::new(VersionState::Unavailable));
            if !matches!(slot.state, VersionState::Ready(_)) {
                slot.state = VersionState::Unavailable;
            }
            slot.reason = reason.to_owned();
        });
    }

    /// Takes the versions of `name` that are not in `keep` out of the
    /// table, once one of `keep` is READY (until then they keep serving).
    /// A READY version taken out drains (UNLOADING) and is then dropped.
    pub fn retire_versions(&self, name: &str, keep: &[u64]) {
        let retired = self.update(name, |e| {
            if !e.ready().any(|(v, _)| keep.contains(&v)) {
                return Vec::new();
            }
            let gone: Vec<u64> = e.versions.keys().copied().filter(|v| !keep.contains(v)).collect();
            gone.into_iter().filter_map(|v| e.versions.remove(&v).map(|s| (v, s))).collect::<Vec<_>>()
        });
        for (version, slot) in retired {
            if let VersionState::Ready(model) = slot.state {
                tracing::info!(model = %name, version, "unloading: no longer selected by the version policy");
                self.drain(name, version, &model);
            }
        }
    }

    /// Whether version `version` of `name` is READY.
    pub fn is_ready(&self, name: &str, version: u64) -> bool {
        let models = self.models.read();
        models
            .get(name)
            .and_then(|e| e.versions.get(&version))
            .is_some_and(|s| matches!(s.state, VersionState::Ready(_)))
    }

    /// Takes every version of `name` out of service, recording `reason`:
    /// later requests get 503 with it; requests in flight finish first.
    /// Returns the models taken out, so the caller can drop them and give
    /// their memory back.
    pub fn unload(&self, name: &str, reason: &str) -> Vec<Arc<M>> {
        let old = self.update(name, |e| {
            e.wanted = false;
            e.error = Some(reason.to_owned());
            std::mem::take(&mut e.versions)
        });
        self.drain_all(name, old)
    }

    /// Takes every version of `name` out of service so that new ones can
    /// load in their place (a swap that unloads first): as
    /// [`Registry::unload`], but the model stays wanted and records no
    /// error, since a load of it is under way.
    pub fn make_way(&self, name: &str) -> Vec<Arc<M>> {
        let old = self.update(name, |e| std::mem::take(&mut e.versions));
        self.drain_all(name, old)
    }

    /// Drains the READY ones of `versions`, taken out of `name`'s entry,
    /// and returns their models.
    fn drain_all(&self, name: &str, old: BTreeMap<u64, Slot<M>>) -> Vec<Arc<M>> {
        let mut models = Vec::new();
        for (version, slot) in old {
            if let VersionState::Ready(model) = slot.state {
                self.drain(name, version, &model);
                models.push(model);
            }
        }
        models
    }

    /// Drops every trace of `name`, after [`Registry::unload`]: it is no
    /// longer listed (modelmesh mode, where an unloaded model id is gone).
    pub fn forget(&self, name: &str) {
        self.models.write().remove(name);
    }

    /// Whether `name` has a READY version.
    pub fn has_ready(&self, name: &str) -> bool {
        let models = self.models.read();
        models.get(name).is_some_and(|e| e.ready().next().is_some())
    }

    /// Whether a request is using one of the READY versions of `name`: the
    /// registry holds one reference, each request in flight another.
    pub fn is_busy(&self, name: &str) -> bool {
        let models = self.models.read();
        models.get(name).is_some_and(|e| e.ready().any(|(_, m)| Arc::strong_count(m) > 1))
    }

    fn drain(&self, name: &str, version: u64, model: &Arc<M>) {
        let mut draining = self.draining.lock();
        draining.push(Draining { name: name.to_owned(), version, model: Arc::downgrade(model) });
    }

    /// The READY versions of `name`, ascending.
    pub fn ready_versions(&self, name: &str) -> Vec<u64> {
        let models = self.models.read();
        models.get(name).map_or_else(Vec::new, |e| e.ready().map(|(v, _)| v).collect())
    }

    /// Every READY version of model `name`, or of every model for `None`.
    pub fn ready_models(&self, name: Option<&str>) -> Vec<Arc<M>> {
        let models = self.models.read();
        let entries = models.iter().filter(|(n, _)| name.is_none_or(|name| n.as_str() == name));
        entries.flat_map(|(_, e)| e.ready().map(|(_, m)| m.clone())).collect()
    }

    /// The model a request for `name` (and `version`, if given) reaches:
    /// that exact version, or else the highest READY version.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown model or version;
    /// [`Error::Unavailable`] with the reason when it is not READY. The
    /// messages begin as Triton's do (`Request for unknown model: 'm' is not
    /// found`, `... version 2 is not found`, `... version 2 is not at ready
    /// state`, `... has no available versions`), which clients match, and
    /// give Plinth's reason after.
    pub fn resolve(&self, name: &str, version: Option<u64>) -> Result<Arc<M>, Error> {
        let models = self.models.read();
        let entry = models.get(name).ok_or_else(|| Error::NotFound(unknown_model(name, None)))?;
        match version {
            Some(v) => match entry.versions.get(&v).map(|s| (&s.state, &s.reason)) {
                Some((VersionState::Ready(m), _)) => Ok(m.clone()),
                Some((VersionState::Loading, _)) => Err(Error::Unavailable(format!(
                    "{UNKNOWN_MODEL}: '{name}' version {v} is not at ready state: it is LOADING"
                ))),
                Some((VersionState::Unavailable, reason)) => Err(Error::Unavailable(format!(
                    "{UNKNOWN_MODEL}: '{name}' version {v} is not at ready state: it is UNAVAILABLE: {reason}"
                ))),
                None => Err(Error::NotFound(unknown_model(name, Some(v)))),
            },
            None => entry
                .ready()
                .next_back()
                .map(|(_, m)| m.clone())
                .ok_or_else(|| Error::Unavailable(unavailable_reason(name, entry))),
        }
    }

    /// Whether every wanted model has a READY version.
    pub fn all_ready(&self) -> bool {
        let models = self.models.read();
        models.values().filter(|e| e.wanted).all(|e| e.ready().next().is_some())
    }

    /// The repository index: one row per model version, one per model for a
    /// model-level state, and one per version still draining, sorted by name.
    /// A READY version's `resident_bytes` is what `resident_bytes(name,
    /// version)` says (the residency's accounting).
    pub fn index(&self, resident_bytes: impl Fn(&str, u64) -> u64) -> Vec<IndexEntry> {
        let mut rows = Vec::new();
        {
            let models = self.models.read();
            for (name, entry) in models.iter() {
                if let Some(reason) = &entry.error {
                    rows.push(IndexEntry {
                        name: name.clone(),
                        version: String::new(),
                        state: RepositoryState::Unavailable,
                        reason: reason.clone(),
                        resident_bytes: 0,
                    });
                }
                for (v, slot) in &entry.versions {
                    let (state, resident_bytes) = match slot.state {
                        VersionState::Loading => (RepositoryState::Loading, 0),
                        VersionState::Ready(_) => (RepositoryState::Ready, resident_bytes(name, *v)),
                        VersionState::Unavailable => (RepositoryState::Unavailable, 0),
                    };
                    rows.push(IndexEntry {
                        name: name.clone(),
                        version: v.to_string(),
                        state,
                        reason: slot.reason.clone(),
                        resident_bytes,
                    });
                }
            }
        }
        let mut draining = self.draining.lock();
        draining.retain(|d| d.model.strong_count() > 0);
        for d in draining.iter() {
            rows.push(IndexEntry {
                name: d.name.clone(),
                version: d.version.to_string(),
                state: RepositoryState::Unloading,
                reason: String::new(),
                resident_bytes: 0,
            });
        }
        // Versions in numeric order (9 before 10); a model's own row first.
        rows.sort_by_key(|row| (row.name.clone(), row.version.parse::<u64>().ok()));
        rows
    }
}

/// How Triton begins the message for a model or version that cannot serve a
/// request (its `ModelRepositoryManager::GetModel`); clients match on it.
pub const UNKNOWN_MODEL: &str = "Request for unknown model";

/// Triton's message for a model (or one of its versions) that does not exist.
pub fn unknown_model(name: &str, version: Option<u64>) -> String {
    match version {
        Some(v) => format!("{UNKNOWN_MODEL}: '{name}' version {v} is not found"),
        None => format!("{UNKNOWN_MODEL}: '{name}' is not found"),
    }
}

fn unavailable_reason<M>(name: &str, entry: &ModelEntry<M>) -> String {
    let none = format!("{UNKNOWN_MODEL}: '{name}' has no available versions");
    if let Some(reason) = &entry.error {
        return format!("{none}: it is UNAVAILABLE: {reason}");
    }
    let reasons: Vec<String> = entry
        .versions
        .iter()
        .map(|(v, s)| match s.state {
            VersionState::Loading => format!("version {v} is LOADING"),
            _ => format!("version {v}: {}", s.reason),
        })
        .collect();
    if reasons.is_empty() { none } else { format!("{none}: {}", reasons.join("; ")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registry of stand-ins: it never looks inside what it holds.
    fn registry() -> Registry<&'static str> {
        Registry::default()
    }

    fn rows(r: &Registry<&'static str>) -> Vec<(String, String, &'static str)> {
        r.index(|_, _| 0).into_iter().map(|row| (row.name, row.version, row.state.as_str())).collect()
    }

    #[test]
    fn requests_reach_the_highest_ready_version_or_the_one_named() {
        let r = registry();
        r.begin_load("m", true);
        r.set_ready("m", 1, Arc::new("one"));
        r.set_ready("m", 2, Arc::new("two"));
        r.set_loading("m", 3);
        assert_eq!(*r.resolve("m", None).unwrap(), "two");
        assert_eq!(*r.resolve("m", Some(1)).unwrap(), "one");
        let loading = "Request for unknown model: 'm' version 3 is not at ready state: it is LOADING";
        assert_eq!(r.resolve("m", Some(3)).err(), Some(Error::Unavailable(loading.into())));
        let missing = "Request for unknown model: 'm' version 4 is not found";
        assert_eq!(r.resolve("m", Some(4)).err(), Some(Error::NotFound(missing.into())));
        let unknown = "Request for unknown model: 'x' is not found";
        assert_eq!(r.resolve("x", None).err(), Some(Error::NotFound(unknown.into())));
        assert_eq!(r.ready_versions("m"), [1, 2]);
    }

    #[test]
    fn a_failed_reload_keeps_the_ready_version_serving_with_the_reason() {
        let r = registry();
        r.set_ready("m", 1, Arc::new("one"));
        r.set_loading("m", 1);
        r.set_failed("m", 1, "broken file");
        assert_eq!(*r.resolve("m", Some(1)).unwrap(), "one");
        let row = r.index(|_, v| 10 * v).pop().unwrap();
        assert_eq!((row.state, row.reason.as_str(), row.resident_bytes), (RepositoryState::Ready, "broken file", 10));
        r.set_failed("m", 2, "no such file");
        assert_eq!(
            r.resolve("m", Some(2)).err(),
            Some(Error::Unavailable(
                "Request for unknown model: 'm' version 2 is not at ready state: it is UNAVAILABLE: no such file"
                    .into()
            ))
        );
    }

    #[test]
    fn a_replaced_or_retired_version_drains_until_its_last_request_lets_go() {
        let r = registry();
        r.set_ready("m", 1, Arc::new("old"));
        let in_flight = r.resolve("m", Some(1)).unwrap();
        assert!(r.is_busy("m"));
        r.set_ready("m", 2, Arc::new("new"));
        r.retire_versions("m", &[2]);
        assert_eq!(rows(&r), [("m".into(), "1".into(), "UNLOADING"), ("m".into(), "2".into(), "READY")]);
        drop(in_flight);
        assert_eq!(rows(&r), [("m".into(), "2".into(), "READY")]);
        assert!(!r.is_busy("m"));
    }

    #[test]
    fn versions_stay_until_one_that_is_kept_is_ready() {
        let r = registry();
        r.set_ready("m", 1, Arc::new("one"));
        r.set_failed("m", 2, "broken");
        r.retire_versions("m", &[2]);
        assert_eq!(*r.resolve("m", None).unwrap(), "one", "nothing retired while the new version is not READY");
    }

    #[test]
    fn unloading_takes_every_version_out_and_says_why() {
        let r = registry();
        r.begin_load("m", true);
        r.set_ready("m", 1, Arc::new("one"));
        assert!(r.all_ready());
        let taken = r.unload("m", "unloaded");
        assert_eq!(taken.len(), 1);
        let unloaded = "Request for unknown model: 'm' has no available versions: it is UNAVAILABLE: unloaded";
        assert_eq!(r.resolve("m", None).err(), Some(Error::Unavailable(unloaded.into())));
        assert!(r.all_ready(), "an unloaded model no longer counts for readiness");
        r.add_unloaded("other", "not loaded");
        assert!(r.all_ready(), "nor does a model that was never loaded");
        r.begin_load("other", true);
        assert!(!r.all_ready());
    }

    #[test]
    fn the_index_lists_versions_in_numeric_order() {
        let r = registry();
        for v in [10, 2, 9] {
            r.set_ready("m", v, Arc::new("x"));
        }
        r.add_unloaded("a", "not loaded");
        let listed: Vec<(String, String)> = rows(&r).into_iter().map(|(n, v, _)| (n, v)).collect();
        let want = [("a", ""), ("m", "2"), ("m", "9"), ("m", "10")];
        assert_eq!(listed, want.map(|(n, v)| (n.to_owned(), v.to_owned())));
    }
}

//! The table of models the server knows and the state of each version, in
//! the repository extension's terms (READY, LOADING, UNLOADING,
//! UNAVAILABLE), and the resolution of a request's model name and version
//! to a loaded model. `lifecycle` decides what changes; this module only
//! records it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock, Weak};

use crate::error::Error;
use crate::model::Model;

/// The state of one model version.
pub enum VersionState {
    /// Being loaded and warmed up; not serving yet.
    Loading,
    /// Loaded and serving.
    Ready(Arc<Model>),
    /// Tried and failed, or removed.
    Unavailable,
}

/// One version of a model: its state, and why the last attempt to load it
/// failed (empty when it did not). A READY version keeps serving when a
/// reload of it fails; the reason then says so.
pub struct Slot {
    /// Where the version stands.
    pub state: VersionState,
    /// The last failure, if any.
    pub reason: String,
    /// Measured memory footprint while READY, in bytes.
    pub bytes: u64,
}

impl Slot {
    fn new(state: VersionState) -> Slot {
        Slot { state, reason: String::new(), bytes: 0 }
    }
}

/// A model's versions and standing.
#[derive(Default)]
pub struct ModelEntry {
    /// The versions tried, by number.
    pub versions: BTreeMap<u64, Slot>,
    /// Why the model could not be (re)loaded as a whole the last time it was
    /// tried (a `config.pbtxt` that does not parse, an unload), if so.
    pub error: Option<String>,
    /// Whether the server should serve this model: it counts for readiness.
    pub wanted: bool,
}

impl ModelEntry {
    fn ready(&self) -> impl DoubleEndedIterator<Item = (u64, &Arc<Model>)> {
        self.versions.iter().filter_map(|(v, s)| match &s.state {
            VersionState::Ready(m) => Some((*v, m)),
            _ => None,
        })
    }
}

/// One row of the repository index (`POST /v2/repository/index`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct IndexEntry {
    /// The model's name.
    pub name: String,
    /// Empty for a row about the model as a whole.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// `READY`, `LOADING`, `UNLOADING` or `UNAVAILABLE`.
    pub state: &'static str,
    /// Why it is UNAVAILABLE, or why its last reload failed; else empty.
    pub reason: String,
    /// Memory the version holds while READY (measured at load), in bytes.
    pub resident_bytes: u64,
}

/// A version taken out of service that still has requests in flight: it
/// stays in memory until the last of them drops its `Arc<Model>`.
struct Draining {
    name: String,
    version: u64,
    model: Weak<Model>,
}

/// All models, by name. Lookups take a short read lock.
#[derive(Default)]
pub struct Registry {
    models: RwLock<BTreeMap<String, ModelEntry>>,
    draining: Mutex<Vec<Draining>>,
}

impl Registry {
    /// Runs `f` on the entry of `name`, creating an empty one if needed.
    fn update<T>(&self, name: &str, f: impl FnOnce(&mut ModelEntry) -> T) -> T {
        let mut models = self.models.write().expect("registry lock");
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

    /// Version `version` of `name` is loaded, holding `bytes`: it serves
    /// from now on. A model it replaces finishes its in-flight requests, then
    /// is dropped.
    pub fn set_ready(&self, name: &str, version: u64, model: Arc<Model>, bytes: u64) {
        let old = self.update(name, |e| {
            let slot = Slot { state: VersionState::Ready(model), reason: String::new(), bytes };
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
        let models = self.models.read().expect("registry lock");
        models
            .get(name)
            .and_then(|e| e.versions.get(&version))
            .is_some_and(|s| matches!(s.state, VersionState::Ready(_)))
    }

    /// Takes every version of `name` out of service, recording `reason`:
    /// later requests get 503 with it; requests in flight finish first.
    /// Returns the models taken out, so the caller can drop them and give
    /// their memory back.
    pub fn unload(&self, name: &str, reason: &str) -> Vec<Arc<Model>> {
        let old = self.update(name, |e| {
            e.wanted = false;
            e.error = Some(reason.to_owned());
            std::mem::take(&mut e.versions)
        });
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
        self.models.write().expect("registry lock").remove(name);
    }

    /// Whether `name` has a READY version.
    pub fn has_ready(&self, name: &str) -> bool {
        let models = self.models.read().expect("registry lock");
        models.get(name).is_some_and(|e| e.ready().next().is_some())
    }

    /// Whether a request is using one of the READY versions of `name`: the
    /// registry holds one reference, each request in flight another.
    pub fn is_busy(&self, name: &str) -> bool {
        let models = self.models.read().expect("registry lock");
        models.get(name).is_some_and(|e| e.ready().any(|(_, m)| Arc::strong_count(m) > 1))
    }

    fn drain(&self, name: &str, version: u64, model: &Arc<Model>) {
        let mut draining = self.draining.lock().expect("draining lock");
        draining.push(Draining { name: name.to_owned(), version, model: Arc::downgrade(model) });
    }

    /// The READY versions of `name`, ascending.
    pub fn ready_versions(&self, name: &str) -> Vec<u64> {
        let models = self.models.read().expect("registry lock");
        models.get(name).map_or_else(Vec::new, |e| e.ready().map(|(v, _)| v).collect())
    }

    /// Every READY version of model `name`, or of every model for `None`.
    pub fn ready_models(&self, name: Option<&str>) -> Vec<Arc<Model>> {
        let models = self.models.read().expect("registry lock");
        let entries = models.iter().filter(|(n, _)| name.is_none_or(|name| n.as_str() == name));
        entries.flat_map(|(_, e)| e.ready().map(|(_, m)| m.clone())).collect()
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
        match version {
            Some(v) => match entry.versions.get(&v).map(|s| (&s.state, &s.reason)) {
                Some((VersionState::Ready(m), _)) => Ok(m.clone()),
                Some((VersionState::Loading, _)) => {
                    Err(Error::Unavailable(format!("model '{name}' version {v} is LOADING")))
                }
                Some((VersionState::Unavailable, reason)) => {
                    Err(Error::Unavailable(format!("model '{name}' version {v} is UNAVAILABLE: {reason}")))
                }
                None => Err(Error::NotFound(format!("model '{name}' has no version {v}"))),
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
        let models = self.models.read().expect("registry lock");
        models.values().filter(|e| e.wanted).all(|e| e.ready().next().is_some())
    }

    /// The repository index: one row per model version, one per model for a
    /// model-level state, and one per version still draining, sorted by name.
    pub fn index(&self) -> Vec<IndexEntry> {
        let mut rows = Vec::new();
        {
            let models = self.models.read().expect("registry lock");
            for (name, entry) in models.iter() {
                if let Some(reason) = &entry.error {
                    rows.push(IndexEntry {
                        name: name.clone(),
                        version: String::new(),
                        state: "UNAVAILABLE",
                        reason: reason.clone(),
                        resident_bytes: 0,
                    });
                }
                for (v, slot) in &entry.versions {
                    let (state, resident_bytes) = match slot.state {
                        VersionState::Loading => ("LOADING", 0),
                        VersionState::Ready(_) => ("READY", slot.bytes),
                        VersionState::Unavailable => ("UNAVAILABLE", 0),
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
        let mut draining = self.draining.lock().expect("draining lock");
        draining.retain(|d| d.model.strong_count() > 0);
        for d in draining.iter() {
            rows.push(IndexEntry {
                name: d.name.clone(),
                version: d.version.to_string(),
                state: "UNLOADING",
                reason: String::new(),
                resident_bytes: 0,
            });
        }
        rows.sort_by(|a, b| (&a.name, &a.version).cmp(&(&b.name, &b.version)));
        rows
    }
}

fn unavailable_reason(name: &str, entry: &ModelEntry) -> String {
    if let Some(reason) = &entry.error {
        return format!("model '{name}' is UNAVAILABLE: {reason}");
    }
    let reasons: Vec<String> = entry
        .versions
        .iter()
        .map(|(v, s)| match s.state {
            VersionState::Loading => format!("version {v} is LOADING"),
            _ => format!("version {v}: {}", s.reason),
        })
        .collect();
    if reasons.is_empty() {
        format!("model '{name}' has no version to serve")
    } else {
        format!("model '{name}' is UNAVAILABLE: {}", reasons.join("; "))
    }
}

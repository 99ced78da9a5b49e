//! What every control mode shares: the records of what was loaded from
//! where (`records`), the repositories, unloading, and keeping the
//! residency accounting and metrics in step with the registry. Loading is
//! `loading`; a hot swap on a GPU, `swap`.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::LoadLimits;
use super::loader::Loader;
use super::records::ModelRecord;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::repository::{ModelDir, ModelFiles, Repositories, ScanError};
use crate::residency::{self, Footprint, Residency, Versions};
use crate::rollout::Rollouts;

/// Why an evicted model is not serving.
const EVICTED: &str = "evicted to stay within the memory budget; the next request loads it again";

/// The shared core of every control mode.
pub(super) struct Core {
    pub(super) registry: Arc<Registry>,
    pub(super) loader: Arc<dyn Loader>,
    pub(super) repositories: Repositories,
    records: Mutex<HashMap<String, Arc<tokio::sync::Mutex<ModelRecord>>>>,
    pub(super) residency: Residency,
    /// Each model's rollout from its serving version to a candidate.
    pub(super) rollouts: Rollouts,
    /// `--model-load-concurrency` loads at a time.
    pub(super) load_permits: tokio::sync::Semaphore,
    pub(super) limits: LoadLimits,
    pub(super) metrics: Arc<Metrics>,
}

impl Core {
    pub(super) fn new(
        loader: Arc<dyn Loader>,
        registry: Arc<Registry>,
        repositories: Repositories,
        residency: Residency,
        limits: LoadLimits,
        metrics: Arc<Metrics>,
    ) -> Core {
        metrics.residency.budget_bytes.set(limits.budget.bytes.map_or(0, |b| b as i64));
        Core {
            registry,
            loader,
            repositories,
            records: Mutex::default(),
            residency,
            rollouts: Rollouts::new(metrics.rollout.clone()),
            load_permits: tokio::sync::Semaphore::new(limits.concurrency.max(1)),
            limits,
            metrics,
        }
    }

    /// The model folders of every repository and what each holds now.
    ///
    /// # Errors
    /// A message when a repository cannot be read (a store that cannot be
    /// listed shows what its mirror last synced, if anything).
    pub(super) async fn scan(&self) -> Result<Vec<(ModelDir, ModelFiles)>, ScanError> {
        self.repositories.scan().await
    }

    /// The folder of model `name` in the repositories, if there is one.
    pub(super) async fn find(&self, name: &str) -> Option<ModelDir> {
        self.repositories.find(name).await
    }

    /// See [`Repositories::remove_temporary_mirrors`].
    pub(super) fn remove_temporary_mirrors(&self) {
        self.repositories.remove_temporary_mirrors();
    }

    /// What model folder `dir` holds as far as loading goes, without
    /// fetching it.
    pub(super) fn observe(&self, dir: &ModelDir) -> ModelFiles {
        self.repositories.observe(dir)
    }

    /// The first of the core's shared parts (records, registry, residency,
    /// rollouts) whose lock cannot be taken within `wait`: every request
    /// takes some of them, so none can be served while one is stuck.
    pub(super) fn stuck(&self, wait: std::time::Duration) -> Option<&'static str> {
        let parts: [(&str, &dyn Fn() -> bool); 4] = [
            ("the model records' lock", &|| self.records.try_lock_for(wait).is_some()),
            ("the registry's lock", &|| self.registry.responsive(wait)),
            ("the residency's lock", &|| self.residency.responsive(wait)),
            ("the rollouts' lock", &|| self.rollouts.responsive(wait)),
        ];
        parts.into_iter().find(|(_, free)| !free()).map(|(name, _)| name)
    }

    /// The record of model `name`, created empty the first time.
    pub(super) fn record(&self, name: &str) -> Arc<tokio::sync::Mutex<ModelRecord>> {
        self.records.lock().entry(name.to_owned()).or_default().clone()
    }

    /// Every model that has a record.
    pub(super) fn recorded(&self) -> Vec<String> {
        self.records.lock().keys().cloned().collect()
    }

    /// Forgets the record of `name`, and its per-model metric series,
    /// unless someone else holds or waits for it (`record` is the caller's
    /// own handle).
    pub(super) fn forget_record(&self, name: &str, record: &Arc<tokio::sync::Mutex<ModelRecord>>) {
        let mut records = self.records.lock();
        // Only the caller holds it besides the map: nothing waits on it.
        if Arc::strong_count(record) == 2 {
            records.remove(name);
            self.metrics.residency.forget(name, self.gpus_of(name));
        }
    }

    /// The GPUs `name` held memory on when last loaded.
    pub(super) fn gpus_of(&self, name: &str) -> Vec<u32> {
        self.residency.known_footprint(name).map_or_else(Vec::new, |f| f.devices.keys().copied().collect())
    }

    /// Unloads every version of `name`. Requests already accepted finish;
    /// later ones get 503.
    ///
    /// # Errors
    /// [`Error::NotFound`] when no such model is known.
    pub(super) async fn unload(&self, name: &str) -> Result<(), Error> {
        let record = self.record(name);
        let mut record = record.lock().await;
        if self.find(name).await.is_none() && self.registry.resolve(name, None).is_err() {
            return Err(Error::NotFound(format!("unknown model '{name}'")));
        }
        self.take_out(name, "unloaded");
        *record = ModelRecord::default();
        // Its versions' series left with them; its loads count goes too
        // (an evicted model keeps its loads and evictions counts instead:
        // it serves again at its next request).
        self.metrics.residency.forget(name, self.gpus_of(name));
        tracing::info!(model = %name, "unloaded");
        Ok(())
    }

    /// Makes room for `need` for `name` as the residency's admission says:
    /// evicting least recently used models, or refusing.
    ///
    /// # Errors
    /// A message when `need` exceeds a whole budget (nothing is evicted),
    /// or, where nothing is evicted, the room left.
    pub(super) fn make_room(&self, name: &str, need: &Footprint) -> Result<(), String> {
        for victim in self.residency.make_room(name, need, |n| self.registry.is_busy(n))? {
            tracing::info!(model = %victim, "evicting: least recently used");
            self.metrics.residency.evictions.with_label_values(&[&victim]).inc();
            self.take_out(&victim, EVICTED);
        }
        Ok(())
    }

    /// Records what `name`'s READY versions hold once a load or unload of
    /// some of them finished: the accounted footprints of the versions just
    /// loaded (`loaded`) with those of the versions still READY from
    /// before. Makes room if the model turned out larger than room was made
    /// for.
    ///
    /// # Errors
    /// A message when the footprint exceeds the whole budget (or, where
    /// nothing is evicted, the room left): the model is taken out again, and
    /// later requests are refused without a load.
    pub(super) fn settle(&self, name: &str, loaded: Versions, pinned_by_config: bool) -> Result<(), String> {
        let mut versions = self.residency.versions(name);
        versions.retain(|v, _| self.registry.is_ready(name, *v));
        versions.extend(loaded);
        let footprint = residency::total(&versions);
        if footprint.is_empty() {
            self.residency.remove(name);
            return Ok(());
        }
        let previous = self.residency.known_footprint(name).unwrap_or_default();
        self.residency.admit(name, versions, pinned_by_config);
        if let Err(reason) = self.make_room(name, &footprint) {
            self.take_out(name, &reason);
            // The series of GPUs only the versions before it used go too.
            self.metrics.residency.forget_footprint(name, previous.devices.keys().copied());
            return Err(reason);
        }
        let residency = &self.metrics.residency;
        // A GPU the model no longer uses (its `gpus` changed) loses its series.
        let left = previous.devices.keys().filter(|gpu| !footprint.devices.contains_key(gpu)).copied();
        residency.forget_footprint(name, left);
        residency.resident_bytes.with_label_values(&[name]).set(footprint.host as i64);
        for (gpu, bytes) in &footprint.devices {
            residency.device_bytes.with_label_values(&[name, &gpu.to_string()]).set(*bytes as i64);
        }
        residency.used_bytes.set(self.residency.used().host as i64);
        Ok(())
    }

    /// Takes every version of `name` out of service with `reason` and gives
    /// its memory back once no request uses it.
    pub(super) fn take_out(&self, name: &str, reason: &str) {
        // Each version's instances are freed, and their memory handed back,
        // once its last request lets it go (`drain::FreedOffThread`).
        drop(self.registry.unload(name, reason));
        self.rollouts.forget(name);
        self.forget_residency(name);
    }

    /// Takes `version` of `name` out of service (a promoted rollout's
    /// serving version), keeping the residency accounting in step. The
    /// model's other versions stay.
    pub(super) async fn retire_version(&self, name: &str, version: u64) {
        let record = self.record(name);
        let mut record = record.lock().await;
        let keep: Vec<u64> = self.registry.ready_versions(name).into_iter().filter(|v| *v != version).collect();
        if keep.is_empty() {
            return;
        }
        self.registry.retire_versions(name, &keep);
        record.keep_ready(&self.registry, name);
        if let Err(reason) = self.settle(name, Versions::new(), self.residency.holds_pinned(name)) {
            tracing::warn!(model = %name, "{reason}");
        }
    }

    /// Records that `name` left memory: the residency and its footprint series.
    pub(super) fn forget_residency(&self, name: &str) {
        self.residency.remove(name);
        self.metrics.residency.forget_footprint(name, self.gpus_of(name));
        self.metrics.residency.used_bytes.set(self.residency.used().host as i64);
    }
}

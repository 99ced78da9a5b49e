//! On-demand loading and residency: a request for a model that is not
//! resident loads it (one load, however many requests wait), and the least
//! recently used models make room when the memory budget would be exceeded.

use std::sync::Arc;

use super::{Lifecycle, ModelRecord};
use crate::config::{self, ModelConfig};
use crate::error::Error;
use crate::model::Model;
use crate::repository::ModelDir;
use crate::residency::{self, Resident};

/// The `config.pbtxt` parameter that keeps a model resident: `pinned: "true"`.
pub const PINNED_PARAMETER: &str = "pinned";

/// Why an evicted model is not serving.
const EVICTED: &str = "evicted to stay within the memory budget; the next request loads it again";

/// How often a request retries when its freshly loaded model is evicted by
/// another load before it could be used.
const ATTEMPTS: usize = 3;

/// Whether `config` pins its model (`parameters { key: "pinned" value: { string_value: "true" } }`).
pub(super) fn parameter_says_pinned(config: &ModelConfig) -> bool {
    config::parameter(config, PINNED_PARAMETER) == Some("true")
}

impl Lifecycle {
    /// The model a request for `name` (and `version`) reaches. In on-demand
    /// mode a model that is not resident is loaded first; the request waits
    /// at most `--model-load-timeout-secs` (the load itself goes on).
    ///
    /// # Errors
    /// As [`crate::registry::Registry::resolve`]; in on-demand mode also
    /// [`Error::Unavailable`] when the model cannot be loaded (its reason),
    /// does not fit the budget, or takes longer than the timeout.
    pub async fn resolve(self: &Arc<Self>, name: &str, version: Option<u64>) -> Result<Arc<Model>, Error> {
        if self.mode != super::ControlMode::OnDemand {
            return self.registry.resolve(name, version);
        }
        if self.registry.has_ready(name) {
            let model = self.registry.resolve(name, version)?;
            self.residency.touch(name);
            self.metrics.residency_hits.inc();
            return Ok(model);
        }
        let Some(dir) = self.find(name) else { return self.registry.resolve(name, version) };
        self.metrics.residency_misses.inc();
        let this = self.clone();
        // The load runs as its own task, so a request that gives up waiting
        // never cancels it halfway.
        let loading = tokio::spawn(async move { this.ensure_resident(&dir, version).await });
        match tokio::time::timeout(self.limits.timeout, loading).await {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => Err(Error::Internal(format!("loading model '{name}' panicked: {e}"))),
            Err(_) => Err(Error::Unavailable(format!(
                "model '{name}' did not finish loading within {} s (--model-load-timeout-secs); try again",
                self.limits.timeout.as_secs()
            ))),
        }
    }

    /// Loads `dir` unless it is resident, and returns the model for the
    /// request. Concurrent callers queue on the model's record and find it
    /// loaded; a load that failed is not retried until its files change.
    async fn ensure_resident(&self, dir: &ModelDir, version: Option<u64>) -> Result<Arc<Model>, Error> {
        let name = &dir.name;
        let record = self.record(name);
        for _ in 0..ATTEMPTS {
            let mut record = record.lock().await;
            if self.registry.has_ready(name) {
                return self.registry.resolve(name, version);
            }
            if let Some(reason) = self.known_failure(dir, &record) {
                return Err(Error::Unavailable(format!("model '{name}' cannot be loaded: {reason}")));
            }
            let pinned = self.is_pinned(name);
            self.load_locked(dir, None, pinned, &mut record)
                .await
                .map_err(|reason| Error::Unavailable(format!("model '{name}' cannot be loaded: {reason}")))?;
            if let Ok(model) = self.registry.resolve(name, version) {
                self.residency.touch(name);
                return Ok(model);
            }
        }
        Err(Error::Unavailable(format!(
            "model '{name}' was evicted by other loads before it could serve; the memory budget is too small for this traffic"
        )))
    }

    /// The reason the last load of `dir` failed, if its files have not
    /// changed since.
    fn known_failure(&self, dir: &ModelDir, record: &ModelRecord) -> Option<String> {
        let (tried, config_json) = record.attempted.as_ref()?;
        let unchanged = config_json.is_none() && *tried == crate::repository::ModelFiles::observe(dir);
        if unchanged { record.failure.clone() } else { None }
    }

    fn is_pinned(&self, name: &str) -> bool {
        self.pinned.lock().expect("pinned lock").iter().any(|p| p == name)
    }

    /// Evicts least recently used models until `need` more bytes for `name`
    /// fit the budget. In modelmesh mode ModelMesh evicts: nothing is, and a
    /// model that does not fit beside the others is refused.
    ///
    /// # Errors
    /// A message when `need` exceeds the whole budget (nothing is evicted),
    /// or in modelmesh mode the room left.
    pub(super) fn make_room(&self, name: &str, need: u64) -> Result<(), String> {
        self.residency.check_fits(name, need)?;
        if self.mode == super::ControlMode::ModelMesh {
            return self.residency.check_free(name, need);
        }
        for victim in self.residency.victims(name, need, |n| self.registry.is_busy(n)) {
            self.evict(&victim);
        }
        Ok(())
    }

    /// Records `name`'s measured footprint once its load finished, and
    /// evicts others if it turned out larger than room was made for.
    ///
    /// # Errors
    /// A message when the footprint exceeds the whole budget (or, in
    /// modelmesh mode, the room left): the model is taken out again, and
    /// later requests are refused without a load.
    pub(super) fn settle(&self, name: &str, footprint: u64, pinned_by_config: bool) -> Result<(), String> {
        if footprint == 0 {
            self.residency.remove(name);
            return Ok(());
        }
        let resident = Resident { bytes: footprint, pinned: pinned_by_config || self.is_pinned(name) };
        self.residency.admit(name, resident);
        if let Err(reason) = self.make_room(name, footprint) {
            self.take_out(name, &reason);
            return Err(reason);
        }
        self.metrics.resident_bytes.with_label_values(&[name]).set(footprint as i64);
        self.metrics.used_bytes.set(self.residency.used() as i64);
        Ok(())
    }

    /// Takes `name` out of memory to make room.
    fn evict(&self, name: &str) {
        tracing::info!(model = %name, "evicting: least recently used");
        self.metrics.evictions.with_label_values(&[name]).inc();
        self.take_out(name, EVICTED);
    }

    /// Takes every version of `name` out of service with `reason` and gives
    /// its memory back once no request uses it.
    pub(super) fn take_out(&self, name: &str, reason: &str) {
        let models = self.registry.unload(name, reason);
        self.residency.remove(name);
        let _ = self.metrics.resident_bytes.remove_label_values(&[name]);
        self.metrics.used_bytes.set(self.residency.used() as i64);
        drop(models);
        residency::release_freed_memory();
    }
}

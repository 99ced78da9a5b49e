//! On-demand mode: every model of the repositories is available, and a
//! request for one that is not resident loads it (one load, however many
//! requests wait); the least recently used models make room when the memory
//! budget would be exceeded (`core::Core::make_room`). `--load-model`
//! models load at start and are pinned.

use std::sync::Arc;

use super::core::Core;
use super::loading::LoadOptions;
use super::records::ModelRecord;
use super::startup;
use crate::error::Error;
use crate::model::Model;
use crate::repository::{ModelDir, ScanError};

/// How often a request retries when its freshly loaded model is evicted by
/// another load before it could be used.
const ATTEMPTS: usize = 3;

/// Loads and pins the `--load-model` models; the others wait for their first
/// request.
///
/// # Errors
/// A message when a repository cannot be read.
pub(super) async fn start(core: &Core, load_models: &[String]) -> Result<(), ScanError> {
    let not_resident = "not resident; the first request for it loads it";
    // Pinned before they load, so that loading one never evicts another.
    startup::start(core, load_models, not_resident, |names| names.iter().for_each(|n| core.residency.pin(n))).await
}

/// The model a request for `name` (and `version`) reaches, loaded first if
/// it is not resident; the request waits at most `--model-load-timeout-secs`
/// (the load itself goes on).
///
/// # Errors
/// As [`crate::registry::Registry::resolve`], and [`Error::Unavailable`]
/// when the model cannot be loaded (its reason), does not fit the budget, or
/// takes longer than the timeout.
pub(super) async fn resolve(core: &Arc<Core>, name: &str, version: Option<u64>) -> Result<Arc<Model>, Error> {
    if core.registry.has_ready(name) {
        let model = core.registry.resolve(name, version)?;
        core.residency.touch(name);
        core.metrics.residency.hits.inc();
        return Ok(model);
    }
    let Some(dir) = core.find(name).await else { return core.registry.resolve(name, version) };
    core.metrics.residency.misses.inc();
    let owned = core.clone();
    // The load runs as its own task, so a request that gives up waiting
    // never cancels it halfway.
    let loading = tokio::spawn(async move { ensure_resident(&owned, &dir, version).await });
    match tokio::time::timeout(core.limits.timeout, loading).await {
        Ok(Ok(result)) => result,
        Ok(Err(e)) => Err(Error::Internal(format!("loading model '{name}' panicked: {e}"))),
        Err(_) => Err(Error::Unavailable(format!(
            "model '{name}' did not finish loading within {} s (--model-load-timeout-secs); try again",
            core.limits.timeout.as_secs()
        ))),
    }
}

/// Loads `dir` unless it is resident, and returns the model for the
/// request. Concurrent callers queue on the model's record and find it
/// loaded; a load that failed is not retried until its files change (one
/// refused for room is).
async fn ensure_resident(core: &Core, dir: &ModelDir, version: Option<u64>) -> Result<Arc<Model>, Error> {
    let name = &dir.name;
    let record = core.record(name);
    let cannot =
        |reason: &dyn std::fmt::Display| Error::Unavailable(format!("model '{name}' cannot be loaded: {reason}"));
    for _ in 0..ATTEMPTS {
        let mut record = record.lock().await;
        if core.registry.has_ready(name) {
            return core.registry.resolve(name, version);
        }
        if let Some(reason) = known_failure(core, dir, &record) {
            return Err(cannot(reason));
        }
        let options = LoadOptions { wanted: core.residency.is_pinned(name), rename: false, chain: &[] };
        core.load_locked(dir, None, options, &mut record).await.map_err(|e| cannot(&e))?;
        if let Ok(model) = core.registry.resolve(name, version) {
            core.residency.touch(name);
            return Ok(model);
        }
    }
    Err(Error::Unavailable(format!(
        "model '{name}' was evicted by other loads before it could serve; the memory budget is too small for this traffic"
    )))
}

/// Why the last load of `dir` failed, if its files have not changed since.
/// A refusal for room is not remembered: it depends on what else is
/// resident and on the budget, not on the files, so the next request tries
/// again.
fn known_failure<'a>(core: &Core, dir: &ModelDir, record: &'a ModelRecord) -> Option<&'a crate::error::LoadError> {
    let (tried, config_json) = record.attempted.as_ref()?;
    let unchanged = config_json.is_none() && *tried == core.observe(dir);
    match &record.failure {
        Some(crate::error::LoadError::NoRoom(_)) => None,
        failure if unchanged => failure.as_ref(),
        _ => None,
    }
}

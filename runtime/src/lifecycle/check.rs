//! `plinth check`: the start-up of `plinth serve` in mode `none`, without
//! listeners, so that a repository it passes is one `serve` loads in full.

use std::path::PathBuf;
use std::sync::Arc;

use super::{ControlMode, Lifecycle, LoadLimits, RuntimeLoader};
use crate::model::Runtimes;
use crate::registry::{IndexEntry, Registry, RepositoryState};
use crate::residency::Budget;

/// Loads every model of `repositories` with `runtimes` exactly as `plinth
/// serve --model-control-mode none` does at start: each configuration
/// against Triton's validation rules, every selected version (model file,
/// configuration against it, plugin contract, warm-up), every ensemble with
/// its steps (cycles, tensors, data types, shapes, batch sizes). Returns one
/// line per model or version that would not be READY, naming it, with the
/// reason the repository index would give; empty when all would serve.
///
/// # Errors
/// A message when a repository cannot be read.
pub async fn check_repository(repositories: Vec<PathBuf>, runtimes: Runtimes) -> Result<Vec<String>, String> {
    let metrics = runtimes.metrics.clone();
    let limits = LoadLimits {
        concurrency: std::thread::available_parallelism().map_or(1, usize::from),
        timeout: std::time::Duration::from_secs(60),
        budget: Budget::default(),
    };
    let loader = Arc::new(RuntimeLoader::new(runtimes));
    let lifecycle =
        Lifecycle::new(loader, Arc::new(Registry::default()), repositories, ControlMode::None, limits, metrics);
    lifecycle.start(&[]).await?;
    Ok(lifecycle.registry().index().iter().filter_map(problem).collect())
}

/// The line for a row of the index that does not serve, if it does not.
fn problem(row: &IndexEntry) -> Option<String> {
    (row.state != RepositoryState::Ready).then(|| match row.version.as_str() {
        "" => format!("model '{}': {}", row.name, row.reason),
        version => format!("model '{}' version {version}: {}", row.name, row.reason),
    })
}

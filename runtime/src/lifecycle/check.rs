//! `plinth check`: the start-up of `plinth serve` in mode `none`, without
//! listeners, so that a repository it passes is one `serve` loads in full.

use super::{ControlMode, Lifecycle, LoadingOptions};
use crate::registry::{IndexEntry, RepositoryState};

/// Starts the runtimes and loads every model of `opts`' repositories
/// exactly as `plinth serve --model-control-mode none` does at start, with
/// the same loading flags ([`Lifecycle::from_options`], then
/// [`Lifecycle::start`]): each configuration against Triton's validation
/// rules, every selected version (model file, configuration against it,
/// plugin contract, warm-up), every ensemble with its steps (cycles,
/// tensors, data types, shapes, batch sizes). Returns one line per row of
/// the repository index that is not READY, naming the model (and version),
/// with the reason the index gives; empty when all would serve.
///
/// # Errors
/// As [`Lifecycle::from_options`], or a message when a repository cannot
/// be read.
pub async fn check_repository(opts: &LoadingOptions) -> Result<Vec<String>, String> {
    let lifecycle = Lifecycle::from_options(&LoadingOptions { control_mode: ControlMode::None, ..opts.clone() })?;
    lifecycle.start(&[]).await?;
    Ok(lifecycle.index().iter().filter_map(problem).collect())
}

/// The line for a row of the index that does not serve, if it does not.
fn problem(row: &IndexEntry) -> Option<String> {
    (row.state != RepositoryState::Ready).then(|| match row.version.as_str() {
        "" => format!("model '{}': {}", row.name, row.reason),
        version => format!("model '{}' version {version}: {}", row.name, row.reason),
    })
}

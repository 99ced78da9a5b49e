//! Start-up in the modes that load from the repositories: every model
//! (`none`, `poll`), or the `--load-model` ones (`explicit`, `on_demand`),
//! after which the repository API's load and unload decide. The models load
//! side by side, `--model-load-concurrency` at a time (the load permits),
//! in name order.

use futures_util::future::join_all;

use super::core::Core;
use super::request::LoadRequest;
use crate::repository::{ModelDir, ScanError};

/// Loads every model of the repositories; returns their folders.
///
/// # Errors
/// A message when a repository cannot be read.
pub(super) async fn load_all(core: &Core) -> Result<Vec<ModelDir>, ScanError> {
    let dirs: Vec<ModelDir> = core.scan().await?.into_iter().map(|(dir, _)| dir).collect();
    // Errors are in the log and the index already.
    join_all(dirs.iter().map(|dir| core.load(&dir.name, LoadRequest::default()))).await;
    Ok(dirs)
}

/// Loads the models `load_models` names (`*` for all) and lists the others
/// as not loaded, with `not_loaded` as the reason. `before_loading` sees the
/// names to load before the first load starts.
///
/// # Errors
/// A message when a repository cannot be read.
pub(super) async fn start(
    core: &Core,
    load_models: &[String],
    not_loaded: &str,
    before_loading: impl FnOnce(&[String]),
) -> Result<(), ScanError> {
    let dirs: Vec<ModelDir> = core.scan().await?.into_iter().map(|(dir, _)| dir).collect();
    let wanted: Vec<String> = if load_models.iter().any(|m| m == "*") {
        dirs.iter().map(|d| d.name.clone()).collect()
    } else {
        load_models.to_vec()
    };
    for dir in dirs.iter().filter(|d| !wanted.contains(&d.name)) {
        core.registry.add_unloaded(&dir.name, not_loaded);
    }
    before_loading(&wanted);
    join_all(wanted.iter().map(|name| core.load(name, LoadRequest::default()))).await;
    Ok(())
}

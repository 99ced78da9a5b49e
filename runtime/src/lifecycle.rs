//! Loading the repository's models into the registry. A model that fails
//! to load is recorded as UNAVAILABLE with the reason; it never stops the
//! others from loading or serving.

use std::sync::Arc;
use std::time::Instant;

use crate::config;
use crate::model::{Model, Runtimes};
use crate::registry::{ModelEntry, Registry, VersionState};
use crate::repository::{self, ModelDir};

/// Loads every model found in the repositories, one after another.
///
/// # Errors
/// A message when a repository cannot be read at all.
pub fn load_all(repositories: &[std::path::PathBuf], rt: &Runtimes, registry: &Registry) -> Result<(), String> {
    for dir in repository::scan(repositories)? {
        let entry = load_model(&dir, rt);
        registry.set(&dir.name, entry);
    }
    Ok(())
}

/// Loads the versions of one model that its version policy selects.
pub fn load_model(dir: &ModelDir, rt: &Runtimes) -> ModelEntry {
    let config = match config::load(&dir.path).and_then(|c| check_name(dir, c)) {
        Ok(c) => c,
        Err(reason) => {
            tracing::error!(model = %dir.name, "cannot load: {reason}");
            return ModelEntry { error: Some(reason), ..ModelEntry::default() };
        }
    };
    let selected = repository::select_versions(config.version_policy.as_ref(), &repository::versions(dir));
    if selected.is_empty() {
        let reason = "no version folder selected by its version_policy (numeric folders such as 1/)".to_owned();
        tracing::error!(model = %dir.name, "cannot load: {reason}");
        return ModelEntry { error: Some(reason), ..ModelEntry::default() };
    }
    let mut entry = ModelEntry::default();
    for version in selected {
        let started = Instant::now();
        let state = match Model::load(dir, version, &config, rt) {
            Ok(model) => {
                tracing::info!(model = %dir.name, version, ms = started.elapsed().as_millis() as u64, "READY");
                VersionState::Ready(Arc::new(model))
            }
            Err(reason) => {
                tracing::error!(model = %dir.name, version, "UNAVAILABLE: {reason}");
                VersionState::Unavailable(reason)
            }
        };
        entry.versions.insert(version, state);
    }
    entry
}

/// Triton requires `name`, when given, to equal the folder name.
fn check_name(dir: &ModelDir, config: config::ModelConfig) -> Result<config::ModelConfig, String> {
    if config.name.is_empty() || config.name == dir.name {
        Ok(config)
    } else {
        Err(format!(
            "{} says name '{}' but the model folder is '{}'; they must match",
            config::CONFIG_FILE,
            config.name,
            dir.name
        ))
    }
}

//! `plinth check`: validating a repository without serving it.

use std::path::PathBuf;

use super::core::model_config;
use crate::model::{Model, Runtimes};
use crate::{config, repository};

/// Checks a repository without serving it: every configuration parses and
/// passes Triton's validation rules (every problem of it listed, even when
/// the model file is missing), and every selected version loads (model
/// file, configuration against it, plugin instantiation). Returns one line
/// per problem, naming the model and version; empty when all is well.
pub fn check_repository(repositories: &[PathBuf], runtimes: &Runtimes) -> Result<Vec<String>, String> {
    let mut problems = Vec::new();
    for dir in repository::scan(repositories)? {
        let config = match model_config(&dir, None, false) {
            Ok(c) => c,
            Err(found) => {
                problems.extend(found.into_iter().map(|problem| format!("model '{}': {problem}", dir.name)));
                continue;
            }
        };
        let available = repository::versions(&dir);
        let targets = repository::select_versions(config.version_policy.as_ref(), &available);
        if targets.is_empty() {
            let reason = format!("no version folder for its version_policy among {available:?}");
            problems.push(format!("model '{}': {}", dir.name, config::with_missing_files_hint(&config, reason)));
        }
        for version in targets {
            if let Err(reason) = Model::load(&dir, version, &config, runtimes) {
                problems.push(format!("model '{}' version {version}: {reason}", dir.name));
            }
        }
    }
    Ok(problems)
}

//! The model repository on disk: one folder per model holding
//! `config.pbtxt` and numeric version folders (Triton's layout).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::config::proto::{ModelVersionPolicy, model_version_policy::PolicyChoice};

/// A model folder found in a repository.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelDir {
    /// The folder name, which is the model's name.
    pub name: String,
    /// The model folder.
    pub path: PathBuf,
}

impl ModelDir {
    /// The folder of version `version`.
    pub fn version_path(&self, version: u64) -> PathBuf {
        self.path.join(version.to_string())
    }
}

/// Lists the model folders of every repository, by name.
///
/// # Errors
/// A message when a repository cannot be read, or when two repositories
/// hold a model of the same name.
pub fn scan(repositories: &[PathBuf]) -> Result<Vec<ModelDir>, String> {
    let mut models = BTreeMap::new();
    for repo in repositories {
        let entries = std::fs::read_dir(repo)
            .map_err(|e| format!("cannot read model repository {}: {e}", repo.display()))?;
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
                continue;
            };
            if !path.is_dir() || name.starts_with('.') {
                continue;
            }
            if let Some(previous) = models.insert(name.clone(), ModelDir { name: name.clone(), path: path.clone() }) {
                return Err(format!(
                    "model '{name}' is in two repositories: {} and {}",
                    previous.path.display(),
                    path.display()
                ));
            }
        }
    }
    Ok(models.into_values().collect())
}

/// The version numbers present in a model folder, ascending. Folders whose
/// names are not numbers are ignored, with a log line saying so.
pub fn versions(model: &ModelDir) -> Vec<u64> {
    let Ok(entries) = std::fs::read_dir(&model.path) else { return Vec::new() };
    let mut versions: Vec<u64> = entries
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let version = name.parse::<u64>().ok();
            if version.is_none() && !name.starts_with('.') {
                tracing::info!(model = %model.name, folder = %name, "ignoring a folder that is not a version number");
            }
            version
        })
        .collect();
    versions.sort_unstable();
    versions
}

/// The versions a `version_policy` selects from `available` (ascending).
/// No policy means Triton's default, `latest { num_versions: 1 }`.
pub fn select_versions(policy: Option<&ModelVersionPolicy>, available: &[u64]) -> Vec<u64> {
    match policy.and_then(|p| p.policy_choice.as_ref()) {
        None => latest(available, 1),
        Some(PolicyChoice::Latest(l)) => latest(available, l.num_versions.max(1) as usize),
        Some(PolicyChoice::All(_)) => available.to_vec(),
        Some(PolicyChoice::Specific(s)) => available
            .iter()
            .copied()
            .filter(|v| s.versions.iter().any(|&w| u64::try_from(w) == Ok(*v)))
            .collect(),
    }
}

fn latest(available: &[u64], n: usize) -> Vec<u64> {
    available[available.len().saturating_sub(n)..].to_vec()
}

/// Whether `path` is inside a repository folder (used to refuse plugin
/// paths that escape their model folder).
pub fn is_within(path: &Path, folder: &Path) -> bool {
    match (path.canonicalize(), folder.canonicalize()) {
        (Ok(p), Ok(f)) => p.starts_with(f),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::proto::model_version_policy::{All, Latest, Specific};

    fn policy(choice: PolicyChoice) -> ModelVersionPolicy {
        ModelVersionPolicy { policy_choice: Some(choice) }
    }

    #[test]
    fn version_policies_select_like_triton() {
        let available = [1, 2, 5];
        assert_eq!(select_versions(None, &available), vec![5]);
        assert_eq!(select_versions(Some(&policy(PolicyChoice::Latest(Latest { num_versions: 2 }))), &available), vec![2, 5]);
        assert_eq!(select_versions(Some(&policy(PolicyChoice::All(All {}))), &available), vec![1, 2, 5]);
        let specific = policy(PolicyChoice::Specific(Specific { versions: vec![1, 3] }));
        assert_eq!(select_versions(Some(&specific), &available), vec![1]);
        assert_eq!(select_versions(None, &[]), Vec::<u64>::new());
    }

    #[test]
    fn scan_finds_models_and_numeric_versions() {
        let repo = tempfile::tempdir().unwrap();
        for dir in ["a/1", "a/3", "a/notes", "b/2", ".hidden/1"] {
            std::fs::create_dir_all(repo.path().join(dir)).unwrap();
        }
        let models = scan(&[repo.path().to_path_buf()]).unwrap();
        let names: Vec<_> = models.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(versions(&models[0]), vec![1, 3]);
    }
}

//! Model repositories: one folder per model holding `config.pbtxt` and
//! numeric version folders (Triton's layout), on this machine or in object
//! storage ([`remote`], mirrored into a local folder that is then read as
//! a local repository). [`location`] reads where a repository is.

mod listing;
pub mod location;
pub mod remote;
mod sources;
mod stores;

pub use location::Location;
pub use sources::{Repositories, ScanError};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::config::proto::{ModelVersionPolicy, model_version_policy::PolicyChoice};

/// A model folder found in a repository.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelDir {
    /// The folder name, which is the model's name.
    pub name: String,
    pub path: PathBuf,
}

impl ModelDir {
    /// The folder of version `version`.
    pub fn version_path(&self, version: u64) -> PathBuf {
        self.path.join(version.to_string())
    }
}

/// Whether `name` can name a model folder: one plain path component (not
/// empty, no `/` or `\\`, not `.` or `..`), so that a name from a request
/// never reaches outside the repositories.
pub fn is_model_name(name: &str) -> bool {
    let mut parts = Path::new(name).components();
    !name.contains(['/', '\\']) && matches!((parts.next(), parts.next()), (Some(std::path::Component::Normal(_)), None))
}

/// The model folders of one repository folder, by name.
///
/// # Errors
/// A message when the folder cannot be read.
pub fn scan_folder(repo: &Path) -> Result<Vec<ModelDir>, String> {
    let entries =
        std::fs::read_dir(repo).map_err(|e| format!("cannot read model repository {}: {e}", repo.display()))?;
    let mut models = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            continue;
        };
        if path.is_dir() && !name.starts_with('.') {
            models.push(ModelDir { name, path });
        }
    }
    models.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(models)
}

/// The version numbers present in a model folder, ascending.
pub fn versions(model: &ModelDir) -> Vec<u64> {
    let (mut versions, _) = subfolders(model);
    versions.sort_unstable();
    versions
}

/// Folders of a model folder that hold data, not a version: warm-up samples
/// (`model_warmup`'s `input_data_file`, `plugin.warmup`) and a sequence
/// model's `initial_state` files, as Triton lays them out.
pub const DATA_FOLDERS: [&str; 2] = ["warmup", "initial_state"];

/// The subfolders of a model folder that are neither version numbers nor
/// [`DATA_FOLDERS`] (nor hidden): they are ignored, and loading logs them.
pub fn ignored_folders(model: &ModelDir) -> Vec<String> {
    subfolders(model).1.into_iter().filter(|f| !DATA_FOLDERS.contains(&f.as_str())).collect()
}

/// A version number as a folder or URL names it: decimal digits without a
/// leading zero (`0`, `1`, `42`; not `01`, `+1`, ` 1`). `None` otherwise or
/// beyond `u64`.
pub fn parse_version(s: &str) -> Option<u64> {
    let canonical = s == "0" || (!s.starts_with('0') && !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()));
    if canonical { s.parse().ok() } else { None }
}

fn subfolders(model: &ModelDir) -> (Vec<u64>, Vec<String>) {
    let (mut versions, mut others) = (Vec::new(), Vec::new());
    let Ok(entries) = std::fs::read_dir(&model.path) else { return (versions, others) };
    for entry in entries.flatten().filter(|e| e.path().is_dir()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        match parse_version(&name) {
            Some(v) => versions.push(v),
            None if !name.starts_with('.') => others.push(name),
            None => {}
        }
    }
    (versions, others)
}

/// The versions a `version_policy` selects from `available` (ascending).
/// No policy means Triton's default, `latest { num_versions: 1 }`.
pub fn select_versions(policy: Option<&ModelVersionPolicy>, available: &[u64]) -> Vec<u64> {
    match policy.and_then(|p| p.policy_choice.as_ref()) {
        None => latest(available, 1),
        Some(PolicyChoice::Latest(l)) => latest(available, l.num_versions.max(1) as usize),
        Some(PolicyChoice::All(_)) => available.to_vec(),
        Some(PolicyChoice::Specific(s)) => {
            let missing: Vec<i64> =
                s.versions.iter().copied().filter(|&w| !available.iter().any(|&v| u64::try_from(w) == Ok(v))).collect();
            if !missing.is_empty() {
                tracing::warn!(?missing, "version_policy names versions that have no folder");
            }
            available.iter().copied().filter(|v| s.versions.iter().any(|&w| u64::try_from(w) == Ok(*v))).collect()
        }
    }
}

fn latest(available: &[u64], n: usize) -> Vec<u64> {
    available[available.len().saturating_sub(n)..].to_vec()
}

/// What identifies one file's content for a change: its path, size,
/// modification time and, for an object in a store, its entity tag.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp {
    /// The file's path (inside its folder, for an object).
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// When it was last written, if known.
    pub modified: Option<SystemTime>,
    /// The store's entity tag of an object (`None` for a local file).
    pub tag: Option<String>,
}

/// The stamp of every file under a folder: a change to any file, or a file
/// added or removed, changes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fingerprint(Vec<Stamp>);

impl Fingerprint {
    /// Fingerprints the files directly in `dir` (`recursive: false`) or
    /// every file below it. Unreadable entries are left out.
    pub fn of(dir: &Path, recursive: bool) -> Fingerprint {
        let mut files = Vec::new();
        collect(dir, recursive, &mut files);
        Fingerprint::from_stamps(files)
    }

    /// The fingerprint of files stamped elsewhere (an object listing).
    pub fn from_stamps(mut stamps: Vec<Stamp>) -> Fingerprint {
        stamps.sort();
        Fingerprint(stamps)
    }

    /// The total size of the files, in bytes.
    pub fn bytes(&self) -> u64 {
        self.0.iter().map(|s| s.size).sum()
    }
}

fn collect(dir: &Path, recursive: bool, files: &mut Vec<Stamp>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        // A link to a file counts as the file (ModelMesh's puller and
        // staging link weights); links to folders are not followed.
        let Ok(meta) = std::fs::metadata(entry.path()) else { continue };
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            if recursive {
                collect(&entry.path(), true, files);
            }
        } else if meta.is_file() {
            files.push(Stamp { path: entry.path(), size: meta.len(), modified: meta.modified().ok(), tag: None });
        }
    }
}

/// What a model folder holds, as far as loading is concerned: the files
/// beside the versions (`config.pbtxt`, the plugin, labels) and each numeric
/// version folder's files.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelFiles {
    /// Files directly in the model folder.
    pub top: Fingerprint,
    /// Each version folder's files, by version.
    pub versions: BTreeMap<u64, Fingerprint>,
}

impl ModelFiles {
    /// Observes `model` as it is on disk now.
    pub fn observe(model: &ModelDir) -> ModelFiles {
        let versions =
            versions(model).into_iter().map(|v| (v, Fingerprint::of(&model.version_path(v), true))).collect();
        ModelFiles { top: Fingerprint::of(&model.path, false), versions }
    }
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
    #[test]
    fn model_names_stay_inside_the_repository() {
        use super::is_model_name;
        assert!(is_model_name("ocr_cls"));
        assert!(is_model_name("a.b-c"));
        for bad in ["", ".", "..", "../x", "a/b", "/tmp/x", "a\\b", "x/.."] {
            assert!(!is_model_name(bad), "{bad:?}");
        }
    }

    use super::*;
    use crate::config::proto::model_version_policy::{All, Latest, Specific};

    fn policy(choice: PolicyChoice) -> ModelVersionPolicy {
        ModelVersionPolicy { policy_choice: Some(choice) }
    }

    #[test]
    fn version_policies_select_like_triton() {
        let available = [1, 2, 5];
        assert_eq!(select_versions(None, &available), vec![5]);
        assert_eq!(
            select_versions(Some(&policy(PolicyChoice::Latest(Latest { num_versions: 2 }))), &available),
            vec![2, 5]
        );
        assert_eq!(select_versions(Some(&policy(PolicyChoice::All(All {}))), &available), vec![1, 2, 5]);
        let specific = policy(PolicyChoice::Specific(Specific { versions: vec![1, 3] }));
        assert_eq!(select_versions(Some(&specific), &available), vec![1]);
        assert_eq!(select_versions(None, &[]), Vec::<u64>::new());
    }

    #[test]
    fn scan_finds_models_and_numeric_versions() {
        let repo = tempfile::tempdir().unwrap();
        for dir in ["a/1", "a/3", "a/notes", "a/03", "b/2", ".hidden/1"] {
            std::fs::create_dir_all(repo.path().join(dir)).unwrap();
        }
        let models = scan_folder(repo.path()).unwrap();
        let names: Vec<_> = models.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(versions(&models[0]), vec![1, 3]);
        let mut ignored = ignored_folders(&models[0]);
        ignored.sort();
        assert_eq!(ignored, ["03", "notes"]);
    }

    #[test]
    fn versions_are_canonical_numbers() {
        assert_eq!(parse_version("0"), Some(0));
        assert_eq!(parse_version("42"), Some(42));
        for bad in ["", "01", "+1", "-1", " 1", "1a", "99999999999999999999"] {
            assert_eq!(parse_version(bad), None, "{bad:?}");
        }
    }
}

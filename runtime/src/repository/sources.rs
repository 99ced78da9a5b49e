//! Every repository a server reads, local folders and object stores
//! alike, behind the questions the lifecycle asks: which model folders
//! there are, where one is, what it holds now, and bringing it to disk
//! before it loads. A remote model's folder is its mirror folder; the
//! lifecycle loads it as a local one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::location::{Location, RemoteLocation};
use super::remote::{Listing, RemoteRepository};
use super::{ModelDir, ModelFiles, is_model_name};
use crate::metrics::RepositoryMetrics;

/// Why the repositories could not be listed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ScanError {
    /// What went wrong, naming the repository or model.
    pub message: String,
    /// Whether trying again later may succeed: a store in object storage
    /// that cannot be listed, or lists nothing yet. Two repositories
    /// holding one model, or a folder that cannot be read, are not.
    pub transient: bool,
}

impl From<ScanError> for String {
    fn from(e: ScanError) -> String {
        e.message
    }
}

/// The repositories of a server, in the order given.
#[derive(Default)]
pub struct Repositories {
    list: Vec<Repository>,
    /// The temporary folder of the mirrors when no cache folder was given:
    /// removed when the server stops, as Triton removes its copy.
    scratch: parking_lot::Mutex<Option<tempfile::TempDir>>,
}

/// One repository.
pub enum Repository {
    /// A folder on this machine.
    Local(PathBuf),
    /// A bucket path, mirrored into a local folder.
    Remote(Arc<RemoteRepository>),
}

impl From<Vec<PathBuf>> for Repositories {
    fn from(folders: Vec<PathBuf>) -> Repositories {
        Repositories { list: folders.into_iter().map(Repository::Local).collect(), scratch: Default::default() }
    }
}

impl Repositories {
    /// Opens the repositories at `locations`: a local one must be a
    /// folder; a remote one is mirrored under `cache` (`--repository-cache-dir`),
    /// else under the folder its provider's Triton variable names
    /// (`TRITON_AWS_MOUNT_DIRECTORY`, `TRITON_GCS_MOUNT_DIRECTORY`,
    /// `TRITON_AZURE_MOUNT_DIRECTORY`), else under a temporary folder
    /// removed when the server stops. Each remote repository has its own
    /// folder there, named after its location, so a kept cache folder
    /// serves again after a restart.
    ///
    /// # Errors
    /// A message naming the location for a local one that is not a folder,
    /// or a remote one whose store or mirror cannot be set up.
    pub fn open(
        locations: &[Location],
        cache: Option<&Path>,
        metrics: &Arc<RepositoryMetrics>,
    ) -> Result<Repositories, String> {
        let mut scratch: Option<tempfile::TempDir> = None;
        let mut list = Vec::new();
        for location in locations {
            let remote = match location {
                Location::Local(folder) if folder.is_dir() => {
                    list.push(Repository::Local(folder.clone()));
                    continue;
                }
                Location::Local(folder) => {
                    return Err(format!("model repository {} is not a folder", folder.display()));
                }
                Location::Remote(remote) => remote,
            };
            let root = match cache
                .map(Path::to_path_buf)
                .or_else(|| std::env::var_os(remote.store.mount_directory_variable()).map(PathBuf::from))
            {
                Some(root) => root,
                None => match &scratch {
                    Some(dir) => dir.path().to_path_buf(),
                    None => {
                        let dir = tempfile::Builder::new().prefix("plinth-repositories-").tempdir().map_err(|e| {
                            format!("model repository {remote}: cannot make a temporary folder for its copy: {e}")
                        })?;
                        let path = dir.path().to_path_buf();
                        scratch = Some(dir);
                        path
                    }
                },
            };
            let folder = root.join(mirror_name(remote));
            tracing::info!(repository = %remote, mirror = %folder.display(), "model repository in object storage");
            list.push(Repository::Remote(Arc::new(RemoteRepository::connect(
                remote.clone(),
                folder,
                metrics.clone(),
            )?)));
        }
        Ok(Repositories { list, scratch: parking_lot::Mutex::new(scratch) })
    }

    /// Every model folder and what it holds now: a local folder as on
    /// disk, a remote one as its store lists it (a store that cannot be
    /// listed shows what its mirror last synced, with a warning).
    ///
    /// # Errors
    /// A message when a local repository cannot be read, a store can be
    /// neither listed nor read from its mirror, or two repositories hold a
    /// model of the same name.
    pub async fn scan(&self) -> Result<Vec<(ModelDir, ModelFiles)>, ScanError> {
        let mut models: BTreeMap<String, (ModelDir, ModelFiles)> = BTreeMap::new();
        for repository in &self.list {
            let found = match repository {
                Repository::Local(folder) => super::scan_folder(folder)
                    .map_err(|message| ScanError { message, transient: false })?
                    .into_iter()
                    .map(|dir| {
                        let files = ModelFiles::observe(&dir);
                        (dir, files)
                    })
                    .collect(),
                Repository::Remote(remote) => {
                    remote_models(remote).await.map_err(|message| ScanError { message, transient: true })?
                }
            };
            for (dir, files) in found {
                if let Some((previous, _)) = models.get(&dir.name) {
                    let message = format!(
                        "model '{}' is in two repositories: {} and {}",
                        dir.name,
                        self.origin(previous),
                        self.origin(&dir)
                    );
                    return Err(ScanError { message, transient: false });
                }
                models.insert(dir.name.clone(), (dir, files));
            }
        }
        Ok(models.into_values().collect())
    }

    /// The folder of model `name`, if a repository has one (for a remote
    /// repository, the folder its mirror gives the model, which
    /// [`Repositories::fetch`] fills).
    pub async fn find(&self, name: &str) -> Option<ModelDir> {
        if !is_model_name(name) {
            return None;
        }
        for repository in &self.list {
            let dir = ModelDir { name: name.to_owned(), path: repository.folder().join(name) };
            let found = match repository {
                Repository::Local(_) => dir.path.is_dir(),
                // A store that cannot be listed may hold the model: its
                // load then says why the store cannot be read.
                Repository::Remote(remote) => remote.model(name).await.map_or(true, |listing| !listing.is_empty()),
            };
            if found {
                return Some(dir);
            }
        }
        None
    }

    /// What model folder `dir` holds as far as loading goes, without
    /// fetching it: a local folder as on disk, a mirror folder as last
    /// synced.
    pub fn observe(&self, dir: &ModelDir) -> ModelFiles {
        match self.remote_of(dir) {
            Some(remote) => remote.synced(&dir.name).map(|l| ModelFiles::of_listing(&l)).unwrap_or_default(),
            None => ModelFiles::observe(dir),
        }
    }

    /// Brings `dir` to disk before it loads, and says what it holds: a
    /// remote model folder is listed and synced into its mirror folder (a
    /// store that cannot be listed leaves the mirror's copy, with a
    /// warning); a local one is only observed.
    ///
    /// # Errors
    /// A message naming the store, the object and the provider's error
    /// class when a remote model cannot be listed (and has no mirror copy)
    /// or downloaded; the mirror folder is then as it was.
    pub async fn fetch(&self, dir: &ModelDir) -> Result<ModelFiles, String> {
        let Some(remote) = self.remote_of(dir) else { return Ok(ModelFiles::observe(dir)) };
        let listing = match remote.model(&dir.name).await {
            Ok(listing) => listing,
            Err(e) => {
                let Some(synced) = remote.synced(&dir.name) else { return Err(e.message) };
                tracing::warn!(model = %dir.name, "{e}; loading the mirror's copy, synced before");
                return Ok(ModelFiles::of_listing(&synced));
            }
        };
        if listing.is_empty() {
            return Err(format!("no model folder '{}' in {}", dir.name, remote.location()));
        }
        remote.ensure(&dir.name, &listing).await.map_err(|e| e.message)?;
        Ok(ModelFiles::of_listing(&listing))
    }

    /// Where model folder `dir` comes from, for messages: its location in
    /// object storage, or its folder.
    fn origin(&self, dir: &ModelDir) -> String {
        match self.remote_of(dir) {
            Some(remote) => format!("{}/{}", remote.location(), dir.name),
            None => dir.path.display().to_string(),
        }
    }

    /// Removes the temporary folder that holds the mirrors when no cache
    /// folder was given (at shutdown: the process does not drop the
    /// lifecycle on its way out).
    pub fn remove_temporary_mirrors(&self) {
        let scratch = self.scratch.lock().take();
        if let Some(dir) = scratch {
            let path = dir.path().display().to_string();
            if let Err(e) = dir.close() {
                tracing::warn!("cannot remove the temporary mirror folder {path}: {e}");
            }
        }
    }

    /// The remote repository whose mirror holds `dir`, if any.
    fn remote_of(&self, dir: &ModelDir) -> Option<&RemoteRepository> {
        self.list.iter().find_map(|r| match r {
            Repository::Remote(remote) if dir.path.starts_with(remote.folder()) => Some(remote.as_ref()),
            _ => None,
        })
    }
}

impl Repository {
    /// The local folder the repository's model folders are in.
    pub fn folder(&self) -> &Path {
        match self {
            Repository::Local(folder) => folder,
            Repository::Remote(remote) => remote.folder(),
        }
    }
}

/// The model folders of `remote` and what each holds: from a listing, or
/// when the store cannot be listed, from what the mirror last synced.
async fn remote_models(remote: &RemoteRepository) -> Result<Vec<(ModelDir, ModelFiles)>, String> {
    let models: BTreeMap<String, Listing> = match remote.models().await {
        Ok(models) => models,
        Err(e) => {
            let synced = remote.synced_models();
            if synced.is_empty() {
                return Err(e.message);
            }
            tracing::warn!(repository = %remote.location(), "{e}; using the mirror's copies, synced before");
            synced
        }
    };
    if models.is_empty() {
        // Triton refuses a repository path that does not exist; in object
        // storage that is a prefix with nothing under it.
        return Err(format!(
            "model repository {} holds no model folder (nothing under it): check the bucket and the path",
            remote.location()
        ));
    }
    let dir = |name: &String| ModelDir { name: name.clone(), path: remote.folder().join(name) };
    Ok(models.iter().map(|(name, listing)| (dir(name), ModelFiles::of_listing(listing))).collect())
}

/// The folder name of a remote repository's mirror: its location with
/// every character that is not a letter, a digit, `.`, `-` or `_` made `_`,
/// then 8 hex digits of the location's SHA-256, so that two locations that
/// read alike (`repo/a`, `repo_a`) never share a mirror
/// (`s3://127.0.0.1:9000/models/repo` → `s3_127.0.0.1_9000_models_repo-` and 8 hex digits).
fn mirror_name(location: &RemoteLocation) -> String {
    use sha2::Digest;
    let exact = location.to_string();
    let text = exact.replace("://", "_");
    let readable: String =
        text.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') { c } else { '_' }).collect();
    let digest = sha2::Sha256::digest(exact.as_bytes());
    let tag: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("{readable}-{tag}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_remote_repository_has_a_mirror_folder_named_after_it() {
        let name = |text: &str| match text.parse::<Location>().unwrap() {
            Location::Remote(r) => mirror_name(&r),
            Location::Local(_) => unreachable!(),
        };
        assert!(name("s3://127.0.0.1:9000/models/repo").starts_with("s3_127.0.0.1_9000_models_repo-"));
        assert!(name("gs://bucket/a/b").starts_with("gs_bucket_a_b-"));
        assert_eq!(name("gs://bucket/a/b"), name("gs://bucket/a/b/"), "one location, one mirror");
        assert_ne!(name("s3://b/x"), name("gs://b/x"));
        assert_ne!(name("s3://models/repo/a"), name("s3://models/repo_a"), "alike, but not one");
    }
}

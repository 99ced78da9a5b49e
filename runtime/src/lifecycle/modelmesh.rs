//! Modelmesh mode: ModelMesh decides which models this process holds, and
//! `server::modelmesh` turns its `mmesh.ModelRuntime` calls into these. A
//! model loads from the local path ModelMesh's puller gives (a model folder
//! in the Triton layout, or one model file) under ModelMesh's model id.
//! Nothing is evicted: ModelMesh keeps its own LRU across pods, and the
//! memory budget only refuses a load that cannot fit
//! (`residency::Admission::RefuseWhenFull`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

use super::core::Core;
use super::loading::LoadOptions;
use super::records::ModelRecord;
use crate::config::CONFIG_FILE;
use crate::drain::InUse;
use crate::error::LoadError;
use crate::repository::{self, Fingerprint, ModelDir};
use crate::residency::Footprint;

/// Modelmesh mode's own state.
#[derive(Default)]
pub(super) struct ModelMesh {
    /// Where each model id's files are, and its staging folder (shared
    /// with the load tasks, which outlive a cancelled call).
    placed: Arc<Mutex<HashMap<String, Placed>>>,
    /// How many times `runtimeStatus` unloaded everything.
    purges: AtomicU64,
}

/// ModelMesh's operations on the lifecycle (`Lifecycle::modelmesh`).
pub struct Mesh<'a> {
    pub(super) core: &'a Arc<Core>,
    pub(super) state: &'a ModelMesh,
}

/// A model's files as ModelMesh placed them.
pub(super) struct Placed {
    /// The model folder loads read.
    dir: ModelDir,
    /// The path ModelMesh gave.
    source: PathBuf,
    /// For a single model file: the folder that gives it the Triton layout
    /// (`1/model.onnx`, a link to the file), removed at unload.
    staging: Option<tempfile::TempDir>,
}

impl Placed {
    /// `reason` with the staged link named as the file ModelMesh gave.
    fn explain(&self, reason: &str) -> String {
        match &self.staging {
            Some(staging) => reason.replace(
                &staging.path().join("1/model.onnx").display().to_string(),
                &self.source.display().to_string(),
            ),
            None => reason.to_owned(),
        }
    }
}

/// A predicted size is the model's files times this, plus
/// [`SIZE_OVERHEAD`]. Measured on the five example models loaded in two
/// orders, a model holds 0.8 to 2.8 times its files (an ONNX Runtime session
/// keeps optimised copies of its weights; a plugin its compiled code and
/// instances), and the first model loaded also carries about 10 MB of the
/// runtime's one-time allocations, more when its plugin is compiled cold.
const SIZE_FACTOR: u64 = 2;

/// Bytes added to every predicted size, see [`SIZE_FACTOR`].
const SIZE_OVERHEAD: u64 = 32 << 20;

/// The size ModelMesh assumes for a model before it knows better
/// (`defaultModelSizeInBytes`), and the prediction for a model whose files
/// are not here yet, in bytes: above every example model.
pub const DEFAULT_MODEL_SIZE: u64 = 64 << 20;

/// How long `unloadModel` waits for requests still running on the model
/// before it gives up waiting (the model then leaves memory with the last).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

/// Where a model's files are, as ModelMesh gave them.
pub enum Source {
    /// A model folder: `config.pbtxt` and/or numeric version folders.
    Folder(PathBuf),
    /// One ONNX model file.
    OnnxFile(PathBuf),
}

impl Source {
    /// Reads `path` (a model folder, a model file, or a folder holding one
    /// model file, as the puller writes single files) and `model_type`
    /// (ModelMesh's model format name, e.g. `onnx`; may be empty).
    ///
    /// # Errors
    /// [`LoadError::Invalid`] naming the path when it does not exist or
    /// is none of these, or for a TorchScript file alone (its inputs and
    /// outputs need a `config.pbtxt`).
    pub fn of(path: &Path, model_type: &str) -> Result<Source, LoadError> {
        if path.is_file() {
            return model_file(path, model_type);
        }
        if !path.is_dir() {
            let what = if path.exists() { "is neither a file nor a folder" } else { "does not exist" };
            return Err(LoadError::Invalid(format!("modelPath {} {what}", path.display())));
        }
        let folder = ModelDir { name: String::new(), path: path.to_owned() };
        if path.join(CONFIG_FILE).is_file() || !repository::versions(&folder).is_empty() {
            return Ok(Source::Folder(path.to_owned()));
        }
        let files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| LoadError::Invalid(format!("cannot read modelPath {}: {e}", path.display())))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file() && !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
            .collect();
        match files.as_slice() {
            [file] => model_file(file, model_type),
            _ => Err(LoadError::Invalid(format!(
                "modelPath {} is neither a model folder ({CONFIG_FILE}, numeric version folders) nor one model file",
                path.display()
            ))),
        }
    }

    /// The size of the model's files, in bytes.
    fn bytes(&self) -> u64 {
        match self {
            Source::Folder(path) => Fingerprint::of(path, true).bytes(),
            Source::OnnxFile(file) => std::fs::metadata(file).map_or(0, |m| m.len()),
        }
    }

    /// The path ModelMesh gave.
    fn path(&self) -> &Path {
        match self {
            Source::Folder(path) | Source::OnnxFile(path) => path,
        }
    }

    /// The model folder to load for model `id`.
    fn place(self, id: &str) -> Result<Placed, String> {
        match self {
            Source::Folder(path) => {
                Ok(Placed { dir: ModelDir { name: id.to_owned(), path: path.clone() }, source: path, staging: None })
            }
            Source::OnnxFile(file) => {
                let staging = tempfile::Builder::new()
                    .prefix("plinth-modelmesh-")
                    .tempdir()
                    .map_err(|e| format!("cannot make a staging folder for {}: {e}", file.display()))?;
                let version = staging.path().join("1");
                let target = std::path::absolute(&file).map_err(|e| e.to_string())?;
                std::fs::create_dir(&version)
                    .and_then(|()| std::os::unix::fs::symlink(&target, version.join("model.onnx")))
                    .map_err(|e| format!("cannot stage {}: {e}", file.display()))?;
                let dir = ModelDir { name: id.to_owned(), path: staging.path().to_owned() };
                Ok(Placed { dir, source: file, staging: Some(staging) })
            }
        }
    }
}

fn model_file(path: &Path, model_type: &str) -> Result<Source, LoadError> {
    let extension = path.extension().map(|e| e.to_string_lossy().to_lowercase()).unwrap_or_default();
    match (extension.as_str(), model_type) {
        ("onnx", _) | (_, "onnx") => Ok(Source::OnnxFile(path.to_owned())),
        ("pt" | "pth", _) | (_, "pytorch") => Err(LoadError::Invalid(format!(
            "{} is a TorchScript file, which records no input or output types: give a model folder with its {CONFIG_FILE}",
            path.display()
        ))),
        _ => Err(LoadError::Invalid(format!(
            "cannot tell the format of {}: name it .onnx or give the model type 'onnx'",
            path.display()
        ))),
    }
}

/// A conservative size in bytes for a model not loaded yet
/// (`predictModelSize`): `disk_bytes` (the puller's `disk_size_bytes`), or
/// else the size of the model's files at `path`, times 2, plus 32 MiB;
/// [`DEFAULT_MODEL_SIZE`] when neither is known (ModelMesh may ask before
/// the files are pulled). Reads no more than file sizes.
pub fn predict_size(path: &Path, model_type: &str, disk_bytes: Option<u64>) -> u64 {
    let files = disk_bytes.filter(|&b| b > 0).or_else(|| Source::of(path, model_type).ok().map(|s| s.bytes()));
    files.map_or(DEFAULT_MODEL_SIZE, |f| f.saturating_mul(SIZE_FACTOR).saturating_add(SIZE_OVERHEAD))
}

/// Whether `id` can name a model: not empty, no control characters (they
/// cannot travel in a gRPC header, and name threads and metrics).
fn check_id(id: &str) -> Result<(), LoadError> {
    if id.is_empty() {
        return Err(LoadError::Invalid("modelId is empty".into()));
    }
    if id.chars().any(char::is_control) {
        return Err(LoadError::Invalid(format!("modelId {id:?} contains control characters")));
    }
    Ok(())
}

impl Mesh<'_> {
    /// Loads `source` as model `id`, and returns its measured size in bytes.
    /// A model already READY under `id` from the same path (ModelMesh
    /// retrying) is not loaded again. The load runs as its own task: when
    /// the caller is cancelled it still finishes, and an [`Mesh::unload`]
    /// of `id` made afterwards waits for it and then undoes it.
    ///
    /// # Errors
    /// [`LoadError::Invalid`] for a bad id, or an id READY from another
    /// path; [`LoadError::NoRoom`] when the files alone, or the size the
    /// model had before, exceed the budget's free room;
    /// [`LoadError::Failed`] with the reason when the load fails or the
    /// measured model does not fit (it is unloaded again);
    /// [`LoadError::Aborted`] when `runtimeStatus` unloaded it meanwhile.
    pub async fn load(&self, id: &str, source: Source) -> Result<u64, LoadError> {
        check_id(id)?;
        let purges = self.state.purges.load(Ordering::Acquire);
        let record = self.core.record(id).lock_owned().await;
        let (core, placed, owned_id) = (self.core.clone(), self.state.placed.clone(), id.to_owned());
        let loaded = tokio::spawn(async move { load_locked(&core, &placed, &owned_id, source, record).await })
            .await
            .map_err(|e| LoadError::Failed(format!("loading panicked: {e}")))??;
        if self.state.purges.load(Ordering::Acquire) != purges {
            return Err(LoadError::Aborted(format!(
                "model '{id}' was unloaded by runtimeStatus (ModelMesh restarting) while it loaded"
            )));
        }
        Ok(loaded)
    }

    /// Unloads model `id` and forgets it. Returns once requests still
    /// running on it have finished and its memory is given back (until then
    /// the budget still counts it), or after a minute, logging a warning,
    /// when requests still run: the model then leaves memory with the last. Waits
    /// for a load of `id` in progress. An unknown id is not an error.
    pub async fn unload(&self, id: &str) {
        let core = self.core;
        let record = core.record(id);
        let mut guard = record.lock().await;
        let models = core.registry.unload(id, "unloaded");
        let loaded = !models.is_empty();
        // The registry let go of them; each request in flight holds one
        // more, and the last one to let go drops the instances (on a
        // blocking thread).
        let freed: Vec<InUse> = models.iter().map(|m| m.freed()).collect();
        drop(models);
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        let mut still_running = 0;
        for version in freed {
            still_running += usize::from(version.none_by(deadline).await.is_err());
        }
        if still_running > 0 {
            // ModelMesh is told the unload succeeded all the same: the model
            // serves no new request, and its memory leaves with the last one.
            tracing::warn!(
                model = %id,
                timeout_s = DRAIN_TIMEOUT.as_secs(),
                "unload: requests still running after the drain timeout; the model leaves memory when they finish"
            );
        } else if loaded {
            tracing::info!(model = %id, "unloaded");
        }
        core.take_out(id, "unloaded");
        core.registry.forget(id);
        *guard = ModelRecord::default();
        self.state.placed.lock().remove(id);
        drop(guard);
        core.forget_record(id, &record);
    }

    /// Unloads every model, waiting for loads in progress (ModelMesh asks
    /// for this when it starts).
    pub async fn purge(&self) {
        self.state.purges.fetch_add(1, Ordering::AcqRel);
        for id in self.core.recorded() {
            self.unload(&id).await;
        }
    }

    /// The measured size of model `id` in bytes, if it is READY.
    pub fn model_size(&self, id: &str) -> Option<u64> {
        if !self.core.registry.has_ready(id) {
            return None;
        }
        self.core.residency.known_footprint(id).map(|f| f.host)
    }
}

/// [`Mesh::load`] with the record of `id` held.
async fn load_locked(
    core: &Core,
    placements: &Mutex<HashMap<String, Placed>>,
    id: &str,
    source: Source,
    mut record: OwnedMutexGuard<ModelRecord>,
) -> Result<u64, LoadError> {
    if core.registry.has_ready(id) {
        let placed = placements.lock();
        let from = placed.get(id).map(|p| p.source.clone()).unwrap_or_default();
        let same = |a: &Path, b: &Path| a == b || a.canonicalize().ok() == b.canonicalize().ok();
        if !same(&from, source.path()) {
            return Err(LoadError::Invalid(format!(
                "model '{id}' is loaded already, from {}; unload it before loading {}",
                from.display(),
                source.path().display()
            )));
        }
        return Ok(core.residency.held(id).host);
    }
    core.residency.check_free(id, &Footprint::host(source.bytes())).map_err(LoadError::NoRoom)?;
    let placed = source.place(id).map_err(LoadError::Failed)?;
    let dir = placed.dir.clone();
    placements.lock().insert(id.to_owned(), placed);
    let options = LoadOptions { wanted: false, rename: true, chain: &[] };
    if let Err(e) = core.load_locked(&dir, None, options, &mut record).await {
        core.take_out(id, e.message());
        let placed = placements.lock().remove(id);
        return Err(e.map_message(|reason| {
            let reason = placed.map_or(reason.clone(), |p| p.explain(&reason));
            format!("failed to load '{id}': {reason}")
        }));
    }
    Ok(core.residency.held(id).host)
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_folders_onnx_files_or_folders_holding_one_file() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m");
        std::fs::create_dir_all(model.join("1")).unwrap();
        assert!(matches!(Source::of(&model, ""), Ok(Source::Folder(_))));

        let single = dir.path().join("single");
        std::fs::create_dir(&single).unwrap();
        std::fs::write(single.join("_model"), b"onnx bytes").unwrap();
        assert!(matches!(Source::of(&single, "onnx"), Ok(Source::OnnxFile(_))));
        let unknown = Source::of(&single, "sklearn").err().unwrap().to_string();
        assert!(unknown.contains("cannot tell the format"), "{unknown}");

        std::fs::write(dir.path().join("model.pt"), b"zip").unwrap();
        let torch = Source::of(&dir.path().join("model.pt"), "pytorch").err().unwrap().to_string();
        assert!(torch.contains("config.pbtxt"), "{torch}");
        let missing = Source::of(&dir.path().join("nothing"), "onnx").err().unwrap().to_string();
        assert!(missing.contains("does not exist"), "{missing}");
    }

    #[test]
    fn a_single_file_is_staged_in_the_triton_layout() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("weights.onnx");
        std::fs::write(&file, b"0123456789").unwrap();
        let placed = Source::OnnxFile(file).place("id-1").unwrap();
        assert_eq!(placed.dir.name, "id-1");
        assert_eq!(std::fs::read(placed.dir.path.join("1/model.onnx")).unwrap(), b"0123456789");
        let staging = placed.dir.path.clone();
        drop(placed);
        assert!(!staging.exists(), "unloading removes the staging folder");
    }

    #[test]
    fn predicted_sizes_come_from_the_disk_size_or_the_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("1")).unwrap();
        std::fs::write(dir.path().join("1/model.onnx"), vec![0u8; 1000]).unwrap();
        assert_eq!(predict_size(dir.path(), "", None), 2000 + SIZE_OVERHEAD);
        assert_eq!(predict_size(dir.path(), "", Some(5000)), 10_000 + SIZE_OVERHEAD);
        assert_eq!(predict_size(&dir.path().join("1/model.onnx"), "", Some(0)), 2000 + SIZE_OVERHEAD);
        // Not pulled yet, or not a model: the default, without walking it.
        assert_eq!(predict_size(Path::new("s3-bucket/models/x"), "onnx", None), DEFAULT_MODEL_SIZE);
        assert_eq!(predict_size(Path::new("/"), "", None), DEFAULT_MODEL_SIZE);
    }

    #[test]
    fn ids_are_not_empty_and_have_no_control_characters() {
        assert!(check_id("mnist__isvc-6b2eb3b5e4").is_ok());
        assert!(check_id("../ünïcode / spaces").is_ok());
        for bad in ["", "a\0b", "line\nbreak"] {
            assert!(matches!(check_id(bad), Err(LoadError::Invalid(_))), "{bad:?}");
        }
    }
}

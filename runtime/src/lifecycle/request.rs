//! What a repository `load` carries besides the model's name (Triton's
//! model repository extension, `docs/protocol/extension_model_repository.md`):
//! a `config` override and `file:<version>/<name>` files that make up an
//! override model folder ("load from memory").

use std::collections::BTreeMap;
use std::path::{Component, Path};

use crate::error::LoadError;
use crate::repository::{self, ModelDir};

/// A load's parameters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadRequest {
    /// `config`: a JSON model configuration used instead of `config.pbtxt`.
    pub config: Option<String>,
    /// `file:<version>/<name>`: the files of the model folder to load
    /// instead of the repository's, by path relative to the model folder.
    pub files: BTreeMap<String, Vec<u8>>,
}

/// The prefix of a file parameter's key.
pub const FILE_PREFIX: &str = "file:";

impl LoadRequest {
    /// A load with only a configuration override (or none).
    pub fn config(config: Option<String>) -> LoadRequest {
        LoadRequest { config, files: BTreeMap::new() }
    }

    /// Writes the files into a new folder that serves as model `name`'s
    /// folder: `None` when the request has no files.
    ///
    /// # Errors
    /// [`LoadError::Invalid`] when files come without a `config`, or a path
    /// is not `<version>/<file>` inside the folder; [`LoadError::Failed`]
    /// when the folder cannot be written.
    pub fn stage(&self, name: &str) -> Result<Option<(ModelDir, tempfile::TempDir)>, LoadError> {
        if self.files.is_empty() {
            return Ok(None);
        }
        if self.config.is_none() {
            return Err(LoadError::Invalid(
                "'file:' parameters need the 'config' parameter too: it is the configuration of the model folder they make".into(),
            ));
        }
        for path in self.files.keys() {
            check_path(path)?;
        }
        let staged = tempfile::Builder::new()
            .prefix("plinth-load-")
            .tempdir()
            .map_err(|e| LoadError::Failed(format!("cannot make a folder for the files of '{name}': {e}")))?;
        let folder = staged.path().join(name);
        for (path, bytes) in &self.files {
            let target = folder.join(path);
            let parent = target.parent().expect("a path of two components or more");
            std::fs::create_dir_all(parent)
                .and_then(|()| std::fs::write(&target, bytes))
                .map_err(|e| LoadError::Failed(format!("cannot write '{FILE_PREFIX}{path}': {e}")))?;
        }
        Ok(Some((ModelDir { name: name.to_owned(), path: folder }, staged)))
    }
}

/// `<version>/<file>...`: a version number, then plain path components.
fn check_path(path: &str) -> Result<(), LoadError> {
    let mut parts = Path::new(path).components();
    let version = parts.next().and_then(|c| match c {
        Component::Normal(v) => v.to_str().and_then(repository::parse_version),
        _ => None,
    });
    let rest: Vec<Component> = parts.collect();
    let plain = !rest.is_empty() && rest.iter().all(|c| matches!(c, Component::Normal(_)));
    if version.is_some() && plain && !path.contains('\\') {
        Ok(())
    } else {
        Err(LoadError::Invalid(format!(
            "'{FILE_PREFIX}{path}' must name a file in a version folder, as in '{FILE_PREFIX}1/model.onnx'"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_make_a_model_folder_and_bad_paths_are_refused() {
        let mut request = LoadRequest::config(Some("{}".into()));
        request.files.insert("1/model.onnx".into(), b"weights".to_vec());
        request.files.insert("1/labels/classes.txt".into(), b"cat".to_vec());
        let (dir, staged) = request.stage("m").unwrap().unwrap();
        assert_eq!(dir.name, "m");
        assert_eq!(std::fs::read(dir.path.join("1/model.onnx")).unwrap(), b"weights");
        assert_eq!(std::fs::read(dir.path.join("1/labels/classes.txt")).unwrap(), b"cat");
        drop(staged);
        assert!(!dir.path.exists());
        assert_eq!(LoadRequest::default().stage("m").unwrap().map(|(d, _)| d), None);

        for bad in ["model.onnx", "../1/model.onnx", "1/../../etc", "01/model.onnx", "/abs/model.onnx", "1/"] {
            let mut request = LoadRequest::config(Some("{}".into()));
            request.files.insert(bad.into(), vec![]);
            let error = request.stage("m").unwrap_err().to_string();
            assert!(error.contains("must name a file in a version folder"), "{bad}: {error}");
        }
        let mut no_config = LoadRequest::default();
        no_config.files.insert("1/model.onnx".into(), vec![]);
        assert!(no_config.stage("m").unwrap_err().to_string().contains("need the 'config' parameter"));
    }
}

//! A repository `load`'s files made into a model folder ("load from
//! memory", Triton's model repository extension): the request itself is
//! read by `protocol::repository`.

use std::path::{Component, Path};

use crate::error::LoadError;
pub use crate::protocol::repository::{FILE_PREFIX, LoadRequest};
use crate::repository::{self, ModelDir};

/// Writes the files of `request` into a new folder that serves as model
/// `name`'s folder: `None` when the request has no files.
///
/// # Errors
/// [`LoadError::Invalid`] when files come without a `config`, or a path is
/// not `<version>/<file>` inside the folder; [`LoadError::Failed`] when the
/// folder cannot be written.
pub fn stage(request: &LoadRequest, name: &str) -> Result<Option<(ModelDir, tempfile::TempDir)>, LoadError> {
    if request.files.is_empty() {
        return Ok(None);
    }
    if request.config.is_none() {
        return Err(LoadError::Invalid(
            "'file:' parameters need the 'config' parameter too: it is the configuration of the model folder they make"
                .into(),
        ));
    }
    for path in request.files.keys() {
        check_path(path)?;
    }
    let staged = tempfile::Builder::new()
        .prefix("plinth-load-")
        .tempdir()
        .map_err(|e| LoadError::Failed(format!("cannot make a folder for the files of '{name}': {e}")))?;
    let folder = staged.path().join(name);
    for (path, bytes) in &request.files {
        let target = folder.join(path);
        let parent = target.parent().expect("a path of two components or more");
        std::fs::create_dir_all(parent)
            .and_then(|()| std::fs::write(&target, bytes))
            .map_err(|e| LoadError::Failed(format!("cannot write '{FILE_PREFIX}{path}': {e}")))?;
    }
    Ok(Some((ModelDir { name: name.to_owned(), path: folder }, staged)))
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
        let (dir, staged) = stage(&request, "m").unwrap().unwrap();
        assert_eq!(dir.name, "m");
        assert_eq!(std::fs::read(dir.path.join("1/model.onnx")).unwrap(), b"weights");
        assert_eq!(std::fs::read(dir.path.join("1/labels/classes.txt")).unwrap(), b"cat");
        drop(staged);
        assert!(!dir.path.exists());
        assert_eq!(stage(&LoadRequest::default(), "m").unwrap().map(|(d, _)| d), None);

        for bad in ["model.onnx", "../1/model.onnx", "1/../../etc", "01/model.onnx", "/abs/model.onnx", "1/"] {
            let mut request = LoadRequest::config(Some("{}".into()));
            request.files.insert(bad.into(), vec![]);
            let error = stage(&request, "m").unwrap_err().to_string();
            assert!(error.contains("must name a file in a version folder"), "{bad}: {error}");
        }
        let mut no_config = LoadRequest::default();
        no_config.files.insert("1/model.onnx".into(), vec![]);
        assert!(stage(&no_config, "m").unwrap_err().to_string().contains("need the 'config' parameter"));
    }
}

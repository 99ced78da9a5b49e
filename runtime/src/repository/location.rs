//! Where a model repository is, as `--model-repository` names it: a local
//! folder, or a bucket path in object storage in Triton's forms
//! (`docs/user_guide/model_repository.md`, "Cloud Storage"):
//! `s3://bucket/path`, `s3://host:port/bucket/path` (a custom endpoint,
//! HTTP unless written `s3://https://host:port/...`), `gs://bucket/path` and
//! `as://account/container/path`.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// A model repository's location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// A folder on this machine.
    Local(PathBuf),
    /// A bucket path in object storage.
    Remote(RemoteLocation),
}

/// A repository in object storage: the store, and the path of the
/// repository inside it (no leading or trailing `/`; empty for the root).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteLocation {
    /// Which store, and where.
    pub store: Store,
    /// The repository's path in the bucket or container.
    pub prefix: String,
}

/// An object store holding a repository.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Store {
    /// Amazon S3, or any server with its API at `endpoint`.
    S3 {
        bucket: String,
        /// A custom endpoint (`http://host:port` or `https://host:port`),
        /// or `None` for AWS itself.
        endpoint: Option<String>,
    },
    /// Google Cloud Storage.
    Gcs { bucket: String },
    /// Azure Blob Storage.
    Azure { account: String, container: String },
}

impl Store {
    /// The provider's name in messages and metrics: `s3`, `gcs`, `azure`.
    pub fn provider(&self) -> &'static str {
        match self {
            Store::S3 { .. } => "s3",
            Store::Gcs { .. } => "gcs",
            Store::Azure { .. } => "azure",
        }
    }

    /// Triton's environment variable naming the local folder a remote
    /// repository of this provider is copied to.
    pub fn mount_directory_variable(&self) -> &'static str {
        match self {
            Store::S3 { .. } => "TRITON_AWS_MOUNT_DIRECTORY",
            Store::Gcs { .. } => "TRITON_GCS_MOUNT_DIRECTORY",
            Store::Azure { .. } => "TRITON_AZURE_MOUNT_DIRECTORY",
        }
    }
}

impl RemoteLocation {
    /// The object key of `path` (relative to the repository).
    pub fn key(&self, path: &str) -> String {
        if self.prefix.is_empty() { path.to_owned() } else { format!("{}/{path}", self.prefix) }
    }

    /// The path of `key` relative to the repository, if it is inside it.
    pub fn relative<'a>(&self, key: &'a str) -> Option<&'a str> {
        if self.prefix.is_empty() {
            return Some(key);
        }
        key.strip_prefix(self.prefix.as_str())?.strip_prefix('/')
    }
}

/// The location as the user wrote it (never with credentials: none are in
/// a location).
impl fmt::Display for RemoteLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path =
            |f: &mut fmt::Formatter<'_>| if self.prefix.is_empty() { Ok(()) } else { write!(f, "/{}", self.prefix) };
        match &self.store {
            Store::S3 { bucket, endpoint: None } => write!(f, "s3://{bucket}")?,
            Store::S3 { bucket, endpoint: Some(endpoint) } => match endpoint.strip_prefix("http://") {
                Some(host) => write!(f, "s3://{host}/{bucket}")?,
                None => write!(f, "s3://{endpoint}/{bucket}")?,
            },
            Store::Gcs { bucket } => write!(f, "gs://{bucket}")?,
            Store::Azure { account, container } => write!(f, "as://{account}/{container}")?,
        }
        path(f)
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Local(path) => write!(f, "{}", path.display()),
            Location::Remote(remote) => remote.fmt(f),
        }
    }
}

impl FromStr for Location {
    type Err = String;

    /// Reads a `--model-repository` value.
    ///
    /// # Errors
    /// A message giving the expected form, for a remote location without
    /// its bucket (or account and container), or an unknown scheme.
    fn from_str(text: &str) -> Result<Location, String> {
        let Some((scheme, rest)) = text.split_once("://") else { return Ok(Location::Local(PathBuf::from(text))) };
        let rest = rest.trim_end_matches('/');
        // user:secret@host would put a secret in every log line that names
        // the repository; the message does not repeat the text.
        if split(rest.rsplit_once("://").map_or(rest, |(_, r)| r)).0.contains('@') {
            return Err(format!(
                "model repository {scheme}://...: credentials in a location are not read; give them through the \
                 provider's environment variables or files"
            ));
        }
        let (store, prefix) = match scheme {
            "s3" => s3(rest).ok_or_else(|| expected(text, "s3://bucket/path or s3://host:port/bucket/path"))?,
            "gs" => {
                let (bucket, prefix) = split(rest);
                (Store::Gcs { bucket: named(bucket).ok_or_else(|| expected(text, "gs://bucket/path"))? }, prefix)
            }
            "as" => {
                let (account, rest) = split(rest);
                let (container, prefix) = split(rest);
                let (Some(account), Some(container)) = (named(account), named(container)) else {
                    return Err(expected(text, "as://account/container/path"));
                };
                (Store::Azure { account, container }, prefix)
            }
            other => {
                return Err(format!(
                    "model repository '{text}': unknown scheme '{other}://'; a repository is a folder, \
                     s3://..., gs://... or as://..."
                ));
            }
        };
        // Object keys under the repository are read segment by segment: an
        // empty, `.` or `..` segment names no folder.
        if !prefix.is_empty() && prefix.split('/').any(|part| matches!(part, "" | "." | "..")) {
            return Err(format!("model repository '{text}': the path has an empty, '.' or '..' segment"));
        }
        Ok(Location::Remote(RemoteLocation { store, prefix: prefix.to_owned() }))
    }
}

/// `bucket/path`, `host:port/bucket/path`, or with the scheme written,
/// `http://host[:port]/bucket/path` and `https://host[:port]/bucket/path`:
/// without a scheme, a first part with a `:` is a host (a bucket name
/// cannot hold one).
fn s3(rest: &str) -> Option<(Store, &str)> {
    let (scheme, rest) = match rest.split_once("://") {
        Some((scheme @ ("http" | "https"), rest)) => (Some(scheme), rest),
        Some(_) => return None,
        None => (None, rest),
    };
    let (first, after) = split(rest);
    match scheme {
        None if !first.contains(':') => Some((Store::S3 { bucket: named(first)?, endpoint: None }, after)),
        scheme => {
            let (bucket, prefix) = split(after);
            // A port, when written, is a TCP port.
            if let Some((_, port)) = first.rsplit_once(':')
                && port.parse::<u16>().is_err()
            {
                return None;
            }
            let endpoint = format!("{}://{}", scheme.unwrap_or("http"), named(first)?);
            Some((Store::S3 { bucket: named(bucket)?, endpoint: Some(endpoint) }, prefix))
        }
    }
}

/// The first path component and the rest.
fn split(path: &str) -> (&str, &str) {
    path.split_once('/').unwrap_or((path, ""))
}

fn named(part: &str) -> Option<String> {
    (!part.is_empty()).then(|| part.to_owned())
}

fn expected(text: &str, form: &str) -> String {
    format!("model repository '{text}' is not of the form {form}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(text: &str) -> RemoteLocation {
        match text.parse::<Location>().unwrap() {
            Location::Remote(r) => r,
            Location::Local(p) => panic!("{text} read as the folder {}", p.display()),
        }
    }

    #[test]
    fn triton_s_forms_read_as_their_store_and_path() {
        let s3 = |bucket: &str, endpoint: Option<&str>| Store::S3 {
            bucket: bucket.into(),
            endpoint: endpoint.map(Into::into),
        };
        let cases = [
            ("s3://models/prod/repo", s3("models", None), "prod/repo"),
            ("s3://models", s3("models", None), ""),
            ("s3://models/", s3("models", None), ""),
            ("s3://127.0.0.1:9000/models/repo", s3("models", Some("http://127.0.0.1:9000")), "repo"),
            ("s3://minio.local:9000/models", s3("models", Some("http://minio.local:9000")), ""),
            ("s3://https://minio.local:9000/models/a/b", s3("models", Some("https://minio.local:9000")), "a/b"),
            ("s3://http://minio.local:9000/models/a", s3("models", Some("http://minio.local:9000")), "a"),
            ("gs://bucket/path/to/repo", Store::Gcs { bucket: "bucket".into() }, "path/to/repo"),
            (
                "as://account/container/path",
                Store::Azure { account: "account".into(), container: "container".into() },
                "path",
            ),
        ];
        for (text, store, prefix) in cases {
            let location = remote(text);
            assert_eq!((&location.store, location.prefix.as_str()), (&store, prefix), "{text}");
        }
        assert_eq!("/srv/models".parse::<Location>().unwrap(), Location::Local("/srv/models".into()));
        assert_eq!("models".parse::<Location>().unwrap(), Location::Local("models".into()));
    }

    #[test]
    fn locations_print_as_written_and_name_their_keys() {
        for text in
            ["s3://models/prod", "s3://127.0.0.1:9000/models/repo", "s3://https://h:1/b", "gs://b/p", "as://a/c/p"]
        {
            assert_eq!(remote(text).to_string(), text);
        }
        let r = remote("s3://models/prod");
        assert_eq!(r.key("ocr/1/model.onnx"), "prod/ocr/1/model.onnx");
        assert_eq!(r.relative("prod/ocr/config.pbtxt"), Some("ocr/config.pbtxt"));
        assert_eq!(r.relative("production/x"), None);
        assert_eq!(remote("s3://models").relative("ocr/config.pbtxt"), Some("ocr/config.pbtxt"));
    }

    #[test]
    fn incomplete_or_unknown_locations_say_the_form() {
        let cases = [
            ("s3://", "is not of the form s3://bucket/path"),
            ("s3://h:1", "is not of the form s3://bucket/path"),
            ("s3://https://minio.local:9000", "is not of the form s3://bucket/path"),
            ("gs://", "is not of the form gs://bucket/path"),
            ("as://account", "is not of the form as://account/container/path"),
            ("hdfs://x/y", "unknown scheme 'hdfs://'"),
            ("s3://127.0.0.1:99999/models/repo", "is not of the form s3://bucket/path"),
            ("s3://models/a//b", "an empty, '.' or '..' segment"),
            ("gs://models/a/../b", "an empty, '.' or '..' segment"),
        ];
        for (text, message) in cases {
            let e = text.parse::<Location>().unwrap_err();
            assert!(e.contains(message), "{text}: {e}");
        }
    }

    #[test]
    fn credentials_in_a_location_are_refused_without_repeating_them() {
        for text in ["s3://AKIA:TopSecret@127.0.0.1:9000/models/repo", "s3://https://k:TopSecret@minio:9000/m"] {
            let e = text.parse::<Location>().unwrap_err();
            assert!(e.contains("credentials in a location are not read") && !e.contains("TopSecret"), "{e}");
        }
    }
}

//! A model repository in object storage (S3, GCS, Azure Blob, through the
//! `object_store` crate), mirrored into a local folder: the lifecycle loads
//! a model from its mirror folder exactly as from a local repository, and
//! never learns where the bytes came from.
//!
//! A model folder is brought to the mirror whole before it loads
//! ([`RemoteRepository::sync`]): every object of the folder is downloaded
//! into a staging folder, streamed to disk, its size checked against the
//! listing and its ETag against the object served, and only then does the
//! staging folder replace the mirror's. A failed download leaves the mirror
//! (and what serves from it) as it was. Objects whose size and ETag match
//! the last sync are linked from the mirror instead of downloaded, so a
//! restart over a kept mirror downloads only what changed.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use futures_util::stream::{StreamExt, TryStreamExt};
use object_store::{GetOptions, ObjectMeta, ObjectStore, RetryConfig};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use super::listing::{self, Client};
use super::location::RemoteLocation;
use super::{Fingerprint, ModelFiles, Stamp, parse_version};
use crate::metrics::RepositoryMetrics;

/// Objects of one model downloaded at once.
const PARALLEL_DOWNLOADS: usize = 4;

/// One object of a model folder, as the listing gives it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Object {
    /// Its size in bytes.
    pub size: u64,
    /// The store's entity tag, when it gives one.
    pub e_tag: Option<String>,
    /// When it was last written, in milliseconds since the Unix epoch.
    pub modified_ms: i64,
}

/// The objects of one model folder, by path inside the folder
/// (`config.pbtxt`, `1/model.onnx`).
pub type Listing = BTreeMap<String, Object>;

impl ModelFiles {
    /// The model folder a listing describes, comparable with the previous
    /// listing's (a change to any object's size, ETag or time changes it).
    pub fn of_listing(listing: &Listing) -> ModelFiles {
        let stamp = |path: &str, o: &Object| Stamp {
            path: PathBuf::from(path),
            size: o.size,
            modified: u64::try_from(o.modified_ms).ok().map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
            tag: o.e_tag.clone(),
        };
        let mut top = Vec::new();
        let mut versions: BTreeMap<u64, Vec<Stamp>> = BTreeMap::new();
        for (path, object) in listing {
            match path.split_once('/') {
                None => top.push(stamp(path, object)),
                Some((folder, _)) => {
                    if let Some(version) = parse_version(folder) {
                        versions.entry(version).or_default().push(stamp(path, object));
                    }
                }
            }
        }
        ModelFiles {
            top: Fingerprint::from_stamps(top),
            versions: versions.into_iter().map(|(v, stamps)| (v, Fingerprint::from_stamps(stamps))).collect(),
        }
    }
}

/// Why a listing or a download failed: the class the metrics count it
/// under, and the message (naming the store, the key and the provider's
/// error class; never a credential).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RemoteError {
    /// `not_found`, `denied` (permission or credentials), `changed` (the
    /// object changed during its download), `truncated`, `local` (the
    /// mirror folder), or `provider` (anything else the store answered,
    /// after its retries: an endpoint down, throttling).
    pub cause: &'static str,
    /// What happened.
    pub message: String,
}

/// A model repository in object storage and its local mirror.
pub struct RemoteRepository {
    location: RemoteLocation,
    store: Arc<dyn Client>,
    /// Keys skipped by a listing and said so (once each).
    skipped: Mutex<std::collections::BTreeSet<String>>,
    /// The mirror: one folder per model synced, beside `.plinth/`
    /// (manifests, staging).
    folder: PathBuf,
    metrics: Arc<RepositoryMetrics>,
    /// Numbers staging folders apart.
    next: AtomicU64,
}

impl RemoteRepository {
    /// Connects to the store of `location` with credentials from its
    /// provider's standard chain (read when a request needs them) and
    /// mirrors it into `folder`.
    ///
    /// # Errors
    /// A message naming the location when the store cannot be set up (an
    /// invalid endpoint, a credential file that does not parse), or the
    /// mirror folder cannot be made.
    pub fn connect(
        location: RemoteLocation,
        folder: PathBuf,
        metrics: Arc<RepositoryMetrics>,
    ) -> Result<RemoteRepository, String> {
        let store = super::stores::connect(&location.store, retries())
            .map_err(|e| format!("model repository {location}: {e}"))?;
        for dir in [folder.join(".plinth/manifests"), folder.join(".plinth/staging")] {
            std::fs::create_dir_all(&dir).map_err(|e| {
                format!("model repository {location}: cannot make the mirror folder {}: {e}", dir.display())
            })?;
        }
        remove_abandoned_staging(&folder.join(".plinth/staging"));
        let skipped = Mutex::default();
        Ok(RemoteRepository { location, store, skipped, folder, metrics, next: AtomicU64::new(0) })
    }

    /// The location, as written.
    pub fn location(&self) -> &RemoteLocation {
        &self.location
    }

    /// The mirror folder, which holds a folder per model synced.
    pub fn folder(&self) -> &Path {
        &self.folder
    }

    /// Every model folder of the repository and its objects, from one
    /// listing.
    ///
    /// # Errors
    /// When the store cannot be listed.
    pub async fn models(&self) -> Result<BTreeMap<String, Listing>, RemoteError> {
        let mut models: BTreeMap<String, Listing> = BTreeMap::new();
        for (path, object) in self.list("").await? {
            if let Some((model, inside)) = path.split_once('/')
                && super::is_model_name(model)
                && !model.starts_with('.')
            {
                models.entry(model.to_owned()).or_default().insert(inside.to_owned(), object);
            }
        }
        Ok(models)
    }

    /// The objects of model folder `name`; empty when there is none.
    ///
    /// # Errors
    /// When the store cannot be listed.
    pub async fn model(&self, name: &str) -> Result<Listing, RemoteError> {
        self.list(&format!("{name}/")).await
    }

    /// The objects under `under` (a folder path ending in `/`, or empty for
    /// the whole repository), by path below it. Folder markers (keys ending
    /// in `/`) are left out, and so are keys with an empty, `.` or `..`
    /// segment, with a warning naming them (see `listing`).
    async fn list(&self, under: &str) -> Result<Listing, RemoteError> {
        let prefix = self.object_path(&self.location.key(under.trim_end_matches('/')))?;
        let prefix = (!prefix.as_ref().is_empty()).then_some(prefix);
        let metas: Vec<ObjectMeta> = listing::list(&*self.store, prefix.as_ref(), &self.skipped)
            .await
            .map_err(|e| self.failure(&format!("list {}", self.url(under)), e))?;
        let mut listing = Listing::new();
        for meta in metas {
            let key = meta.location.as_ref();
            let Some(path) = self.location.relative(key).and_then(|p| p.strip_prefix(under)) else { continue };
            if path.is_empty() || path.ends_with('/') {
                continue;
            }
            let object = Object {
                size: meta.size,
                e_tag: meta.e_tag.clone(),
                modified_ms: meta.last_modified.timestamp_millis(),
            };
            listing.insert(path.to_owned(), object);
        }
        drop_folder_markers(&mut listing);
        Ok(listing)
    }

    /// The store's path of `key`, taken as it is: `Path::from` would
    /// percent-encode a `%`, `#` or non-ASCII character that the HTTP
    /// client then encodes again.
    fn object_path(&self, key: &str) -> Result<object_store::path::Path, RemoteError> {
        object_store::path::Path::parse(key).map_err(|e| RemoteError {
            cause: "provider",
            message: format!("{}: the key '{key}' cannot be read: {e}", self.location),
        })
    }

    /// What the mirror holds of model `name`: the listing it was last
    /// synced to, if it ever was (also by an earlier run of the server).
    pub fn synced(&self, name: &str) -> Option<Listing> {
        let text = std::fs::read(self.manifest(name)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Every model the mirror holds, as last synced.
    pub fn synced_models(&self) -> BTreeMap<String, Listing> {
        let Ok(entries) = std::fs::read_dir(self.folder.join(".plinth/manifests")) else { return BTreeMap::new() };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".json").map(str::to_owned))
            .filter_map(|name| Some((name.clone(), self.synced(&name)?)))
            .collect()
    }

    /// Makes the mirror's folder of model `name` hold what `listing`
    /// describes: nothing to do (each object counted a cache hit) when the
    /// last sync was of the same listing and its files are all there, else
    /// [`RemoteRepository::sync`].
    ///
    /// # Errors
    /// As [`RemoteRepository::sync`].
    pub async fn ensure(&self, name: &str, listing: &Listing) -> Result<PathBuf, RemoteError> {
        let folder = self.folder.join(name);
        let present = |(path, object): (&String, &Object)| {
            std::fs::metadata(folder.join(path)).is_ok_and(|m| m.is_file() && m.len() == object.size)
        };
        if self.synced(name).as_ref() == Some(listing) && listing.iter().all(present) {
            self.metrics.cache_hits.with_label_values(&[name]).inc_by(listing.len() as u64);
            return Ok(folder);
        }
        tracing::info!(model = %name, from = %self.location, objects = listing.len(), "fetching the model folder");
        self.sync(name, listing).await
    }

    /// Brings model folder `name` to the mirror as `listing` describes it:
    /// the objects that differ from the last sync are downloaded into a
    /// staging folder, the others linked from the mirror, and the staging
    /// folder then replaces the mirror's folder of the model. Returns the
    /// mirror folder.
    ///
    /// # Errors
    /// When an object cannot be downloaded (after the store's retries),
    /// changed during its download, came short of its listed size, has a
    /// path that leaves the folder, or the mirror cannot be written. The
    /// mirror's folder of the model is then as it was.
    pub async fn sync(&self, name: &str, listing: &Listing) -> Result<PathBuf, RemoteError> {
        let started = Instant::now();
        let staging = self.folder.join(".plinth/staging").join(format!(
            "{name}.{}.{}",
            std::process::id(),
            self.next.fetch_add(1, Ordering::Relaxed)
        ));
        let result = self.fill(name, listing, &staging).await;
        let target = self.folder.join(name);
        let result = match result {
            Ok(()) => self.replace(name, listing, &staging, &target).await,
            Err(e) => Err(e),
        };
        if result.is_err() {
            let _ = tokio::fs::remove_dir_all(&staging).await;
        }
        self.metrics.download_seconds.with_label_values(&[name]).inc_by(started.elapsed().as_secs_f64());
        if let Err(e) = &result {
            self.metrics.failures.with_label_values(&[name, e.cause]).inc();
        }
        result.map(|()| target)
    }

    /// Fills `staging` with the objects of `listing`.
    async fn fill(&self, name: &str, listing: &Listing, staging: &Path) -> Result<(), RemoteError> {
        let previous = self.synced(name).unwrap_or_default();
        let current = self.folder.join(name);
        // Owned jobs: the stream's futures borrow only what outlives it.
        let jobs: Vec<(String, Object, bool)> = listing
            .iter()
            .map(|(path, object)| {
                let kept = previous.get(path) == Some(object) && object.e_tag.is_some();
                (path.clone(), object.clone(), kept)
            })
            .collect();
        let places =
            jobs.into_iter().map(|(path, object, kept)| self.place(name, &current, staging, path, object, kept));
        futures_util::stream::iter(places).buffer_unordered(PARALLEL_DOWNLOADS).try_collect::<Vec<()>>().await?;
        Ok(())
    }

    /// Puts the object at `path` of model `name` into `staging`: linked
    /// from the mirror's folder `current` when `kept` (unchanged since the
    /// last sync) and still there, else downloaded.
    async fn place(
        &self,
        name: &str,
        current: &Path,
        staging: &Path,
        path: String,
        object: Object,
        kept: bool,
    ) -> Result<(), RemoteError> {
        let to =
            inside(staging, &path, &staging.join(&path)).map_err(|message| RemoteError { cause: "local", message })?;
        if kept && link(&current.join(&path), &to, object.size).await {
            self.metrics.cache_hits.with_label_values(&[name]).inc();
            return Ok(());
        }
        self.download(name, &path, &object, &to).await
    }

    /// Streams the object at `path` of model `name` to `to`, checking it
    /// is the object listed (its ETag) and that all of it arrived.
    async fn download(&self, name: &str, path: &str, object: &Object, to: &Path) -> Result<(), RemoteError> {
        let relative = format!("{name}/{path}");
        let url = self.url(&relative);
        let local = |e: std::io::Error| RemoteError {
            cause: "local",
            message: format!("cannot write {} into the mirror: {e}", to.display()),
        };
        if let Some(parent) = to.parent() {
            tokio::fs::create_dir_all(parent).await.map_err(local)?;
        }
        if object.size == 0 {
            // Nothing to download (and a folder marker's key, which the
            // listing gives without its `/`, has no object to get).
            tokio::fs::File::create(to).await.map_err(local)?;
            self.metrics.objects.with_label_values(&[name]).inc();
            return Ok(());
        }
        let options = GetOptions { if_match: object.e_tag.clone(), ..GetOptions::default() };
        let key = self.object_path(&self.location.key(&relative))?;
        let got = self.store.get_opts(&key, options).await.map_err(|e| self.failure(&format!("download {url}"), e))?;
        let mut stream = got.into_stream();
        let mut file = tokio::fs::File::create(to).await.map_err(local)?;
        let mut written = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.failure(&format!("download {url}"), e))?;
            file.write_all(&chunk).await.map_err(local)?;
            written += chunk.len() as u64;
        }
        file.flush().await.map_err(local)?;
        if written != object.size {
            return Err(RemoteError {
                cause: "truncated",
                message: format!("download {url}: {written} bytes arrived of the {} listed", object.size),
            });
        }
        self.metrics.objects.with_label_values(&[name]).inc();
        self.metrics.bytes.with_label_values(&[name]).inc_by(written);
        Ok(())
    }

    /// Puts `staging` in place of the mirror's folder `target` of model
    /// `name`, and records `listing` as what it holds.
    async fn replace(&self, name: &str, listing: &Listing, staging: &Path, target: &Path) -> Result<(), RemoteError> {
        let local = |e: std::io::Error| RemoteError {
            cause: "local",
            message: format!("cannot replace the mirror folder {}: {e}", target.display()),
        };
        let manifest = serde_json::to_vec(listing).expect("a listing serialises");
        let old = staging.with_extension("old");
        if tokio::fs::try_exists(target).await.map_err(local)? {
            tokio::fs::rename(target, &old).await.map_err(local)?;
        }
        tokio::fs::rename(staging, target).await.map_err(local)?;
        let written = self.manifest(name).with_extension("json.new");
        tokio::fs::write(&written, manifest).await.map_err(local)?;
        tokio::fs::rename(&written, self.manifest(name)).await.map_err(local)?;
        let _ = tokio::fs::remove_dir_all(&old).await;
        Ok(())
    }

    fn manifest(&self, name: &str) -> PathBuf {
        self.folder.join(".plinth/manifests").join(format!("{name}.json"))
    }

    /// The URL of `path` in the repository, for messages.
    fn url(&self, path: &str) -> String {
        format!("{}/{path}", self.location)
    }

    /// A store error while doing `what`, classed.
    fn failure(&self, what: &str, e: object_store::Error) -> RemoteError {
        use object_store::Error as E;
        let text = source_text(&e);
        let (cause, class) = match (&e, status_in(&text)) {
            (E::NotFound { .. }, _) | (_, Some(404)) => ("not_found", "not found"),
            (E::Unauthenticated { .. }, _) | (_, Some(401)) => {
                ("denied", "unauthenticated: missing, wrong or expired credentials")
            }
            (E::PermissionDenied { .. }, _) | (_, Some(403)) => {
                ("denied", "permission denied: the credentials are refused or lack access")
            }
            (_, Some(400)) if text.contains("ExpiredToken") => ("denied", "the credentials have expired"),
            (E::Precondition { .. }, _) | (_, Some(412)) => ("changed", "the object changed since it was listed"),
            (_, Some(429 | 503)) => ("provider", "throttled, after retries"),
            _ => ("provider", "store error"),
        };
        let provider = self.location.store.provider();
        RemoteError { cause, message: format!("cannot {what} ({provider}: {class}): {text}") }
    }
}

/// Removes the staging folders (`MODEL.PID.N`) of processes that are gone:
/// a server killed in the middle of a download leaves its partial copy.
/// Another live server's staging folder in a shared cache stays.
fn remove_abandoned_staging(staging: &Path) {
    let Ok(entries) = std::fs::read_dir(staging) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name.rsplit('.').nth(1).and_then(|pid| pid.parse::<u32>().ok());
        let alive = pid.is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        if pid.is_some() && !alive {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Drops the empty objects that only mark a folder (the AWS console's
/// "Create folder", `aws s3api put-object --key dir/`): the listing gives
/// `dir/` as `dir`, which would clash with the files under it.
fn drop_folder_markers(listing: &mut Listing) {
    let folders: std::collections::BTreeSet<String> =
        listing.keys().flat_map(|path| path.match_indices('/').map(|(at, _)| path[..at].to_owned())).collect();
    listing.retain(|path, object| !(object.size == 0 && folders.contains(path)));
}

/// The HTTP status a store's answer had, as object_store writes it into
/// its message ("status code: 403 Forbidden"): its own typed status is not
/// public for every request (an S3 listing's 403 comes as a generic error).
fn status_in(text: &str) -> Option<u16> {
    let (_, after) = text.split_once("status code: ")?;
    after.get(..3)?.parse().ok()
}

/// The store's own words for `e`, without the location object_store
/// repeats.
fn source_text(e: &object_store::Error) -> String {
    use std::error::Error as _;
    let text = e.source().map_or_else(|| e.to_string(), ToString::to_string);
    // A store's XML error body spans lines: one line in the log.
    redacted(&text.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// The elements of S3's SignatureDoesNotMatch answer that echo the signed
/// request, session token header included.
const ECHOED_REQUEST: [&str; 4] = ["CanonicalRequest", "CanonicalRequestBytes", "StringToSign", "StringToSignBytes"];

/// The variables whose values are secrets, should a store echo one.
const SECRET_VARIABLES: [&str; 7] = [
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_CLIENT_SECRET",
];

/// `text` without what a store echoed of the signed request, and with any
/// credential the environment holds replaced by `REDACTED`.
fn redacted(text: &str) -> String {
    let mut text = text.to_owned();
    for element in ECHOED_REQUEST {
        let (open, close) = (format!("<{element}>"), format!("</{element}>"));
        let mut out = String::with_capacity(text.len());
        let mut rest = text.as_str();
        while let Some(start) = rest.find(&open) {
            out.push_str(&rest[..start + open.len()]);
            out.push_str("REDACTED");
            rest = &rest[start + open.len()..];
            rest = rest.find(&close).map_or("", |end| &rest[end..]);
        }
        out.push_str(rest);
        text = out;
    }
    for variable in SECRET_VARIABLES {
        if let Ok(secret) = std::env::var(variable)
            && secret.len() >= 8
        {
            text = text.replace(&secret, "REDACTED");
        }
    }
    text
}

/// The retries every store makes on a transient failure (a 5xx such as
/// S3's 503 SlowDown, a timeout, a connection refused): exponential
/// backoff from 100 ms, for at most 30 s per request.
fn retries() -> RetryConfig {
    RetryConfig { max_retries: 6, retry_timeout: Duration::from_secs(30), ..RetryConfig::default() }
}

/// `to` (the object `path` placed in `folder`) when `path` names a file
/// inside the folder.
fn inside(folder: &Path, path: &str, to: &Path) -> Result<PathBuf, String> {
    let plain = Path::new(path).components().all(|c| matches!(c, Component::Normal(_)));
    if plain && !path.contains('\\') && to.starts_with(folder) {
        Ok(to.to_path_buf())
    } else {
        Err(format!("object '{path}' does not name a file inside its model folder; it is not mirrored"))
    }
}

/// Links `from` (the mirror's copy of an unchanged object) at `to`, or
/// copies it where a link cannot be made; false when `from` is missing or
/// not `size` bytes (then the object is downloaded again).
async fn link(from: &Path, to: &Path, size: u64) -> bool {
    if !tokio::fs::metadata(from).await.is_ok_and(|m| m.is_file() && m.len() == size) {
        return false;
    }
    if let Some(parent) = to.parent()
        && tokio::fs::create_dir_all(parent).await.is_err()
    {
        return false;
    }
    tokio::fs::hard_link(from, to).await.is_ok() || tokio::fs::copy(from, to).await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(size: u64, tag: &str) -> Object {
        Object { size, e_tag: Some(tag.into()), modified_ms: 1_700_000_000_000 }
    }

    #[test]
    fn an_echoed_signed_request_is_redacted() {
        let answer = "<Error><Code>SignatureDoesNotMatch</Code><CanonicalRequest>GET / x-amz-security-token:FQoG\
                      </CanonicalRequest><StringToSign>AWS4 FQoG</StringToSign><RequestId>7</RequestId></Error>";
        let text = redacted(answer);
        assert_eq!(
            text,
            "<Error><Code>SignatureDoesNotMatch</Code><CanonicalRequest>REDACTED</CanonicalRequest>\
             <StringToSign>REDACTED</StringToSign><RequestId>7</RequestId></Error>"
        );
        assert_eq!(redacted("<StringToSign>cut short"), "<StringToSign>REDACTED");
    }

    #[test]
    fn folder_markers_leave_the_listing_and_empty_files_stay() {
        let mut listing: Listing = [
            ("1".to_owned(), object(0, "marker")),
            ("1/model.onnx".to_owned(), object(100, "a")),
            ("2".to_owned(), object(0, "lone marker")),
            ("empty.txt".to_owned(), object(0, "empty")),
        ]
        .into();
        drop_folder_markers(&mut listing);
        assert_eq!(listing.keys().collect::<Vec<_>>(), ["1/model.onnx", "2", "empty.txt"]);
    }

    #[test]
    fn a_listing_reads_as_the_model_files_it_holds() {
        let listing: Listing = [
            ("config.pbtxt".to_owned(), object(10, "a")),
            ("labels.txt".to_owned(), object(3, "b")),
            ("1/model.onnx".to_owned(), object(100, "c")),
            ("2/model.onnx".to_owned(), object(100, "d")),
            ("notes/readme".to_owned(), object(1, "e")),
        ]
        .into_iter()
        .collect();
        let files = ModelFiles::of_listing(&listing);
        assert_eq!(files.versions.keys().copied().collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(files.top.bytes(), 13);
        let mut changed = listing.clone();
        changed.insert("2/model.onnx".into(), object(100, "d2"));
        let after = ModelFiles::of_listing(&changed);
        assert_eq!(after.versions[&1], files.versions[&1]);
        assert_ne!(after.versions[&2], files.versions[&2], "a new ETag is a change");
    }

    #[test]
    fn a_store_s_status_is_read_from_its_message() {
        let text = "Error performing GET http://h/models?list-type=2 in 21ms - Server returned non-2xx status code: \
                    403 Forbidden: <Error><Code>InvalidAccessKeyId</Code></Error>";
        assert_eq!(status_in(text), Some(403));
        assert_eq!(status_in("connection refused"), None);
    }

    #[test]
    fn objects_are_placed_only_inside_their_folder() {
        let folder = Path::new("/m/staging/x");
        assert!(inside(folder, "1/model.onnx", &folder.join("1/model.onnx")).is_ok());
        for bad in ["../y", "1/../../y", "/abs", "a\\b"] {
            assert!(inside(folder, bad, &folder.join(bad)).is_err(), "{bad}");
        }
    }
}

//! Loading, reloading and unloading models as the model control mode says
//! (Triton's `none`, `poll`, `explicit`), without dropping a request:
//!
//! - a new or changed version loads and warms up beside the one serving;
//!   traffic moves to it only once it is READY, and the old one finishes its
//!   accepted requests before it is dropped;
//! - a version that fails to load leaves whatever was serving untouched and
//!   shows as UNAVAILABLE with the reason, every time it is tried;
//! - an unchanged version is never reloaded;
//! - in poll mode a folder is acted on only once its files stayed the same
//!   for a whole poll interval, so half-copied files are not loaded.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::config::{self, ModelConfig};
use crate::error::Error;
use crate::model::{Model, Runtimes};
use crate::registry::Registry;
use crate::repository::{self, Fingerprint, ModelDir, ModelFiles};

/// How the set of loaded models changes after start (Triton's
/// `--model-control-mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlMode {
    /// Load every model at start; never change.
    None,
    /// Load every model at start, then follow the repositories' changes.
    Poll,
    /// Load only `--load-model` models at start; then the load and unload
    /// API decides.
    Explicit,
}

impl std::fmt::Display for ControlMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ControlMode::None => "none",
            ControlMode::Poll => "poll",
            ControlMode::Explicit => "explicit",
        })
    }
}

/// Where a READY version came from: the model folder's own files, the
/// version folder's files and the configuration override, if any. The same
/// key means there is nothing to reload.
type LoadKey = (Fingerprint, Fingerprint, Option<String>);

/// What the lifecycle last did with one model. Its mutex also serialises
/// the loads and unloads of that model.
#[derive(Default)]
struct ModelRecord {
    /// The files (and override) the last load attempt saw; poll mode tries
    /// again only when they change.
    attempted: Option<(ModelFiles, Option<String>)>,
    /// Each READY version's origin.
    loaded: BTreeMap<u64, LoadKey>,
}

/// Owns the loading of models: the runtimes, the registry it updates, and
/// what was loaded from where.
pub struct Lifecycle {
    runtimes: Arc<Runtimes>,
    registry: Arc<Registry>,
    repositories: Vec<PathBuf>,
    mode: ControlMode,
    records: Mutex<HashMap<String, Arc<tokio::sync::Mutex<ModelRecord>>>>,
    /// Poll mode: each model folder as the previous poll saw it.
    observed: Mutex<HashMap<String, ModelFiles>>,
}

impl Lifecycle {
    /// A lifecycle over `repositories` that records states in `registry`.
    pub fn new(
        runtimes: Runtimes,
        registry: Arc<Registry>,
        repositories: Vec<PathBuf>,
        mode: ControlMode,
    ) -> Lifecycle {
        let runtimes = Arc::new(runtimes);
        Lifecycle { runtimes, registry, repositories, mode, records: Mutex::default(), observed: Mutex::default() }
    }

    /// The control mode.
    pub fn mode(&self) -> ControlMode {
        self.mode
    }

    /// The start-up loads: every model in `none` and `poll` mode; in
    /// `explicit` mode the models named in `load_models` (`*` for all),
    /// the others listed as not loaded. Failures are logged and shown in the
    /// index; they never stop the other models.
    ///
    /// # Errors
    /// A message when a repository cannot be read.
    pub async fn start(&self, load_models: &[String]) -> Result<(), String> {
        let dirs = repository::scan(&self.repositories)?;
        let all = self.mode != ControlMode::Explicit || load_models.iter().any(|m| m == "*");
        let wanted: Vec<String> =
            if all { dirs.iter().map(|d| d.name.clone()).collect() } else { load_models.to_vec() };
        for dir in &dirs {
            if !wanted.contains(&dir.name) {
                self.registry.add_unloaded(&dir.name);
            }
        }
        for name in &wanted {
            // Errors are in the log and the index already.
            let _ = self.load(name, None).await;
        }
        if self.mode == ControlMode::Poll {
            let mut observed = self.observed.lock().expect("observed lock");
            for dir in &dirs {
                observed.insert(dir.name.clone(), ModelFiles::observe(dir));
            }
        }
        Ok(())
    }

    /// Loads `name` (the versions its policy selects), or reloads what
    /// changed. `config_json` overrides `config.pbtxt` with a JSON model
    /// configuration (the load API's `config` parameter).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] with every failure's reason: no such model
    /// folder, a configuration that does not parse or match the model, a
    /// version that does not load. Versions serving before keep serving.
    pub async fn load(&self, name: &str, config_json: Option<String>) -> Result<(), Error> {
        // A name with no folder leaves no trace: a typo in a load request
        // must not make the server unready.
        let Some(dir) = self.find(name) else {
            let reason = format!("no model folder '{name}' in the model repositories");
            tracing::error!(model = %name, "cannot load: {reason}");
            return Err(Error::InvalidArgument(format!("failed to load '{name}': {reason}")));
        };
        let record = self.record(name);
        let mut record = record.lock().await;
        self.registry.want(name);
        let files = ModelFiles::observe(&dir);
        let result = self.load_versions(&dir, &files, config_json.as_deref(), &mut record).await;
        record.attempted = Some((files, config_json));
        result.map_err(|reason| Error::InvalidArgument(format!("failed to load '{name}': {reason}")))
    }

    async fn load_versions(
        &self,
        dir: &ModelDir,
        files: &ModelFiles,
        config_json: Option<&str>,
        record: &mut ModelRecord,
    ) -> Result<(), String> {
        let name = &dir.name;
        let config = match model_config(dir, config_json) {
            Ok(c) => c,
            Err(reason) => {
                self.registry.fail_model(name, &reason);
                tracing::error!(model = %name, "cannot load: {reason}");
                return Err(reason);
            }
        };
        for folder in repository::ignored_folders(dir) {
            tracing::info!(model = %name, %folder, "ignoring a folder that is not a version number");
        }
        let available: Vec<u64> = files.versions.keys().copied().collect();
        let targets = repository::select_versions(config.version_policy.as_ref(), &available);
        if targets.is_empty() {
            let reason =
                format!("no version folder for its version_policy among {available:?} (numeric folders such as 1/)");
            self.registry.fail_model(name, &reason);
            tracing::error!(model = %name, "cannot load: {reason}");
            return Err(reason);
        }
        let mut failures = Vec::new();
        for &version in &targets {
            let key = (files.top.clone(), files.versions[&version].clone(), config_json.map(str::to_owned));
            if record.loaded.get(&version) == Some(&key) && self.registry.is_ready(name, version) {
                tracing::debug!(model = %name, version, "unchanged: not reloaded");
                continue;
            }
            self.registry.set_loading(name, version);
            match self.load_version(dir, version, &config).await {
                Ok(model) => {
                    self.registry.set_ready(name, version, model);
                    record.loaded.insert(version, key);
                }
                Err(reason) => {
                    tracing::error!(model = %name, version, "load failed: {reason}");
                    self.registry.set_failed(name, version, &reason);
                    failures.push(format!("version {version}: {reason}"));
                }
            }
        }
        self.registry.retire_versions(name, &targets);
        record.loaded.retain(|v, _| self.registry.is_ready(name, *v));
        if failures.is_empty() { Ok(()) } else { Err(failures.join("; ")) }
    }

    /// Loads and warms up one version off the async executor, logging each
    /// stage with the milliseconds since the start.
    async fn load_version(&self, dir: &ModelDir, version: u64, config: &ModelConfig) -> Result<Arc<Model>, String> {
        let (dir, config, runtimes) = (dir.clone(), config.clone(), self.runtimes.clone());
        let loading = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let ms = || started.elapsed().as_millis() as u64;
            tracing::info!(model = %dir.name, version, "load: start");
            let model = Model::load(&dir, version, &config, &runtimes)?;
            tracing::info!(model = %dir.name, version, ms = ms(), "load: session created");
            let runs = model.warm_up(&dir.path)?;
            tracing::info!(model = %dir.name, version, ms = ms(), runs, "load: warm-up done");
            tracing::info!(model = %dir.name, version, ms = ms(), "load: ready");
            Ok(Arc::new(model))
        });
        loading.await.map_err(|e| format!("loading panicked: {e}"))?
    }

    /// Unloads every version of `name`. Requests already accepted finish;
    /// later ones get 503.
    ///
    /// # Errors
    /// [`Error::NotFound`] when no such model is known.
    pub async fn unload(&self, name: &str) -> Result<(), Error> {
        let record = self.record(name);
        let mut record = record.lock().await;
        if self.find(name).is_none() && self.registry.resolve(name, None).is_err() {
            return Err(Error::NotFound(format!("unknown model '{name}'")));
        }
        self.registry.unload(name);
        *record = ModelRecord::default();
        tracing::info!(model = %name, "unloaded");
        Ok(())
    }

    /// One poll of the repositories: acts on every model folder whose files
    /// stayed the same since the previous poll and differ from what was last
    /// tried, and unloads models whose folder is gone.
    pub async fn poll(&self) {
        let dirs = match repository::scan(&self.repositories) {
            Ok(dirs) => dirs,
            Err(e) => return tracing::error!("poll: {e}"),
        };
        let mut stable = Vec::new();
        let gone: Vec<String> = {
            let mut observed = self.observed.lock().expect("observed lock");
            let mut now = HashMap::new();
            for dir in dirs {
                let files = ModelFiles::observe(&dir);
                if observed.get(&dir.name) == Some(&files) {
                    stable.push((dir.name.clone(), files.clone()));
                }
                now.insert(dir.name, files);
            }
            let gone = observed.keys().filter(|n| !now.contains_key(*n)).cloned().collect();
            *observed = now;
            gone
        };
        for (name, files) in stable {
            let record = self.record(&name);
            let changed = record.lock().await.attempted.as_ref().is_none_or(|(tried, _)| *tried != files);
            if changed {
                tracing::info!(model = %name, "poll: files changed");
                let _ = self.load(&name, None).await;
            }
        }
        for name in gone {
            tracing::info!(model = %name, "poll: model folder removed");
            let _ = self.unload(&name).await;
        }
    }

    fn record(&self, name: &str) -> Arc<tokio::sync::Mutex<ModelRecord>> {
        self.records.lock().expect("records lock").entry(name.to_owned()).or_default().clone()
    }

    fn find(&self, name: &str) -> Option<ModelDir> {
        self.repositories
            .iter()
            .map(|r| ModelDir { name: name.to_owned(), path: r.join(name) })
            .find(|d| d.path.is_dir())
    }
}

/// The model's configuration: the JSON override, or `config.pbtxt`.
fn model_config(dir: &ModelDir, config_json: Option<&str>) -> Result<ModelConfig, String> {
    let config = match config_json {
        Some(json) => config::parse_json(json)
            .map_err(|e| format!("the 'config' parameter is not a valid model configuration: {e}"))?,
        None => config::load(&dir.path)?,
    };
    if config.name.is_empty() || config.name == dir.name {
        Ok(config)
    } else {
        Err(format!(
            "the configuration says name '{}' but the model folder is '{}'; they must match",
            config.name, dir.name
        ))
    }
}

/// Checks a repository without serving it: every configuration parses and
/// every selected version loads (model file, configuration against it,
/// plugin instantiation). Returns one line per problem, naming the model and
/// version; empty when all is well.
pub fn check_repository(repositories: &[PathBuf], runtimes: &Runtimes) -> Result<Vec<String>, String> {
    let mut problems = Vec::new();
    for dir in repository::scan(repositories)? {
        let config = match model_config(&dir, None) {
            Ok(c) => c,
            Err(reason) => {
                problems.push(format!("model '{}': {reason}", dir.name));
                continue;
            }
        };
        let available = repository::versions(&dir);
        let targets = repository::select_versions(config.version_policy.as_ref(), &available);
        if targets.is_empty() {
            problems
                .push(format!("model '{}': no version folder for its version_policy among {available:?}", dir.name));
        }
        for version in targets {
            if let Err(reason) = Model::load(&dir, version, &config, runtimes) {
                problems.push(format!("model '{}' version {version}: {reason}", dir.name));
            }
        }
    }
    Ok(problems)
}

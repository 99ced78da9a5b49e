//! Loading, reloading and unloading models as the model control mode says
//! (Triton's `none`, `poll`, `explicit`; Plinth's `on_demand`, `modelmesh`),
//! without dropping a request:
//!
//! - a new or changed version loads and warms up beside the one serving;
//!   traffic moves to it only once it is READY, and the old one finishes its
//!   accepted requests before it is dropped;
//! - a version that fails to load leaves whatever was serving untouched and
//!   shows as UNAVAILABLE with the reason, every time it is tried;
//! - an unchanged version is never reloaded;
//! - in poll mode a folder is acted on only once its files stayed the same
//!   for a whole poll interval, so half-copied files are not loaded;
//! - in on-demand mode a request for a model that is not resident loads it
//!   (one load however many requests wait), evicting the least recently
//!   used models when the memory budget would be exceeded (`on_demand`);
//! - in modelmesh mode ModelMesh's calls load and unload models from the
//!   paths it gives, and nothing is evicted (`modelmesh`).

mod check;
mod modelmesh;
mod on_demand;

pub use check::check_repository;
pub use modelmesh::{DEFAULT_MODEL_SIZE, MeshLoadError, Source, predict_size};
pub use on_demand::PINNED_PARAMETER;
use on_demand::parameter_says_pinned;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::config::{self, ModelConfig};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::model::{Model, Runtimes};
use crate::registry::Registry;
use crate::repository::{self, Fingerprint, ModelDir, ModelFiles};
use crate::residency::{self, Budget, Residency};

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
    /// Like `explicit`, and a request for a model that is not resident
    /// loads it, within the memory budget.
    OnDemand,
    /// ModelMesh loads and unloads models through `mmesh.ModelRuntime`
    /// (`modelmesh`); nothing is evicted.
    ModelMesh,
}

impl std::fmt::Display for ControlMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ControlMode::None => "none",
            ControlMode::Poll => "poll",
            ControlMode::Explicit => "explicit",
            ControlMode::OnDemand => "on_demand",
            ControlMode::ModelMesh => "modelmesh",
        })
    }
}

/// Where a READY version came from: the model folder's own files, the
/// version folder's files and the configuration override, if any. The same
/// key means there is nothing to reload.
type LoadKey = (Fingerprint, Fingerprint, Option<String>);

/// What the lifecycle last did with one model. Its mutex also serialises
/// the loads and unloads of that model: concurrent first requests for a cold
/// model wait on it, and find the model loaded.
#[derive(Default)]
struct ModelRecord {
    /// The files (and override) the last load attempt saw; poll mode tries
    /// again only when they change.
    attempted: Option<(ModelFiles, Option<String>)>,
    /// Why that attempt failed, if it did.
    failure: Option<String>,
    /// Each READY version's origin and measured footprint in bytes.
    loaded: BTreeMap<u64, (LoadKey, u64)>,
}

/// How loads are bounded (flags of `plinth serve`).
#[derive(Clone, Copy, Debug)]
pub struct LoadLimits {
    /// Loads that run at once (`--model-load-concurrency`).
    pub concurrency: usize,
    /// How long a request waits for its model to load
    /// (`--model-load-timeout-secs`).
    pub timeout: std::time::Duration,
    /// What may be resident at once (on-demand mode).
    pub budget: Budget,
}

/// Owns the loading of models: the runtimes, the registry it updates, what
/// was loaded from where, and what is resident.
pub struct Lifecycle {
    runtimes: Arc<Runtimes>,
    registry: Arc<Registry>,
    repositories: Vec<PathBuf>,
    mode: ControlMode,
    records: Mutex<HashMap<String, Arc<tokio::sync::Mutex<ModelRecord>>>>,
    /// Poll mode: each model folder as the previous poll saw it.
    observed: Mutex<HashMap<String, ModelFiles>>,
    residency: Residency,
    /// Models never evicted: those named by `--load-model` in on-demand mode.
    pinned: Mutex<Vec<String>>,
    /// Modelmesh mode: where each model id's files are, and its staging
    /// folder.
    placed: Mutex<HashMap<String, modelmesh::Placed>>,
    /// Modelmesh mode: how many times `runtimeStatus` unloaded everything.
    purges: std::sync::atomic::AtomicU64,
    load_permits: tokio::sync::Semaphore,
    limits: LoadLimits,
    metrics: Arc<Metrics>,
}

impl Lifecycle {
    /// A lifecycle over `repositories` that records states in `registry`
    /// and counts in `metrics`.
    pub fn new(
        runtimes: Runtimes,
        registry: Arc<Registry>,
        repositories: Vec<PathBuf>,
        mode: ControlMode,
        limits: LoadLimits,
        metrics: Arc<Metrics>,
    ) -> Lifecycle {
        metrics.budget_bytes.set(limits.budget.bytes.map_or(0, |b| b as i64));
        Lifecycle {
            runtimes: Arc::new(runtimes),
            registry,
            repositories,
            mode,
            records: Mutex::default(),
            observed: Mutex::default(),
            residency: Residency::new(limits.budget),
            pinned: Mutex::default(),
            placed: Mutex::default(),
            purges: Default::default(),
            load_permits: tokio::sync::Semaphore::new(limits.concurrency.max(1)),
            limits,
            metrics,
        }
    }

    /// The control mode.
    pub fn mode(&self) -> ControlMode {
        self.mode
    }

    /// The start-up loads: every model in `none` and `poll` mode; in
    /// `explicit` and `on_demand` mode the models named in `load_models`
    /// (`*` for all; pinned in on-demand mode), the others listed as not
    /// loaded. Failures are logged and shown in the index; they never stop
    /// the other models.
    ///
    /// # Errors
    /// A message when a repository cannot be read.
    pub async fn start(&self, load_models: &[String]) -> Result<(), String> {
        let dirs = repository::scan(&self.repositories)?;
        let selective = matches!(self.mode, ControlMode::Explicit | ControlMode::OnDemand);
        let all = !selective || load_models.iter().any(|m| m == "*");
        let wanted: Vec<String> =
            if all { dirs.iter().map(|d| d.name.clone()).collect() } else { load_models.to_vec() };
        if self.mode == ControlMode::OnDemand {
            *self.pinned.lock().expect("pinned lock") = wanted.clone();
        }
        let not_loaded = match self.mode {
            ControlMode::OnDemand => "not resident; the first request for it loads it",
            _ => "not loaded",
        };
        for dir in &dirs {
            if !wanted.contains(&dir.name) {
                self.registry.add_unloaded(&dir.name, not_loaded);
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
        let dir = self.find(name).ok_or_else(|| {
            let reason = if repository::is_model_name(name) {
                format!("no model folder '{name}' in the model repositories")
            } else {
                format!("'{name}' is not a model name (one folder name: no '/', not empty, '.' or '..')")
            };
            tracing::error!(model = %name, "cannot load: {reason}");
            Error::InvalidArgument(format!("failed to load '{name}': {reason}"))
        })?;
        let record = self.record(name);
        let mut record = record.lock().await;
        self.load_locked(&dir, config_json, true, &mut record)
            .await
            .map_err(|reason| Error::InvalidArgument(format!("failed to load '{name}': {reason}")))
    }

    /// Loads `dir` with its record held; `wanted` makes it count for
    /// readiness.
    async fn load_locked(
        &self,
        dir: &ModelDir,
        config_json: Option<String>,
        wanted: bool,
        record: &mut ModelRecord,
    ) -> Result<(), String> {
        self.registry.begin_load(&dir.name, wanted);
        let files = ModelFiles::observe(dir);
        let result = self.load_versions(dir, &files, config_json.as_deref(), record).await;
        record.attempted = Some((files, config_json));
        record.failure = result.as_ref().err().cloned();
        result
    }

    async fn load_versions(
        &self,
        dir: &ModelDir,
        files: &ModelFiles,
        config_json: Option<&str>,
        record: &mut ModelRecord,
    ) -> Result<(), String> {
        let name = &dir.name;
        let config = match model_config(dir, config_json, self.mode == ControlMode::ModelMesh) {
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
        let changed: Vec<(u64, LoadKey)> = targets
            .iter()
            .map(|&v| (v, (files.top.clone(), files.versions[&v].clone(), config_json.map(str::to_owned))))
            .filter(|(v, key)| {
                let unchanged = record.loaded.get(v).is_some_and(|(k, _)| k == key) && self.registry.is_ready(name, *v);
                if unchanged {
                    tracing::debug!(model = %name, version = v, "unchanged: not reloaded");
                }
                !unchanged
            })
            .collect();
        if changed.is_empty() {
            return Ok(());
        }
        // Room is made before loading for a model whose footprint is known.
        // An unknown one loads first and is measured (the budget is exceeded
        // by at most its size meanwhile), so that a model too large for the
        // whole budget never evicts anything.
        let room = match self.residency.known_footprint(name) {
            Some(known) => self.make_room(name, known),
            None => self.residency.check_fits(name, changed.iter().map(|(v, _)| files.versions[v].bytes()).sum()),
        };
        if let Err(reason) = room {
            self.registry.fail_model(name, &reason);
            return Err(reason);
        }
        let mut failures = Vec::new();
        for (version, key) in changed {
            self.registry.set_loading(name, version);
            match self.load_version(dir, version, &config).await {
                Ok((model, bytes)) => {
                    self.registry.set_ready(name, version, model, bytes);
                    record.loaded.insert(version, (key, bytes));
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
        let footprint = record.loaded.values().map(|(_, bytes)| bytes).sum();
        self.settle(name, footprint, parameter_says_pinned(&config))?;
        if failures.is_empty() { Ok(()) } else { Err(failures.join("; ")) }
    }

    /// Loads and warms up one version off the async executor, at most
    /// `--model-load-concurrency` at a time, logging each stage with the
    /// milliseconds since the start. Returns the model and its footprint:
    /// the growth of the process's resident memory across the load, and at
    /// least the size of the version's files (loads running side by side
    /// share their growth, so a footprint can come out high, never below
    /// the weights).
    async fn load_version(
        &self,
        dir: &ModelDir,
        version: u64,
        config: &ModelConfig,
    ) -> Result<(Arc<Model>, u64), String> {
        let _permit = self.load_permits.acquire().await.map_err(|_| "the server is shutting down".to_owned())?;
        self.metrics.loads.with_label_values(&[&dir.name]).inc();
        self.metrics.loads_in_progress.inc();
        let (dir, config, runtimes) = (dir.clone(), config.clone(), self.runtimes.clone());
        let loading = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let ms = || started.elapsed().as_millis() as u64;
            // Free pages go back before and after, so the growth measured is
            // what this load keeps, not what it or another freed.
            residency::release_freed_memory();
            let rss_before = residency::process_rss();
            tracing::info!(model = %dir.name, version, "load: start");
            let loaded = Model::load(&dir, version, &config, &runtimes).and_then(|model| {
                tracing::info!(model = %dir.name, version, ms = ms(), "load: session created");
                let runs = model.warm_up(&dir.path)?;
                tracing::info!(model = %dir.name, version, ms = ms(), runs, "load: warm-up done");
                Ok(model)
            });
            let model = loaded.inspect_err(|_| {
                tracing::info!(model = %dir.name, version, ms = ms(), "load: failed");
                // What the failed load allocated goes back to the system.
                residency::release_freed_memory();
            })?;
            residency::release_freed_memory();
            let weights = Fingerprint::of(&dir.version_path(version), true).bytes();
            let bytes = residency::process_rss().saturating_sub(rss_before).max(weights);
            tracing::info!(model = %dir.name, version, ms = ms(), bytes, "load: ready");
            runtimes.metrics.load_duration(&dir.name, version, started.elapsed().as_secs_f64());
            Ok((Arc::new(model), bytes))
        });
        let result = loading.await.map_err(|e| format!("loading panicked: {e}"));
        self.metrics.loads_in_progress.dec();
        result?
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
        self.take_out(name, "unloaded");
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
        if !repository::is_model_name(name) {
            return None;
        }
        self.repositories
            .iter()
            .map(|r| ModelDir { name: name.to_owned(), path: r.join(name) })
            .find(|d| d.path.is_dir())
    }
}

/// The model's configuration: the JSON override, or `config.pbtxt`. With
/// `rename` (a ModelMesh model id) the configuration's own name gives way to
/// the folder's.
fn model_config(dir: &ModelDir, config_json: Option<&str>, rename: bool) -> Result<ModelConfig, String> {
    let mut config = match config_json {
        Some(json) => config::parse_json(json)
            .map_err(|e| format!("the 'config' parameter is not a valid model configuration: {e}"))?,
        None => config::load(&dir.path)?,
    };
    if rename {
        config.name = dir.name.clone();
    }
    if config.name.is_empty() || config.name == dir.name {
        Ok(config)
    } else {
        Err(format!(
            "the configuration says name '{}' but the model folder is '{}'; they must match",
            config.name, dir.name
        ))
    }
}

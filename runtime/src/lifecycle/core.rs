//! What every control mode shares: the record of what was loaded from
//! where, the loading itself (a new or changed version beside the one
//! serving, the old one retired once the new one is READY), unloading, and
//! keeping the residency accounting and metrics in step with the registry.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;

use super::LoadLimits;
use super::ensemble::{self, StepLabels};
use super::loader::Loader;
use super::request::{self, LoadRequest};
use super::runner::WarmUpRunner;
use crate::config::{self, ModelConfig, Signature};
use crate::drain::InUse;
use crate::error::{Error, LoadError};
use crate::metrics::Metrics;
use crate::model::{Ensemble, Model};
use crate::registry::Registry;
use crate::repository::{self, Fingerprint, ModelDir, ModelFiles, Repositories, ScanError};
use crate::residency::{self, Footprint, Residency};
use crate::rollout::{self, Rollouts};
use crate::scheduler::sequence::policy::SequencePolicy;

/// The `config.pbtxt` parameter that keeps a model resident: `pinned: "true"`.
pub const PINNED_PARAMETER: &str = "pinned";

/// The `config.pbtxt` parameter that says what a new version does when it
/// does not fit on its GPU beside the version serving: `gpu_swap_policy`,
/// [`SwapPolicy`]'s values.
pub const GPU_SWAP_PARAMETER: &str = "gpu_swap_policy";

/// What a hot swap does on a GPU without room for both versions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwapPolicy {
    /// `refuse` (the default): the swap fails with a message, and the
    /// version serving keeps serving.
    Refuse,
    /// `unload_first`: the versions serving are unloaded first; requests
    /// get 503 until the new version is READY.
    UnloadFirst,
}

impl SwapPolicy {
    /// The policy `config` names.
    ///
    /// # Errors
    /// A message naming the parameter for a value that is neither.
    pub fn of(config: &ModelConfig) -> Result<SwapPolicy, String> {
        match config::parameter(config, GPU_SWAP_PARAMETER).map(str::trim) {
            None | Some("refuse") => Ok(SwapPolicy::Refuse),
            Some("unload_first") => Ok(SwapPolicy::UnloadFirst),
            Some(other) => {
                Err(format!("parameter '{GPU_SWAP_PARAMETER}' must be \"refuse\" or \"unload_first\", got '{other}'"))
            }
        }
    }
}

/// Why an evicted model is not serving.
const EVICTED: &str = "evicted to stay within the memory budget; the next request loads it again";

/// Where a READY version came from: the model folder's own files, the
/// version folder's files and the configuration override, if any. The same
/// key means there is nothing to reload.
type LoadKey = (Fingerprint, Fingerprint, Option<String>);

/// What the lifecycle last did with one model. Its mutex also serialises
/// the loads and unloads of that model: concurrent first requests for a cold
/// model wait on it, and find the model loaded.
#[derive(Default)]
pub(super) struct ModelRecord {
    /// The files (and override) the last load attempt saw; poll mode tries
    /// again only when they change.
    pub(super) attempted: Option<(ModelFiles, Option<String>)>,
    /// Why that attempt failed, if it did.
    pub(super) failure: Option<LoadError>,
    /// Each READY version's origin and accounted footprint.
    loaded: BTreeMap<u64, (LoadKey, Footprint)>,
    /// The folder the last load's `file:` parameters made, kept while a
    /// version loaded from it may serve.
    staged: Option<tempfile::TempDir>,
}

impl ModelRecord {
    /// The accounted footprint of the model's READY versions.
    pub(super) fn footprint(&self) -> Footprint {
        let mut total = Footprint::default();
        for (_, footprint) in self.loaded.values() {
            total.add(footprint);
        }
        total
    }
}

/// How one load counts and names its model.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct LoadOptions<'a> {
    /// The model counts for readiness from now on.
    pub(super) wanted: bool,
    /// The model serves under its folder's name (a ModelMesh model id)
    /// whatever its configuration calls it; otherwise a configuration's
    /// `name` must be the folder's.
    pub(super) rename: bool,
    /// The ensembles whose loads load this model, outermost first.
    pub(super) chain: &'a [String],
}

/// The shared core of every control mode.
pub(super) struct Core {
    pub(super) registry: Arc<Registry>,
    loader: Arc<dyn Loader>,
    repositories: Repositories,
    records: Mutex<HashMap<String, Arc<tokio::sync::Mutex<ModelRecord>>>>,
    pub(super) residency: Residency,
    /// Each model's rollout from its serving version to a candidate.
    pub(super) rollouts: Rollouts,
    load_permits: tokio::sync::Semaphore,
    pub(super) limits: LoadLimits,
    pub(super) metrics: Arc<Metrics>,
}

impl Core {
    pub(super) fn new(
        loader: Arc<dyn Loader>,
        registry: Arc<Registry>,
        repositories: Repositories,
        residency: Residency,
        limits: LoadLimits,
        metrics: Arc<Metrics>,
    ) -> Core {
        metrics.residency.budget_bytes.set(limits.budget.bytes.map_or(0, |b| b as i64));
        Core {
            registry,
            loader,
            repositories,
            records: Mutex::default(),
            residency,
            rollouts: Rollouts::new(metrics.rollout.clone()),
            load_permits: tokio::sync::Semaphore::new(limits.concurrency.max(1)),
            limits,
            metrics,
        }
    }

    /// The model folders of every repository and what each holds now.
    ///
    /// # Errors
    /// A message when a repository cannot be read (a store that cannot be
    /// listed shows what its mirror last synced, if anything).
    pub(super) async fn scan(&self) -> Result<Vec<(ModelDir, ModelFiles)>, ScanError> {
        self.repositories.scan().await
    }

    /// The folder of model `name` in the repositories, if there is one.
    pub(super) async fn find(&self, name: &str) -> Option<ModelDir> {
        self.repositories.find(name).await
    }

    /// See [`Repositories::remove_temporary_mirrors`].
    pub(super) fn remove_temporary_mirrors(&self) {
        self.repositories.remove_temporary_mirrors();
    }

    /// What model folder `dir` holds as far as loading goes, without
    /// fetching it.
    pub(super) fn observe(&self, dir: &ModelDir) -> ModelFiles {
        self.repositories.observe(dir)
    }

    /// The first of the core's shared parts (records, registry, residency,
    /// rollouts) whose lock cannot be taken within `wait`: every request
    /// takes some of them, so none can be served while one is stuck.
    pub(super) fn stuck(&self, wait: std::time::Duration) -> Option<&'static str> {
        let parts: [(&str, &dyn Fn() -> bool); 4] = [
            ("the model records' lock", &|| self.records.try_lock_for(wait).is_some()),
            ("the registry's lock", &|| self.registry.responsive(wait)),
            ("the residency's lock", &|| self.residency.responsive(wait)),
            ("the rollouts' lock", &|| self.rollouts.responsive(wait)),
        ];
        parts.into_iter().find(|(_, free)| !free()).map(|(name, _)| name)
    }

    /// The record of model `name`, created empty the first time.
    pub(super) fn record(&self, name: &str) -> Arc<tokio::sync::Mutex<ModelRecord>> {
        self.records.lock().entry(name.to_owned()).or_default().clone()
    }

    /// Every model that has a record.
    pub(super) fn recorded(&self) -> Vec<String> {
        self.records.lock().keys().cloned().collect()
    }

    /// Forgets the record of `name`, and its per-model metric series,
    /// unless someone else holds or waits for it (`record` is the caller's
    /// own handle).
    pub(super) fn forget_record(&self, name: &str, record: &Arc<tokio::sync::Mutex<ModelRecord>>) {
        let mut records = self.records.lock();
        // Only the caller holds it besides the map: nothing waits on it.
        if Arc::strong_count(record) == 2 {
            records.remove(name);
            self.metrics.residency.forget(name, self.gpus_of(name));
        }
    }

    /// Loads `name` (the versions its policy selects), or reloads what
    /// changed. The request's `config` overrides `config.pbtxt`; its files,
    /// when it has any, are the model folder instead of the repository's
    /// (the model need not be in a repository then). The model counts for
    /// readiness from now on.
    ///
    /// # Errors
    /// [`LoadError::Invalid`] when there is no such model folder, or the
    /// files are malformed; otherwise as [`Core::load_locked`], with every
    /// failure's reason. Versions serving before keep serving.
    pub(super) async fn load(&self, name: &str, request: LoadRequest) -> Result<(), LoadError> {
        self.load_within(name, request, &[]).await
    }

    /// [`Core::load`] for a model the ensembles in `chain` run.
    pub(super) async fn load_within(
        &self,
        name: &str,
        request: LoadRequest,
        chain: &[String],
    ) -> Result<(), LoadError> {
        let staged = if repository::is_model_name(name) { request::stage(&request, name)? } else { None };
        // A name with no folder leaves no trace: a typo in a load request
        // must not make the server unready.
        let dir = match &staged {
            Some((dir, _)) => dir.clone(),
            None => self.find(name).await.ok_or_else(|| {
                let reason = if repository::is_model_name(name) {
                    format!("no model folder '{name}' in the model repositories")
                } else {
                    format!("'{name}' is not a model name (one folder name: no '/', not empty, '.' or '..')")
                };
                tracing::error!(model = %name, "cannot load: {reason}");
                LoadError::Invalid(reason)
            })?,
        };
        let record = self.record(name);
        let mut record = record.lock().await;
        let options = LoadOptions { wanted: true, rename: false, chain };
        let result = self.load_locked(&dir, request.config, options, &mut record).await;
        // The last folder that loaded stays while its versions may serve.
        if let (Some((_, folder)), Ok(())) = (staged, &result) {
            record.staged = Some(folder);
        }
        result
    }

    /// Loads the models of `ensemble`'s steps that are not READY. `chain` names
    /// the ensembles being loaded around this one, outermost first.
    ///
    /// # Errors
    /// [`LoadError::Failed`] for a step whose model is not in a repository,
    /// does not load, or closes a cycle of ensembles.
    async fn load_steps(&self, name: &str, ensemble: &Ensemble, chain: &[String]) -> Result<(), LoadError> {
        let chain: Vec<String> = chain.iter().cloned().chain([name.to_owned()]).collect();
        let models: BTreeSet<&str> = ensemble.steps.iter().map(|s| s.model.as_str()).collect();
        for model in models {
            if chain.iter().any(|c| c == model) {
                return Err(LoadError::Failed(format!(
                    "circular dependency between ensembles: {} -> {model}",
                    chain.join(" -> ")
                )));
            }
            if self.registry.has_ready(model) {
                continue;
            }
            if self.find(model).await.is_none() {
                return Err(LoadError::Failed(format!(
                    "ensemble {name} contains models that are not available or ambiguous: {model} (not in the \
                     model repositories)"
                )));
            }
            Box::pin(self.load_within(model, LoadRequest::default(), &chain)).await.map_err(|e| {
                LoadError::Failed(format!("ensemble '{name}' runs model '{model}', which failed to load: {e}"))
            })?;
        }
        Ok(())
    }

    /// Loads `dir` with its record held.
    ///
    /// # Errors
    /// [`LoadError::Failed`] for a configuration that does not parse or
    /// name the folder, no version to load, or versions that fail (each
    /// named); [`LoadError::NoRoom`] when the model cannot fit the budget.
    pub(super) async fn load_locked(
        &self,
        dir: &ModelDir,
        config_json: Option<String>,
        options: LoadOptions<'_>,
        record: &mut ModelRecord,
    ) -> Result<(), LoadError> {
        self.registry.begin_load(&dir.name, options.wanted);
        // A remote model folder is brought to its mirror first, whole.
        let files = match self.repositories.fetch(dir).await {
            Ok(files) => files,
            Err(reason) => {
                let e = self.cannot_load(&dir.name, LoadError::Failed(reason));
                record.failure = Some(e.clone());
                return Err(e);
            }
        };
        let result = self.load_versions(dir, &files, config_json.as_deref(), options, record).await;
        record.attempted = Some((files, config_json));
        record.failure = result.as_ref().err().cloned();
        result
    }

    async fn load_versions(
        &self,
        dir: &ModelDir,
        files: &ModelFiles,
        config_json: Option<&str>,
        options: LoadOptions<'_>,
        record: &mut ModelRecord,
    ) -> Result<(), LoadError> {
        let name = &dir.name;
        let config = model_config(dir, config_json, options.rename)
            .map_err(|problems| self.cannot_load(name, LoadError::Failed(problems.join("; "))))?;
        // Checked on every model, not only when a swap needs it.
        SwapPolicy::of(&config).map_err(|e| self.cannot_load(name, LoadError::Failed(e)))?;
        let declared = rollout::declared_plan(&config).map_err(|e| self.cannot_load(name, LoadError::Failed(e)))?;
        let mut step_labels = StepLabels::new();
        if let Some(ensemble) = Ensemble::from_config(&config) {
            let signature = Signature::from_config(&config).map_err(LoadError::Failed);
            let ready = async {
                self.load_steps(name, &ensemble, options.chain).await?;
                ensemble::check_steps(&self.registry, name, &signature?, &ensemble)
            };
            step_labels = ready.await.map_err(|e| self.cannot_load(name, e))?;
        }
        for folder in repository::ignored_folders(dir) {
            tracing::info!(model = %name, %folder, "ignoring a folder that is not a version number");
        }
        let available: Vec<u64> = files.versions.keys().copied().collect();
        let targets = repository::select_versions(config.version_policy.as_ref(), &available);
        if targets.is_empty() {
            let reason = config::with_missing_files_hint(
                &config,
                format!("no version folder for its version_policy among {available:?} (numeric folders such as 1/)"),
            );
            return Err(self.cannot_load(name, LoadError::Failed(reason)));
        }
        // With a declared rollout, the version answering now stays beside
        // the versions the policy selects (while its folder is there): a
        // new one rolls out from it.
        let answering = declared.and_then(|_| self.answering(name)).filter(|v| available.contains(v));
        let keep: Vec<u64> = targets.iter().copied().chain(answering).collect();
        // Versions taken out since (evicted, refused room) serve no more.
        record.loaded.retain(|v, _| self.registry.is_ready(name, *v));
        let mut changed: Vec<(u64, LoadKey)> = targets
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
            // A version folder removed since serves no more.
            if !self.retire_unkept(name, keep, &available, record) {
                return Ok(());
            }
            return self.settle_config(name, &config, record).map_err(LoadError::Failed);
        }
        // A swap that does not fit on its GPU is settled first, so that a
        // refused one evicts nothing.
        let unloaded = self.room_to_swap(name, &config, record).await;
        let new_bytes = changed.iter().map(|(v, _)| files.versions[v].bytes()).sum();
        let room = unloaded.and_then(|unloaded| self.room_to_load(name, new_bytes).map(|()| unloaded));
        let unloaded = room.map_err(|reason| {
            self.registry.fail_model(name, &reason);
            LoadError::NoRoom(reason)
        })?;
        if unloaded {
            // Every target loads again, the unchanged ones too.
            changed = targets
                .iter()
                .map(|&v| (v, (files.top.clone(), files.versions[&v].clone(), config_json.map(str::to_owned))))
                .collect();
        }
        let mut failures = Vec::new();
        let mut new_ready = Vec::new();
        for (version, key) in changed {
            self.registry.set_loading(name, version);
            match self.load_version(dir, version, &config, &step_labels).await {
                Ok((model, footprint)) => {
                    self.registry.set_ready(name, version, model, footprint.host);
                    record.loaded.insert(version, (key, footprint));
                    new_ready.push(version);
                }
                Err(e) => {
                    tracing::error!(model = %name, version, "load failed: {e}");
                    self.registry.set_failed(name, version, e.message());
                    failures.push(format!("version {version}: {e}"));
                }
            }
        }
        let candidate = answering.and_then(|serving| new_ready.into_iter().filter(|v| *v != serving).max());
        if let (Some(plan), Some(serving), Some(candidate)) = (declared, answering, candidate) {
            self.roll_out_new_version(name, plan, candidate, serving);
        }
        self.retire_unkept(name, keep, &available, record);
        self.settle_config(name, &config, record).map_err(LoadError::Failed)?;
        if failures.is_empty() { Ok(()) } else { Err(LoadError::Failed(failures.join("; "))) }
    }

    /// Takes the versions of `name` out of service that are neither in
    /// `keep` nor the candidate of its rollout in progress (while that
    /// candidate's folder is among `available`), once one of them is READY,
    /// and ends a rollout that lost a version. A new version that failed
    /// to load so replaces no candidate; one whose rollout started is the
    /// candidate. Whether a version went.
    fn retire_unkept(&self, name: &str, mut keep: Vec<u64>, available: &[u64], record: &mut ModelRecord) -> bool {
        keep.extend(self.rollouts.candidate_in_progress(name).filter(|v| available.contains(v)));
        let before = record.loaded.len();
        self.registry.retire_versions(name, &keep);
        record.loaded.retain(|v, _| self.registry.is_ready(name, *v));
        self.end_rollout_without_versions(name);
        record.loaded.len() < before
    }

    /// [`Core::settle`] with the footprint of `record`'s versions, pinned
    /// when `config` says so.
    fn settle_config(&self, name: &str, config: &ModelConfig, record: &ModelRecord) -> Result<(), String> {
        let pinned = config::parameter(config, PINNED_PARAMETER) == Some("true");
        self.settle(name, record.footprint(), pinned)
    }

    /// Room for loading `name`, whose new version files hold `new_bytes`.
    /// Room is made before loading for a model whose footprint is known.
    /// An unknown one loads first and is measured (the budget is exceeded
    /// by at most its size meanwhile), so that a model too large for the
    /// whole budget never evicts anything.
    ///
    /// # Errors
    /// As [`Core::make_room`] and [`Residency::check_fits`].
    fn room_to_load(&self, name: &str, new_bytes: u64) -> Result<(), String> {
        match self.residency.known_footprint(name) {
            Some(known) => self.make_room(name, &known),
            None => self.residency.check_fits(name, &Footprint::host(new_bytes)),
        }
    }

    /// Whether a new version of `name` fits on its GPUs beside the versions
    /// serving (a hot swap keeps them until the new one is READY), counting
    /// it as large as they are together: within `--model-load-gpu-limit`
    /// and within the memory NVML says is free on the device. Only GPUs the
    /// new configuration may use are checked (a move to the CPU needs no
    /// room there; a GPU the model never used is measured at load, as a
    /// first load is). Where it does not fit, [`SwapPolicy`] decides:
    /// refused, or the versions serving are unloaded first. Loading anyway
    /// could run the device out of memory in the middle of the swap.
    ///
    /// Returns whether it unloaded them, once their memory was handed back
    /// (requests in flight on them finish first; at most the load timeout).
    ///
    /// # Errors
    /// Under [`SwapPolicy::Refuse`], a message naming the GPU, both sizes
    /// and the parameter that allows unloading first; under
    /// [`SwapPolicy::UnloadFirst`], when requests still hold the old
    /// versions at the load timeout or the GPU is still short of room; a
    /// bad policy value.
    async fn room_to_swap(&self, name: &str, config: &ModelConfig, record: &mut ModelRecord) -> Result<bool, String> {
        let serving = record.footprint();
        let wanted: BTreeMap<u32, u64> = serving
            .devices
            .iter()
            .filter(|&(&gpu, &bytes)| bytes > 0 && crate::model::may_use_gpu(config, gpu))
            .map(|(&gpu, &bytes)| (gpu, bytes))
            .collect();
        if wanted.is_empty() {
            return Ok(false);
        }
        let policy = SwapPolicy::of(config)?;
        // Device memory only: the host budget is settled after the load.
        let both = Footprint { host: 0, devices: wanted.iter().map(|(&gpu, &b)| (gpu, 2 * b)).collect() };
        let budget = self.residency.check_free_on_gpus(name, &both).err();
        let Some(reason) = budget.or_else(|| self.short_of_device_memory(&wanted)) else { return Ok(false) };
        match policy {
            SwapPolicy::Refuse => Err(format!(
                "model '{name}': a new version does not fit beside the one serving ({serving}): {reason}; the version serving \
                 keeps serving (parameter '{GPU_SWAP_PARAMETER}: unload_first' unloads it first, at the cost of \
                 503s until the new one is READY)"
            )),
            SwapPolicy::UnloadFirst => {
                tracing::warn!(model = %name, %reason, "unloading the versions serving before the swap ({GPU_SWAP_PARAMETER})");
                let old = self.registry.make_way(name);
                self.forget_residency(name);
                record.loaded.clear();
                self.hand_back(old).await.map_err(|e| format!("model '{name}': {e}"))?;
                match self.short_of_device_memory(&wanted) {
                    None => Ok(true),
                    Some(reason) => Err(format!("model '{name}': the versions serving were unloaded, but {reason}")),
                }
            }
        }
    }

    /// The first GPU of `wanted` (bytes by GPU index) where NVML reports
    /// less memory free than wanted there, as a message with both sizes.
    fn short_of_device_memory(&self, wanted: &BTreeMap<u32, u64>) -> Option<String> {
        wanted.iter().find_map(|(&gpu, &bytes)| {
            let free = self.loader.gpu_free_bytes(gpu)?;
            (bytes > free).then(|| {
                format!(
                    "GPU {gpu} has {} free, and the new version needs about {} there",
                    residency::human(free),
                    residency::human(bytes)
                )
            })
        })
    }

    /// Lets go of `old`, taken out of the registry, and waits until the
    /// last request using it has let go too and its instances are dropped
    /// (at most the load timeout), so that its sessions and modules are
    /// destroyed, and their device memory handed back, before this returns.
    ///
    /// # Errors
    /// When requests still hold a version at the timeout (it then leaves
    /// memory with the last of them).
    async fn hand_back(&self, old: Vec<Arc<Model>>) -> Result<(), String> {
        let freed: Vec<InUse> = old.iter().map(|m| m.freed()).collect();
        drop(old);
        let deadline = tokio::time::Instant::now() + self.limits.timeout;
        for version in freed {
            if version.none_by(deadline).await.is_err() {
                return Err(format!(
                    "requests still run on the versions unloaded to make room after {:?} \
                     (--model-load-timeout-secs); the new version was not loaded",
                    self.limits.timeout
                ));
            }
        }
        Ok(())
    }

    /// The GPUs `name` held memory on when last loaded.
    fn gpus_of(&self, name: &str) -> Vec<u32> {
        self.residency.known_footprint(name).map_or_else(Vec::new, |f| f.devices.keys().copied().collect())
    }

    /// Records a failure of the whole model in the registry and the log.
    fn cannot_load(&self, name: &str, e: LoadError) -> LoadError {
        self.registry.fail_model(name, e.message());
        tracing::error!(model = %name, "cannot load: {e}");
        e
    }

    /// Loads one version off the async executor, at most
    /// `--model-load-concurrency` at a time; returns the model, given the
    /// labels its ensemble steps write, and its accounted footprint.
    async fn load_version(
        &self,
        dir: &ModelDir,
        version: u64,
        config: &ModelConfig,
        step_labels: &StepLabels,
    ) -> Result<(Arc<Model>, Footprint), LoadError> {
        let _permit = self
            .load_permits
            .acquire()
            .await
            .map_err(|_| LoadError::Failed("the server is shutting down".to_owned()))?;
        self.metrics.residency.loads.with_label_values(&[&dir.name]).inc();
        self.metrics.residency.loads_in_progress.inc();
        let (loader, dir, config) = (self.loader.clone(), dir.clone(), config.clone());
        let loading = tokio::task::spawn_blocking(move || loader.load(&dir, version, &config));
        let result = loading.await.map_err(|e| LoadError::Failed(format!("loading panicked: {e}")));
        self.metrics.residency.loads_in_progress.dec();
        let (mut model, least) = result??;
        model.inherit_labels(step_labels.clone());
        let model = Arc::new(model);
        let runner = Arc::new(WarmUpRunner { model: model.clone(), registry: self.registry.clone() });
        let samples = model.warm_up_plugin(runner).await.map_err(LoadError::Failed)?;
        if samples > 0 {
            tracing::info!(model = %model.name, version, samples, "load: plugin warm-up done");
        }
        // Counted by the model's runtimes, after every warm-up: the same for
        // identical copies whatever the other models are doing.
        let footprint = Footprint { host: model.resident_bytes().max(least), devices: model.device_bytes().clone() };
        tracing::info!(model = %model.name, version, bytes = footprint.host, devices = ?footprint.devices, "load: footprint");
        Ok((model, footprint))
    }

    /// Unloads every version of `name`. Requests already accepted finish;
    /// later ones get 503.
    ///
    /// # Errors
    /// [`Error::NotFound`] when no such model is known.
    pub(super) async fn unload(&self, name: &str) -> Result<(), Error> {
        let record = self.record(name);
        let mut record = record.lock().await;
        if self.find(name).await.is_none() && self.registry.resolve(name, None).is_err() {
            return Err(Error::NotFound(format!("unknown model '{name}'")));
        }
        self.take_out(name, "unloaded");
        *record = ModelRecord::default();
        // Its versions' series left with them; its loads count goes too
        // (an evicted model keeps its loads and evictions counts instead:
        // it serves again at its next request).
        self.metrics.residency.forget(name, self.gpus_of(name));
        tracing::info!(model = %name, "unloaded");
        Ok(())
    }

    /// Makes room for `need` for `name` as the residency's admission says:
    /// evicting least recently used models, or refusing.
    ///
    /// # Errors
    /// A message when `need` exceeds a whole budget (nothing is evicted),
    /// or, where nothing is evicted, the room left.
    pub(super) fn make_room(&self, name: &str, need: &Footprint) -> Result<(), String> {
        for victim in self.residency.make_room(name, need, |n| self.registry.is_busy(n))? {
            tracing::info!(model = %victim, "evicting: least recently used");
            self.metrics.residency.evictions.with_label_values(&[&victim]).inc();
            self.take_out(&victim, EVICTED);
        }
        Ok(())
    }

    /// Records `name`'s accounted footprint once its load finished, and
    /// makes room if it turned out larger than room was made for.
    ///
    /// # Errors
    /// A message when the footprint exceeds the whole budget (or, where
    /// nothing is evicted, the room left): the model is taken out again, and
    /// later requests are refused without a load.
    fn settle(&self, name: &str, footprint: Footprint, pinned_by_config: bool) -> Result<(), String> {
        if footprint.is_empty() {
            self.residency.remove(name);
            return Ok(());
        }
        let previous = self.residency.known_footprint(name).unwrap_or_default();
        self.residency.admit(name, footprint.clone(), pinned_by_config);
        if let Err(reason) = self.make_room(name, &footprint) {
            self.take_out(name, &reason);
            // The series of GPUs only the versions before it used go too.
            self.metrics.residency.forget_footprint(name, previous.devices.keys().copied());
            return Err(reason);
        }
        let residency = &self.metrics.residency;
        // A GPU the model no longer uses (its `gpus` changed) loses its series.
        let left = previous.devices.keys().filter(|gpu| !footprint.devices.contains_key(gpu)).copied();
        residency.forget_footprint(name, left);
        residency.resident_bytes.with_label_values(&[name]).set(footprint.host as i64);
        for (gpu, bytes) in &footprint.devices {
            residency.device_bytes.with_label_values(&[name, &gpu.to_string()]).set(*bytes as i64);
        }
        residency.used_bytes.set(self.residency.used().host as i64);
        Ok(())
    }

    /// Takes every version of `name` out of service with `reason` and gives
    /// its memory back once no request uses it.
    pub(super) fn take_out(&self, name: &str, reason: &str) {
        // Each version's instances are freed, and their memory handed back,
        // once its last request lets it go (`drain::FreedOffThread`).
        drop(self.registry.unload(name, reason));
        self.rollouts.forget(name);
        self.forget_residency(name);
    }

    /// Takes `version` of `name` out of service (a promoted rollout's
    /// serving version), keeping the residency accounting in step. The
    /// model's other versions stay.
    pub(super) async fn retire_version(&self, name: &str, version: u64) {
        let record = self.record(name);
        let mut record = record.lock().await;
        let keep: Vec<u64> = self.registry.ready_versions(name).into_iter().filter(|v| *v != version).collect();
        if keep.is_empty() {
            return;
        }
        self.registry.retire_versions(name, &keep);
        record.loaded.retain(|v, _| self.registry.is_ready(name, *v));
        if let Err(reason) = self.settle(name, record.footprint(), self.residency.is_pinned(name)) {
            tracing::warn!(model = %name, "{reason}");
        }
    }

    /// Records that `name` left memory: the residency and its footprint series.
    fn forget_residency(&self, name: &str) {
        self.residency.remove(name);
        self.metrics.residency.forget_footprint(name, self.gpus_of(name));
        self.metrics.residency.used_bytes.set(self.residency.used().host as i64);
    }
}

/// The model's configuration: the JSON override, or `config.pbtxt`. A
/// configuration's `name` must be its folder's (or empty); with `rename` it
/// gives way to the folder's. It must pass Triton's validation rules
/// (`config::validate`, and the sequence batcher's control inputs),
/// checked before any model file is looked at.
///
/// # Errors
/// Every problem found, one message each.
pub(super) fn model_config(
    dir: &ModelDir,
    config_json: Option<&str>,
    rename: bool,
) -> Result<ModelConfig, Vec<String>> {
    let mut config = match config_json {
        Some(json) => config::parse_json(json)
            .map_err(|e| format!("the 'config' parameter is not a valid model configuration: {e}")),
        None => config::load(&dir.path),
    }
    .map_err(|e| vec![e])?;
    if rename {
        config.name.clone_from(&dir.name);
    }
    let mut problems = Vec::new();
    if !config.name.is_empty() && config.name != dir.name {
        problems.push(format!(
            "the configuration says name '{}' but the model folder is '{}'; they must match",
            config.name, dir.name
        ));
    }
    problems.extend(config::validate::validate(&config).err().unwrap_or_default());
    // The scheduler's rules that need no file run with the validation, as
    // Triton's do, so that a model without versions is refused for them too.
    problems.extend(SequencePolicy::check_config(&config).err());
    if problems.is_empty() { Ok(config) } else { Err(problems) }
}

//! Loading a model: its configuration read and checked, an ensemble's
//! steps loaded first, the versions its policy selects loaded beside the
//! ones serving (only those whose files changed), room made in the
//! residency budget, the versions no longer selected retired, and a
//! declared rollout started for a new version.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::core::Core;
use super::ensemble::{self, StepLabels};
use super::records::{LoadKey, ModelRecord};
use super::request::{self, LoadRequest};
use super::runner::WarmUpRunner;
use crate::config::{self, ModelConfig, Parameters, Signature};
use crate::error::LoadError;
use crate::model::{Ensemble, Model};
use crate::repository::{self, ModelDir, ModelFiles};
use crate::residency::{Footprint, Versions};
use crate::rollout;
use crate::scheduler::sequence::policy::SequencePolicy;

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

impl Core {
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
        let (config, parameters) = model_config(dir, config_json, options.rename)
            .map_err(|problems| self.cannot_load(name, LoadError::Failed(problems.join("; "))))?;
        let declared = rollout::declared_plan(parameters.rollout.as_deref())
            .map_err(|e| self.cannot_load(name, LoadError::Failed(e)))?;
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
            let reason = parameters.with_missing_files_hint(format!(
                "no version folder for its version_policy among {available:?} (numeric folders such as 1/)"
            ));
            return Err(self.cannot_load(name, LoadError::Failed(reason)));
        }
        // With a declared rollout, the version answering now stays beside
        // the versions the policy selects (while its folder is there): a
        // new one rolls out from it.
        let answering = declared.and_then(|_| self.answering(name)).filter(|v| available.contains(v));
        let keep: Vec<u64> = targets.iter().copied().chain(answering).collect();
        // Versions taken out since (evicted, refused room) serve no more.
        record.keep_ready(&self.registry, name);
        let mut changed: Vec<(u64, LoadKey)> = targets
            .iter()
            .map(|&v| (v, (files.top.clone(), files.versions[&v].clone(), config_json.map(str::to_owned))))
            .filter(|(v, key)| {
                let unchanged = record.loaded.get(v) == Some(key) && self.registry.is_ready(name, *v);
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
            return self.settle(name, Versions::new(), parameters.pinned).map_err(LoadError::Failed);
        }
        // A swap that does not fit on its GPU is settled first, so that a
        // refused one evicts nothing.
        let unloaded = self.room_to_swap(name, &config, parameters.gpu_swap_policy, record).await;
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
        let mut new_ready = Versions::new();
        for (version, key) in changed {
            self.registry.set_loading(name, version);
            match self.load_version(dir, version, (&config, &parameters), &step_labels).await {
                Ok((model, footprint)) => {
                    self.registry.set_ready(name, version, model);
                    record.loaded.insert(version, key);
                    new_ready.insert(version, footprint);
                }
                Err(e) => {
                    tracing::error!(model = %name, version, "load failed: {e}");
                    self.registry.set_failed(name, version, e.message());
                    failures.push(format!("version {version}: {e}"));
                }
            }
        }
        let candidate = answering.and_then(|serving| new_ready.keys().copied().filter(|v| *v != serving).max());
        if let (Some(plan), Some(serving), Some(candidate)) = (declared, answering, candidate) {
            self.roll_out_new_version(name, plan, candidate, serving);
        }
        self.retire_unkept(name, keep, &available, record);
        self.settle(name, new_ready, parameters.pinned).map_err(LoadError::Failed)?;
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
        self.registry.retire_versions(name, &keep);
        let retired = record.keep_ready(&self.registry, name);
        self.end_rollout_without_versions(name);
        retired
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
        (config, parameters): (&ModelConfig, &Parameters),
        step_labels: &StepLabels,
    ) -> Result<(Arc<Model>, Footprint), LoadError> {
        let _permit = self
            .load_permits
            .acquire()
            .await
            .map_err(|_| LoadError::Failed("the server is shutting down".to_owned()))?;
        self.metrics.residency.loads.with_label_values(&[&dir.name]).inc();
        self.metrics.residency.loads_in_progress.inc();
        let (loader, dir, config, parameters) = (self.loader.clone(), dir.clone(), config.clone(), parameters.clone());
        let loading = tokio::task::spawn_blocking(move || loader.load(&dir, version, &config, &parameters));
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
) -> Result<(ModelConfig, Parameters), Vec<String>> {
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
    let parameters = config::validate::validate(&config).map_err(|found| problems.extend(found));
    // The scheduler's rules that need no file run with the validation, as
    // Triton's do, so that a model without versions is refused for them too.
    problems.extend(SequencePolicy::check_config(&config).err());
    match parameters {
        Ok(parameters) if problems.is_empty() => Ok((config, parameters)),
        _ => Err(problems),
    }
}

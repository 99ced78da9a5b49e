//! Loading, reloading and unloading models as the model control mode says
//! (Triton's `none`, `poll`, `explicit`; Plinth's `on_demand`, `modelmesh`),
//! without dropping a request:
//!
//! - a new or changed version loads and warms up beside the one serving;
//!   traffic moves to it only once it is READY, and the old one finishes its
//!   accepted requests before it is dropped;
//! - a version that fails to load leaves whatever was serving untouched and
//!   shows as UNAVAILABLE with the reason, every time it is tried;
//! - an unchanged version is never reloaded.
//!
//! What every mode shares (records, loading, unloading, residency) is the
//! `core`, and `startup` loads all or the named models at start. Each
//! mode with behaviour or state of its own has its own file: `poll` (act
//! on folders whose files stopped changing), `on_demand` (a request loads
//! its model, evicting the least recently used), `modelmesh` (ModelMesh's
//! calls decide); in `explicit` the repository API decides, which
//! [`Lifecycle::load`] and [`Lifecycle::unload`] allow in it and `on_demand`
//! only. [`Loader`] is the seam to the runtimes that load a version.

mod check;
mod core;
mod ensemble;
mod loader;
mod loading;
mod modelmesh;
mod on_demand;
mod poll;
mod records;
mod request;
mod rollout;
mod runner;
mod runtimes;
mod serve;
mod startup;
mod swap;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;

/// What the rollout API answers: the lifecycle carries rollouts out, so
/// the front ends reach them through it only.
pub use crate::rollout::{Figures, Phase, RolloutStatus};
pub use check::check_repository;
pub use loader::{Loader, RuntimeLoader};
pub use modelmesh::{DEFAULT_MODEL_SIZE, Mesh, Source, predict_size};
pub use request::LoadRequest;
pub use runtimes::LoadingOptions;
pub use serve::{Accepted, Caller, Headers, InferCall};

use std::sync::Arc;

use self::core::Core;
use crate::error::{Error, LoadError};
use crate::metrics::Metrics;
use crate::model::Model;
use crate::registry::{IndexEntry, Registry};
use crate::repository::{Repositories, ScanError};
use crate::residency::{Admission, Budget, Residency};
use crate::rollout::Plan;

/// How the set of loaded models changes after start (Triton's
/// `--model-control-mode`, plus Plinth's `on_demand` and `modelmesh`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ControlMode {
    /// Load every model at start; never change.
    None,
    /// Load every model at start, then follow the repositories' changes.
    Poll,
    /// Load `--load-model` models at start; then the repository API decides.
    Explicit,
    /// Like explicit, and a request for a model that is not in memory loads
    /// it, evicting the least recently used ones to stay within
    /// `--model-memory-budget` / `--max-loaded-models`.
    #[value(name = "on_demand")]
    OnDemand,
    /// ModelMesh decides: models load and unload through the
    /// `mmesh.ModelRuntime` gRPC service, from the paths it gives, under its
    /// model ids; nothing is evicted, and `--model-memory-budget` only
    /// refuses loads that do not fit. No `--model-repository`.
    #[value(name = "modelmesh")]
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

/// How loads are bounded (flags of `plinth serve`).
#[derive(Clone, Debug)]
pub struct LoadLimits {
    /// Loads that run at once (`--model-load-concurrency`).
    pub concurrency: usize,
    /// How long a request waits for its model to load
    /// (`--model-load-timeout-secs`).
    pub timeout: std::time::Duration,
    /// What may be resident at once (on-demand and modelmesh mode).
    pub budget: Budget,
}

/// Each mode's own state, over the shared core.
enum Mode {
    None,
    Poll(poll::Poll),
    Explicit,
    OnDemand,
    ModelMesh(modelmesh::ModelMesh),
}

/// Owns the loading of models: the shared core and the control mode.
pub struct Lifecycle {
    core: Arc<Core>,
    mode: Mode,
}

impl Lifecycle {
    /// A lifecycle in `mode` over `repositories` that loads with `loader`,
    /// records states in `registry` and counts in `metrics`.
    pub fn new(
        loader: Arc<dyn Loader>,
        registry: Arc<Registry>,
        repositories: Repositories,
        mode: ControlMode,
        limits: LoadLimits,
        metrics: Arc<Metrics>,
    ) -> Lifecycle {
        // Only on-demand mode takes models out to make room; elsewhere the
        // operator (or ModelMesh) decides what is loaded, and a load that
        // does not fit is refused (Triton's --model-load-gpu-limit).
        let admission = match mode {
            ControlMode::OnDemand => Admission::EvictLeastRecentlyUsed,
            _ => Admission::RefuseWhenFull,
        };
        let residency = Residency::new(limits.budget.clone(), admission);
        let core = Arc::new(Core::new(loader, registry, repositories, residency, limits, metrics));
        let mode = match mode {
            ControlMode::None => Mode::None,
            ControlMode::Poll => Mode::Poll(poll::Poll::default()),
            ControlMode::Explicit => Mode::Explicit,
            ControlMode::OnDemand => Mode::OnDemand,
            ControlMode::ModelMesh => Mode::ModelMesh(modelmesh::ModelMesh::default()),
        };
        Lifecycle { core, mode }
    }

    /// Removes the temporary mirror folder of the repositories in object
    /// storage, if one was made (at shutdown).
    pub fn remove_temporary_mirrors(&self) {
        self.core.remove_temporary_mirrors();
    }

    pub fn mode(&self) -> ControlMode {
        match self.mode {
            Mode::None => ControlMode::None,
            Mode::Poll(_) => ControlMode::Poll,
            Mode::Explicit => ControlMode::Explicit,
            Mode::OnDemand => ControlMode::OnDemand,
            Mode::ModelMesh(_) => ControlMode::ModelMesh,
        }
    }

    /// The registry it records states in.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.core.registry
    }

    /// The repository index (`Registry::index`), each READY version with
    /// the memory the residency accounts to it.
    pub fn index(&self) -> Vec<IndexEntry> {
        self.core.registry.index(|name, version| self.core.residency.host_bytes(name, version))
    }

    /// The metrics it counts loads and residency in.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.core.metrics
    }

    /// Which shared part of the core is stuck: a lock that cannot be taken
    /// within `wait` (see `Core::stuck`); `None` when all are free.
    pub fn stuck(&self, wait: std::time::Duration) -> Option<&'static str> {
        self.core.stuck(wait)
    }

    /// Runs `f` while holding the lock that every answer a rollout judges
    /// takes: the server's test-only fault hook panics or stalls there.
    pub fn while_core_locked<T>(&self, f: impl FnOnce() -> T) -> T {
        self.core.rollouts.while_locked(f)
    }

    /// The load limits: concurrency, timeout and memory budget.
    pub fn limits(&self) -> &LoadLimits {
        &self.core.limits
    }

    /// The start-up loads: every model in `none` and `poll` mode; in
    /// `explicit` and `on_demand` mode the models named in `load_models`
    /// (`*` for all; pinned in on-demand mode), the others listed as not
    /// loaded; none in modelmesh mode. Failures are logged and shown in the
    /// index; they never stop the other models.
    ///
    /// # Errors
    /// A message when a repository cannot be read.
    pub async fn start(&self, load_models: &[String]) -> Result<(), ScanError> {
        let core = &self.core;
        match &self.mode {
            Mode::None => startup::load_all(core).await.map(drop),
            Mode::Poll(poll) => poll.start(core).await,
            Mode::Explicit => startup::start(core, load_models, "not loaded", |_| ()).await,
            Mode::OnDemand => on_demand::start(core, load_models).await,
            Mode::ModelMesh(_) => Ok(()),
        }
    }

    /// One poll of the repositories (poll mode; nothing in the others).
    pub async fn poll(&self) {
        if let Mode::Poll(poll) = &self.mode {
            poll.poll(&self.core).await;
        }
    }

    /// The model a request for `name` (and `version`) reaches. In on-demand
    /// mode a model that is not resident is loaded first; the request waits
    /// at most `--model-load-timeout-secs` (the load itself goes on).
    ///
    /// # Errors
    /// As [`Registry::resolve`]; in on-demand mode also
    /// [`Error::Unavailable`] when the model cannot be loaded (its reason),
    /// does not fit the budget, or takes longer than the timeout.
    pub async fn resolve(&self, name: &str, version: Option<u64>) -> Result<Arc<Model>, Error> {
        match &self.mode {
            Mode::OnDemand => on_demand::resolve(&self.core, name, version).await,
            _ => self.core.registry.resolve(name, version),
        }
    }

    /// Loads `name` (the versions its policy selects), or reloads what
    /// changed (the repository extension's `load`), with the request's
    /// `config` override and `file:` files, if any.
    ///
    /// # Errors
    /// [`LoadError::NotAllowed`] in a mode without explicit loads;
    /// [`LoadError::Invalid`] for no such model folder, malformed files, a
    /// `rollout` plan that does not parse, or one that cannot start once
    /// loaded;
    /// [`LoadError::Failed`] or [`LoadError::NoRoom`] with every failure's reason. Each message
    /// starts `failed to load 'NAME'`. Versions serving before keep serving.
    pub async fn load(&self, name: &str, request: LoadRequest) -> Result<(), LoadError> {
        self.explicit_mode()?;
        // A plan that does not parse refuses the load before it starts.
        let plan = request.rollout.as_deref().map(|json| Plan::parse(json.as_bytes())).transpose();
        let plan = plan.map_err(|e| LoadError::Invalid(format!("failed to load '{name}': {e}")))?;
        self.core.load(name, request).await.map_err(|e| e.map_message(|m| format!("failed to load '{name}': {m}")))?;
        if let Some(plan) = plan {
            self.core
                .start_rollout(name, plan)
                .map_err(|e| LoadError::Invalid(format!("loaded '{name}', but no rollout started: {e}")))?;
        }
        Ok(())
    }

    /// Unloads every version of `name` (the repository extension's
    /// `unload`). Requests already accepted finish; later ones get 503.
    /// With `unload_dependents`, the READY ensembles that run `name` go too,
    /// and, when `name` is an ensemble, the models of its steps that no
    /// other READY ensemble runs.
    ///
    /// # Errors
    /// [`Error::Unavailable`] (HTTP 503, gRPC UNAVAILABLE) in a mode without
    /// explicit loads; [`Error::NotFound`] when no such model is known.
    pub async fn unload(&self, name: &str, unload_dependents: bool) -> Result<(), Error> {
        self.explicit_mode()?;
        let steps = if unload_dependents { ensemble::steps(&self.core.registry, name) } else { Vec::new() };
        self.core.unload(name).await?;
        if unload_dependents {
            for user in ensemble::users(&self.core.registry, name) {
                Box::pin(self.unload(&user, true)).await?;
            }
            for step in steps {
                if ensemble::users(&self.core.registry, &step).is_empty() {
                    Box::pin(self.unload(&step, true)).await?;
                }
            }
        }
        Ok(())
    }

    /// ModelMesh's operations, in modelmesh mode.
    pub fn modelmesh(&self) -> Option<Mesh<'_>> {
        match &self.mode {
            Mode::ModelMesh(state) => Some(Mesh { core: &self.core, state }),
            _ => None,
        }
    }

    /// Load and unload are allowed in explicit and on_demand mode only. The
    /// refusal begins with Triton's text, which clients match on.
    fn explicit_mode(&self) -> Result<(), LoadError> {
        const REFUSED: &str = "explicit model load / unload is not allowed if polling is enabled";
        match self.mode() {
            ControlMode::Explicit | ControlMode::OnDemand => Ok(()),
            ControlMode::ModelMesh => Err(LoadError::NotAllowed(format!(
                "{REFUSED}: in model control mode 'modelmesh' ModelMesh loads and unloads models (mmesh.ModelRuntime)"
            ))),
            mode => Err(LoadError::NotAllowed(format!(
                "{REFUSED}: the model control mode is '{mode}'; start with --model-control-mode=explicit"
            ))),
        }
    }
}

//! Rollouts through the lifecycle: starting one checks both versions are
//! READY (a load starts the one a model declares in `config.pbtxt` for a
//! new version), requests that name no version are routed by it, and what
//! it decides is carried out (a rolled-back candidate is marked with the
//! reason; a promoted one stays the only version).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::Lifecycle;
use super::core::Core;
use crate::error::Error;
use crate::model::{Model, OutputRequest};
use crate::plugin::{CallContext, ModelRunner, RawRequest, RawResponse};
use crate::rollout::{Plan, RolloutStatus, ShadowTicket, Transition, compare};
use crate::scheduler::policy::RequestOptions;
use crate::scheduler::sequence::SequenceRequest;
use crate::tensor::Tensor;

impl Core {
    /// Starts a rollout of `name` to `plan.candidate` from `plan.serving`
    /// (by default the highest READY version below the candidate),
    /// replacing any earlier rollout of the model.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown model; [`Error::InvalidArgument`]
    /// when the candidate or the serving version is not READY, there is no
    /// READY version below the candidate to serve meanwhile.
    pub(super) fn start_rollout(&self, name: &str, plan: Plan) -> Result<RolloutStatus, Error> {
        let registry = &self.registry;
        let ready = registry.ready_versions(name);
        if ready.is_empty() {
            registry.resolve(name, None)?;
        }
        let not_ready = |role: &str, v: u64| {
            Error::InvalidArgument(format!(
                "rollout of '{name}': the {role} version {v} is not READY (READY versions: {ready:?}); load it first, \
                 with a version_policy that selects both versions"
            ))
        };
        if !ready.contains(&plan.candidate) {
            return Err(not_ready("candidate", plan.candidate));
        }
        let serving = match plan.serving {
            Some(v) if ready.contains(&v) => v,
            Some(v) => return Err(not_ready("serving", v)),
            None => ready.iter().copied().filter(|v| *v < plan.candidate).max().ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "rollout of '{name}': no READY version below candidate {} to serve meanwhile (READY versions: \
                     {ready:?}); name one as 'serving'",
                    plan.candidate
                ))
            })?,
        };
        let status = self.rollouts.start(name, plan, serving);
        tracing::info!(model = %name, serving, candidate = status.candidate, percent = status.percent,
            "rollout started");
        Ok(status)
    }

    /// The READY version of `name` that answers the requests naming no
    /// version, as far as a new version rolling out from it goes: its
    /// rollout's (see [`crate::rollout::Rollouts::answering`]), else its
    /// highest READY one.
    pub(super) fn answering(&self, name: &str) -> Option<u64> {
        match self.rollouts.answering(name).filter(|v| self.registry.is_ready(name, *v)) {
            Some(v) => Some(v),
            None => Some(self.registry.resolve(name, None).ok()?.version),
        }
    }

    /// Ends `name`'s rollout in progress once one of its two versions is
    /// no longer READY (its folder removed, its declaration gone), so that
    /// its status says what happened; requests that name no version go
    /// to the version left.
    pub(super) fn end_rollout_without_versions(&self, name: &str) {
        let Some(status) = self.rollouts.status(name) else { return };
        let gone = [("serving", status.serving), ("candidate", status.candidate)]
            .into_iter()
            .find(|(_, v)| !self.registry.is_ready(name, *v));
        if let Some((role, version)) = gone {
            let reason = format!("the {role} version {version} was unloaded");
            if self.rollouts.cancel(name, &reason).is_some() {
                tracing::warn!(model = %name, version, "rollout ended: {reason}");
            }
        }
    }

    /// Rolls `candidate`, a version a load just made READY, out from
    /// `serving`, as the model's declared `plan` says. A rollout that
    /// cannot start (the serving version went meanwhile) leaves the new
    /// version to replace the old one as usual, with a warning.
    pub(super) fn roll_out_new_version(&self, name: &str, plan: &str, candidate: u64, serving: u64) {
        let started = Plan::declared(plan, candidate, serving)
            .map_err(Error::InvalidArgument)
            .and_then(|plan| self.start_rollout(name, plan));
        if let Err(e) = started {
            tracing::warn!(model = %name, version = candidate, "the rollout config.pbtxt declares did not start: {e}");
        }
    }
}

impl Lifecycle {
    /// Starts a rollout of `name` with the JSON `plan` (`docs/rollouts.md`):
    /// to `plan.candidate` from `plan.serving` (by default the highest
    /// READY version below the candidate), replacing any earlier rollout
    /// of the model.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a plan that does not parse, a
    /// candidate or serving version that is not READY, or no READY version
    /// below the candidate to serve meanwhile; [`Error::NotFound`] for an
    /// unknown model.
    pub fn start_rollout(&self, name: &str, plan: &[u8]) -> Result<RolloutStatus, Error> {
        let plan = Plan::parse(plan).map_err(Error::InvalidArgument)?;
        self.core.start_rollout(name, plan)
    }

    /// Stops `name`'s rollout in canary: the serving version takes every
    /// request back, and the candidate is marked cancelled.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the model has no rollout in canary.
    pub fn cancel_rollout(&self, name: &str) -> Result<RolloutStatus, Error> {
        let transition = self
            .core
            .rollouts
            .cancel(name, "cancelled through the API")
            .ok_or_else(|| Error::NotFound(format!("model '{name}' has no rollout in progress")))?;
        self.carry_out(name, transition);
        self.rollout(name)
    }

    /// `name`'s rollout, in progress or finished.
    ///
    /// # Errors
    /// [`Error::NotFound`] when it has none.
    pub fn rollout(&self, name: &str) -> Result<RolloutStatus, Error> {
        self.core.rollouts.status(name).ok_or_else(|| Error::NotFound(format!("model '{name}' has no rollout")))
    }

    /// Every model's rollout, by name.
    pub fn rollouts(&self) -> Vec<RolloutStatus> {
        self.core.rollouts.all()
    }

    /// The model a request for `name` reaches: with no `version`, the one
    /// its rollout picks (`header` looks up the request's sticky header),
    /// else as [`Lifecycle::resolve`].
    ///
    /// # Errors
    /// As [`Lifecycle::resolve`].
    pub async fn route(
        &self,
        name: &str,
        version: Option<u64>,
        header: &(dyn Fn(&str) -> Option<String> + Sync),
    ) -> Result<Arc<Model>, Error> {
        let routed = if version.is_none() { self.core.rollouts.route(name, header) } else { None };
        match routed {
            // A version the rollout picks that is no longer READY (unloaded
            // meanwhile) leaves the request to the usual choice.
            Some(v) => match self.resolve(name, Some(v)).await {
                Ok(model) => Ok(model),
                Err(_) => self.resolve(name, None).await,
            },
            None => self.resolve(name, version).await,
        }
    }

    /// The version of `model`'s rollout that a request of `sequence`
    /// reaches when it names no version (`named`): one version for the
    /// whole sequence, its id the sticky key. `model` itself for a request
    /// outside a sequence or naming a version, when no rollout decides
    /// otherwise, or when the version picked is no longer READY.
    pub async fn route_sequence(
        &self,
        model: Arc<Model>,
        named: Option<u64>,
        sequence: Option<&SequenceRequest>,
    ) -> Arc<Model> {
        let (Some(sequence), None) = (sequence, named) else { return model };
        match self.core.rollouts.route_by_key(&model.name, &sequence.id.to_string()) {
            Some(v) if v != model.version => self.resolve(&model.name, Some(v)).await.unwrap_or(model),
            _ => model,
        }
    }

    /// Counts an answer of `model` for its rollout: `failed` when it failed
    /// on the server's side; carries out what the rollout decides.
    pub fn observe(self: &Arc<Self>, model: &Model, latency: Duration, failed: bool) {
        if let Some(transition) = self.core.rollouts.observe(&model.name, model.version, latency, failed) {
            self.carry_out(&model.name, transition);
        }
    }

    /// Whether the request `model` is answering is also run on its
    /// rollout's candidate (in the shadow phase). A ticket given must go
    /// back: to [`Lifecycle::shadow_infer`] or [`Lifecycle::shadow_predict`]
    /// with the serving version's answer, or to
    /// [`Lifecycle::release_shadow`] when there is none.
    pub fn shadow_ticket(&self, model: &Model) -> Option<ShadowTicket> {
        self.core.rollouts.shadow_ticket(&model.name, model.version)
    }

    /// Lets go of a shadow ticket whose request failed on the serving
    /// version.
    pub fn release_shadow(&self, ticket: &ShadowTicket) {
        self.core.rollouts.release(ticket);
    }

    /// Runs the request of `ticket` (`inputs`, `requested`) on the
    /// candidate on a task of its own, after the serving version answered
    /// `answer`, and counts whether the answers agree. Its answer goes
    /// nowhere else.
    pub fn shadow_infer(
        self: &Arc<Self>,
        ticket: ShadowTicket,
        inputs: Vec<Tensor>,
        requested: Vec<OutputRequest>,
        answer: Vec<Tensor>,
    ) {
        let plan = ticket.plan.clone();
        self.shadow_on_candidate(ticket, move |candidate, lifecycle| async move {
            let runner: Arc<dyn ModelRunner> = lifecycle;
            let (outputs, _) = candidate.infer(inputs, &requested, RequestOptions::default(), &runner).await?;
            Ok(compare::tensors(&answer, &outputs, &plan))
        });
    }

    /// As [`Lifecycle::shadow_infer`], for a `/predict` request through the
    /// model's plugin: the raw answers must be the same.
    pub fn shadow_predict(self: &Arc<Self>, ticket: ShadowTicket, request: RawRequest, answer: RawResponse) {
        self.shadow_on_candidate(ticket, move |candidate, lifecycle| async move {
            let context = CallContext { runner: lifecycle, chain: Vec::new(), sequence: None, trace: None };
            let (got, _) = candidate.predict_within(request, context).await?;
            Ok(compare::raw((&answer.content_type, &answer.body), (&got.content_type, &got.body)))
        });
    }

    /// Runs `run` on the candidate `ticket` names, on a task of its own, and
    /// counts its comparison: `Ok(agreement)` from `run`, or a failure of
    /// the candidate (its error, or its not being READY) as a difference.
    fn shadow_on_candidate<F, Fut>(self: &Arc<Self>, ticket: ShadowTicket, run: F)
    where
        F: FnOnce(Arc<Model>, Arc<Lifecycle>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Result<(), String>, Error>> + Send,
    {
        let lifecycle = self.clone();
        tokio::spawn(async move {
            let outcome = match lifecycle.candidate_of(&ticket) {
                Err(e) => Err(e),
                Ok(candidate) => {
                    run(candidate, lifecycle.clone()).await.unwrap_or_else(|e| Err(format!("failed: {e}")))
                }
            };
            lifecycle.shadowed(&ticket, outcome);
        });
    }

    fn candidate_of(&self, ticket: &ShadowTicket) -> Result<Arc<Model>, String> {
        self.core
            .registry
            .resolve(&ticket.model, Some(ticket.candidate))
            .map_err(|e| format!("version {} cannot run it: {e}", ticket.candidate))
    }

    fn shadowed(&self, ticket: &ShadowTicket, outcome: Result<(), String>) {
        if let Some(transition) = self.core.rollouts.shadowed(ticket, outcome) {
            self.carry_out(&ticket.model, transition);
        }
    }

    fn carry_out(&self, name: &str, transition: Transition) {
        match transition {
            Transition::Advanced { step, percent } => {
                tracing::info!(model = %name, step, percent, "rollout: next step");
                // The first canary step after a shadow phase the answers passed.
            }
            Transition::RolledBack { candidate, reason } => {
                tracing::warn!(model = %name, version = candidate, "rollout rolled back: {reason}");
                // The candidate stays loaded for requests that name it, and
                // says why it takes no other traffic.
                self.core.registry.set_failed(name, candidate, &format!("rolled back: {reason}"));
            }
            Transition::Promoted { candidate, serving } => {
                tracing::info!(model = %name, version = candidate, replaced = serving, "rollout promoted");
                let core = self.core.clone();
                let name = name.to_owned();
                tokio::spawn(async move { core.retire_version(&name, serving).await });
            }
        }
    }
}

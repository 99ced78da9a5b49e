//! Triton's rate limiter (`docs/user_guide/rate_limiter.md`; its
//! implementation is `src/rate_limiter.cc` in triton-inference-server/core):
//! one object shared by every model, through which, with
//! `--rate-limit=execution_count`, each instance's worker passes before an
//! execution. An instance with work stages itself; the staged instance
//! with the lowest *scaled priority* (its executions so far times its
//! group's `rate_limiter.priority`, 0 counting as 1; ties in staging order)
//! runs next, as soon as the resources its group lists are free, and holds
//! them until its execution ends. Only that instance may take resources:
//! the others wait behind it even when theirs are free, as in Triton. So
//! of two instances that compete for one resource, one of priority 1 runs
//! twice for each run of one of priority 2.
//!
//! An instance whose group lists no resources is not limited at all (as
//! Triton's model configuration documents): it runs as soon as it has work,
//! whatever its priority.
//!
//! With `--rate-limit=off` (the default, as in Triton) there is no limiter
//! and the configurations' `rate_limiter` settings are not applied.

mod resources;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

pub use resources::{Device, Needs, ResourceCount, Scope};

/// `--rate-limit`: whether executions wait for the rate limiter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum Mode {
    /// No rate limiting: an instance runs as soon as it has work (Triton's default).
    #[default]
    Off,
    /// Triton's `execution_count`: resources and priorities decide which
    /// instance runs next.
    ExecutionCount,
}

/// What one model instance asks of the rate limiter: its device and its
/// group's `rate_limiter { resources [...] priority }`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceLimits {
    /// Where it runs (its per-device resources are that device's).
    pub device: Device,
    /// Each resource it holds while it executes: (name, global, count).
    pub resources: Vec<(String, bool, u32)>,
    /// Its `priority`; 0 counts as 1. Higher runs less often.
    pub priority: u32,
}

impl InstanceLimits {
    /// Whether it passes through the rate limiter: its group lists at least
    /// one resource.
    pub fn limited(&self) -> bool {
        !self.resources.is_empty()
    }

    /// The resources it needs, by scope.
    fn needs(&self) -> Needs {
        let mut needs = Needs::new();
        for (name, global, count) in &self.resources {
            let scope = if *global { Scope::Global } else { Scope::Device(self.device) };
            *needs.entry((scope, name.clone())).or_default() += count;
        }
        needs
    }
}

/// The rate limiter shared by every model of the server.
pub struct RateLimiter {
    /// `--rate-limit-resource`: the copies given explicitly.
    explicit: Vec<ResourceCount>,
    state: Mutex<State>,
    /// Wakes the staged instances: resources were freed or the first
    /// staged instance changed.
    turn: Condvar,
}

struct Instance {
    needs: Needs,
    /// Its priority, at least 1.
    priority: u64,
    /// Executions it ran (Triton's `exec_count`).
    executions: u64,
}

/// Staged instances in the order they run: scaled priority, then staging order.
type Stage = (u128, u64, u64);

#[derive(Default)]
struct State {
    instances: HashMap<u64, Instance>,
    /// The copies of each resource.
    available: Needs,
    /// The copies held by executions now.
    in_use: Needs,
    staged: BTreeSet<Stage>,
    /// The next instance id and staging number.
    next: u64,
}

impl State {
    /// Recomputes the copies available from the instances registered.
    fn recompute(&mut self, explicit: &[ResourceCount]) -> Result<(), String> {
        self.available = resources::available(explicit, self.instances.values().map(|i| &i.needs))?;
        Ok(())
    }

    /// Whether instance `id`'s resources are free now.
    fn fits(&self, id: u64) -> bool {
        self.instances[&id].needs.iter().all(|(key, &n)| {
            let held = self.in_use.get(key).copied().unwrap_or(0);
            held + n <= self.available.get(key).copied().unwrap_or(0)
        })
    }

    fn take(&mut self, id: u64) {
        for (key, &n) in &self.instances[&id].needs {
            *self.in_use.entry(key.clone()).or_default() += n;
        }
    }

    fn give_back(&mut self, id: u64) {
        let Some(instance) = self.instances.get_mut(&id) else { return };
        instance.executions += 1;
        for (key, &n) in &instance.needs {
            if let Some(held) = self.in_use.get_mut(key) {
                *held = held.saturating_sub(n);
            }
        }
    }
}

impl RateLimiter {
    /// A rate limiter with the copies `explicit` gives
    /// (`--rate-limit-resource`; none: the most any instance needs).
    pub fn new(explicit: Vec<ResourceCount>) -> Arc<RateLimiter> {
        Arc::new(RateLimiter { explicit, state: Mutex::new(State::default()), turn: Condvar::new() })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Registers the instances of one model version, in order: the
    /// executions of those that list resources then wait for their turn
    /// ([`work`]); dropping the registration (the version unloads) removes
    /// them.
    ///
    /// # Errors
    /// Triton's texts (see [`resources::available`]) when the resources
    /// cannot serve the instances; nothing is registered then.
    pub fn register(self: &Arc<Self>, instances: &[InstanceLimits]) -> Result<Registration, String> {
        let mut state = self.lock();
        let mut ids = Vec::with_capacity(instances.len());
        for limits in instances {
            if !limits.limited() {
                ids.push(None);
                continue;
            }
            let id = state.next;
            state.next += 1;
            let instance =
                Instance { needs: limits.needs(), priority: u64::from(limits.priority.max(1)), executions: 0 };
            state.instances.insert(id, instance);
            ids.push(Some(id));
        }
        if let Err(e) = state.recompute(&self.explicit) {
            for id in ids.iter().flatten() {
                state.instances.remove(id);
            }
            let _ = state.recompute(&self.explicit);
            return Err(e);
        }
        drop(state);
        self.turn.notify_all();
        Ok(Registration { limiter: self.clone(), ids })
    }

    /// Stages instance `id`: it has work and waits for its turn.
    fn stage(state: &mut State, id: u64) -> Stage {
        let order = state.next;
        state.next += 1;
        let instance = &state.instances[&id];
        let stage = (u128::from(instance.executions) * u128::from(instance.priority), order, id);
        state.staged.insert(stage);
        stage
    }

    /// Waits until `stage` is the first staged and its instance's
    /// resources are free, then takes them.
    fn wait(&self, stage: Stage) {
        let id = stage.2;
        let mut state = self.lock();
        while state.staged.first() != Some(&stage) || !state.fits(id) {
            self.turn.wait(&mut state);
        }
        state.staged.remove(&stage);
        state.take(id);
        drop(state);
        // The next staged instance may fit too.
        self.turn.notify_all();
    }

    /// The copies of each resource, as the instances registered now make them.
    #[cfg(test)]
    pub fn available(&self) -> Needs {
        self.lock().available.clone()
    }
}

/// One model version's instances in the rate limiter, removed when dropped.
pub struct Registration {
    limiter: Arc<RateLimiter>,
    /// The limiter's id of each instance, in the model's order; `None` for
    /// one that lists no resources (never limited).
    ids: Vec<Option<u64>>,
}

impl Registration {
    /// Whether instance `i` of the model waits for its turn.
    pub fn limits(&self, i: usize) -> bool {
        self.ids.get(i).is_some_and(Option::is_some)
    }

    /// Stages instance `i` of the model: it has work, and waits for its
    /// turn with [`Staged::wait`].
    ///
    /// # Panics
    /// If instance `i` is not limited ([`Registration::limits`]).
    pub fn stage(&self, i: usize) -> Staged {
        let id = self.ids[i].expect("only a limited instance is staged");
        let stage = RateLimiter::stage(&mut self.limiter.lock(), id);
        Staged { limiter: self.limiter.clone(), stage: Some(stage) }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut state = self.limiter.lock();
        for id in self.ids.iter().flatten() {
            state.instances.remove(id);
        }
        state.staged.retain(|(_, _, id)| !self.ids.contains(&Some(*id)));
        // Fewer instances never need more copies than before.
        let _ = state.recompute(&self.limiter.explicit);
        drop(state);
        self.limiter.turn.notify_all();
    }
}

/// An instance staged for its turn; dropped without waiting, it leaves
/// the stage.
pub struct Staged {
    limiter: Arc<RateLimiter>,
    /// Taken by [`Staged::wait`].
    stage: Option<Stage>,
}

impl Staged {
    /// Blocks until it is the instance's turn and its resources are free;
    /// they are held until the grant is dropped.
    pub fn wait(mut self) -> Grant {
        let stage = self.stage.take().expect("waited once");
        self.limiter.wait(stage);
        Grant { limiter: self.limiter.clone(), id: Some(stage.2) }
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(stage) = self.stage.take() {
            self.limiter.lock().staged.remove(&stage);
            self.limiter.turn.notify_all();
        }
    }
}

/// An instance's hold on its resources during one execution; dropped, it
/// gives them back and counts the execution.
pub struct Grant {
    limiter: Arc<RateLimiter>,
    /// Taken by [`Grant::then_stage`].
    id: Option<u64>,
}

impl Grant {
    /// Gives the resources back, counts the execution and stages the
    /// instance again, at once (as Triton does when the instance still has
    /// work): no other instance can take its turn in between.
    pub fn then_stage(mut self) -> Staged {
        let id = self.id.take().expect("staged once");
        let stage = {
            let mut state = self.limiter.lock();
            state.give_back(id);
            RateLimiter::stage(&mut state, id)
        };
        self.limiter.turn.notify_all();
        Staged { limiter: self.limiter.clone(), stage: Some(stage) }
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.limiter.lock().give_back(id);
            self.limiter.turn.notify_all();
        }
    }
}

/// An instance's worker loop through the rate limiter: takes work with
/// `next` (blocking; `None` ends the loop), waits for its turn, runs it
/// with `run` (given how long it waited) and, while `try_next` finds more
/// work at once, stays staged from the end of one execution to the next.
/// Without `turns` (no rate limiter), or for an instance that lists no
/// resources, it runs each piece of work at once.
pub fn work<B>(
    turns: Option<(&Registration, usize)>,
    mut next: impl FnMut() -> Option<B>,
    mut try_next: impl FnMut() -> Option<B>,
    mut run: impl FnMut(B, Duration),
) {
    let Some((registration, i)) = turns.filter(|(r, i)| r.limits(*i)) else {
        while let Some(work) = next() {
            run(work, Duration::ZERO);
        }
        return;
    };
    let mut held: Option<(B, Staged)> = None;
    loop {
        let (work, staged) = match held.take() {
            Some(held) => held,
            None => match next() {
                Some(work) => (work, registration.stage(i)),
                None => return,
            },
        };
        let started = Instant::now();
        let grant = staged.wait();
        run(work, started.elapsed());
        // More work at once: stay staged; else the grant's drop gives the
        // resources back.
        held = try_next().map(|work| (work, grant.then_stage()));
    }
}

#[cfg(test)]
mod tests;

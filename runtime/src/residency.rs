//! Which models are in memory, how many bytes each holds on the host and on
//! each GPU, which are pinned, and which to evict when a budget would be
//! exceeded: least recently used first, never a pinned model, a busy one
//! only when no idle one is left, and for a GPU's budget only models that
//! hold memory on that GPU. Where another system decides placement
//! (ModelMesh), or the operator does (explicit, poll and none modes, where
//! only a GPU budget applies), nothing is chosen and a model that does not
//! fit is refused ([`Admission`]).
//!
//! This module keeps the accounting and makes the choices; `lifecycle`
//! carries them out.

use std::collections::{BTreeMap, HashMap, HashSet};

use lru::LruCache;
use parking_lot::Mutex;

/// Limits on what may be resident at once.
#[derive(Clone, Debug, Default)]
pub struct Budget {
    /// Host memory for all resident models, in bytes (`--model-memory-budget`).
    pub bytes: Option<u64>,
    /// Number of resident models (`--max-loaded-models`).
    pub models: Option<usize>,
    /// Device memory for all resident models, in bytes, by GPU index
    /// (`--model-load-gpu-limit`); a GPU without an entry is not limited.
    pub gpu: BTreeMap<u32, u64>,
}

/// What a resident model holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Host memory, in bytes.
    pub host: u64,
    /// Device memory, in bytes, by GPU index; no entry for a GPU it does not use.
    pub devices: BTreeMap<u32, u64>,
}

impl Footprint {
    /// A footprint of `bytes` of host memory and nothing on a GPU.
    pub fn host(bytes: u64) -> Footprint {
        Footprint { host: bytes, devices: BTreeMap::new() }
    }

    /// Adds `other` to this one.
    pub fn add(&mut self, other: &Footprint) {
        self.host += other.host;
        for (&device, &bytes) in &other.devices {
            *self.devices.entry(device).or_default() += bytes;
        }
    }

    /// Takes `other` away from this one (never below zero).
    fn subtract(&mut self, other: &Footprint) {
        self.host = self.host.saturating_sub(other.host);
        for (device, bytes) in &other.devices {
            if let Some(held) = self.devices.get_mut(device) {
                *held = held.saturating_sub(*bytes);
            }
        }
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.host == 0 && self.devices.values().all(|&b| b == 0)
    }
}

impl std::fmt::Display for Footprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&human(self.host))?;
        for (device, bytes) in &self.devices {
            write!(f, " + {} on GPU {device}", human(*bytes))?;
        }
        Ok(())
    }
}

/// What happens when a model needs more room than the budget has free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// The least recently used models leave (on-demand mode).
    EvictLeastRecentlyUsed,
    /// The model is refused; nothing leaves (modelmesh mode, where
    /// ModelMesh evicts across pods).
    RefuseWhenFull,
}

/// The accounted footprint of each loaded version of a model, by version.
pub type Versions = BTreeMap<u64, Footprint>;

#[derive(Clone, Debug, PartialEq, Eq)]
struct Resident {
    /// Accounted footprint of each of its loaded versions.
    versions: Versions,
    /// Never evicted (loaded by `--load-model`, or `pinned` in its config).
    pinned: bool,
}

impl Resident {
    /// What its versions hold together.
    fn footprint(&self) -> Footprint {
        total(&self.versions)
    }
}

/// What `versions` hold together.
pub fn total(versions: &Versions) -> Footprint {
    let mut total = Footprint::default();
    for footprint in versions.values() {
        total.add(footprint);
    }
    total
}

#[derive(Default)]
struct State {
    /// Resident models, most recently used first. Unbounded: the byte
    /// budget, not the entry count, decides what leaves.
    lru: Option<LruCache<String, Resident>>,
    /// The last accounted footprint of every model ever loaded, resident or
    /// not: the size to make room for before loading it again.
    footprints: HashMap<String, Footprint>,
    /// Models never evicted whatever their configuration says
    /// (`--load-model` in on-demand mode).
    pinned: HashSet<String>,
}

impl State {
    fn lru(&mut self) -> &mut LruCache<String, Resident> {
        self.lru.get_or_insert_with(LruCache::unbounded)
    }
}

pub struct Residency {
    budget: Budget,
    admission: Admission,
    state: Mutex<State>,
}

impl Residency {
    /// A manager for `budget` that makes room as `admission` says.
    pub fn new(budget: Budget, admission: Admission) -> Residency {
        Residency { budget, admission, state: Mutex::default() }
    }

    /// Whether the residency's lock can be taken within `wait`
    /// (readiness: a lock held that long means requests are stuck).
    pub fn responsive(&self, wait: std::time::Duration) -> bool {
        self.state.try_lock_for(wait).is_some()
    }

    /// Pins `name`: it is never evicted.
    pub fn pin(&self, name: &str) {
        self.state.lock().pinned.insert(name.to_owned());
    }

    /// Whether `name` was pinned with [`Residency::pin`].
    pub fn is_pinned(&self, name: &str) -> bool {
        self.state.lock().pinned.contains(name)
    }

    /// Room for `need` for `name`: the models to evict for it (none under
    /// [`Admission::RefuseWhenFull`]), chosen as [`Residency::victims`]
    /// chooses; `busy` tells which models have requests in flight.
    ///
    /// # Errors
    /// A message with both sizes when `need` exceeds a whole budget
    /// (nothing is evicted), when pinned models leave too little room even
    /// with every other one evicted, or, under
    /// [`Admission::RefuseWhenFull`], the room that is left.
    pub fn make_room(&self, name: &str, need: &Footprint, busy: impl Fn(&str) -> bool) -> Result<Vec<String>, String> {
        self.check_fits(name, need)?;
        match self.admission {
            Admission::EvictLeastRecentlyUsed => {
                let victims = self.victims(name, need, busy);
                self.check_pinned(name, need, &victims)?;
                Ok(victims)
            }
            Admission::RefuseWhenFull => self.check_free(name, need).map(|()| Vec::new()),
        }
    }

    /// Whether `need` for `name` fits every budget once `victims` are
    /// gone. [`Residency::victims`] falls short only when what is left is
    /// pinned (or frees nothing an exceeded budget counts).
    ///
    /// # Errors
    /// A message naming the flag whose budget the pinned models fill.
    fn check_pinned(&self, name: &str, need: &Footprint, victims: &[String]) -> Result<(), String> {
        let (mut total, mut count) = (need.clone(), 1);
        {
            let mut state = self.state.lock();
            for (_, resident) in state.lru().iter().filter(|(n, _)| *n != name && !victims.contains(n)) {
                total.add(&resident.footprint());
                count += 1;
            }
        }
        let held = |bytes: u64, own: u64| human(bytes.saturating_sub(own));
        match (self.exceeded(&total).first(), self.budget.models) {
            (Some(None), _) => Err(format!(
                "model '{name}' needs {} but pinned models hold {} of the {} --model-memory-budget",
                human(need.host),
                held(total.host, need.host),
                human(self.budget.bytes.unwrap_or(0))
            )),
            (Some(&Some(device)), _) => {
                let wanted = need.devices.get(&device).copied().unwrap_or(0);
                Err(format!(
                    "model '{name}' needs {} on GPU {device} but pinned models hold {} of the {} \
                     --model-load-gpu-limit there",
                    human(wanted),
                    held(total.devices.get(&device).copied().unwrap_or(0), wanted),
                    human(self.budget.gpu.get(&device).copied().unwrap_or(0))
                ))
            }
            (None, Some(models)) if count > models => Err(format!(
                "model '{name}' cannot load: the {} resident models are pinned and --max-loaded-models is {models}",
                count - 1
            )),
            _ => Ok(()),
        }
    }

    /// Records a use of `name`: it becomes the most recently used.
    pub fn touch(&self, name: &str) {
        self.state.lock().lru().promote(name);
    }

    /// The footprint measured the last time `name` was loaded, if ever.
    pub fn known_footprint(&self, name: &str) -> Option<Footprint> {
        self.state.lock().footprints.get(name).cloned()
    }

    /// The footprint of each version of `name` while it is resident; none
    /// when it is not.
    pub fn versions(&self, name: &str) -> Versions {
        self.state.lock().lru().peek(name).map(|r| r.versions.clone()).unwrap_or_default()
    }

    /// What `name` holds while resident (nothing when it is not).
    pub fn held(&self, name: &str) -> Footprint {
        self.state.lock().lru().peek(name).map(Resident::footprint).unwrap_or_default()
    }

    /// The host memory `version` of `name` holds while resident, in bytes
    /// (0 when it is not).
    pub fn host_bytes(&self, name: &str, version: u64) -> u64 {
        let mut state = self.state.lock();
        state.lru().peek(name).and_then(|r| r.versions.get(&version)).map_or(0, |f| f.host)
    }

    /// Whether `name` is resident and never evicted (pinned by its
    /// configuration or with [`Residency::pin`]).
    pub fn holds_pinned(&self, name: &str) -> bool {
        self.state.lock().lru().peek(name).is_some_and(|r| r.pinned)
    }

    /// What resident models hold, together.
    pub fn used(&self) -> Footprint {
        let mut state = self.state.lock();
        let mut used = Footprint::default();
        for (_, resident) in state.lru().iter() {
            used.add(&resident.footprint());
        }
        used
    }

    /// What resident models other than `name` hold, with `need` added.
    fn others_with(&self, name: &str, need: &Footprint) -> Footprint {
        let mut state = self.state.lock();
        let mut total = need.clone();
        for (_, resident) in state.lru().iter().filter(|(n, _)| n.as_str() != name) {
            total.add(&resident.footprint());
        }
        total
    }

    /// Each budget that `total` exceeds: `None` for the host's, else the GPU.
    fn exceeded(&self, total: &Footprint) -> Vec<Option<u32>> {
        let host = self.budget.bytes.is_some_and(|b| total.host > b).then_some(None);
        let devices = self.budget.gpu.iter().filter(|(d, limit)| total.devices.get(d).is_some_and(|b| b > limit));
        host.into_iter().chain(devices.map(|(d, _)| Some(*d))).collect()
    }

    /// Whether `need` can ever fit: a model larger than a whole budget is
    /// refused without evicting anything.
    ///
    /// # Errors
    /// A message with both sizes, naming the flag.
    pub fn check_fits(&self, name: &str, need: &Footprint) -> Result<(), String> {
        match self.exceeded(need).first() {
            None => Ok(()),
            Some(None) => Err(format!(
                "model '{name}' needs {} but the whole --model-memory-budget is {}",
                human(need.host),
                human(self.budget.bytes.unwrap_or(0))
            )),
            Some(Some(device)) => Err(format!(
                "model '{name}' needs {} on GPU {device} but --model-load-gpu-limit allows {} there",
                human(need.devices.get(device).copied().unwrap_or(0)),
                human(self.budget.gpu[device])
            )),
        }
    }

    /// Whether `need` for `name` fits beside the other resident models
    /// without evicting any (modelmesh mode, where ModelMesh evicts; the
    /// GPU budget where the operator decides what loads).
    ///
    /// # Errors
    /// A message with the size and the room left, naming the flag.
    pub fn check_free(&self, name: &str, need: &Footprint) -> Result<(), String> {
        let total = self.others_with(name, need);
        match self.exceeded(&total).first() {
            None => Ok(()),
            Some(None) => {
                let budget = self.budget.bytes.unwrap_or(0);
                Err(format!(
                    "model '{name}' needs {} but only {} of the {} --model-memory-budget is free",
                    human(need.host),
                    human(budget.saturating_sub(total.host - need.host)),
                    human(budget)
                ))
            }
            Some(Some(device)) => {
                let (limit, wanted) = (self.budget.gpu[device], need.devices.get(device).copied().unwrap_or(0));
                Err(format!(
                    "model '{name}' needs {} on GPU {device} but only {} of the {} --model-load-gpu-limit there is free",
                    human(wanted),
                    human(limit.saturating_sub(total.devices[device] - wanted)),
                    human(limit)
                ))
            }
        }
    }

    /// Whether `need`'s device memory fits beside the other resident
    /// models within `--model-load-gpu-limit` on each GPU `need` uses;
    /// other GPUs' budgets and the host's are not looked at.
    ///
    /// # Errors
    /// As [`Residency::check_free`], for the first GPU without room.
    pub fn check_free_on_gpus(&self, name: &str, need: &Footprint) -> Result<(), String> {
        let total = self.others_with(name, need);
        let Some((&device, &limit)) = self
            .budget
            .gpu
            .iter()
            .find(|(d, limit)| need.devices.contains_key(d) && total.devices.get(d).is_some_and(|b| b > limit))
        else {
            return Ok(());
        };
        let wanted = need.devices[&device];
        Err(format!(
            "model '{name}' needs {} on GPU {device} but only {} of the {} --model-load-gpu-limit there is free",
            human(wanted),
            human(limit.saturating_sub(total.devices[&device] - wanted)),
            human(limit)
        ))
    }

    /// The models to evict, least recently used first, so that `incoming`
    /// (not resident, or resident already) with `need` fits every budget.
    /// Pinned models are never chosen; `busy` ones only once no idle one is
    /// left; a model is chosen only if it frees memory that an exceeded
    /// budget counts (a GPU's budget evicts models on that GPU). May fall
    /// short when only pinned models remain.
    pub fn victims(&self, incoming: &str, need: &Footprint, busy: impl Fn(&str) -> bool) -> Vec<String> {
        let mut total = self.others_with(incoming, need);
        let others: Vec<(String, Resident)> = {
            let mut state = self.state.lock();
            state
                .lru()
                .iter()
                .rev()
                .filter(|(n, _)| n.as_str() != incoming)
                .map(|(n, r)| (n.clone(), r.clone()))
                .collect()
        };
        let mut count = others.len() + 1;
        let over_count = |count: usize| self.budget.models.is_some_and(|m| count > m);
        let (idle, busy): (Vec<_>, Vec<_>) =
            others.into_iter().filter(|(_, r)| !r.pinned).partition(|(n, _)| !busy(n.as_str()));
        let mut chosen = Vec::new();
        for (name, resident) in idle.into_iter().chain(busy) {
            let exceeded = self.exceeded(&total);
            if exceeded.is_empty() && !over_count(count) {
                break;
            }
            let footprint = resident.footprint();
            let frees = |budget: &Option<u32>| match budget {
                None => footprint.host > 0,
                Some(device) => footprint.devices.get(device).is_some_and(|&b| b > 0),
            };
            if !over_count(count) && !exceeded.iter().any(frees) {
                continue;
            }
            total.subtract(&footprint);
            count -= 1;
            chosen.push(name);
        }
        chosen
    }

    /// Records `name` as resident with the accounted footprints of its
    /// loaded versions, most recently used; pinned if `pinned` (its
    /// configuration says so) or it was pinned with [`Residency::pin`].
    pub fn admit(&self, name: &str, versions: Versions, pinned: bool) {
        let mut state = self.state.lock();
        let pinned = pinned || state.pinned.contains(name);
        state.footprints.insert(name.to_owned(), total(&versions));
        state.lru().put(name.to_owned(), Resident { versions, pinned });
    }

    /// Records that `name` left memory.
    pub fn remove(&self, name: &str) {
        self.state.lock().lru().pop(name);
    }
}

/// Bytes in MiB with one decimal, for messages.
pub fn human(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// The memory this process may use, in bytes: its cgroup's limit (v2
/// `memory.max`, or v1 `memory.limit_in_bytes`) where one is set, else the
/// machine's `MemTotal`.
pub fn memory_limit() -> u64 {
    let read = |path: &str| std::fs::read_to_string(path).ok()?.trim().parse::<u64>().ok();
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines().find_map(|l| l.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?.trim().parse().ok())
        })
        .map_or(u64::MAX, |kib: u64| kib * 1024);
    let cgroup = read("/sys/fs/cgroup/memory.max").or_else(|| read("/sys/fs/cgroup/memory/memory.limit_in_bytes"));
    // An unlimited v1 cgroup reads as a huge number, not "max".
    cgroup.map_or(total, |limit| limit.min(total))
}

#[cfg(test)]
mod tests;

//! Which models are in memory, how many bytes each holds, which are pinned,
//! and which to evict when a byte budget would be exceeded: least recently
//! used first, never a pinned model, and a busy one only when no idle one is
//! left. Where another system decides placement (ModelMesh), nothing is
//! chosen and a model that does not fit is refused ([`Admission`]).
//!
//! This module keeps the accounting and makes the choices; `lifecycle`
//! carries them out.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use lru::LruCache;

/// Limits on what may be resident at once.
#[derive(Clone, Copy, Debug, Default)]
pub struct Budget {
    /// Host memory for all resident models, in bytes (`--model-memory-budget`).
    pub bytes: Option<u64>,
    /// Number of resident models (`--max-loaded-models`).
    pub models: Option<usize>,
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

/// One resident model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resident {
    /// Accounted footprint of its loaded versions, in bytes.
    pub bytes: u64,
    /// Never evicted (loaded by `--load-model`, or `pinned` in its config).
    pub pinned: bool,
}

#[derive(Default)]
struct State {
    /// Resident models, most recently used first. Unbounded: the byte
    /// budget, not the entry count, decides what leaves.
    lru: Option<LruCache<String, Resident>>,
    /// The last accounted footprint of every model ever loaded, resident or
    /// not: the size to make room for before loading it again.
    footprints: HashMap<String, u64>,
    /// Models never evicted whatever their configuration says
    /// (`--load-model` in on-demand mode).
    pinned: HashSet<String>,
}

impl State {
    fn lru(&mut self) -> &mut LruCache<String, Resident> {
        self.lru.get_or_insert_with(LruCache::unbounded)
    }
}

/// The residency manager.
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

    /// The budget.
    pub fn budget(&self) -> Budget {
        self.budget
    }

    /// Pins `name`: it is never evicted.
    pub fn pin(&self, name: &str) {
        self.state.lock().expect("residency lock").pinned.insert(name.to_owned());
    }

    /// Whether `name` was pinned with [`Residency::pin`].
    pub fn is_pinned(&self, name: &str) -> bool {
        self.state.lock().expect("residency lock").pinned.contains(name)
    }

    /// Room for `need` more bytes for `name`: the models to evict for it
    /// (none under [`Admission::RefuseWhenFull`]), chosen as
    /// [`Residency::victims`] chooses; `busy` tells which models have
    /// requests in flight.
    ///
    /// # Errors
    /// A message with both sizes when `need` exceeds the whole budget
    /// (nothing is evicted), or, under [`Admission::RefuseWhenFull`], the
    /// room that is left.
    pub fn make_room(&self, name: &str, need: u64, busy: impl Fn(&str) -> bool) -> Result<Vec<String>, String> {
        self.check_fits(name, need)?;
        match self.admission {
            Admission::EvictLeastRecentlyUsed => Ok(self.victims(name, need, busy)),
            Admission::RefuseWhenFull => self.check_free(name, need).map(|()| Vec::new()),
        }
    }

    /// Records a use of `name`: it becomes the most recently used.
    pub fn touch(&self, name: &str) {
        self.state.lock().expect("residency lock").lru().promote(name);
    }

    /// The footprint measured the last time `name` was loaded, if ever.
    pub fn known_footprint(&self, name: &str) -> Option<u64> {
        self.state.lock().expect("residency lock").footprints.get(name).copied()
    }

    /// Bytes held by resident models.
    pub fn used(&self) -> u64 {
        let mut state = self.state.lock().expect("residency lock");
        state.lru().iter().map(|(_, r)| r.bytes).sum()
    }

    /// Whether `bytes` can ever fit: a model larger than the whole budget is
    /// refused without evicting anything.
    ///
    /// # Errors
    /// A message with both sizes.
    pub fn check_fits(&self, name: &str, bytes: u64) -> Result<(), String> {
        match self.budget.bytes {
            Some(budget) if bytes > budget => Err(format!(
                "model '{name}' needs {} but the whole --model-memory-budget is {}",
                human(bytes),
                human(budget)
            )),
            _ => Ok(()),
        }
    }

    /// Whether `bytes` for `name` fit beside the other resident models
    /// without evicting any (modelmesh mode, where ModelMesh evicts).
    ///
    /// # Errors
    /// A message with the size and the room left.
    pub fn check_free(&self, name: &str, bytes: u64) -> Result<(), String> {
        let Some(budget) = self.budget.bytes else { return Ok(()) };
        let mut state = self.state.lock().expect("residency lock");
        let others: u64 = state.lru().iter().filter(|(n, _)| n.as_str() != name).map(|(_, r)| r.bytes).sum();
        if others + bytes <= budget {
            return Ok(());
        }
        Err(format!(
            "model '{name}' needs {} but only {} of the {} --model-memory-budget is free",
            human(bytes),
            human(budget.saturating_sub(others)),
            human(budget)
        ))
    }

    /// The models to evict, least recently used first, so that `incoming`
    /// (not resident, or resident already) with `bytes` fits both budgets.
    /// Pinned models are never chosen; `busy` ones only once no idle one is
    /// left. May fall short when only pinned models remain.
    pub fn victims(&self, incoming: &str, bytes: u64, busy: impl Fn(&str) -> bool) -> Vec<String> {
        let mut state = self.state.lock().expect("residency lock");
        let lru = state.lru();
        let others: Vec<(String, Resident)> =
            lru.iter().rev().filter(|(n, _)| n.as_str() != incoming).map(|(n, r)| (n.clone(), *r)).collect();
        let mut used: u64 = others.iter().map(|(_, r)| r.bytes).sum::<u64>() + bytes;
        let mut count = others.len() + 1;
        let over = |used: u64, count: usize| {
            self.budget.bytes.is_some_and(|b| used > b) || self.budget.models.is_some_and(|m| count > m)
        };
        let (idle, busy): (Vec<_>, Vec<_>) =
            others.into_iter().filter(|(_, r)| !r.pinned).partition(|(n, _)| !busy(n.as_str()));
        let mut chosen = Vec::new();
        for (name, resident) in idle.into_iter().chain(busy) {
            if !over(used, count) {
                break;
            }
            used -= resident.bytes;
            count -= 1;
            chosen.push(name);
        }
        chosen
    }

    /// Records `name` as resident with its accounted footprint, most recently
    /// used; pinned if `pinned` (its configuration says so) or it was
    /// pinned with [`Residency::pin`].
    pub fn admit(&self, name: &str, bytes: u64, pinned: bool) {
        let mut state = self.state.lock().expect("residency lock");
        let pinned = pinned || state.pinned.contains(name);
        state.footprints.insert(name.to_owned(), bytes);
        state.lru().put(name.to_owned(), Resident { bytes, pinned });
    }

    /// Records that `name` left memory.
    pub fn remove(&self, name: &str) {
        self.state.lock().expect("residency lock").lru().pop(name);
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

/// Hands memory that freed allocations left in the C heap back to the
/// operating system, so an eviction lowers the process's resident size.
pub fn release_freed_memory() {
    // SAFETY: malloc_trim only walks glibc's own free lists.
    unsafe { libc::malloc_trim(0) };
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn manager(bytes: u64) -> Residency {
        Residency::new(Budget { bytes: Some(bytes), models: None }, Admission::EvictLeastRecentlyUsed)
    }

    #[test]
    fn the_least_recently_used_model_leaves_first() {
        let r = manager(25 * MIB);
        r.admit("a", 10 * MIB, false);
        r.admit("b", 10 * MIB, false);
        r.touch("a");
        assert_eq!(r.victims("c", 10 * MIB, |_| false), ["b"]);
        assert_eq!(r.victims("c", 4 * MIB, |_| false), Vec::<String>::new(), "it fits without evicting");
        assert_eq!(r.victims("c", 20 * MIB, |_| false), ["b", "a"]);
    }

    #[test]
    fn pinned_models_stay_and_busy_ones_go_last() {
        let r = manager(25 * MIB);
        r.admit("pinned", 10 * MIB, true);
        r.admit("busy", 5 * MIB, false);
        r.admit("idle", 5 * MIB, false);
        r.touch("busy");
        assert_eq!(r.victims("new", 10 * MIB, |n| n == "busy"), ["idle"]);
        assert_eq!(r.victims("new", 15 * MIB, |n| n == "busy"), ["idle", "busy"]);
        assert_eq!(r.victims("new", 20 * MIB, |_| false), ["idle", "busy"], "never the pinned one");
    }

    #[test]
    fn a_model_larger_than_the_budget_is_refused_and_the_count_limit_holds() {
        let r = manager(25 * MIB);
        assert!(r.check_fits("big", 30 * MIB).unwrap_err().contains("30.0 MiB"));
        let counted = Residency::new(Budget { bytes: None, models: Some(2) }, Admission::EvictLeastRecentlyUsed);
        counted.admit("a", 1, false);
        counted.admit("b", 1, false);
        assert_eq!(counted.victims("c", 1, |_| false), ["a"]);
        assert_eq!(counted.victims("b", 1, |_| false), Vec::<String>::new(), "a resident model needs no room");
    }

    #[test]
    fn check_free_counts_the_others_and_evicts_nothing() {
        let r = manager(25 * MIB);
        r.admit("a", 10 * MIB, false);
        r.admit("b", 10 * MIB, false);
        assert!(r.check_free("c", 5 * MIB).is_ok());
        assert!(r.check_free("c", 6 * MIB).unwrap_err().contains("only 5.0 MiB of the 25.0 MiB"));
        assert!(r.check_free("b", 15 * MIB).is_ok(), "its own bytes are not counted twice");
        assert_eq!(r.used(), 20 * MIB);
        assert!(memory_limit() > 0);
    }

    #[test]
    fn pinned_names_are_never_victims_and_refusing_budgets_evict_nothing() {
        let r = manager(25 * MIB);
        r.pin("kept");
        r.admit("kept", 10 * MIB, false);
        r.admit("other", 10 * MIB, false);
        assert!(r.is_pinned("kept") && !r.is_pinned("other"));
        assert_eq!(r.make_room("new", 15 * MIB, |_| false).unwrap(), ["other"]);
        assert!(r.make_room("new", 30 * MIB, |_| false).unwrap_err().contains("whole --model-memory-budget"));

        let mesh = Residency::new(Budget { bytes: Some(25 * MIB), models: None }, Admission::RefuseWhenFull);
        mesh.admit("a", 10 * MIB, false);
        assert_eq!(mesh.make_room("b", 15 * MIB, |_| false).unwrap(), Vec::<String>::new());
        assert!(mesh.make_room("b", 16 * MIB, |_| false).unwrap_err().contains("only 15.0 MiB"));
    }

    #[test]
    fn footprints_are_remembered_after_eviction() {
        let r = manager(25 * MIB);
        r.admit("a", 7 * MIB, false);
        r.remove("a");
        assert_eq!(r.known_footprint("a"), Some(7 * MIB));
        assert_eq!(r.used(), 0);
    }
}

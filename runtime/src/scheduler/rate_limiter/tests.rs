//! The rate limiter with threads standing for instance workers: shared
//! resources exclude each other, priorities share the turns, registrations
//! are checked and removed, and a staged instance that leaves lets the
//! next one go.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::*;
use crate::backend::fake::HANG_GUARD;

fn cpu(resources: &[(&str, bool, u32)], priority: u32) -> InstanceLimits {
    on(Device::Cpu, resources, priority)
}

fn on(device: Device, resources: &[(&str, bool, u32)], priority: u32) -> InstanceLimits {
    InstanceLimits { device, resources: resources.iter().map(|&(n, g, c)| (n.to_owned(), g, c)).collect(), priority }
}

/// Runs `work` for instance 0 of each registration on its own thread,
/// each with endless work until `stop` is set; `run` is called for each
/// execution with the instance's index.
fn run_until(registrations: &[Registration], stop: &AtomicBool, run: impl Fn(usize) + Sync) {
    std::thread::scope(|scope| {
        for (n, registration) in registrations.iter().enumerate() {
            let run = &run;
            scope.spawn(move || {
                let more = || (!stop.load(Ordering::SeqCst)).then_some(());
                work(Some((registration, 0)), more, more, |(), _| run(n));
            });
        }
    });
}

/// The most executions of `registrations`' instances that ran at once in
/// 400 executions.
fn most_at_once(registrations: &[Registration]) -> usize {
    let (running, most, runs) = (AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0));
    let stop = AtomicBool::new(false);
    run_until(registrations, &stop, |_| {
        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
        most.fetch_max(now, Ordering::SeqCst);
        std::thread::yield_now();
        running.fetch_sub(1, Ordering::SeqCst);
        if runs.fetch_add(1, Ordering::SeqCst) + 1 >= 400 {
            stop.store(true, Ordering::SeqCst);
        }
    });
    most.load(Ordering::SeqCst)
}

/// Whether two of `registrations`' instances executed at once: each
/// execution waits (within a hang guard) for another to start.
fn ran_together(registrations: &[Registration]) -> bool {
    let (running, both) = (AtomicUsize::new(0), AtomicBool::new(false));
    let stop = AtomicBool::new(false);
    run_until(registrations, &stop, |_| {
        running.fetch_add(1, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(60);
        while running.load(Ordering::SeqCst) < 2 && Instant::now() < deadline && !both.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        if running.load(Ordering::SeqCst) == 2 {
            both.store(true, Ordering::SeqCst);
        }
        running.fetch_sub(1, Ordering::SeqCst);
        stop.store(true, Ordering::SeqCst);
    });
    both.load(Ordering::SeqCst)
}

#[test]
fn instances_that_share_one_copy_never_run_at_once() {
    let limiter = RateLimiter::new(Vec::new());
    let a = limiter.register(&[cpu(&[("r", false, 1)], 1)]).unwrap();
    let b = limiter.register(&[cpu(&[("r", false, 1)], 1)]).unwrap();
    assert_eq!(most_at_once(&[a, b]), 1, "one copy: one execution at a time");
}

#[test]
fn per_device_copies_are_each_device_s_own_and_a_global_copy_is_the_server_s() {
    // One copy of `r` on each GPU: instances on GPU 0 and GPU 1 run together.
    let limiter = RateLimiter::new(Vec::new());
    let a = limiter.register(&[on(Device::Gpu(0), &[("r", false, 1)], 1)]).unwrap();
    let b = limiter.register(&[on(Device::Gpu(1), &[("r", false, 1)], 1)]).unwrap();
    let key = |gpu| (Scope::Device(Device::Gpu(gpu)), "r".to_owned());
    assert_eq!((limiter.available()[&key(0)], limiter.available()[&key(1)]), (1, 1));
    assert!(ran_together(&[a, b]), "each GPU has its own copy");
    // One global copy: the same two instances never run at once.
    let limiter = RateLimiter::new(Vec::new());
    let a = limiter.register(&[on(Device::Gpu(0), &[("r", true, 1)], 1)]).unwrap();
    let b = limiter.register(&[on(Device::Gpu(1), &[("r", true, 1)], 1)]).unwrap();
    assert_eq!(limiter.available()[&(Scope::Global, "r".to_owned())], 1);
    assert_eq!(most_at_once(&[a, b]), 1, "one copy for the whole server");
    // An explicit count on one GPU only: the other has none, so an
    // instance there cannot be served.
    let limiter = RateLimiter::new(vec!["r:1:0".parse().unwrap()]);
    assert!(limiter.register(&[on(Device::Gpu(0), &[("r", false, 1)], 1)]).is_ok());
    let e = limiter.register(&[on(Device::Gpu(1), &[("r", false, 1)], 1)]).err().unwrap();
    assert!(e.contains("\"r\" is limited to 0"), "{e}");
    // ... while a global resource takes the most any flag gives, whatever its device.
    let limiter = RateLimiter::new(vec!["g:3:1".parse().unwrap()]);
    let _held = limiter.register(&[on(Device::Gpu(0), &[("g", true, 2)], 1)]).unwrap();
    assert_eq!(limiter.available()[&(Scope::Global, "g".to_owned())], 3);
}

#[test]
fn an_instance_that_lists_no_resources_is_not_limited() {
    let limiter = RateLimiter::new(Vec::new());
    let busy = limiter.register(&[cpu(&[("r", false, 1)], 1)]).unwrap();
    let blocked = limiter.register(&[cpu(&[("r", false, 1)], 1)]).unwrap();
    let free = limiter.register(&[cpu(&[], 1)]).unwrap();
    assert!(!free.limits(0) && blocked.limits(0));
    // `busy` holds the one copy and `blocked` is first in line for it.
    let held = busy.stage(0).wait();
    let staged = blocked.stage(0);
    let waiting = std::thread::spawn(move || drop(staged.wait()));
    let ran = AtomicUsize::new(0);
    let mut pending = Some(());
    work(
        Some((&free, 0)),
        || pending.take(),
        || None,
        |(), waited| {
            assert_eq!(waited, Duration::ZERO);
            ran.fetch_add(1, Ordering::SeqCst);
        },
    );
    assert_eq!(ran.load(Ordering::SeqCst), 1, "ran while the others wait");
    drop(held);
    join_within_guard(waiting);
}

/// The turns `turns` executions give each of instances (one copy of a
/// global resource each needs) of the priorities `priorities`, every
/// instance always having work: each takes its turn as soon as it is
/// first, and stages again at once when its execution ends.
fn turns(priorities: &[u32], turns: usize) -> Vec<usize> {
    let limiter = RateLimiter::new(Vec::new());
    let registrations: Vec<Registration> =
        priorities.iter().map(|&p| limiter.register(&[cpu(&[("r", true, 1)], p)]).unwrap()).collect();
    let mut staged: Vec<Option<Staged>> = registrations.iter().map(|r| Some(r.stage(0))).collect();
    let mut counts = vec![0; priorities.len()];
    for _ in 0..turns {
        let first = limiter.lock().staged.first().map(|&(_, _, id)| id).unwrap();
        let n = registrations.iter().position(|r| r.ids[0] == Some(first)).unwrap();
        // The first staged instance with free resources: its wait returns at once.
        let grant = staged[n].take().unwrap().wait();
        counts[n] += 1;
        staged[n] = Some(grant.then_stage());
    }
    counts
}

#[test]
fn priorities_share_the_turns_in_inverse_proportion() {
    assert_eq!(turns(&[1, 2], 300), [200, 100]);
    // 0 counts as 1.
    assert_eq!(turns(&[0, 2], 300), [200, 100]);
    assert_eq!(turns(&[1, 3], 400), [300, 100]);
    assert_eq!(turns(&[1, 2, 4], 700), [400, 200, 100]);
    assert_eq!(turns(&[5, 5], 300), [150, 150]);
}

#[test]
fn priorities_one_and_two_share_the_turns_two_to_one_between_threads() {
    // The same with a thread per instance: both wait for their first turn
    // together, then the turns follow the priorities.
    let limiter = RateLimiter::new(Vec::new());
    let first = limiter.register(&[cpu(&[("r", true, 1)], 1)]).unwrap();
    let second = limiter.register(&[cpu(&[("r", true, 1)], 2)]).unwrap();
    // Both instances staged before either runs: the one copy is held here.
    let blocker = limiter.register(&[cpu(&[("r", true, 1)], 1)]).unwrap();
    let held = blocker.stage(0).wait();
    let order = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let arrived = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for (n, registration) in [&first, &second].into_iter().enumerate() {
            let (order, stop, arrived) = (&order, &stop, &arrived);
            scope.spawn(move || {
                let mut fresh = true;
                let more = || {
                    if std::mem::take(&mut fresh) {
                        arrived.fetch_add(1, Ordering::SeqCst);
                    }
                    (!stop.load(Ordering::SeqCst)).then_some(())
                };
                let again = || (!stop.load(Ordering::SeqCst)).then_some(());
                work(Some((registration, 0)), more, again, |(), _| {
                    let mut order = order.lock();
                    order.push(n);
                    if order.len() >= 300 {
                        stop.store(true, Ordering::SeqCst);
                    }
                });
            });
        }
        // Both have taken work (and so are staged, or about to be) before the copy is free.
        let deadline = Instant::now() + Duration::from_secs(60);
        while arrived.load(Ordering::SeqCst) < 2 || limiter.lock().staged.len() < 2 {
            assert!(Instant::now() < deadline, "the instances never staged");
            std::thread::yield_now();
        }
        drop(held);
    });
    let order = order.into_inner();
    let counts = order[..300].iter().fold([0, 0], |mut c, &n| {
        c[n] += 1;
        c
    });
    assert_eq!(counts, [200, 100], "priority 1 ran {} times, priority 2 {}", counts[0], counts[1]);
}

#[test]
fn with_copies_for_both_they_run_together() {
    let limiter = RateLimiter::new(vec!["r:2".parse().unwrap()]);
    let a = limiter.register(&[cpu(&[("r", false, 1)], 1)]).unwrap();
    let b = limiter.register(&[cpu(&[("r", false, 1)], 1)]).unwrap();
    assert!(ran_together(&[a, b]), "two copies let both instances execute at once");
}

#[test]
fn a_registration_the_resources_cannot_serve_is_refused_whole() {
    let limiter = RateLimiter::new(vec!["resource1:3".parse().unwrap()]);
    let e = limiter.register(&[cpu(&[], 1), cpu(&[("resource1", false, 4)], 1)]).err().unwrap();
    assert_eq!(
        e,
        "Resource count for \"resource1\" is limited to 3 which will prevent scheduling of one or more model \
         instances, the minimum required count is 4"
    );
    assert!(limiter.lock().instances.is_empty(), "neither instance stays registered");
    assert!(limiter.register(&[cpu(&[("resource1", false, 3)], 1)]).is_ok());
}

#[test]
fn dropping_a_registration_takes_its_needs_out_of_the_defaults() {
    let limiter = RateLimiter::new(Vec::new());
    let big = limiter.register(&[cpu(&[("r", false, 4)], 1)]).unwrap();
    let small = limiter.register(&[cpu(&[("r", false, 2)], 1)]).unwrap();
    let key = (Scope::Device(Device::Cpu), "r".to_owned());
    assert_eq!(limiter.available()[&key], 4);
    drop(big);
    assert_eq!(limiter.available()[&key], 2);
    drop(small);
    assert!(limiter.available().is_empty());
}

#[test]
fn a_staged_instance_that_leaves_lets_the_next_one_go() {
    let limiter = RateLimiter::new(Vec::new());
    let a = limiter.register(&[cpu(&[("r", false, 1)], 1)]).unwrap();
    let b = limiter.register(&[cpu(&[("r", false, 1)], 1)]).unwrap();
    let running = a.stage(0).wait();
    let first = a.stage(0);
    let waiting = std::thread::spawn(move || drop(b.stage(0).wait()));
    drop(running);
    // `first` is ahead of b's instance and never waits: leaving lets b run.
    drop(first);
    join_within_guard(waiting);
}

/// Joins `thread`, failing the test if it is still running after
/// [`HANG_GUARD`] (a lost wake-up would otherwise hang `cargo test`).
fn join_within_guard(thread: std::thread::JoinHandle<()>) {
    let deadline = std::time::Instant::now() + HANG_GUARD;
    while !thread.is_finished() {
        assert!(std::time::Instant::now() < deadline, "the waiting thread did not finish within {HANG_GUARD:?}");
        std::thread::park_timeout(Duration::from_millis(10));
    }
    thread.join().unwrap();
}

use super::*;

const MIB: u64 = 1 << 20;

/// A model with `footprint` in its one version.
fn one_version(footprint: Footprint) -> Versions {
    [(1, footprint)].into()
}

fn manager(bytes: u64) -> Residency {
    Residency::new(Budget { bytes: Some(bytes), ..Budget::default() }, Admission::EvictLeastRecentlyUsed)
}

#[test]
fn the_least_recently_used_model_leaves_first() {
    let r = manager(25 * MIB);
    r.admit("a", one_version(Footprint::host(10 * MIB)), false);
    r.admit("b", one_version(Footprint::host(10 * MIB)), false);
    r.touch("a");
    assert_eq!(r.victims("c", &Footprint::host(10 * MIB), |_| false), ["b"]);
    assert_eq!(r.victims("c", &Footprint::host(4 * MIB), |_| false), Vec::<String>::new(), "it fits without evicting");
    assert_eq!(r.victims("c", &Footprint::host(20 * MIB), |_| false), ["b", "a"]);
}

#[test]
fn pinned_models_stay_and_busy_ones_go_last() {
    let r = manager(25 * MIB);
    r.admit("pinned", one_version(Footprint::host(10 * MIB)), true);
    r.admit("busy", one_version(Footprint::host(5 * MIB)), false);
    r.admit("idle", one_version(Footprint::host(5 * MIB)), false);
    r.touch("busy");
    assert_eq!(r.victims("new", &Footprint::host(10 * MIB), |n| n == "busy"), ["idle"]);
    assert_eq!(r.victims("new", &Footprint::host(15 * MIB), |n| n == "busy"), ["idle", "busy"]);
    assert_eq!(r.victims("new", &Footprint::host(20 * MIB), |_| false), ["idle", "busy"], "never the pinned one");
}

#[test]
fn a_model_larger_than_the_budget_is_refused_and_the_count_limit_holds() {
    let r = manager(25 * MIB);
    assert!(r.check_fits("big", &Footprint::host(30 * MIB)).unwrap_err().contains("30.0 MiB"));
    let counted = Residency::new(Budget { models: Some(2), ..Budget::default() }, Admission::EvictLeastRecentlyUsed);
    counted.admit("a", one_version(Footprint::host(1)), false);
    counted.admit("b", one_version(Footprint::host(1)), false);
    assert_eq!(counted.victims("c", &Footprint::host(1), |_| false), ["a"]);
    assert_eq!(
        counted.victims("b", &Footprint::host(1), |_| false),
        Vec::<String>::new(),
        "a resident model needs no room"
    );
}

#[test]
fn check_free_counts_the_others_and_evicts_nothing() {
    let r = manager(25 * MIB);
    r.admit("a", one_version(Footprint::host(10 * MIB)), false);
    r.admit("b", one_version(Footprint::host(10 * MIB)), false);
    assert!(r.check_free("c", &Footprint::host(5 * MIB)).is_ok());
    assert!(r.check_free("c", &Footprint::host(6 * MIB)).unwrap_err().contains("only 5.0 MiB of the 25.0 MiB"));
    assert!(r.check_free("b", &Footprint::host(15 * MIB)).is_ok(), "its own bytes are not counted twice");
    assert_eq!(r.used().host, 20 * MIB);
    assert!(memory_limit() > 0);
}

#[test]
fn pinned_names_are_never_victims_and_refusing_budgets_evict_nothing() {
    let r = manager(25 * MIB);
    r.pin("kept");
    r.admit("kept", one_version(Footprint::host(10 * MIB)), false);
    r.admit("other", one_version(Footprint::host(10 * MIB)), false);
    assert!(r.is_pinned("kept") && !r.is_pinned("other"));
    assert_eq!(r.make_room("new", &Footprint::host(15 * MIB), |_| false).unwrap(), ["other"]);
    assert!(
        r.make_room("new", &Footprint::host(30 * MIB), |_| false).unwrap_err().contains("whole --model-memory-budget")
    );

    let mesh = Residency::new(Budget { bytes: Some(25 * MIB), ..Budget::default() }, Admission::RefuseWhenFull);
    mesh.admit("a", one_version(Footprint::host(10 * MIB)), false);
    assert_eq!(mesh.make_room("b", &Footprint::host(15 * MIB), |_| false).unwrap(), Vec::<String>::new());
    assert!(mesh.make_room("b", &Footprint::host(16 * MIB), |_| false).unwrap_err().contains("only 15.0 MiB"));
}

#[test]
fn pinned_models_that_fill_a_budget_refuse_the_load() {
    let r = manager(25 * MIB);
    r.admit("kept", one_version(Footprint::host(20 * MIB)), true);
    r.admit("other", one_version(Footprint::host(3 * MIB)), false);
    assert_eq!(r.make_room("new", &Footprint::host(5 * MIB), |_| false).unwrap(), ["other"]);
    let refused = r.make_room("new", &Footprint::host(6 * MIB), |_| false).unwrap_err();
    assert!(refused.contains("pinned models hold 20.0 MiB of the 25.0 MiB --model-memory-budget"), "{refused}");

    let gpu =
        Residency::new(Budget { gpu: [(0, 10 * MIB)].into(), ..Budget::default() }, Admission::EvictLeastRecentlyUsed);
    gpu.admit("kept", one_version(on_gpus(MIB, &[(0, 8 * MIB)])), true);
    let refused = gpu.make_room("new", &on_gpus(MIB, &[(0, 4 * MIB)]), |_| false).unwrap_err();
    assert!(refused.contains("4.0 MiB on GPU 0 but pinned models hold 8.0 MiB"), "{refused}");

    let counted = Residency::new(Budget { models: Some(1), ..Budget::default() }, Admission::EvictLeastRecentlyUsed);
    counted.admit("kept", one_version(Footprint::host(1)), true);
    assert!(counted.make_room("new", &Footprint::host(1), |_| false).unwrap_err().contains("--max-loaded-models is 1"));
}

#[test]
fn footprints_are_remembered_after_eviction() {
    let r = manager(25 * MIB);
    r.admit("a", one_version(Footprint::host(7 * MIB)), false);
    r.remove("a");
    assert_eq!(r.known_footprint("a"), Some(Footprint::host(7 * MIB)));
    assert_eq!(r.used(), Footprint::default());
    assert_eq!((r.held("a"), r.host_bytes("a", 1)), (Footprint::default(), 0), "nothing is held once it left");
}

#[test]
fn each_version_is_accounted_and_the_model_counts_them_together() {
    let r = manager(25 * MIB);
    r.admit("a", [(1, Footprint::host(3 * MIB)), (2, Footprint::host(4 * MIB))].into(), false);
    assert_eq!((r.host_bytes("a", 1), r.host_bytes("a", 2), r.host_bytes("a", 3)), (3 * MIB, 4 * MIB, 0));
    assert_eq!(r.held("a"), Footprint::host(7 * MIB));
    assert_eq!(r.known_footprint("a"), Some(Footprint::host(7 * MIB)));
    assert_eq!(r.victims("b", &Footprint::host(20 * MIB), |_| false), ["a"], "both versions leave together");
}

fn on_gpus(host: u64, devices: &[(u32, u64)]) -> Footprint {
    Footprint { host, devices: devices.iter().copied().collect() }
}

#[test]
fn a_gpu_budget_evicts_only_models_on_that_gpu() {
    let budget = Budget { gpu: [(0, 10 * MIB), (1, 10 * MIB)].into(), ..Budget::default() };
    let r = Residency::new(budget, Admission::EvictLeastRecentlyUsed);
    r.admit("cpu", one_version(on_gpus(50 * MIB, &[])), false);
    r.admit("gpu0", one_version(on_gpus(MIB, &[(0, 6 * MIB)])), false);
    r.admit("gpu1", one_version(on_gpus(MIB, &[(1, 6 * MIB)])), false);
    r.touch("cpu");
    r.touch("gpu1");
    // Least recently used first is gpu0, then cpu, then gpu1: only the
    // one on GPU 1 makes room there.
    assert_eq!(r.victims("new", &on_gpus(MIB, &[(1, 6 * MIB)]), |_| false), ["gpu1"]);
    assert_eq!(r.victims("new", &on_gpus(MIB, &[(0, 4 * MIB)]), |_| false), Vec::<String>::new());
    assert_eq!(r.victims("new", &on_gpus(MIB, &[(0, 5 * MIB), (1, 5 * MIB)]), |_| false), ["gpu0", "gpu1"]);
    let too_big = r.check_fits("new", &on_gpus(MIB, &[(1, 11 * MIB)])).unwrap_err();
    assert!(too_big.contains("11.0 MiB on GPU 1 but --model-load-gpu-limit allows 10.0 MiB"), "{too_big}");
    assert_eq!(r.used(), on_gpus(52 * MIB, &[(0, 6 * MIB), (1, 6 * MIB)]));
}

#[test]
fn a_refusing_gpu_budget_names_the_room_left() {
    let budget = Budget { gpu: [(0, 10 * MIB)].into(), ..Budget::default() };
    let r = Residency::new(budget, Admission::RefuseWhenFull);
    r.admit("a", one_version(on_gpus(MIB, &[(0, 6 * MIB)])), false);
    assert_eq!(r.make_room("b", &on_gpus(MIB, &[(0, 4 * MIB)]), |_| false).unwrap(), Vec::<String>::new());
    let refused = r.make_room("b", &on_gpus(MIB, &[(0, 5 * MIB)]), |_| false).unwrap_err();
    assert!(refused.contains("only 4.0 MiB of the 10.0 MiB --model-load-gpu-limit"), "{refused}");
    assert!(r.check_free("a", &on_gpus(MIB, &[(0, 10 * MIB)])).is_ok(), "its own bytes are not counted twice");
}

//! On-demand mode: models load on their first request, one load however
//! many requests wait, and the least recently used leave memory when the
//! budget would be exceeded, really giving their memory back.

use std::path::Path;

use plinth_tests::{Server, copy_dir, example_repository, fixture};
use serde_json::{Value, json};

const MIB: u64 = 1 << 20;

/// Copies example model `from` into `repo` as model `name`.
fn add_copy(repo: &Path, from: &str, name: &str) {
    copy_dir(&example_repository().join(from), &repo.join(name));
    let config = repo.join(name).join("config.pbtxt");
    let text =
        std::fs::read_to_string(&config).unwrap().replace(&format!("name: \"{from}\""), &format!("name: \"{name}\""));
    std::fs::write(config, text).unwrap();
}

/// Reads the hello line with text-recognition model `model`.
fn read_hello(server: &Server, model: &str) -> (u16, Value) {
    server.post_bytes(&format!("/v2/models/{model}/predict"), "image/png", fixture("line_hello.png"))
}

/// Tells an upright line's direction with classifier `model`.
fn classify(server: &Server, model: &str) -> (u16, Value) {
    server.post_bytes(&format!("/v2/models/{model}/predict"), "image/png", fixture("cls_upright.png"))
}

/// Model name -> measured footprint in bytes, for the READY models.
fn resident(server: &Server) -> Vec<(String, u64)> {
    let (_, index) = server.post_json("/v2/repository/index", &json!({}));
    index
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["state"] == "READY")
        .map(|r| (r["name"].as_str().unwrap().to_owned(), r["resident_bytes"].as_u64().unwrap()))
        .collect()
}

fn names(rows: &[(String, u64)]) -> Vec<&str> {
    rows.iter().map(|(n, _)| n.as_str()).collect()
}

/// A repository of `recognizers` ocr_rec copies and `classifiers` ocr_cls
/// copies, plus `warm` (an ocr_cls copy loaded and pinned at start, so that
/// one-time start-up costs are not counted against the models under test).
fn repository(recognizers: &[&str], classifiers: &[&str]) -> tempfile::TempDir {
    let repo = tempfile::tempdir().unwrap();
    add_copy(repo.path(), "ocr_cls", "warm");
    for name in recognizers {
        add_copy(repo.path(), "ocr_rec", name);
    }
    for name in classifiers {
        add_copy(repo.path(), "ocr_cls", name);
    }
    repo
}

fn on_demand<'a>(budget: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["--model-control-mode", "on_demand", "--load-model", "warm", "--model-memory-budget", budget];
    args.extend_from_slice(extra);
    args
}

/// The footprints of `warm`, `a` and `b` as a server without a budget
/// measures them.
fn calibrate(repo: &Path) -> (u64, u64, u64) {
    let server = Server::start(repo, &["--model-control-mode", "on_demand", "--load-model", "warm"]);
    read_hello(&server, "a");
    read_hello(&server, "b");
    let rows = resident(&server);
    let of = |name: &str| rows.iter().find(|(n, _)| n == name).unwrap().1;
    (of("warm"), of("a"), of("b"))
}

#[test]
fn the_least_recently_used_model_is_the_one_evicted() {
    let repo = repository(&["a", "b", "c"], &[]);
    // A budget that holds warm and two recognizers, not three.
    let (warm, a, b) = calibrate(repo.path());
    let budget = warm + a + b + a.max(b) / 2;
    let server = Server::start(repo.path(), &on_demand(&format!("{budget}B"), &[]));
    assert_eq!(names(&resident(&server)), ["warm"], "nothing else is loaded before it is asked for");
    for model in ["a", "b", "a", "c"] {
        let (status, body) = read_hello(&server, model);
        assert_eq!((status, body["text"].as_str()), (200, Some("Hello World")), "{model}: {body}");
    }
    let rows = resident(&server);
    assert_eq!(names(&rows), ["a", "c", "warm"], "b was least recently used: {rows:?}");
    let (_, index) = server.post_json("/v2/repository/index", &json!({}));
    let evicted = index.as_array().unwrap().iter().find(|r| r["name"] == "b").unwrap();
    assert!(evicted["reason"].as_str().unwrap().contains("evicted"), "{evicted}");
    assert_eq!(server.metric("plinth_model_evictions_total{model=\"b\"}"), 1.0);
    assert_eq!(server.metric("plinth_residency_misses_total"), 3.0, "a, b and c were cold once");
    assert_eq!(server.metric("plinth_residency_hits_total"), 1.0, "the second a was resident");
    let used: u64 = rows.iter().map(|(_, b)| b).sum();
    assert_eq!(server.metric("plinth_memory_used_bytes") as u64, used);
    assert!(used <= budget, "{used} bytes resident, budget {budget}");

    let (status, body) = read_hello(&server, "b");
    assert_eq!((status, body["text"].as_str()), (200, Some("Hello World")), "an evicted model comes back: {body}");
    assert_eq!(names(&resident(&server)), ["b", "c", "warm"], "a is now the least recently used");
}

#[test]
fn concurrent_first_requests_share_one_load() {
    let repo = repository(&["a"], &[]);
    let server = Server::start(repo.path(), &on_demand("1GiB", &[]));
    let answers: Vec<(u16, Value)> = std::thread::scope(|s| {
        let requests: Vec<_> = (0..32).map(|_| s.spawn(|| read_hello(&server, "a"))).collect();
        requests.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for (status, body) in &answers {
        assert_eq!((*status, body["text"].as_str()), (200, Some("Hello World")), "{body}");
    }
    assert_eq!(server.metric("plinth_model_loads_total{model=\"a\"}"), 1.0);
    assert_eq!(server.log().lines().filter(|l| l.contains("load: start") && l.contains("model=a")).count(), 1);
}

#[test]
fn fifty_load_and_evict_cycles_do_not_grow_memory() {
    let repo = repository(&[], &["x", "y"]);
    // Room for warm and one classifier.
    let args = ["--model-control-mode", "on_demand", "--load-model", "warm", "--max-loaded-models", "2"];
    let server = Server::start(repo.path(), &args);
    let mut after_first = 0;
    for cycle in 1..=50 {
        for model in ["x", "y"] {
            let (status, body) = classify(&server, model);
            assert_eq!((status, body["angle"].as_i64()), (200, Some(0)), "cycle {cycle} {model}: {body}");
        }
        if cycle == 1 {
            after_first = server.rss();
        }
    }
    let after_all = server.rss();
    assert_eq!(server.metric("plinth_model_loads_total{model=\"x\"}"), 50.0);
    // 98 more loads each leaking a model would grow by 98 footprints.
    let footprint = resident(&server).iter().find(|(n, _)| n == "y").unwrap().1;
    assert!(
        after_all.saturating_sub(after_first) < 5 * footprint,
        "memory grew from {} MiB after the first cycle to {} MiB after fifty, loading a {} MiB model 98 more times",
        after_first / MIB,
        after_all / MIB,
        footprint / MIB
    );
}

/// The most loads the log shows running at once.
fn max_concurrent_loads(log: &str) -> usize {
    let (mut running, mut most) = (0usize, 0usize);
    for line in log.lines() {
        if line.contains("load: start") {
            running += 1;
            most = most.max(running);
        } else if line.contains("load: ready") || line.contains("load: failed") {
            running = running.saturating_sub(1);
        }
    }
    most
}

#[test]
fn a_load_storm_stays_bounded_and_the_hot_model_keeps_answering() {
    let cold: Vec<String> = (0..20).map(|i| format!("cold{i}")).collect();
    let cold_refs: Vec<&str> = cold.iter().map(String::as_str).collect();
    let repo = repository(&["hot"], &cold_refs);
    let server = Server::start(repo.path(), &on_demand("80MiB", &["--model-load-concurrency", "2"]));
    assert_eq!(read_hello(&server, "hot").0, 200);

    let stop = std::sync::atomic::AtomicBool::new(false);
    let (server, stop) = (&server, &stop);
    let hot_answers = std::thread::scope(|s| {
        let hot = s.spawn(move || {
            let mut answers = 0;
            loop {
                let (status, body) = read_hello(server, "hot");
                assert_eq!((status, body["text"].as_str()), (200, Some("Hello World")), "hot model: {body}");
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    return answers;
                }
                // Answered while the storm still went on.
                answers += 1;
            }
        });
        let storm: Vec<_> = cold.iter().map(|name| s.spawn(move || (name, classify(server, name)))).collect();
        for request in storm {
            let (name, (status, body)) = request.join().unwrap();
            match status {
                200 => assert_eq!(body["angle"], 0, "{name}: {body}"),
                503 => assert!(body["error"].as_str().is_some_and(|e| e.contains(name.as_str())), "{name}: {body}"),
                _ => panic!("{name}: status {status}: {body}"),
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        hot.join().unwrap()
    });
    assert!(hot_answers > 0, "the hot model answered nothing while the cold ones loaded");
    assert!(max_concurrent_loads(&server.log()) <= 2, "more than 2 loads ran at once:\n{}", server.log());
    assert_eq!(server.get("/v2/health/live").0, 200, "the server survived the storm");
    let used = server.metric("plinth_memory_used_bytes") as u64;
    assert!(used <= 80 * MIB, "{} MiB resident after the storm", used / MIB);
}

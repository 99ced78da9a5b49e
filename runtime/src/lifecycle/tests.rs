//! Each control mode over the shared core, with fake backends
//! (`testing::FakeLoader`): what loads at start, what the repository API
//! may do, what a poll picks up, what a request loads and evicts, and
//! ModelMesh's loads, unloads and purges.

use std::future::Future;
use std::sync::Arc;

use super::testing::{FAKE_BYTES, Repository, index, lifecycle};
use super::{ControlMode, LoadRequest, Source};
use crate::backend::fake::{Doubler, Gate};
use crate::error::{Error, LoadError};
use crate::plugin::ModelRunner;
use crate::residency::Budget;
use crate::scheduler::policy::RequestOptions;

const NO_BUDGET: Budget = Budget { bytes: None, models: None, gpu: std::collections::BTreeMap::new() };

fn row(name: &str, version: &str, state: &'static str, reason: &str) -> (String, String, &'static str, String) {
    (name.to_owned(), version.to_owned(), state, reason.to_owned())
}

#[tokio::test]
async fn none_loads_every_model_at_start_and_refuses_the_repository_api() {
    let repo = Repository::new();
    repo.add("a", &[1], "").add("b", &[1, 2], "version_policy: { all: {} }");
    let (lifecycle, loader) = lifecycle(ControlMode::None, Some(&repo.path()), NO_BUDGET, None);
    lifecycle.start(&[]).await.unwrap();
    assert_eq!(index(&lifecycle), [row("a", "1", "READY", ""), row("b", "1", "READY", ""), row("b", "2", "READY", "")]);
    assert_eq!(loader.count(), 3);
    let refused = lifecycle.load("a", LoadRequest::default()).await.unwrap_err();
    assert_eq!(
        refused,
        LoadError::NotAllowed(
            "explicit model load / unload is not allowed if polling is enabled: the model control mode is 'none'; start with --model-control-mode=explicit".into()
        )
    );
    assert!(matches!(lifecycle.unload("a", false).await, Err(Error::Unavailable(m)) if m.contains("mode is 'none'")));
}

#[tokio::test]
async fn explicit_loads_the_named_models_and_then_what_the_api_says() {
    let repo = Repository::new();
    repo.add("a", &[1], "").add("b", &[1], "").add(
        "broken",
        &[1],
        r#"parameters { key: "fake.fail" value: { string_value: "no weights" } }"#,
    );
    let (lifecycle, loader) = lifecycle(ControlMode::Explicit, Some(&repo.path()), NO_BUDGET, None);
    lifecycle.start(&["a".into()]).await.unwrap();
    assert_eq!(
        index(&lifecycle),
        [
            row("a", "1", "READY", ""),
            row("b", "", "UNAVAILABLE", "not loaded"),
            row("broken", "", "UNAVAILABLE", "not loaded")
        ]
    );

    lifecycle.load("b", LoadRequest::default()).await.unwrap();
    lifecycle.load("b", LoadRequest::default()).await.unwrap();
    assert_eq!(loader.count(), 2, "an unchanged model is not loaded again");
    let failed = lifecycle.load("broken", LoadRequest::default()).await.unwrap_err();
    assert_eq!(failed, LoadError::Failed("failed to load 'broken': version 1: no weights".into()));
    assert_eq!(index(&lifecycle)[2], row("broken", "1", "UNAVAILABLE", "no weights"));
    let missing = lifecycle.load("zzz", LoadRequest::default()).await.unwrap_err();
    assert_eq!(
        missing,
        LoadError::Invalid("failed to load 'zzz': no model folder 'zzz' in the model repositories".into())
    );
    let escape = lifecycle.load("../a", LoadRequest::default()).await.unwrap_err().to_string();
    assert!(escape.contains("'../a' is not a model name"), "{escape}");

    lifecycle.unload("a", false).await.unwrap();
    let gone = lifecycle.resolve("a", None).await.err();
    let unloaded = "Request for unknown model: 'a' has no available versions: it is UNAVAILABLE: unloaded";
    assert_eq!(gone, Some(Error::Unavailable(unloaded.into())));
    assert_eq!(lifecycle.unload("zzz", false).await, Err(Error::NotFound("unknown model 'zzz'".into())));

    // The load API's configuration override reloads the model under it.
    lifecycle.load("b", LoadRequest::config(Some(r#"{"max_batch_size": 4}"#.into()))).await.unwrap();
    assert_eq!(lifecycle.resolve("b", None).await.unwrap().config.max_batch_size, 4);
    assert_eq!(loader.count(), 4);
}

#[tokio::test]
async fn a_load_may_bring_the_model_folder_with_it() {
    let repo = Repository::new();
    repo.add("a", &[1], "");
    let (lifecycle, loader) = lifecycle(ControlMode::Explicit, Some(&repo.path()), NO_BUDGET, None);
    lifecycle.start(&[]).await.unwrap();
    let mut request = LoadRequest::config(Some(r#"{"max_batch_size": 2}"#.into()));
    request.files.insert("3/model.onnx".into(), b"weights".to_vec());
    lifecycle.load("in_memory", request.clone()).await.unwrap();
    assert_eq!(index(&lifecycle).last().unwrap(), &row("in_memory", "3", "READY", ""), "no repository folder needed");
    lifecycle.load("a", request).await.unwrap();
    let a = lifecycle.resolve("a", None).await.unwrap();
    assert_eq!((a.version, a.config.max_batch_size), (3, 2), "the files replace the repository's folder");
    assert_eq!(loader.loads.lock().last().unwrap(), &("a".to_owned(), 3));
    let mut no_config = LoadRequest::default();
    no_config.files.insert("1/model.onnx".into(), vec![]);
    let refused = lifecycle.load("a", no_config).await.unwrap_err();
    assert!(matches!(&refused, LoadError::Invalid(m) if m.contains("need the 'config' parameter too")), "{refused:?}");
}

#[tokio::test]
async fn poll_acts_on_a_folder_once_its_files_stopped_changing_and_unloads_removed_ones() {
    let repo = Repository::new();
    repo.add("a", &[1], "");
    let (lifecycle, loader) = lifecycle(ControlMode::Poll, Some(&repo.path()), NO_BUDGET, None);
    lifecycle.start(&[]).await.unwrap();

    repo.add("b", &[1], "");
    lifecycle.poll().await;
    assert_eq!(index(&lifecycle), [row("a", "1", "READY", "")], "a folder seen once may still be copying");
    repo.add("b", &[1], "# still copying");
    lifecycle.poll().await;
    assert_eq!(index(&lifecycle).len(), 1, "its files changed since the last look");
    repo.add("b", &[1], "");
    lifecycle.poll().await;
    lifecycle.poll().await;
    assert_eq!(index(&lifecycle), [row("a", "1", "READY", ""), row("b", "1", "READY", "")]);

    repo.add("a", &[2], "");
    lifecycle.poll().await;
    lifecycle.poll().await;
    assert_eq!(index(&lifecycle)[0], row("a", "2", "READY", ""), "version 2 replaced version 1 (latest policy)");
    let loads_before = loader.count();
    lifecycle.poll().await;
    assert_eq!(loader.count(), loads_before, "nothing changed, nothing reloaded");

    repo.add("b", &[2], "version_policy { all {} }");
    lifecycle.poll().await;
    lifecycle.poll().await;
    assert_eq!(index(&lifecycle)[1..], [row("b", "1", "READY", ""), row("b", "2", "READY", "")]);
    std::fs::remove_dir_all(repo.model_path("b").join("2")).unwrap();
    lifecycle.poll().await;
    lifecycle.poll().await;
    assert_eq!(index(&lifecycle)[1..], [row("b", "1", "READY", "")], "a version folder removed is unloaded");

    repo.remove("a");
    lifecycle.poll().await;
    assert_eq!(index(&lifecycle)[0], row("a", "", "UNAVAILABLE", "unloaded"));
}

#[tokio::test]
async fn on_demand_loads_on_the_first_request_and_evicts_the_least_recently_used() {
    let repo = Repository::new();
    for name in ["pinned", "b", "c"] {
        repo.add(name, &[1], "");
    }
    repo.add("broken", &[1], r#"parameters { key: "fake.fail" value: { string_value: "no weights" } }"#);
    let budget = Budget { bytes: Some(2 * FAKE_BYTES), ..Budget::default() };
    let (lifecycle, loader) = lifecycle(ControlMode::OnDemand, Some(&repo.path()), budget, None);
    lifecycle.start(&["pinned".into()]).await.unwrap();
    assert_eq!(index(&lifecycle)[0], row("b", "", "UNAVAILABLE", "not resident; the first request for it loads it"));

    let b = lifecycle.resolve("b", None).await.unwrap();
    assert_eq!(b.name, "b");
    drop(b);
    lifecycle.resolve("c", None).await.unwrap();
    let rows = index(&lifecycle);
    assert_eq!(
        rows[0],
        row("b", "", "UNAVAILABLE", "evicted to stay within the memory budget; the next request loads it again")
    );
    assert_eq!(rows[2], row("c", "1", "READY", ""));
    assert_eq!(rows[3], row("pinned", "1", "READY", ""), "the pinned model stays");
    let metrics = lifecycle.metrics().render();
    assert!(metrics.contains(r#"plinth_model_evictions_total{model="b"} 1"#), "{metrics}");
    assert!(metrics.contains("plinth_residency_misses_total 2"), "{metrics}");

    let failed = lifecycle.resolve("broken", None).await.unwrap_err();
    assert!(
        matches!(&failed, Error::Unavailable(m) if m.contains("model 'broken' cannot be loaded: version 1: no weights")),
        "{failed:?}"
    );
    let loads = loader.count();
    lifecycle.resolve("broken", None).await.unwrap_err();
    assert_eq!(loader.count(), loads, "a failed load is not retried until its files change");
    lifecycle.resolve("c", None).await.unwrap();
    assert!(lifecycle.metrics().render().contains("plinth_residency_hits_total 1"));
}

#[tokio::test]
async fn modelmesh_loads_from_the_path_it_is_given_under_its_id() {
    let repo = Repository::new();
    repo.add("model", &[1], r#"name: "model""#).add("other", &[1], "");
    let budget = Budget { bytes: Some(10 * FAKE_BYTES), ..Budget::default() };
    let (lifecycle, loader) = lifecycle(ControlMode::ModelMesh, None, budget, None);
    let mesh = lifecycle.modelmesh().unwrap();
    let folder = || Source::of(&repo.model_path("model"), "").unwrap();

    assert_eq!(mesh.load("mm-1", folder()).await, Ok(FAKE_BYTES), "served under the id, whatever config.pbtxt says");
    assert_eq!(lifecycle.resolve("mm-1", None).await.unwrap().name, "mm-1");
    assert_eq!(mesh.load("mm-1", folder()).await, Ok(FAKE_BYTES));
    assert_eq!(loader.count(), 1, "loading an id again from the same path is ModelMesh retrying");
    let elsewhere = mesh.load("mm-1", Source::of(&repo.model_path("other"), "").unwrap()).await.unwrap_err();
    assert!(matches!(&elsewhere, LoadError::Invalid(m) if m.contains("unload it before loading")), "{elsewhere:?}");
    assert_eq!(mesh.model_size("mm-1"), Some(FAKE_BYTES));
    assert!(matches!(mesh.load("", folder()).await, Err(LoadError::Invalid(_))));

    mesh.unload("mm-1").await;
    mesh.unload("mm-1").await;
    assert_eq!(index(&lifecycle), [], "an unloaded id leaves no trace");
    assert_eq!(mesh.model_size("mm-1"), None);
    assert!(
        lifecycle
            .load("mm-1", LoadRequest::default())
            .await
            .unwrap_err()
            .to_string()
            .contains("ModelMesh loads and unloads")
    );
}

#[tokio::test]
async fn modelmesh_refuses_what_does_not_fit_and_evicts_nothing() {
    let repo = Repository::new();
    repo.add("model", &[1], "");
    let budget = Budget { bytes: Some(FAKE_BYTES + FAKE_BYTES / 2), ..Budget::default() };
    let (lifecycle, _) = lifecycle(ControlMode::ModelMesh, None, budget, None);
    let mesh = lifecycle.modelmesh().unwrap();
    mesh.load("first", Source::of(&repo.model_path("model"), "").unwrap()).await.unwrap();
    let refused = mesh.load("second", Source::of(&repo.model_path("model"), "").unwrap()).await.unwrap_err();
    assert!(matches!(&refused, LoadError::Failed(m) if m.contains("only 0.5 MiB of the 1.5 MiB")), "{refused:?}");
    assert!(lifecycle.resolve("first", None).await.is_ok(), "nothing was evicted for it");
    assert!(lifecycle.resolve("second", None).await.is_err(), "and nothing of it stays loaded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_during_a_load_aborts_that_load() {
    let repo = Repository::new();
    repo.add("model", &[1], "");
    let gate = Gate::closed();
    let (lifecycle, _) = lifecycle(ControlMode::ModelMesh, None, NO_BUDGET, Some(gate.clone()));
    let (loading, source) = (lifecycle.clone(), Source::of(&repo.model_path("model"), "").unwrap());
    let load = tokio::spawn(async move { loading.modelmesh().unwrap().load("mm", source).await });
    tokio::task::spawn_blocking({
        let gate = gate.clone();
        move || gate.wait_for_waiters(1)
    })
    .await
    .unwrap();
    // Polled once, the purge counts itself and waits for the load's record.
    let mut purge = Box::pin(async { lifecycle.modelmesh().unwrap().purge().await });
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(purge.as_mut().poll(&mut cx).is_pending());
    gate.open();
    let result = load.await.unwrap();
    assert!(matches!(&result, Err(LoadError::Aborted(m)) if m.contains("unloaded by runtimeStatus")), "{result:?}");
    purge.await;
    assert_eq!(index(&lifecycle), []);
}

#[tokio::test]
async fn composed_calls_run_through_the_callee_as_a_client_request_would() {
    let repo = Repository::new();
    repo.add("a", &[1], "");
    let (lifecycle, _) = lifecycle(ControlMode::OnDemand, Some(&repo.path()), NO_BUDGET, None);
    lifecycle.start(&[]).await.unwrap();
    let runner: Arc<dyn ModelRunner> = lifecycle.clone();
    let outputs = runner
        .clone()
        .infer("a".into(), None, Doubler::input(&[1.5]), vec![], RequestOptions::default())
        .await
        .unwrap();
    assert_eq!(Doubler::values(&outputs[0]), [3.0], "an on-demand callee loads on the first call");
    let no_plugin = runner.clone().predict("a".into(), None, Default::default(), vec!["caller".into()], None).await;
    assert!(
        matches!(&no_plugin, Err(Error::InvalidArgument(m)) if m.contains("model 'a' has no plugin")),
        "{no_plugin:?}"
    );
    let unknown = runner.infer("zzz".into(), None, vec![], vec![], RequestOptions::default()).await.unwrap_err();
    assert_eq!(unknown, Error::NotFound("Request for unknown model: 'zzz' is not found".into()));
}

/// Runs `IN` = `x` through `model` as a client (or a plugin) would.
async fn run(lifecycle: &Arc<super::Lifecycle>, model: &str, x: f32) -> Result<Vec<f32>, Error> {
    let runner: Arc<dyn ModelRunner> = lifecycle.clone();
    let input = vec![crate::tensor::Tensor { name: "IN".into(), ..Doubler::input(&[x]).remove(0) }];
    let outputs = runner.infer(model.into(), None, input, vec![], RequestOptions::default()).await?;
    Ok(Doubler::values(&outputs[0]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ensemble_loads_its_steps_and_runs_them_as_a_graph() {
    let repo = Repository::new();
    repo.add("a", &[1], "").add("b", &[1], "").add_chain("twice_twice", &["a", "b"]);
    repo.add(
        "three",
        &[1],
        r#"platform: "ensemble"
           input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
           output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
           ensemble_scheduling { step [
             { model_name: "twice_twice" model_version: -1 input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "T" } },
             { model_name: "a" model_version: -1 input_map { key: "x" value: "T" } output_map { key: "y" value: "OUT" } } ] }"#,
    );
    let (lifecycle, _) = lifecycle(ControlMode::Explicit, Some(&repo.path()), NO_BUDGET, None);
    lifecycle.start(&[]).await.unwrap();
    lifecycle.load("three", LoadRequest::default()).await.unwrap();
    let ready: Vec<String> = index(&lifecycle).into_iter().filter(|r| r.2 == "READY").map(|r| r.0).collect();
    assert_eq!(ready, ["a", "b", "three", "twice_twice"], "loading an ensemble loads what its steps run");
    assert_eq!(run(&lifecycle, "twice_twice", 1.5).await.unwrap(), [6.0]);
    assert_eq!(run(&lifecycle, "three", 1.0).await.unwrap(), [8.0], "an ensemble may run an ensemble");
    let ensemble = lifecycle.resolve("three", None).await.unwrap();
    assert_eq!(ensemble.platform(), "ensemble");

    // A step whose model is gone fails the request as unavailable, naming it.
    lifecycle.unload("b", false).await.unwrap();
    let failed = run(&lifecycle, "three", 1.0).await.unwrap_err();
    assert!(
        matches!(&failed, Error::Unavailable(m) if m.starts_with("in ensemble 'three', in ensemble 'twice_twice', ") && m.ends_with("(step 1, model 'b') (step 0, model 'twice_twice')")),
        "{failed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensembles_that_do_not_fit_their_steps_or_run_themselves_fail_to_load() {
    let repo = Repository::new();
    repo.add("a", &[1], "").add_chain("loop_1", &["loop_2"]).add_chain("loop_2", &["loop_1"]);
    repo.add(
        "misfit",
        &[1],
        r#"platform: "ensemble"
           input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
           output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
           ensemble_scheduling { step [ { model_name: "a" model_version: -1 input_map { key: "z" value: "IN" } output_map { key: "y" value: "OUT" } } ] }"#,
    );
    let (lifecycle, _) = lifecycle(ControlMode::Explicit, Some(&repo.path()), NO_BUDGET, None);
    lifecycle.start(&[]).await.unwrap();
    let misfit = lifecycle.load("misfit", LoadRequest::default()).await.unwrap_err().to_string();
    assert!(misfit.contains("in ensemble 'misfit', step 0 (model 'a'): ensemble tensor 'IN' is mapping to non-existing input z in model a"), "{misfit}");
    assert!(misfit.contains("input x in model a is not mapped to any ensemble tensors"), "{misfit}");
    let cycle = lifecycle.load("loop_1", LoadRequest::default()).await.unwrap_err().to_string();
    assert!(cycle.contains("circular dependency between ensembles: loop_1 -> loop_2 -> loop_1"), "{cycle}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unload_dependents_takes_an_ensemble_and_its_steps_out_together() {
    let repo = Repository::new();
    repo.add("a", &[1], "").add("b", &[1], "").add_chain("pair", &["a", "b"]).add_chain("solo", &["a"]);
    let (lifecycle, _) = lifecycle(ControlMode::Explicit, Some(&repo.path()), NO_BUDGET, None);
    lifecycle.start(&[]).await.unwrap();
    for model in ["pair", "solo"] {
        lifecycle.load(model, LoadRequest::default()).await.unwrap();
    }
    lifecycle.unload("pair", true).await.unwrap();
    let ready = |lifecycle: &super::Lifecycle| -> Vec<String> {
        index(lifecycle).into_iter().filter(|r| r.2 == "READY").map(|r| r.0).collect()
    };
    assert_eq!(ready(&lifecycle), ["a", "solo"], "b went with pair; a stays for solo");
    lifecycle.unload("a", true).await.unwrap();
    assert_eq!(ready(&lifecycle), Vec::<String>::new(), "solo runs a, so it went with it");
}

/// `fake.gpu_bytes` for a model configuration, plus `extra`.
fn on_gpu(bytes: u64, extra: &str) -> String {
    format!(r#"parameters {{ key: "fake.gpu_bytes" value: {{ string_value: "{bytes}" }} }} {extra}"#)
}

#[tokio::test]
async fn a_gpu_limit_evicts_the_models_on_that_gpu() {
    let repo = Repository::new();
    repo.add("cpu", &[1], "").add("a", &[1], &on_gpu(600, "")).add("b", &[1], &on_gpu(600, ""));
    let budget = Budget { gpu: [(0, 1000)].into(), ..Budget::default() };
    let (lifecycle, _) = lifecycle(ControlMode::OnDemand, Some(&repo.path()), budget, None);
    lifecycle.start(&[]).await.unwrap();
    lifecycle.resolve("a", None).await.unwrap();
    lifecycle.resolve("cpu", None).await.unwrap();
    // "a" is the least recently used model on GPU 0; "cpu", more recent,
    // would free nothing there and stays.
    lifecycle.resolve("b", None).await.unwrap();
    let rows = index(&lifecycle);
    assert_eq!(rows[0].2, "UNAVAILABLE", "{rows:?}");
    assert_eq!(rows[1], row("b", "1", "READY", ""));
    assert_eq!(rows[2], row("cpu", "1", "READY", ""));
    let metrics = lifecycle.metrics().render();
    assert!(metrics.contains(r#"plinth_model_gpu_memory_bytes{gpu="0",model="b"} 600"#), "{metrics}");
    assert!(!metrics.contains(r#"plinth_model_gpu_memory_bytes{gpu="0",model="a"}"#), "{metrics}");

    // Back again: "a" is no swap of itself (nothing of it serves) and
    // evicts "b" in turn.
    lifecycle.resolve("a", None).await.unwrap();
    let rows = index(&lifecycle);
    assert_eq!(rows[0], row("a", "1", "READY", ""), "{rows:?}");
    assert_eq!(rows[1].2, "UNAVAILABLE", "{rows:?}");
}

#[tokio::test]
async fn a_swap_that_does_not_fit_on_its_gpu_is_refused_or_unloads_first() {
    let repo = Repository::new();
    repo.add("m", &[1], &on_gpu(600, ""));
    let budget = Budget { gpu: [(0, 1000)].into(), ..Budget::default() };
    let (lifecycle, loader) = lifecycle(ControlMode::Explicit, Some(&repo.path()), budget, None);
    lifecycle.start(&["m".into()]).await.unwrap();

    // Version 2 beside version 1 would need 1200 of the limit's 1000.
    repo.add("m", &[2], &on_gpu(600, ""));
    let refused = lifecycle.load("m", LoadRequest::default()).await.unwrap_err();
    let message = refused.message();
    assert!(matches!(refused, LoadError::NoRoom(_)), "{refused:?}");
    assert!(message.contains("model 'm': a new version does not fit beside the one serving"), "{message}");
    assert!(message.contains("--model-load-gpu-limit") && message.contains("gpu_swap_policy"), "{message}");
    let rows = index(&lifecycle);
    assert!(rows.contains(&row("m", "1", "READY", "")), "version 1 serves on: {rows:?}");
    assert!(lifecycle.resolve("m", None).await.is_ok(), "and answers");
    let loads = loader.count();

    // Opting in, the serving version goes first and version 2 loads.
    let unload_first = r#"parameters { key: "gpu_swap_policy" value: { string_value: "unload_first" } }"#;
    repo.add("m", &[2], &on_gpu(600, unload_first));
    lifecycle.load("m", LoadRequest::default()).await.unwrap();
    assert_eq!(loader.count(), loads + 1);
    assert_eq!(index(&lifecycle), [row("m", "2", "READY", "")], "no trace of the unload but version 1 gone");

    // Without a limit, the device's own free memory (NVML's) counts.
    let repo = Repository::new();
    repo.add("n", &[1], &on_gpu(600, ""));
    let (lifecycle, loader) = super::testing::lifecycle(ControlMode::Explicit, Some(&repo.path()), NO_BUDGET, None);
    lifecycle.start(&["n".into()]).await.unwrap();
    *loader.gpu_free.lock() = Some(500);
    repo.add("n", &[2], &on_gpu(600, ""));
    let refused = lifecycle.load("n", LoadRequest::default()).await.unwrap_err();
    assert!(refused.message().contains("GPU 0 has 0.0 MiB free"), "{refused:?}");
    assert_eq!(loader.count(), 1, "nothing was loaded");
    // Unloading first does not help when something else holds the memory.
    let unload_first = r#"parameters { key: "gpu_swap_policy" value: { string_value: "unload_first" } }"#;
    repo.add("n", &[2], &on_gpu(600, unload_first));
    let refused = lifecycle.load("n", LoadRequest::default()).await.unwrap_err();
    assert!(refused.message().contains("the versions serving were unloaded, but GPU 0 has"), "{refused:?}");
    assert_eq!(loader.count(), 1, "nothing was loaded");
    // A version moved to the CPU needs no room on the GPU.
    repo.add("n", &[2], r#"instance_group [{ kind: KIND_CPU }]"#);
    lifecycle.load("n", LoadRequest::default()).await.unwrap();
    assert_eq!(index(&lifecycle), [row("n", "2", "READY", "")]);
    assert_eq!(loader.count(), 2);
    let bad = r#"parameters { key: "gpu_swap_policy" value: { string_value: "sometimes" } }"#;
    repo.add("n", &[2], &on_gpu(600, bad));
    let refused = lifecycle.load("n", LoadRequest::default()).await.unwrap_err();
    assert!(refused.message().contains("parameter 'gpu_swap_policy' must be"), "{refused:?}");
}

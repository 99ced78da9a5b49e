//! The plugin host in-process, with the test plugin that misbehaves on
//! request (`plugins/faulty`, built by `make setup`) and a fake
//! [`ModelRunner`]: limits, traps, replaced instances, errors and
//! composition.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::compose::BoxFuture;
use super::{
    CallContext, ModelInfo, ModelRunner, Plugin, PluginError, PluginHost, PluginLimits, RawRequest, RawResponse,
};
use crate::config::Signature;
use crate::error::{Error, Overload};
use crate::metrics::Metrics;
use crate::tensor::{DataType, Tensor, TensorSpec};

/// The misbehaving test plugin.
fn faulty_wasm() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/target/wasm32-wasip2/release/faulty.wasm");
    assert!(path.is_file(), "{} is missing: run `make setup` first", path.display());
    path
}

/// Answers composed calls: `infer` with the inputs as they came, `predict`
/// with "from MODEL", except that models named `loading`, `busy` and
/// `missing` refuse as an unavailable, overloaded and unknown callee;
/// records each call with the chain it carried.
#[derive(Default)]
struct Runner {
    calls: Mutex<Vec<(String, Vec<String>)>>,
}

impl ModelRunner for Runner {
    fn infer(
        self: Arc<Self>,
        model: String,
        _: Option<u64>,
        inputs: Vec<Tensor>,
        _: Vec<String>,
        _: crate::scheduler::policy::RequestOptions,
    ) -> BoxFuture<Result<Vec<Tensor>, Error>> {
        self.calls.lock().push((model, Vec::new()));
        Box::pin(async move { Ok(inputs) })
    }

    fn signature(self: Arc<Self>, model: String, _: Option<u64>) -> BoxFuture<Result<Signature, Error>> {
        Box::pin(async move { Err(Error::NotFound(format!("no model '{model}' here"))) })
    }

    fn predict(
        self: Arc<Self>,
        model: String,
        _: Option<u64>,
        _: RawRequest,
        chain: Vec<String>,
        _: Option<crate::trace::Span>,
    ) -> BoxFuture<Result<RawResponse, Error>> {
        let body = format!("from {model}").into_bytes();
        let refusal = match model.as_str() {
            "loading" => Some(Error::Unavailable("model 'loading' is LOADING".into())),
            "busy" => Some(Error::Overloaded(Overload { message: "queue full".into(), retry_after_secs: 7 })),
            "missing" => Some(Error::NotFound("unknown model 'missing'".into())),
            _ => None,
        };
        self.calls.lock().push((model, chain));
        Box::pin(async move {
            match refusal {
                Some(e) => Err(e),
                None => Ok(RawResponse { content_type: "text/plain".into(), body }),
            }
        })
    }
}

struct Fixture {
    plugin: Arc<Plugin>,
    runner: Arc<Runner>,
    metrics: Arc<Metrics>,
    _model_dir: tempfile::TempDir,
}

/// The faulty plugin for model `m` (one FP32 input `x` of dims `[2]`), with
/// `limits`.
fn load(limits: PluginLimits) -> Fixture {
    let host = PluginHost::new(limits, None).unwrap();
    let model_dir = tempfile::tempdir().unwrap();
    let spec = |name: &str| TensorSpec::new(name, DataType::Fp32, &[2]);
    let info = ModelInfo {
        name: "m".into(),
        version: 1,
        signature: Signature { max_batch_size: 4, inputs: vec![spec("x")], outputs: vec![spec("y")] },
        parameters: Vec::new(),
        metadata: Vec::new(),
    };
    let metrics = Arc::new(Metrics::new());
    let plugin = host.load(&faulty_wasm(), model_dir.path(), info, limits, metrics.for_plugin("m", 1)).unwrap();
    Fixture { plugin: Arc::new(plugin), runner: Arc::default(), metrics, _model_dir: model_dir }
}

impl Fixture {
    fn context(&self, chain: &[&str]) -> CallContext {
        CallContext {
            runner: self.runner.clone(),
            chain: chain.iter().map(|m| m.to_string()).collect(),
            sequence: None,
            trace: None,
        }
    }

    async fn preprocess(&self, body: &str) -> Result<Vec<Tensor>, PluginError> {
        let request = RawRequest { body: body.into(), ..RawRequest::default() };
        self.plugin.preprocess(Arc::new(request), self.context(&["m"])).await
    }

    async fn postprocess(&self, body: &str, chain: &[&str]) -> Result<RawResponse, PluginError> {
        let request = RawRequest { body: body.into(), ..RawRequest::default() };
        self.plugin.postprocess(Arc::new(request), Vec::new(), self.context(chain)).await
    }

    fn metric(&self, series: &str) -> String {
        let text = self.metrics.render();
        text.lines().find(|l| l.starts_with(series)).unwrap_or_else(|| panic!("no {series} in {text}")).to_owned()
    }
}

fn failed(result: Result<impl std::fmt::Debug, PluginError>) -> String {
    match result {
        Err(PluginError::Failed(m)) => m,
        other => panic!("expected a plugin failure, got {other:?}"),
    }
}

#[test]
fn a_model_s_limits_win_over_the_server_s() {
    let server = PluginLimits { memory_bytes: 1 << 30, ..PluginLimits::default() };
    let own = crate::config::parameters::PluginParameters {
        memory_bytes: Some(512 << 20),
        timeout: Some(Duration::from_millis(50)),
        instances: Some(3),
        ..Default::default()
    };
    let model = server.for_model(&own);
    assert_eq!((model.memory_bytes, model.call_timeout, model.instances), (512 << 20, Duration::from_millis(50), 3));
    let unset = server.for_model(&Default::default());
    assert_eq!((unset.memory_bytes, unset.call_timeout), (1 << 30, server.call_timeout));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trapping_plugin_fails_its_call_and_the_next_call_gets_a_fresh_instance() {
    let f = load(PluginLimits::default());
    let error = failed(f.preprocess("trap").await);
    assert!(error.starts_with("plugin 'faulty.wasm' of model 'm' trapped in preprocess"), "{error}");
    assert!(error.contains("it panicked at faulty/src/lib.rs:"), "the panic's location is given: {error}");
    assert!(!error.contains("deliberate trap"), "its message stays in the log: {error}");
    assert!(!error.contains("RUST_BACKTRACE") && !error.contains('\n'), "{error}");
    let detailed = load(PluginLimits { panic_details: true, ..PluginLimits::default() });
    let error = failed(detailed.preprocess("trap").await);
    assert!(error.ends_with(": deliberate trap requested by the test"), "--plugin-panic-details quotes it: {error}");
    let inputs = f.preprocess("ok").await.unwrap();
    assert_eq!((inputs[0].name.as_str(), inputs[0].shape.as_slice()), ("x", &[1, 2][..]));
    assert_eq!(f.metric("plinth_plugin_traps_total"), r#"plinth_plugin_traps_total{model="m",version="1"} 1"#);
    assert_eq!(
        f.metric("plinth_plugin_instance_starts_total"),
        r#"plinth_plugin_instance_starts_total{model="m",version="1"} 2"#,
        "the first instance, and the one replacing it"
    );
    assert!(f.metric("plinth_plugin_failures_total").ends_with(" 1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_past_its_time_or_memory_limit_is_stopped() {
    let limits =
        PluginLimits { call_timeout: Duration::from_millis(1000), memory_bytes: 64 << 20, ..PluginLimits::default() };
    let f = load(limits);
    let error = failed(f.preprocess("loop").await);
    assert_eq!(
        error,
        "plugin 'faulty.wasm' of model 'm' exceeded its time limit of 1000 ms in preprocess and was stopped"
    );
    let error = failed(f.preprocess("alloc").await);
    assert!(error.contains("memory allocation of 1073741824 bytes failed"), "{error}");
    assert!(f.preprocess("ok").await.is_ok(), "the next call is served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_the_request_s_fault_not_the_plugin_s() {
    let f = load(PluginLimits::default());
    let result = f.preprocess("bad").await;
    assert_eq!(
        result.unwrap_err(),
        PluginError::Refused(Error::InvalidArgument("plugin 'faulty.wasm' of model 'm': deliberate bad input".into()))
    );
    assert!(!f.metrics.render().contains("plinth_plugin_failures_total{"), "a refusal is not a plugin failure");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn composed_calls_reach_the_runner_with_the_request_s_chain() {
    let f = load(PluginLimits::default());
    let response = f.postprocess("call:callee/ok", &["outer", "m"]).await.unwrap();
    assert_eq!(response.body, b"from callee");
    let inferred = f.postprocess("self-infer", &["m"]).await.unwrap();
    let outputs: serde_json::Value = serde_json::from_slice(&inferred.body).unwrap();
    assert_eq!(outputs["outputs"][0]["shape"], serde_json::json!([1, 2]), "{outputs}");
    let calls = f.runner.calls.lock().clone();
    assert_eq!(calls, [("callee".to_owned(), vec!["outer".to_owned(), "m".to_owned()]), ("m".to_owned(), vec![])]);

    let cycle = failed(f.postprocess("call:outer/ok", &["outer", "m"]).await);
    assert!(
        cycle.contains("calling model 'outer' from outer → m would be a cycle (outer → m → outer); nothing ran"),
        "{cycle}"
    );
    let deep: Vec<String> = (0..8).map(|i| format!("m{i}")).collect();
    let chain: Vec<&str> = deep.iter().map(String::as_str).collect();
    let too_deep = failed(f.postprocess("call:callee/ok", &chain).await);
    assert!(too_deep.contains("would pass through more than 8 plugins"), "{too_deep}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callee_s_refusal_passed_on_keeps_its_class() {
    let f = load(PluginLimits::default());
    let prefix = "plugin 'faulty.wasm' of model 'm': model";
    let refused = |result: Result<RawResponse, PluginError>| match result {
        Err(PluginError::Refused(e)) => e,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(
        refused(f.postprocess("call:loading/ok", &["m"]).await),
        Error::Unavailable(format!("{prefix} 'loading': model 'loading' is LOADING"))
    );
    assert_eq!(
        refused(f.postprocess("call:busy/ok", &["m"]).await),
        Error::Overloaded(Overload { message: format!("{prefix} 'busy': queue full"), retry_after_secs: 7 })
    );
    assert_eq!(
        refused(f.postprocess("call:missing/ok", &["m"]).await),
        Error::NotFound(format!("{prefix} 'missing': unknown model 'missing'"))
    );
    assert!(!f.metrics.render().contains("plinth_plugin_failures_total{"), "a passed-on refusal is not a failure");
}

/// A call awaited on the runtime's thread that turns out slow yields at
/// every epoch tick: on a runtime of one thread, another task runs while
/// the plugin loops until its time limit.
#[test]
fn a_slow_call_on_the_runtime_s_thread_lets_other_tasks_run() {
    let limits = PluginLimits { call_timeout: Duration::from_millis(300), ..PluginLimits::default() };
    let f = load(limits);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        f.preprocess("ok").await.unwrap();
        // A fast stage's mean, set rather than measured: a loaded machine
        // may take longer than the inline bound on the first calls.
        for _ in 0..64 {
            f.plugin.timing.remember(crate::metrics::PluginStage::Preprocess, Duration::from_micros(1));
        }
        assert!(f.plugin.timing.runs_inline(crate::metrics::PluginStage::Preprocess), "a fast stage runs inline");
        let ran = Arc::new(Mutex::new(Vec::new()));
        let other = tokio::spawn({
            let ran = ran.clone();
            async move {
                loop {
                    ran.lock().push(std::time::Instant::now());
                    tokio::task::yield_now().await;
                }
            }
        });
        let started = std::time::Instant::now();
        let error = failed(f.preprocess("loop").await);
        let ended = std::time::Instant::now();
        other.abort();
        assert!(error.contains("exceeded its time limit of 300 ms"), "{error}");
        let ran = ran.lock();
        assert!(
            ran.iter().any(|t| *t > started && *t < ended),
            "the other task ran while the plugin looped ({} runs, none during the call)",
            ran.len()
        );
    });
}

/// The exported SmolLM2 (`make setup-models`): its ONNX Runtime GenAI
/// folder and transformers' reference continuations.
fn smollm2() -> (PathBuf, serde_json::Value) {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.cache/smollm2");
    let reference = std::fs::read(cache.join("reference.json"))
        .unwrap_or_else(|e| panic!("{}/reference.json: {e}: run `make setup-models` first", cache.display()));
    (cache.join("fp32"), serde_json::from_slice(&reference).unwrap())
}

/// The generic text-generation plugin over `model_dir`.
fn text_generation(model_dir: &Path) -> Arc<Plugin> {
    let wasm =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/target/wasm32-wasip2/release/text_generation.wasm");
    let limits = PluginLimits::default();
    let host = PluginHost::new(limits, None).unwrap();
    let info = ModelInfo {
        name: "smollm2".into(),
        version: 1,
        signature: Signature { max_batch_size: 0, inputs: Vec::new(), outputs: Vec::new() },
        parameters: Vec::new(),
        metadata: Vec::new(),
    };
    let metrics = Arc::new(Metrics::new());
    Arc::new(host.load(&wasm, model_dir, info, limits, metrics.for_plugin("smollm2", 1)).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_text_generation_plugin_tokenizes_and_detokenizes_as_transformers_does() {
    use super::{ChatMessage, Prompt};
    let (model_dir, reference) = smollm2();
    let plugin = text_generation(&model_dir);
    assert_eq!(plugin.stop_token_ids().await.unwrap(), [2], "<|im_end|>, the GGUF's end of sequence");
    for case in reference["cases"].as_array().unwrap() {
        let prompt = match case["kind"].as_str().unwrap() {
            "chat" => Prompt::Chat(serde_json::from_value::<Vec<ChatMessage>>(case["prompt"].clone()).unwrap()),
            _ => Prompt::Text(case["prompt"].as_str().unwrap().to_owned()),
        };
        let ids: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
        assert_eq!(plugin.encode(prompt.clone()).await.unwrap(), ids, "{prompt:?}");
        // The generated ids one at a time, as the decode loop sends them.
        let generated: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        let (mut text, mut start, mut read) = (String::new(), 0, 0);
        for end in 1..=generated.len() {
            let step = plugin.decode(generated[start..end].to_vec(), read).await.unwrap();
            text.push_str(&step.text);
            (start, read) = (start + step.prefix, step.read);
        }
        let rest = plugin.decode(generated[start..].to_vec(), read).await.unwrap();
        assert_eq!(rest.text, "", "everything was sent as it came");
        assert_eq!(text, case["text"].as_str().unwrap(), "{prompt:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_does_not_generate_refuses_to_tokenize() {
    let f = load(PluginLimits::default());
    let refused = f.plugin.encode(super::Prompt::Text("hello".into())).await;
    assert!(
        matches!(&refused, Err(PluginError::Refused(Error::InvalidArgument(m))) if m.contains("does not tokenize")),
        "{refused:?}"
    );
}

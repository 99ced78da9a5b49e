//! One plugin call measured in this process, without HTTP: ocr_cls's
//! `postprocess` (two probabilities in, a small JSON answer out) through
//! Plinth's plugin host, as the server makes it from an async worker
//! thread. Measured back to back (caches warm) and right after an ONNX
//! Runtime run of ocr_cls, as in the server, where the model's run has
//! just passed through the caches.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ort::session::Session;
use plinth::config::Signature;
use plinth::error::Error;
use plinth::metrics::Metrics;
use plinth::plugin::compose::BoxFuture;
use plinth::plugin::{CallContext, ModelInfo, ModelRunner, PluginHost, PluginLimits, RawRequest, RawResponse};
use plinth::scheduler::policy::RequestOptions;
use plinth::tensor::{DataType, Tensor, TensorSpec};
use plinth::trace::Span;
use plinth_tests::{example_repository, fixture};

/// Calls per figure; the median is kept.
const CALLS: usize = 501;

/// The median call time warm and right after a model run.
pub struct CallTimes {
    pub warm: Duration,
    pub after_model: Duration,
}

/// ocr_cls's `postprocess` on `cls_rotated.png`'s request, warm and after
/// a batch-1 run of `session` (ocr_cls) each time.
pub fn measure(session: &mut Session) -> CallTimes {
    let folder = example_repository().join("ocr_cls");
    let spec = |name: &str, dims: &[i64]| TensorSpec::new(name, DataType::Fp32, dims);
    let output = "save_infer_model/scale_0.tmp_1";
    let info = ModelInfo {
        name: "ocr_cls".into(),
        version: 1,
        signature: Signature {
            max_batch_size: 8,
            inputs: vec![spec("x", &[3, 48, 192])],
            outputs: vec![spec(output, &[2])],
        },
        parameters: Vec::new(),
        metadata: Vec::new(),
    };
    let limits = PluginLimits::default();
    let host = PluginHost::new(limits, None).expect("the plugin host starts");
    let metrics = Metrics::new();
    let plugin = host
        .load(&folder.join("ocr_cls.wasm"), &folder.join("1"), info, limits, metrics.for_plugin("ocr_cls", 1))
        .expect("ocr_cls's plugin loads");
    let plugin = Arc::new(plugin);
    let request = Arc::new(RawRequest {
        content_type: "image/png".into(),
        body: fixture("cls_rotated.png"),
        parameters: Vec::new(),
    });
    let probabilities: Vec<u8> = [0.25f32, 0.75].iter().flat_map(|v| v.to_le_bytes()).collect();
    let outputs = Tensor { name: output.into(), datatype: DataType::Fp32, shape: vec![1, 2], data: probabilities };
    let input = crate::common::input_tensor(1);
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    // A spawned task, so that the calls start from a worker thread as a
    // request's do.
    let call = |plugin: Arc<plinth::plugin::Plugin>| {
        let (request, outputs) = (request.clone(), outputs.clone());
        async move {
            let context =
                CallContext { runner: Arc::new(NoModels), chain: vec!["ocr_cls".into()], sequence: None, trace: None };
            let started = Instant::now();
            let answer = plugin.postprocess(request, vec![outputs], context).await.expect("postprocess answers");
            let took = started.elapsed();
            assert_eq!(answer.content_type, "application/json");
            took
        }
    };
    let mut warm = Vec::new();
    let mut after_model = Vec::new();
    for _ in 0..CALLS {
        warm.push(runtime.block_on(runtime.spawn(call(plugin.clone()))).expect("the task"));
    }
    for _ in 0..CALLS {
        session.run(ort::inputs!["x" => input.view()]).expect("ONNX Runtime runs");
        after_model.push(runtime.block_on(runtime.spawn(call(plugin.clone()))).expect("the task"));
    }
    CallTimes { warm: median(warm), after_model: median(after_model) }
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// ocr_cls's plugin composes no call; any would be a benchmark bug.
struct NoModels;

impl ModelRunner for NoModels {
    fn infer(
        self: Arc<Self>,
        model: String,
        _: Option<u64>,
        _: Vec<Tensor>,
        _: Vec<String>,
        _: RequestOptions,
    ) -> BoxFuture<Result<Vec<Tensor>, Error>> {
        Box::pin(async move { Err(Error::NotFound(format!("no model '{model}' in this benchmark"))) })
    }

    fn signature(self: Arc<Self>, model: String, _: Option<u64>) -> BoxFuture<Result<Signature, Error>> {
        Box::pin(async move { Err(Error::NotFound(format!("no model '{model}' in this benchmark"))) })
    }

    fn predict(
        self: Arc<Self>,
        model: String,
        _: Option<u64>,
        _: RawRequest,
        _: Vec<String>,
        _: Option<Span>,
    ) -> BoxFuture<Result<RawResponse, Error>> {
        Box::pin(async move { Err(Error::NotFound(format!("no model '{model}' in this benchmark"))) })
    }
}

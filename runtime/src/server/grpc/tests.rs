//! The gRPC service in-process (its trait's methods called with
//! `Request::new`, no socket, no binary) over the same service, lifecycle
//! and fake backends as the HTTP router's tests, for what those cover; and
//! one table of inference requests sent through both front ends, which
//! must get the same answer and status.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::http::StatusCode;
use serde_json::{Value, json};
use tonic::{Code, Request};
use tower::ServiceExt;

use super::Grpc;
use crate::lifecycle::ControlMode;
use crate::lifecycle::testing::{Repository, lifecycle};
use crate::protocol::grpc::proto::grpc_inference_service_server::GrpcInferenceService;
use crate::protocol::grpc::proto::infer_parameter::ParameterChoice as P;
use crate::protocol::grpc::proto::{self as pb, model_infer_request as mir};
use crate::residency::Budget;
use crate::server::error::statuses;
use crate::server::service::Settings;
use crate::server::{Service, router};

const NO_BUDGET: Budget = Budget { bytes: None, models: None, gpu: std::collections::BTreeMap::new() };

/// A started service in `mode` over a repository holding the doubler
/// `twice` (versions 2, 9 and 10, all served), and its gRPC face.
async fn started(mode: ControlMode) -> (Repository, Arc<Service>, Grpc) {
    let repo = Repository::new();
    repo.add("twice", &[2, 9, 10], "version_policy: { all: {} }");
    let (lifecycle, _) = lifecycle(mode, Some(&repo.path()), NO_BUDGET, None);
    lifecycle.start(&["*".into()]).await.unwrap();
    let service = Arc::new(Service::new(lifecycle, Settings::for_tests()));
    service.startup_done.store(true, Ordering::Release);
    let grpc = Grpc { service: service.clone() };
    (repo, service, grpc)
}

/// A request to `twice` with the FP32 input `x` [2, 1] = [1.5, -2].
fn infer_request(model: &str, version: &str) -> pb::ModelInferRequest {
    pb::ModelInferRequest {
        model_name: model.into(),
        model_version: version.into(),
        id: "r1".into(),
        inputs: vec![mir::InferInputTensor {
            name: "x".into(),
            datatype: "FP32".into(),
            shape: vec![2, 1],
            contents: Some(pb::InferTensorContents { fp32_contents: vec![1.5, -2.0], ..Default::default() }),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

#[tokio::test]
async fn inference_returns_the_model_s_values() {
    let (_repo, _service, grpc) = started(ControlMode::Explicit).await;
    let answer = grpc.model_infer(Request::new(infer_request("twice", ""))).await.unwrap().into_inner();
    assert_eq!((answer.model_name.as_str(), answer.model_version.as_str(), answer.id.as_str()), ("twice", "10", "r1"));
    assert_eq!(answer.outputs[0].name, "y");
    assert_eq!((answer.outputs[0].datatype.as_str(), answer.outputs[0].shape.as_slice()), ("FP32", &[2, 1][..]));
    assert_eq!(floats(&answer.raw_output_contents[0]), [3.0, -4.0]);
    let answer = grpc.model_infer(Request::new(infer_request("twice", "9"))).await.unwrap().into_inner();
    assert_eq!(answer.model_version, "9");
}

#[tokio::test]
async fn bad_requests_say_why_with_the_right_code() {
    let (_repo, service, grpc) = started(ControlMode::Explicit).await;
    let metadata = |name: &str, version: &str| {
        Request::new(pb::ModelMetadataRequest { name: name.into(), version: version.into() })
    };
    let cases = [
        (metadata("zzz", ""), Code::NotFound, "Request for unknown model: 'zzz' is not found"),
        (metadata("twice", "3"), Code::NotFound, "Request for unknown model: 'twice' version 3 is not found"),
        (
            metadata("twice", "07"),
            Code::InvalidArgument,
            "model version must be a whole number without leading zeros, got '07'",
        ),
    ];
    for (request, code, message) in cases {
        let status = grpc.model_metadata(request).await.unwrap_err();
        assert_eq!((status.code(), status.message()), (code, message));
    }
    let unload = pb::RepositoryModelUnloadRequest { model_name: "zzz".into(), ..Default::default() };
    let status = grpc.repository_model_unload(Request::new(unload)).await.unwrap_err();
    assert_eq!((status.code(), status.message()), (Code::NotFound, "unknown model 'zzz'"));
    let mut wrong = infer_request("twice", "");
    wrong.inputs[0].datatype = "FP33".into();
    let status = grpc.model_infer(Request::new(wrong)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("FP33"), "{}", status.message());
    let stats = service.statistics(Some("twice"), Some(10)).unwrap();
    assert_eq!(stats[0].inference_stats.fail.count, 1, "the malformed request counts as a failure of the model");
}

#[tokio::test]
async fn the_repository_index_lists_versions_in_numeric_order() {
    let (_repo, _service, grpc) = started(ControlMode::Explicit).await;
    let index = grpc.repository_index(Request::new(pb::RepositoryIndexRequest::default())).await.unwrap();
    let models = index.into_inner().models;
    let versions: Vec<&str> = models.iter().map(|m| m.version.as_str()).collect();
    assert_eq!(versions, ["2", "9", "10"]);
    assert_eq!((models[0].name.as_str(), models[0].state.as_str(), models[0].reason.as_str()), ("twice", "READY", ""));
    let named = pb::RepositoryIndexRequest { repository_name: "other".into(), ready: false };
    let status = grpc.repository_index(Request::new(named)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
}

fn load(
    name: &str,
    parameters: &[(&str, pb::model_repository_parameter::ParameterChoice)],
) -> pb::RepositoryModelLoadRequest {
    let parameters = parameters
        .iter()
        .map(|(k, v)| ((*k).to_owned(), pb::ModelRepositoryParameter { parameter_choice: Some(v.clone()) }))
        .collect();
    pb::RepositoryModelLoadRequest { model_name: name.into(), repository_name: String::new(), parameters }
}

#[tokio::test]
async fn load_and_unload_follow_the_control_mode() {
    use pb::model_repository_parameter::ParameterChoice as R;
    let (_repo, _service, grpc) = started(ControlMode::None).await;
    let unload = pb::RepositoryModelUnloadRequest { model_name: "twice".into(), ..Default::default() };
    let status = grpc.repository_model_unload(Request::new(unload)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert!(status.message().starts_with("explicit model load / unload is not allowed"), "{}", status.message());

    let (_repo, service, grpc) = started(ControlMode::Explicit).await;
    let unload = pb::RepositoryModelUnloadRequest { model_name: "twice".into(), ..Default::default() };
    grpc.repository_model_unload(Request::new(unload)).await.unwrap();
    assert!(service.model_ready("twice", None).is_err());
    let config = R::StringParam(r#"{"max_batch_size": 2, "version_policy": {"all": {}}}"#.into());
    grpc.repository_model_load(Request::new(load("twice", &[("config", config)]))).await.unwrap();
    let served = service.model_config("twice", None).await.unwrap();
    assert_eq!(served.max_batch_size, 2);

    // Load from memory: the files as bytes, with a config.
    let files = [
        ("config", R::StringParam(r#"{"max_batch_size": 4}"#.into())),
        ("file:5/model.onnx", R::BytesParam(b"weights".to_vec())),
    ];
    grpc.repository_model_load(Request::new(load("new", &files))).await.unwrap();
    assert_eq!(service.model_metadata("new", None).await.unwrap().versions, ["5"]);
    let cases = [
        (
            load("new", &[("file:1/model.onnx", R::StringParam("d2VpZ2h0cw==".into()))]),
            "parameter 'file:1/model.onnx' must be the file's content as a bytes_param",
        ),
        (
            load("new", &[("filename", R::StringParam("x".into()))]),
            "unknown load parameter 'filename'; a load takes 'config', 'rollout' and 'file:<version>/<name>'",
        ),
        (
            load("new", &[("file:1/model.onnx", R::BytesParam(vec![]))]),
            "failed to load 'new': 'file:' parameters need the 'config' parameter too",
        ),
    ];
    for (request, message) in cases {
        let status = grpc.repository_model_load(Request::new(request)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().starts_with(message), "{}", status.message());
    }
}

#[tokio::test]
async fn readiness_and_new_inference_follow_shutdown() {
    let (_repo, service, grpc) = started(ControlMode::Explicit).await;
    let ready =
        || async { grpc.server_ready(Request::new(pb::ServerReadyRequest {})).await.unwrap().into_inner().ready };
    assert!(ready().await);
    service.shutting_down.store(true, Ordering::Release);
    assert!(!ready().await);
    assert!(grpc.server_live(Request::new(pb::ServerLiveRequest {})).await.unwrap().into_inner().live);
    service.refusing.store(true, Ordering::Release);
    let status = grpc.model_infer(Request::new(infer_request("twice", ""))).await.unwrap_err();
    assert_eq!((status.code(), status.message()), (Code::Unavailable, "the server is shutting down"));
    assert_eq!(service.in_flight.count(), 0, "a refused request is not left counted");
}

/// A parameter value as a client gives it: the JSON value an HTTP client
/// sends, and each gRPC kind that carries the same value.
struct Given {
    json: Value,
    grpc: Vec<P>,
}

fn given(json: Value) -> Given {
    let grpc = match &json {
        Value::Bool(b) => vec![P::BoolParam(*b)],
        Value::String(s) => vec![P::StringParam(s.clone())],
        Value::Number(n) if n.is_u64() => {
            let n = n.as_u64().unwrap();
            vec![P::Int64Param(n as i64), P::Uint64Param(n)]
        }
        Value::Number(n) if n.is_i64() => vec![P::Int64Param(n.as_i64().unwrap())],
        Value::Number(n) => vec![P::DoubleParam(n.as_f64().unwrap())],
        other => panic!("no gRPC form for {other}"),
    };
    Given { json, grpc }
}

/// Where a case puts its parameters: on the request, on the input `x` or
/// on the requested output `y`.
#[derive(Clone, Copy, Debug)]
enum At {
    Request,
    Input,
    Output,
}

/// A row of the table: where the parameters go, the parameters, and the
/// status both front ends answer.
type Case = (At, Vec<(&'static str, Value)>, StatusCode);

/// The answer of one front end: the status (as HTTP's) and either the
/// error text or the outputs as `{name: [datatype, shape, values]}`.
type Outcome = (StatusCode, Value);

async fn over_http(service: &Arc<Service>, at: At, parameters: &[(&str, Value)]) -> Outcome {
    let map: serde_json::Map<String, Value> = parameters.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
    let mut request = json!({"inputs": [{"name": "x", "shape": [2, 1], "datatype": "FP32", "data": [1.5, -2]}]});
    match at {
        At::Request => request["parameters"] = Value::Object(map),
        At::Input => {
            // An input in shared memory has no data of its own.
            if map.contains_key("shared_memory_region") {
                request["inputs"][0].as_object_mut().unwrap().remove("data");
            }
            request["inputs"][0]["parameters"] = Value::Object(map)
        }
        At::Output => request["outputs"] = json!([{"name": "y", "parameters": map}]),
    }
    let http = axum::http::Request::post("/v2/models/twice/infer").body(Body::from(request.to_string())).unwrap();
    let response = router(service.clone()).oneshot(http).await.unwrap();
    let status = response.status();
    let body: Value =
        serde_json::from_slice(&axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap()).unwrap();
    if !status.is_success() {
        return (status, body["error"].clone());
    }
    let outputs = body["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o["name"].as_str().unwrap().to_owned(), json!([o["datatype"], o["shape"], o["data"]])));
    (status, Value::Object(outputs.collect()))
}

async fn over_grpc(grpc: &Grpc, at: At, parameters: &[(&str, P)]) -> Outcome {
    let map: HashMap<String, pb::InferParameter> = parameters
        .iter()
        .map(|(k, v)| ((*k).to_owned(), pb::InferParameter { parameter_choice: Some(v.clone()) }))
        .collect();
    let mut request = infer_request("twice", "");
    request.id.clear();
    match at {
        At::Request => request.parameters = map,
        At::Input => {
            if map.contains_key("shared_memory_region") {
                request.inputs[0].contents = None;
            }
            request.inputs[0].parameters = map
        }
        At::Output => request.outputs = vec![mir::InferRequestedOutputTensor { name: "y".into(), parameters: map }],
    }
    let answer = match grpc.model_infer(Request::new(request)).await {
        Ok(answer) => answer.into_inner(),
        Err(status) => {
            let http = [
                StatusCode::BAD_REQUEST,
                StatusCode::NOT_FOUND,
                StatusCode::SERVICE_UNAVAILABLE,
                StatusCode::INTERNAL_SERVER_ERROR,
                StatusCode::NOT_IMPLEMENTED,
            ]
            .into_iter()
            .find(|s| statuses(&error_of(*s)).1 == status.code())
            .unwrap();
            return (http, Value::String(status.message().to_owned()));
        }
    };
    let outputs = answer.outputs.iter().zip(&answer.raw_output_contents).map(|(o, raw)| {
        let values = match o.datatype.as_str() {
            "FP32" => json!(floats(raw)),
            "BYTES" => json!(
                crate::tensor::bytes_elements(raw)
                    .unwrap()
                    .iter()
                    .map(|b| String::from_utf8_lossy(b))
                    .collect::<Vec<_>>()
            ),
            other => panic!("unexpected datatype {other}"),
        };
        (o.name.clone(), json!([o.datatype, o.shape, values]))
    });
    (StatusCode::OK, Value::Object(outputs.collect()))
}

/// The outcome with the list of parameters an unknown one's refusal
/// names cut: that list is each front end's own (the binary tensor data
/// parameters are HTTP's).
fn same_front((status, answer): Outcome) -> Outcome {
    let cut = |text: &str| text.split("; Plinth reads").next().unwrap_or_default().to_owned();
    match answer {
        Value::String(text) => (status, Value::String(cut(&text))),
        other => (status, other),
    }
}

/// An error of the class HTTP answers with `status`.
fn error_of(status: StatusCode) -> crate::error::Error {
    use crate::error::Error;
    match status {
        StatusCode::BAD_REQUEST => Error::InvalidArgument(String::new()),
        StatusCode::NOT_FOUND => Error::NotFound(String::new()),
        StatusCode::SERVICE_UNAVAILABLE => Error::Unavailable(String::new()),
        StatusCode::NOT_IMPLEMENTED => Error::Unsupported(String::new()),
        _ => Error::Internal(String::new()),
    }
}

#[tokio::test]
async fn every_parameter_gets_the_same_answer_over_http_and_grpc() {
    const OK: StatusCode = StatusCode::OK;
    const BAD: StatusCode = StatusCode::BAD_REQUEST;
    let (_repo, service, grpc) = started(ControlMode::Explicit).await;
    let region = |name: &str| ("shared_memory_region", json!(name));
    let doubled = json!({"y": ["FP32", [2, 1], [3.0, -4.0]]});
    let cases: Vec<Case> = vec![
        (At::Request, vec![], OK),
        (At::Request, vec![("priority", json!(1))], OK),
        (At::Request, vec![("priority", json!(0))], OK),
        (At::Request, vec![("priority", json!(-1))], BAD),
        (At::Request, vec![("priority", json!("high"))], BAD),
        (At::Request, vec![("priority", json!(1.5))], BAD),
        (At::Request, vec![("timeout", json!(100000))], OK),
        (At::Request, vec![("timeout", json!(true))], BAD),
        (At::Request, vec![("sequence_id", json!(-4))], BAD),
        (At::Request, vec![("sequence_start", json!(1))], BAD),
        (At::Request, vec![("sequence_id", json!(5)), ("sequence_start", json!(true))], BAD),
        (At::Request, vec![("triton_enable_empty_final_response", json!(true))], OK),
        (At::Request, vec![("custom", json!("x"))], BAD),
        (At::Request, vec![region("r")], BAD),
        (At::Input, vec![("custom", json!(1))], BAD),
        (At::Input, vec![region("r")], BAD),
        (At::Input, vec![region("r"), ("shared_memory_byte_size", json!(8))], StatusCode::NOT_FOUND),
        (At::Input, vec![("shared_memory_offset", json!(4))], BAD),
        (At::Input, vec![("shared_memory_region", json!(3)), ("shared_memory_byte_size", json!(8))], BAD),
        (At::Input, vec![region("r"), ("shared_memory_byte_size", json!(-8))], BAD),
        (At::Output, vec![], OK),
        (At::Output, vec![("classification", json!(0))], OK),
        (At::Output, vec![("classification", json!(1))], OK),
        (At::Output, vec![("classification", json!(-1))], BAD),
        (At::Output, vec![("classification", json!("1"))], BAD),
        (At::Output, vec![("classification", json!(4294967296u64))], BAD),
        (At::Output, vec![("custom", json!(false))], BAD),
        (At::Output, vec![region("r"), ("shared_memory_byte_size", json!(8))], StatusCode::NOT_FOUND),
        (At::Output, vec![region("r"), ("shared_memory_byte_size", json!(8)), ("classification", json!(1))], BAD),
        (At::Output, vec![("shared_memory_byte_size", json!(8))], BAD),
    ];
    for (at, parameters, status) in cases {
        let given: Vec<(&str, Given)> = parameters.iter().map(|(k, v)| (*k, given(v.clone()))).collect();
        let json_parameters: Vec<(&str, Value)> = given.iter().map(|(k, g)| (*k, g.json.clone())).collect();
        let http = over_http(&service, at, &json_parameters).await;
        assert_eq!(http.0, status, "{at:?} {parameters:?}: {}", http.1);
        // Each gRPC kind that carries the value (an integer as int64 and as uint64).
        let kinds = given.iter().map(|(_, g)| g.grpc.len()).max().unwrap_or(1);
        for kind in 0..kinds {
            let grpc_parameters: Vec<(&str, P)> =
                given.iter().map(|(k, g)| (*k, g.grpc[kind.min(g.grpc.len() - 1)].clone())).collect();
            let answer = over_grpc(&grpc, at, &grpc_parameters).await;
            assert_eq!(same_front(answer), same_front(http.clone()), "{at:?} {parameters:?} as {grpc_parameters:?}");
        }
    }
    // The answers themselves: the doubled input, or its top class.
    assert_eq!(over_http(&service, At::Request, &[("priority", json!(1))]).await, (OK, doubled));
    let top = over_http(&service, At::Output, &[("classification", json!(1))]).await;
    assert_eq!(top, (OK, json!({"y": ["BYTES", [2, 1], ["3.000000:0", "-4.000000:0"]]})));
}

/// Where Triton's front ends differ on purpose, so do Plinth's: binary
/// tensor data is HTTP's extension (`docs/protocol/extension_binary_data.md`).
#[tokio::test]
async fn binary_data_parameters_are_http_s_only() {
    let (_repo, service, grpc) = started(ControlMode::Explicit).await;
    let http = over_http(&service, At::Output, &[("binary_data", json!(false))]).await;
    assert_eq!(http.0, StatusCode::OK);
    let (status, message) = over_grpc(&grpc, At::Output, &[("binary_data", P::BoolParam(false))]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(message.as_str().unwrap().starts_with("unknown output 'y' parameter 'binary_data'"), "{message}");
    let (status, message) = over_grpc(&grpc, At::Request, &[("binary_data_output", P::BoolParam(true))]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(message.as_str().unwrap().starts_with("unknown request parameter 'binary_data_output'"), "{message}");
}

//! The HTTP router in-process (`Router::oneshot`, no socket, no binary) over
//! a real service, lifecycle and scheduler with fake backends
//! (`lifecycle::testing`): status codes, error bodies and values.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;

use super::service::Settings;
use super::{Service, router};
use crate::lifecycle::ControlMode;
use crate::lifecycle::testing::{Repository, lifecycle};
use crate::residency::Budget;

const NO_BUDGET: Budget = Budget { bytes: None, models: None, gpu: std::collections::BTreeMap::new() };

/// A started service in `mode` over a repository holding the doubler
/// `twice` (versions 2, 9 and 10, all served).
async fn started(mode: ControlMode) -> (Repository, Arc<Service>) {
    started_with(mode, Settings::for_tests()).await
}

/// [`started`] with `settings`.
async fn started_with(mode: ControlMode, settings: Settings) -> (Repository, Arc<Service>) {
    let repo = Repository::new();
    repo.add("twice", &[2, 9, 10], "version_policy: { all: {} }");
    let (lifecycle, _) = lifecycle(mode, Some(&repo.path()), NO_BUDGET, None);
    lifecycle.start(&["*".into()]).await.unwrap();
    let service = Arc::new(Service::new(lifecycle, settings));
    service.startup_done.store(true, Ordering::Release);
    (repo, service)
}

/// Sends `method path` with `body` through the router; the status and the
/// body as JSON (`null` when empty).
async fn call(service: &Arc<Service>, method: &str, path: &str, body: &str) -> (StatusCode, Value) {
    let request = Request::builder().method(method).uri(path).body(Body::from(body.to_owned())).unwrap();
    let response = router(service.clone()).oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap() };
    (status, body)
}

fn error(text: &str) -> Value {
    json!({ "error": text })
}

#[tokio::test]
async fn inference_returns_the_model_s_values() {
    let (_repo, service) = started(ControlMode::Explicit).await;
    let request = r#"{"id": "r1", "inputs": [{"name": "x", "shape": [2, 1], "datatype": "FP32", "data": [1.5, -2]}]}"#;
    let (status, body) = call(&service, "POST", "/v2/models/twice/infer", request).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({ "model_name": "twice", "model_version": "10", "id": "r1",
                "outputs": [{ "name": "y", "datatype": "FP32", "shape": [2, 1], "data": [3.0, -4.0] }] })
    );
    let (status, body) = call(&service, "POST", "/v2/models/twice/versions/9/infer", request).await;
    assert_eq!((status, &body["model_version"]), (StatusCode::OK, &json!("9")));
}

#[tokio::test]
async fn bad_requests_say_why_with_the_right_status() {
    let (_repo, service) = started(ControlMode::Explicit).await;
    let cases = [
        ("GET", "/v2/models/zzz", "", StatusCode::NOT_FOUND, "Request for unknown model: 'zzz' is not found"),
        (
            "GET",
            "/v2/models/twice/versions/3",
            "",
            StatusCode::NOT_FOUND,
            "Request for unknown model: 'twice' version 3 is not found",
        ),
        (
            "GET",
            "/v2/models/twice/versions/99999999999999999999",
            "",
            StatusCode::NOT_FOUND,
            "Request for unknown model: 'twice' version 99999999999999999999 is not found",
        ),
        (
            "GET",
            "/v2/models/twice/versions/07",
            "",
            StatusCode::BAD_REQUEST,
            "model version must be a whole number without leading zeros, got '07'",
        ),
        ("POST", "/v2/repository/models/zzz/unload", "", StatusCode::NOT_FOUND, "unknown model 'zzz'"),
        ("GET", "/v3/nothing", "", StatusCode::NOT_FOUND, "unknown route; see the KServe v2 protocol's /v2/... routes"),
        ("DELETE", "/v2/models/twice", "", StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this route"),
    ];
    for (method, path, body, status, message) in cases {
        assert_eq!(call(&service, method, path, body).await, (status, error(message)), "{method} {path}");
    }
    let (status, body) = call(&service, "POST", "/v2/models/twice/infer", "{not json").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"].as_str().unwrap().starts_with("malformed inference request JSON"), "{body}");
    let (status, body) = call(&service, "POST", "/v2/models/twice/predict", "raw").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"].as_str().unwrap().starts_with("model 'twice' has no plugin"), "{body}");
    let stats = service.statistics(Some("twice"), Some(10)).unwrap();
    assert_eq!(stats[0].inference_stats.fail.count, 1, "the malformed request counts as a failure of the model");
}

#[tokio::test]
async fn a_body_over_the_limit_is_a_413_naming_the_flag() {
    let (_repo, service) = started(ControlMode::Explicit).await;
    let big = " ".repeat((1 << 20) + 1);
    let (status, body) = call(&service, "POST", "/v2/models/twice/infer", &big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        body,
        error(
            "request JSON size of more than 1048576 bytes exceeds the maximum allowed input size of 1048576 bytes (--http-max-body-bytes)"
        )
    );
}

#[tokio::test]
async fn the_repository_index_lists_versions_in_numeric_order() {
    let (_repo, service) = started(ControlMode::Explicit).await;
    let (status, body) = call(&service, "POST", "/v2/repository/index", "").await;
    assert_eq!(status, StatusCode::OK);
    let versions: Vec<&str> = body.as_array().unwrap().iter().map(|r| r["version"].as_str().unwrap()).collect();
    assert_eq!(versions, ["2", "9", "10"]);
    assert_eq!(
        body[0],
        json!({ "name": "twice", "version": "2", "state": "READY", "reason": "", "resident_bytes": 1048576 })
    );
    let (_, ready_only) = call(&service, "POST", "/v2/repository/index", r#"{"ready": true}"#).await;
    assert_eq!(ready_only.as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn load_and_unload_follow_the_control_mode() {
    let (_repo, service) = started(ControlMode::None).await;
    let (status, body) = call(&service, "POST", "/v2/repository/models/twice/unload", "").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body["error"].as_str().unwrap().starts_with("explicit model load / unload is not allowed"), "{body}");

    let (_repo, service) = started(ControlMode::Explicit).await;
    assert_eq!(call(&service, "POST", "/v2/repository/models/twice/unload", "").await, (StatusCode::OK, json!({})));
    let (status, body) = call(&service, "GET", "/v2/models/twice/ready", "").await;
    let unloaded = "Request for unknown model: 'twice' has no available versions: it is UNAVAILABLE: unloaded";
    assert_eq!((status, body), (StatusCode::SERVICE_UNAVAILABLE, error(unloaded)));
    let config = r#"{"parameters": {"config": "{\"max_batch_size\": 2, \"version_policy\": {\"all\": {}}}"}}"#;
    assert_eq!(call(&service, "POST", "/v2/repository/models/twice/load", config).await, (StatusCode::OK, json!({})));
    let (_, served) = call(&service, "GET", "/v2/models/twice/config", "").await;
    assert_eq!(served["max_batch_size"], 2, "{served}");
    let (status, body) = call(&service, "POST", "/v2/repository/models/zzz/load", "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body, error("failed to load 'zzz': no model folder 'zzz' in the model repositories"));

    // Load from memory: the files in base64 (b"weights"), with a config.
    let files = r#"{"parameters": {"config": {"max_batch_size": 4}, "file:5/model.onnx": "d2VpZ2h0cw=="}}"#;
    assert_eq!(call(&service, "POST", "/v2/repository/models/new/load", files).await, (StatusCode::OK, json!({})));
    let (_, metadata) = call(&service, "GET", "/v2/models/new", "").await;
    assert_eq!(metadata["versions"], json!(["5"]));
    let cases = [
        (
            r#"{"parameters": {"file:1/model.onnx": "%%%"}}"#,
            "parameter 'file:1/model.onnx' must be the file's content in base64",
        ),
        (
            r#"{"parameters": {"filename": "x"}}"#,
            "unknown load parameter 'filename'; a load takes 'config', 'rollout' and 'file:<version>/<name>'",
        ),
        (
            r#"{"parameters": {"file:1/model.onnx": ""}}"#,
            "failed to load 'new': 'file:' parameters need the 'config' parameter too",
        ),
    ];
    for (body, message) in cases {
        let (status, answer) = call(&service, "POST", "/v2/repository/models/new/load", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(answer["error"].as_str().unwrap().starts_with(message), "{body}: {answer}");
    }
}

#[tokio::test]
async fn readiness_and_new_inference_follow_shutdown() {
    let (_repo, service) = started(ControlMode::Explicit).await;
    assert_eq!(call(&service, "GET", "/v2/health/ready", "").await.0, StatusCode::OK);
    service.shutting_down.store(true, Ordering::Release);
    assert_eq!(call(&service, "GET", "/v2/health/ready", "").await.0, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(call(&service, "GET", "/v2/health/live", "").await.0, StatusCode::OK);
    service.refusing.store(true, Ordering::Release);
    let request = r#"{"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}"#;
    let refused = call(&service, "POST", "/v2/models/twice/infer", request).await;
    assert_eq!(refused, (StatusCode::SERVICE_UNAVAILABLE, error("the server is shutting down")));
    assert_eq!(service.in_flight.count(), 0, "a refused request is not left counted");
}

#[tokio::test]
async fn only_inference_answers_are_compressed() {
    let (_repo, service) = started(ControlMode::Explicit).await;
    let send = |path: &str, method: &str, body: &str| {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("accept-encoding", "gzip")
            .body(Body::from(body.to_owned()))
            .unwrap();
        router(service.clone()).oneshot(request)
    };
    let infer = r#"{"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}"#;
    let response = send("/v2/models/twice/infer", "POST", infer).await.unwrap();
    assert_eq!(response.headers()["content-encoding"], "gzip");
    for path in ["/v2", "/v2/models/twice", "/v2/models/twice/config", "/v2/models/stats"] {
        let response = send(path, "GET", "").await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        assert!(!response.headers().contains_key("content-encoding"), "{path} is not compressed");
    }
}

#[tokio::test]
async fn restricted_apis_need_their_header() {
    use super::restrictions::{Front, Restrictions};
    let restrictions = Restrictions::parse(&["model-repository,statistics:admin-key=secret".into()], Front::Http);
    let settings = Settings { http_restrictions: restrictions.unwrap(), ..Settings::for_tests() };
    let (_repo, service) = started_with(ControlMode::Explicit, settings).await;
    let refused = error("This API is restricted, expecting header 'admin-key'");
    assert_eq!(call(&service, "POST", "/v2/repository/index", "").await, (StatusCode::FORBIDDEN, refused.clone()));
    assert_eq!(call(&service, "GET", "/v2/models/twice/stats", "").await, (StatusCode::FORBIDDEN, refused));
    let with_header = |path: &str, value: &str| {
        let request =
            Request::builder().method("POST").uri(path).header("Admin-Key", value).body(Body::empty()).unwrap();
        router(service.clone()).oneshot(request)
    };
    assert_eq!(with_header("/v2/repository/index", "secret").await.unwrap().status(), StatusCode::OK);
    assert_eq!(with_header("/v2/repository/index", "guess").await.unwrap().status(), StatusCode::FORBIDDEN);
    assert_eq!(call(&service, "GET", "/v2/models/twice", "").await.0, StatusCode::OK, "metadata is not restricted");
}

#[tokio::test]
async fn a_content_length_over_the_limit_is_refused_before_the_body_is_read() {
    let (_repo, service) = started(ControlMode::Explicit).await;
    // The body never comes: only the announced length is looked at.
    let request = Request::builder()
        .method("POST")
        .uri("/v2/models/twice/infer")
        .header("content-length", "1048577")
        .body(Body::empty())
        .unwrap();
    let response = router(service.clone()).oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(response.headers()["connection"], "close");
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        body,
        error(
            "request JSON size of 1048577 bytes (Content-Length) exceeds the maximum allowed input size of 1048576 bytes (--http-max-body-bytes)"
        )
    );
}

#[tokio::test]
async fn answers_close_their_connection_once_shutdown_began() {
    let (_repo, service) = started(ControlMode::Explicit).await;
    let connection = |service: &Arc<Service>| {
        let request = Request::builder().uri("/v2").body(Body::empty()).unwrap();
        let answer = router(service.clone()).oneshot(request);
        async { answer.await.unwrap().headers().get("connection").cloned() }
    };
    assert_eq!(connection(&service).await, None);
    service.shutting_down.store(true, Ordering::Release);
    assert_eq!(connection(&service).await.unwrap(), "close");
}

#[test]
fn hyper_s_own_error_answers_are_explained_and_nothing_else() {
    use super::http::explain_automatic_answer;
    let hyper = |status: &str| {
        format!(
            "HTTP/1.1 {status}\r\nconnection: close\r\ncontent-length: 0\r\ndate: Wed, 02 Dec 2026 19:59:19 GMT\r\n\r\n"
        )
    };
    let cases = [
        (
            "400 Bad Request",
            "malformed HTTP/1.1 request: its request line or a header (such as Content-Length or Transfer-Encoding) cannot be parsed",
        ),
        ("414 URI Too Long", "the request URI is longer than 65534 bytes"),
        (
            "431 Request Header Fields Too Large",
            "the request has more than 100 headers, or more than 417792 bytes of request line and headers",
        ),
    ];
    for (status, message) in cases {
        let answer = String::from_utf8(explain_automatic_answer(hyper(status).as_bytes(), true).unwrap()).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with(&format!("HTTP/1.1 {status}\r\n")), "{head}");
        assert!(head.contains("\r\ncontent-type: application/json\r\n"), "{head}");
        assert!(head.contains(&format!("\r\ncontent-length: {}\r\n", body.len())), "{head}");
        assert_eq!(serde_json::from_str::<Value>(body).unwrap(), error(message));
    }
    for other in [
        hyper("200 OK"),
        hyper("413 Payload Too Large"),
        hyper("400 Bad Request").replace("content-length: 0", "content-length: 2"),
        hyper("400 Bad Request").replace("\r\n\r\n", "\r\ncontent-type: application/json\r\n\r\n"),
        hyper("400 Bad Request") + "{}",
    ] {
        assert_eq!(explain_automatic_answer(other.as_bytes(), true), None, "{other}");
    }
    // A head cut before its request line ended: the URI is what is too long.
    let cut = hyper("431 Request Header Fields Too Large");
    let answer = String::from_utf8(explain_automatic_answer(cut.as_bytes(), false).unwrap()).unwrap();
    assert!(answer.starts_with("HTTP/1.1 414 URI Too Long\r\n"), "{answer}");
    assert!(answer.ends_with(&error("the request URI is longer than 65534 bytes").to_string()), "{answer}");
}

#[tokio::test]
async fn openai_routes_list_only_the_models_that_opt_in_and_answer_errors_in_openai_s_shape() {
    let repo = Repository::new();
    repo.add("twice", &[1], "");
    repo.add("vectors", &[1], r#"parameters { key: "openai.embeddings" value: { string_value: "true" } }"#);
    let (lifecycle, _) = lifecycle(ControlMode::Explicit, Some(&repo.path()), NO_BUDGET, None);
    lifecycle.start(&["*".into()]).await.unwrap();
    let service = Arc::new(Service::new(lifecycle, Settings::for_tests()));
    service.startup_done.store(true, Ordering::Release);

    let (status, body) = call(&service, "GET", "/v1/models", "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let ids: Vec<&Value> = body["data"].as_array().unwrap().iter().map(|m| &m["id"]).collect();
    assert_eq!(ids, [&json!("vectors")]);
    assert_eq!((&body["data"][0]["object"], &body["data"][0]["owned_by"]), (&json!("model"), &json!("plinth")));

    let (status, body) = call(&service, "POST", "/v1/embeddings", r#"{"model": "nope", "input": "a"}"#).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!((&body["error"]["code"], &body["error"]["param"]), (&json!("model_not_found"), &json!("model")));
    assert!(body["error"]["message"].as_str().unwrap().contains("'nope'"), "{body}");
    let (status, body) = call(&service, "POST", "/v1/embeddings", r#"{"model": "twice", "input": "a"}"#).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["error"]["message"].as_str().unwrap().contains("openai.embeddings"), "{body}");
    // The fake model has no plugin, so its /predict refuses the input.
    let (status, body) = call(&service, "POST", "/v1/embeddings", r#"{"model": "vectors", "input": "a"}"#).await;
    assert_eq!((status, &body["error"]["param"]), (StatusCode::BAD_REQUEST, &json!("input")), "{body}");
    assert_eq!(body["error"]["type"], json!("invalid_request_error"));
    let (status, body) = call(&service, "GET", "/v1/models/twice", "").await;
    assert_eq!((status, &body["error"]["code"]), (StatusCode::NOT_FOUND, &json!("model_not_found")));

    // Refusals from outside the handlers (shutdown) take the same shape.
    service.refusing.store(true, Ordering::Release);
    let (status, body) = call(&service, "POST", "/v1/embeddings", r#"{"model": "vectors", "input": "a"}"#).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["error"]["type"], json!("server_error"), "{body}");
    assert!(body["error"]["message"].is_string(), "{body}");
}

#[test]
fn a_request_head_is_read_no_further_than_hyper_s_limit() {
    use super::http::HeadLimit;
    let max = 8192 + 4096 * 100;
    let mut head = HeadLimit::new();
    assert_eq!(head.cap(), Some(max));
    head.read(b"GET /v2 HTTP/1.1\r\nHost: x\r");
    assert_eq!(head.cap(), Some(max - 26));
    head.read(b"\n\r");
    head.read(b"\n{\"body\": 1}");
    assert_eq!(head.cap(), None, "a head ends at a blank line split across reads; the body is read uncapped");
    head.answering();
    head.read(&vec![b'y'; max]);
    assert_eq!(head.cap(), None, "at the limit hyper refuses the head by itself");
    head.answering();
    assert_eq!(head.cap(), Some(max));
}

//! The KServe v2 HTTP front end on axum (and the OpenAI-compatible routes
//! of `openai`): the route table, body limits,
//! compression, the counting of inference requests in flight, connections
//! closed from shutdown on, and a JSON body for hyper's own error answers.
//! The handlers are in `routes`.

use std::any::Any;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::compression::CompressionLayer;
use tower_http::decompression::RequestDecompressionLayer;

use opentelemetry::KeyValue;

use super::restrictions::Api;
use super::{ApiError, Service, body, faults, openai, routes};
use crate::trace::{Front, Span};

/// The KServe v2 routes over `service`, each group of them behind its
/// `--http-restricted-api` header check where one is set.
pub fn router(service: Arc<Service>) -> Router {
    let inference = Router::new()
        .route("/v2/models/{model}/infer", post(routes::infer))
        .route("/v2/models/{model}/versions/{version}/infer", post(routes::infer))
        .route("/v2/models/{model}/predict", post(routes::predict))
        .route("/v2/models/{model}/versions/{version}/predict", post(routes::predict))
        .route("/v2/models/{model}/generate", post(super::generate::generate))
        .route("/v2/models/{model}/versions/{version}/generate", post(super::generate::generate))
        .route("/v2/models/{model}/generate_stream", post(super::generate::generate_stream))
        .route("/v2/models/{model}/versions/{version}/generate_stream", post(super::generate::generate_stream))
        .route_layer(middleware::from_fn_with_state(service.clone(), track_inference))
        // Only inference answers are compressed, as in Triton: clients such
        // as tritonclient's aio client send `Accept-Encoding: gzip` on every
        // call and decompress only inference bodies.
        .layer(CompressionLayer::new());
    // OpenAI's embeddings call, counted and refused at shutdown like the
    // v2 inference routes; every error of the OpenAI routes in its shape.
    let openai_inference = Router::new()
        .route("/v1/embeddings", post(openai::embeddings))
        .route("/v1/completions", post(super::completions::completions))
        .route("/v1/chat/completions", post(super::completions::chat_completions))
        .route_layer(middleware::from_fn_with_state(service.clone(), track_inference))
        .layer(middleware::map_response(openai::error_shape));
    let openai_models = Router::new()
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{model}", get(openai::model))
        .layer(middleware::map_response(openai::error_shape));
    let health = Router::new()
        .route("/v2/health/live", get(routes::live))
        .route("/v2/health/ready", get(routes::ready))
        .route("/v2/models/{model}/ready", get(routes::model_ready))
        .route("/v2/models/{model}/versions/{version}/ready", get(routes::model_ready));
    let metadata = Router::new()
        .route("/", get(super::status::page))
        .route("/v2", get(routes::server_metadata))
        .route("/v2/models/{model}", get(routes::model_metadata))
        .route("/v2/models/{model}/versions/{version}", get(routes::model_metadata));
    let model_config = Router::new()
        .route("/v2/models/{model}/config", get(routes::model_config))
        .route("/v2/models/{model}/versions/{version}/config", get(routes::model_config));
    let statistics = Router::new()
        .route("/v2/models/stats", get(routes::model_stats))
        .route("/v2/models/{model}/stats", get(routes::model_stats))
        .route("/v2/models/{model}/versions/{version}/stats", get(routes::model_stats));
    let logging = Router::new().route("/v2/logging", get(routes::log_settings).post(routes::update_log_settings));
    let trace = Router::new()
        .route("/v2/trace/setting", get(routes::trace_settings).post(routes::update_trace_settings))
        .route(
            "/v2/models/{model}/trace/setting",
            get(routes::model_trace_settings).post(routes::update_model_trace_settings),
        );
    let repository = Router::new()
        .route("/v2/repository/index", post(routes::repository_index))
        .route("/v2/repository/models/{model}/load", post(routes::load_model))
        .route("/v2/repository/models/{model}/unload", post(routes::unload_model))
        .route(
            "/v2/repository/models/{model}/rollout",
            post(routes::start_rollout).get(routes::rollout).delete(routes::cancel_rollout),
        );
    let shared_memory = Router::new()
        .route("/v2/systemsharedmemory/status", get(routes::shared_memory_status))
        .route("/v2/systemsharedmemory/region/{region}/status", get(routes::shared_memory_status))
        .route("/v2/systemsharedmemory/register", post(routes::register_unnamed_shared_memory))
        .route("/v2/systemsharedmemory/region/{region}/register", post(routes::register_shared_memory))
        .route("/v2/systemsharedmemory/unregister", post(routes::unregister_shared_memory))
        .route("/v2/systemsharedmemory/region/{region}/unregister", post(routes::unregister_shared_memory))
        .route("/v2/cudasharedmemory/status", get(routes::cuda_shared_memory))
        .route("/v2/cudasharedmemory/region/{region}/status", get(routes::cuda_shared_memory))
        .route("/v2/cudasharedmemory/region/{region}/register", post(routes::cuda_shared_memory))
        .route("/v2/cudasharedmemory/unregister", post(routes::unregister_cuda_shared_memory))
        .route("/v2/cudasharedmemory/region/{region}/unregister", post(routes::unregister_cuda_shared_memory));
    let groups = [
        (Api::Inference, inference),
        (Api::Inference, openai_inference),
        (Api::Metadata, openai_models),
        (Api::Health, health),
        (Api::Metadata, metadata),
        (Api::ModelConfig, model_config),
        (Api::Statistics, statistics),
        (Api::Logging, logging),
        (Api::Trace, trace),
        (Api::ModelRepository, repository),
        (Api::SharedMemory, shared_memory),
    ];
    let mut routes =
        groups.into_iter().fold(Router::new(), |all, (api, routes)| all.merge(restricted(&service, api, routes)));
    if faults::enabled() {
        tracing::warn!("{} is set: requests may inject faults (tests only)", faults::ENABLE_VARIABLE);
        routes = routes.route_layer(middleware::from_fn_with_state(service.clone(), faults::inject));
    }
    routes
        .fallback(routes::unknown_route)
        .method_not_allowed_fallback(routes::wrong_method)
        // The limit applies to the body after decompression, so a small
        // compressed body cannot unpack past it.
        .layer(DefaultBodyLimit::max(service.max_body_bytes))
        .layer(RequestDecompressionLayer::new())
        .layer(middleware::from_fn_with_state(service.clone(), edges))
        .layer(CatchPanicLayer::custom(|panic: Box<dyn Any + Send>| {
            ApiError::from(super::error::panicked(&*panic)).into_response()
        }))
        .with_state(service)
}

/// `routes` behind the header check of `api`, if `--http-restricted-api`
/// restricts it.
fn restricted(service: &Arc<Service>, api: Api, routes: Router<Arc<Service>>) -> Router<Arc<Service>> {
    if !service.http_restrictions.restricts(api) {
        return routes;
    }
    routes.route_layer(middleware::from_fn_with_state((service.clone(), api), require_header))
}

/// 403 with Triton's text unless the request carries the header its API
/// group requires.
async fn require_header(State((service, api)): State<(Arc<Service>, Api)>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    match service.http_restrictions.check(api, header) {
        Ok(()) => next.run(request).await,
        Err(missing) => {
            ApiError::new(StatusCode::FORBIDDEN, format!("This API is restricted, expecting header '{missing}'"))
                .into_response()
        }
    }
}

/// What every request goes through before it is decompressed and routed,
/// one middleware (each layer boxes a future and clones the service per
/// request): a body announced over the limit is refused, a small body read
/// first; the decompression layer's empty 415 is explained; from SIGTERM
/// on every answer closes its connection.
async fn edges(State(service): State<Arc<Service>>, request: Request, next: Next) -> Response {
    let mut response = match refuse_announced_excess(&service, &request) {
        Some(refused) => refused,
        None => match read_small_body_first(&service, request).await {
            Ok(request) => explain_unsupported_encoding(next.run(request).await),
            Err(unreadable) => unreadable,
        },
    };
    close_when_shutting_down(&service, &mut response);
    response
}

/// The decompression layer refuses an unknown `Content-Encoding` with an
/// empty 415; every failure says why in `{"error"}`.
fn explain_unsupported_encoding(response: Response) -> Response {
    if response.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE && !response.headers().contains_key(header::CONTENT_TYPE)
    {
        let message = "unsupported Content-Encoding; send the body as is, gzip or deflate";
        return ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, message).into_response();
    }
    response
}

/// Counts inference requests in flight, from before their body is read, so
/// shutdown can wait for them, and refuses new ones once shutdown has begun.
async fn track_inference(State(service): State<Arc<Service>>, request: Request, next: Next) -> Response {
    let _counted = match service.begin_inference() {
        Ok(counted) => counted,
        Err(e) => return ApiError::from(e).into_response(),
    };
    // Reserved before the body is read, held until the answer: its length
    // where the connection knows it, else the most a body may be.
    let length = http_body::Body::size_hint(request.body()).exact();
    let _memory = match service.request_memory.reserve(length.unwrap_or(service.max_body_bytes as u64)).await {
        Ok(permit) => permit,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let response = traced(&service, request, next).await;
    service.request_memory.answered(length.unwrap_or(0));
    response
}

/// A request's `Content-Length`, if it announces one.
fn announced_length(request: &Request) -> Option<u64> {
    request.headers().get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

/// Runs `request`, in a root span when it is traced.
async fn traced(service: &Service, mut request: Request, next: Next) -> Response {
    let Some(span) = start_trace(service, &request) else { return next.run(request).await };
    request.extensions_mut().insert(span.clone());
    let outcome = |response: &Response| {
        let status = response.status();
        // OpenTelemetry's HTTP conventions: a server span fails on 5xx only.
        let failure = status.is_server_error().then(|| status.canonical_reason().unwrap_or("server error").into());
        (KeyValue::new("http.response.status_code", i64::from(status.as_u16())), failure)
    };
    span.run_root(Front::Http, next.run(request), outcome).await
}

/// The root span of an inference request, when it is traced: the model is
/// the path's `/v2/models/{model}/...`, the parent its `traceparent`.
fn start_trace(service: &Service, request: &Request) -> Option<Span> {
    if !service.tracing.as_ref().is_some_and(|t| t.is_on()) {
        return None;
    }
    let model = request.uri().path().strip_prefix("/v2/models/")?.split('/').next()?;
    let model = percent_encoding::percent_decode_str(model).decode_utf8().ok()?;
    let header = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok());
    let span = service.start_trace(&model, Front::Http, header("traceparent"), header("tracestate"))?;
    span.set(KeyValue::new("url.path", request.uri().path().to_owned()));
    Some(span)
}

/// A request whose `Content-Length` announces more than
/// `--http-max-body-bytes` gets its 413 as soon as its headers arrive: no
/// body byte is read, so hyper sends no `100 Continue` either.
fn refuse_announced_excess(service: &Service, request: &Request) -> Option<Response> {
    let max = service.max_body_bytes;
    match announced_length(request) {
        Some(length) if length > max as u64 => {
            // Begins as the text of a body found too long while read.
            let message = format!(
                "request JSON size of {length} bytes (Content-Length) exceeds the maximum allowed input size of {max} bytes (--http-max-body-bytes)"
            );
            let mut response = ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, message).into_response();
            // The body is never read, so the connection cannot carry another request.
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            Some(response)
        }
        _ => None,
    }
}

/// The largest body [`read_small_body_first`] reads before routing.
const READ_FIRST_BYTES: u64 = 64 * 1024;

/// Reads a body of at most [`READ_FIRST_BYTES`] (by its `Content-Length`)
/// whole before the request is routed, so that every answer, a refusal
/// that never looks at the body included (403 of a restricted API, 404,
/// 503 at shutdown), comes after the client's whole request: over HTTP/2
/// an answer to a request still being sent ends its stream with a reset,
/// which clients such as curl 7.88 report as a failure instead of the
/// answer. The body's own limits apply as it is read (a body that stops
/// arriving is a 408).
async fn read_small_body_first(service: &Service, request: Request) -> Result<Request, Response> {
    let small = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|length| length > 0 && length <= READ_FIRST_BYTES);
    if !small {
        return Ok(request);
    }
    let (parts, body) = request.into_parts();
    match axum::body::to_bytes(body, READ_FIRST_BYTES as usize).await {
        Ok(bytes) => Ok(Request::from_parts(parts, axum::body::Body::from(bytes))),
        Err(e) => Err(body::unreadable(service, &e).into_response()),
    }
}

/// From SIGTERM on every answer closes its connection: a keep-alive client
/// reconnects, through its load balancer, to a server that stays, and no
/// idle connection is left for shutdown to close under a request.
fn close_when_shutting_down(service: &Service, response: &mut Response) {
    if service.shutting_down.load(std::sync::atomic::Ordering::Acquire) {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
}

// hyper's limits on a request's head, which `axum::serve` leaves at
// hyper's defaults (it offers no way to set them).
/// The longest request URI hyper takes.
const HYPER_MAX_URI: usize = 65534;
/// The most headers hyper takes.
const HYPER_MAX_HEADERS: usize = 100;
/// hyper's read buffer, which the request line and headers must fit.
const HYPER_MAX_HEAD: usize = 8192 + 4096 * 100;

/// Keeps a request head within [`HYPER_MAX_HEAD`] bytes as hyper reads it.
/// hyper checks its limit only between reads, and a read may fill its
/// buffer past the limit (it reads into all the spare room it reserved,
/// hyperium/hyper#4081, still so in 1.13): a head that completes within
/// that read is then served, however large, instead of answered 431. So
/// `listeners` caps each read of a head at the bytes left under the limit;
/// a head that has not ended by then leaves hyper's buffer full, and hyper
/// answers 431. A head ends at the first blank line (`\r\n\r\n`); the next
/// one starts when an answer is written. Bodies are read uncapped.
#[derive(Clone, Copy, Debug)]
pub(super) struct HeadLimit {
    /// Bytes of the current head read so far; `None` while reading a body.
    read: Option<usize>,
    /// How much of `\r\n\r\n` the last bytes read match (0 to 3).
    matched: u8,
    /// Whether the current head's request line has ended (a `\n` read).
    line_ended: bool,
}

impl HeadLimit {
    /// A connection's limit: its first bytes are a head.
    pub(super) fn new() -> HeadLimit {
        HeadLimit { read: Some(0), matched: 0, line_ended: false }
    }

    /// Whether the head read last had a whole request line: a head cut at
    /// the limit without one is a URI too long, not too many headers.
    pub(super) fn request_line_ended(&self) -> bool {
        self.line_ended || self.read.is_none()
    }

    /// The most bytes the next read may take; `None` for no limit (a body,
    /// or a head already at the limit, which hyper refuses).
    pub(super) fn cap(&self) -> Option<usize> {
        self.read.filter(|&read| read < HYPER_MAX_HEAD).map(|read| HYPER_MAX_HEAD - read)
    }

    /// Counts `bytes`, just read.
    pub(super) fn read(&mut self, bytes: &[u8]) {
        let Some(read) = self.read else { return };
        for &byte in bytes {
            self.line_ended |= byte == b'\n';
            self.matched = match (self.matched, byte) {
                (0 | 2, b'\r') | (1 | 3, b'\n') => self.matched + 1,
                (_, b'\r') => 1,
                _ => 0,
            };
            if self.matched == 4 {
                (self.read, self.matched, self.line_ended) = (None, 0, false);
                return;
            }
        }
        self.read = Some(read + bytes.len());
    }

    /// An answer is being written: what is read next is a new head (a
    /// head read ahead of it, pipelined, is counted from here on only).
    pub(super) fn answering(&mut self) {
        *self = HeadLimit::new();
    }
}

/// hyper answers a request it cannot parse (malformed: 400; URI too long:
/// 414; headers too many or too large: 431) itself, before any service of
/// ours runs, with an empty body, and has no hook to change that answer
/// (hyperium/hyper#3911 proposes one). So `listeners` hands each write of
/// a connection here: when `written` is exactly such an answer (its status
/// line, `connection: close`, `content-length: 0` and `date`, nothing
/// else; our own 400s always carry a JSON body), the answer to write
/// instead, with the same status and a JSON body saying what was wrong.
///
/// hyper's 431 for a head cut at the limit before its request line ended
/// (`request_line_ended` false) is a URI far too long: it becomes a 414,
/// as hyper answers a URI that fits its buffer and is still too long.
pub(super) fn explain_automatic_answer(written: &[u8], request_line_ended: bool) -> Option<Vec<u8>> {
    let head = written.strip_suffix(b"\r\n\r\n")?;
    let mut lines = head.split(|&b| b == b'\n').map(|line| line.strip_suffix(b"\r").unwrap_or(line));
    let mut status_line = lines.next()?;
    let (status, message) = match status_line {
        b"HTTP/1.1 400 Bad Request" => (
            StatusCode::BAD_REQUEST,
            "malformed HTTP/1.1 request: its request line or a header (such as Content-Length or Transfer-Encoding) cannot be parsed"
                .to_owned(),
        ),
        b"HTTP/1.1 414 URI Too Long" => {
            (StatusCode::URI_TOO_LONG, format!("the request URI is longer than {HYPER_MAX_URI} bytes"))
        }
        b"HTTP/1.1 431 Request Header Fields Too Large" if !request_line_ended => {
            status_line = b"HTTP/1.1 414 URI Too Long";
            (StatusCode::URI_TOO_LONG, format!("the request URI is longer than {HYPER_MAX_URI} bytes"))
        }
        b"HTTP/1.1 431 Request Header Fields Too Large" => (
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!(
                "the request has more than {HYPER_MAX_HEADERS} headers, or more than {HYPER_MAX_HEAD} bytes of request line and headers"
            ),
        ),
        _ => return None,
    };
    let mut date = None;
    for line in lines {
        match line {
            b"connection: close" | b"content-length: 0" => {}
            line if line.starts_with(b"date: ") => date = Some(line),
            _ => return None,
        }
    }
    tracing::debug!(status = status.as_u16(), "{message}");
    let body = serde_json::json!({ "error": message }).to_string();
    let mut answer = Vec::with_capacity(status_line.len() + body.len() + 128);
    answer.extend_from_slice(status_line);
    answer.extend_from_slice(b"\r\ncontent-type: application/json\r\nconnection: close\r\n");
    answer.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    if let Some(date) = date {
        answer.extend_from_slice(date);
        answer.extend_from_slice(b"\r\n");
    }
    answer.extend_from_slice(b"\r\n");
    answer.extend_from_slice(body.as_bytes());
    Some(answer)
}

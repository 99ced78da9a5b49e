//! The KServe v2 HTTP routes. Handlers only translate between HTTP and the
//! [`Service`] core; they hold no state of their own.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use super::body::Body;
use super::error::ApiError;
use super::service::{self, EXTENSIONS, SERVER_NAME, Service};
use super::shared_memory::{CUDA_UNSUPPORTED, RegionStatus, RequestRegions};
use crate::error::Error;
use crate::lifecycle::{Accepted, InferCall, RolloutStatus};
use crate::model::Model;
use crate::plugin::RawRequest;
use crate::protocol::binary::{self, HEADER_LENGTH, OutputForm};
use crate::protocol::json::{InferResponse, ModelMetadata};
use crate::protocol::parameters::{Front, Parameters};
use crate::protocol::repository;
use crate::protocol::request::RequestHead;
use crate::protocol::shared_memory::Regions;
use crate::registry::UNKNOWN_MODEL;
use crate::scheduler::Timing;
use crate::tensor::DataType;
use crate::trace::{Span, Update};

type ApiResult<T> = Result<T, ApiError>;

/// The model (and optional version) a route names: `/v2/models/{model}` or
/// `/v2/models/{model}/versions/{version}`.
pub struct ModelRef {
    pub name: String,
    /// The version, when the route names one.
    pub version: Option<u64>,
}

impl<S: Send + Sync> FromRequestParts<S> for ModelRef {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(params) = Path::<HashMap<String, String>>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::bad_request(e.body_text()))?;
        let name = params.get("model").cloned().unwrap_or_default();
        let version = match params.get("version").map(|v| service::parse_version(v)) {
            Some(Err(Error::NotFound(_))) => {
                let v = &params["version"];
                return Err(Error::NotFound(format!("{UNKNOWN_MODEL}: '{name}' version {v} is not found")).into());
            }
            other => other.transpose()?,
        };
        Ok(ModelRef { name, version })
    }
}

impl ModelRef {
    /// A client's inference request to this model, routed to the version
    /// that serves it (see [`Service::accept`]; `headers` for a sticky
    /// rollout).
    async fn accept(&self, service: &Service, headers: &HeaderMap) -> Result<Accepted, Error> {
        service.accept(&self.name, self.version, &header_of(headers)).await
    }
}

/// Looks up a request header's text by name, for a rollout's
/// `sticky_header`; `None` when absent or not visible ASCII.
pub(super) fn header_of(headers: &HeaderMap) -> impl Fn(&str) -> Option<String> + Sync + '_ {
    |key| headers.get(key).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// `GET /v2/health/live`: 200 while the process serves HTTP.
pub async fn live() -> StatusCode {
    StatusCode::OK
}

/// `GET /v2/health/ready`: 200 once the start-up loads have finished and,
/// with `--strict-readiness`, every model that should be loaded is READY;
/// 503 before, and from the moment shutdown begins.
pub async fn ready(State(service): State<Arc<Service>>) -> StatusCode {
    if service.is_ready() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }
}

/// `GET /v2`: server metadata.
pub async fn server_metadata() -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "name": SERVER_NAME,
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": EXTENSIONS,
    }))
}

/// `GET /v2/models/{m}[/versions/{v}]`: the model's versions, platform and
/// tensors (shapes with -1 for any size, batch dimension included).
pub async fn model_metadata(State(service): State<Arc<Service>>, model: ModelRef) -> ApiResult<Json<ModelMetadata>> {
    Ok(Json(service.model_metadata(&model.name, model.version).await?))
}

/// `GET /v2/models/{m}[/versions/{v}]/ready`: 200 when READY; otherwise the
/// error status (404 unknown, 503 unavailable) and why.
pub async fn model_ready(State(service): State<Arc<Service>>, model: ModelRef) -> ApiResult<StatusCode> {
    service.model_ready(&model.name, model.version)?;
    Ok(StatusCode::OK)
}

/// `POST /v2/models/{m}[/versions/{v}]/infer`: tensors in and out as JSON
/// or binary tensor data (`binary::decode`, `binary::encode`); the request
/// `parameters` may set `priority` and `timeout`. The answer carries a
/// `Server-Timing` header.
pub async fn infer(
    State(service): State<Arc<Service>>,
    model: ModelRef,
    trace: Option<Extension<Span>>,
    headers: HeaderMap,
    Body(body): Body,
) -> ApiResult<Response> {
    let accepted = model.accept(&service, &headers).await?;
    let header_length = headers.get(HEADER_LENGTH).map(HeaderValue::as_bytes);
    let inferred = accepted
        .infer(trace.map(|Extension(span)| span), |m| {
            let decode = |reads: &dyn Regions| binary::decode(header_length, &body, (&m.name, &m.signature), reads);
            let (decoded, regions) = service.shared_memory.decode(decode, |d| &d.head.outputs)?;
            let binary::Decoded { request, head, tensors } = decoded;
            refuse_json_only_binary_outputs(m, &head, &regions)?;
            let call = InferCall::new(tensors, &head, request.id.clone(), None);
            Ok((call, (request.id, head, regions)))
        })
        .await?;
    let m = inferred.model;
    let (id, head, regions) = inferred.request;
    let outputs = inferred.outputs.into_iter().map(|t| {
        let form = if regions.write(&t)? {
            OutputForm::SharedMemory
        } else if head.wants_binary(&t.name) {
            OutputForm::Binary
        } else {
            OutputForm::Json
        };
        Ok((t, form))
    });
    let response =
        InferResponse { model_name: m.name.clone(), model_version: m.version.to_string(), id, outputs: Vec::new() };
    let encoded = binary::encode(response, outputs.collect::<Result<_, Error>>()?)?;
    let mut headers = HeaderMap::new();
    let content_type = match encoded.header_length {
        Some(n) => {
            headers.insert(HeaderName::from_static(HEADER_LENGTH), HeaderValue::from(n));
            "application/octet-stream"
        }
        None => "application/json",
    };
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert("server-timing", server_timing(&timing_entries(&inferred.timing)));
    Ok((headers, encoded.body).into_response())
}

/// `POST /v2/models/{m}[/versions/{v}]/predict`: the raw body goes through
/// the model's plugin (preprocess → infer → postprocess); the answer is the
/// plugin's, with its content type and a `Server-Timing` header. Query
/// parameters reach the plugin.
pub async fn predict(
    State(service): State<Arc<Service>>,
    model: ModelRef,
    trace: Option<Extension<Span>>,
    Query(query): Query<Vec<(String, String)>>,
    headers: HeaderMap,
    Body(body): Body,
) -> ApiResult<Response> {
    let accepted = model.accept(&service, &headers).await?;
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let request = RawRequest { content_type: content_type.to_owned(), body: body.to_vec(), parameters: query };
    let (_, response, timing) = accepted.predict(request, Vec::new(), trace.map(|Extension(span)| span)).await?;
    let [queue, input, infer, output] = timing_entries(&timing.inference);
    let entries = [("preprocess", timing.preprocess), queue, input, infer, output, ("postprocess", timing.postprocess)];
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_str(&response.content_type)
                .unwrap_or(HeaderValue::from_static("application/octet-stream")),
        )],
        [(HeaderName::from_static("server-timing"), server_timing(&entries))],
        response.body,
    )
        .into_response())
}

/// FP16 and BF16 outputs have no JSON form: refused before the model runs
/// unless asked for as binary data.
fn refuse_json_only_binary_outputs(m: &Model, head: &RequestHead, regions: &RequestRegions) -> Result<(), Error> {
    let as_tensor = |name: &str| head.outputs.iter().any(|o| o.name == name && o.classification.is_none());
    let returned = m.signature.outputs.iter().filter(|o| head.outputs.is_empty() || as_tensor(&o.name));
    for o in returned {
        let has_json = !head.wants_binary(&o.name) && !regions.contains(&o.name);
        if matches!(o.datatype, DataType::Fp16 | DataType::Bf16) && has_json {
            return Err(Error::InvalidArgument(format!(
                "output '{}' is {}, which has no JSON representation; ask for it with \"binary_data\": true (binary tensor data extension)",
                o.name, o.datatype
            )));
        }
    }
    Ok(())
}

fn timing_entries(t: &Timing) -> [(&'static str, Duration); 4] {
    [
        ("queue", t.queue),
        ("compute_input", t.compute.input),
        ("compute_infer", t.compute.infer),
        ("compute_output", t.compute.output),
    ]
}

/// A `Server-Timing` header (W3C Server Timing): one metric per stage, its
/// `dur` in milliseconds with microsecond precision. Written into one
/// buffer: the header is on every inference answer.
fn server_timing(entries: &[(&str, Duration)]) -> HeaderValue {
    use std::fmt::Write;
    let mut text = String::with_capacity(entries.len() * 24);
    for (i, (name, d)) in entries.iter().enumerate() {
        let separator = if i == 0 { "" } else { ", " };
        write!(text, "{separator}{name};dur={:.3}", d.as_secs_f64() * 1000.0).expect("writing to a String");
    }
    HeaderValue::from_maybe_shared(Bytes::from(text)).expect("stage names and numbers are valid header text")
}

/// `GET /v2/models/{m}[/versions/{v}]/config`: the model configuration as
/// JSON, as Triton returns it (protobuf field names, enums as names),
/// inputs and outputs completed from the model file.
pub async fn model_config(State(service): State<Arc<Service>>, model: ModelRef) -> ApiResult<Json<serde_json::Value>> {
    Ok(Json(crate::config::to_json(&service.model_config(&model.name, model.version).await?)))
}

/// `GET /v2/models[/{m}[/versions/{v}]]/stats`: Triton's statistics
/// extension for the READY versions asked for (all models without a name).
pub async fn model_stats(
    State(service): State<Arc<Service>>,
    Path(params): Path<HashMap<String, String>>,
) -> ApiResult<Json<serde_json::Value>> {
    let version = params.get("version").map(|v| service::parse_version(v)).transpose()?;
    let stats = service.statistics(params.get("model").map(String::as_str), version)?;
    let stats = serde_json::to_value(stats).expect("statistics serialise");
    Ok(Json(serde_json::json!({ "model_stats": stats })))
}

/// `POST /v2/repository/index`: every model version and its state; with
/// `{"ready": true}` only the READY ones.
pub async fn repository_index(
    State(service): State<Arc<Service>>,
    Body(body): Body,
) -> ApiResult<Json<serde_json::Value>> {
    #[derive(serde::Deserialize)]
    struct IndexRequest {
        #[serde(default)]
        ready: bool,
    }
    let ready_only = if body.is_empty() {
        false
    } else {
        // A `ready` of another type is refused with Triton's text, before
        // its value is read (so however deep it nests).
        let request: IndexRequest = serde_json::from_slice(&body).map_err(|e| match e.classify() {
            serde_json::error::Category::Data => {
                ApiError::bad_request(format!("Invalid value for 'ready': expected a boolean ({e})"))
            }
            _ => ApiError::bad_request(format!("malformed repository index request: {e}")),
        })?;
        request.ready
    };
    let mut rows = serde_json::to_value(service.repository_index(ready_only)).expect("index rows serialise");
    mark_rollouts(&mut rows, &service.lifecycle.rollouts());
    Ok(Json(rows))
}

/// Adds `"rollout": {"role", "phase", "percent"}` to the index rows of the
/// versions a rollout moves traffic between (`percent`: the share of
/// unversioned requests the version answers).
fn mark_rollouts(rows: &mut serde_json::Value, rollouts: &[RolloutStatus]) {
    let Some(rows) = rows.as_array_mut() else { return };
    for row in rows {
        let (Some(name), Some(version)) = (row["name"].as_str(), row["version"].as_str()) else { continue };
        let Some(r) = rollouts.iter().find(|r| r.model == name) else { continue };
        let (role, percent) = match version.parse::<u64>() {
            Ok(v) if v == r.candidate => ("candidate", r.percent),
            Ok(v) if v == r.serving => ("serving", 100.0 - r.percent),
            _ => continue,
        };
        row["rollout"] = serde_json::json!({"role": role, "phase": r.phase, "percent": percent});
    }
}

/// `POST /v2/repository/models/{m}/load` (explicit mode): loads the model,
/// or reloads what changed. The optional body's `parameters` may hold
/// `config` (a JSON model configuration, as a string or an object) used
/// instead of `config.pbtxt`, and `file:<version>/<name>` entries (base64)
/// that make up the model folder instead of the repository's. 200 once every
/// selected version is READY; 400 with every failure's reason otherwise
/// (versions that were serving keep serving).
pub async fn load_model(
    State(service): State<Arc<Service>>,
    Path(name): Path<String>,
    Body(body): Body,
) -> ApiResult<Json<serde_json::Value>> {
    let request = repository::load_request(Front::Http, &repository_parameters(&body, "load")?)?;
    service.load(&name, request).await?;
    Ok(Json(serde_json::json!({})))
}

/// `POST /v2/repository/models/{m}/unload` (explicit mode): requests already
/// accepted finish; later ones get 503. The optional body's `parameters`
/// may set `unload_dependents`.
pub async fn unload_model(
    State(service): State<Arc<Service>>,
    Path(name): Path<String>,
    Body(body): Body,
) -> ApiResult<Json<serde_json::Value>> {
    let dependents = repository::unload_dependents(&repository_parameters(&body, "unload")?)?;
    service.unload(&name, dependents).await?;
    Ok(Json(serde_json::json!({})))
}

/// `POST /v2/repository/models/{m}/rollout`: starts a rollout with the
/// JSON plan in the body (Plinth's; docs/rollouts.md); answers with its
/// status. 400 for a plan that does not parse or versions not READY.
pub async fn start_rollout(
    State(service): State<Arc<Service>>,
    Path(name): Path<String>,
    Body(body): Body,
) -> ApiResult<Json<RolloutStatus>> {
    Ok(Json(service.lifecycle.start_rollout(&name, &body)?))
}

/// `GET /v2/repository/models/{m}/rollout`: the model's rollout, in
/// progress or finished; 404 when it has none.
pub async fn rollout(State(service): State<Arc<Service>>, Path(name): Path<String>) -> ApiResult<Json<RolloutStatus>> {
    Ok(Json(service.lifecycle.rollout(&name)?))
}

/// `DELETE /v2/repository/models/{m}/rollout`: cancels the rollout in
/// progress (the serving version takes every request back); 404 when
/// there is none.
pub async fn cancel_rollout(
    State(service): State<Arc<Service>>,
    Path(name): Path<String>,
) -> ApiResult<Json<RolloutStatus>> {
    Ok(Json(service.lifecycle.cancel_rollout(&name)?))
}

/// The `parameters` of a repository request's optional JSON body (`what`
/// names the request in the error).
fn repository_parameters(body: &[u8], what: &str) -> Result<Parameters, ApiError> {
    #[derive(serde::Deserialize)]
    struct RepositoryRequest {
        #[serde(default)]
        parameters: Parameters,
    }
    if body.is_empty() {
        return Ok(Parameters::default());
    }
    let request: RepositoryRequest = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("malformed {what} request JSON: {e}")))?;
    Ok(request.parameters)
}

/// `GET /v2/logging`: the log settings (Triton's logging extension).
pub async fn log_settings(State(service): State<Arc<Service>>) -> ApiResult<Json<serde_json::Value>> {
    Ok(Json(service.log_settings()?))
}

/// `POST /v2/logging`: changes the settings the body names; answers with
/// all of them.
pub async fn update_log_settings(
    State(service): State<Arc<Service>>,
    Body(body): Body,
) -> ApiResult<Json<serde_json::Value>> {
    let update: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("the log settings must be a JSON object: {e}")))?;
    Ok(Json(service.update_log_settings(&update)?))
}

/// `GET /v2/trace/setting`: the server's trace settings.
pub async fn trace_settings(State(service): State<Arc<Service>>) -> ApiResult<Json<serde_json::Value>> {
    Ok(Json(service.trace_settings(None, None)?))
}

/// `POST /v2/trace/setting`: changes the server's trace settings.
pub async fn update_trace_settings(
    State(service): State<Arc<Service>>,
    Body(body): Body,
) -> ApiResult<Json<serde_json::Value>> {
    let update = trace_update(&body)?;
    Ok(Json(service.trace_settings(None, Some(&update))?))
}

/// `GET /v2/models/{m}/trace/setting`: the trace settings in force for a
/// model.
pub async fn model_trace_settings(
    State(service): State<Arc<Service>>,
    Path(name): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    Ok(Json(service.trace_settings(Some(&name), None)?))
}

/// `POST /v2/models/{m}/trace/setting`: changes a model's trace settings;
/// `{}` removes them (Triton's extension).
pub async fn update_model_trace_settings(
    State(service): State<Arc<Service>>,
    Path(name): Path<String>,
    Body(body): Body,
) -> ApiResult<Json<serde_json::Value>> {
    let update = trace_update(&body)?;
    Ok(Json(service.trace_settings(Some(&name), Some(&update))?))
}

/// A trace extension request body: each setting a string, a number, a
/// list of strings, or `null` (which clears a model's setting).
fn trace_update(body: &[u8]) -> Result<Update, ApiError> {
    use serde_json::Value;
    let settings: serde_json::Map<String, Value> = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the trace settings must be a JSON object: {e}")))?;
    settings
        .into_iter()
        .map(|(key, value)| {
            let values = match value {
                Value::Null => Vec::new(),
                Value::String(s) => vec![s],
                Value::Number(n) => vec![n.to_string()],
                Value::Array(items) => items
                    .into_iter()
                    .map(|v| match v {
                        Value::String(s) => Ok(s),
                        other => Err(other),
                    })
                    .collect::<Result<_, _>>()
                    .map_err(|v| ApiError::bad_request(format!("trace setting '{key}': {v} is not a string")))?,
                other => return Err(ApiError::bad_request(format!("trace setting '{key}': {other} is not a string"))),
            };
            Ok((key, values))
        })
        .collect()
}

/// `GET /v2/systemsharedmemory[/region/{r}]/status`: the registered
/// regions, or the one named (404 when it is not registered).
pub async fn shared_memory_status(
    State(service): State<Arc<Service>>,
    region: Option<Path<String>>,
) -> ApiResult<Json<Vec<RegionStatus>>> {
    Ok(Json(service.shared_memory.status(region.as_ref().map(|r| r.0.as_str()))?))
}

/// A register request's body (the extension's
/// `$system_shared_memory_register_request`; sizes in bytes).
#[derive(serde::Deserialize)]
struct RegisterRequest {
    key: Option<String>,
    #[serde(default)]
    offset: u64,
    byte_size: Option<u64>,
}

/// `POST /v2/systemsharedmemory/region/{r}/register`: registers `byte_size`
/// bytes from `offset` of the object `key` as region `r`; the answer has
/// an empty body.
pub async fn register_shared_memory(
    State(service): State<Arc<Service>>,
    Path(region): Path<String>,
    Body(body): Body,
) -> ApiResult<StatusCode> {
    let request: RegisterRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("malformed shared memory register request JSON: {e}")))?;
    let missing = |field: &str| ApiError::bad_request(format!("Shared memory register request has no '{field}' field"));
    let key = request.key.ok_or_else(|| missing("key"))?;
    let byte_size = request.byte_size.ok_or_else(|| missing("byte_size"))?;
    service.shared_memory.register(&region, &key, request.offset, byte_size)?;
    Ok(StatusCode::OK)
}

/// `POST /v2/systemsharedmemory/register`: refused, a region needs a name.
pub async fn register_unnamed_shared_memory() -> ApiError {
    ApiError::bad_request("'region name' is necessary to register system shared memory region")
}

/// `POST /v2/systemsharedmemory[/region/{r}]/unregister`: unregisters the
/// region named, or every region; a name not registered is no error.
pub async fn unregister_shared_memory(
    State(service): State<Arc<Service>>,
    region: Option<Path<String>>,
) -> ApiResult<StatusCode> {
    service.shared_memory.unregister(region.as_ref().map(|r| r.0.as_str()))?;
    Ok(StatusCode::OK)
}

/// `/v2/cudasharedmemory/status` and `.../register`: refused; Plinth has
/// no CUDA memory to share.
pub async fn cuda_shared_memory() -> ApiError {
    Error::Unsupported(CUDA_UNSUPPORTED.into()).into()
}

/// `POST /v2/cudasharedmemory[/region/{r}]/unregister`: there are no CUDA
/// regions, so nothing to unregister (see [`SharedMemory::unregister_cuda`]).
///
/// [`SharedMemory::unregister_cuda`]: super::shared_memory::SharedMemory::unregister_cuda
pub async fn unregister_cuda_shared_memory(State(service): State<Arc<Service>>) -> ApiResult<StatusCode> {
    service.shared_memory.unregister_cuda()?;
    Ok(StatusCode::OK)
}

/// Any other path.
pub async fn unknown_route() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "unknown route; see the KServe v2 protocol's /v2/... routes")
}

/// A known path with the wrong method.
pub async fn wrong_method() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this route")
}

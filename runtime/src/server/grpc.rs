//! The KServe v2 gRPC service (`inference.GRPCInferenceService`, from
//! `proto/grpc_service.proto`) on tonic. Like the HTTP routes, it only
//! translates between protobuf messages and the [`Service`] core.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::oneshot::error::TryRecvError;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::http;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use super::restrictions::{Api, Restrictions};
use super::service::{self, EXTENSIONS, InferCall, ParameterValue, SERVER_NAME, Service};
use super::shared_memory::{CUDA_UNSUPPORTED, OutputPlaces};
use crate::config::proto as pb;
use crate::config::proto::grpc_inference_service_server::GrpcInferenceService;
use crate::config::proto::infer_parameter::ParameterChoice;
use crate::error::Error;
use crate::lifecycle::{FILE_PREFIX, LoadRequest};
use crate::metrics::{ModelStatistics, Total};
use crate::model::OutputRequest;
use crate::protocol::shared_memory::{self, RegionRef, Regions};
use crate::scheduler::policy::RequestOptions;
use crate::scheduler::sequence::{CorrelationId, Owner, SequenceRequest, new_owner};
use crate::tensor::{DataType, Tensor, push_bytes_element, request_datatype};
use crate::trace::{Front, Span, Update};
use opentelemetry::KeyValue;
use tracing::Instrument;

/// The gRPC face of the server.
pub struct Grpc {
    /// The core every handler calls.
    pub service: Arc<Service>,
}

type Answer<T> = Result<Response<T>, Status>;

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        let message = e.to_string();
        match e {
            Error::InvalidArgument(_) => Status::invalid_argument(message),
            Error::NotFound(_) => Status::not_found(message),
            Error::AlreadyExists(_) => Status::already_exists(message),
            // gRPC's HTTP mapping turns 502 into UNAVAILABLE too.
            Error::Unavailable(_) | Error::Overloaded(_) | Error::BadGateway(_) => Status::unavailable(message),
            Error::Internal(_) => Status::internal(message),
            Error::Unsupported(_) => Status::unimplemented(message),
        }
    }
}

impl Grpc {
    /// Refuses a request to `api` without the metadata
    /// `--grpc-restricted-protocol` asks for, with Triton's status and text.
    fn allow<T>(&self, api: Api, request: &Request<T>) -> Result<(), Status> {
        restricted(&self.service.grpc_restrictions, api, request.metadata())
    }
}

/// [`Grpc::allow`] over `metadata`; also the check of the health service.
pub fn restricted(restrictions: &Restrictions, api: Api, metadata: &MetadataMap) -> Result<(), Status> {
    restrictions
        .check(api, |key| metadata.get(key).and_then(|v| v.to_str().ok()))
        .map_err(|missing| Status::unavailable(format!("This protocol is restricted, expecting header '{missing}'")))
}

/// The start of tonic's message when a request message is larger than
/// `max_decoding_message_size`.
const TOO_LARGE: &str = "Error, decoded message length too large";

/// A request message over the size limit is RESOURCE_EXHAUSTED, as gRPC's
/// other implementations (C++, Java, Go) answer it, where tonic (0.14.9,
/// the newest) says OUT_OF_RANGE: the status to answer instead of
/// `status`, or `None` for every other status.
fn over_the_limit(status: &Status) -> Option<Status> {
    (status.code() == tonic::Code::OutOfRange && status.message().starts_with(TOO_LARGE))
        .then(|| Status::resource_exhausted(status.message()))
}

/// A gRPC service whose answers go through [`over_the_limit`]: tonic
/// decodes a unary request before the handler runs, so its status can only
/// be changed on the way out. (A stream's messages are decoded as the
/// handler reads them: `serve_stream` maps its own.)
#[derive(Clone)]
pub struct MessageLimit<S>(pub S);

impl<S: tonic::server::NamedService> tonic::server::NamedService for MessageLimit<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> tonic::codegen::Service<http::Request<B>> for MessageLimit<S>
where
    S: tonic::codegen::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = tonic::codegen::BoxFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let answer = self.0.call(request);
        Box::pin(async move {
            let mut response = answer.await?;
            // A unary call's error is trailers-only: its status is in the headers.
            if let Some(status) = Status::from_header_map(response.headers())
                && let Some(exhausted) = over_the_limit(&status)
            {
                let _ = exhausted.add_header(response.headers_mut());
            }
            Ok(response)
        })
    }
}

/// An empty version field means "the server's choice".
fn version(v: &str) -> Result<Option<u64>, Error> {
    if v.is_empty() { Ok(None) } else { service::parse_version(v).map(Some) }
}

#[tonic::async_trait]
impl GrpcInferenceService for Grpc {
    async fn server_live(&self, request: Request<pb::ServerLiveRequest>) -> Answer<pb::ServerLiveResponse> {
        self.allow(Api::Health, &request)?;
        Ok(Response::new(pb::ServerLiveResponse { live: true }))
    }

    async fn server_ready(&self, request: Request<pb::ServerReadyRequest>) -> Answer<pb::ServerReadyResponse> {
        self.allow(Api::Health, &request)?;
        Ok(Response::new(pb::ServerReadyResponse { ready: self.service.is_ready() }))
    }

    async fn model_ready(&self, request: Request<pb::ModelReadyRequest>) -> Answer<pb::ModelReadyResponse> {
        self.allow(Api::Health, &request)?;
        let r = request.into_inner();
        let ready = self.service.model_ready(&r.name, version(&r.version)?).is_ok();
        Ok(Response::new(pb::ModelReadyResponse { ready }))
    }

    async fn server_metadata(&self, request: Request<pb::ServerMetadataRequest>) -> Answer<pb::ServerMetadataResponse> {
        self.allow(Api::Metadata, &request)?;
        Ok(Response::new(pb::ServerMetadataResponse {
            name: SERVER_NAME.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: EXTENSIONS.iter().map(|e| e.to_string()).collect(),
        }))
    }

    async fn model_metadata(&self, request: Request<pb::ModelMetadataRequest>) -> Answer<pb::ModelMetadataResponse> {
        self.allow(Api::Metadata, &request)?;
        let model_id = mesh_model_id(&request);
        let mut r = request.into_inner();
        if let Some(id) = model_id {
            r.name = id;
        }
        let m = self.service.model_metadata(&r.name, version(&r.version)?).await?;
        let tensors = |list: Vec<crate::protocol::json::TensorMetadata>| {
            list.into_iter()
                .map(|t| pb::model_metadata_response::TensorMetadata {
                    name: t.name,
                    datatype: t.datatype.into(),
                    shape: t.shape,
                })
                .collect()
        };
        Ok(Response::new(pb::ModelMetadataResponse {
            name: m.name,
            versions: m.versions,
            platform: m.platform,
            inputs: tensors(m.inputs),
            outputs: tensors(m.outputs),
        }))
    }

    async fn model_infer(&self, request: Request<pb::ModelInferRequest>) -> Answer<pb::ModelInferResponse> {
        self.allow(Api::Inference, &request)?;
        let _counted = self.service.begin_inference()?;
        let model_id = mesh_model_id(&request);
        let headers = TraceHeaders::of(request.metadata());
        let mut r = request.into_inner();
        if let Some(id) = model_id {
            r.model_name = id;
        }
        Ok(Response::new(traced_infer(&self.service, r, None, ("ModelInfer", &headers)).await?))
    }

    type ModelStreamInferStream = ReceiverStream<Result<pb::ModelStreamInferResponse, Status>>;

    /// Each request of the stream runs as it arrives; each answer (or error,
    /// with the request's id) is sent as its request completes. When the
    /// client goes away or cancels the call, the requests still queued are
    /// taken out and never run.
    async fn model_stream_infer(
        &self,
        request: Request<Streaming<pb::ModelInferRequest>>,
    ) -> Answer<Self::ModelStreamInferStream> {
        self.allow(Api::Inference, &request)?;
        let (answers, stream) = tokio::sync::mpsc::channel(STREAM_BUFFER);
        let headers = TraceHeaders::of(request.metadata());
        tokio::spawn(serve_stream(self.service.clone(), request.into_inner(), answers, headers));
        Ok(Response::new(ReceiverStream::new(stream)))
    }

    async fn model_config(&self, request: Request<pb::ModelConfigRequest>) -> Answer<pb::ModelConfigResponse> {
        self.allow(Api::ModelConfig, &request)?;
        let r = request.into_inner();
        let config = self.service.model_config(&r.name, version(&r.version)?).await?;
        Ok(Response::new(pb::ModelConfigResponse { config: Some(config) }))
    }

    async fn model_statistics(
        &self,
        request: Request<pb::ModelStatisticsRequest>,
    ) -> Answer<pb::ModelStatisticsResponse> {
        self.allow(Api::Statistics, &request)?;
        let r = request.into_inner();
        let name = (!r.name.is_empty()).then_some(r.name.as_str());
        let stats = self.service.statistics(name, version(&r.version)?)?;
        Ok(Response::new(pb::ModelStatisticsResponse { model_stats: stats.into_iter().map(statistics).collect() }))
    }

    async fn repository_index(
        &self,
        request: Request<pb::RepositoryIndexRequest>,
    ) -> Answer<pb::RepositoryIndexResponse> {
        self.allow(Api::ModelRepository, &request)?;
        let r = request.into_inner();
        unnamed_repository(&r.repository_name)?;
        let ready_only = r.ready;
        let models = self
            .service
            .repository_index(ready_only)
            .into_iter()
            .map(|row| pb::repository_index_response::ModelIndex {
                name: row.name,
                version: row.version,
                state: row.state.as_str().into(),
                reason: row.reason,
            })
            .collect();
        Ok(Response::new(pb::RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        request: Request<pb::RepositoryModelLoadRequest>,
    ) -> Answer<pb::RepositoryModelLoadResponse> {
        use pb::model_repository_parameter::ParameterChoice as P;
        self.allow(Api::ModelRepository, &request)?;
        let r = request.into_inner();
        unnamed_repository(&r.repository_name)?;
        let mut load = LoadRequest::default();
        for (key, value) in r.parameters {
            match (key.as_str(), value.parameter_choice) {
                ("config", Some(P::StringParam(json))) => load.config = Some(json),
                ("config", _) => {
                    return Err(Status::invalid_argument(
                        "parameter 'config' must be a string holding a JSON model configuration",
                    ));
                }
                (file, Some(P::BytesParam(bytes))) if file.starts_with(FILE_PREFIX) => {
                    load.files.insert(file[FILE_PREFIX.len()..].to_owned(), bytes);
                }
                (file, _) if file.starts_with(FILE_PREFIX) => {
                    return Err(Status::invalid_argument(format!("parameter '{file}' must be a bytes_param")));
                }
                (other, _) => {
                    return Err(Status::invalid_argument(format!(
                        "unknown load parameter '{other}'; a load takes 'config' and '{FILE_PREFIX}<version>/<name>'"
                    )));
                }
            }
        }
        self.service.load(&r.model_name, load).await?;
        Ok(Response::new(pb::RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        request: Request<pb::RepositoryModelUnloadRequest>,
    ) -> Answer<pb::RepositoryModelUnloadResponse> {
        use pb::model_repository_parameter::ParameterChoice as P;
        self.allow(Api::ModelRepository, &request)?;
        let r = request.into_inner();
        unnamed_repository(&r.repository_name)?;
        let mut dependents = false;
        for (key, value) in r.parameters {
            match (key.as_str(), value.parameter_choice) {
                ("unload_dependents", Some(P::BoolParam(flag))) => dependents = flag,
                ("unload_dependents", _) => {
                    return Err(Status::invalid_argument("parameter 'unload_dependents' must be a bool_param"));
                }
                (other, _) => {
                    return Err(Status::invalid_argument(format!(
                        "unknown unload parameter '{other}'; an unload takes 'unload_dependents'"
                    )));
                }
            }
        }
        self.service.unload(&r.model_name, dependents).await?;
        Ok(Response::new(pb::RepositoryModelUnloadResponse {}))
    }

    async fn system_shared_memory_status(
        &self,
        request: Request<pb::SystemSharedMemoryStatusRequest>,
    ) -> Answer<pb::SystemSharedMemoryStatusResponse> {
        use pb::system_shared_memory_status_response::RegionStatus;
        self.allow(Api::SharedMemory, &request)?;
        let name = request.into_inner().name;
        let status = self.service.shared_memory.status((!name.is_empty()).then_some(name.as_str()))?;
        let regions = status
            .into_iter()
            .map(|r| {
                let status =
                    RegionStatus { name: r.name.clone(), key: r.key, offset: r.offset, byte_size: r.byte_size };
                (r.name, status)
            })
            .collect();
        Ok(Response::new(pb::SystemSharedMemoryStatusResponse { regions }))
    }

    async fn system_shared_memory_register(
        &self,
        request: Request<pb::SystemSharedMemoryRegisterRequest>,
    ) -> Answer<pb::SystemSharedMemoryRegisterResponse> {
        self.allow(Api::SharedMemory, &request)?;
        let r = request.into_inner();
        self.service.shared_memory.register(&r.name, &r.key, r.offset, r.byte_size)?;
        Ok(Response::new(pb::SystemSharedMemoryRegisterResponse {}))
    }

    /// An empty name unregisters every region.
    async fn system_shared_memory_unregister(
        &self,
        request: Request<pb::SystemSharedMemoryUnregisterRequest>,
    ) -> Answer<pb::SystemSharedMemoryUnregisterResponse> {
        self.allow(Api::SharedMemory, &request)?;
        let name = request.into_inner().name;
        self.service.shared_memory.unregister((!name.is_empty()).then_some(name.as_str()))?;
        Ok(Response::new(pb::SystemSharedMemoryUnregisterResponse {}))
    }

    async fn cuda_shared_memory_status(
        &self,
        request: Request<pb::CudaSharedMemoryStatusRequest>,
    ) -> Answer<pb::CudaSharedMemoryStatusResponse> {
        self.allow(Api::SharedMemory, &request)?;
        Err(Status::unimplemented(CUDA_UNSUPPORTED))
    }

    async fn cuda_shared_memory_register(
        &self,
        request: Request<pb::CudaSharedMemoryRegisterRequest>,
    ) -> Answer<pb::CudaSharedMemoryRegisterResponse> {
        self.allow(Api::SharedMemory, &request)?;
        Err(Status::unimplemented(CUDA_UNSUPPORTED))
    }

    async fn cuda_shared_memory_unregister(
        &self,
        request: Request<pb::CudaSharedMemoryUnregisterRequest>,
    ) -> Answer<pb::CudaSharedMemoryUnregisterResponse> {
        self.allow(Api::SharedMemory, &request)?;
        self.service.shared_memory.unregister_cuda()?;
        Ok(Response::new(pb::CudaSharedMemoryUnregisterResponse {}))
    }

    /// Triton's `TraceSetting`: no settings reads them; a setting with no
    /// values clears a model's.
    async fn trace_setting(&self, request: Request<pb::TraceSettingRequest>) -> Answer<pb::TraceSettingResponse> {
        use pb::trace_setting_response::SettingValue;
        self.allow(Api::Trace, &request)?;
        let r = request.into_inner();
        let model = (!r.model_name.is_empty()).then_some(r.model_name.as_str());
        let update: Update = r.settings.into_iter().map(|(key, v)| (key, v.value)).collect();
        let settings = self.service.trace_settings(model, (!update.is_empty()).then_some(&update))?;
        let settings = settings.as_object().into_iter().flatten().map(|(key, value)| {
            let value = match value {
                serde_json::Value::Array(items) => items.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect(),
                other => vec![other.as_str().map_or_else(|| other.to_string(), str::to_owned)],
            };
            (key.clone(), SettingValue { value })
        });
        Ok(Response::new(pb::TraceSettingResponse { settings: settings.collect() }))
    }

    async fn log_settings(&self, request: Request<pb::LogSettingsRequest>) -> Answer<pb::LogSettingsResponse> {
        use pb::log_settings_request::setting_value::ParameterChoice as P;
        self.allow(Api::Logging, &request)?;
        let update: serde_json::Map<String, serde_json::Value> = request
            .into_inner()
            .settings
            .into_iter()
            .map(|(key, value)| {
                let value = match value.parameter_choice {
                    Some(P::BoolParam(b)) => serde_json::Value::Bool(b),
                    Some(P::Uint32Param(n)) => n.into(),
                    Some(P::StringParam(s)) => serde_json::Value::String(s),
                    None => serde_json::Value::Null,
                };
                (key, value)
            })
            .collect();
        let settings =
            if update.is_empty() { self.service.log_settings()? } else { self.service.update_log_settings(&update)? };
        Ok(Response::new(log_settings_response(settings)))
    }
}

/// Plinth's repositories have no names: a request naming one is refused
/// rather than served from whichever repository holds the model.
fn unnamed_repository(name: &str) -> Result<(), Status> {
    if name.is_empty() {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!(
            "repository_name '{name}': Plinth's repositories have no names; leave it empty"
        )))
    }
}

/// The log settings as the gRPC `LogSettingsResponse` carries them.
fn log_settings_response(settings: serde_json::Value) -> pb::LogSettingsResponse {
    use pb::log_settings_response::SettingValue;
    use pb::log_settings_response::setting_value::ParameterChoice as P;
    let value = |v: &serde_json::Value| match v {
        serde_json::Value::Bool(b) => Some(P::BoolParam(*b)),
        serde_json::Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()).map(P::Uint32Param),
        serde_json::Value::String(s) => Some(P::StringParam(s.clone())),
        _ => None,
    };
    let settings = settings.as_object().into_iter().flatten();
    pb::LogSettingsResponse {
        settings: settings.map(|(k, v)| (k.clone(), SettingValue { parameter_choice: value(v) })).collect(),
    }
}

/// Answers buffered on a stream before its requests wait for the client to
/// read them.
const STREAM_BUFFER: usize = 64;

/// The W3C trace context a call's metadata carries.
#[derive(Clone, Default)]
struct TraceHeaders {
    traceparent: Option<String>,
    tracestate: Option<String>,
}

impl TraceHeaders {
    fn of(metadata: &MetadataMap) -> TraceHeaders {
        let get = |key: &str| metadata.get(key).and_then(|v| v.to_str().ok()).map(str::to_owned);
        TraceHeaders { traceparent: get("traceparent"), tracestate: get("tracestate") }
    }
}

/// [`infer`] under the request's root span when it is traced: `call` is
/// the method it came on and the call's trace context.
async fn traced_infer(
    service: &Service,
    r: pb::ModelInferRequest,
    stream: Option<Owner>,
    call: (&'static str, &TraceHeaders),
) -> Result<pb::ModelInferResponse, Status> {
    let (method, headers) = call;
    let front = Front::Grpc(method);
    let span = service.start_trace(&r.model_name, front, headers.traceparent.as_deref(), headers.tracestate.as_deref());
    let Some(span) = span else { return infer(service, r, stream, None).await };
    // The request's log lines carry its trace id (`--log-format json`).
    let log = tracing::info_span!("request", trace_id = %span.trace_id());
    let result = infer(service, r, stream, Some(span.clone())).instrument(log).await;
    let code = result.as_ref().map_or_else(Status::code, |_| tonic::Code::Ok);
    span.set(KeyValue::new("rpc.grpc.status_code", code as i64));
    // OpenTelemetry's gRPC conventions: the codes that fail a server span.
    use tonic::Code as C;
    if let Err(status) = &result
        && matches!(
            code,
            C::Unknown | C::DeadlineExceeded | C::Unimplemented | C::Internal | C::Unavailable | C::DataLoss
        )
    {
        span.fail(status.message());
    }
    span.event("INFER_RESPONSE_COMPLETE");
    span.event("GRPC_SEND_START");
    span.end();
    result
}

/// Runs one `ModelInferRequest` through the service core; `stream` is the
/// `ModelStreamInfer` call it came on, if any (it owns the sequences it
/// starts); `trace` its root span, when it is traced.
async fn infer(
    service: &Service,
    r: pb::ModelInferRequest,
    stream: Option<Owner>,
    trace: Option<Span>,
) -> Result<pb::ModelInferResponse, Status> {
    let m = service.model(&r.model_name, version(&r.model_version)?).await?;
    let (parameters, inputs, raw, outputs) = (r.parameters, r.inputs, r.raw_input_contents, r.outputs);
    let request_id = (!r.id.is_empty()).then(|| r.id.clone());
    let inferred = service
        .infer(&m, trace, |_| {
            check_parameters(&parameters, &inputs, &outputs)?;
            let options = RequestOptions {
                priority: uint_parameter(&parameters, "priority")?,
                timeout_us: uint_parameter(&parameters, "timeout")?,
                sequence: sequence_request(&parameters)?.map(|s| SequenceRequest { owner: stream, ..s }),
                request_id,
                trace: None,
            };
            let requested = outputs.iter().map(requested_output).collect::<Result<_, _>>()?;
            let places = output_places(service, &outputs)?;
            let tensors = input_tensors(&m.name, inputs, raw, &service.shared_memory)?;
            let sequence = options.sequence.clone();
            Ok((InferCall { tensors, requested, options }, (places, sequence)))
        })
        .await?;
    let (places, sequence) = inferred.request;
    let mut response = pb::ModelInferResponse {
        model_name: m.name.clone(),
        model_version: m.version.to_string(),
        id: r.id,
        ..Default::default()
    };
    // A sequence's flags come back on its answers, as Triton sends them
    // (a stream's reader tells a sequence's last answer by them).
    if let Some(sequence) = sequence {
        for (key, flag) in [("sequence_start", sequence.start), ("sequence_end", sequence.end)] {
            let value = pb::InferParameter { parameter_choice: Some(ParameterChoice::BoolParam(flag)) };
            response.parameters.insert(key.to_owned(), value);
        }
    }
    for t in inferred.outputs {
        // An output in shared memory keeps its (empty) raw_output_contents
        // entry: clients find each output's data by its position.
        let in_shared_memory = places.write(&t)?;
        response.outputs.push(pb::model_infer_response::InferOutputTensor {
            name: t.name,
            datatype: t.datatype.name().into(),
            shape: t.shape,
            ..Default::default()
        });
        response.raw_output_contents.push(if in_shared_memory { Vec::new() } else { t.data });
    }
    Ok(response)
}

/// The sequence parameters of a gRPC request.
///
/// # Errors
/// As [`service::sequence_request`].
fn sequence_request(parameters: &HashMap<String, pb::InferParameter>) -> Result<Option<SequenceRequest>, Error> {
    service::sequence_request(|key| {
        Some(match parameters.get(key)?.parameter_choice.as_ref()? {
            ParameterChoice::BoolParam(b) => ParameterValue::Bool(*b),
            ParameterChoice::Int64Param(n) => ParameterValue::Int(*n),
            ParameterChoice::Uint64Param(n) => ParameterValue::Uint(*n),
            ParameterChoice::StringParam(s) => ParameterValue::Text(s),
            other => ParameterValue::Other(format!("{other:?}")),
        })
    })
}

/// A sequence a stream carries: model name, version field, correlation id.
type StreamSequence = (String, String, CorrelationId);

/// Serves one `ModelStreamInfer` call: reads requests until the client ends
/// its side, runs each as its own task, and sends each answer as it is
/// ready. Requests of one sequence run one after another, in the order
/// they came, each after the one before was answered. The tasks are
/// aborted (their queued requests taken out, which cancels their
/// sequences) when the client cancels or stops reading; when the stream
/// ends, the sequences it opened and left open end.
async fn serve_stream(
    service: Arc<Service>,
    mut requests: Streaming<pb::ModelInferRequest>,
    answers: tokio::sync::mpsc::Sender<Result<pb::ModelStreamInferResponse, Status>>,
    headers: TraceHeaders,
) {
    let owner = new_owner();
    let mut running = tokio::task::JoinSet::new();
    // Each sequence's last request so far: its answer has been sent when
    // the receiver reports its sender gone.
    let mut sequences: HashMap<StreamSequence, tokio::sync::oneshot::Receiver<()>> = HashMap::new();
    // The sequences the stream sent requests of and did not see end.
    let mut opened: HashSet<StreamSequence> = HashSet::new();
    let mut reading = true;
    while reading || !running.is_empty() {
        tokio::select! {
            next = requests.message(), if reading => match next {
                Ok(Some(request)) => {
                    let (service, headers) = (service.clone(), headers.clone());
                    let turn = match sequence_request(&request.parameters) {
                        Ok(Some(sequence)) => {
                            // Sequences whose last request has been answered
                            // need no entry, unless still open.
                            sequences.retain(|_, done| matches!(done.try_recv(), Err(TryRecvError::Empty)));
                            let key = (request.model_name.clone(), request.model_version.clone(), sequence.id);
                            let (answered, done) = tokio::sync::oneshot::channel();
                            let previous = sequences.insert(key.clone(), done);
                            opened.insert(key.clone());
                            Some((previous, answered, key, sequence.end))
                        }
                        _ => None,
                    };
                    running.spawn(async move {
                        let Some((previous, answered, key, end)) = turn else {
                            return (stream_answer(&service, request, owner, &headers).await, None);
                        };
                        if let Some(turn) = previous {
                            let _ = turn.await;
                        }
                        (stream_answer(&service, request, owner, &headers).await, Some((answered, key, end)))
                    });
                }
                Ok(None) => reading = false,
                // A message over the limit ends the stream with its status.
                Err(status) if let Some(exhausted) = over_the_limit(&status) => {
                    let _ = answers.send(Err(exhausted)).await;
                    break;
                }
                // The client cancelled the call or the connection broke.
                Err(_) => break,
            },
            Some(done) = running.join_next() => {
                let (answer, sequence) = done.unwrap_or_else(|e| {
                    (stream_error(String::new(), &format!("the request failed: {e}")), None)
                });
                let succeeded = answer.error_message.is_empty();
                let sent = answers.send(Ok(answer)).await;
                // The sequence's next request may run now that this answer
                // is on its way, so the answers keep the requests' order.
                if let Some((answered, key, end)) = sequence {
                    if end && succeeded {
                        opened.remove(&key);
                    }
                    drop(answered);
                }
                if sent.is_err() {
                    break;
                }
            },
            () = answers.closed() => break,
        }
    }
    // Requests still running are cancelled, and with them their sequences.
    drop(running);
    for (model, version_field, id) in opened {
        // Never loads: a model that is not resident holds no sequences. A
        // sequence that ended, or that another client opened since under
        // the same id, is left alone.
        if let Ok(m) = version(&version_field).and_then(|v| service.registry().resolve(&model, v)) {
            m.release_sequence(&id, owner);
        }
    }
}

/// The stream's answer to one request: its response, or its error with its
/// id, as Triton answers on the stream. `owner` is the stream.
async fn stream_answer(
    service: &Service,
    request: pb::ModelInferRequest,
    owner: Owner,
    headers: &TraceHeaders,
) -> pb::ModelStreamInferResponse {
    let id = request.id.clone();
    let answer = match service.begin_inference() {
        Ok(_counted) => traced_infer(service, request, Some(owner), ("ModelStreamInfer", headers)).await,
        Err(e) => Err(e.into()),
    };
    match answer {
        Ok(response) => pb::ModelStreamInferResponse { error_message: String::new(), infer_response: Some(response) },
        Err(status) => stream_error(id, status.message()),
    }
}

fn stream_error(id: String, message: &str) -> pb::ModelStreamInferResponse {
    let infer_response = pb::ModelInferResponse { id, ..Default::default() };
    pb::ModelStreamInferResponse { error_message: message.to_owned(), infer_response: Some(infer_response) }
}

/// The model id ModelMesh sends with a forwarded request, which names the
/// model in place of the request's own field: `mm-model-id`, or for an id
/// that is not ASCII, `mm-model-id-bin` (gRPC binary metadata, UTF-8).
fn mesh_model_id<T>(request: &Request<T>) -> Option<String> {
    use super::modelmesh::MODEL_ID_HEADER;
    let metadata = request.metadata();
    if let Some(id) = metadata.get(MODEL_ID_HEADER) {
        return id.to_str().ok().map(str::to_owned);
    }
    let id = metadata.get_bin(format!("{MODEL_ID_HEADER}-bin"))?.to_bytes().ok()?;
    String::from_utf8(id.to_vec()).ok()
}

/// An output the request asks for, with its `classification` parameter
/// (an int64 above 0, as Triton reads it).
fn requested_output(o: &pb::model_infer_request::InferRequestedOutputTensor) -> Result<OutputRequest, Error> {
    let classification = match o.parameters.get("classification").and_then(|p| p.parameter_choice.as_ref()) {
        None => None,
        Some(ParameterChoice::Int64Param(n)) if *n > 0 => Some(usize::try_from(*n).unwrap_or(usize::MAX)),
        Some(other) => {
            return Err(Error::InvalidArgument(format!(
                "output '{}': parameter 'classification' must be an int64_param above 0, got {other:?}",
                o.name
            )));
        }
    };
    Ok(OutputRequest { name: o.name.clone(), classification })
}

/// Refuses the parameters, of the request, an input or an output, that
/// Plinth does not act on.
fn check_parameters(
    parameters: &std::collections::HashMap<String, pb::InferParameter>,
    inputs: &[pb::model_infer_request::InferInputTensor],
    outputs: &[pb::model_infer_request::InferRequestedOutputTensor],
) -> Result<(), Error> {
    use crate::protocol::parameters::{Front, Level, check};
    check(Level::Request, Front::Grpc, "", parameters.keys().map(String::as_str))?;
    for i in inputs {
        check(Level::Input, Front::Grpc, &format!("input '{}'", i.name), i.parameters.keys().map(String::as_str))?;
    }
    for o in outputs {
        check(Level::Output, Front::Grpc, &format!("output '{}'", o.name), o.parameters.keys().map(String::as_str))?;
    }
    Ok(())
}

/// A non-negative integer request parameter (`priority`, `timeout`).
fn uint_parameter(
    parameters: &std::collections::HashMap<String, pb::InferParameter>,
    key: &str,
) -> Result<Option<u64>, Error> {
    match parameters.get(key).and_then(|p| p.parameter_choice.as_ref()) {
        None => Ok(None),
        Some(ParameterChoice::Uint64Param(v)) => Ok(Some(*v)),
        Some(ParameterChoice::Int64Param(v)) if *v >= 0 => Ok(Some(*v as u64)),
        Some(other) => Err(Error::InvalidArgument(format!(
            "request parameter '{key}' must be a non-negative integer, got {other:?}"
        ))),
    }
}

/// The inputs as tensors: from a shared memory region, from
/// `raw_input_contents` (one entry per input not in shared memory, in
/// order, as Triton counts them) or from each input's typed `contents`.
fn input_tensors(
    model: &str,
    inputs: Vec<pb::model_infer_request::InferInputTensor>,
    raw: Vec<Vec<u8>>,
    regions: &dyn Regions,
) -> Result<Vec<Tensor>, Error> {
    let places = inputs.iter().map(|i| region(&i.name, &i.parameters)).collect::<Result<Vec<_>, _>>()?;
    let in_body = places.iter().filter(|p| p.is_none()).count();
    if !raw.is_empty() && raw.len() != in_body {
        return Err(Error::InvalidArgument(format!(
            "raw_input_contents has {} entries for {in_body} inputs not in shared memory; give one per input, in order",
            raw.len(),
        )));
    }
    let mut raw = raw.into_iter();
    inputs
        .into_iter()
        .zip(places)
        .map(|(input, place)| {
            let bad = |m: String| Error::InvalidArgument(format!("input '{}': {m}", input.name));
            let contents = input.contents.unwrap_or_default();
            if let Some(at) = place {
                if contents != pb::InferTensorContents::default() {
                    return Err(Error::InvalidArgument(format!(
                        "unexpected 'content' provided when using shared memory for input tensor '{}' for model \
                         '{model}'",
                        input.name
                    )));
                }
                return shared_memory::input_tensor(model, input.name, &input.datatype, input.shape, &at, regions);
            }
            let datatype = request_datatype(&input.datatype, &input.shape).map_err(bad)?;
            let data = match raw.next() {
                Some(_) if contents != pb::InferTensorContents::default() => {
                    return Err(bad("has both typed contents and raw_input_contents; give one".into()));
                }
                Some(bytes) => bytes,
                None => typed_contents(datatype, contents).map_err(bad)?,
            };
            let tensor = Tensor { name: input.name.clone(), datatype, shape: input.shape, data };
            tensor.check_data().map_err(Error::InvalidArgument)?;
            Ok(tensor)
        })
        .collect()
}

/// The shared memory place the `parameters` of tensor `name` (an input or
/// a requested output) give, if any; the value kinds are Triton's.
fn region(
    name: &str,
    parameters: &std::collections::HashMap<String, pb::InferParameter>,
) -> Result<Option<RegionRef>, Error> {
    let kind = |key: &str, expected: &str| {
        Error::InvalidArgument(format!(
            "invalid value type for '{key}' parameter for tensor '{name}', expected {expected}."
        ))
    };
    let number = |key: &str| match parameters.get(key).and_then(|p| p.parameter_choice.as_ref()) {
        None => Ok(None),
        Some(ParameterChoice::Int64Param(n)) => u64::try_from(*n)
            .map(Some)
            .map_err(|_| Error::InvalidArgument(format!("'{key}' of tensor '{name}' must not be negative, got {n}"))),
        Some(ParameterChoice::Uint64Param(n)) => Ok(Some(*n)),
        Some(_) => Err(kind(key, "int64_param")),
    };
    let region = match parameters.get(shared_memory::REGION).and_then(|p| p.parameter_choice.as_ref()) {
        None => None,
        Some(ParameterChoice::StringParam(s)) => Some(s.clone()),
        Some(_) => return Err(kind(shared_memory::REGION, "string_param")),
    };
    RegionRef::from_parameters(name, region, number(shared_memory::OFFSET)?, number(shared_memory::BYTE_SIZE)?)
}

/// Where the requested outputs that name a shared memory region go, each
/// checked against its region before the model runs.
fn output_places(
    service: &Service,
    outputs: &[pb::model_infer_request::InferRequestedOutputTensor],
) -> Result<OutputPlaces, Error> {
    let mut places = OutputPlaces::default();
    for o in outputs {
        let Some(at) = region(&o.name, &o.parameters)? else { continue };
        if o.parameters.contains_key("classification") {
            return Err(Error::InvalidArgument(format!(
                "output can't set both 'shared_memory_region' and 'classification' (output '{}')",
                o.name
            )));
        }
        places.insert(o.name.clone(), service.shared_memory.output(at)?);
    }
    Ok(places)
}

/// The `InferTensorContents` field that carries `datatype`.
fn contents_field(datatype: DataType) -> &'static str {
    match datatype {
        DataType::Bool => "bool_contents",
        DataType::Int8 | DataType::Int16 | DataType::Int32 => "int_contents",
        DataType::Int64 => "int64_contents",
        DataType::Uint8 | DataType::Uint16 | DataType::Uint32 => "uint_contents",
        DataType::Uint64 => "uint64_contents",
        DataType::Fp32 => "fp32_contents",
        DataType::Fp64 => "fp64_contents",
        DataType::Bytes => "bytes_contents",
        DataType::Fp16 | DataType::Bf16 => "raw_input_contents",
    }
}

/// Typed `InferTensorContents` as little-endian bytes; only the field of
/// the datatype may be set.
fn typed_contents(datatype: DataType, c: pb::InferTensorContents) -> Result<Vec<u8>, String> {
    let set = [
        ("bool_contents", !c.bool_contents.is_empty()),
        ("int_contents", !c.int_contents.is_empty()),
        ("int64_contents", !c.int64_contents.is_empty()),
        ("uint_contents", !c.uint_contents.is_empty()),
        ("uint64_contents", !c.uint64_contents.is_empty()),
        ("fp32_contents", !c.fp32_contents.is_empty()),
        ("fp64_contents", !c.fp64_contents.is_empty()),
        ("bytes_contents", !c.bytes_contents.is_empty()),
    ];
    let want = contents_field(datatype);
    if let Some((other, _)) = set.iter().find(|(name, is_set)| *is_set && *name != want) {
        return Err(format!("{datatype} data goes in {want}, but {other} is set"));
    }
    /// `values` as the narrower `T`, little-endian, each checked for range.
    fn narrow<T: TryFrom<i64>, const N: usize>(
        values: impl Iterator<Item = i64>,
        dt: DataType,
        out: &mut Vec<u8>,
        le: impl Fn(T) -> [u8; N],
    ) -> Result<(), String> {
        for v in values {
            out.extend(le(T::try_from(v).map_err(|_| format!("{v} is out of range for {dt}"))?));
        }
        Ok(())
    }
    let mut out = Vec::new();
    let ints = || c.int_contents.iter().map(|&v| i64::from(v));
    let uints = || c.uint_contents.iter().map(|&v| i64::from(v));
    match datatype {
        DataType::Bool => out.extend(c.bool_contents.iter().map(|&b| u8::from(b))),
        DataType::Int8 => narrow(ints(), datatype, &mut out, i8::to_le_bytes)?,
        DataType::Int16 => narrow(ints(), datatype, &mut out, i16::to_le_bytes)?,
        DataType::Int32 => narrow(ints(), datatype, &mut out, i32::to_le_bytes)?,
        DataType::Int64 => out.extend(c.int64_contents.iter().flat_map(|v| v.to_le_bytes())),
        DataType::Uint8 => narrow(uints(), datatype, &mut out, u8::to_le_bytes)?,
        DataType::Uint16 => narrow(uints(), datatype, &mut out, u16::to_le_bytes)?,
        DataType::Uint32 => narrow(uints(), datatype, &mut out, u32::to_le_bytes)?,
        DataType::Uint64 => out.extend(c.uint64_contents.iter().flat_map(|v| v.to_le_bytes())),
        DataType::Fp32 => out.extend(c.fp32_contents.iter().flat_map(|v| v.to_le_bytes())),
        DataType::Fp64 => out.extend(c.fp64_contents.iter().flat_map(|v| v.to_le_bytes())),
        DataType::Bytes => c.bytes_contents.iter().for_each(|b| push_bytes_element(&mut out, b)),
        DataType::Fp16 | DataType::Bf16 => {
            return Err(format!("{datatype} has no typed contents; send it in raw_input_contents"));
        }
    }
    Ok(out)
}

fn statistics(s: ModelStatistics) -> pb::ModelStatistics {
    let d = |t: Total| Some(pb::StatisticDuration { count: t.count, ns: t.ns });
    let i = s.inference_stats;
    pb::ModelStatistics {
        name: s.name,
        version: s.version,
        last_inference: s.last_inference,
        inference_count: s.inference_count,
        execution_count: s.execution_count,
        inference_stats: Some(pb::InferStatistics {
            success: d(i.success),
            fail: d(i.fail),
            queue: d(i.queue),
            compute_input: d(i.compute_input),
            compute_infer: d(i.compute_infer),
            compute_output: d(i.compute_output),
            cache_hit: d(i.cache_hit),
            cache_miss: d(i.cache_miss),
        }),
        batch_stats: s
            .batch_stats
            .into_iter()
            .map(|b| pb::InferBatchStatistics {
                batch_size: b.batch_size,
                compute_input: d(b.compute_input),
                compute_infer: d(b.compute_infer),
                compute_output: d(b.compute_output),
            })
            .collect(),
    }
}

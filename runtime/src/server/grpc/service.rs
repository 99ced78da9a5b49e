//! The handlers of `inference.GRPCInferenceService`: each reads its
//! message, calls the [`Service`] core and answers. Restrictions and the
//! message limit are the layers' ([`super::layers`]); the messages' codecs
//! are `protocol::grpc` and [`super::codec`].

use std::sync::Arc;

use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::codec;
use super::infer::{Caller, Outcome, TraceHeaders, traced_infer, version};
use super::stream::{STREAM_BUFFER, serve_stream};
use crate::protocol::grpc::proto::grpc_inference_service_server::GrpcInferenceService;
use crate::protocol::grpc::{proto as pb, repository_parameters};
use crate::protocol::parameters::Front;
use crate::protocol::repository;
use crate::server::service::{EXTENSIONS, SERVER_NAME, Service};
use crate::server::shared_memory::CUDA_UNSUPPORTED;

/// The gRPC face of the server.
pub struct Grpc {
    /// The core every handler calls.
    pub service: Arc<Service>,
}

type Answer<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl GrpcInferenceService for Grpc {
    async fn server_live(&self, _: Request<pb::ServerLiveRequest>) -> Answer<pb::ServerLiveResponse> {
        Ok(Response::new(pb::ServerLiveResponse { live: true }))
    }

    async fn server_ready(&self, _: Request<pb::ServerReadyRequest>) -> Answer<pb::ServerReadyResponse> {
        Ok(Response::new(pb::ServerReadyResponse { ready: self.service.is_ready() }))
    }

    async fn model_ready(&self, request: Request<pb::ModelReadyRequest>) -> Answer<pb::ModelReadyResponse> {
        let r = request.into_inner();
        let ready = self.service.model_ready(&r.name, version(&r.version)?).is_ok();
        Ok(Response::new(pb::ModelReadyResponse { ready }))
    }

    async fn server_metadata(&self, _: Request<pb::ServerMetadataRequest>) -> Answer<pb::ServerMetadataResponse> {
        Ok(Response::new(pb::ServerMetadataResponse {
            name: SERVER_NAME.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: EXTENSIONS.iter().map(|e| e.to_string()).collect(),
        }))
    }

    async fn model_metadata(&self, request: Request<pb::ModelMetadataRequest>) -> Answer<pb::ModelMetadataResponse> {
        let model_id = mesh_model_id(&request);
        let mut r = request.into_inner();
        if let Some(id) = model_id {
            r.name = id;
        }
        let m = self.service.model_metadata(&r.name, version(&r.version)?).await?;
        Ok(Response::new(codec::model_metadata(m)))
    }

    async fn model_infer(&self, request: Request<pb::ModelInferRequest>) -> Answer<pb::ModelInferResponse> {
        let _counted = self.service.begin_inference()?;
        let model_id = mesh_model_id(&request);
        let headers = TraceHeaders::of(request.metadata());
        let mut r = request.into_inner();
        if let Some(id) = model_id {
            r.model_name = id;
        }
        match traced_infer(&self.service, r, Caller::Unary, ("ModelInfer", &headers)).await? {
            Outcome::Response(response) => Ok(Response::new(response)),
            Outcome::Generation(_) => unreachable!("ModelInfer refuses generative models"),
        }
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
        let (answers, stream) = tokio::sync::mpsc::channel(STREAM_BUFFER);
        let headers = TraceHeaders::of(request.metadata());
        tokio::spawn(serve_stream(self.service.clone(), request.into_inner(), answers, headers));
        Ok(Response::new(ReceiverStream::new(stream)))
    }

    async fn model_config(&self, request: Request<pb::ModelConfigRequest>) -> Answer<pb::ModelConfigResponse> {
        let r = request.into_inner();
        let config = self.service.model_config(&r.name, version(&r.version)?).await?;
        Ok(Response::new(pb::ModelConfigResponse { config: Some(config) }))
    }

    async fn model_statistics(
        &self,
        request: Request<pb::ModelStatisticsRequest>,
    ) -> Answer<pb::ModelStatisticsResponse> {
        let r = request.into_inner();
        let name = (!r.name.is_empty()).then_some(r.name.as_str());
        let stats = self.service.statistics(name, version(&r.version)?)?;
        Ok(Response::new(pb::ModelStatisticsResponse {
            model_stats: stats.into_iter().map(codec::statistics).collect(),
        }))
    }

    async fn repository_index(
        &self,
        request: Request<pb::RepositoryIndexRequest>,
    ) -> Answer<pb::RepositoryIndexResponse> {
        let r = request.into_inner();
        unnamed_repository(&r.repository_name)?;
        let models = self
            .service
            .repository_index(r.ready)
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
        let r = request.into_inner();
        unnamed_repository(&r.repository_name)?;
        let load = repository::load_request(Front::Grpc, &repository_parameters(r.parameters))?;
        self.service.load(&r.model_name, load).await?;
        Ok(Response::new(pb::RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        request: Request<pb::RepositoryModelUnloadRequest>,
    ) -> Answer<pb::RepositoryModelUnloadResponse> {
        let r = request.into_inner();
        unnamed_repository(&r.repository_name)?;
        let dependents = repository::unload_dependents(&repository_parameters(r.parameters))?;
        self.service.unload(&r.model_name, dependents).await?;
        Ok(Response::new(pb::RepositoryModelUnloadResponse {}))
    }

    async fn system_shared_memory_status(
        &self,
        request: Request<pb::SystemSharedMemoryStatusRequest>,
    ) -> Answer<pb::SystemSharedMemoryStatusResponse> {
        use pb::system_shared_memory_status_response::RegionStatus;
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
        let r = request.into_inner();
        self.service.shared_memory.register(&r.name, &r.key, r.offset, r.byte_size)?;
        Ok(Response::new(pb::SystemSharedMemoryRegisterResponse {}))
    }

    /// An empty name unregisters every region.
    async fn system_shared_memory_unregister(
        &self,
        request: Request<pb::SystemSharedMemoryUnregisterRequest>,
    ) -> Answer<pb::SystemSharedMemoryUnregisterResponse> {
        let name = request.into_inner().name;
        self.service.shared_memory.unregister((!name.is_empty()).then_some(name.as_str()))?;
        Ok(Response::new(pb::SystemSharedMemoryUnregisterResponse {}))
    }

    async fn cuda_shared_memory_status(
        &self,
        _: Request<pb::CudaSharedMemoryStatusRequest>,
    ) -> Answer<pb::CudaSharedMemoryStatusResponse> {
        Err(Status::unimplemented(CUDA_UNSUPPORTED))
    }

    async fn cuda_shared_memory_register(
        &self,
        _: Request<pb::CudaSharedMemoryRegisterRequest>,
    ) -> Answer<pb::CudaSharedMemoryRegisterResponse> {
        Err(Status::unimplemented(CUDA_UNSUPPORTED))
    }

    async fn cuda_shared_memory_unregister(
        &self,
        _: Request<pb::CudaSharedMemoryUnregisterRequest>,
    ) -> Answer<pb::CudaSharedMemoryUnregisterResponse> {
        self.service.shared_memory.unregister_cuda()?;
        Ok(Response::new(pb::CudaSharedMemoryUnregisterResponse {}))
    }

    /// Triton's `TraceSetting`: no settings reads them; a setting with no
    /// values clears a model's.
    async fn trace_setting(&self, request: Request<pb::TraceSettingRequest>) -> Answer<pb::TraceSettingResponse> {
        let r = request.into_inner();
        let model = (!r.model_name.is_empty()).then_some(r.model_name.as_str());
        let update = codec::trace_update(r.settings);
        let settings = self.service.trace_settings(model, (!update.is_empty()).then_some(&update))?;
        Ok(Response::new(codec::trace_settings(settings)))
    }

    async fn log_settings(&self, request: Request<pb::LogSettingsRequest>) -> Answer<pb::LogSettingsResponse> {
        let update = codec::log_update(request.into_inner().settings);
        let settings =
            if update.is_empty() { self.service.log_settings()? } else { self.service.update_log_settings(&update)? };
        Ok(Response::new(codec::log_settings(settings)))
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

/// The model id ModelMesh sends with a forwarded request, which names the
/// model in place of the request's own field: `mm-model-id`, or for an id
/// that is not ASCII, `mm-model-id-bin` (gRPC binary metadata, UTF-8).
fn mesh_model_id<T>(request: &Request<T>) -> Option<String> {
    use crate::server::modelmesh::MODEL_ID_HEADER;
    let metadata = request.metadata();
    if let Some(id) = metadata.get(MODEL_ID_HEADER) {
        return id.to_str().ok().map(str::to_owned);
    }
    let id = metadata.get_bin(format!("{MODEL_ID_HEADER}-bin"))?.to_bytes().ok()?;
    String::from_utf8(id.to_vec()).ok()
}

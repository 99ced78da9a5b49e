//! ModelMesh's model-management service (`mmesh.ModelRuntime`, from
//! `proto/model_runtime.proto`), served beside the KServe v2 gRPC service in
//! `--model-control-mode=modelmesh`. It only translates: `lifecycle` loads,
//! unloads and measures.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tonic::{Request, Response, Status};

use super::Service;
use crate::error::LoadError;
use crate::lifecycle::{DEFAULT_MODEL_SIZE, Mesh, Source, predict_size};

/// Code generated from `proto/model_runtime.proto`.
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/wire/mmesh.rs"));
}

use proto::model_runtime_server::ModelRuntime;
use proto::runtime_status_response::{MethodInfo, Status as RuntimeState};

/// The gRPC header in which ModelMesh sends the model id with each forwarded
/// inference request.
pub const MODEL_ID_HEADER: &str = "mm-model-id";

/// The inference methods ModelMesh may forward, each with the path of field
/// numbers to the string it overwrites with the model id: `model_name` is
/// field 1 of `ModelInferRequest` and `name` field 1 of `ModelMetadataRequest`.
const METHODS: [&str; 2] =
    ["inference.GRPCInferenceService/ModelInfer", "inference.GRPCInferenceService/ModelMetadata"];

/// The service over the server's core.
pub struct MeshRuntime {
    /// The core; its lifecycle is in modelmesh mode.
    pub service: Arc<Service>,
}

type Answer<T> = Result<Response<T>, Status>;

impl MeshRuntime {
    fn mesh(&self) -> Result<Mesh<'_>, Status> {
        self.service
            .lifecycle
            .modelmesh()
            .ok_or_else(|| Status::failed_precondition("the server is not in model control mode 'modelmesh'"))
    }
}

/// A load's failure as ModelMesh reads it: INVALID_ARGUMENT and
/// FAILED_PRECONDITION mean "no load was tried, no memory is used".
fn load_status(e: LoadError) -> Status {
    let message = e.to_string();
    match e {
        LoadError::Invalid(_) | LoadError::NotAllowed(_) => Status::invalid_argument(message),
        LoadError::NoRoom(_) => Status::failed_precondition(message),
        LoadError::Failed(_) => Status::internal(message),
        LoadError::Aborted(_) => Status::aborted(message),
    }
}

/// What Plinth reads of a `modelKey` (JSON written by ModelMesh and its
/// puller); every other field is ignored.
#[derive(Debug, Default, PartialEq)]
struct ModelKey {
    /// `model_type.name`: the model format, e.g. `onnx`.
    model_type: Option<String>,
    /// `disk_size_bytes`: the size of the model's files.
    disk_size_bytes: Option<u64>,
}

impl ModelKey {
    /// Parses `json`; an empty string is an empty key.
    ///
    /// # Errors
    /// INVALID_ARGUMENT when it is not a JSON object.
    fn parse(json: &str) -> Result<ModelKey, Status> {
        if json.trim().is_empty() {
            return Ok(ModelKey::default());
        }
        let value: serde_json::Value =
            serde_json::from_str(json).map_err(|e| Status::invalid_argument(format!("modelKey is not JSON: {e}")))?;
        if !value.is_object() {
            return Err(Status::invalid_argument(format!("modelKey must be a JSON object, got {value}")));
        }
        Ok(ModelKey {
            model_type: value.pointer("/model_type/name").and_then(|n| n.as_str()).map(str::to_lowercase),
            disk_size_bytes: value.get("disk_size_bytes").and_then(serde_json::Value::as_u64),
        })
    }

    /// The model format: the key's, or else the request's `modelType`.
    fn model_type(&self, request_type: &str) -> String {
        self.model_type.clone().unwrap_or_else(|| request_type.to_lowercase())
    }
}

#[tonic::async_trait]
impl ModelRuntime for MeshRuntime {
    async fn load_model(&self, request: Request<proto::LoadModelRequest>) -> Answer<proto::LoadModelResponse> {
        let r = request.into_inner();
        let key = ModelKey::parse(&r.model_key)?;
        let source = Source::of(Path::new(&r.model_path), &key.model_type(&r.model_type)).map_err(load_status)?;
        tracing::info!(model = ?r.model_id, path = ?r.model_path, "modelmesh: loadModel");
        let bytes = self.mesh()?.load(&r.model_id, source).await.map_err(load_status)?;
        Ok(Response::new(proto::LoadModelResponse { size_in_bytes: bytes, max_concurrency: 0 }))
    }

    async fn unload_model(&self, request: Request<proto::UnloadModelRequest>) -> Answer<proto::UnloadModelResponse> {
        let id = request.into_inner().model_id;
        tracing::info!(model = ?id, "modelmesh: unloadModel");
        self.mesh()?.unload(&id).await;
        Ok(Response::new(proto::UnloadModelResponse {}))
    }

    async fn predict_model_size(
        &self,
        request: Request<proto::PredictModelSizeRequest>,
    ) -> Answer<proto::PredictModelSizeResponse> {
        let r = request.into_inner();
        let key = ModelKey::parse(&r.model_key)?;
        let size_in_bytes = predict_size(Path::new(&r.model_path), &key.model_type(&r.model_type), key.disk_size_bytes);
        Ok(Response::new(proto::PredictModelSizeResponse { size_in_bytes }))
    }

    async fn model_size(&self, request: Request<proto::ModelSizeRequest>) -> Answer<proto::ModelSizeResponse> {
        let id = request.into_inner().model_id;
        let size_in_bytes =
            self.mesh()?.model_size(&id).ok_or_else(|| Status::not_found(format!("model '{id}' is not loaded")))?;
        Ok(Response::new(proto::ModelSizeResponse { size_in_bytes }))
    }

    async fn runtime_status(&self, _: Request<proto::RuntimeStatusRequest>) -> Answer<proto::RuntimeStatusResponse> {
        let started = self.service.startup_done.load(Ordering::Acquire);
        if started {
            // ModelMesh asks only when it (re)starts, and then knows of no
            // model here: whatever is loaded would be counted nowhere.
            tracing::info!("modelmesh: runtimeStatus: unloading every model before answering READY");
            self.mesh()?.purge().await;
        }
        let limits = self.service.lifecycle.limits();
        let method = MethodInfo { id_injection_path: vec![1] };
        Ok(Response::new(proto::RuntimeStatusResponse {
            status: if started { RuntimeState::Ready } else { RuntimeState::Starting }.into(),
            capacity_in_bytes: limits.budget.bytes.unwrap_or(0),
            max_loading_concurrency: u32::try_from(limits.concurrency.max(1)).unwrap_or(u32::MAX),
            model_loading_timeout_ms: u32::try_from(limits.timeout.as_millis()).unwrap_or(u32::MAX),
            default_model_size_in_bytes: DEFAULT_MODEL_SIZE,
            runtime_version: env!("CARGO_PKG_VERSION").into(),
            numeric_runtime_version: 0,
            method_infos: METHODS.iter().map(|m| (m.to_string(), method.clone())).collect::<HashMap<_, _>>(),
            limit_model_concurrency: false,
            allow_any_method: false,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::ModelKey;

    #[test]
    fn model_keys_keep_what_plinth_reads_and_ignore_the_rest() {
        let key = ModelKey::parse(
            r#"{"model_type":{"name":"ONNX","version":"1"},"disk_size_bytes":1234,"schema_path":null,"future":[1]}"#,
        )
        .unwrap();
        assert_eq!(key, ModelKey { model_type: Some("onnx".into()), disk_size_bytes: Some(1234) });
        assert_eq!(ModelKey::parse("").unwrap(), ModelKey::default());
        assert_eq!(ModelKey::parse("{}").unwrap().model_type("Pytorch"), "pytorch");
        assert!(ModelKey::parse("[1]").unwrap_err().message().contains("JSON object"));
        assert!(ModelKey::parse("{").unwrap_err().message().contains("not JSON"));
    }
}

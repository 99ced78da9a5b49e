//! What wraps every gRPC service of the server, as one tower layer each:
//! the `--grpc-restricted-protocol` check, keyed by the method a call
//! names, and the status of a message over the size limit. HTTP's router
//! layers (`server::http`) do the same for the routes.

use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::Status;
use tonic::codegen::{BoxFuture, Service, http};

use crate::server::restrictions::{Api, Restrictions};

/// The API group of each gRPC method the restrictions cover, by service
/// and method (Triton's grouping, `docs/customization_guide/inference_protocols.md`).
/// A method not listed (ModelMesh's runtime, which only ModelMesh calls)
/// is never restricted.
const METHODS: &[(&str, &str, Api)] = &[
    ("inference.GRPCInferenceService", "ServerLive", Api::Health),
    ("inference.GRPCInferenceService", "ServerReady", Api::Health),
    ("inference.GRPCInferenceService", "ModelReady", Api::Health),
    ("inference.GRPCInferenceService", "ServerMetadata", Api::Metadata),
    ("inference.GRPCInferenceService", "ModelMetadata", Api::Metadata),
    ("inference.GRPCInferenceService", "ModelInfer", Api::Inference),
    ("inference.GRPCInferenceService", "ModelStreamInfer", Api::Inference),
    ("inference.GRPCInferenceService", "ModelConfig", Api::ModelConfig),
    ("inference.GRPCInferenceService", "ModelStatistics", Api::Statistics),
    ("inference.GRPCInferenceService", "RepositoryIndex", Api::ModelRepository),
    ("inference.GRPCInferenceService", "RepositoryModelLoad", Api::ModelRepository),
    ("inference.GRPCInferenceService", "RepositoryModelUnload", Api::ModelRepository),
    ("inference.GRPCInferenceService", "SystemSharedMemoryStatus", Api::SharedMemory),
    ("inference.GRPCInferenceService", "SystemSharedMemoryRegister", Api::SharedMemory),
    ("inference.GRPCInferenceService", "SystemSharedMemoryUnregister", Api::SharedMemory),
    ("inference.GRPCInferenceService", "CudaSharedMemoryStatus", Api::SharedMemory),
    ("inference.GRPCInferenceService", "CudaSharedMemoryRegister", Api::SharedMemory),
    ("inference.GRPCInferenceService", "CudaSharedMemoryUnregister", Api::SharedMemory),
    ("inference.GRPCInferenceService", "TraceSetting", Api::Trace),
    ("inference.GRPCInferenceService", "LogSettings", Api::Logging),
    ("grpc.health.v1.Health", "Check", Api::Health),
    ("grpc.health.v1.Health", "Watch", Api::Health),
];

/// The group of the method a call's path (`/<service>/<method>`) names.
fn api_of(path: &str) -> Option<Api> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    METHODS.iter().find(|(s, m, _)| *s == service && *m == method).map(|(_, _, api)| *api)
}

/// A gRPC service behind the `--grpc-restricted-protocol` check: a call to
/// a restricted group without its header is answered UNAVAILABLE with
/// Triton's text before the service sees it.
#[derive(Clone)]
pub struct Restricted<S> {
    inner: S,
    restrictions: Arc<Restrictions>,
}

impl<S> Restricted<S> {
    /// The layer that puts services behind `restrictions`.
    pub fn layer(restrictions: Restrictions) -> impl tower::Layer<S, Service = Restricted<S>> + Clone {
        let restrictions = Arc::new(restrictions);
        tower::layer::layer_fn(move |inner| Restricted { inner, restrictions: restrictions.clone() })
    }
}

/// The refusal of a call to `api` that lacks its header, or `None`.
fn refusal(restrictions: &Restrictions, path: &str, headers: &http::HeaderMap) -> Option<Status> {
    let api = api_of(path)?;
    let missing = restrictions.check(api, |key| headers.get(key).and_then(|v| v.to_str().ok())).err()?;
    Some(Status::unavailable(format!("This protocol is restricted, expecting header '{missing}'")))
}

impl<S, B, R> Service<http::Request<B>> for Restricted<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if let Some(status) = refusal(&self.restrictions, request.uri().path(), request.headers()) {
            return Box::pin(async move { Ok(status.into_http()) });
        }
        Box::pin(self.inner.call(request))
    }
}

/// The start of tonic's message when a request message is larger than
/// `max_decoding_message_size`.
const TOO_LARGE: &str = "Error, decoded message length too large";

/// A request message over the size limit is RESOURCE_EXHAUSTED, as gRPC's
/// other implementations (C++, Java, Go) answer it, where tonic (0.14.9,
/// the newest) says OUT_OF_RANGE: the status to answer instead of
/// `status`, or `None` for every other status.
pub fn over_the_limit(status: &Status) -> Option<Status> {
    (status.code() == tonic::Code::OutOfRange && status.message().starts_with(TOO_LARGE))
        .then(|| Status::resource_exhausted(status.message()))
}

/// A gRPC service whose answers go through [`over_the_limit`]: tonic
/// decodes a unary request before the handler runs, so its status can only
/// be changed on the way out. (A stream's messages are decoded as the
/// handler reads them: the stream maps its own.)
#[derive(Clone)]
pub struct MessageLimit<S>(S);

impl<S> MessageLimit<S> {
    /// The layer that puts services behind the mapping.
    pub fn layer() -> impl tower::Layer<S, Service = MessageLimit<S>> + Clone {
        tower::layer::layer_fn(MessageLimit)
    }
}

impl<S, B, R> Service<http::Request<B>> for MessageLimit<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::restrictions::Front;

    #[test]
    fn every_method_of_the_inference_service_has_its_group() {
        let proto = include_str!("../../../proto/grpc_service.proto");
        let methods: Vec<&str> = proto
            .lines()
            .filter_map(|l| l.trim().strip_prefix("rpc "))
            .map(|l| l.split('(').next().unwrap_or_default().trim())
            .collect();
        assert_eq!(methods.len(), 20, "{methods:?}");
        for method in methods {
            assert!(api_of(&format!("/inference.GRPCInferenceService/{method}")).is_some(), "{method}");
        }
        assert_eq!(api_of("/grpc.health.v1.Health/Check"), Some(Api::Health));
        assert_eq!(api_of("/mmesh.ModelRuntime/loadModel"), None);
        assert_eq!(api_of("nonsense"), None);
    }

    #[tokio::test]
    async fn a_restricted_call_without_its_header_never_reaches_the_service() {
        let restrictions = Restrictions::parse(&["inference:key=secret".into()], Front::Grpc).unwrap();
        let reached = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = reached.clone();
        let inner = tower::service_fn(move |_: http::Request<()>| {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async { Ok::<_, std::convert::Infallible>(http::Response::new(String::new())) }
        });
        let mut service = tower::Layer::layer(&Restricted::layer(restrictions), inner);
        let call = |path: &str, key: Option<&str>| {
            let mut request = http::Request::builder().uri(path);
            if let Some(value) = key {
                request = request.header("triton-grpc-protocol-key", value);
            }
            request.body(()).unwrap()
        };
        let refused = service.call(call("/inference.GRPCInferenceService/ModelInfer", None)).await.unwrap();
        let status = Status::from_header_map(refused.headers()).unwrap();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert_eq!(status.message(), "This protocol is restricted, expecting header 'triton-grpc-protocol-key'");
        assert_eq!(reached.load(std::sync::atomic::Ordering::Relaxed), 0);
        service.call(call("/inference.GRPCInferenceService/ModelInfer", Some("secret"))).await.unwrap();
        service.call(call("/inference.GRPCInferenceService/ServerLive", None)).await.unwrap();
        assert_eq!(reached.load(std::sync::atomic::Ordering::Relaxed), 2);
    }
}

//! The three listeners: HTTP (the KServe v2 routes), Prometheus metrics,
//! and gRPC (the KServe v2 service, gRPC health and, in modelmesh mode,
//! ModelMesh's runtime interface).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use tokio::sync::oneshot;
use tonic::codec::CompressionEncoding;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;

use super::restrictions::Api;
use super::{ServeOptions, Service, grpc, modelmesh};
use crate::config::proto::grpc_inference_service_server::GrpcInferenceServiceServer;
use crate::lifecycle::ControlMode;

/// How often the gRPC health service checks readiness.
const HEALTH_INTERVAL: Duration = Duration::from_millis(100);

type Serving<E> = tokio::task::JoinHandle<Result<(), E>>;

/// A server task and the sender that stops it gracefully.
struct Running<E> {
    stop: oneshot::Sender<()>,
    task: Serving<E>,
}

/// The bound listeners, serving.
pub(super) struct Listeners {
    http: Running<std::io::Error>,
    grpc: Option<Running<tonic::transport::Error>>,
}

impl Listeners {
    /// Binds and starts every listener `opts` asks for; each logs where it
    /// listens (tests and operators read the port from there).
    ///
    /// # Errors
    /// A message naming the address that cannot be bound.
    pub(super) async fn bind(opts: &ServeOptions, service: &Arc<Service>) -> Result<Listeners, String> {
        let http_addr = SocketAddr::new(opts.http_address, opts.http_port);
        let listener = bind(http_addr, "HTTP").await?;
        tracing::info!("HTTP server listening on {}", local_addr(&listener)?);
        if let Some(port) = opts.metrics_port {
            serve_metrics(SocketAddr::new(opts.http_address, port), service).await?;
        }
        let grpc = match opts.grpc_port {
            Some(port) => Some(serve_grpc(service, SocketAddr::new(opts.grpc_address, port)).await?),
            None => None,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let app = super::router(service.clone());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).with_graceful_shutdown(async { stopped.await.unwrap_or(()) }).await
        });
        Ok(Listeners { http: Running { stop, task }, grpc })
    }

    /// Stops HTTP and gRPC gracefully and waits for them.
    ///
    /// # Errors
    /// A message when a server failed.
    pub(super) async fn stop(self) -> Result<(), String> {
        let _ = self.http.stop.send(());
        self.http.task.await.map_err(|e| e.to_string())?.map_err(|e| format!("HTTP server failed: {e}"))?;
        if let Some(grpc) = self.grpc {
            let _ = grpc.stop.send(());
            grpc.task.await.map_err(|e| e.to_string())?.map_err(|e| format!("gRPC server failed: {e}"))?;
        }
        Ok(())
    }
}

async fn bind(addr: SocketAddr, what: &str) -> Result<tokio::net::TcpListener, String> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("cannot listen on {addr} for {what}: {e}"))
}

fn local_addr(listener: &tokio::net::TcpListener) -> Result<SocketAddr, String> {
    listener.local_addr().map_err(|e| e.to_string())
}

/// `GET /metrics` on its own port, until the process exits.
async fn serve_metrics(addr: SocketAddr, service: &Service) -> Result<(), String> {
    let listener = bind(addr, "metrics").await?;
    tracing::info!("metrics listening on {}", local_addr(&listener)?);
    let metrics = service.lifecycle.metrics().clone();
    let app = Router::new().route("/metrics", get(move || async move { metrics.render() }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(())
}

/// The KServe v2 gRPC service, the standard gRPC health service
/// (`grpc.health.v1.Health`, SERVING while ready) and, in modelmesh mode,
/// ModelMesh's `mmesh.ModelRuntime`.
async fn serve_grpc(service: &Arc<Service>, addr: SocketAddr) -> Result<Running<tonic::transport::Error>, String> {
    use modelmesh::proto::model_runtime_server::ModelRuntimeServer;
    let listener = bind(addr, "gRPC").await?;
    tracing::info!("gRPC server listening on {}", local_addr(&listener)?);
    let inference = GrpcInferenceServiceServer::new(grpc::Grpc { service: service.clone() })
        .max_decoding_message_size(service.max_body_bytes)
        .max_encoding_message_size(usize::MAX)
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Deflate)
        .send_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Deflate);
    let mesh = (service.lifecycle.mode() == ControlMode::ModelMesh)
        .then(|| grpc::MessageLimit(ModelRuntimeServer::new(modelmesh::MeshRuntime { service: service.clone() })));
    let (health, health_service) = tonic_health::server::health_reporter();
    // grpc.health.v1 belongs to the `health` group of --grpc-restricted-protocol.
    let restrictions = service.grpc_restrictions.clone();
    let health_service = tonic::service::interceptor::InterceptedService::new(health_service, move |request| {
        grpc::restricted(&restrictions, Api::Health, tonic::Request::metadata(&request))?;
        Ok(request)
    });
    let watched = service.clone();
    tokio::spawn(async move {
        // The health service follows readiness, within HEALTH_INTERVAL.
        let mut reported = None;
        loop {
            let status = if watched.is_ready() { ServingStatus::Serving } else { ServingStatus::NotServing };
            if reported != Some(status) {
                health.set_service_status("", status).await;
                health.set_service_status("inference.GRPCInferenceService", status).await;
                reported = Some(status);
            }
            tokio::time::sleep(HEALTH_INTERVAL).await;
        }
    });
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(grpc::MessageLimit(inference))
            .add_optional_service(mesh)
            // Without TCP_NODELAY small answers wait for the peer's delayed ACK (~40 ms).
            .serve_with_incoming_shutdown(TcpIncoming::from(listener).with_nodelay(Some(true)), async {
                stopped.await.unwrap_or(())
            }),
    );
    Ok(Running { stop, task })
}

//! The HTTP server: KServe v2 routes on axum, started by [`serve`], with
//! repository polling and graceful shutdown.

pub(crate) mod binary;
mod error;
mod grpc;
mod modelmesh;
mod routes;
pub(crate) mod v2_json;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tower_http::compression::CompressionLayer;
use tower_http::decompression::RequestDecompressionLayer;

use crate::error::Error;
use crate::lifecycle::{ControlMode, Lifecycle, LoadLimits};
use crate::model::Model;
use crate::model::Runtimes;
use crate::plugin::PluginLimits;
use crate::registry::Registry;
use tonic::codec::CompressionEncoding;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;

pub use error::ApiError;

/// Everything `plinth serve` needs, from flags (see `cli`).
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The model repository folders to serve.
    pub model_repositories: Vec<PathBuf>,
    /// How the loaded models change after start.
    pub control_mode: ControlMode,
    /// Poll mode: time between two looks at the repositories.
    pub repository_poll: Duration,
    /// Explicit and on-demand mode: the models to load at start (`*`: all).
    pub load_models: Vec<String>,
    /// Load concurrency, load timeout and the residency budget.
    pub load_limits: LoadLimits,
    /// Port of `GET /metrics`; `None` serves no metrics.
    pub metrics_port: Option<u16>,
    /// Port of the gRPC services; `None` serves no gRPC.
    pub grpc_port: Option<u16>,
    /// Address the HTTP and metrics servers bind.
    pub http_address: std::net::IpAddr,
    /// Address the gRPC server binds.
    pub grpc_address: std::net::IpAddr,
    /// 0 picks a free port (logged at start).
    pub http_port: u16,
    /// Largest request body accepted, in bytes (413 beyond).
    pub http_max_body_bytes: usize,
    /// Readiness also requires every model to be READY.
    pub strict_readiness: bool,
    /// How long accepted requests may take to finish after SIGTERM/SIGINT.
    pub exit_timeout: Duration,
    /// `--drain-delay-secs`: how long after SIGTERM/SIGINT the server, no
    /// longer ready, still takes new requests.
    pub drain_delay: Duration,
    /// Path of `libonnxruntime.so` (`ORT_DYLIB_PATH`).
    pub ort_dylib_path: Option<PathBuf>,
    /// Memory, time and concurrency limits of plugin calls.
    pub plugin_limits: PluginLimits,
    /// Where compiled plugins are cached; `None` disables the cache.
    pub plugin_cache_dir: Option<PathBuf>,
}

/// State shared by all handlers.
pub struct AppState {
    /// The models and their states.
    pub registry: Arc<Registry>,
    /// Loads and unloads models.
    pub lifecycle: Arc<Lifecycle>,
    /// Set once the start-up loads have been tried.
    pub startup_done: AtomicBool,
    /// Set at SIGTERM/SIGINT: not ready.
    pub shutting_down: AtomicBool,
    /// Set `--drain-delay-secs` after SIGTERM/SIGINT: no new inference.
    pub refusing: AtomicBool,
    /// Inference requests accepted and not yet answered.
    pub in_flight: AtomicUsize,
    /// `--strict-readiness`: ready only when every model is READY.
    pub strict_readiness: bool,
    /// `--http-max-body-bytes`, for the 413 message.
    pub max_body_bytes: usize,
}

/// The protocol extensions Plinth serves, as server metadata lists them.
pub const EXTENSIONS: [&str; 4] = ["binary_tensor_data", "model_configuration", "statistics", "model_repository"];

impl AppState {
    /// Ready: the start-up loads are done, shutdown has not begun and, with
    /// `--strict-readiness`, every model that should be loaded is READY.
    pub fn is_ready(&self) -> bool {
        let loaded = self.startup_done.load(Ordering::Acquire) && !self.shutting_down.load(Ordering::Acquire);
        loaded && (!self.strict_readiness || self.registry.all_ready())
    }

    /// Counts an inference request in flight until the guard drops.
    ///
    /// # Errors
    /// [`Error::Unavailable`] once shutdown has stopped taking requests.
    fn begin_inference(&self) -> Result<InFlight<'_>, Error> {
        let guard = InFlight::enter(&self.in_flight);
        // Checked after counting, so shutdown never misses a request it let in.
        if self.refusing.load(Ordering::Acquire) {
            return Err(Error::Unavailable("the server is shutting down".into()));
        }
        Ok(guard)
    }
}

/// A version number from a URL or a gRPC field: whole, no leading zeros.
///
/// # Errors
/// [`Error::NotFound`] for a well-formed number too large to be a version,
/// [`Error::InvalidArgument`] for anything else.
fn parse_version(v: &str) -> Result<u64, Error> {
    crate::repository::parse_version(v).ok_or_else(|| {
        if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) && !v.starts_with('0') {
            Error::NotFound(format!("no version {v}"))
        } else {
            Error::InvalidArgument(format!("model version must be a whole number without leading zeros, got '{v}'"))
        }
    })
}

/// The READY versions the statistics extension reports on: every model's
/// (no name), one model's, or one version's.
///
/// # Errors
/// [`Error::NotFound`] or [`Error::Unavailable`] for a model or version
/// that cannot be resolved.
fn stats_models(state: &AppState, name: Option<&str>, version: Option<u64>) -> Result<Vec<Arc<Model>>, Error> {
    match (name, version) {
        (None, _) => Ok(state.registry.ready_models(None)),
        (Some(name), Some(v)) => Ok(vec![state.registry.resolve(name, Some(v))?]),
        (Some(name), None) => {
            state.registry.resolve(name, None)?;
            Ok(state.registry.ready_models(Some(name)))
        }
    }
}

/// The KServe v2 routes.
pub fn router(state: Arc<AppState>) -> Router {
    let inference = Router::new()
        .route("/v2/models/{model}/infer", post(routes::infer))
        .route("/v2/models/{model}/versions/{version}/infer", post(routes::infer))
        .route("/v2/models/{model}/predict", post(routes::predict))
        .route("/v2/models/{model}/versions/{version}/predict", post(routes::predict))
        .route_layer(middleware::from_fn_with_state(state.clone(), track_inference));
    Router::new()
        .route("/v2/health/live", get(routes::live))
        .route("/v2/health/ready", get(routes::ready))
        .route("/v2", get(routes::server_metadata))
        .route("/v2/models/{model}", get(routes::model_metadata))
        .route("/v2/models/{model}/versions/{version}", get(routes::model_metadata))
        .route("/v2/models/{model}/ready", get(routes::model_ready))
        .route("/v2/models/{model}/config", get(routes::model_config))
        .route("/v2/models/{model}/versions/{version}/config", get(routes::model_config))
        .route("/v2/models/stats", get(routes::model_stats))
        .route("/v2/models/{model}/stats", get(routes::model_stats))
        .route("/v2/models/{model}/versions/{version}/stats", get(routes::model_stats))
        .route("/v2/models/{model}/versions/{version}/ready", get(routes::model_ready))
        .route("/v2/repository/index", post(routes::repository_index))
        .route("/v2/repository/models/{model}/load", post(routes::load_model))
        .route("/v2/repository/models/{model}/unload", post(routes::unload_model))
        .merge(inference)
        .fallback(routes::unknown_route)
        .method_not_allowed_fallback(routes::wrong_method)
        // The limit applies to the body after decompression, so a small
        // compressed body cannot unpack past it.
        .layer(DefaultBodyLimit::max(state.max_body_bytes))
        .layer(RequestDecompressionLayer::new())
        .layer(middleware::map_response(explain_unsupported_encoding))
        .layer(CompressionLayer::new())
        .with_state(state)
}

/// The decompression layer refuses an unknown `Content-Encoding` with an
/// empty 415; every failure says why in `{"error"}`.
async fn explain_unsupported_encoding(response: Response) -> Response {
    if response.status() == axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE
        && !response.headers().contains_key(axum::http::header::CONTENT_TYPE)
    {
        let message = "unsupported Content-Encoding; send the body as is, gzip or deflate";
        return ApiError::new(axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE, message).into_response();
    }
    response
}

/// Counts inference requests in flight, so shutdown can wait for them, and
/// refuses new ones once shutdown has begun.
async fn track_inference(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    match state.begin_inference() {
        Ok(_counted) => next.run(request).await,
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// One request counted in flight until it is dropped: answered, or
/// abandoned because its client went away.
struct InFlight<'a>(&'a AtomicUsize);

impl InFlight<'_> {
    fn enter(count: &AtomicUsize) -> InFlight<'_> {
        count.fetch_add(1, Ordering::AcqRel);
        InFlight(count)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Starts the runtimes, binds HTTP (so liveness answers during loading),
/// loads the models the control mode asks for, polls the repositories in
/// poll mode, and serves until SIGTERM/SIGINT. Then readiness turns false,
/// new inference gets 503, accepted requests finish, and it returns; when
/// some are still running after `exit_timeout`, the process exits at once
/// with status 1.
///
/// # Errors
/// A message when ONNX Runtime or wasmtime cannot start, a repository is
/// not a folder, or the address cannot be bound.
pub async fn serve(opts: ServeOptions) -> Result<(), String> {
    for repo in &opts.model_repositories {
        if !repo.is_dir() {
            return Err(format!("model repository {} is not a folder", repo.display()));
        }
    }
    let runtimes = Runtimes::start(opts.ort_dylib_path.as_deref(), opts.plugin_limits, opts.plugin_cache_dir.clone())?;
    if opts.control_mode == ControlMode::ModelMesh {
        // ModelMesh would place ONNX models here and see every load fail.
        if runtimes.onnx.is_none() {
            return Err(format!("modelmesh mode serves ONNX models: {}", crate::backend::onnx::HINT));
        }
        let capacity = opts.load_limits.budget.bytes.unwrap_or(0);
        tracing::info!(capacity_bytes = capacity, "modelmesh mode: ModelMesh loads and unloads models");
    }
    let registry = Arc::new(Registry::default());
    let metrics = runtimes.metrics.clone();
    let plugin_models = runtimes.plugins.models().clone();
    let lifecycle = Arc::new(Lifecycle::new(
        runtimes,
        registry.clone(),
        opts.model_repositories.clone(),
        opts.control_mode,
        opts.load_limits,
        metrics.clone(),
    ));
    plugin_models.connect(&lifecycle);
    let state = Arc::new(AppState {
        registry,
        lifecycle: lifecycle.clone(),
        startup_done: AtomicBool::new(false),
        shutting_down: AtomicBool::new(false),
        refusing: AtomicBool::new(false),
        in_flight: AtomicUsize::new(0),
        strict_readiness: opts.strict_readiness,
        max_body_bytes: opts.http_max_body_bytes,
    });

    let addr = SocketAddr::new(opts.http_address, opts.http_port);
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!("HTTP server listening on {local}");

    if let Some(port) = opts.metrics_port {
        let addr = SocketAddr::new(opts.http_address, port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr} for metrics: {e}"))?;
        tracing::info!("metrics listening on {}", listener.local_addr().map_err(|e| e.to_string())?);
        let app = Router::new().route("/metrics", get(move || async move { metrics.render() }));
        tokio::spawn(async move { axum::serve(listener, app).await });
    }

    let grpc = match opts.grpc_port {
        Some(port) => Some(start_grpc(state.clone(), SocketAddr::new(opts.grpc_address, port)).await?),
        None => None,
    };

    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let app = router(state.clone());
    let server = tokio::spawn(async move {
        axum::serve(listener, app).with_graceful_shutdown(async { http_stopped.await.unwrap_or(()) }).await
    });
    let background = tokio::spawn(start_and_poll(state.clone(), opts.clone()));

    shutdown_signal().await;
    state.shutting_down.store(true, Ordering::Release);
    // Not ready from now on, but still serving for the drain delay: load
    // balancers take a moment to notice, and what they send meanwhile
    // must not fail.
    if !opts.drain_delay.is_zero() {
        tracing::info!(
            seconds = opts.drain_delay.as_secs_f64(),
            "shutting down: not ready, still serving for the drain delay"
        );
        tokio::time::sleep(opts.drain_delay).await;
    }
    state.refusing.store(true, Ordering::Release);
    tracing::info!("shutting down: refusing new inference, finishing accepted requests");
    background.abort();
    let deadline = Instant::now() + opts.exit_timeout;
    while state.in_flight.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let unfinished = state.in_flight.load(Ordering::Acquire);
    if unfinished > 0 {
        // A backend call cannot be cancelled (a TorchScript loop, a hung
        // remote): waiting for it, or for the workers that run it, would hold
        // the process past the timeout the orchestrator was promised.
        tracing::warn!(unfinished, "exit timeout reached with requests still running; exiting without them");
        std::process::exit(1);
    }
    let _ = stop_http.send(());
    server.await.map_err(|e| e.to_string())?.map_err(|e| format!("HTTP server failed: {e}"))?;
    if let Some((stop_grpc, grpc_server)) = grpc {
        let _ = stop_grpc.send(());
        grpc_server.await.map_err(|e| e.to_string())?.map_err(|e| format!("gRPC server failed: {e}"))?;
    }
    tracing::info!("stopped");
    // The models are not dropped on the way out: dropping one joins its
    // workers, and a worker stuck in a backend call would hold the process.
    std::mem::forget(lifecycle);
    Ok(())
}

type GrpcServer = tokio::task::JoinHandle<Result<(), tonic::transport::Error>>;

/// Binds and starts the KServe v2 gRPC service, the standard gRPC health
/// service (`grpc.health.v1.Health`, SERVING while ready) and, in modelmesh
/// mode, ModelMesh's `mmesh.ModelRuntime`; returns the sender that stops
/// them and their task.
///
/// # Errors
/// A message when the address cannot be bound.
async fn start_grpc(
    state: Arc<AppState>,
    addr: SocketAddr,
) -> Result<(tokio::sync::oneshot::Sender<()>, GrpcServer), String> {
    use crate::config::proto::grpc_inference_service_server::GrpcInferenceServiceServer;
    use modelmesh::proto::model_runtime_server::ModelRuntimeServer;
    let listener =
        tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("cannot listen on {addr} for gRPC: {e}"))?;
    tracing::info!("gRPC server listening on {}", listener.local_addr().map_err(|e| e.to_string())?);
    let (health, health_service) = tonic_health::server::health_reporter();
    let service = GrpcInferenceServiceServer::new(grpc::Grpc { state: state.clone() })
        .max_decoding_message_size(state.max_body_bytes)
        .max_encoding_message_size(usize::MAX)
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Deflate)
        .send_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Deflate);
    let mesh = (state.lifecycle.mode() == ControlMode::ModelMesh)
        .then(|| ModelRuntimeServer::new(modelmesh::MeshRuntime { state: state.clone() }));
    tokio::spawn(async move {
        // The health service follows readiness, within 100 ms.
        let mut reported = None;
        loop {
            let status = if state.is_ready() { ServingStatus::Serving } else { ServingStatus::NotServing };
            if reported != Some(status) {
                health.set_service_status("", status).await;
                health.set_service_status("inference.GRPCInferenceService", status).await;
                reported = Some(status);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(service)
            .add_optional_service(mesh)
            // Without TCP_NODELAY small answers wait for the peer's delayed ACK (~40 ms).
            .serve_with_incoming_shutdown(TcpIncoming::from(listener).with_nodelay(Some(true)), async {
                stopped.await.unwrap_or(())
            }),
    );
    Ok((stop, server))
}

/// The start-up loads, then (poll mode) a look at the repositories every
/// poll interval.
async fn start_and_poll(state: Arc<AppState>, opts: ServeOptions) {
    if let Err(e) = state.lifecycle.start(&opts.load_models).await {
        tracing::error!("{e}");
    }
    state.startup_done.store(true, Ordering::Release);
    tracing::info!("start-up loading finished");
    if opts.control_mode == ControlMode::Poll {
        let mut ticks = tokio::time::interval(opts.repository_poll);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            state.lifecycle.poll().await;
        }
    }
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}

//! The HTTP server: KServe v2 routes on axum, started by [`serve`].

mod error;
mod routes;
mod v2_json;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use crate::backend::onnx::OnnxRuntime;
use crate::lifecycle;
use crate::model::Runtimes;
use crate::plugin::{PluginHost, PluginLimits};
use crate::registry::Registry;

pub use error::ApiError;

/// Everything `plinth serve` needs, from flags (see `cli`).
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The model repository folders to serve.
    pub model_repositories: Vec<PathBuf>,
    /// Address the HTTP server binds.
    pub http_address: std::net::IpAddr,
    /// 0 picks a free port (logged at start).
    pub http_port: u16,
    /// Largest request body accepted, in bytes (413 beyond).
    pub http_max_body_bytes: usize,
    /// Readiness also requires every model to be READY.
    pub strict_readiness: bool,
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
    /// Set once the models present at start have been tried.
    pub startup_done: AtomicBool,
    /// `--strict-readiness`: ready only when every model is READY.
    pub strict_readiness: bool,
}

/// The KServe v2 routes.
pub fn router(state: Arc<AppState>, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/v2/health/live", get(routes::live))
        .route("/v2/health/ready", get(routes::ready))
        .route("/v2", get(routes::server_metadata))
        .route("/v2/models/{model}", get(routes::model_metadata))
        .route("/v2/models/{model}/versions/{version}", get(routes::model_metadata))
        .route("/v2/models/{model}/ready", get(routes::model_ready))
        .route("/v2/models/{model}/versions/{version}/ready", get(routes::model_ready))
        .route("/v2/models/{model}/infer", post(routes::infer))
        .route("/v2/models/{model}/versions/{version}/infer", post(routes::infer))
        .route("/v2/models/{model}/predict", post(routes::predict))
        .route("/v2/models/{model}/versions/{version}/predict", post(routes::predict))
        .route("/v2/repository/index", post(routes::repository_index))
        .fallback(routes::unknown_route)
        .method_not_allowed_fallback(routes::wrong_method)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(state)
}

/// Starts the runtimes, binds HTTP (so liveness answers during loading),
/// loads every model of the repositories and serves until SIGINT/SIGTERM.
///
/// # Errors
/// A message when ONNX Runtime or wasmtime cannot start, the address cannot
/// be bound, or a repository cannot be read.
pub async fn serve(opts: ServeOptions) -> Result<(), String> {
    let onnx = OnnxRuntime::init(opts.ort_dylib_path.as_deref())?;
    let plugins = PluginHost::new(opts.plugin_limits, opts.plugin_cache_dir.clone())?;
    let runtimes = Runtimes { onnx, plugins };
    for repo in &opts.model_repositories {
        if !repo.is_dir() {
            return Err(format!("model repository {} is not a folder", repo.display()));
        }
    }

    let registry = Arc::new(Registry::default());
    let state = Arc::new(AppState { registry: registry.clone(), startup_done: AtomicBool::new(false), strict_readiness: opts.strict_readiness });
    let addr = SocketAddr::new(opts.http_address, opts.http_port);
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!("HTTP server listening on {local}");

    let loading = {
        let state = state.clone();
        let repos = opts.model_repositories.clone();
        tokio::task::spawn_blocking(move || {
            let result = lifecycle::load_all(&repos, &runtimes, &registry);
            state.startup_done.store(true, Ordering::Release);
            result.map(|()| runtimes)
        })
    };
    let app = router(state, opts.http_max_body_bytes);
    let server = axum::serve(listener, app).with_graceful_shutdown(shutdown_signal());
    let server = tokio::spawn(async move { server.await });
    // Keep the runtimes alive for as long as the server runs.
    let _runtimes = loading.await.map_err(|e| format!("model loading panicked: {e}"))??;
    tracing::info!("start-up loading finished");
    server.await.map_err(|e| e.to_string())?.map_err(|e| format!("HTTP server failed: {e}"))
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = ctrl_c => {},
        _ = term.recv() => {},
    }
    tracing::info!("shutting down");
}

//! The server: the KServe v2 front ends over one [`Service`] core (HTTP on
//! axum in [`http`] and `routes`, gRPC on tonic in `grpc`, ModelMesh's
//! runtime interface in `modelmesh`), OpenAI-compatible routes for the
//! models that opt in (`openai`), the metrics endpoint, and
//! [`serve`], which starts them, runs the start-up loads and polling, and
//! shuts down gracefully.

mod body;
pub mod body_timeout;
mod completions;
mod error;
mod faults;
mod generate;
mod generation;
mod grpc;
pub mod http;
mod listeners;
pub mod logging;
pub mod memory;
mod modelmesh;
pub mod openai;
pub mod restrictions;
mod routes;
pub mod service;
pub mod shared_memory;
mod shutdown;
pub mod status;
#[cfg(test)]
mod tests;
pub mod tls;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::lifecycle::{ControlMode, Lifecycle, LoadingOptions};

pub use error::ApiError;
pub use http::router;
pub use listeners::settings::{self as listener_settings, GrpcListener, HttpListener};
pub use service::{Service, Settings};

/// Everything `plinth serve` needs, from flags (see `cli`).
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// What loading the models needs: the part `plinth check` shares.
    pub loading: LoadingOptions,
    /// Poll mode: time between two looks at the repositories.
    pub repository_poll: Duration,
    /// Explicit and on-demand mode: the models to load at start (`*`: all).
    pub load_models: Vec<String>,
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
    /// `--http-max-inflight-body-bytes`: the request bodies read and
    /// decoded at once, in bytes (at least `http_max_body_bytes`).
    pub http_max_inflight_body_bytes: u64,
    /// What the HTTP listener allows its clients: timeouts, connections.
    pub http: HttpListener,
    /// What the metrics listener allows its clients (the HTTP timeouts,
    /// a connection limit of its own).
    pub metrics: HttpListener,
    /// What the gRPC listener allows its clients: handshake timeout,
    /// keepalive, connection age, connections.
    pub grpc: GrpcListener,
    /// Readiness also requires every model to be READY.
    pub strict_readiness: bool,
    /// How long accepted requests may take to finish after SIGTERM/SIGINT.
    pub exit_timeout: Duration,
    /// `--drain-delay-secs`: how long after SIGTERM/SIGINT the server, no
    /// longer ready, still takes new requests.
    pub drain_delay: Duration,
    /// `--http-restricted-api`: HTTP APIs that need a header.
    pub http_restrictions: restrictions::Restrictions,
    /// `--grpc-restricted-protocol`: gRPC APIs that need a header.
    pub grpc_restrictions: restrictions::Restrictions,
    /// `--allow-client-shm`: clients may register shared memory regions.
    pub allow_client_shm: bool,
    /// `--shm-max-input-bytes`: the most bytes one request's inputs may
    /// read from shared memory, in all.
    pub shm_max_input_bytes: u64,
    /// `--trace-config`: which requests are traced and where their spans go.
    pub trace: crate::trace::TraceConfig,
}

/// Starts the runtimes, binds HTTP (so liveness answers during loading),
/// metrics and gRPC, loads the models the control mode asks for, polls the
/// repositories in poll mode, and serves until SIGTERM/SIGINT. Then
/// readiness turns false and HTTP answers close their connections, new
/// inference gets 503 (after the drain delay), accepted requests finish,
/// the listeners close without resetting a connection they took, and it
/// returns; when some requests are still running after `exit_timeout`, the
/// process exits at once with status 1.
///
/// # Errors
/// A message when ONNX Runtime or wasmtime cannot start, a repository is
/// not a folder, modelmesh mode has no ONNX Runtime, or an address cannot
/// be bound.
pub async fn serve(opts: ServeOptions, logging: Arc<logging::Logging>) -> Result<(), String> {
    let lifecycle = Lifecycle::from_options(&opts.loading)?;
    let settings = Settings {
        strict_readiness: opts.strict_readiness,
        max_body_bytes: opts.http_max_body_bytes,
        max_inflight_body_bytes: opts.http_max_inflight_body_bytes,
        logging: Some(logging),
        http_restrictions: opts.http_restrictions.clone(),
        grpc_restrictions: opts.grpc_restrictions.clone(),
        allow_client_shm: opts.allow_client_shm,
        shm_max_input_bytes: opts.shm_max_input_bytes,
        tracing: Some(Arc::new(crate::trace::Tracing::new(&opts.trace)?)),
    };
    let service = Arc::new(Service::new(Arc::new(lifecycle), settings));
    let listeners = listeners::Listeners::bind(&opts, &service).await?;
    tokio::spawn(status::sample_forever(service.clone()));
    let background = tokio::spawn(start_and_poll(service.clone(), opts.clone()));
    shutdown::signalled().await;
    shutdown::stop_taking(&service, opts.drain_delay).await;
    background.abort();
    let deadline = tokio::time::Instant::now() + opts.exit_timeout;
    shutdown::finish_accepted(&service, deadline).await;
    listeners.stop(deadline).await?;
    if let Some(tracing) = service.tracing.clone() {
        // The last spans go out before the process does.
        let _ = tokio::task::spawn_blocking(move || tracing.flush()).await;
    }
    service.lifecycle.remove_temporary_mirrors();
    tracing::info!("stopped");
    // The models are not dropped on the way out: dropping one joins its
    // workers, and a worker stuck in a backend call would hold the process.
    std::mem::forget(service);
    Ok(())
}

/// The first wait before a start-up that could not list a repository in
/// object storage is tried again; it doubles up to [`START_RETRY_LAST`].
const START_RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between two start-up tries.
const START_RETRY_LAST: Duration = Duration::from_secs(60);

/// The start-up loads, then (poll mode) a look at the repositories every
/// poll interval.
async fn start_and_poll(service: Arc<Service>, opts: ServeOptions) {
    let mut delay = START_RETRY_FIRST;
    while let Err(e) = service.lifecycle.start(&opts.load_models).await {
        // A store that cannot be listed (down, refusing the credentials)
        // may come back: the server stays unready and tries again.
        if !e.transient {
            tracing::error!("{e}");
            break;
        }
        tracing::error!("{e}; trying again in {} s", delay.as_secs());
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(START_RETRY_LAST);
    }
    service.startup_done.store(true, Ordering::Release);
    tracing::info!("start-up loading finished");
    if opts.loading.control_mode == ControlMode::Poll {
        let mut ticks = tokio::time::interval(opts.repository_poll);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            service.lifecycle.poll().await;
        }
    }
}

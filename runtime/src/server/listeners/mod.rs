//! The three listeners: HTTP (the KServe v2 routes), Prometheus metrics,
//! and gRPC (the KServe v2 service, gRPC health and, in modelmesh mode,
//! ModelMesh's runtime interface), each with its own connection limit and
//! held to its timeouts for slow clients ([`settings`]).
//!
//! HTTP and gRPC accept through an [`Acceptor`], so that shutdown never
//! resets a connection it took: closing a listening socket resets every
//! connection still in the kernel's accept queue, and a server that stops a
//! connection before reading it resets a request already sent. At
//! shutdown each listener first stops answering handshakes, accepts what
//! the kernel already took and only then closes; the servers stop their
//! connections once every connection accepted has sent its first bytes
//! ([`connection`] counts them).

mod acceptor;
mod activity;
mod connection;
mod opening;
mod report;
mod serve;
pub mod settings;
mod transport;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tonic_health::ServingStatus;
use tower_http::catch_panic::CatchPanicLayer;

use self::acceptor::{Acceptor, Controls, Kind, Limit};
use self::connection::Conn;
use self::opening::Opening;
use self::report::Reporting;
use self::serve::HttpServer;
use self::settings::{GrpcListener, HttpListener};
use super::{ServeOptions, Service, grpc, modelmesh};
use crate::drain::InUse;
use crate::lifecycle::ControlMode;
use crate::metrics::{Listener, Metrics};
use crate::server::tls::{Alpn, Tls, TlsFiles};

/// How often the gRPC health service checks readiness.
const HEALTH_INTERVAL: Duration = Duration::from_millis(100);

/// How long shutdown waits for the connections accepted last to send their
/// first bytes before it stops the servers: a connection stopped before it
/// was read is reset under the request its client already sent. A client
/// sends at once; this only bounds the wait for one that never does.
const FIRST_BYTES_GRACE: Duration = Duration::from_secs(1);

type Serving<E> = tokio::task::JoinHandle<Result<(), E>>;

/// A server task, its acceptor's controls, and the sender that stops its
/// connections gracefully.
struct Running<E> {
    /// Set to true: the acceptor stops taking connections and closes its socket.
    close: watch::Sender<bool>,
    /// Answers once the listening socket is closed.
    closed: oneshot::Receiver<()>,
    /// The acceptor's count of connections not yet read from.
    fresh: InUse,
    /// Starts the graceful shutdown of the server's connections.
    stop: oneshot::Sender<()>,
    task: Serving<E>,
}

impl<E> Running<E> {
    /// The server `task` behind the acceptor of `controls`, which `stop`
    /// stops gracefully.
    fn new(controls: Controls, stop: oneshot::Sender<()>, task: Serving<E>) -> Running<E> {
        Running { close: controls.close, closed: controls.closed, fresh: controls.fresh, stop, task }
    }

    /// Closes the listener as [`Acceptor`] does, and waits until it is
    /// closed and its connections accepted last have sent their first
    /// bytes (at most [`FIRST_BYTES_GRACE`]).
    async fn stop_accepting(&mut self) {
        let _ = self.close.send(true);
        let _ = (&mut self.closed).await;
        if let Err(waiting) = self.fresh.none_by(Instant::now() + FIRST_BYTES_GRACE).await {
            tracing::debug!(waiting, "connections that sent nothing are closed");
        }
    }

    /// Stops the connections gracefully and waits for them until `deadline`.
    async fn finish(self, deadline: Instant, what: &str) -> Result<(), String>
    where
        E: std::fmt::Display,
    {
        let _ = self.stop.send(());
        match tokio::time::timeout_at(deadline, self.task).await {
            Ok(done) => done.map_err(|e| e.to_string())?.map_err(|e| format!("{what} server failed: {e}")),
            Err(_) => {
                tracing::warn!("exit timeout reached with {what} connections still open; exiting without them");
                Ok(())
            }
        }
    }
}

/// The bound listeners, serving.
pub(super) struct Listeners {
    http: Running<io::Error>,
    grpc: Option<Running<tonic::transport::Error>>,
    /// Serves until the process exits; held so that it is never told to stop.
    _metrics: Option<Running<io::Error>>,
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
        let metrics = match opts.metrics_port {
            Some(port) => Some(serve_metrics(SocketAddr::new(opts.http_address, port), service, opts).await?),
            None => None,
        };
        let grpc = match opts.grpc_port {
            Some(port) => Some(serve_grpc(service, SocketAddr::new(opts.grpc_address, port), &opts.grpc).await?),
            None => None,
        };
        let server = http_server(super::router(service.clone()), &opts.http, Listener::Http, service)?;
        let http = serve_http(listener, server, "--http-max-connections")?;
        Ok(Listeners { http, grpc, _metrics: metrics })
    }

    /// Closes the HTTP and gRPC listeners without resetting a connection
    /// they took, then stops their connections gracefully (requests being
    /// answered finish) and waits for them until `deadline`.
    ///
    /// # Errors
    /// A message when a server failed.
    pub(super) async fn stop(mut self, deadline: Instant) -> Result<(), String> {
        let grpc_closing = async {
            if let Some(grpc) = &mut self.grpc {
                grpc.stop_accepting().await;
            }
        };
        tokio::join!(self.http.stop_accepting(), grpc_closing);
        let grpc_finishing = async {
            match self.grpc {
                Some(grpc) => grpc.finish(deadline, "gRPC").await,
                None => Ok(()),
            }
        };
        let (http, grpc) = tokio::join!(self.http.finish(deadline, "HTTP"), grpc_finishing);
        http.and(grpc)
    }
}

async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener, String> {
    TcpListener::bind(addr).await.map_err(|e| format!("cannot listen on {addr} for {what}: {e}"))
}

fn local_addr(listener: &TcpListener) -> Result<SocketAddr, String> {
    listener.local_addr().map_err(|e| e.to_string())
}

/// The server of an HTTP listener: `app` behind the limits of `settings`,
/// reporting as `listener`, over TLS when the settings name its files.
///
/// # Errors
/// A message naming a TLS file that cannot be read or used.
fn http_server(
    app: Router,
    settings: &HttpListener,
    listener: Listener,
    service: &Service,
) -> Result<HttpServer, String> {
    let metrics = service.lifecycle.metrics();
    let tls = start_tls(settings.tls.as_ref(), Alpn::Http, listener, metrics)?;
    let reporting = reporting(
        listener,
        metrics,
        tls.is_some(),
        "--http-header-read-timeout",
        (settings.write_timeout, "--http-write-timeout"),
        (settings.idle_timeout, "--http-idle-timeout"),
    );
    Ok(HttpServer { app, settings: Arc::new(settings.clone()), reporting, tls })
}

/// The TLS of `listener` from `files`, if any, logged.
///
/// # Errors
/// As [`Tls::start`].
fn start_tls(
    files: Option<&TlsFiles>,
    alpn: Alpn,
    listener: Listener,
    metrics: &Arc<Metrics>,
) -> Result<Option<Tls>, String> {
    let Some(files) = files else { return Ok(None) };
    let tls = Tls::start(files, alpn, listener, metrics).map_err(|e| format!("{} TLS: {e}", listener.label()))?;
    let clients = if files.client_roots.is_some() { "; clients must present a certificate" } else { "" };
    tracing::info!(listener = listener.label(), "TLS with {}{clients}", files.cert.display());
    Ok(Some(tls))
}

/// Where the connections of `listener` report: their opening held to
/// `opening_flag`, their writes and idle time to `write` and `idle` (each
/// with the flag that sets it).
fn reporting(
    listener: Listener,
    metrics: &Arc<Metrics>,
    tls: bool,
    opening_flag: &'static str,
    write: (Duration, &'static str),
    idle: (Duration, &'static str),
) -> Reporting {
    metrics.connections.start(listener, tls);
    Reporting { listener, metrics: metrics.clone(), opening_flag, write_timeout: write, idle_timeout: idle }
}

/// Serves `server` on `listener`, at most its settings' connections at
/// once (`flag` sets them).
fn serve_http(listener: TcpListener, server: HttpServer, flag: &'static str) -> Result<Running<io::Error>, String> {
    let limit = Limit {
        max: server.settings.max_connections,
        flag,
        listener: server.reporting.listener,
        metrics: server.reporting.metrics.clone(),
    };
    let kind = if server.tls.is_some() { Kind::Https } else { Kind::Http };
    let (acceptor, controls) = Acceptor::new(listener, kind, limit)?;
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(server.serve(acceptor, stopped));
    Ok(Running::new(controls, stop, task))
}

/// `GET /metrics` on its own port, with its own connection limit, until
/// the process exits.
async fn serve_metrics(addr: SocketAddr, service: &Service, opts: &ServeOptions) -> Result<Running<io::Error>, String> {
    let listener = bind(addr, "metrics").await?;
    tracing::info!("metrics listening on {}", local_addr(&listener)?);
    let metrics = service.lifecycle.metrics().clone();
    let app = Router::new().route("/metrics", get(move || async move { metrics.render() }));
    serve_http(listener, http_server(app, &opts.metrics, Listener::Metrics, service)?, "--metrics-max-connections")
}

/// The KServe v2 gRPC service, the standard gRPC health service
/// (`grpc.health.v1.Health`, SERVING while ready) and, in modelmesh mode,
/// ModelMesh's `mmesh.ModelRuntime`.
async fn serve_grpc(
    service: &Arc<Service>,
    addr: SocketAddr,
    settings: &GrpcListener,
) -> Result<Running<tonic::transport::Error>, String> {
    use modelmesh::proto::model_runtime_server::ModelRuntimeServer;
    let listener = bind(addr, "gRPC").await?;
    tracing::info!("gRPC server listening on {}", local_addr(&listener)?);
    let mesh = (service.lifecycle.mode() == ControlMode::ModelMesh)
        .then(|| ModelRuntimeServer::new(modelmesh::MeshRuntime { service: service.clone() }));
    let (health, health_service) = tonic_health::server::health_reporter();
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
    let metrics = service.lifecycle.metrics();
    let tls = start_tls(settings.tls.as_ref(), Alpn::Grpc, Listener::Grpc, metrics)?;
    let reporting = reporting(
        Listener::Grpc,
        metrics,
        tls.is_some(),
        "--grpc-handshake-timeout",
        (settings.write_timeout, "--grpc-write-timeout"),
        (settings.idle_timeout, "--grpc-idle-timeout"),
    );
    let limit = Limit {
        max: settings.max_connections,
        flag: "--grpc-max-connections",
        listener: Listener::Grpc,
        metrics: metrics.clone(),
    };
    let (mut acceptor, controls) = Acceptor::new(listener, Kind::Grpc, limit)?;
    // tonic takes a stream of connections; it ends them all once the stream
    // ends, so the stream never does: shutdown goes through `stop`.
    let (connections, incoming) = mpsc::channel::<io::Result<Conn>>(1);
    let handshake = settings.handshake_timeout;
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                (accepted, _) = acceptor.next() => accepted,
                () = connections.closed() => return,
            };
            // Each connection's handshake on its own, so a slow one holds up no other.
            let (connections, tls, reporting) = (connections.clone(), tls.clone(), reporting.clone());
            tokio::spawn(async move {
                let deadline = accepted.at + handshake;
                let Some(accepted) = transport::secure(accepted, tls.as_ref(), deadline, &reporting).await else {
                    return;
                };
                let conn = Conn::new(accepted, Opening::new(deadline, handshake), reporting, false);
                let _ = connections.send(Ok(conn)).await;
            });
        }
    });
    let (stop, stopped) = oneshot::channel::<()>();
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(settings.keepalive_time))
        .http2_keepalive_timeout(Some(settings.keepalive_timeout));
    if let Some(age) = settings.max_connection_age {
        builder = builder.max_connection_age(age);
    }
    if let Some(grace) = settings.max_connection_age_grace {
        builder = builder.max_connection_age_grace(grace);
    }
    let task = tokio::spawn(
        builder
            // grpc.health.v1 belongs to the `health` group of --grpc-restricted-protocol.
            .layer(grpc::Restricted::layer(service.grpc_restrictions.clone()))
            .layer(grpc::MessageLimit::layer())
            // Each call keeps its connection from closing as idle.
            .layer(activity::TrackLayer)
            // A panic fails its call alone, INTERNAL with what panicked.
            .layer(CatchPanicLayer::custom(|panic: Box<dyn std::any::Any + Send>| {
                tonic::Status::from(super::error::panicked(&*panic)).into_http::<tonic::body::Body>()
            }))
            .add_service(health_service)
            .add_service(grpc::inference(service))
            .add_optional_service(mesh)
            .serve_with_incoming_shutdown(tokio_stream::wrappers::ReceiverStream::new(incoming), async {
                stopped.await.unwrap_or(())
            }),
    );
    Ok(Running::new(controls, stop, task))
}

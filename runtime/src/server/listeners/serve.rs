//! Serving the connections of the HTTP and the metrics listener with
//! hyper, as `axum::serve` would, plus the limits it has no setting for:
//! each HTTP/1 request head must arrive within the header read timeout
//! (which also closes a keep-alive connection left idle that long), each
//! request body must keep arriving, HTTP/2 connections are pinged, and
//! HTTPS connections are handshaken first.
//! At shutdown every connection is stopped gracefully: a request being
//! answered finishes, an idle connection closes.

use std::convert::Infallible;
use std::io;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::sync::{oneshot, watch};
use tower::Service as _;

use super::acceptor::{Accepted, Acceptor};
use super::activity::Tracked;
use super::connection::Conn;
use super::opening::Opening;
use super::report::Reporting;
use super::settings::{HTTP2_PING_TIMEOUT, HttpListener};
use super::transport;
use crate::drain::{Hold, InUse};
use crate::metrics::SlowClient;
use crate::server::body_timeout::{IdleTimeout, Pace};
use crate::server::tls::Tls;

/// One HTTP listener's server: its routes, its limits, where it reports.
#[derive(Clone)]
pub(super) struct HttpServer {
    pub app: Router,
    /// The limits its clients are held to.
    pub settings: Arc<HttpListener>,
    /// Its name and metrics.
    pub reporting: Reporting,
    /// Its TLS, when it speaks HTTPS.
    pub tls: Option<Tls>,
}

impl HttpServer {
    /// Serves the connections `acceptor` takes until `stop` answers, then
    /// stops each gracefully and returns once all are closed.
    pub(super) async fn serve(self, mut acceptor: Acceptor, stop: oneshot::Receiver<()>) -> io::Result<()> {
        let (stopping, stop_rx) = watch::channel(false);
        let connections = InUse::default();
        let mut stop = std::pin::pin!(stop);
        loop {
            let accepted = tokio::select! {
                (accepted, _) = acceptor.next() => accepted,
                _ = &mut stop => break,
            };
            tokio::spawn(self.clone().serve_connection(accepted, stop_rx.clone(), connections.hold()));
        }
        let _ = stopping.send(true);
        drop(acceptor);
        connections.none().await;
        Ok(())
    }

    /// Serves one connection until it closes, or gracefully from `stop` on.
    async fn serve_connection(self, accepted: Accepted, mut stop: watch::Receiver<bool>, _serving: Hold) {
        let settings = &self.settings;
        let deadline = accepted.at + settings.header_read_timeout;
        let Some(accepted) = transport::secure(accepted, self.tls.as_ref(), deadline, &self.reporting).await else {
            return;
        };
        let opening = Opening::new(deadline, settings.header_read_timeout);
        let conn = Conn::new(accepted, opening, self.reporting.clone(), true);
        let activity = conn.activity();
        let pace = Pace { pause: settings.body_read_timeout, min_rate: settings.body_min_rate };
        let app = self.app.clone();
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            // Busy from now until the answer's body is taken whole.
            let busy = activity.begin();
            let request = request.map(|body| Body::new(IdleTimeout::new(body, pace)));
            let mut app = app.clone();
            async move {
                let answer = app.call(request).await.unwrap_or_else(|never| match never {});
                Ok::<_, Infallible>(answer.map(|body| Body::new(Tracked::new(body, Some(busy)))))
            }
        });
        let builder = self.builder();
        let connection = builder.serve_connection(TokioIo::new(conn), service);
        let mut connection = std::pin::pin!(connection);
        let mut stopping = false;
        loop {
            tokio::select! {
                served = connection.as_mut() => {
                    if let Err(e) = served {
                        self.report(e.as_ref());
                    }
                    return;
                }
                _ = stop.wait_for(|stop| *stop), if !stopping => {
                    stopping = true;
                    connection.as_mut().graceful_shutdown();
                }
            }
        }
    }

    /// hyper's connection builder with this listener's limits.
    fn builder(&self) -> auto::Builder<TokioExecutor> {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder.http1().timer(TokioTimer::new()).header_read_timeout(self.settings.header_read_timeout);
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(self.settings.header_read_timeout)
            .keep_alive_timeout(HTTP2_PING_TIMEOUT);
        builder
    }

    /// Counts and logs a connection closed because its client did not
    /// send a request head in time; other errors are the client's and
    /// logged at debug level.
    fn report(&self, error: &(dyn std::error::Error + 'static)) {
        let listener = self.reporting.listener.label();
        if error.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_timeout) {
            self.reporting.metrics.connections.slow_client(self.reporting.listener, SlowClient::Header);
            tracing::debug!(
                listener,
                "closed a connection whose request head did not arrive within {} s (--http-header-read-timeout)",
                self.settings.header_read_timeout.as_secs_f64()
            );
        } else {
            tracing::debug!(listener, "connection ended: {error}");
        }
    }
}

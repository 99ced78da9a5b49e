//! Plinth's connection families, per listener (`http`, `grpc`, `metrics`):
//! the connections open now, those refused at accept because the listener
//! held its `--*-max-connections`, and those the server closed because a
//! client was too slow (a handshake, a request head or a body that did not
//! arrive in time).

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

use super::register;

/// A listening socket of the server, as its series' `listener` label names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    /// The KServe v2 HTTP port (`--http-port`).
    Http,
    /// The gRPC port (`--grpc-port`).
    Grpc,
    /// The Prometheus port (`--metrics-port`).
    Metrics,
}

impl Listener {
    /// The label value: `http`, `grpc` or `metrics`.
    pub fn label(self) -> &'static str {
        match self {
            Listener::Http => "http",
            Listener::Grpc => "grpc",
            Listener::Metrics => "metrics",
        }
    }
}

/// Why the server closed a connection its client had not finished with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlowClient {
    /// The TLS handshake or the HTTP/2 connection preface did not arrive
    /// within the listener's handshake timeout.
    Handshake,
    /// An HTTP/1 request head (or, on a keep-alive connection, the next
    /// one) did not arrive within `--http-header-read-timeout`.
    Header,
    /// A request body stopped arriving for `--http-body-read-timeout`, or
    /// arrived slower than `--http-body-min-rate`.
    Body,
    /// The client read nothing of an answer for the listener's write
    /// timeout.
    Write,
    /// The connection served no request for the listener's idle timeout.
    Idle,
}

impl SlowClient {
    /// Every reason, in the order of the series.
    pub const ALL: [SlowClient; 5] =
        [SlowClient::Handshake, SlowClient::Header, SlowClient::Body, SlowClient::Write, SlowClient::Idle];

    /// The `reason` label value.
    pub fn label(self) -> &'static str {
        match self {
            SlowClient::Handshake => "handshake_timeout",
            SlowClient::Header => "header_timeout",
            SlowClient::Body => "body_timeout",
            SlowClient::Write => "write_timeout",
            SlowClient::Idle => "idle_timeout",
        }
    }
}

/// The connection families, recorded by the listeners.
pub struct ConnectionMetrics {
    open: IntGaugeVec,
    refused: IntCounterVec,
    slow: IntCounterVec,
    tls_failed: IntCounterVec,
    tls_loads: IntCounterVec,
}

impl ConnectionMetrics {
    /// Creates the families and registers them with `registry`.
    pub(super) fn register(registry: &Registry) -> ConnectionMetrics {
        let open = IntGaugeVec::new(
            Opts::new("plinth_connections_open", "Connections each listener holds open now"),
            &["listener"],
        )
        .expect("valid metric");
        let refused = IntCounterVec::new(
            Opts::new(
                "plinth_connections_refused_total",
                "Connections closed at accept because the listener held its maximum (--http-max-connections, \
                 --grpc-max-connections, --metrics-max-connections)",
            ),
            &["listener"],
        )
        .expect("valid metric");
        let slow = IntCounterVec::new(
            Opts::new(
                "plinth_connections_slow_client_total",
                "Connections or requests ended because the client did not send in time, by reason \
                 (handshake_timeout, header_timeout, body_timeout, write_timeout, idle_timeout)",
            ),
            &["listener", "reason"],
        )
        .expect("valid metric");
        let tls_failed = IntCounterVec::new(
            Opts::new(
                "plinth_tls_handshake_failures_total",
                "TLS handshakes that failed (no or an untrusted client certificate, no common protocol version \
                 or cipher, not TLS at all)",
            ),
            &["listener"],
        )
        .expect("valid metric");
        let tls_loads = IntCounterVec::new(
            Opts::new(
                "plinth_tls_certificate_loads_total",
                "Loads of a listener's TLS certificate, key and client roots, at start and whenever their files \
                 change, by result (ok; failed: the files in use stay)",
            ),
            &["listener", "result"],
        )
        .expect("valid metric");
        ConnectionMetrics {
            tls_loads: register(registry, tls_loads),
            open: register(registry, open),
            refused: register(registry, refused),
            slow: register(registry, slow),
            tls_failed: register(registry, tls_failed),
        }
    }

    /// One more connection open on `listener`, until the guard is dropped.
    pub fn opened(&self, listener: Listener) -> OpenConnection {
        let gauge = self.open.with_label_values(&[listener.label()]);
        gauge.inc();
        OpenConnection(gauge)
    }

    /// A connection closed at accept: `listener` held its maximum.
    pub fn refused(&self, listener: Listener) {
        self.refused.with_label_values(&[listener.label()]).inc();
    }

    /// A connection or request of `listener` ended for a slow client.
    pub fn slow_client(&self, listener: Listener, reason: SlowClient) {
        self.slow.with_label_values(&[listener.label(), reason.label()]).inc();
    }

    /// A TLS handshake on `listener` failed.
    pub fn tls_failed(&self, listener: Listener) {
        self.tls_failed.with_label_values(&[listener.label()]).inc();
    }

    /// A load of `listener`'s TLS files succeeded (`ok`) or failed.
    pub fn tls_reloaded(&self, listener: Listener, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.tls_loads.with_label_values(&[listener.label(), result]).inc();
    }

    /// Makes every series of `listener` exist (at zero), so a scrape shows
    /// the families before anything happened.
    pub fn start(&self, listener: Listener, tls: bool) {
        let _ = self.open.with_label_values(&[listener.label()]);
        let _ = self.refused.with_label_values(&[listener.label()]);
        for reason in SlowClient::ALL {
            let _ = self.slow.with_label_values(&[listener.label(), reason.label()]);
        }
        if tls {
            let _ = self.tls_failed.with_label_values(&[listener.label()]);
            for result in ["ok", "failed"] {
                let _ = self.tls_loads.with_label_values(&[listener.label(), result]);
            }
        }
    }
}

/// A connection counted in `plinth_connections_open` until dropped.
pub struct OpenConnection(prometheus::IntGauge);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

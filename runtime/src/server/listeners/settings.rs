//! What each listener allows its clients: how long a client may take to
//! open a connection and to send a request head or body, how many
//! connections the listener holds at once, HTTP/2 keepalive, and TLS.

use std::time::Duration;

use crate::server::tls::TlsFiles;

/// `--http-header-read-timeout`'s default, in seconds: nginx's
/// `client_header_timeout` is 60 s, hyper's `header_read_timeout` 30 s.
pub const DEFAULT_HEADER_READ_TIMEOUT_SECS: f64 = 30.0;

/// `--http-body-read-timeout`'s default, in seconds (nginx's
/// `client_body_timeout` is 60 s).
pub const DEFAULT_BODY_READ_TIMEOUT_SECS: f64 = 30.0;

/// `--http-body-min-rate`'s default, in bytes per second: a body slower
/// than this on average, once it has been arriving for
/// `--http-body-read-timeout`, is refused (a byte now and then, each pause
/// shorter than the read timeout, would hold a request for ever).
pub const DEFAULT_BODY_MIN_RATE: u64 = 1024;

/// `--http-write-timeout`'s and `--grpc-write-timeout`'s default, in
/// seconds: how long a client may read nothing of an answer.
pub const DEFAULT_WRITE_TIMEOUT_SECS: f64 = 30.0;

/// `--http-idle-timeout`'s and `--grpc-idle-timeout`'s default, in
/// seconds: how long a connection may serve no request (gRPC's
/// `MAX_CONNECTION_IDLE`; HTTP/1 keep-alive connections close sooner, at
/// `--http-header-read-timeout`).
pub const DEFAULT_IDLE_TIMEOUT_SECS: f64 = 300.0;

/// How long an HTTP/2 connection of the HTTP port has to answer the
/// server's ping before it is closed.
pub const HTTP2_PING_TIMEOUT: Duration = Duration::from_secs(20);

/// File descriptors kept for the server's own use (model and plugin files,
/// shared memory objects, logs, the runtimes' threads) when the default
/// connection limits are worked out from the open-file limit.
const RESERVED_FILES: u64 = 256;

/// The metrics port's default connection limit, at most: Prometheus keeps
/// one connection per target.
const METRICS_CONNECTIONS: u64 = 64;

/// What the HTTP listener, or the metrics listener, allows its clients.
#[derive(Clone, Debug)]
pub struct HttpListener {
    /// How long a new connection may take to open (its TLS handshake, or
    /// an HTTP/2 client's connection preface) and each HTTP/1 request head
    /// to arrive, counted from the connection's accept or the previous
    /// answer: so also how long an idle keep-alive connection is kept.
    /// HTTP/2 connections are pinged this often and closed when a ping
    /// goes unanswered for [`HTTP2_PING_TIMEOUT`].
    pub header_read_timeout: Duration,
    /// The longest pause within a request body (408 beyond).
    pub body_read_timeout: Duration,
    /// The slowest a request body may arrive on average, in bytes per
    /// second, once it has been arriving for `body_read_timeout` (408
    /// below).
    pub body_min_rate: u64,
    /// How long a client may read nothing of an answer before its
    /// connection is closed and the answer dropped.
    pub write_timeout: Duration,
    /// How long a connection may serve no request before it is closed
    /// (HTTP/2 connections that only answer pings).
    pub idle_timeout: Duration,
    /// Connections open at once; more are closed at accept.
    pub max_connections: usize,
    /// The certificate, key and (mutual TLS) client roots, when the
    /// listener speaks HTTPS.
    pub tls: Option<TlsFiles>,
}

/// What the gRPC listener allows its clients.
#[derive(Clone, Debug)]
pub struct GrpcListener {
    /// How long a new connection may take to open: its TLS handshake and
    /// the HTTP/2 connection preface with the client's first SETTINGS.
    pub handshake_timeout: Duration,
    /// `--grpc-keepalive-time`: how long a connection may go without a
    /// frame from its client before the server pings it (Triton's flag).
    pub keepalive_time: Duration,
    /// `--grpc-keepalive-timeout`: how long the server waits for a ping's
    /// answer before it closes the connection (Triton's flag).
    pub keepalive_timeout: Duration,
    /// `--grpc-max-connection-age`: a connection is asked to go away
    /// (GOAWAY) this long after it opened (Triton's flag).
    pub max_connection_age: Option<Duration>,
    /// `--grpc-max-connection-age-grace`: how long calls still running on
    /// such a connection may take before it is closed (Triton's flag).
    pub max_connection_age_grace: Option<Duration>,
    /// Connections open at once; more are closed at accept.
    pub max_connections: usize,
    /// How long a client may read nothing of an answer before its
    /// connection is closed and the answer dropped.
    pub write_timeout: Duration,
    /// How long a connection may serve no call (one that only answers
    /// pings) before it is closed.
    pub idle_timeout: Duration,
    /// The certificate, key and (mutual TLS) client roots, when the
    /// listener speaks TLS (Triton's `--grpc-use-ssl`).
    pub tls: Option<TlsFiles>,
}

/// The default connection limits of the HTTP, gRPC and metrics listeners,
/// worked out from the process's open-file limit so that the listeners
/// together never run the process out of descriptors (then `accept`
/// fails, and every port, readiness included, stops answering): after
/// [`RESERVED_FILES`], half for HTTP, three eighths for gRPC, and for
/// metrics the rest up to [`METRICS_CONNECTIONS`].
pub fn default_max_connections() -> ConnectionBudget {
    let files = open_file_limit().unwrap_or(1024);
    let budget = files.saturating_sub(RESERVED_FILES).max(16);
    let share = |n: u64, d: u64| usize::try_from(budget * n / d).unwrap_or(usize::MAX).max(1);
    ConnectionBudget {
        http: share(1, 2),
        grpc: share(3, 8),
        metrics: usize::try_from((budget / 8).clamp(1, METRICS_CONNECTIONS)).unwrap_or(1),
    }
}

/// The connection limit of each listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionBudget {
    /// The HTTP listener's.
    pub http: usize,
    /// The gRPC listener's.
    pub grpc: usize,
    /// The metrics listener's.
    pub metrics: usize,
}

/// The soft limit on open files (`RLIMIT_NOFILE`), if it can be read.
fn open_file_limit() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into `limit`, which outlives the call.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    (rc == 0 && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_limits_stay_within_the_open_file_limit() {
        let budget = default_max_connections();
        let files = open_file_limit().unwrap_or(1024);
        let total = (budget.http + budget.grpc + budget.metrics) as u64;
        assert!(total + RESERVED_FILES <= files.max(RESERVED_FILES + 16 + 3), "{budget:?} within {files}");
        assert!(budget.http >= budget.grpc && budget.metrics <= METRICS_CONNECTIONS as usize, "{budget:?}");
    }
}

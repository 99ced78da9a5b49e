//! Flags of `plinth serve`: the listeners, TLS, timeouts, residency and
//! everything else that only a serving process needs.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::*;

/// Flags of `plinth serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The repositories, runtimes and limits (shared with `plinth check`).
    #[command(flatten)]
    pub loading: LoadArgs,

    /// How the loaded models change after start.
    #[arg(long, value_enum, default_value_t = ControlMode::None)]
    pub model_control_mode: ControlMode,

    /// Poll mode: seconds between two looks at the repositories. A changed
    /// folder is loaded once its files stayed the same for this long.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..))]
    pub repository_poll_secs: u64,

    /// Explicit and on-demand mode: a model to load at start (repeat; `*`
    /// loads all). In on-demand mode these stay resident (pinned).
    #[arg(long = "load-model", value_name = "NAME")]
    pub load_models: Vec<String>,

    /// On-demand and modelmesh mode: host memory for all resident models,
    /// e.g. 2GiB (modelmesh default: three quarters of the memory limit).
    #[arg(long, value_parser = parse_bytes)]
    pub model_memory_budget: Option<usize>,

    /// On-demand mode: at most this many resident models.
    #[arg(long)]
    pub max_loaded_models: Option<usize>,

    /// On-demand mode: seconds a request waits for its model to load
    /// before it gets 503 (the load goes on). Modelmesh mode: the load
    /// timeout reported to ModelMesh.
    #[arg(long, default_value_t = DEFAULT_LOAD_TIMEOUT_SECS)]
    pub model_load_timeout_secs: u64,

    /// Port of the KServe v2 gRPC service and the gRPC health service (0
    /// picks a free port).
    #[arg(long, default_value_t = 8001)]
    pub grpc_port: u16,

    /// Serve gRPC at all.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub allow_grpc: bool,

    /// Port of the Prometheus metrics (`GET /metrics`; 0 picks a free port).
    #[arg(long, default_value_t = 8002)]
    pub metrics_port: u16,

    /// Serve metrics at all.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub allow_metrics: bool,

    /// Seconds accepted requests may take to finish after SIGTERM/SIGINT.
    #[arg(long, default_value_t = 30)]
    pub exit_timeout_secs: u64,

    /// Seconds the server, no longer ready after SIGTERM/SIGINT, still
    /// accepts new requests, while load balancers stop sending them
    /// (a rolling update's overlap; 0: refuse at once).
    #[arg(long, default_value_t = 0.0)]
    pub drain_delay_secs: f64,

    /// Address the HTTP and metrics servers bind.
    #[arg(long, default_value = "0.0.0.0")]
    pub http_address: std::net::IpAddr,

    /// Address the gRPC server binds (default: --http-address). In a
    /// ModelMesh pod, 127.0.0.1: only the pod's own containers call it.
    #[arg(long)]
    pub grpc_address: Option<std::net::IpAddr>,

    /// HTTP port (0 picks a free one; the log says which).
    #[arg(long, default_value_t = 8000)]
    pub http_port: u16,

    /// Largest request body accepted, e.g. 64MiB (413 beyond).
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    pub http_max_body_bytes: usize,

    /// Request bodies read and decoded at once, in all (at least
    /// --http-max-body-bytes); an inference request that does not fit
    /// waits for room, then gets 503 with Retry-After.
    #[arg(long, default_value = "256MiB", value_parser = parse_bytes)]
    pub http_max_inflight_body_bytes: usize,

    /// Seconds a new HTTP or metrics connection may take to open (TLS
    /// handshake, HTTP/2 preface) and each request head to arrive; an idle
    /// keep-alive connection is closed after as long (HTTP/2: pinged).
    #[arg(long, value_name = "SECONDS", default_value_t = crate::server::listener_settings::DEFAULT_HEADER_READ_TIMEOUT_SECS)]
    pub http_header_read_timeout: f64,

    /// Seconds a request body may pause between two pieces (408 beyond).
    #[arg(long, value_name = "SECONDS", default_value_t = crate::server::listener_settings::DEFAULT_BODY_READ_TIMEOUT_SECS)]
    pub http_body_read_timeout: f64,

    /// Bytes a second a request body must average once it has been
    /// arriving for --http-body-read-timeout (408 below; 0: no minimum).
    #[arg(long, value_name = "BYTES_PER_SEC", default_value_t = crate::server::listener_settings::DEFAULT_BODY_MIN_RATE)]
    pub http_body_min_rate: u64,

    /// Seconds an HTTP or metrics client may read nothing of an answer
    /// before its connection is closed and the answer dropped.
    #[arg(long, value_name = "SECONDS", default_value_t = crate::server::listener_settings::DEFAULT_WRITE_TIMEOUT_SECS)]
    pub http_write_timeout: f64,

    /// Seconds an HTTP or metrics connection may serve no request before
    /// it is closed (HTTP/2 connections that only answer pings; HTTP/1
    /// keep-alive connections close at --http-header-read-timeout).
    #[arg(long, value_name = "SECONDS", default_value_t = crate::server::listener_settings::DEFAULT_IDLE_TIMEOUT_SECS)]
    pub http_idle_timeout: f64,

    /// Connections the HTTP port holds at once; more are closed at accept
    /// (default: half the open-file limit after 256 for the server).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub http_max_connections: Option<u64>,

    /// Connections the metrics port holds at once (default: an eighth of
    /// the open-file limit after 256, at most 64).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub metrics_max_connections: Option<u64>,

    /// Connections the gRPC port holds at once (default: three eighths of
    /// the open-file limit after 256).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub grpc_max_connections: Option<u64>,

    /// Serve gRPC over TLS with --grpc-server-cert and --grpc-server-key
    /// (Triton's flag).
    #[arg(long, value_name = "BOOL", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub grpc_use_ssl: bool,

    /// Serve gRPC over mutual TLS: as --grpc-use-ssl, and every client must
    /// present a certificate signed by --grpc-root-cert (Triton's flag).
    #[arg(long, value_name = "BOOL", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub grpc_use_ssl_mutual: bool,

    /// The gRPC server's certificate chain, PEM (re-read when it changes).
    #[arg(long, value_name = "PATH")]
    pub grpc_server_cert: Option<PathBuf>,

    /// The gRPC server certificate's private key, PEM (re-read when it changes).
    #[arg(long, value_name = "PATH")]
    pub grpc_server_key: Option<PathBuf>,

    /// With --grpc-use-ssl-mutual: the roots that sign the clients'
    /// certificates, PEM (re-read when they change).
    #[arg(long, value_name = "PATH")]
    pub grpc_root_cert: Option<PathBuf>,

    /// Serve HTTP over TLS (HTTPS) with this certificate chain, PEM, and
    /// --http-ssl-key (re-read when they change).
    #[arg(long, value_name = "PATH")]
    pub http_ssl_cert: Option<PathBuf>,

    /// The HTTPS certificate's private key, PEM.
    #[arg(long, value_name = "PATH")]
    pub http_ssl_key: Option<PathBuf>,

    /// HTTPS with mutual TLS: every client must present a certificate
    /// signed by one of these roots, PEM.
    #[arg(long, value_name = "PATH")]
    pub http_ssl_root_cert: Option<PathBuf>,

    /// Serve metrics over TLS with this certificate chain, PEM, and
    /// --metrics-ssl-key.
    #[arg(long, value_name = "PATH")]
    pub metrics_ssl_cert: Option<PathBuf>,

    /// The metrics certificate's private key, PEM.
    #[arg(long, value_name = "PATH")]
    pub metrics_ssl_key: Option<PathBuf>,

    /// Metrics with mutual TLS: the roots that sign the scrapers'
    /// certificates, PEM.
    #[arg(long, value_name = "PATH")]
    pub metrics_ssl_root_cert: Option<PathBuf>,

    /// Seconds a new gRPC connection may take to send its TLS handshake and
    /// HTTP/2 preface.
    #[arg(long, value_name = "SECONDS", default_value_t = crate::server::listener_settings::DEFAULT_HEADER_READ_TIMEOUT_SECS)]
    pub grpc_handshake_timeout: f64,

    /// Milliseconds a gRPC connection may go without a frame from its
    /// client before the server pings it (Triton's flag and default, 2 h).
    #[arg(long, value_name = "MS", default_value_t = 7_200_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub grpc_keepalive_time: u64,

    /// Milliseconds the server waits for the answer to its ping before it
    /// closes the connection (Triton's flag and default).
    #[arg(long, value_name = "MS", default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub grpc_keepalive_timeout: u64,

    /// Milliseconds after which a gRPC connection is asked to go away
    /// (GOAWAY; 0, the default: never; Triton's flag).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub grpc_max_connection_age: u64,

    /// Milliseconds the calls of a connection past its age may still take
    /// before it is closed (0, the default: as long as they take; Triton's flag).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub grpc_max_connection_age_grace: u64,

    /// Seconds a gRPC client may read nothing of an answer before its
    /// connection is closed and the answer dropped.
    #[arg(long, value_name = "SECONDS", default_value_t = crate::server::listener_settings::DEFAULT_WRITE_TIMEOUT_SECS)]
    pub grpc_write_timeout: f64,

    /// Seconds a gRPC connection may have no call open (one that only
    /// answers pings) before it is closed; clients reconnect on their next
    /// call (gRPC's MAX_CONNECTION_IDLE).
    #[arg(long, value_name = "SECONDS", default_value_t = crate::server::listener_settings::DEFAULT_IDLE_TIMEOUT_SECS)]
    pub grpc_idle_timeout: f64,

    /// Report ready only when every model is READY (Triton's default).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub strict_readiness: bool,

    /// HTTP APIs that answer only requests with a header, as
    /// `<api>,<api>,...:<key>=<value>` (the header `<key>`; repeatable).
    /// APIs: health, metadata, inference, shared-memory, model-config,
    /// model-repository, statistics, trace, logging.
    #[arg(long, value_name = "APIS:KEY=VALUE")]
    pub http_restricted_api: Vec<String>,

    /// gRPC protocols that answer only requests with a header, as
    /// `<protocol>,...:<key>=<value>` (the metadata
    /// `triton-grpc-protocol-<key>`; repeatable); the groups of
    /// --http-restricted-api.
    #[arg(long, value_name = "PROTOCOLS:KEY=VALUE")]
    pub grpc_restricted_protocol: Vec<String>,

    /// Let clients register and unregister system shared memory regions
    /// (`/v2/systemsharedmemory`, Triton's flag and default).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub allow_client_shm: bool,

    /// The most bytes one request's inputs may read from system shared
    /// memory, in all, e.g. 256MiB (400 beyond; default: --http-max-body-bytes).
    #[arg(long, value_parser = parse_bytes)]
    pub shm_max_input_bytes: Option<usize>,

    /// Request tracing with OpenTelemetry, as Triton's flag (repeat):
    /// `level=TIMESTAMPS` (default OFF), `rate=N` (one request in N,
    /// default 1000; 0: only requests with a sampled `traceparent`),
    /// `count=N` (traces by rate to take; -1, the default, no limit),
    /// `mode=opentelemetry` (the only mode), and for the OTLP exporter
    /// `opentelemetry,url=HOST:PORT[/PATH]` (default localhost:4318/v1/traces),
    /// `opentelemetry,protocol=http/protobuf|grpc`,
    /// `opentelemetry,resource=KEY=VALUE`, `opentelemetry,bsp_max_queue_size=N`,
    /// `opentelemetry,bsp_schedule_delay=MS`,
    /// `opentelemetry,bsp_max_export_batch_size=N`.
    #[arg(long, value_name = "[MODE,]SETTING=VALUE")]
    pub trace_config: Vec<String>,

    /// Verbose logging level: 0 info, 1 debug, 2 trace.
    #[arg(long, default_value_t = 0)]
    pub log_verbose: u8,

    /// Log line format.
    #[arg(long, value_enum, default_value_t = LogFormat::Default)]
    pub log_format: LogFormat,
}

impl ServeArgs {
    /// The server options these flags describe.
    ///
    /// # Errors
    /// A message for flags that contradict each other.
    pub fn options(&self) -> Result<ServeOptions, String> {
        let selective = matches!(self.model_control_mode, ControlMode::Explicit | ControlMode::OnDemand);
        if !self.load_models.is_empty() && !selective {
            return Err("--load-model needs --model-control-mode=explicit or on_demand (none and poll load every \
                        model; in modelmesh ModelMesh decides)"
                .into());
        }
        let mesh = self.model_control_mode == ControlMode::ModelMesh;
        let budgeted = self.model_memory_budget.is_some() || self.max_loaded_models.is_some();
        if budgeted && !matches!(self.model_control_mode, ControlMode::OnDemand | ControlMode::ModelMesh) {
            return Err("--model-memory-budget and --max-loaded-models need --model-control-mode=on_demand, \
                        where models leave memory and come back on the next request \
                        (or, for the budget, modelmesh)"
                .into());
        }
        if mesh && !self.allow_grpc {
            return Err(
                "--model-control-mode=modelmesh needs gRPC: ModelMesh calls mmesh.ModelRuntime on --grpc-port".into()
            );
        }
        if mesh && self.max_loaded_models.is_some() {
            return Err("--max-loaded-models does not apply in modelmesh mode: ModelMesh counts by bytes".into());
        }
        let budget = Budget {
            bytes: self.model_memory_budget.map(|b| b as u64).or_else(|| mesh.then(default_mesh_budget)),
            models: self.max_loaded_models,
            gpu: Default::default(),
        };
        let timeout = Duration::from_secs(self.model_load_timeout_secs);
        let budget_limits = default_max_connections();
        Ok(ServeOptions {
            loading: self.loading.options(self.model_control_mode, budget, timeout)?,
            metrics_port: self.allow_metrics.then_some(self.metrics_port),
            grpc_port: self.allow_grpc.then_some(self.grpc_port),
            repository_poll: Duration::from_secs(self.repository_poll_secs),
            load_models: self.load_models.clone(),
            exit_timeout: Duration::from_secs(self.exit_timeout_secs),
            drain_delay: Duration::try_from_secs_f64(self.drain_delay_secs).map_err(|_| {
                format!("--drain-delay-secs must be a number of seconds, got {}", self.drain_delay_secs)
            })?,
            http_address: self.http_address,
            grpc_address: self.grpc_address.unwrap_or(self.http_address),
            http_port: self.http_port,
            http_max_body_bytes: self.http_max_body_bytes,
            http_max_inflight_body_bytes: self.http_max_inflight_body_bytes.max(self.http_max_body_bytes) as u64,
            http: self.http_listener(budget_limits.http, self.http_max_connections, self.http_tls()?)?,
            metrics: self.http_listener(budget_limits.metrics, self.metrics_max_connections, self.metrics_tls()?)?,
            grpc: self.grpc_listener(budget_limits.grpc)?,
            strict_readiness: self.strict_readiness,
            http_restrictions: Restrictions::parse(&self.http_restricted_api, Front::Http)?,
            grpc_restrictions: Restrictions::parse(&self.grpc_restricted_protocol, Front::Grpc)?,
            allow_client_shm: self.allow_client_shm,
            shm_max_input_bytes: self.shm_max_input_bytes.unwrap_or(self.http_max_body_bytes) as u64,
            trace: crate::trace::TraceConfig::parse(&self.trace_config)?,
        })
    }
}

impl ServeArgs {
    /// The HTTP (or metrics) listener's settings, with at most `given`
    /// connections, else `default`.
    ///
    /// # Errors
    /// A message naming a timeout flag that is not a positive number of seconds.
    fn http_listener(&self, default: usize, given: Option<u64>, tls: Option<TlsFiles>) -> Result<HttpListener, String> {
        Ok(HttpListener {
            tls,
            header_read_timeout: seconds("--http-header-read-timeout", self.http_header_read_timeout)?,
            body_read_timeout: seconds("--http-body-read-timeout", self.http_body_read_timeout)?,
            body_min_rate: self.http_body_min_rate,
            write_timeout: seconds("--http-write-timeout", self.http_write_timeout)?,
            idle_timeout: seconds("--http-idle-timeout", self.http_idle_timeout)?,
            max_connections: given.map_or(default, |n| usize::try_from(n).unwrap_or(usize::MAX)),
        })
    }

    /// The gRPC listener's settings, with at most `default` connections
    /// unless `--grpc-max-connections` says otherwise.
    ///
    /// # Errors
    /// A message naming a timeout flag that is not a positive number of seconds.
    fn grpc_listener(&self, default: usize) -> Result<GrpcListener, String> {
        let millis = |ms: u64| (ms > 0).then(|| Duration::from_millis(ms));
        Ok(GrpcListener {
            handshake_timeout: seconds("--grpc-handshake-timeout", self.grpc_handshake_timeout)?,
            keepalive_time: Duration::from_millis(self.grpc_keepalive_time),
            keepalive_timeout: Duration::from_millis(self.grpc_keepalive_timeout),
            max_connection_age: millis(self.grpc_max_connection_age),
            max_connection_age_grace: millis(self.grpc_max_connection_age_grace),
            write_timeout: seconds("--grpc-write-timeout", self.grpc_write_timeout)?,
            idle_timeout: seconds("--grpc-idle-timeout", self.grpc_idle_timeout)?,
            max_connections: self.grpc_max_connections.map_or(default, |n| usize::try_from(n).unwrap_or(usize::MAX)),
            tls: self.grpc_tls()?,
        })
    }

    /// The HTTP port's TLS files, from --http-ssl-*.
    ///
    /// # Errors
    /// As [`tls_files`].
    fn http_tls(&self) -> Result<Option<TlsFiles>, String> {
        let flags = ["--http-ssl-cert", "--http-ssl-key", "--http-ssl-root-cert"];
        tls_files(flags, &self.http_ssl_cert, &self.http_ssl_key, &self.http_ssl_root_cert)
    }

    /// The metrics port's TLS files, from --metrics-ssl-*.
    ///
    /// # Errors
    /// As [`tls_files`].
    fn metrics_tls(&self) -> Result<Option<TlsFiles>, String> {
        let flags = ["--metrics-ssl-cert", "--metrics-ssl-key", "--metrics-ssl-root-cert"];
        tls_files(flags, &self.metrics_ssl_cert, &self.metrics_ssl_key, &self.metrics_ssl_root_cert)
    }

    /// The gRPC port's TLS files, from Triton's flags: --grpc-use-ssl (or
    /// --grpc-use-ssl-mutual, which implies it) with --grpc-server-cert and
    /// --grpc-server-key; under mutual TLS, --grpc-root-cert.
    ///
    /// # Errors
    /// A message naming the flag missing, or given where it does nothing.
    fn grpc_tls(&self) -> Result<Option<TlsFiles>, String> {
        let (cert, key, root) = (&self.grpc_server_cert, &self.grpc_server_key, &self.grpc_root_cert);
        if !self.grpc_use_ssl && !self.grpc_use_ssl_mutual {
            let given = [("--grpc-server-cert", cert), ("--grpc-server-key", key), ("--grpc-root-cert", root)];
            return match given.iter().find(|(_, path)| path.is_some()) {
                Some((flag, _)) => Err(format!("{flag} needs --grpc-use-ssl=true or --grpc-use-ssl-mutual=true")),
                None => Ok(None),
            };
        }
        if !self.grpc_use_ssl_mutual && root.is_some() {
            return Err("--grpc-root-cert is used only with --grpc-use-ssl-mutual=true: without it, clients are \
                        not asked for a certificate"
                .into());
        }
        if self.grpc_use_ssl_mutual && root.is_none() {
            return Err("--grpc-use-ssl-mutual needs --grpc-root-cert: the roots that sign the clients' \
                        certificates"
                .into());
        }
        let flag = if self.grpc_use_ssl_mutual { "--grpc-use-ssl-mutual" } else { "--grpc-use-ssl" };
        let need = |path: &Option<PathBuf>, name: &str| path.clone().ok_or_else(|| format!("{flag} needs {name}"));
        Ok(Some(TlsFiles {
            cert: need(cert, "--grpc-server-cert")?,
            key: need(key, "--grpc-server-key")?,
            client_roots: root.clone(),
        }))
    }
}

/// The TLS files of an HTTP listener from its `[cert, key, root]` flags.
///
/// # Errors
/// A message naming the flag missing: a certificate needs its key and a
/// key its certificate; client roots need both.
fn tls_files(
    flags: [&str; 3],
    cert: &Option<PathBuf>,
    key: &Option<PathBuf>,
    root: &Option<PathBuf>,
) -> Result<Option<TlsFiles>, String> {
    let [cert_flag, key_flag, root_flag] = flags;
    match (cert, key) {
        (Some(cert), Some(key)) => {
            Ok(Some(TlsFiles { cert: cert.clone(), key: key.clone(), client_roots: root.clone() }))
        }
        (Some(_), None) => Err(format!("{cert_flag} needs {key_flag}")),
        (None, Some(_)) => Err(format!("{key_flag} needs {cert_flag}")),
        (None, None) if root.is_some() => Err(format!("{root_flag} needs {cert_flag} and {key_flag}")),
        (None, None) => Ok(None),
    }
}

/// `value` seconds of `flag` as a duration.
///
/// # Errors
/// A message naming `flag` when `value` is not a positive number of seconds.
fn seconds(flag: &str, value: f64) -> Result<Duration, String> {
    match Duration::try_from_secs_f64(value) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(format!("{flag} must be a positive number of seconds, got {value}")),
    }
}

/// `--model-load-gpu-limit`'s DEVICE:FRACTION, as Triton writes it.
/// Modelmesh mode without `--model-memory-budget`: three quarters of the
/// memory the process may use, leaving the rest to the runtime itself and to
/// requests.
fn default_mesh_budget() -> u64 {
    crate::residency::memory_limit() / 4 * 3
}

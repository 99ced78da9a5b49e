//! The error types every layer shares: [`Error`], why a request failed, and
//! [`LoadError`], why a model did not load. Each variant is one class of
//! failure; the front ends map the classes to protocol statuses in one
//! table (`server::error`: the HTTP status and the gRPC code of each), and
//! ModelMesh's runtime maps a [`LoadError`] as ModelMesh reads it
//! (`server::modelmesh`).

/// Why a request failed. The message is shown to the client as is, so it
/// names what was wrong and what was expected.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The request itself is wrong (HTTP 400).
    #[error("{0}")]
    InvalidArgument(String),
    /// No such model, version or route (HTTP 404).
    #[error("{0}")]
    NotFound(String),
    /// What the request would create exists already (HTTP 400 as in
    /// Triton, gRPC ALREADY_EXISTS).
    #[error("{0}")]
    AlreadyExists(String),
    /// The model exists but cannot serve now (HTTP 503).
    #[error("{0}")]
    Unavailable(String),
    /// The model's queue is full or the request's queue timeout expired
    /// (HTTP 503 with `Retry-After`); the client may retry later.
    #[error("{0}")]
    Overloaded(Overload),
    /// A remote server that a model is delegated to answered with a failure
    /// or a malformed response (HTTP 502).
    #[error("{0}")]
    BadGateway(String),
    /// A failure on the server's side (HTTP 500).
    #[error("{0}")]
    Internal(String),
    /// A protocol feature Plinth does not implement (HTTP 501, gRPC
    /// UNIMPLEMENTED).
    #[error("{0}")]
    Unsupported(String),
}

impl Error {
    /// The same error with its message put through `f` (to add context).
    pub fn map_message(self, f: impl FnOnce(String) -> String) -> Error {
        match self {
            Error::InvalidArgument(m) => Error::InvalidArgument(f(m)),
            Error::NotFound(m) => Error::NotFound(f(m)),
            Error::AlreadyExists(m) => Error::AlreadyExists(f(m)),
            Error::Unavailable(m) => Error::Unavailable(f(m)),
            Error::Overloaded(o) => Error::Overloaded(o.map_message(f)),
            Error::BadGateway(m) => Error::BadGateway(f(m)),
            Error::Internal(m) => Error::Internal(f(m)),
            Error::Unsupported(m) => Error::Unsupported(f(m)),
        }
    }

    /// Whether the server failed rather than the request (HTTP 500 or 502):
    /// what a rollout counts against a version.
    pub fn is_server_side(&self) -> bool {
        matches!(self, Error::Internal(_) | Error::BadGateway(_))
    }
}

/// A refusal because something is busy: what, and when to try again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overload {
    /// What is full or timed out, for the client.
    pub message: String,
    /// Seconds a client should wait before retrying (HTTP `Retry-After`,
    /// RFC 9110 §10.2.3): the host's [`Overload::RETRY_AFTER_SECS`], or
    /// what a plugin passed on.
    pub retry_after_secs: u32,
}

impl Overload {
    /// The host's hint for a full queue or an expired queue timeout:
    /// queues drain in milliseconds, so one second (the header's unit) is
    /// the shortest honest hint; clients add their own jittered backoff.
    pub const RETRY_AFTER_SECS: u32 = 1;

    /// An overload with the host's retry hint.
    pub fn new(message: impl Into<String>) -> Overload {
        Overload { message: message.into(), retry_after_secs: Overload::RETRY_AFTER_SECS }
    }

    /// The same overload with its message put through `f`.
    pub fn map_message(self, f: impl FnOnce(String) -> String) -> Overload {
        Overload { message: f(self.message), ..self }
    }
}

impl std::fmt::Display for Overload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Why a model (or one of its versions) did not load. The message names the
/// model and what was wrong.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum LoadError {
    /// Nothing was tried: the request names no model folder, an id or path
    /// that cannot be served, or an operation the control mode does not
    /// allow.
    #[error("{0}")]
    Invalid(String),
    /// Nothing was tried: the model does not fit the memory budget.
    #[error("{0}")]
    NoRoom(String),
    /// The load was tried and failed: the configuration, the model file, the
    /// plugin or the warm-up; or the loaded model turned out not to fit.
    /// Nothing of it stays loaded.
    #[error("{0}")]
    Failed(String),
    /// Nothing was tried: the control mode does not allow explicit loads
    /// and unloads (Triton answers UNAVAILABLE).
    #[error("{0}")]
    NotAllowed(String),
    /// ModelMesh's `runtimeStatus` unloaded every model while this load ran.
    #[error("{0}")]
    Aborted(String),
}

impl LoadError {
    /// The same error with its message put through `f` (to add context).
    pub fn map_message(self, f: impl FnOnce(String) -> String) -> LoadError {
        match self {
            LoadError::Invalid(m) => LoadError::Invalid(f(m)),
            LoadError::NoRoom(m) => LoadError::NoRoom(f(m)),
            LoadError::Failed(m) => LoadError::Failed(f(m)),
            LoadError::NotAllowed(m) => LoadError::NotAllowed(f(m)),
            LoadError::Aborted(m) => LoadError::Aborted(f(m)),
        }
    }

    /// The message alone.
    pub fn message(&self) -> &str {
        match self {
            LoadError::Invalid(m)
            | LoadError::NoRoom(m)
            | LoadError::Failed(m)
            | LoadError::NotAllowed(m)
            | LoadError::Aborted(m) => m,
        }
    }
}

impl From<LoadError> for Error {
    /// A load asked for through the repository extension (`load`, the
    /// `config` override): Triton answers every failure to load as a bad
    /// request (HTTP 400, gRPC INVALID_ARGUMENT), with the reason, except a
    /// load or unload the control mode does not allow: UNAVAILABLE, as
    /// Triton's `model_repository_manager.cc` answers it.
    fn from(e: LoadError) -> Error {
        match e {
            LoadError::NotAllowed(m) => Error::Unavailable(m),
            e => Error::InvalidArgument(e.to_string()),
        }
    }
}

//! The error types every layer shares: [`Error`], why a request failed, and
//! [`LoadError`], why a model did not load. Each variant is one class of
//! failure; the front ends map the classes to protocol statuses in one
//! place each (`server::error` for HTTP, `server::grpc` and
//! `server::modelmesh` for gRPC).

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
    Overloaded(String),
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

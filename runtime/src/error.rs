//! The error type of the request path. Each variant is one of the protocol's
//! error classes; the HTTP layer maps them to status codes.

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
}

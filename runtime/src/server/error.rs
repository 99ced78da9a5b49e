//! The HTTP face of errors: a status code and `{"error": "<message>"}`, as
//! the KServe v2 protocol specifies.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::error::Error;

/// An error answer: its status and message.
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, for the client.
    pub message: String,
    /// Seconds for the `Retry-After` header of an overload 503 (RFC 9110).
    pub retry_after_secs: Option<u64>,
}

impl ApiError {
    /// A 400 Bad Request with `message`.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// An error answer with `status` and `message`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), retry_after_secs: None }
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        let status = match &e {
            Error::InvalidArgument(_) | Error::AlreadyExists(_) => StatusCode::BAD_REQUEST,
            Error::NotFound(_) => StatusCode::NOT_FOUND,
            Error::Unavailable(_) | Error::Overloaded(_) => StatusCode::SERVICE_UNAVAILABLE,
            Error::BadGateway(_) => StatusCode::BAD_GATEWAY,
            Error::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Error::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
        };
        let retry_after_secs = match &e {
            Error::Overloaded(o) => Some(u64::from(o.retry_after_secs)),
            _ => None,
        };
        ApiError { status, message: e.to_string(), retry_after_secs }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.message });
        respond(self.status, &self.message, body, self.retry_after_secs)
    }
}

/// An error answer with `body` (the KServe or OpenAI shape) and status,
/// `Retry-After` when given; `message` is logged, as a warning for a server
/// failure other than 503 (which is the server working as designed).
pub(super) fn respond(
    status: StatusCode,
    message: &str,
    body: serde_json::Value,
    retry_after_secs: Option<u64>,
) -> Response {
    if status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE {
        tracing::warn!(status = status.as_u16(), "{message}");
    } else {
        tracing::debug!(status = status.as_u16(), "{message}");
    }
    let mut response = (status, Json(body)).into_response();
    if let Some(secs) = retry_after_secs {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

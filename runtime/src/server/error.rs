//! Errors as the front ends answer them: one table from each class of
//! [`Error`] to its HTTP status and its gRPC code ([`statuses`]); over
//! HTTP a status and `{"error": "<message>"}` ([`ApiError`]), as the KServe
//! v2 protocol specifies, over gRPC a [`tonic::Status`].

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tonic::Code;

use crate::error::Error;

/// The HTTP status and the gRPC code of an error's class. The HTTP
/// statuses are the KServe v2 protocol's and Triton's; the gRPC codes
/// follow gRPC's own mapping of those statuses (`doc/http-grpc-status-mapping.md`
/// in grpc/grpc), except where Triton's gRPC front end answers otherwise.
pub fn statuses(e: &Error) -> (StatusCode, Code) {
    match e {
        Error::InvalidArgument(_) => (StatusCode::BAD_REQUEST, Code::InvalidArgument),
        Error::NotFound(_) => (StatusCode::NOT_FOUND, Code::NotFound),
        // 400 over HTTP as in Triton; gRPC has a code of its own.
        Error::AlreadyExists(_) => (StatusCode::BAD_REQUEST, Code::AlreadyExists),
        Error::Unavailable(_) | Error::Overloaded(_) => (StatusCode::SERVICE_UNAVAILABLE, Code::Unavailable),
        // gRPC's mapping turns a 502 into UNAVAILABLE too.
        Error::BadGateway(_) => (StatusCode::BAD_GATEWAY, Code::Unavailable),
        Error::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, Code::Internal),
        Error::Unsupported(_) => (StatusCode::NOT_IMPLEMENTED, Code::Unimplemented),
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> tonic::Status {
        tonic::Status::new(statuses(&e).1, e.to_string())
    }
}

/// `Retry-After` of a 503 that is not an overload (a model LOADING,
/// UNAVAILABLE or unloading, the server shutting down): a client that
/// backs off by the header tries again after a second rather than at once.
pub const UNAVAILABLE_RETRY_AFTER_SECS: u64 = 1;

/// An error answer: its status and message.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    /// What went wrong, for the client.
    pub message: String,
    /// Seconds for the `Retry-After` header (RFC 9110) of an overload 503;
    /// every other 503 carries [`UNAVAILABLE_RETRY_AFTER_SECS`].
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
        let (status, _) = statuses(&e);
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
/// `Retry-After` when given, and on every 503 (a client that backs off by
/// it must not retry at once); `message` is logged, as a warning for a
/// server failure other than 503 (which is the server working as designed).
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
    let unavailable = (status == StatusCode::SERVICE_UNAVAILABLE).then_some(UNAVAILABLE_RETRY_AFTER_SECS);
    if let Some(secs) = retry_after_secs.or(unavailable) {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// The words of a caught panic's payload (a `panic!` message is a `&str`
/// or a `String`).
pub(super) fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(text) = payload.downcast_ref::<&str>() {
        text
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text
    } else {
        "a panic without a message"
    }
}

/// What a request whose handling panicked is answered: an internal error
/// that says so, logged as an error. The panic fails that request alone:
/// the server's locks cannot be poisoned (`parking_lot`), so the next
/// requests, to this model or any other, are served as before.
pub(super) fn panicked(payload: &(dyn std::any::Any + Send)) -> Error {
    let what = panic_message(payload);
    tracing::error!(panic = what, "a request's handling panicked; that request fails, the server goes on");
    Error::Internal(format!("the server failed on this request (a panic: {what}); other requests are not affected"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Overload;

    #[test]
    fn every_class_of_error_has_its_http_status_and_grpc_code() {
        let overload = Overload { message: "full".into(), retry_after_secs: 1 };
        let table = [
            (Error::InvalidArgument("m".into()), StatusCode::BAD_REQUEST, Code::InvalidArgument),
            (Error::NotFound("m".into()), StatusCode::NOT_FOUND, Code::NotFound),
            (Error::AlreadyExists("m".into()), StatusCode::BAD_REQUEST, Code::AlreadyExists),
            (Error::Unavailable("m".into()), StatusCode::SERVICE_UNAVAILABLE, Code::Unavailable),
            (Error::Overloaded(overload), StatusCode::SERVICE_UNAVAILABLE, Code::Unavailable),
            (Error::BadGateway("m".into()), StatusCode::BAD_GATEWAY, Code::Unavailable),
            (Error::Internal("m".into()), StatusCode::INTERNAL_SERVER_ERROR, Code::Internal),
            (Error::Unsupported("m".into()), StatusCode::NOT_IMPLEMENTED, Code::Unimplemented),
        ];
        // A new class fails to compile here until the table has it.
        let class = |e: &Error| match e {
            Error::InvalidArgument(_) => 0,
            Error::NotFound(_) => 1,
            Error::AlreadyExists(_) => 2,
            Error::Unavailable(_) => 3,
            Error::Overloaded(_) => 4,
            Error::BadGateway(_) => 5,
            Error::Internal(_) => 6,
            Error::Unsupported(_) => 7,
        };
        let classes: std::collections::BTreeSet<i32> = table.iter().map(|(e, _, _)| class(e)).collect();
        assert_eq!(classes.len(), 8);
        for (e, http, grpc) in table {
            assert_eq!(statuses(&e), (http, grpc), "{e:?}");
            let api = ApiError::from(e.clone());
            assert_eq!((api.status, api.message.as_str()), (http, e.to_string().as_str()));
            let status = tonic::Status::from(e.clone());
            assert_eq!((status.code(), status.message()), (grpc, e.to_string().as_str()));
        }
    }
}

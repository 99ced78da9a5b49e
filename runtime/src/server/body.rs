//! Reading an HTTP request's body whole, and the one answer every route
//! gives to a body it cannot read.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;

use super::error::ApiError;
use super::service::Service;
use crate::metrics::{Listener, SlowClient};

/// A request body read whole, within `--http-max-body-bytes` and the pace
/// `--http-body-read-timeout` and `--http-body-min-rate` set; a route takes
/// it as its last argument. A body that cannot be read is refused with
/// [`rejected`]'s answer.
pub struct Body(pub Bytes);

impl FromRequest<Arc<Service>> for Body {
    type Rejection = ApiError;

    async fn from_request(request: Request, service: &Arc<Service>) -> Result<Body, ApiError> {
        Bytes::from_request(request, service).await.map(Body).map_err(|e| rejected(service, e))
    }
}

/// The answer to a body that could not be read: 408 when it stopped
/// arriving (counted in `plinth_connections_slow_client_total`), else 400.
pub(super) fn unreadable(service: &Service, e: &(dyn std::error::Error + 'static)) -> ApiError {
    if let Some(stalled) = super::body_timeout::stalled(e) {
        service.lifecycle.metrics().connections.slow_client(Listener::Http, SlowClient::Body);
        return ApiError::new(StatusCode::REQUEST_TIMEOUT, stalled.to_string());
    }
    ApiError::bad_request(format!("cannot read the request body: {e}"))
}

/// The answer to a body the `Bytes` extractor could not take: 408 when it
/// stopped arriving, 413 (Triton's text) over `--http-max-body-bytes`,
/// else the extractor's status.
fn rejected(service: &Service, e: BytesRejection) -> ApiError {
    if super::body_timeout::stalled(&e).is_some() {
        return unreadable(service, &e);
    }
    let message = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        // Begins as Triton's text, which clients match on.
        let max = service.max_body_bytes;
        format!(
            "request JSON size of more than {max} bytes exceeds the maximum allowed input size of {max} bytes (--http-max-body-bytes)"
        )
    } else {
        format!("cannot read the request body: {}", e.body_text())
    };
    ApiError::new(e.status(), message)
}

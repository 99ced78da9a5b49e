//! Faults the end-to-end tests inject into the real binary, to show that a
//! panic or a stall inside one request costs that request alone (or, for a
//! stall, readiness). Off unless the process starts with
//! `PLINTH_TEST_FAULTS=1` in its environment; then an HTTP request with the
//! header `plinth-test-fault` does what its value says, while holding the
//! lock every answer a rollout judges takes:
//!
//! - `panic`: panics (the request gets a 500 saying so);
//! - `hold=SECS`: keeps the lock for SECS seconds (at most 60), then goes on.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{ApiError, Service};

/// The environment variable that turns the hook on.
pub const ENABLE_VARIABLE: &str = "PLINTH_TEST_FAULTS";

/// The request header that names a fault.
pub const HEADER: &str = "plinth-test-fault";

/// The longest `hold` taken.
const MAX_HOLD: Duration = Duration::from_secs(60);

/// Whether this process takes faults from requests.
pub fn enabled() -> bool {
    std::env::var_os(ENABLE_VARIABLE).is_some_and(|v| v == "1")
}

/// A fault a request asks for.
enum Fault {
    Panic,
    Hold(Duration),
}

impl Fault {
    fn parse(value: &str) -> Result<Fault, String> {
        if value == "panic" {
            return Ok(Fault::Panic);
        }
        let secs = value.strip_prefix("hold=").and_then(|s| s.parse::<u64>().ok());
        match secs.map(Duration::from_secs) {
            Some(hold) if hold <= MAX_HOLD => Ok(Fault::Hold(hold)),
            _ => Err(format!("header '{HEADER}' must be 'panic' or 'hold=SECS' (SECS at most 60), got '{value}'")),
        }
    }
}

/// The middleware: injects the fault a request names, then serves it.
pub async fn inject(State(service): State<Arc<Service>>, request: Request, next: Next) -> Response {
    let Some(value) = request.headers().get(HEADER).and_then(|v| v.to_str().ok()) else {
        return next.run(request).await;
    };
    match Fault::parse(value) {
        Err(message) => ApiError::bad_request(message).into_response(),
        Ok(Fault::Panic) => service.lifecycle.while_core_locked(|| panic!("a fault injected by '{HEADER}: panic'")),
        Ok(Fault::Hold(hold)) => {
            // On a blocking thread: the runtime's workers go on serving.
            let held = service.clone();
            let _ = tokio::task::spawn_blocking(move || held.lifecycle.while_core_locked(|| std::thread::sleep(hold)))
                .await;
            next.run(request).await
        }
    }
}

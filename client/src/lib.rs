//! A blocking KServe v2 (Open Inference Protocol) HTTP client.
//!
//! Requests that a server refuses for overload (503, or 429) are retried
//! with exponential backoff and full jitter, a bounded number of times, so
//! that many clients backing off at once do not return in lockstep. A
//! `Retry-After` header (RFC 9110, seconds) raises the wait, up to the
//! policy's maximum delay.
//!
//! ```no_run
//! use plinth_client::{Client, InferInput, InferRequest};
//! let client = Client::new("http://127.0.0.1:8000");
//! let request = InferRequest::new(vec![InferInput::fp32("x", &[1, 4], &[0.0, 1.0, 2.0, 3.0])]);
//! let response = client.infer("my_model", &request)?;
//! let y = response.output("y").expect("output y").to_f32()?;
//! # Ok::<(), plinth_client::ClientError>(())
//! ```

mod types;

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use reqwest::StatusCode;
use reqwest::header::RETRY_AFTER;

pub use types::{InferInput, InferOutput, InferRequest, InferResponse};

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error status and its `{"error"}` message.
    #[error("HTTP {status}: {message}")]
    Status {
        /// The HTTP status.
        status: StatusCode,
        /// The server's `error` message (or the body, if it was not JSON).
        message: String,
        /// The `Retry-After` header, if any.
        retry_after: Option<Duration>,
    },
    /// No answer: the connection failed or timed out.
    #[error("request failed: {0}")]
    Transport(#[from] reqwest::Error),
    /// An answer that is not what the protocol says.
    #[error("unexpected answer: {0}")]
    Protocol(String),
}

impl ClientError {
    /// Overload answers (503 Service Unavailable, 429 Too Many Requests)
    /// are worth retrying; nothing else is.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ClientError::Status { status, .. }
            if *status == StatusCode::SERVICE_UNAVAILABLE || *status == StatusCode::TOO_MANY_REQUESTS)
    }

    /// The HTTP status, for an error answer.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ClientError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// How overload answers are retried.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Attempts in all, the first included; 1 never retries.
    pub max_attempts: usize,
    /// The backoff before the first retry; it doubles for each later one.
    pub initial_delay: Duration,
    /// The longest wait between two attempts, `Retry-After` included.
    pub max_delay: Duration,
}

impl RetryPolicy {
    /// Up to 5 attempts, waiting about 50 ms, 100 ms, 200 ms, 400 ms (each
    /// plus a random jitter of up to the same again), at most 2 s.
    pub const DEFAULT: RetryPolicy =
        RetryPolicy { max_attempts: 5, initial_delay: Duration::from_millis(50), max_delay: Duration::from_secs(2) };

    /// One attempt: errors come back as they are.
    pub const NEVER: RetryPolicy =
        RetryPolicy { max_attempts: 1, initial_delay: Duration::ZERO, max_delay: Duration::ZERO };

    /// The waits between attempts, jittered.
    fn delays(&self) -> impl Iterator<Item = Duration> {
        ExponentialBuilder::default()
            .with_min_delay(self.initial_delay)
            .with_max_delay(self.max_delay)
            .with_max_times(self.max_attempts.saturating_sub(1))
            .with_jitter()
            .build()
    }
}

/// A blocking reqwest client for `http://` and `https://` servers, with
/// `timeout` for each request (none when `None`). Its TLS is rustls with
/// ring, installed as the process's crypto provider unless one already is.
///
/// # Panics
/// When reqwest cannot build a client (no TLS roots can be read).
pub fn http_client(timeout: Option<Duration>) -> reqwest::blocking::Client {
    // ring's provider is deprecated only for lacking post-quantum key
    // exchange; aws-lc-rs would add a C build of its own.
    #[allow(deprecated)]
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::blocking::Client::builder().timeout(timeout).build().expect("an HTTP client can be built")
}

/// A client of one server.
#[derive(Clone)]
pub struct Client {
    http: reqwest::blocking::Client,
    base: String,
    retry: RetryPolicy,
}

impl Client {
    /// A client of the server at `base` (e.g. `http://127.0.0.1:8000`) with
    /// [`RetryPolicy::DEFAULT`] and no request timeout.
    pub fn new(base: &str) -> Client {
        let http = http_client(None);
        Client { http, base: base.trim_end_matches('/').to_owned(), retry: RetryPolicy::DEFAULT }
    }

    /// The same client with another retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Client {
        self.retry = retry;
        self
    }

    /// The same client with a timeout for each attempt; a request that
    /// times out closes its connection, which cancels it on the server.
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.http = http_client(Some(timeout));
        self
    }

    /// `POST /v2/models/{model}/infer` with JSON tensors.
    ///
    /// # Errors
    /// [`ClientError::Status`] with the server's message once the retries
    /// are spent (or at once for a status that is not retried),
    /// [`ClientError::Transport`] when there is no answer.
    pub fn infer(&self, model: &str, request: &InferRequest) -> Result<InferResponse, ClientError> {
        self.infer_json(model, &request.to_json())
    }

    /// [`Client::infer`] with a request already encoded by
    /// [`InferRequest::to_json`], for callers that send the same request
    /// many times (load generators) and should not pay its encoding each time.
    ///
    /// # Errors
    /// As [`Client::infer`].
    pub fn infer_json(&self, model: &str, request: &[u8]) -> Result<InferResponse, ClientError> {
        let url = format!("{}/v2/models/{model}/infer", self.base);
        let body = self.with_retries(|| {
            self.http.post(&url).header(reqwest::header::CONTENT_TYPE, "application/json").body(request.to_vec()).send()
        })?;
        serde_json::from_slice(&body).map_err(|e| ClientError::Protocol(format!("inference response: {e}")))
    }

    /// `POST /v2/models/{model}/predict`: a raw body through the model's
    /// plugin; returns the plugin's answer body.
    ///
    /// # Errors
    /// As [`Client::infer`].
    pub fn predict(&self, model: &str, content_type: &str, body: &[u8]) -> Result<Vec<u8>, ClientError> {
        let url = format!("{}/v2/models/{model}/predict", self.base);
        self.with_retries(|| {
            self.http.post(&url).header(reqwest::header::CONTENT_TYPE, content_type).body(body.to_vec()).send()
        })
    }

    fn with_retries(
        &self,
        send: impl Fn() -> reqwest::Result<reqwest::blocking::Response>,
    ) -> Result<Vec<u8>, ClientError> {
        let mut delays = self.retry.delays();
        loop {
            match answer(send()?) {
                Err(e) if e.is_retryable() => match delays.next() {
                    Some(delay) => std::thread::sleep(self.wait(delay, &e)),
                    None => return Err(e),
                },
                other => return other,
            }
        }
    }

    /// The backoff, raised to the server's `Retry-After`, at most `max_delay`.
    fn wait(&self, backoff: Duration, e: &ClientError) -> Duration {
        match e {
            ClientError::Status { retry_after: Some(after), .. } => backoff.max(*after).min(self.retry.max_delay),
            _ => backoff,
        }
    }
}

fn answer(response: reqwest::blocking::Response) -> Result<Vec<u8>, ClientError> {
    let status = response.status();
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let body = response.bytes()?.to_vec();
    if status.is_success() {
        return Ok(body);
    }
    let message = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("error").and_then(|m| m.as_str()).map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
    Err(ClientError::Status { status, message, retry_after })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_are_bounded_jittered_and_capped() {
        let policy = RetryPolicy {
            max_attempts: 4,
            initial_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(40),
        };
        let delays: Vec<_> = policy.delays().collect();
        assert_eq!(delays.len(), 3, "3 retries after the first attempt");
        assert!(
            delays.iter().all(|d| *d >= Duration::from_millis(10) && *d <= Duration::from_millis(80)),
            "{delays:?}"
        );
        assert_eq!(RetryPolicy::NEVER.delays().count(), 0);
    }

    #[test]
    fn retry_after_raises_the_wait_up_to_the_maximum() {
        let client = Client::new("http://x").with_retry(RetryPolicy {
            max_attempts: 3,
            initial_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(500),
        });
        let overloaded = ClientError::Status {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: String::new(),
            retry_after: Some(Duration::from_secs(1)),
        };
        assert!(overloaded.is_retryable());
        assert_eq!(client.wait(Duration::from_millis(10), &overloaded), Duration::from_millis(500));
    }
}

//! Graceful shutdown: after SIGTERM or SIGINT readiness turns false at
//! once, and every HTTP answer closes its connection; for the drain delay
//! new requests are still taken (load balancers take a moment to notice);
//! then new inference gets 503 and accepted requests finish, up to the
//! exit timeout. Last the listeners close without resetting a connection
//! they took (`listeners`): a request is answered or refused at connect.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::Service;

/// Waits for SIGTERM or SIGINT.
pub(super) async fn signalled() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}

/// Turns the service unready, keeps serving for `drain_delay`, then refuses
/// new inference.
pub(super) async fn stop_taking(service: &Service, drain_delay: Duration) {
    service.shutting_down.store(true, Ordering::Release);
    if !drain_delay.is_zero() {
        tracing::info!(
            seconds = drain_delay.as_secs_f64(),
            "shutting down: not ready, still serving for the drain delay"
        );
        tokio::time::sleep(drain_delay).await;
    }
    service.refusing.store(true, Ordering::Release);
    tracing::info!("shutting down: refusing new inference, finishing accepted requests");
}

/// Waits until `deadline` for the requests in flight. If some are still
/// running then (a backend call cannot be cancelled: a TorchScript loop, a
/// hung remote), the process exits at once with status 1: waiting for them,
/// or for the workers that run them, would hold the process past the
/// timeout the orchestrator was promised.
pub(super) async fn finish_accepted(service: &Service, deadline: Instant) {
    if let Err(unfinished) = service.in_flight.none_by(deadline).await {
        tracing::warn!(unfinished, "exit timeout reached with requests still running; exiting without them");
        std::process::exit(1);
    }
}

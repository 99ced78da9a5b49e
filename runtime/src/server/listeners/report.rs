//! Where the connections of one listener report: the listener's name in
//! the metrics and the log, and the flags their opening, writes and idle
//! time are held to.

use std::sync::Arc;
use std::time::Duration;

use crate::metrics::{Listener, Metrics};

/// What a connection of one listener reports to: the listener's name and
/// the metrics its slow clients are counted in.
#[derive(Clone)]
pub(super) struct Reporting {
    pub listener: Listener,
    /// Where `plinth_connections_*` are counted.
    pub metrics: Arc<Metrics>,
    /// The flag whose timeout an opening is held to, for the log.
    pub opening_flag: &'static str,
    /// How long a write may make no progress (the client reads nothing)
    /// before the connection is closed, and the flag that sets it.
    pub write_timeout: (Duration, &'static str),
    /// How long the connection may serve no request before it is closed,
    /// and the flag that sets it.
    pub idle_timeout: (Duration, &'static str),
}

#[cfg(test)]
impl Reporting {
    /// For the unit tests: `listener`'s, its opening held to `opening_flag`,
    /// writes and idle time to ten minutes.
    pub fn patient(listener: Listener, metrics: &Arc<Metrics>, opening_flag: &'static str) -> Reporting {
        let ten_minutes = Duration::from_secs(600);
        Reporting {
            listener,
            metrics: metrics.clone(),
            opening_flag,
            write_timeout: (ten_minutes, "--http-write-timeout"),
            idle_timeout: (ten_minutes, "--http-idle-timeout"),
        }
    }
}

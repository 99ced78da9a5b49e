//! Where the connections of one listener report: the listener's name in
//! the metrics and the log, and the flag their opening is held to.

use std::sync::Arc;

use crate::metrics::{Listener, Metrics};

/// What a connection of one listener reports to: the listener's name and
/// the metrics its slow clients are counted in.
#[derive(Clone)]
pub(super) struct Reporting {
    /// The listener.
    pub listener: Listener,
    /// Where `plinth_connections_*` are counted.
    pub metrics: Arc<Metrics>,
    /// The flag whose timeout an opening is held to, for the log.
    pub opening_flag: &'static str,
}

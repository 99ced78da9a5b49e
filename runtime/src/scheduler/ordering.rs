//! `preserve_ordering`: answers leave in the order their requests were
//! queued, whichever instance finished first.

use std::collections::BTreeSet;

use parking_lot::Mutex;
use tokio::sync::Notify;

/// Request ids are queue ids: 1, 2, 3, ... in arrival order.
pub struct Ordering {
    /// The lowest id without an answer, and the answered ids above it.
    state: Mutex<(u64, BTreeSet<u64>)>,
    released: Notify,
}

impl Default for Ordering {
    fn default() -> Ordering {
        Ordering { state: Mutex::new((1, BTreeSet::new())), released: Notify::new() }
    }
}

impl Ordering {
    /// Request `id` has its answer, or will never get one (it was removed).
    pub fn done(&self, id: u64) {
        let mut state = self.state.lock();
        let (next, answered) = &mut *state;
        answered.insert(id);
        while answered.remove(next) {
            *next += 1;
        }
        self.released.notify_waiters();
    }

    /// Waits until every request queued before `id` has its answer.
    pub async fn turn(&self, id: u64) {
        loop {
            let released = self.released.notified();
            if self.state.lock().0 > id {
                return;
            }
            released.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_later_answer_waits_for_every_earlier_one() {
        let ordering = Ordering::default();
        ordering.done(2);
        let early = tokio::time::timeout(Duration::from_millis(50), ordering.turn(2)).await;
        assert!(early.is_err(), "request 2 was released before request 1 had its answer");
        ordering.done(1);
        tokio::time::timeout(Duration::from_secs(5), ordering.turn(2)).await.expect("released once 1 is done");
        ordering.turn(1).await;
    }
}

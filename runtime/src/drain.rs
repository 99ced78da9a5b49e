//! Waiting until what is in use is let go: the requests in flight at
//! shutdown, the connections a listener took that have not sent their
//! first bytes, a model version that requests still hold when it is
//! unloaded. One count that can be waited on ([`InUse`], over a `watch`),
//! a guard per holder ([`Hold`]), and a wrapper that drops its value on a
//! blocking thread and says when it is gone ([`FreedOffThread`]). No one
//! polls: a waiter wakes when the count changes.

use std::ops::Deref;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

/// How many hold something; can be waited on until none does.
#[derive(Clone, Debug)]
pub struct InUse(Arc<watch::Sender<usize>>);

impl Default for InUse {
    fn default() -> InUse {
        InUse(Arc::new(watch::Sender::new(0)))
    }
}

/// One holder of an [`InUse`], counted until it is dropped.
#[derive(Debug)]
pub struct Hold(InUse);

impl Drop for Hold {
    fn drop(&mut self) {
        self.0.0.send_modify(|n| *n -= 1);
    }
}

impl InUse {
    /// Counts one more holder, until the [`Hold`] is dropped.
    pub fn hold(&self) -> Hold {
        self.0.send_modify(|n| *n += 1);
        Hold(self.clone())
    }

    /// How many hold it now.
    pub fn count(&self) -> usize {
        *self.0.borrow()
    }

    /// Waits until no one holds it.
    pub async fn none(&self) {
        let mut changes = self.0.subscribe();
        // The sender lives in `self`, so the wait ends only by the count.
        let _ = changes.wait_for(|n| *n == 0).await;
    }

    /// Waits until no one holds it, or `deadline`.
    ///
    /// # Errors
    /// How many still hold it at the deadline.
    pub async fn none_by(&self, deadline: Instant) -> Result<(), usize> {
        let mut changes = self.0.subscribe();
        // The sender lives in `self`, so the wait ends only by the count.
        match tokio::time::timeout_at(deadline, changes.wait_for(|n| *n == 0)).await {
            Ok(_) => Ok(()),
            Err(_) => Err(self.count()),
        }
    }
}

/// A value whose drop is slow (it joins threads, frees native memory):
/// dropped on one of tokio's blocking threads, wherever its owner lets it
/// go, so no async thread stalls on it, and the heap memory it freed then
/// handed back to the operating system ([`release_freed_memory`]);
/// [`FreedOffThread::freed`] tells when that is done. Outside a tokio
/// runtime it is dropped in place.
#[derive(Debug)]
pub struct FreedOffThread<T: Send + 'static> {
    value: Option<(T, Hold)>,
    freed: InUse,
}

impl<T: Send + 'static> FreedOffThread<T> {
    /// Wraps `value`.
    pub fn new(value: T) -> FreedOffThread<T> {
        let freed = InUse::default();
        let held = freed.hold();
        FreedOffThread { value: Some((value, held)), freed }
    }

    /// Held until the value has been dropped: [`InUse::none_by`] waits for
    /// that.
    pub fn freed(&self) -> InUse {
        self.freed.clone()
    }
}

impl<T: Send + 'static> Deref for FreedOffThread<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value.as_ref().expect("the value is taken only by drop").0
    }
}

impl<T: Send + 'static> Drop for FreedOffThread<T> {
    fn drop(&mut self) {
        let Some(value) = self.value.take() else { return };
        // The value goes, its memory is handed back, and only then does
        // its hold: `freed` counts none once all of that is done.
        let free = move || {
            let (value, held) = value;
            drop(value);
            release_freed_memory();
            drop(held);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(free)),
            Err(_) => free(),
        }
    }
}

/// Hands memory that freed allocations left in the C heap back to the
/// operating system, so an unload or an eviction lowers the process's
/// resident size.
pub fn release_freed_memory() {
    // SAFETY: malloc_trim only walks glibc's own free lists.
    unsafe { libc::malloc_trim(0) };
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_wait_ends_when_the_last_holder_lets_go() {
        let in_use = InUse::default();
        assert_eq!(in_use.none_by(Instant::now()).await, Ok(()), "nothing held");
        let (a, b) = (in_use.hold(), in_use.hold());
        assert_eq!(in_use.count(), 2);
        assert_eq!(in_use.none_by(Instant::now()).await, Err(2));
        let waiter = tokio::spawn({
            let in_use = in_use.clone();
            async move { in_use.none_by(Instant::now() + Duration::from_secs(600)).await }
        });
        drop(a);
        drop(b);
        assert_eq!(waiter.await.unwrap(), Ok(()));
    }

    /// Tells the thread it was dropped on.
    struct Dropped(std::sync::mpsc::Sender<std::thread::ThreadId>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            let _ = self.0.send(std::thread::current().id());
        }
    }

    #[tokio::test]
    async fn a_value_is_dropped_on_a_blocking_thread_and_its_release_awaited() {
        let (sender, dropped_on) = std::sync::mpsc::channel();
        let value = FreedOffThread::new(Dropped(sender));
        let freed = value.freed();
        assert_eq!(freed.count(), 1);
        drop(value);
        assert_eq!(freed.none_by(Instant::now() + Duration::from_secs(600)).await, Ok(()));
        assert_ne!(dropped_on.recv().unwrap(), std::thread::current().id(), "not on the thread that let it go");
    }

    #[test]
    fn outside_a_runtime_a_value_is_dropped_in_place() {
        let (sender, dropped_on) = std::sync::mpsc::channel();
        drop(FreedOffThread::new(Dropped(sender)));
        assert_eq!(dropped_on.recv().unwrap(), std::thread::current().id());
    }
}

//! The memory of the HTTP requests in flight: the bodies being read and
//! decoded at once are bounded together (`--http-max-inflight-body-bytes`),
//! and once a large request or a large answer is let go the allocator gives
//! the freed memory back to the system ([`trim_soon`]).
//!
//! A request's decoding costs a multiple of its body (the body, the
//! tensors, the model's own copies), so the body sizes bound it: each
//! inference request reserves its `Content-Length` (or, for a body of
//! unknown length, `--http-max-body-bytes`) before its body is read and
//! holds it until it is answered. A request that does not fit waits for
//! others to finish, up to [`MAX_WAIT`], then gets a 503 with
//! `Retry-After`. Small requests reserve a few kibibytes and never wait
//! behind anything but a full pool.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{Error, Overload};

/// The unit reservations are counted in (semaphore permits are `u32`).
const UNIT: u64 = 1024;

/// How long a request waits for room before its 503.
pub const MAX_WAIT: Duration = Duration::from_secs(10);

/// A request body or an answer at least this large has the allocator
/// trimmed once it is let go.
pub const TRIM_AFTER_BYTES: u64 = 4 << 20;

/// How long a trim waits after it is asked for: what else is let go
/// meanwhile (the rest of a burst of large requests) is given back by the
/// same trim, and trims run at most once per this.
const TRIM_DELAY: Duration = Duration::from_secs(1);

/// A trim is queued or running: more large requests meanwhile need none.
static TRIMMING: AtomicBool = AtomicBool::new(false);

/// Gives the allocator's free memory back to the system [`TRIM_DELAY`]
/// from now, on a blocking thread, unless a trim is already on its way:
/// glibc keeps what a request freed in its arenas otherwise, and the
/// process stays as large as its largest request. Call it after letting go
/// of [`TRIM_AFTER_BYTES`] or more.
pub fn trim_soon() {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    if TRIMMING.swap(true, Ordering::AcqRel) {
        return;
    }
    runtime.spawn(async {
        tokio::time::sleep(TRIM_DELAY).await;
        // Cleared first: what is let go while the trim runs asks for another.
        TRIMMING.store(false, Ordering::Release);
        // SAFETY: malloc_trim has no preconditions; it only returns free
        // pages of the heap to the system.
        let _ = tokio::task::spawn_blocking(|| unsafe { libc::malloc_trim(0) }).await;
    });
}

/// The pool of request bytes in flight.
pub struct RequestMemory {
    pool: Arc<Semaphore>,
    /// The pool's size, in bytes.
    bytes: u64,
}

impl RequestMemory {
    /// A pool of `bytes` (at least one unit, at most `u32::MAX` units).
    pub fn new(bytes: u64) -> RequestMemory {
        let units = bytes.div_ceil(UNIT).clamp(1, u64::from(u32::MAX));
        let bytes = units * UNIT;
        RequestMemory { pool: Arc::new(Semaphore::new(units as usize)), bytes }
    }

    /// Reserves `bytes` of the pool until the permit drops, waiting up to
    /// [`MAX_WAIT`] for room.
    ///
    /// # Errors
    /// [`Error::Overloaded`] (503, `Retry-After`) when there is no room by
    /// then; [`Error::InvalidArgument`] for more than the whole pool.
    pub async fn reserve(&self, bytes: u64) -> Result<OwnedSemaphorePermit, Error> {
        if bytes > self.bytes {
            return Err(self.too_large(bytes));
        }
        // At most the pool's units, which fit in a u32.
        let units = u32::try_from(bytes.div_ceil(UNIT).max(1)).unwrap_or(u32::MAX);
        match tokio::time::timeout(MAX_WAIT, self.pool.clone().acquire_many_owned(units)).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(Error::Overloaded(Overload {
                message: format!(
                    "the server is reading and decoding {} of request bodies at once, its most \
                     (--http-max-inflight-body-bytes); retry shortly",
                    bytesize::ByteSize::b(self.bytes)
                ),
                retry_after_secs: 1,
            })),
        }
    }

    fn too_large(&self, bytes: u64) -> Error {
        Error::InvalidArgument(format!(
            "a request body of {bytes} bytes is more than the {} bytes of request bodies the server reads at once \
             (--http-max-inflight-body-bytes)",
            self.bytes
        ))
    }

    /// After the answer to a request whose body was `bytes`: its decoding
    /// is let go, so for a large one the allocator is trimmed.
    pub fn answered(&self, bytes: u64) {
        if bytes >= TRIM_AFTER_BYTES {
            trim_soon();
        }
    }
}

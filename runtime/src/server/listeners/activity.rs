//! What a connection is serving, so that one left idle is closed: a
//! request counts from its arrival until its answer's body has been taken
//! whole by the connection (or dropped), so an open stream (gRPC
//! `ModelStreamInfer`, an answer that waits for HTTP/2 window) keeps its
//! connection busy, and a connection that only answers pings does not.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use http_body::{Body, Frame, SizeHint};
use parking_lot::Mutex;
use tokio::time::Instant;

/// The requests of one connection.
#[derive(Debug)]
pub(crate) struct Activity {
    /// Requests whose answers are not yet taken whole.
    open: AtomicUsize,
    /// When the last request ended (or the connection opened).
    last: Mutex<Instant>,
}

impl Activity {
    /// A connection opened now, serving nothing yet.
    pub(super) fn new() -> Arc<Activity> {
        Arc::new(Activity { open: AtomicUsize::new(0), last: Mutex::new(Instant::now()) })
    }

    /// Counts a request from now until the guard drops.
    pub(crate) fn begin(self: &Arc<Self>) -> Busy {
        self.open.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }

    /// How long the connection has served nothing; `None` while it serves
    /// a request.
    pub(super) fn idle_for(&self, now: Instant) -> Option<Duration> {
        let last = *self.last.lock();
        (self.open.load(Ordering::Acquire) == 0).then(|| now.saturating_duration_since(last))
    }
}

/// A request being served; the connection is busy until it drops.
#[derive(Debug)]
pub(crate) struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        *self.0.last.lock() = Instant::now();
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An answer's body that keeps its request counted ([`Busy`]) until the
/// body ends or is dropped; a large one has the allocator trimmed when it
/// is dropped (sent, or thrown away with a connection that would not read
/// it).
pub(crate) struct Tracked<B> {
    body: B,
    busy: Option<Busy>,
    large: bool,
}

impl<B: Body> Tracked<B> {
    /// `body`, counted by `busy` (none: not counted).
    pub(crate) fn new(body: B, busy: Option<Busy>) -> Tracked<B> {
        let large = body.size_hint().lower() >= crate::server::memory::TRIM_AFTER_BYTES;
        Tracked { body, busy, large }
    }
}

impl<B> Drop for Tracked<B> {
    fn drop(&mut self) {
        if self.large {
            crate::server::memory::trim_soon();
        }
    }
}

/// An empty body, counted by nothing (what a layer answers on its own).
impl<B: Body + Default> Default for Tracked<B> {
    fn default() -> Tracked<B> {
        Tracked::new(B::default(), None)
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Tracked<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(None | Some(Err(_))) = polled {
            self.busy = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// What a connection tells the requests tonic serves on it (tonic puts it
/// in each request's extensions): its [`Activity`].
#[derive(Clone, Debug)]
pub(crate) struct ConnInfo {
    /// The connection's requests.
    pub activity: Arc<Activity>,
}

/// The tower layer that counts each gRPC request in its connection's
/// [`Activity`] until its answer's body ends.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TrackLayer;

impl<S> tower::Layer<S> for TrackLayer {
    type Service = Track<S>;

    fn layer(&self, inner: S) -> Track<S> {
        Track(inner)
    }
}

/// See [`TrackLayer`].
#[derive(Clone, Debug)]
pub(crate) struct Track<S>(S);

impl<S, B, R> tower::Service<http::Request<B>> for Track<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    R: Body,
    S::Future: Send + 'static,
{
    type Response = http::Response<Tracked<R>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let busy = request.extensions().get::<ConnInfo>().map(|info| info.activity.begin());
        let answer = self.0.call(request);
        Box::pin(async move { Ok(answer.await?.map(|body| Tracked::new(body, busy))) })
    }
}

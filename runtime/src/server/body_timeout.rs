//! A request body that must keep arriving: each piece must come within a
//! timeout of the one before (`--http-body-read-timeout`), like nginx's
//! `client_body_timeout`, and, once it has been arriving that long, at an
//! average of at least `--http-body-min-rate` bytes per second, so a
//! client that announces a body and then sends nothing, or a byte now and
//! then, does not hold its request and its connection for ever. The clock
//! runs only while the server reads the body.

use std::error::Error as StdError;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::{Bytes, HttpBody};
use http_body::Frame;
use tokio::time::{Instant, Sleep};

/// How a request body must arrive.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// The longest pause between two pieces (`--http-body-read-timeout`).
    pub pause: Duration,
    /// The slowest average, in bytes per second, once the body has been
    /// arriving for `pause` (`--http-body-min-rate`; 0: none).
    pub min_rate: u64,
}

/// The body `B`, failing with [`BodyStalled`] when it does not arrive at
/// its [`Pace`].
pub struct IdleTimeout<B> {
    body: Pin<Box<B>>,
    pace: Pace,
    /// Running while a read waits for the next piece.
    sleep: Option<Pin<Box<Sleep>>>,
    /// When the first read began, and the bytes read since.
    started: Option<Instant>,
    read: u64,
}

impl<B> IdleTimeout<B> {
    /// `body`, held to `pace`.
    pub fn new(body: B, pace: Pace) -> IdleTimeout<B> {
        IdleTimeout { body: Box::pin(body), pace, sleep: None, started: None, read: 0 }
    }

    /// The error when the bytes read so far are too few for the time
    /// taken, past the first `pause`.
    fn too_slow(&self, now: Instant) -> Option<BodyStalled> {
        let elapsed = now.saturating_duration_since(self.started?);
        let min_rate = self.pace.min_rate;
        let slow = elapsed > self.pace.pause && (self.read as f64) < min_rate as f64 * elapsed.as_secs_f64();
        slow.then_some(BodyStalled::TooSlow { read: self.read, elapsed, min_rate })
    }
}

/// A request body did not arrive at its pace. Answered 408.
#[derive(Debug, thiserror::Error)]
pub enum BodyStalled {
    /// Nothing arrived for this long.
    #[error("the request body stopped arriving: no byte for {} s (--http-body-read-timeout)", .0.as_secs_f64())]
    Stopped(Duration),
    /// `read` bytes arrived in `elapsed`, less than `min_rate` a second.
    #[error(
        "the request body arrives too slowly: {read} bytes in {:.0} s, less than {min_rate} bytes a second (--http-body-min-rate)",
        .elapsed.as_secs_f64()
    )]
    TooSlow {
        /// Bytes read so far.
        read: u64,
        /// Since the first read.
        elapsed: Duration,
        /// The rate required.
        min_rate: u64,
    },
}

impl<B> HttpBody for IdleTimeout<B>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn StdError + Send + Sync>;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let now = Instant::now();
        this.started.get_or_insert(now);
        if let Poll::Ready(frame) = this.body.as_mut().poll_frame(cx) {
            this.sleep = None;
            if let Some(Ok(data)) = frame.as_ref().map(|f| f.as_ref().map(Frame::data_ref)) {
                this.read += data.map_or(0, |d| d.len() as u64);
                if let Some(slow) = this.too_slow(now) {
                    return Poll::Ready(Some(Err(Box::new(slow))));
                }
            }
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let pause = this.pace.pause;
        let sleep = this.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep(pause)));
        ready!(sleep.as_mut().poll(cx));
        this.sleep = None;
        Poll::Ready(Some(Err(Box::new(BodyStalled::Stopped(pause)))))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The [`BodyStalled`] somewhere in `error`'s chain of sources, if any
/// (the body's error reaches a handler wrapped by every layer it went
/// through).
pub fn stalled<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a BodyStalled> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(stalled) = error.downcast_ref::<BodyStalled>() {
            return Some(stalled);
        }
        next = error.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::extract::FromRequest;
    use axum::extract::rejection::BytesRejection;

    use super::*;

    /// A body whose sender sends `first` and then nothing.
    fn stalling(first: &'static [u8]) -> (Body, tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>) {
        let (sender, receiver) = tokio::sync::mpsc::channel(4);
        sender.try_send(Ok(Bytes::from_static(first))).unwrap();
        let stream = tokio_stream::wrappers::ReceiverStream::new(receiver);
        (Body::from_stream(stream), sender)
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stops_arriving_fails_naming_the_flag_through_axum_s_extractor() {
        let (body, _sender) = stalling(b"{\"inputs\": [");
        let timed = Body::new(IdleTimeout::new(body, Pace { pause: Duration::from_secs(30), min_rate: 0 }));
        let request = axum::http::Request::builder().body(timed).unwrap();
        let rejection: BytesRejection = Bytes::from_request(request, &()).await.unwrap_err();
        let found = stalled(&rejection).expect("the stall is found through axum's rejection");
        assert!(matches!(found, BodyStalled::Stopped(d) if *d == Duration::from_secs(30)));
        assert_eq!(found.to_string(), "the request body stopped arriving: no byte for 30 s (--http-body-read-timeout)");
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_keeps_arriving_is_read_whole() {
        let (body, sender) = stalling(b"a");
        let feeder = tokio::spawn(async move {
            for piece in [b"b", b"c"] {
                // Each piece within the timeout, the whole body beyond it.
                tokio::time::sleep(Duration::from_secs(20)).await;
                sender.send(Ok(Bytes::from_static(piece))).await.unwrap();
            }
        });
        let timed = Body::new(IdleTimeout::new(body, Pace { pause: Duration::from_secs(30), min_rate: 0 }));
        let request = axum::http::Request::builder().body(timed).unwrap();
        let read = Bytes::from_request(request, &()).await.unwrap();
        assert_eq!(&read[..], b"abc");
        feeder.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_trickles_below_the_minimum_rate_fails_naming_the_flag() {
        let (body, sender) = stalling(b"a");
        let feeder = tokio::spawn(async move {
            // A byte every 20 s: no pause reaches the timeout.
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_secs(20)).await;
                if sender.send(Ok(Bytes::from_static(b"b"))).await.is_err() {
                    return;
                }
            }
        });
        let timed = Body::new(IdleTimeout::new(body, Pace { pause: Duration::from_secs(30), min_rate: 1 }));
        let request = axum::http::Request::builder().body(timed).unwrap();
        let rejection: BytesRejection = Bytes::from_request(request, &()).await.unwrap_err();
        let found = stalled(&rejection).expect("the slow body is found through axum's rejection");
        assert_eq!(
            found.to_string(),
            "the request body arrives too slowly: 3 bytes in 40 s, less than 1 bytes a second (--http-body-min-rate)"
        );
        feeder.abort();
    }
}

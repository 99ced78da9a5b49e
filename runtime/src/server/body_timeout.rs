//! A request body that must keep arriving: each piece must come within a
//! timeout of the one before (`--http-body-read-timeout`), like nginx's
//! `client_body_timeout`, so a client that announces a body and then sends
//! nothing, or a byte now and then, does not hold its request and its
//! connection for ever. The clock runs only while the server reads the body.

use std::error::Error as StdError;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::{Bytes, HttpBody};
use http_body::Frame;
use tokio::time::Sleep;

/// The body `B`, failing with [`BodyStalled`] when no piece of it arrives
/// within `timeout` of the previous one (or of the first read).
pub struct IdleTimeout<B> {
    body: Pin<Box<B>>,
    timeout: Duration,
    /// Running while a read waits for the next piece.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<B> IdleTimeout<B> {
    /// `body`, with at most `timeout` between two of its pieces.
    pub fn new(body: B, timeout: Duration) -> IdleTimeout<B> {
        IdleTimeout { body: Box::pin(body), timeout, sleep: None }
    }
}

/// A request body stopped arriving: nothing for the timeout. Answered 408.
#[derive(Debug, thiserror::Error)]
#[error("the request body stopped arriving: no byte for {} s (--http-body-read-timeout)", .timeout.as_secs_f64())]
pub struct BodyStalled {
    /// The timeout that passed.
    pub timeout: Duration,
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
        if let Poll::Ready(frame) = this.body.as_mut().poll_frame(cx) {
            this.sleep = None;
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let timeout = this.timeout;
        let sleep = this.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        ready!(sleep.as_mut().poll(cx));
        this.sleep = None;
        Poll::Ready(Some(Err(Box::new(BodyStalled { timeout }))))
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
        let timed = Body::new(IdleTimeout::new(body, Duration::from_secs(30)));
        let request = axum::http::Request::builder().body(timed).unwrap();
        let rejection: BytesRejection = Bytes::from_request(request, &()).await.unwrap_err();
        let found = stalled(&rejection).expect("the stall is found through axum's rejection");
        assert_eq!(found.timeout, Duration::from_secs(30));
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
        let timed = Body::new(IdleTimeout::new(body, Duration::from_secs(30)));
        let request = axum::http::Request::builder().body(timed).unwrap();
        let read = Bytes::from_request(request, &()).await.unwrap();
        assert_eq!(&read[..], b"abc");
        feeder.await.unwrap();
    }
}

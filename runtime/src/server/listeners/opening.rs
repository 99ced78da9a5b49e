//! The opening of a connection: the bytes a client must send, within the
//! listener's handshake timeout, before the protocol's own timers take
//! over. An HTTP/1 client's opening is its first byte (hyper's header read
//! timeout runs from there); an HTTP/2 client's (gRPC, or HTTP/2 with
//! prior knowledge) is the connection preface and its first SETTINGS frame,
//! after which the HTTP/2 keepalive pings run. Without it, a client that
//! connects and sends nothing, or half a preface, would hold its
//! connection for ever: neither hyper nor tonic times that out.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// The HTTP/2 client connection preface (RFC 9113, section 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An HTTP/2 frame header: length (3 bytes), type, flags, stream id.
const FRAME_HEADER: usize = 9;
/// HTTP/2's initial largest frame payload: a SETTINGS frame announcing more
/// is refused by the server's HTTP/2 code as soon as its header is read.
const MAX_FIRST_FRAME: usize = 16_384;
/// The preface and the first frame's header.
const HEAD: usize = PREFACE.len() + FRAME_HEADER;

/// A connection's opening, until it is complete or its deadline passes.
pub(super) struct Opening {
    deadline: Pin<Box<Sleep>>,
    /// The timeout the deadline stands for (for the message).
    timeout: Duration,
    /// The first [`HEAD`] bytes read.
    head: [u8; HEAD],
    /// Every byte read so far.
    read: usize,
}

impl Opening {
    /// An opening due by `deadline`, the end of `timeout`.
    pub(super) fn new(deadline: Instant, timeout: Duration) -> Opening {
        Opening { deadline: Box::pin(tokio::time::sleep_until(deadline)), timeout, head: [0; HEAD], read: 0 }
    }

    /// The timeout the opening is held to.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Counts `bytes`, just read; true once the opening is complete.
    pub(super) fn read(&mut self, bytes: &[u8]) -> bool {
        let kept = self.read.min(HEAD);
        let take = (HEAD - kept).min(bytes.len());
        self.head[kept..kept + take].copy_from_slice(&bytes[..take]);
        self.read += bytes.len();
        let seen = &self.head[..self.read.min(PREFACE.len())];
        if seen != &PREFACE[..seen.len()] {
            // Not HTTP/2: an HTTP/1 request head has begun.
            return true;
        }
        if self.read < HEAD {
            return false;
        }
        let length = u32::from_be_bytes([0, self.head[24], self.head[25], self.head[26]]) as usize;
        self.read >= HEAD + if length <= MAX_FIRST_FRAME { length } else { 0 }
    }

    /// Ready once the deadline has passed.
    pub(super) fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.deadline.as_mut().poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opening() -> Opening {
        Opening::new(Instant::now(), Duration::from_secs(1))
    }

    #[tokio::test]
    async fn an_http1_opening_is_its_first_byte() {
        let mut o = opening();
        assert!(o.read(b"G"));
        let mut o = opening();
        assert!(!o.read(b""), "nothing yet");
        assert!(o.read(b"POST / HTTP/1.1\r\n"), "diverges from the preface at 'O'");
    }

    #[tokio::test]
    async fn an_http2_opening_is_the_preface_and_the_first_settings_frame() {
        let settings = [0, 0, 12, 4, 0, 0, 0, 0, 0];
        let mut o = opening();
        assert!(!o.read(&PREFACE[..10]), "half a preface");
        assert!(!o.read(&PREFACE[10..]), "the preface alone");
        assert!(!o.read(&settings[..5]));
        assert!(!o.read(&settings[5..]), "the frame's header, not its 12 bytes");
        assert!(!o.read(&[0; 11]));
        assert!(o.read(&[0; 1]));
        let mut o = opening();
        let mut all = PREFACE.to_vec();
        all.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        assert!(o.read(&all), "an empty SETTINGS frame in the same read");
        let mut o = opening();
        let mut huge = PREFACE.to_vec();
        huge.extend_from_slice(&[0xff, 0xff, 0xff, 4, 0, 0, 0, 0, 0]);
        assert!(o.read(&huge), "a frame too large is refused by HTTP/2 itself");
    }
}

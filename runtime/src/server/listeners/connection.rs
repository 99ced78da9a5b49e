//! An accepted connection as the servers read and write it: counted fresh
//! until its first read (shutdown waits for that) and open until dropped
//! (the listener's connection limit), held to its opening deadline, closed
//! with a linger so a client's unread bytes never reset the answer, and,
//! over HTTP, hyper's bodyless error answers given a JSON body and each
//! request head kept within hyper's limit.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::Connected;

use super::acceptor::Accepted;
use super::activity::{Activity, ConnInfo};
use super::opening::Opening;
use super::report::Reporting;
use super::transport::Transport;
use crate::drain::Hold;
use crate::metrics::{OpenConnection, SlowClient};

/// How long a connection the server closes keeps reading, and discarding,
/// what its client still sends (a body the answer made moot, such as that
/// of a 413 or a 503): closing a socket with unread data resets it, and
/// the reset can overtake the answer.
const LINGER_ON_CLOSE: Duration = Duration::from_secs(2);

/// An accepted connection: its TCP or TLS stream, plus what shutdown and the
/// connection limit need to know of it, the opening deadline, a lingering
/// close, and (HTTP) hyper's bodyless error answers given a JSON body.
pub(super) struct Conn {
    stream: Transport,
    /// Held until the first read returns: the first request may still be
    /// on its way.
    fresh: Option<Hold>,
    /// Held while the connection is open: the listener's count of them.
    _open: (Hold, OpenConnection),
    /// Until the client has sent its opening: the deadline for it.
    opening: Option<Opening>,
    reporting: Reporting,
    /// Whether writes go through [`crate::server::http::explain_automatic_answer`].
    explain: bool,
    /// An answer written in place of hyper's, and how much of it is out;
    /// once set, everything hyper writes after it is dropped.
    replacement: Option<(Vec<u8>, usize)>,
    /// While closing: when to stop discarding what the client sends.
    linger: Option<Pin<Box<tokio::time::Sleep>>>,
    /// HTTP: keeps each request head within hyper's limit.
    head: Option<crate::server::http::HeadLimit>,
    /// While a write makes no progress: when it fails.
    write_stall: Option<Pin<Box<Sleep>>>,
    /// The requests it serves, and when to look whether it is idle.
    activity: Arc<Activity>,
    idle_check: Pin<Box<Sleep>>,
}

impl Conn {
    /// The connection `accepted`, counted fresh until its first read and
    /// open until dropped, its opening due by `opening`'s deadline;
    /// `explain` gives hyper's bodyless error answers a JSON body (HTTP).
    pub(super) fn new(accepted: Accepted<Transport>, opening: Opening, reporting: Reporting, explain: bool) -> Conn {
        let head = explain.then(crate::server::http::HeadLimit::new);
        let open = reporting.metrics.connections.opened(reporting.listener);
        let idle_check = Box::pin(tokio::time::sleep(reporting.idle_timeout.0));
        Conn {
            stream: accepted.stream,
            fresh: Some(accepted.fresh),
            _open: (accepted.open, open),
            opening: Some(opening),
            reporting,
            explain,
            replacement: None,
            linger: None,
            head,
            write_stall: None,
            activity: Activity::new(),
            idle_check,
        }
    }

    /// The requests the connection serves: each counted there keeps it
    /// from being closed as idle.
    pub(super) fn activity(&self) -> Arc<Activity> {
        self.activity.clone()
    }

    /// `polled`, a write (or flush) of the stream; one that has made no
    /// progress for the write timeout fails instead (counted and logged),
    /// and the server closes the connection, dropping the answer.
    fn watch_write<T>(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.write_stall = None;
            return polled;
        }
        let (timeout, flag) = self.reporting.write_timeout;
        let stall = self.write_stall.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        ready!(stall.as_mut().poll(cx));
        self.write_stall = None;
        let Reporting { listener, metrics, .. } = &self.reporting;
        metrics.connections.slow_client(*listener, SlowClient::Write);
        let message = format!("the client read nothing of an answer for {} s ({flag})", timeout.as_secs_f64());
        tracing::debug!(listener = listener.label(), "{message}");
        Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, message)))
    }

    /// An error once the connection has served no request for the idle
    /// timeout (counted and logged); the read then fails and the server
    /// closes the connection.
    fn poll_idle_expired(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        let (timeout, flag) = self.reporting.idle_timeout;
        while self.idle_check.as_mut().poll(cx).is_ready() {
            let now = Instant::now();
            match self.activity.idle_for(now) {
                Some(quiet) if quiet >= timeout => {
                    let Reporting { listener, metrics, .. } = &self.reporting;
                    metrics.connections.slow_client(*listener, SlowClient::Idle);
                    let message = format!("the connection served no request for {} s ({flag})", timeout.as_secs_f64());
                    tracing::debug!(listener = listener.label(), "{message}");
                    return Some(io::Error::new(io::ErrorKind::TimedOut, message));
                }
                Some(quiet) => self.idle_check.as_mut().reset(now + (timeout - quiet)),
                None => self.idle_check.as_mut().reset(now + timeout),
            }
        }
        None
    }

    /// Whether `written`, hyper's next write, is one of its bodyless error
    /// answers; if so it is replaced, from now on. `line_ended`: whether
    /// the head it answers had a whole request line.
    fn replaces(&mut self, written: &[u8], line_ended: bool) -> bool {
        if self.replacement.is_none()
            && self.explain
            && let Some(answer) = crate::server::http::explain_automatic_answer(written, line_ended)
        {
            self.replacement = Some((answer, 0));
        }
        self.replacement.is_some()
    }

    /// An answer is being written: the next bytes read start a new head.
    /// Returns whether the head read before had a whole request line.
    fn answering(&mut self) -> bool {
        let head = self.head.as_mut();
        let line_ended = head.as_ref().is_none_or(|h| h.request_line_ended());
        if let Some(head) = head {
            head.answering();
        }
        line_ended
    }

    /// Writes what is left of the replacement answer.
    fn poll_replacement(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((answer, written)) = &mut self.replacement
            && *written < answer.len()
        {
            let n = ready!(Pin::new(&mut self.stream).poll_write(cx, &answer[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(()))
    }

    /// An error once the opening's deadline has passed before the client
    /// sent it (counted and logged); the read then fails and the server
    /// closes the connection.
    fn poll_opening_expired(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        let opening = self.opening.as_mut()?;
        if opening.poll_expired(cx).is_pending() {
            return None;
        }
        let timeout = opening.timeout();
        self.opening = None;
        let Reporting { listener, metrics, opening_flag, .. } = &self.reporting;
        metrics.connections.slow_client(*listener, SlowClient::Handshake);
        let message =
            format!("the client did not open the connection within {} s ({opening_flag})", timeout.as_secs_f64());
        tracing::debug!(listener = listener.label(), "{message}");
        Some(io::Error::new(io::ErrorKind::TimedOut, message))
    }
}

impl AsyncRead for Conn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if let Some(expired) = self.poll_opening_expired(cx).or_else(|| self.poll_idle_expired(cx)) {
            return Poll::Ready(Err(expired));
        }
        let cap = self.head.and_then(|h| h.cap()).filter(|&cap| cap < buf.remaining());
        let before = buf.filled().len();
        let read = match cap {
            None => ready!(Pin::new(&mut self.stream).poll_read(cx, buf)),
            Some(cap) => {
                let mut capped = buf.take(cap);
                let read = ready!(Pin::new(&mut self.stream).poll_read(cx, &mut capped));
                let n = capped.filled().len();
                // SAFETY: the stream filled (so initialised) the first `n`
                // bytes of `buf`'s unfilled part, through `capped`.
                unsafe { buf.assume_init(n) };
                buf.advance(n);
                read
            }
        };
        let read_now = &buf.filled()[before..];
        if let Some(head) = &mut self.head {
            head.read(read_now);
        }
        if let Some(opening) = &mut self.opening
            && opening.read(read_now)
        {
            self.opening = None;
        }
        // The connection is no longer fresh.
        self.fresh = None;
        Poll::Ready(read)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let line_ended = self.answering();
        if self.replaces(buf, line_ended) {
            ready!(self.poll_replacement(cx))?;
            return Poll::Ready(Ok(buf.len()));
        }
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.watch_write(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // hyper writes an answer's head as the first buffer, and its
        // automatic answers as a head alone.
        let line_ended = self.answering();
        let total = bufs.iter().map(|b| b.len()).sum();
        let first = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| &b[..]);
        if (first.len() == total && self.replaces(first, line_ended)) || self.replacement.is_some() {
            ready!(self.poll_replacement(cx))?;
            return Poll::Ready(Ok(total));
        }
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.watch_write(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_replacement(cx))?;
        let polled = Pin::new(&mut self.stream).poll_flush(cx);
        self.watch_write(cx, polled)
    }

    /// Sends FIN after the answer, then reads and drops what the client
    /// still sends until it closes too, for at most [`LINGER_ON_CLOSE`].
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_replacement(cx))?;
        let this = &mut *self;
        if this.linger.is_none() {
            // A peer that is gone already has nothing more to read either.
            if ready!(Pin::new(&mut this.stream).poll_shutdown(cx)).is_err() {
                return Poll::Ready(Ok(()));
            }
            this.linger = Some(Box::pin(tokio::time::sleep(LINGER_ON_CLOSE)));
        }
        let mut scratch = [0u8; 4096];
        loop {
            let mut unread = ReadBuf::new(&mut scratch);
            match Pin::new(&mut this.stream).poll_read(cx, &mut unread) {
                Poll::Ready(Ok(())) if !unread.filled().is_empty() => {}
                Poll::Ready(_) => return Poll::Ready(Ok(())),
                Poll::Pending => break,
            }
        }
        match this.linger.as_mut() {
            Some(linger) => linger.as_mut().poll(cx).map(Ok),
            None => Poll::Ready(Ok(())),
        }
    }
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        ConnInfo { activity: self.activity.clone() }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use tokio::net::TcpListener;

    use std::sync::Arc;

    use super::*;
    use crate::drain::InUse;
    use crate::metrics::{Listener, Metrics};

    const HYPER_400: &[u8] =
        b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\ndate: Wed, 02 Dec 2026 19:59:19 GMT\r\n\r\n";

    /// A connected pair: the client's std stream and the server's `Conn`,
    /// and the count of fresh connections.
    async fn pair(explain: bool) -> (std::net::TcpStream, Conn, InUse) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let fresh = InUse::default();
        let at = tokio::time::Instant::now();
        let accepted =
            Accepted { stream: Transport::Plain(stream), fresh: fresh.hold(), open: InUse::default().hold(), at };
        let opening = Opening::new(at + Duration::from_secs(600), Duration::from_secs(600));
        let reporting = Reporting::patient(Listener::Http, &Arc::new(Metrics::new()), "--http-header-read-timeout");
        (client, Conn::new(accepted, opening, reporting, explain), fresh)
    }

    /// Everything the client reads until the server closes.
    fn read_all(mut client: std::net::TcpStream) -> Vec<u8> {
        let mut received = Vec::new();
        client.read_to_end(&mut received).unwrap();
        received
    }

    #[tokio::test]
    async fn hyper_s_bodyless_error_answer_goes_out_with_a_json_body() {
        let (client, mut conn, _) = pair(true).await;
        let reader = std::thread::spawn(move || read_all(client));
        conn.write_all(HYPER_400).await.unwrap();
        conn.shutdown().await.unwrap();
        let received = String::from_utf8(reader.join().unwrap()).unwrap();
        let (head, body) = received.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{head}");
        assert!(head.contains("\r\ncontent-type: application/json\r\n"), "{head}");
        assert!(head.contains("\r\ndate: Wed, 02 Dec 2026 19:59:19 GMT"), "{head}");
        assert!(head.contains(&format!("\r\ncontent-length: {}", body.len())), "{head}");
        let error: serde_json::Value = serde_json::from_str(body).unwrap();
        assert!(error["error"].as_str().unwrap().starts_with("malformed HTTP/1.1 request"), "{body}");
    }

    #[tokio::test]
    async fn other_writes_and_other_servers_go_out_as_they_are() {
        // An answer of ours; hyper's error head with a body after it; on
        // gRPC, no write is looked at.
        let ours =
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}".to_vec();
        let mut with_body = HYPER_400.to_vec();
        with_body.extend_from_slice(b"x");
        for (explain, written) in [(true, ours), (true, with_body), (false, HYPER_400.to_vec())] {
            let (client, mut conn, _) = pair(explain).await;
            let reader = std::thread::spawn(move || read_all(client));
            conn.write_all(&written).await.unwrap();
            conn.shutdown().await.unwrap();
            assert_eq!(reader.join().unwrap(), written);
        }
    }

    #[tokio::test]
    async fn a_connection_is_fresh_until_its_first_read() {
        let (mut client, mut conn, accepted) = pair(true).await;
        assert_eq!(accepted.count(), 1);
        client.write_all(b"GET").unwrap();
        let mut got = [0u8; 3];
        conn.read_exact(&mut got).await.unwrap();
        assert_eq!(accepted.count(), 0);
        drop(conn);
        assert_eq!(accepted.count(), 0, "counted once");
        let (_client, conn, accepted) = pair(true).await;
        drop(conn);
        assert_eq!(accepted.count(), 0, "a connection closed unread is no longer waited for");
    }

    #[tokio::test]
    async fn a_connection_that_does_not_open_in_time_fails_its_read_and_is_counted() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let at = tokio::time::Instant::now();
        let accepted = Accepted {
            stream: Transport::Plain(stream),
            fresh: InUse::default().hold(),
            open: InUse::default().hold(),
            at,
        };
        let metrics = Arc::new(Metrics::new());
        let reporting = Reporting::patient(Listener::Grpc, &metrics, "--grpc-handshake-timeout");
        let mut conn = Conn::new(accepted, Opening::new(at, Duration::from_millis(1)), reporting, false);
        // Half an HTTP/2 preface, then nothing.
        client.write_all(b"PRI * HTTP/2.0\r\n").unwrap();
        let mut buf = [0u8; 64];
        let mut read = 0;
        let error = loop {
            match conn.read(&mut buf).await {
                Ok(n) => read += n,
                Err(e) => break e,
            }
        };
        assert!(read <= 16);
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(error.to_string().contains("(--grpc-handshake-timeout)"), "{error}");
        let text = metrics.render();
        assert!(
            text.contains("plinth_connections_slow_client_total{listener=\"grpc\",reason=\"handshake_timeout\"} 1"),
            "{text}"
        );
    }
}

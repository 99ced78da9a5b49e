//! What a connection's bytes travel over: TCP, or TLS over TCP once the
//! handshake is done. The handshake must end by the connection's opening
//! deadline; one that fails (no client certificate under mutual TLS, not
//! TLS at all) or takes longer closes the connection and is counted.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;

use super::acceptor::Accepted;
use super::report::Reporting;
use crate::metrics::SlowClient;
use crate::server::tls::Tls;

/// A connection's stream: plain TCP or TLS.
pub(super) enum Transport {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS, handshake done.
    Tls(Box<TlsStream<TcpStream>>),
}

/// `accepted` as it will be served: over TLS when `tls` is set, once the
/// handshake is done, which must be by `deadline`; `None` when the
/// handshake failed or took longer (counted, and logged at debug level).
pub(super) async fn secure(
    accepted: Accepted,
    tls: Option<&Tls>,
    deadline: Instant,
    reporting: &Reporting,
) -> Option<Accepted<Transport>> {
    let Some(tls) = tls else {
        return Some(accepted.map(Transport::Plain));
    };
    let Accepted { stream, fresh, open, at } = accepted;
    let listener = reporting.listener;
    match tokio::time::timeout_at(deadline, tls.acceptor().accept(stream)).await {
        Ok(Ok(stream)) => Some(Accepted { stream: Transport::Tls(Box::new(stream)), fresh, open, at }),
        Ok(Err(e)) => {
            reporting.metrics.connections.tls_failed(listener);
            tracing::debug!(listener = listener.label(), "TLS handshake failed: {e}");
            None
        }
        Err(_) => {
            reporting.metrics.connections.slow_client(listener, SlowClient::Handshake);
            tracing::debug!(
                listener = listener.label(),
                "the client did not finish its TLS handshake in time ({})",
                reporting.opening_flag
            );
            None
        }
    }
}

impl AsyncRead for Transport {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Transport {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Transport::Plain(s) => s.is_write_vectored(),
            Transport::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_flush(cx),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    /// TLS: sends close_notify, then closes the TCP stream's writing side.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Transport::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

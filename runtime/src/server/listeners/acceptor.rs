//! Accepting connections so that shutdown never resets one: a closing
//! listener first stops answering handshakes, accepts what the kernel
//! already took, and only then closes its socket.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::connection::Conn;
use crate::drain::InUse;

/// How long a closing listener, no longer answering new handshakes, still
/// accepts: a handshake it answered just before completes within one round
/// trip, and would be reset if the socket closed first.
const HANDSHAKE_LINGER: Duration = Duration::from_millis(250);

/// Which server an [`Acceptor`] accepts for.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Kind {
    /// HTTP/1 (and HTTP/2) through hyper: hyper's bodyless error answers
    /// are given a JSON body.
    Http,
    /// gRPC: TCP_NODELAY, or small answers wait for the peer's delayed ACK (~40 ms).
    Grpc,
}

/// The other side of an [`Acceptor`]: tells it to close, hears when it
/// has, and counts the connections it took that have sent nothing yet.
pub(super) struct Controls {
    /// Set to true to close the listener.
    pub close: watch::Sender<bool>,
    /// Answers once the listening socket is closed.
    pub closed: oneshot::Receiver<()>,
    /// The connections accepted that have not been read from.
    pub fresh: InUse,
}

/// Accepts the connections of one listening socket until told to close it;
/// then it makes the kernel drop new handshakes (clients see the port
/// refused when they retry), keeps accepting for [`HANDSHAKE_LINGER`],
/// takes every connection still queued and closes the socket, so that no
/// connection the kernel completed is reset by the close.
pub(super) struct Acceptor {
    listener: Option<TcpListener>,
    addr: SocketAddr,
    kind: Kind,
    close: watch::Receiver<bool>,
    closed: Option<oneshot::Sender<()>>,
    /// Set once told to close: when the socket closes.
    close_at: Option<Instant>,
    /// Connections taken from the queue at close, not yet handed out.
    queue: VecDeque<(Conn, SocketAddr)>,
    fresh: InUse,
}

/// What woke an [`Acceptor`].
enum Event {
    Accepted(io::Result<(TcpStream, SocketAddr)>),
    Close,
    CloseNow,
}

impl Acceptor {
    /// An acceptor of `listener` for `kind`, and its controls.
    ///
    /// # Errors
    /// When the socket's address cannot be read.
    pub(super) fn new(listener: TcpListener, kind: Kind) -> Result<(Acceptor, Controls), String> {
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let (close, close_rx) = watch::channel(false);
        let (closed_tx, closed) = oneshot::channel();
        let fresh = InUse::default();
        let acceptor = Acceptor {
            listener: Some(listener),
            addr,
            kind,
            close: close_rx,
            closed: Some(closed_tx),
            close_at: None,
            queue: VecDeque::new(),
            fresh: fresh.clone(),
        };
        Ok((acceptor, Controls { close, closed, fresh }))
    }

    /// The next connection; after the socket closed, never.
    pub(super) async fn next(&mut self) -> (Conn, SocketAddr) {
        loop {
            if let Some(next) = self.queue.pop_front() {
                return next;
            }
            let Some(listener) = &self.listener else {
                return std::future::pending().await;
            };
            let event = match self.close_at {
                None => tokio::select! {
                    accepted = listener.accept() => Event::Accepted(accepted),
                    _ = self.close.wait_for(|close| *close) => Event::Close,
                },
                Some(at) => tokio::select! {
                    accepted = listener.accept() => Event::Accepted(accepted),
                    () = tokio::time::sleep_until(at) => Event::CloseNow,
                },
            };
            match event {
                Event::Accepted(Ok((stream, addr))) => return (self.conn(stream), addr),
                Event::Accepted(Err(e)) => accept_error(e).await,
                Event::Close => {
                    refuse_handshakes(listener);
                    self.close_at = Some(Instant::now() + HANDSHAKE_LINGER);
                }
                Event::CloseNow => self.close_now(),
            }
        }
    }

    fn conn(&self, stream: TcpStream) -> Conn {
        if self.kind == Kind::Grpc {
            let _ = stream.set_nodelay(true);
        }
        Conn::new(stream, self.fresh.hold(), self.kind == Kind::Http)
    }

    /// Takes every connection still queued, then closes the socket.
    fn close_now(&mut self) {
        let Some(listener) = self.listener.take() else { return };
        match listener.into_std() {
            Ok(listener) => loop {
                match listener.accept() {
                    Ok((stream, addr)) => {
                        match stream.set_nonblocking(true).and_then(|()| TcpStream::from_std(stream)) {
                            Ok(stream) => {
                                let conn = self.conn(stream);
                                self.queue.push_back((conn, addr));
                            }
                            Err(e) => tracing::warn!("cannot serve a connection accepted at shutdown: {e}"),
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if is_connection_error(&e) || e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        tracing::warn!("accept error while closing the listener: {e}");
                        break;
                    }
                }
            },
            Err(e) => tracing::warn!("cannot take the connections queued at shutdown: {e}"),
        }
        tracing::debug!(address = %self.addr, "listener closed");
        if let Some(closed) = self.closed.take() {
            let _ = closed.send(());
        }
    }
}

impl axum::serve::Listener for Acceptor {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        self.next().await
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

/// As axum's own listener: connection errors are the peer's; others (out
/// of file descriptors) are logged and retried a second later.
async fn accept_error(e: io::Error) {
    if is_connection_error(&e) {
        return;
    }
    tracing::error!("accept error: {e}");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}

/// Makes the kernel drop SYNs to `listener` (a classic BPF socket filter),
/// so no new handshake completes into its accept queue while the queue is
/// emptied; a client's SYN is retried and then finds the port closed. A
/// smaller backlog (a second `listen`) would not do: Linux still admits a
/// connection whenever the queue is empty, and answers with SYN cookies
/// when the SYN queue is full.
#[cfg(target_os = "linux")]
fn refuse_handshakes(listener: &TcpListener) {
    use std::os::fd::AsRawFd;
    // A TCP socket's filter sees a segment from its TCP header: byte 13
    // holds the flags, 0x02 is SYN.
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter { code: code as u16, jt, jf, k };
    let mut program = [
        op(libc::BPF_LD | libc::BPF_B | libc::BPF_ABS, 0, 0, 13),
        op(libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K, 0, 1, 0x02),
        op(libc::BPF_RET | libc::BPF_K, 0, 0, 0),
        op(libc::BPF_RET | libc::BPF_K, 0, 0, u32::MAX),
    ];
    let filter = libc::sock_fprog { len: program.len() as u16, filter: program.as_mut_ptr() };
    // SAFETY: `filter` points at `program`, both alive for the call; the
    // kernel copies the program.
    let rc = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&raw const filter).cast(),
            size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!("cannot stop new handshakes: {}", io::Error::last_os_error());
    }
}

#[cfg(not(target_os = "linux"))]
fn refuse_handshakes(_listener: &TcpListener) {}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use tokio::io::AsyncReadExt;

    use super::*;

    #[tokio::test]
    async fn closing_takes_the_queued_connections_and_then_refuses() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (mut acceptor, mut controls) = Acceptor::new(listener, Kind::Http).unwrap();
        // Completed by the kernel, never accepted: closing the socket now
        // would reset them.
        let mut queued: Vec<_> = (0..3).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
        acceptor.close_now();
        assert!((&mut controls.closed).await.is_ok(), "closing is reported");
        let refused = std::net::TcpStream::connect(addr).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
        assert_eq!(acceptor.queue.len(), 3);
        assert_eq!(controls.fresh.count(), 3, "none sent anything yet");
        for client in &mut queued {
            client.write_all(b"ping").unwrap();
            let (mut conn, _) = acceptor.next().await;
            let mut got = [0u8; 4];
            conn.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"ping", "the queued connection is served");
        }
        assert_eq!(controls.fresh.none_by(Instant::now() + Duration::from_secs(600)).await, Ok(()));
        assert_eq!(controls.fresh.count(), 0);
    }
}

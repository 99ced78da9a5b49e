//! Accepting connections so that shutdown never resets one (a closing
//! listener first stops answering handshakes, accepts what the kernel
//! already took, and only then closes its socket), and no more of them at
//! once than the listener's limit: the excess is closed at accept, so the
//! process keeps descriptors for the connections it serves.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::drain::{Hold, InUse};
use crate::metrics::{Listener, Metrics};

/// How long a closing listener, no longer answering new handshakes, still
/// accepts: a handshake it answered just before completes within one round
/// trip, and would be reset if the socket closed first.
const HANDSHAKE_LINGER: Duration = Duration::from_millis(250);

/// How often, at most, a listener logs the connections it refused at its
/// limit (each line says how many since the last).
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Which server an [`Acceptor`] accepts for.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Kind {
    /// HTTP/1 (and HTTP/2) through hyper, in plain text: a connection
    /// refused at the limit is answered 503 first.
    Http,
    /// HTTPS: a connection refused at the limit is closed.
    Https,
    /// gRPC: TCP_NODELAY, or small answers wait for the peer's delayed ACK
    /// (~40 ms); a connection refused at the limit is closed.
    Grpc,
}

/// How long a connection refused at the limit is kept, after its answer
/// and its FIN, reading and dropping what its client still sends: closing
/// with unread bytes, or before a request still on its way arrives, resets
/// the connection, and the reset can overtake the 503.
const REFUSED_LINGER: Duration = Duration::from_secs(2);

/// Refused connections kept lingering at once, at most; past it one is
/// closed at once (a flood of them must not take the descriptors the
/// limit keeps for the connections served).
const MAX_LINGERING: usize = 64;

/// The answer of a plain HTTP connection refused at the limit.
const REFUSED_ANSWER: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
connection: close\r\nretry-after: 1\r\ncontent-length: 76\r\n\r\n\
{\"error\":\"the server holds its maximum of connections; retry on a new one\"}\n";

/// A connection taken from the kernel, with its places in the listener's
/// counts; `S` is its stream (TCP, until a TLS handshake wraps it).
pub(super) struct Accepted<S = TcpStream> {
    pub stream: S,
    /// Held until the connection's first read (shutdown waits for that).
    pub fresh: Hold,
    /// Held while the connection is open (the listener's limit).
    pub open: Hold,
    /// When it was accepted: its opening deadline counts from here.
    pub at: Instant,
}

impl<S> Accepted<S> {
    /// The same connection over the stream `wrap` makes of its own.
    pub(super) fn map<T>(self, wrap: impl FnOnce(S) -> T) -> Accepted<T> {
        Accepted { stream: wrap(self.stream), fresh: self.fresh, open: self.open, at: self.at }
    }
}

/// How many connections a listener holds at most, and where it reports
/// the ones it refused.
pub(super) struct Limit {
    /// Connections open at once.
    pub max: usize,
    /// The flag that sets `max`, for the log.
    pub flag: &'static str,
    /// The listener, as the metrics name it.
    pub listener: Listener,
    /// Where refusals are counted.
    pub metrics: std::sync::Arc<Metrics>,
}

/// Refusals since the last log line about them.
#[derive(Default)]
struct Refusals {
    logged: Option<Instant>,
    since: u64,
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
    queue: VecDeque<(Accepted, SocketAddr)>,
    fresh: InUse,
    open: InUse,
    limit: Limit,
    refusals: Refusals,
    /// Refused connections lingering now.
    lingering: InUse,
}

/// What woke an [`Acceptor`].
enum Event {
    Accepted(io::Result<(TcpStream, SocketAddr)>),
    Close,
    CloseNow,
}

impl Acceptor {
    /// An acceptor of `listener` for `kind` that holds at most `limit`
    /// connections, and its controls.
    ///
    /// # Errors
    /// When the socket's address cannot be read.
    pub(super) fn new(listener: TcpListener, kind: Kind, limit: Limit) -> Result<(Acceptor, Controls), String> {
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let (close, close_rx) = watch::channel(false);
        let (closed_tx, closed) = oneshot::channel();
        let fresh = InUse::default();
        let open = InUse::default();
        let acceptor = Acceptor {
            listener: Some(listener),
            addr,
            kind,
            close: close_rx,
            closed: Some(closed_tx),
            close_at: None,
            queue: VecDeque::new(),
            fresh: fresh.clone(),
            open: open.clone(),
            limit,
            refusals: Refusals::default(),
            lingering: InUse::default(),
        };
        Ok((acceptor, Controls { close, closed, fresh }))
    }

    /// The next connection within the limit; after the socket closed, never.
    pub(super) async fn next(&mut self) -> (Accepted, SocketAddr) {
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
                Event::Accepted(Ok((stream, addr))) => {
                    if self.open.count() >= self.limit.max {
                        self.refuse(stream);
                        continue;
                    }
                    return (self.accepted(stream), addr);
                }
                Event::Accepted(Err(e)) => accept_error(e).await,
                Event::Close => {
                    refuse_handshakes(listener);
                    self.close_at = Some(Instant::now() + HANDSHAKE_LINGER);
                }
                Event::CloseNow => self.close_now(),
            }
        }
    }

    fn accepted(&self, stream: TcpStream) -> Accepted {
        if self.kind == Kind::Grpc {
            let _ = stream.set_nodelay(true);
        }
        Accepted { stream, fresh: self.fresh.hold(), open: self.open.hold(), at: Instant::now() }
    }

    /// Closes `stream`, over the limit: a plain HTTP client is answered
    /// 503, then the connection lingers (see [`linger`]) so that the close
    /// resets nothing, and the refusal is counted and logged (at most once
    /// every [`REFUSAL_LOG_INTERVAL`]).
    fn refuse(&mut self, stream: TcpStream) {
        let answer = (self.kind == Kind::Http).then_some(REFUSED_ANSWER);
        if self.lingering.count() < MAX_LINGERING {
            tokio::spawn(linger(stream, answer, self.lingering.hold()));
        } else {
            let mut scratch = [0u8; 4096];
            while matches!(stream.try_read(&mut scratch), Ok(n) if n > 0) {}
            if let Some(answer) = answer {
                let _ = stream.try_write(answer);
            }
        }
        let Limit { max, flag, listener, metrics } = &self.limit;
        metrics.connections.refused(*listener);
        self.refusals.since += 1;
        let now = Instant::now();
        if self.refusals.logged.is_none_or(|at| now - at >= REFUSAL_LOG_INTERVAL) {
            tracing::warn!(
                listener = listener.label(),
                "refused {} connection(s) at accept: the listener holds its maximum of {max} ({flag})",
                self.refusals.since
            );
            self.refusals = Refusals { logged: Some(now), since: 0 };
        }
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
                                let accepted = self.accepted(stream);
                                self.queue.push_back((accepted, addr));
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

/// Answers a refused connection (`answer`, if any), sends FIN, and reads
/// and drops what the client sends until it closes too, for at most
/// [`REFUSED_LINGER`]; `_lingering` counts it meanwhile.
async fn linger(mut stream: TcpStream, answer: Option<&'static [u8]>, _lingering: Hold) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = tokio::time::timeout(REFUSED_LINGER, async {
        if let Some(answer) = answer {
            stream.write_all(answer).await?;
        }
        stream.shutdown().await?;
        let mut scratch = [0u8; 4096];
        while stream.read(&mut scratch).await? > 0 {}
        Ok::<(), io::Error>(())
    })
    .await;
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
    use std::io::{Read, Write};
    use std::sync::Arc;

    use tokio::io::AsyncReadExt;

    use super::super::connection::Conn;
    use super::super::opening::Opening;
    use super::super::report::Reporting;
    use super::*;

    fn limit(max: usize, metrics: &Arc<Metrics>) -> Limit {
        Limit { max, flag: "--http-max-connections", listener: Listener::Http, metrics: metrics.clone() }
    }

    /// The server's side of `accepted`, as the HTTP server reads it.
    fn conn(accepted: Accepted, metrics: &Arc<Metrics>) -> Conn {
        let accepted = accepted.map(super::super::transport::Transport::Plain);
        let opening = Opening::new(Instant::now() + Duration::from_secs(600), Duration::from_secs(600));
        let reporting = Reporting::patient(Listener::Http, metrics, "--http-header-read-timeout");
        Conn::new(accepted, opening, reporting, true)
    }

    #[tokio::test]
    async fn closing_takes_the_queued_connections_and_then_refuses() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Arc::new(Metrics::new());
        let (mut acceptor, mut controls) = Acceptor::new(listener, Kind::Http, limit(100, &metrics)).unwrap();
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
            let (accepted, _) = acceptor.next().await;
            let mut conn = conn(accepted, &metrics);
            let mut got = [0u8; 4];
            conn.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"ping", "the queued connection is served");
        }
        assert_eq!(controls.fresh.none_by(Instant::now() + Duration::from_secs(600)).await, Ok(()));
        assert_eq!(controls.fresh.count(), 0);
    }

    #[tokio::test]
    async fn connections_over_the_limit_are_answered_503_and_closed_until_one_closes() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Arc::new(Metrics::new());
        let (mut acceptor, _controls) = Acceptor::new(listener, Kind::Http, limit(2, &metrics)).unwrap();
        let _clients: Vec<_> = (0..2).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
        let first = acceptor.next().await.0;
        let _second = acceptor.next().await.0;
        assert_eq!(acceptor.open.count(), 2);
        let mut excess = std::net::TcpStream::connect(addr).unwrap();
        excess.write_all(b"GET /v2/health/ready HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
        let next = tokio::spawn(async move { acceptor.next().await.0 });
        let answer = tokio::task::spawn_blocking(move || {
            let mut answer = String::new();
            excess.read_to_string(&mut answer).map(|_| answer)
        });
        let answer = answer.await.unwrap().unwrap();
        assert!(answer.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{answer}");
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())), "{answer}");
        let error: serde_json::Value = serde_json::from_str(body).unwrap();
        assert!(error["error"].as_str().unwrap().contains("maximum of connections"), "{body}");
        assert!(metrics.render().contains("plinth_connections_refused_total{listener=\"http\"} 1"));
        // Once one closes, the next is taken.
        drop(first);
        let mut later = std::net::TcpStream::connect(addr).unwrap();
        let accepted = next.await.unwrap();
        later.write_all(b"x").unwrap();
        let mut byte = [0u8; 1];
        conn(accepted, &metrics).read_exact(&mut byte).await.unwrap();
        assert_eq!(&byte, b"x", "the connection after the close is served");
    }
}

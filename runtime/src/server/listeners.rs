//! The three listeners: HTTP (the KServe v2 routes), Prometheus metrics,
//! and gRPC (the KServe v2 service, gRPC health and, in modelmesh mode,
//! ModelMesh's runtime interface).
//!
//! HTTP and gRPC accept through an [`Acceptor`], so that shutdown never
//! resets a connection it took: closing a listening socket resets every
//! connection still in the kernel's accept queue, and a server that stops a
//! connection before reading it resets a request already sent. At
//! shutdown each listener first stops answering handshakes, accepts what
//! the kernel already took and only then closes; the servers stop their
//! connections once every connection accepted has sent its first bytes.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::time::Instant;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic_health::ServingStatus;

use super::{ServeOptions, Service, grpc, modelmesh};
use crate::lifecycle::ControlMode;

/// How often the gRPC health service checks readiness.
const HEALTH_INTERVAL: Duration = Duration::from_millis(100);

/// How long a closing listener, no longer answering new handshakes, still
/// accepts: a handshake it answered just before completes within one round
/// trip, and would be reset if the socket closed first.
const HANDSHAKE_LINGER: Duration = Duration::from_millis(250);

/// How long shutdown waits for the connections accepted last to send their
/// first bytes before it stops the servers: a connection stopped before it
/// was read is reset under the request its client already sent. A client
/// sends at once; this only bounds the wait for one that never does.
const FIRST_BYTES_GRACE: Duration = Duration::from_secs(1);

/// How long a connection the server closes keeps reading, and discarding,
/// what its client still sends (a body the answer made moot, such as that
/// of a 413 or a 503): closing a socket with unread data resets it, and
/// the reset can overtake the answer.
const LINGER_ON_CLOSE: Duration = Duration::from_secs(2);

type Serving<E> = tokio::task::JoinHandle<Result<(), E>>;

/// A server task, its acceptor's controls, and the sender that stops its
/// connections gracefully.
struct Running<E> {
    /// Set to true: the acceptor stops taking connections and closes its socket.
    close: watch::Sender<bool>,
    /// Answers once the listening socket is closed.
    closed: oneshot::Receiver<()>,
    /// The acceptor's count of connections not yet read from.
    accepted: Arc<Accepted>,
    /// Starts the graceful shutdown of the server's connections.
    stop: oneshot::Sender<()>,
    task: Serving<E>,
}

impl<E> Running<E> {
    /// Closes the listener as [`Acceptor`] does, and waits until it is
    /// closed and its connections accepted last have sent their first
    /// bytes (at most [`FIRST_BYTES_GRACE`]).
    async fn stop_accepting(&mut self) {
        let _ = self.close.send(true);
        let _ = (&mut self.closed).await;
        self.accepted.first_bytes(Instant::now() + FIRST_BYTES_GRACE).await;
    }

    /// Stops the connections gracefully and waits for them until `deadline`.
    async fn finish(self, deadline: Instant, what: &str) -> Result<(), String>
    where
        E: std::fmt::Display,
    {
        let _ = self.stop.send(());
        match tokio::time::timeout_at(deadline, self.task).await {
            Ok(done) => done.map_err(|e| e.to_string())?.map_err(|e| format!("{what} server failed: {e}")),
            Err(_) => {
                tracing::warn!("exit timeout reached with {what} connections still open; exiting without them");
                Ok(())
            }
        }
    }
}

/// The bound listeners, serving.
pub(super) struct Listeners {
    http: Running<io::Error>,
    grpc: Option<Running<tonic::transport::Error>>,
}

impl Listeners {
    /// Binds and starts every listener `opts` asks for; each logs where it
    /// listens (tests and operators read the port from there).
    ///
    /// # Errors
    /// A message naming the address that cannot be bound.
    pub(super) async fn bind(opts: &ServeOptions, service: &Arc<Service>) -> Result<Listeners, String> {
        let http_addr = SocketAddr::new(opts.http_address, opts.http_port);
        let listener = bind(http_addr, "HTTP").await?;
        tracing::info!("HTTP server listening on {}", local_addr(&listener)?);
        if let Some(port) = opts.metrics_port {
            serve_metrics(SocketAddr::new(opts.http_address, port), service).await?;
        }
        let grpc = match opts.grpc_port {
            Some(port) => Some(serve_grpc(service, SocketAddr::new(opts.grpc_address, port)).await?),
            None => None,
        };
        let (acceptor, controls) = Acceptor::new(listener, Kind::Http)?;
        let app = super::router(service.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(acceptor, app).with_graceful_shutdown(async { stopped.await.unwrap_or(()) }).await
        });
        Ok(Listeners { http: controls.running(stop, task), grpc })
    }

    /// Closes the HTTP and gRPC listeners without resetting a connection
    /// they took, then stops their connections gracefully (requests being
    /// answered finish) and waits for them until `deadline`.
    ///
    /// # Errors
    /// A message when a server failed.
    pub(super) async fn stop(mut self, deadline: Instant) -> Result<(), String> {
        let grpc_closing = async {
            if let Some(grpc) = &mut self.grpc {
                grpc.stop_accepting().await;
            }
        };
        tokio::join!(self.http.stop_accepting(), grpc_closing);
        let grpc_finishing = async {
            match self.grpc {
                Some(grpc) => grpc.finish(deadline, "gRPC").await,
                None => Ok(()),
            }
        };
        let (http, grpc) = tokio::join!(self.http.finish(deadline, "HTTP"), grpc_finishing);
        http.and(grpc)
    }
}

async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener, String> {
    TcpListener::bind(addr).await.map_err(|e| format!("cannot listen on {addr} for {what}: {e}"))
}

fn local_addr(listener: &TcpListener) -> Result<SocketAddr, String> {
    listener.local_addr().map_err(|e| e.to_string())
}

/// `GET /metrics` on its own port, until the process exits.
async fn serve_metrics(addr: SocketAddr, service: &Service) -> Result<(), String> {
    let listener = bind(addr, "metrics").await?;
    tracing::info!("metrics listening on {}", local_addr(&listener)?);
    let metrics = service.lifecycle.metrics().clone();
    let app = Router::new().route("/metrics", get(move || async move { metrics.render() }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(())
}

/// The KServe v2 gRPC service, the standard gRPC health service
/// (`grpc.health.v1.Health`, SERVING while ready) and, in modelmesh mode,
/// ModelMesh's `mmesh.ModelRuntime`.
async fn serve_grpc(service: &Arc<Service>, addr: SocketAddr) -> Result<Running<tonic::transport::Error>, String> {
    use modelmesh::proto::model_runtime_server::ModelRuntimeServer;
    let listener = bind(addr, "gRPC").await?;
    tracing::info!("gRPC server listening on {}", local_addr(&listener)?);
    let mesh = (service.lifecycle.mode() == ControlMode::ModelMesh)
        .then(|| ModelRuntimeServer::new(modelmesh::MeshRuntime { service: service.clone() }));
    let (health, health_service) = tonic_health::server::health_reporter();
    let watched = service.clone();
    tokio::spawn(async move {
        // The health service follows readiness, within HEALTH_INTERVAL.
        let mut reported = None;
        loop {
            let status = if watched.is_ready() { ServingStatus::Serving } else { ServingStatus::NotServing };
            if reported != Some(status) {
                health.set_service_status("", status).await;
                health.set_service_status("inference.GRPCInferenceService", status).await;
                reported = Some(status);
            }
            tokio::time::sleep(HEALTH_INTERVAL).await;
        }
    });
    let (mut acceptor, controls) = Acceptor::new(listener, Kind::Grpc)?;
    // tonic takes a stream of connections; it ends them all once the stream
    // ends, so the stream never does: shutdown goes through `stop`.
    let (connections, incoming) = mpsc::channel::<io::Result<Conn>>(1);
    tokio::spawn(async move {
        loop {
            let conn = tokio::select! {
                (conn, _) = acceptor.next() => conn,
                () = connections.closed() => return,
            };
            if connections.send(Ok(conn)).await.is_err() {
                return;
            }
        }
    });
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(
        tonic::transport::Server::builder()
            // grpc.health.v1 belongs to the `health` group of --grpc-restricted-protocol.
            .layer(grpc::Restricted::layer(service.grpc_restrictions.clone()))
            .layer(grpc::MessageLimit::layer())
            .add_service(health_service)
            .add_service(grpc::inference(service))
            .add_optional_service(mesh)
            .serve_with_incoming_shutdown(tokio_stream::wrappers::ReceiverStream::new(incoming), async {
                stopped.await.unwrap_or(())
            }),
    );
    Ok(controls.running(stop, task))
}

/// Which server an [`Acceptor`] accepts for.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// HTTP/1 (and HTTP/2) through hyper: hyper's bodyless error answers
    /// are given a JSON body.
    Http,
    /// gRPC: TCP_NODELAY, or small answers wait for the peer's delayed ACK (~40 ms).
    Grpc,
}

/// The connections an [`Acceptor`] took that have not yet sent anything.
#[derive(Default)]
struct Accepted {
    fresh: AtomicUsize,
    changed: Notify,
}

impl Accepted {
    fn add(self: &Arc<Self>) -> Arc<Accepted> {
        self.fresh.fetch_add(1, Ordering::AcqRel);
        self.clone()
    }

    fn read_from(&self) {
        self.fresh.fetch_sub(1, Ordering::AcqRel);
        self.changed.notify_waiters();
    }

    /// Waits until every connection accepted has sent something (or
    /// closed), or `until`.
    async fn first_bytes(&self, until: Instant) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.fresh.load(Ordering::Acquire) == 0 {
                return;
            }
            if tokio::time::timeout_at(until, changed).await.is_err() {
                let waiting = self.fresh.load(Ordering::Acquire);
                tracing::debug!(waiting, "connections that sent nothing are closed");
                return;
            }
        }
    }
}

/// The acceptor's side of the controls of [`Running`].
struct Controls {
    close: watch::Sender<bool>,
    closed: oneshot::Receiver<()>,
    accepted: Arc<Accepted>,
}

impl Controls {
    fn running<E>(self, stop: oneshot::Sender<()>, task: Serving<E>) -> Running<E> {
        Running { close: self.close, closed: self.closed, accepted: self.accepted, stop, task }
    }
}

/// Accepts the connections of one listening socket until told to close it;
/// then it makes the kernel drop new handshakes (clients see the port
/// refused when they retry), keeps accepting for [`HANDSHAKE_LINGER`],
/// takes every connection still queued and closes the socket, so that no
/// connection the kernel completed is reset by the close.
struct Acceptor {
    listener: Option<TcpListener>,
    addr: SocketAddr,
    kind: Kind,
    close: watch::Receiver<bool>,
    closed: Option<oneshot::Sender<()>>,
    /// Set once told to close: when the socket closes.
    close_at: Option<Instant>,
    /// Connections taken from the queue at close, not yet handed out.
    queue: VecDeque<(Conn, SocketAddr)>,
    accepted: Arc<Accepted>,
}

/// What woke an [`Acceptor`].
enum Event {
    Accepted(io::Result<(TcpStream, SocketAddr)>),
    Close,
    CloseNow,
}

impl Acceptor {
    fn new(listener: TcpListener, kind: Kind) -> Result<(Acceptor, Controls), String> {
        let addr = local_addr(&listener)?;
        let (close, close_rx) = watch::channel(false);
        let (closed_tx, closed) = oneshot::channel();
        let accepted = Arc::new(Accepted::default());
        let acceptor = Acceptor {
            listener: Some(listener),
            addr,
            kind,
            close: close_rx,
            closed: Some(closed_tx),
            close_at: None,
            queue: VecDeque::new(),
            accepted: accepted.clone(),
        };
        Ok((acceptor, Controls { close, closed, accepted }))
    }

    /// The next connection; after the socket closed, never.
    async fn next(&mut self) -> (Conn, SocketAddr) {
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
        Conn::new(stream, self.accepted.add(), self.kind == Kind::Http)
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

/// An accepted connection: the TCP stream, plus what shutdown needs to know
/// of it, a lingering close, and (HTTP) hyper's bodyless error answers
/// given a JSON body.
pub(super) struct Conn {
    stream: TcpStream,
    /// Held until the first read returns: the first request may still be
    /// on its way.
    fresh: Option<Arc<Accepted>>,
    /// Whether writes go through [`super::http::explain_automatic_answer`].
    explain: bool,
    /// An answer written in place of hyper's, and how much of it is out;
    /// once set, everything hyper writes after it is dropped.
    replacement: Option<(Vec<u8>, usize)>,
    /// While closing: when to stop discarding what the client sends.
    linger: Option<Pin<Box<tokio::time::Sleep>>>,
    /// HTTP: keeps each request head within hyper's limit.
    head: Option<super::http::HeadLimit>,
}

impl Conn {
    fn new(stream: TcpStream, fresh: Arc<Accepted>, explain: bool) -> Conn {
        let head = explain.then(super::http::HeadLimit::new);
        Conn { stream, fresh: Some(fresh), explain, replacement: None, linger: None, head }
    }

    /// Whether `written`, hyper's next write, is one of its bodyless error
    /// answers; if so it is replaced, from now on.
    fn replaces(&mut self, written: &[u8]) -> bool {
        if self.replacement.is_none()
            && self.explain
            && let Some(answer) = super::http::explain_automatic_answer(written)
        {
            self.replacement = Some((answer, 0));
        }
        self.replacement.is_some()
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
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(accepted) = self.fresh.take() {
            accepted.read_from();
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
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
        if let Some(head) = &mut self.head {
            head.read(&buf.filled()[before..]);
        }
        if let Some(accepted) = self.fresh.take() {
            accepted.read_from();
        }
        Poll::Ready(read)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if let Some(head) = &mut self.head {
            head.answering();
        }
        if self.replaces(buf) {
            ready!(self.poll_replacement(cx))?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // hyper writes an answer's head as the first buffer, and its
        // automatic answers as a head alone.
        if let Some(head) = &mut self.head {
            head.answering();
        }
        let total = bufs.iter().map(|b| b.len()).sum();
        let first = bufs.iter().find(|b| !b.is_empty()).map_or(&[][..], |b| &b[..]);
        if (first.len() == total && self.replaces(first)) || self.replacement.is_some() {
            ready!(self.poll_replacement(cx))?;
            return Poll::Ready(Ok(total));
        }
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_replacement(cx))?;
        Pin::new(&mut self.stream).poll_flush(cx)
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
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    const HYPER_400: &[u8] =
        b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\ndate: Wed, 02 Dec 2026 19:59:19 GMT\r\n\r\n";

    async fn listener() -> (TcpListener, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (listener, addr)
    }

    /// A connected pair: the client's std stream and the server's `Conn`.
    async fn pair(explain: bool) -> (std::net::TcpStream, Conn, Arc<Accepted>) {
        let (listener, addr) = listener().await;
        let client = std::net::TcpStream::connect(addr).unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let accepted = Arc::new(Accepted::default());
        let conn = Conn::new(stream, accepted.add(), explain);
        (client, conn, accepted)
    }

    /// Everything the client reads until the server closes.
    fn read_all(mut client: std::net::TcpStream) -> Vec<u8> {
        let mut received = Vec::new();
        client.read_to_end(&mut received).unwrap();
        received
    }

    #[tokio::test]
    async fn closing_takes_the_queued_connections_and_then_refuses() {
        let (listener, addr) = listener().await;
        let (mut acceptor, mut controls) = Acceptor::new(listener, Kind::Http).unwrap();
        // Completed by the kernel, never accepted: closing the socket now
        // would reset them.
        let mut queued: Vec<_> = (0..3).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
        acceptor.close_now();
        assert!((&mut controls.closed).await.is_ok(), "closing is reported");
        let refused = std::net::TcpStream::connect(addr).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
        assert_eq!(acceptor.queue.len(), 3);
        assert_eq!(controls.accepted.fresh.load(Ordering::Acquire), 3, "none sent anything yet");
        for client in &mut queued {
            client.write_all(b"ping").unwrap();
            let (mut conn, _) = acceptor.next().await;
            let mut got = [0u8; 4];
            conn.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"ping", "the queued connection is served");
        }
        controls.accepted.first_bytes(Instant::now() + Duration::from_secs(60)).await;
        assert_eq!(controls.accepted.fresh.load(Ordering::Acquire), 0);
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
        assert_eq!(accepted.fresh.load(Ordering::Acquire), 1);
        client.write_all(b"GET").unwrap();
        let mut got = [0u8; 3];
        conn.read_exact(&mut got).await.unwrap();
        assert_eq!(accepted.fresh.load(Ordering::Acquire), 0);
        drop(conn);
        assert_eq!(accepted.fresh.load(Ordering::Acquire), 0, "counted once");
        let (_client, conn, accepted) = pair(true).await;
        drop(conn);
        assert_eq!(accepted.fresh.load(Ordering::Acquire), 0, "a connection closed unread is no longer waited for");
    }
}

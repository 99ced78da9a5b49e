//! TLS on the listeners, with rustls and ring: TLS 1.2 and 1.3 only, the
//! certificate and key read from PEM files and re-read when the files
//! change ([`reload`]), and, for mutual TLS, every client's certificate
//! verified against roots read the same way. The listeners handshake each
//! connection with [`Tls::acceptor`] before serving it.

mod files;
pub mod reload;

use std::path::PathBuf;
use std::sync::Arc;

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;

use self::files::Contents;
use self::reload::{Current, Loaded, Resolver, Verifier, Watcher};
use crate::metrics::{Listener, Metrics};

/// The files of a listener's TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain, PEM: its own certificate first,
    /// then those that sign it.
    pub cert: PathBuf,
    /// The certificate's private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// Mutual TLS: the roots, PEM, one of which must sign every client's
    /// certificate; a client without one is refused at the handshake.
    /// `None`: clients are not asked for a certificate.
    pub client_roots: Option<PathBuf>,
}

/// The application protocols a listener offers in ALPN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alpn {
    /// gRPC: `h2` only.
    Grpc,
    /// HTTP: `h2`, then `http/1.1`.
    Http,
}

impl Alpn {
    fn protocols(self) -> Vec<Vec<u8>> {
        match self {
            Alpn::Grpc => vec![b"h2".to_vec()],
            Alpn::Http => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        }
    }
}

/// A listener's TLS: handshakes with the certificate its files hold now.
#[derive(Clone)]
pub struct Tls {
    acceptor: tokio_rustls::TlsAcceptor,
}

impl Tls {
    /// Loads `files` and starts watching them (a task that runs as long as
    /// the process), for `listener`, offering the protocols of `alpn`.
    ///
    /// # Errors
    /// A message naming the file that cannot be read or used: a server
    /// does not start with a TLS setting it cannot serve.
    pub fn start(files: &TlsFiles, alpn: Alpn, listener: Listener, metrics: &Arc<Metrics>) -> Result<Tls, String> {
        let (config, watcher) = config(files, alpn, listener, metrics)?;
        tokio::spawn(watcher.run());
        Ok(Tls { acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)) })
    }

    /// The acceptor that handshakes a connection.
    pub fn acceptor(&self) -> &tokio_rustls::TlsAcceptor {
        &self.acceptor
    }
}

/// The rustls configuration of `files` and the watcher that reloads them.
///
/// # Errors
/// As [`Tls::start`].
fn config(
    files: &TlsFiles,
    alpn: Alpn,
    listener: Listener,
    metrics: &Arc<Metrics>,
) -> Result<(ServerConfig, Watcher), String> {
    let provider = Arc::new(ring_provider());
    let contents = Contents::read(files)?;
    let current = Current::new(Loaded::new(&contents, files, &provider)?);
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("TLS cannot start: {e}"))?;
    let builder = match files.client_roots {
        Some(_) => builder.with_client_cert_verifier(Arc::new(Verifier(current.clone()))),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(Arc::new(Resolver(current.clone())));
    config.alpn_protocols = alpn.protocols();
    metrics.connections.tls_reloaded(listener, true);
    let watcher =
        Watcher { files: files.clone(), current, in_use: contents, listener, metrics: metrics.clone(), provider };
    Ok((config, watcher))
}

/// Installs ring as the process's rustls crypto provider, so every TLS
/// user of the process (the listeners, object storage's clients) agrees.
pub fn install_crypto_provider() {
    let _ = ring_provider().install_default();
}

/// rustls' ring provider, the one crypto provider of the process (no
/// aws-lc build). rustls 0.23.48 deprecates it only because ring offers no
/// post-quantum key exchange; its TLS 1.2 and 1.3 suites are unchanged.
#[allow(deprecated)]
fn ring_provider() -> CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// The provider the listeners use (ring), for tests.
#[cfg(test)]
fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring_provider())
}

#[cfg(test)]
mod tests;

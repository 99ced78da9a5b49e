//! Serving the certificate the files hold now: rustls asks a resolver for
//! the certificate of each handshake and a verifier for each client's,
//! and both read what the watcher last loaded. The watcher reads the files
//! every [`RELOAD_INTERVAL`]; when their bytes change (cert-manager and
//! Kubernetes secrets rewrite them in place, or swap a symbolic link) it
//! loads them, and only if the new certificate, key and roots load and
//! belong together does it replace the old ones. Connections already open
//! keep the session they made; the next handshake gets the new
//! certificate. A file that cannot be read or loaded keeps the old
//! certificate, and says why once per change.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use super::TlsFiles;
use super::files::{self, Contents};
use crate::metrics::{Listener, Metrics};

/// How often the watcher reads a listener's TLS files.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// How long one read of the files may take before the watcher says so: a
/// file on a filesystem that stopped answering. The read goes on in the
/// background, and no other starts until it ends.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// What the TLS files of a listener hold, loaded.
pub(super) struct Loaded {
    key: Arc<CertifiedKey>,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
}

impl Loaded {
    /// Loads `contents`, the bytes of `files`.
    ///
    /// # Errors
    /// A message naming the file that cannot be used.
    pub(super) fn new(contents: &Contents, files: &TlsFiles, provider: &Arc<CryptoProvider>) -> Result<Loaded, String> {
        let key = files::certified_key(contents, files, provider)?;
        let verifier = match (&contents.client_roots, &files.client_roots) {
            (Some(pem), Some(path)) => Some(files::client_verifier(pem, path, provider)?),
            _ => None,
        };
        Ok(Loaded { key, verifier })
    }
}

/// The certificate and client verifier in use, replaced whole on a reload.
pub(super) struct Current(RwLock<Arc<Loaded>>);

impl std::fmt::Debug for Current {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the TLS certificate in use")
    }
}

impl Current {
    /// Serving `loaded`.
    pub(super) fn new(loaded: Loaded) -> Arc<Current> {
        Arc::new(Current(RwLock::new(Arc::new(loaded))))
    }

    fn get(&self) -> Arc<Loaded> {
        self.0.read().clone()
    }

    fn replace(&self, loaded: Loaded) {
        *self.0.write() = Arc::new(loaded);
    }

    /// The client verifier in use; only called where the files name roots.
    fn verifier(&self) -> Arc<dyn ClientCertVerifier> {
        self.get().verifier.clone().expect("a listener with client roots has a verifier")
    }
}

/// Gives each handshake the certificate in use.
#[derive(Debug)]
pub(super) struct Resolver(pub Arc<Current>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.get().key.clone())
    }
}

/// Verifies each client's certificate against the roots in use; every
/// client must present one (mutual TLS).
#[derive(Debug)]
pub(super) struct Verifier(pub Arc<Current>);

impl ClientCertVerifier for Verifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    /// No hints: the roots may change under a handshake, and a client
    /// with one certificate sends it without them.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.0.verifier().verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verifier().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verifier().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.verifier().supported_verify_schemes()
    }
}

/// Watches the files of one listener.
pub(super) struct Watcher {
    pub files: TlsFiles,
    /// What is in use, replaced on a good reload.
    pub current: Arc<Current>,
    /// The bytes in use.
    pub in_use: Contents,
    /// The listener, for the log and the metrics.
    pub listener: Listener,
    /// Where reloads are counted.
    pub metrics: Arc<Metrics>,
    /// The crypto provider the certificates load with.
    pub provider: Arc<CryptoProvider>,
}

impl Watcher {
    /// Reads the files every [`RELOAD_INTERVAL`] and loads what changed,
    /// for as long as the process runs.
    pub(super) async fn run(mut self) {
        let mut ticks = tokio::time::interval(RELOAD_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The last problem said, so each is said once.
        let mut said: Option<Result<Contents, String>> = None;
        // A read still running past READ_TIMEOUT, waited for again.
        let mut pending: Option<tokio::task::JoinHandle<Result<Contents, String>>> = None;
        loop {
            ticks.tick().await;
            let mut reading = pending.take().unwrap_or_else(|| {
                let files = self.files.clone();
                tokio::task::spawn_blocking(move || Contents::read(&files))
            });
            let read = match tokio::time::timeout(READ_TIMEOUT, &mut reading).await {
                Ok(Ok(read)) => read,
                Ok(Err(_)) => continue,
                Err(_) => {
                    let stalled = Err(format!(
                        "reading {} and {} has taken over {READ_TIMEOUT:?}",
                        self.files.cert.display(),
                        self.files.key.display()
                    ));
                    if said.as_ref() != Some(&stalled) {
                        let e = stalled.as_ref().unwrap_err();
                        tracing::warn!(listener = self.listener.label(), "keeping the TLS certificate in use: {e}");
                        said = Some(stalled);
                    }
                    pending = Some(reading);
                    continue;
                }
            };
            if read.as_ref().is_ok_and(|c| *c == self.in_use) || said.as_ref() == Some(&read) {
                continue;
            }
            match read.clone().and_then(|contents| self.reload(contents)) {
                Ok(()) => said = None,
                Err(e) => {
                    self.metrics.connections.tls_reloaded(self.listener, false);
                    tracing::warn!(listener = self.listener.label(), "keeping the TLS certificate in use: {e}");
                    said = Some(read);
                }
            }
        }
    }

    /// Loads `contents` and serves it from the next handshake on.
    fn reload(&mut self, contents: Contents) -> Result<(), String> {
        let loaded = Loaded::new(&contents, &self.files, &self.provider)?;
        self.current.replace(loaded);
        self.in_use = contents;
        self.metrics.connections.tls_reloaded(self.listener, true);
        tracing::info!(
            listener = self.listener.label(),
            "reloaded the TLS certificate from {} and {}",
            self.files.cert.display(),
            self.files.key.display()
        );
        Ok(())
    }
}

//! Reading a listener's TLS files: the certificate chain and its private
//! key (PEM), and the roots that sign the certificates of clients (PEM),
//! into what rustls serves with. Every error names the file.

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls::sign::CertifiedKey;

/// The bytes of a listener's TLS files as last read: reading them again
/// and comparing tells whether they changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Contents {
    /// The certificate chain, PEM.
    pub cert: Vec<u8>,
    /// The private key, PEM.
    pub key: Vec<u8>,
    /// The client roots, PEM, where clients must present a certificate.
    pub client_roots: Option<Vec<u8>>,
}

impl Contents {
    /// Reads the files.
    ///
    /// # Errors
    /// A message naming the file that cannot be read.
    pub(super) fn read(files: &super::TlsFiles) -> Result<Contents, String> {
        let read = |path: &Path| std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()));
        Ok(Contents {
            cert: read(&files.cert)?,
            key: read(&files.key)?,
            client_roots: files.client_roots.as_deref().map(read).transpose()?,
        })
    }
}

/// The certificate chain of `cert` (first the server's own, then those
/// that sign it) with the private key of `key`, checked to belong together.
///
/// # Errors
/// A message naming the file (`cert_path`, `key_path`) that holds no
/// certificate, no key, or a key of another certificate.
pub(super) fn certified_key(
    contents: &Contents,
    files: &super::TlsFiles,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, String> {
    let cert_path = files.cert.display();
    let key_path = files.key.display();
    let chain = CertificateDer::pem_slice_iter(&contents.cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{cert_path} is not a PEM certificate chain: {e}"))?;
    if chain.is_empty() {
        return Err(format!("{cert_path} holds no PEM certificate"));
    }
    let key = PrivateKeyDer::from_pem_slice(&contents.key)
        .map_err(|e| format!("{key_path} holds no PEM private key: {e}"))?;
    let certified = CertifiedKey::from_der(chain, key, provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => {
            format!("the key in {key_path} is not the key of the certificate in {cert_path}")
        }
        e => format!("{key_path} or {cert_path} cannot be used: {e}"),
    })?;
    Ok(Arc::new(certified))
}

/// A verifier that requires every client to present a certificate signed
/// by one of the roots in `pem` (read from `path`).
///
/// # Errors
/// A message naming `path` when it holds no usable root certificate.
pub(super) fn client_verifier(
    pem: &[u8],
    path: &Path,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, String> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| format!("{} is not a PEM certificate list: {e}", path.display()))?;
        roots.add(cert).map_err(|e| format!("{} holds a root that cannot be used: {e}", path.display()))?;
    }
    if roots.is_empty() {
        return Err(format!("{} holds no PEM root certificate", path.display()));
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| format!("{} cannot verify clients: {e}", path.display()))
}

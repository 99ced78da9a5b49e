//! Reading a listener's TLS files: the certificate chain and its private
//! key (PEM), and the roots that sign the certificates of clients (PEM),
//! into what rustls serves with. Every error names the file.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
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

/// The largest TLS file read, in bytes: a certificate chain or a bundle
/// of roots is a few kilobytes.
pub(super) const MAX_FILE_BYTES: u64 = 1 << 20;

/// The bytes of the regular file at `path`, at most [`MAX_FILE_BYTES`].
/// Opened without blocking, so that a FIFO (or another special file) put
/// at the path is refused instead of waiting for a writer for ever.
///
/// # Errors
/// A message naming the file that cannot be opened or read, is no regular
/// file, or is too large.
fn read_file(path: &Path) -> Result<Vec<u8>, String> {
    let cannot = |e: std::io::Error| format!("cannot read {}: {e}", path.display());
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(cannot)?;
    let metadata = file.metadata().map_err(cannot)?;
    if !metadata.is_file() {
        return Err(format!("cannot read {}: it is not a regular file ({:?})", path.display(), metadata.file_type()));
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(cannot)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!("cannot read {}: it is larger than {MAX_FILE_BYTES} bytes", path.display()));
    }
    Ok(bytes)
}

impl Contents {
    /// Reads the files.
    ///
    /// # Errors
    /// A message naming the file that cannot be read (see `read_file`).
    pub(super) fn read(files: &super::TlsFiles) -> Result<Contents, String> {
        let read = read_file;
        Ok(Contents {
            cert: read(&files.cert)?,
            key: read(&files.key)?,
            client_roots: files.client_roots.as_deref().map(read).transpose()?,
        })
    }
}

/// The certificate chain of `cert` (first the server's own, then those
/// that sign it) with the private key of `key`, checked to belong together
/// and the server's own certificate to be valid now: every client that
/// verifies it would refuse it otherwise.
///
/// # Errors
/// A message naming the file (`cert_path`, `key_path`) that holds no
/// certificate, no key, or a key of another certificate, or a certificate
/// that has expired or is not yet valid.
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
    check_validity(&chain[0], &files.cert, UnixTime::now())?;
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

/// Whether `cert` (read from `path`) is valid at `now`: within its
/// `notBefore` and `notAfter` (RFC 5280, 4.1.2.5).
///
/// # Errors
/// A message naming `path` and the validity period when `now` is outside
/// it, or when the certificate cannot be read.
fn check_validity(cert: &CertificateDer<'_>, path: &Path, now: UnixTime) -> Result<(), String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert)
        .map_err(|e| format!("the certificate in {} cannot be read: {e}", path.display()))?;
    let validity = parsed.validity();
    let now = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
    let (from, until) = (validity.not_before.timestamp(), validity.not_after.timestamp());
    let period = format!("valid from {} until {}", validity.not_before, validity.not_after);
    if now < from {
        return Err(format!("the certificate in {} is not yet valid ({period})", path.display()));
    }
    if now > until {
        return Err(format!("the certificate in {} has expired ({period})", path.display()));
    }
    Ok(())
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

//! TLS with certificates made here (rcgen): the files' certificate is
//! served, a rewrite is picked up by the next handshake, a broken or
//! mismatched rewrite keeps the certificate in use, mutual TLS refuses a
//! client without a certificate from its roots, and a bad file stops
//! start-up naming it.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::ClientConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::*;

/// How long a test waits for the watcher before it fails.
const HANG_GUARD: Duration = Duration::from_secs(120);

/// A certificate authority that signs certificates for `localhost`.
struct Authority {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, PEM.
struct Leaf {
    cert: String,
    key: String,
}

impl Authority {
    fn new(name: &str) -> Authority {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        Authority { issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap() }
    }

    fn leaf(&self, name: &str) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf { cert: cert.pem(), key: key.serialize_pem() }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }
}

fn write(dir: &Path, leaf: &Leaf) {
    std::fs::write(dir.join("tls.crt"), &leaf.cert).unwrap();
    std::fs::write(dir.join("tls.key"), &leaf.key).unwrap();
}

fn files(dir: &Path, roots: bool) -> TlsFiles {
    TlsFiles { cert: dir.join("tls.crt"), key: dir.join("tls.key"), client_roots: roots.then(|| dir.join("ca.crt")) }
}

/// A client that trusts `authority`, presenting `leaf` if given.
fn client(authority: &Authority, leaf: Option<&Leaf>) -> Arc<ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(authority.der()).unwrap();
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match leaf {
        Some(leaf) => {
            let chain = vec![CertificateDer::from_pem_slice(leaf.cert.as_bytes()).unwrap()];
            let key = PrivateKeyDer::from_pem_slice(leaf.key.as_bytes()).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    Arc::new(config)
}

use rustls::pki_types::pem::PemObject;

/// One handshake of `client` with `tls`: the certificate the server
/// presented, or the error of whichever side failed.
async fn handshake(tls: &Tls, client: Arc<ClientConfig>) -> Result<CertificateDer<'static>, String> {
    let (near, far) = tokio::io::duplex(64 * 1024);
    let acceptor = tls.acceptor().clone();
    let server = tokio::spawn(async move { acceptor.accept(far).await.map(drop) });
    let connector = tokio_rustls::TlsConnector::from(client);
    let name = ServerName::try_from("localhost").unwrap();
    let connected = connector.connect(name, near).await;
    server.await.unwrap().map_err(|e| format!("server: {e}"))?;
    let stream = connected.map_err(|e| format!("client: {e}"))?;
    Ok(stream.get_ref().1.peer_certificates().unwrap()[0].clone().into_owned())
}

fn leaf_der(leaf: &Leaf) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(leaf.cert.as_bytes()).unwrap()
}

fn loads(metrics: &Metrics, result: &str) -> String {
    let text = metrics.render();
    let prefix = format!("plinth_tls_certificate_loads_total{{listener=\"http\",result=\"{result}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&prefix)).unwrap_or("0").to_owned()
}

/// Waits until `condition` holds, checking every 20 ms.
async fn wait_until(what: &str, mut condition: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + HANG_GUARD;
    while !condition().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_rewritten_certificate_is_served_from_the_next_handshake_and_a_broken_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let authority = Authority::new("test root");
    let (first, second) = (authority.leaf("first"), authority.leaf("second"));
    write(dir.path(), &first);
    let metrics = Arc::new(Metrics::new());
    let tls = Tls::start(&files(dir.path(), false), Alpn::Http, Listener::Http, &metrics).unwrap();
    let trusting = client(&authority, None);
    assert_eq!(handshake(&tls, trusting.clone()).await.unwrap(), leaf_der(&first));
    assert_eq!(loads(&metrics, "ok"), "1");

    write(dir.path(), &second);
    wait_until("the second certificate is served", async || {
        handshake(&tls, trusting.clone()).await.unwrap() == leaf_der(&second)
    })
    .await;
    assert_eq!(loads(&metrics, "ok"), "2");

    // Not a certificate: the second stays.
    std::fs::write(dir.path().join("tls.crt"), "not a certificate").unwrap();
    wait_until("the broken file is refused", async || loads(&metrics, "failed") == "1").await;
    assert_eq!(handshake(&tls, trusting.clone()).await.unwrap(), leaf_der(&second));

    // A certificate with another certificate's key: refused too.
    let third = authority.leaf("third");
    std::fs::write(dir.path().join("tls.crt"), &third.cert).unwrap();
    wait_until("the mismatched pair is refused", async || loads(&metrics, "failed") == "2").await;
    assert_eq!(handshake(&tls, trusting.clone()).await.unwrap(), leaf_der(&second));
    // Its key follows: now the pair belongs together.
    std::fs::write(dir.path().join("tls.key"), &third.key).unwrap();
    wait_until("the third certificate is served", async || {
        handshake(&tls, trusting.clone()).await.unwrap() == leaf_der(&third)
    })
    .await;
}

#[tokio::test]
async fn mutual_tls_refuses_clients_without_a_certificate_of_its_roots() {
    let dir = tempfile::tempdir().unwrap();
    let (authority, stranger) = (Authority::new("clients' root"), Authority::new("another root"));
    write(dir.path(), &authority.leaf("server"));
    std::fs::write(dir.path().join("ca.crt"), authority.pem()).unwrap();
    let metrics = Arc::new(Metrics::new());
    let tls = Tls::start(&files(dir.path(), true), Alpn::Grpc, Listener::Http, &metrics).unwrap();
    let ours = authority.leaf("client");
    assert!(handshake(&tls, client(&authority, Some(&ours))).await.is_ok());
    let none = handshake(&tls, client(&authority, None)).await.unwrap_err();
    assert!(none.contains("server: peer sent no certificates"), "{none}");
    let theirs = handshake(&tls, client(&authority, Some(&stranger.leaf("client")))).await.unwrap_err();
    assert!(theirs.contains("server: invalid peer certificate: UnknownIssuer"), "{theirs}");
}

#[tokio::test]
async fn tls_that_cannot_be_served_stops_start_up_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(Metrics::new());
    let authority = Authority::new("root");
    let start = |roots| Tls::start(&files(dir.path(), roots), Alpn::Http, Listener::Http, &metrics).err().unwrap();
    assert!(start(false).starts_with(&format!("cannot read {}", dir.path().join("tls.crt").display())));
    let (first, second) = (authority.leaf("a"), authority.leaf("b"));
    std::fs::write(dir.path().join("tls.crt"), &first.cert).unwrap();
    std::fs::write(dir.path().join("tls.key"), &second.key).unwrap();
    let mismatched = start(false);
    assert!(mismatched.contains("is not the key of the certificate in"), "{mismatched}");
    write(dir.path(), &first);
    std::fs::write(dir.path().join("ca.crt"), "").unwrap();
    assert!(start(true).ends_with("ca.crt holds no PEM root certificate"), "{}", start(true));
}

//! TLS for every TCP front end (NBD's STARTTLS, the API and S3 over HTTPS):
//! rustls with the ring provider and x509 certificates from PEM files.
//! Why rustls and how each endpoint uses it: docs/decisions/0025-tls.md.
//!
//! - [`server_config`] reads a certificate chain and its key (and, when a CA
//!   is given, requires every client to present a certificate it signed).
//! - [`accept`] runs one server handshake under a deadline.
//! - [`peer_common_name`] is the CN of the client's verified certificate
//!   (what NBD's `nbd:clients` allow-list names).
//! - [`Incoming`] turns a listener into a stream of finished TLS
//!   connections, handshaking several at once (one slow client does not
//!   hold up the others).
//! - [`share`] splits a finished connection into a reader and a writer that
//!   worker threads seal their replies with directly (decision 0043).
//! - [`tcp::accepted`] sets the socket options of every accepted TCP
//!   connection, with or without TLS (decision 0080).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};

mod shared;
pub mod tcp;

pub use rustls;
pub use shared::{share, SharedTls, SharedTlsReader};
pub use tokio_rustls::server::TlsStream;
pub use tokio_rustls::{TlsAcceptor, TlsConnector};
/// A client-side TLS stream (tests and tools that talk to our servers).
pub type ClientTlsStream<IO> = tokio_rustls::client::TlsStream<IO>;

/// Why TLS could not be set up or a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {what} {}: {source}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} {}: {msg}", path.display())]
    Pem {
        what: &'static str,
        path: PathBuf,
        msg: String,
    },
    #[error("TLS configuration: {0}")]
    Config(String),
    #[error("TLS handshake: {0}")]
    Handshake(std::io::Error),
    #[error("TLS handshake took longer than {0:?}")]
    Timeout(Duration),
}

/// The crypto provider every config here uses (ring: AES-GCM with AES-NI,
/// ChaCha20-Poly1305, no cmake in the build).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The provider of every server config: ring's suites (TLS 1.3 and 1.2,
/// AEADs only) with AES-128-GCM ahead of AES-256-GCM and ChaCha20-Poly1305.
/// With AES-NI it is the cheapest per byte for the server's seal and the
/// client's open (10 AES rounds instead of 14), and TLS_AES_128_GCM_SHA256 is
/// the suite RFC 8446 makes mandatory; nothing is removed, so a client that
/// offers only AES-256-GCM or ChaCha20 still gets it (decision 0047).
pub fn server_provider() -> rustls::crypto::CryptoProvider {
    let mut p = rustls::crypto::ring::default_provider();
    // Stable: keeps TLS 1.3 before TLS 1.2 and ring's order otherwise.
    p.cipher_suites.sort_by_key(|s| suite_rank(s.suite()));
    p
}

fn suite_rank(s: rustls::CipherSuite) -> u8 {
    use rustls::CipherSuite as C;
    match s {
        C::TLS13_AES_128_GCM_SHA256 => 0,
        C::TLS13_AES_256_GCM_SHA384 => 1,
        C::TLS13_CHACHA20_POLY1305_SHA256 => 2,
        C::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 | C::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => 3,
        C::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384 | C::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => 4,
        _ => 5,
    }
}

/// The cipher suite a finished handshake agreed on (for logs), e.g.
/// `TLS13_AES_128_GCM_SHA256`.
pub fn negotiated_suite(conn: &rustls::ServerConnection) -> Option<String> {
    conn.negotiated_cipher_suite()
        .map(|s| format!("{:?}", s.suite()))
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// Every certificate in a PEM file (a chain: leaf first).
pub fn load_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let pem = read(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Pem {
            what,
            path: path.to_path_buf(),
            msg: format!("not a PEM certificate file: {e}"),
        })?;
    if certs.is_empty() {
        return Err(Error::Pem {
            what,
            path: path.to_path_buf(),
            msg: "holds no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 RSA or SEC1 EC).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, Error> {
    let pem = read("TLS key", path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| Error::Pem {
        what: "TLS key",
        path: path.to_path_buf(),
        msg: format!("no usable private key: {e}"),
    })
}

/// A root store holding every certificate of a PEM file.
pub fn load_roots(path: &Path) -> Result<RootCertStore, Error> {
    let mut roots = RootCertStore::empty();
    for c in load_certs("CA certificate", path)? {
        roots.add(c).map_err(|e| Error::Pem {
            what: "CA certificate",
            path: path.to_path_buf(),
            msg: format!("not a usable CA: {e}"),
        })?;
    }
    Ok(roots)
}

/// A server config from a certificate chain and key. `client_ca`: clients
/// must present a certificate this CA signed (no certificate, or another
/// CA's, fails the handshake). `alpn`: protocols offered (e.g. `http/1.1`).
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
    alpn: &[&[u8]],
) -> Result<Arc<ServerConfig>, Error> {
    let chain = load_certs("TLS certificate", cert)?;
    let key = load_key(key)?;
    let provider = Arc::new(server_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(e.to_string()))?;
    let builder = match client_ca {
        Some(ca) => {
            let roots = Arc::new(load_roots(ca)?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| Error::Config(format!("client CA {}: {e}", ca.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder
        .with_single_cert(chain, key)
        .map_err(|e| Error::Config(format!("certificate and key do not match: {e}")))?;
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    // Our order, not the client's: GnuTLS (libnbd, qemu) and OpenSSL list
    // AES-256-GCM first, which costs both ends more per byte (decision 0047).
    cfg.ignore_client_order = true;
    Ok(Arc::new(cfg))
}

/// One server handshake, bounded by `timeout`.
pub async fn accept<IO>(
    acceptor: &TlsAcceptor,
    io: IO,
    timeout: Duration,
) -> Result<TlsStream<IO>, Error>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(timeout, acceptor.accept(io)).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(Error::Handshake(e)),
        Err(_) => Err(Error::Timeout(timeout)),
    }
}

/// Ciphertext rustls may queue for a connection that moves bulk data (NBD
/// replies): with rustls' default (64 KiB) a 1 MiB reply went out in 16
/// `writev` calls; with this, in one (up to 64 records). Decision 0037.
pub const BULK_BUFFER_LIMIT: usize = 1 << 20;

/// Lets a connection queue [`BULK_BUFFER_LIMIT`] bytes of records.
pub fn bulk_buffers(conn: &mut rustls::ServerConnection) {
    conn.set_buffer_limit(Some(BULK_BUFFER_LIMIT));
}

/// The common name (CN) of the client's certificate, once verified; None
/// without a client certificate (or without a CN in it).
pub fn peer_common_name(conn: &rustls::ServerConnection) -> Option<String> {
    let leaf = conn.peer_certificates()?.first()?;
    common_name(leaf.as_ref())
}

/// The first CN of a DER certificate's subject.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_owned)
}

/// Finished TLS connections of one listener: a task accepts and runs up to
/// `max_handshakes` handshakes at once (each under `timeout`; failures are
/// logged at debug and dropped) and hands the finished ones over in order
/// of completion.
pub struct Incoming {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Incoming {
    pub fn new(
        listener: TcpListener,
        acceptor: TlsAcceptor,
        max_handshakes: usize,
        timeout: Duration,
        what: &'static str,
    ) -> std::io::Result<Incoming> {
        let local = listener.local_addr()?;
        let (tx, rx) = mpsc::channel(16);
        let slots = Arc::new(Semaphore::new(max_handshakes.max(1)));
        let task = tokio::spawn(async move {
            loop {
                let Ok(permit) = slots.clone().acquire_owned().await else {
                    return;
                };
                let (sock, peer) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!("{what}: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                tcp::accepted(&sock, peer);
                let done = tx.clone();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    match accept(&acceptor, sock, timeout).await {
                        Ok(s) => {
                            let _ = done.send((s, peer)).await;
                        }
                        Err(e) => tracing::debug!(%peer, "{what}: {e}"),
                    }
                });
                if tx.is_closed() {
                    return;
                }
            }
        });
        Ok(Incoming { rx, local, task })
    }

    /// The next finished connection; None once the accept task ended.
    pub async fn accept(&mut self) -> Option<(TlsStream<TcpStream>, SocketAddr)> {
        self.rx.recv().await
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CA, a server certificate for 127.0.0.1 it signed, and a client
    /// certificate with CN `alice`, as PEM files in `dir`.
    pub(crate) fn make_pki(dir: &Path) {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "test CA");
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let srv_key = KeyPair::generate().unwrap();
        let srv = CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
        let srv_cert = srv.signed_by(&srv_key, &ca_cert, &ca_key).unwrap();
        let cl_key = KeyPair::generate().unwrap();
        let mut cl = CertificateParams::new(Vec::<String>::new()).unwrap();
        cl.distinguished_name.push(DnType::CommonName, "alice");
        let cl_cert = cl.signed_by(&cl_key, &ca_cert, &ca_key).unwrap();
        std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
        std::fs::write(dir.join("server.pem"), srv_cert.pem()).unwrap();
        std::fs::write(dir.join("server.key"), srv_key.serialize_pem()).unwrap();
        std::fs::write(dir.join("alice.pem"), cl_cert.pem()).unwrap();
        std::fs::write(dir.join("alice.key"), cl_key.serialize_pem()).unwrap();
    }

    #[test]
    fn loads_and_names() {
        let d = tempfile::tempdir().unwrap();
        make_pki(d.path());
        let p = |n: &str| d.path().join(n);
        server_config(&p("server.pem"), &p("server.key"), Some(&p("ca.pem")), &[]).unwrap();
        let alice = load_certs("c", &p("alice.pem")).unwrap();
        assert_eq!(common_name(alice[0].as_ref()).as_deref(), Some("alice"));
        // The wrong key for the certificate, a key file that is not one,
        // a missing file: errors that name the file.
        let e = server_config(&p("server.pem"), &p("alice.key"), None, &[]).unwrap_err();
        assert!(e.to_string().contains("do not match"), "{e}");
        let e = server_config(&p("server.pem"), &p("ca.pem"), None, &[]).unwrap_err();
        assert!(e.to_string().contains("ca.pem"), "{e}");
        let e = server_config(&p("nope.pem"), &p("server.key"), None, &[]).unwrap_err();
        assert!(e.to_string().contains("nope.pem"), "{e}");
        assert!(common_name(b"not der").is_none());
    }

    #[test]
    fn servers_prefer_aes128_gcm() {
        let names: Vec<String> = server_provider()
            .cipher_suites
            .iter()
            .map(|s| format!("{:?}", s.suite()))
            .collect();
        assert_eq!(names[0], "TLS13_AES_128_GCM_SHA256", "{names:?}");
        assert_eq!(names[1], "TLS13_AES_256_GCM_SHA384", "{names:?}");
        // Nothing dropped, TLS 1.3 ahead of 1.2.
        assert_eq!(
            names.len(),
            rustls::crypto::ring::default_provider().cipher_suites.len()
        );
        let first12 = names.iter().position(|n| !n.starts_with("TLS13")).unwrap();
        assert!(
            names[first12..].iter().all(|n| !n.starts_with("TLS13")),
            "{names:?}"
        );
        assert!(names[first12].contains("AES_128_GCM"), "{names:?}");
    }

    /// A handshake in memory between a server config and a rustls client
    /// offering `suites` (in its order): the suite they agree on.
    fn agree(dir: &Path, suites: &[rustls::SupportedCipherSuite]) -> String {
        let p = |n: &str| dir.join(n);
        let server = server_config(&p("server.pem"), &p("server.key"), None, &[]).unwrap();
        let mut prov = rustls::crypto::ring::default_provider();
        prov.cipher_suites = suites.to_vec();
        let roots = load_roots(&p("ca.pem")).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(prov))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut c = rustls::ClientConnection::new(Arc::new(client), name).unwrap();
        let mut s = rustls::ServerConnection::new(server).unwrap();
        for _ in 0..10 {
            let mut buf = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut buf).unwrap();
            }
            s.read_tls(&mut &buf[..]).unwrap();
            s.process_new_packets().unwrap();
            buf.clear();
            while s.wants_write() {
                s.write_tls(&mut buf).unwrap();
            }
            c.read_tls(&mut &buf[..]).unwrap();
            c.process_new_packets().unwrap();
            if !c.is_handshaking() && !s.is_handshaking() {
                break;
            }
        }
        assert!(!s.is_handshaking());
        negotiated_suite(&s).unwrap()
    }

    #[test]
    fn aes128_gcm_wins_over_the_clients_order() {
        use rustls::crypto::ring::cipher_suite as cs;
        let d = tempfile::tempdir().unwrap();
        make_pki(d.path());
        // GnuTLS, OpenSSL and rustls clients all put AES-256-GCM first.
        let all = rustls::crypto::ring::default_provider().cipher_suites;
        assert_eq!(agree(d.path(), &all), "TLS13_AES_128_GCM_SHA256");
        // A client without AES-128 still gets what it offers.
        let only = [
            cs::TLS13_CHACHA20_POLY1305_SHA256,
            cs::TLS13_AES_256_GCM_SHA384,
        ];
        assert_eq!(agree(d.path(), &only), "TLS13_AES_256_GCM_SHA384");
        let chacha = [cs::TLS13_CHACHA20_POLY1305_SHA256];
        assert_eq!(agree(d.path(), &chacha), "TLS13_CHACHA20_POLY1305_SHA256");
    }
}

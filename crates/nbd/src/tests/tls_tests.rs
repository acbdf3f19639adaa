//! NBD_OPT_STARTTLS: FORCEDTLS (`require`) and SELECTIVETLS (`on`) modes,
//! client certificates against a CA, per-export access by certificate CN,
//! and I/O over TLS. Certificates are made here with rcgen.

use tls::rustls;
use tls::rustls::pki_types::ServerName;

use super::*;

/// Certificates of one test: a CA, a server certificate for 127.0.0.1, and
/// client certificates `alice` and `bob` it signed, plus `mallory` (CN
/// alice) signed by another CA.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let dir = tempfile::tempdir().unwrap();
        let ca = |cn: &str| {
            let key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.distinguished_name.push(DnType::CommonName, cn);
            let cert = p.self_signed(&key).unwrap();
            (cert, key)
        };
        let (ca_cert, ca_key) = ca("test CA");
        let (evil_cert, evil_key) = ca("other CA");
        let write = |name: &str, cert: &rcgen::Certificate, key: &KeyPair| {
            std::fs::write(dir.path().join(format!("{name}.pem")), cert.pem()).unwrap();
            std::fs::write(dir.path().join(format!("{name}.key")), key.serialize_pem()).unwrap();
        };
        write("ca", &ca_cert, &ca_key);
        let key = KeyPair::generate().unwrap();
        let p = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        write(
            "server",
            &p.signed_by(&key, &ca_cert, &ca_key).unwrap(),
            &key,
        );
        for (name, cn, issuer, issuer_key) in [
            ("alice", "alice", &ca_cert, &ca_key),
            ("bob", "bob", &ca_cert, &ca_key),
            ("mallory", "alice", &evil_cert, &evil_key),
        ] {
            let key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.distinguished_name.push(DnType::CommonName, cn);
            write(name, &p.signed_by(&key, issuer, issuer_key).unwrap(), &key);
        }
        Pki { dir }
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    fn server(&self, require: bool, client_ca: bool) -> ServerConfig {
        let ca = self.path("ca.pem");
        let cfg = tls::server_config(
            &self.path("server.pem"),
            &self.path("server.key"),
            client_ca.then_some(ca.as_path()),
            &[],
        )
        .unwrap();
        ServerConfig {
            tls: Some(Tls {
                config: cfg,
                require,
            }),
            ..ServerConfig::default()
        }
    }

    /// A client config trusting the test CA, with `cert` (`alice`, ...) if given.
    fn client(&self, cert: Option<&str>) -> Arc<rustls::ClientConfig> {
        let roots = tls::load_roots(&self.path("ca.pem")).unwrap();
        let b = rustls::ClientConfig::builder_with_provider(tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        Arc::new(match cert {
            Some(n) => b
                .with_client_auth_cert(
                    tls::load_certs("c", &self.path(&format!("{n}.pem"))).unwrap(),
                    tls::load_key(&self.path(&format!("{n}.key"))).unwrap(),
                )
                .unwrap(),
            None => b.with_no_client_auth(),
        })
    }
}

impl C {
    /// NBD_OPT_STARTTLS, then the TLS handshake as `cert`.
    async fn starttls(mut self, cfg: Arc<rustls::ClientConfig>) -> std::io::Result<C> {
        self.opt(OPT_STARTTLS, &[]).await;
        assert_eq!(self.rep(OPT_STARTTLS).await.0, REP_ACK);
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let s = tls::TlsConnector::from(cfg)
            .connect(name, self.s.tcp())
            .await?;
        Ok(C {
            s: Io::Tls(Box::new(s)),
        })
    }
}

#[tokio::test]
async fn require_refuses_everything_before_starttls() {
    let pki = Pki::new();
    let srv = start_with(pki.server(true, false)).await;
    let mut c = C::new(srv.addr).await;
    // LIST, INFO, GO, an unknown option: TLS_REQD, and no export named.
    c.opt(OPT_LIST, &[]).await;
    let (infos, fin) = c.reps(OPT_LIST).await;
    assert!(infos.is_empty());
    assert_eq!(fin, REP_ERR_TLS_REQD);
    for opt in [OPT_INFO, OPT_GO] {
        c.opt(opt, &C::info_data("mem", &[])).await;
        assert_eq!(c.rep(opt).await.0, REP_ERR_TLS_REQD);
    }
    c.opt(OPT_STRUCTURED_REPLY, &[]).await;
    assert_eq!(c.rep(OPT_STRUCTURED_REPLY).await.0, REP_ERR_TLS_REQD);
    c.opt(99, &[]).await;
    assert_eq!(c.rep(99).await.0, REP_ERR_TLS_REQD);
    // EXPORT_NAME has no error reply: the connection ends.
    c.opt(OPT_EXPORT_NAME, b"mem").await;
    c.closed().await;

    // Many options, or a long one, before TLS: closed.
    let mut c = C::new(srv.addr).await;
    for _ in 0..16 {
        c.opt(OPT_LIST, &[]).await;
        assert_eq!(c.rep(OPT_LIST).await.0, REP_ERR_TLS_REQD);
    }
    c.opt(OPT_LIST, &[]).await;
    c.closed().await;
    let mut c = C::new(srv.addr).await;
    c.opt(OPT_GO, &vec![0u8; 8192]).await;
    c.closed().await;
    // STARTTLS with data is invalid.
    let mut c = C::new(srv.addr).await;
    c.opt(OPT_STARTTLS, b"x").await;
    assert_eq!(c.rep(OPT_STARTTLS).await.0, REP_ERR_INVALID);
    // A plaintext client may still abort politely.
    c.opt(OPT_ABORT, &[]).await;
    assert_eq!(c.rep(OPT_ABORT).await.0, REP_ACK);

    // Over TLS: everything works; a second STARTTLS is invalid.
    let c = C::new(srv.addr).await;
    let mut c = c.starttls(pki.client(None)).await.unwrap();
    c.opt(OPT_STARTTLS, &[]).await;
    assert_eq!(c.rep(OPT_STARTTLS).await.0, REP_ERR_INVALID);
    c.opt(OPT_LIST, &[]).await;
    let (infos, fin) = c.reps(OPT_LIST).await;
    assert_eq!((infos.len(), fin), (2, REP_ACK));
    c.structured().await;
    c.go("mem").await;
    let data = pattern(3 * 1024 * 1024, 5);
    c.req(0, CMD_WRITE, 1, 0, 1 << 20, &data[..1 << 20]).await;
    assert_eq!(c.error().await, 0);
    c.req(0, CMD_READ, 2, 0, 1 << 20, &[]).await;
    let chunks = c.chunks().await;
    let got: Vec<u8> = chunks
        .iter()
        .flat_map(|(_, _, d)| d[8..].to_vec())
        .collect();
    assert_eq!(got, data[..1 << 20]);
    // Pipelined requests across many TLS records.
    for h in 0..8u64 {
        c.req(0, CMD_READ, 10 + h, 0, 512 * 1024, &[]).await;
    }
    for _ in 0..8 {
        let chunks = c.chunks().await;
        let got: Vec<u8> = chunks
            .iter()
            .flat_map(|(_, _, d)| d[8..].to_vec())
            .collect();
        assert_eq!(got, data[..512 * 1024]);
    }
    c.req(0, CMD_DISC, 99, 0, 0, &[]).await;
    c.closed().await;
    assert!(stats().snapshot().tls_handshakes >= 1);
    srv.stop().await;
}

#[tokio::test]
async fn client_certificates_are_checked_against_the_ca() {
    let pki = Pki::new();
    let srv = start_with(pki.server(true, true)).await;
    // Signed by the CA: in.
    let c = C::new(srv.addr).await;
    let mut c = c.starttls(pki.client(Some("alice"))).await.unwrap();
    c.go("mem").await;
    c.req(0, CMD_READ, 1, 0, 4096, &[]).await;
    assert_eq!(c.simple().await, (0, 1));
    // No certificate, or one from another CA: the TLS handshake fails (in
    // TLS 1.3 the client may only see it on its first read).
    for cert in [None, Some("mallory")] {
        let c = C::new(srv.addr).await;
        let failed_before = stats().snapshot().tls_failed;
        match c.starttls(pki.client(cert)).await {
            Err(_) => {}
            Ok(mut c) => {
                c.opt(OPT_LIST, &[]).await;
                let mut b = [0u8; 1];
                let r = tokio::time::timeout(T, c.s.read(&mut b)).await.unwrap();
                assert!(matches!(r, Ok(0) | Err(_)), "{cert:?} got an answer");
            }
        }
        assert!(stats().snapshot().tls_failed > failed_before);
    }
    srv.stop().await;
}

/// `mem` is for alice (read-write) and bob (read-only) only, over TLS;
/// `ro` is open to anyone.
struct Guarded(RamProvider);

impl ExportProvider for Guarded {
    fn list(&self) -> Vec<ExportInfo> {
        self.0.list()
    }
    fn open(&self, name: &str) -> Option<Arc<dyn BlockExport>> {
        self.0.open(name)
    }
    fn list_for(&self, client: &Client) -> Vec<ExportInfo> {
        self.list()
            .into_iter()
            .filter(|e| {
                matches!(
                    self.access(&e.name, client),
                    Access::ReadWrite | Access::ReadOnly
                )
            })
            .collect()
    }
    fn access(&self, name: &str, client: &Client) -> Access {
        if name != "mem" {
            return Access::ReadWrite;
        }
        if !client.tls {
            return Access::TlsRequired;
        }
        match client.common_name.as_deref() {
            Some("alice") => Access::ReadWrite,
            Some("bob") => Access::ReadOnly,
            other => Access::Denied(format!("{other:?} is not on the list")),
        }
    }
}

#[tokio::test]
async fn per_export_access_by_common_name() {
    let pki = Pki::new();
    let mem = RamExport::new(1 << 20, false);
    let ro = RamExport::new(64 * 1024, true);
    let info = |n: &str| ExportInfo {
        name: n.into(),
        description: String::new(),
    };
    let provider = Arc::new(Guarded(RamProvider(vec![
        (info("mem"), mem.clone()),
        (info("ro"), ro),
    ])));
    // `on`: TLS offered, not forced.
    let (addr, stop, task) = serve_provider(provider, pki.server(false, true)).await;
    // Plaintext: `mem` is not listed and needs TLS; `ro` works.
    let mut c = C::new(addr).await;
    c.opt(OPT_LIST, &[]).await;
    let (infos, fin) = c.reps(OPT_LIST).await;
    assert_eq!((infos.len(), fin), (1, REP_ACK));
    c.opt(OPT_GO, &C::info_data("mem", &[])).await;
    assert_eq!(c.rep(OPT_GO).await.0, REP_ERR_TLS_REQD);
    c.structured().await;
    let (_, fin) = c.meta(OPT_LIST_META_CONTEXT, "mem", &[]).await;
    assert_eq!(fin, REP_ERR_POLICY);
    c.go("ro").await;
    c.req(0, CMD_READ, 1, 0, 512, &[]).await;
    assert!(!c.chunks().await.is_empty());
    drop(c);

    // alice: read-write.
    let c = C::new(addr).await;
    let mut c = c.starttls(pki.client(Some("alice"))).await.unwrap();
    c.opt(OPT_LIST, &[]).await;
    assert_eq!(c.reps(OPT_LIST).await.0.len(), 2);
    let (_, flags) = c.go("mem").await;
    assert_eq!(flags & FLAG_READ_ONLY, 0);
    c.req(0, CMD_WRITE, 1, 0, 4, b"abcd").await;
    assert_eq!(c.simple().await, (0, 1));
    assert_eq!(
        mem.read(0, 4).unwrap(),
        vec![ReadChunk::Data(b"abcd".to_vec())]
    );

    // bob: read-only grant (the flag says so, writes get EPERM).
    let c = C::new(addr).await;
    let mut c = c.starttls(pki.client(Some("bob"))).await.unwrap();
    let (_, flags) = c.go("mem").await;
    assert_ne!(flags & FLAG_READ_ONLY, 0);
    c.req(0, CMD_WRITE, 1, 0, 4, b"XXXX").await;
    assert_eq!(c.simple().await, (EPERM, 1));
    c.req(0, CMD_TRIM, 2, 0, 4096, &[]).await;
    assert_eq!(c.simple().await, (EPERM, 2));
    c.req(0, CMD_READ, 3, 0, 4, &[]).await;
    assert_eq!(c.simple().await, (0, 3));
    assert_eq!(c.get(4).await, b"abcd");

    stop.send(true).unwrap();
    tokio::time::timeout(T, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    // TLS without a client certificate (no CA configured) is not enough:
    // POLICY, and not listed.
    let provider = Arc::new(Guarded(RamProvider(vec![(info("mem"), mem.clone())])));
    let (addr, stop, task) = serve_provider(provider, pki.server(false, false)).await;
    let c = C::new(addr).await;
    let mut c = c.starttls(pki.client(None)).await.unwrap();
    c.opt(OPT_LIST, &[]).await;
    assert_eq!(c.reps(OPT_LIST).await, (vec![], REP_ACK));
    c.opt(OPT_GO, &C::info_data("mem", &[])).await;
    assert_eq!(c.rep(OPT_GO).await.0, REP_ERR_POLICY);
    // The default export is the first one the client may see: none.
    c.opt(OPT_GO, &C::info_data("", &[])).await;
    assert_eq!(c.rep(OPT_GO).await.0, REP_ERR_UNKNOWN);
    c.opt(OPT_EXPORT_NAME, b"mem").await;
    c.closed().await;
    stop.send(true).unwrap();
    tokio::time::timeout(T, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn tls_off_refuses_starttls() {
    let srv = start().await;
    let mut c = C::new(srv.addr).await;
    c.opt(OPT_STARTTLS, &[]).await;
    assert_eq!(c.rep(OPT_STARTTLS).await.0, REP_ERR_POLICY);
    c.go("mem").await;
    srv.stop().await;
}

/// Replies sealed on the worker threads (decision 0043) while the client
/// does not read: the socket fills, the rest waits as records in rustls for
/// the drain task, and every reply arrives whole and in one piece once the
/// client reads again, with requests of the reader still decrypted meanwhile.
#[tokio::test]
async fn tls_replies_queue_while_the_client_does_not_read() {
    let pki = Pki::new();
    let srv = start_with(pki.server(false, false)).await;
    let c = C::new(srv.addr).await;
    let mut c = c.starttls(pki.client(None)).await.unwrap();
    c.structured().await;
    c.go("mem").await;
    let data = pattern(1 << 20, 9);
    c.req(0, CMD_WRITE, 1, 0, 1 << 20, &data).await;
    assert_eq!(c.error().await, 0);
    // 24 MiB of replies, far more than the socket buffers hold.
    const N: u64 = 24;
    for h in 0..N {
        c.req(0, CMD_READ, 100 + h, 0, 1 << 20, &[]).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut seen = Vec::new();
    for _ in 0..N {
        let chunks = c.chunks().await;
        seen.push(chunks[0].1);
        let got: Vec<u8> = chunks
            .iter()
            .flat_map(|(_, _, d)| d[8..].to_vec())
            .collect();
        assert_eq!(got.len(), data.len());
        assert!(got == data, "a reply's bytes differ");
    }
    seen.sort_unstable();
    assert_eq!(seen, (100..100 + N).collect::<Vec<_>>());
    // A clean end: DISC, then the server's close_notify and EOF.
    c.req(0, CMD_DISC, 99, 0, 0, &[]).await;
    c.closed().await;
    srv.stop().await;
}

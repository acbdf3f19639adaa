//! The S3 front end: buckets are datasets of kind `bucket` under a parent
//! dataset, objects live in the object layer ([`dataset::ObjectSet`]).
//! `s3s` speaks the protocol (routing, XML, SigV4 header and presigned,
//! aws-chunked bodies); the storage semantics are ours (`store.rs`).
//! Layout on disk: README.md and docs/on-disk-format.md "S3 layout".

pub mod access;
pub mod record;
mod service;
pub mod store;
mod unread;

use serde::{Deserialize, Serialize};
use std::sync::Arc;

#[doc(hidden)]
pub use service::fuzzing;
pub use service::Cistern;

/// The `[s3]` section of the config.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct S3Config {
    /// Address to listen on (`cistern serve --s3 ADDR`); 127.0.0.1 by default.
    pub listen: Option<String>,
    /// Dataset buckets live under: S3 bucket `photos` is `PARENT/photos`
    /// (a pool, `tank`, or a filesystem dataset in it, `tank/s3`).
    #[serde(alias = "pool")]
    pub parent: String,
    /// Base domain for virtual-host style requests (`photos.s3.local`);
    /// path style always works.
    pub domain: Option<String>,
    /// What GetBucketLocation answers.
    pub region: String,
    /// Incomplete multipart uploads older than this are aborted: seconds,
    /// or a number with s/m/h/d. 0 keeps them.
    #[serde(deserialize_with = "de_secs")]
    pub multipart_expiry: u64,
    /// How often expired uploads are looked for, seconds.
    pub sweep_interval_secs: u64,
    /// Object-layer calls running at once (they block a thread each).
    pub max_blocking: usize,
    /// ListBuckets also lists read-only snapshot buckets (`b--snap--s`);
    /// they are reachable by name either way.
    pub list_snapshots: bool,
    /// Connections served at once; more wait in the listen queue.
    pub max_connections: usize,
    /// Seconds a client may take to send a request's headers.
    pub header_timeout_secs: u64,
    /// HTTPS: PEM certificate chain and key (both or neither).
    pub tls_cert: Option<std::path::PathBuf>,
    pub tls_key: Option<std::path::PathBuf>,
}

impl Default for S3Config {
    fn default() -> Self {
        Self {
            listen: None,
            parent: "tank".into(),
            domain: None,
            region: "us-east-1".into(),
            multipart_expiry: 7 * 86400,
            sweep_interval_secs: 3600,
            max_blocking: 16,
            list_snapshots: false,
            max_connections: 1024,
            header_timeout_secs: 30,
            tls_cert: None,
            tls_key: None,
        }
    }
}

/// `7d`, `12h`, `30m`, `45s` or plain seconds.
pub fn parse_secs(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().last() {
        Some((i, 'd')) => (&s[..i], 86400),
        Some((i, 'h')) => (&s[..i], 3600),
        Some((i, 'm')) => (&s[..i], 60),
        Some((i, 's')) => (&s[..i], 1),
        _ => (s, 1),
    };
    num.trim()
        .parse::<u64>()
        .map(|n| n * mul)
        .map_err(|_| format!("bad duration '{s}': expected seconds or a number with s, m, h or d"))
}

fn de_secs<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum V {
        N(u64),
        S(String),
    }
    match V::deserialize(d)? {
        V::N(n) => Ok(n),
        V::S(s) => parse_secs(&s).map_err(serde::de::Error::custom),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid S3 base domain '{0}'")]
    Domain(String),
    #[error("S3 listener: {0}")]
    Io(#[from] std::io::Error),
}

/// Virtual-host style under one base domain, path style otherwise (any
/// other Host, e.g. `localhost:9000`, is not taken for a bucket).
struct BaseDomain(String);

impl s3s::host::S3Host for BaseDomain {
    fn parse_host_header<'a>(&'a self, host: &'a str) -> s3s::S3Result<s3s::host::VirtualHost<'a>> {
        let name = match host.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => host,
        };
        let vh = s3s::host::VirtualHost::new(self.0.as_str());
        match name
            .strip_suffix(self.0.as_str())
            .and_then(|b| b.strip_suffix('.'))
        {
            Some(bucket) if !bucket.is_empty() => Ok(vh.with_bucket(bucket.to_ascii_lowercase())),
            _ => Ok(vh),
        }
    }
}

/// Lets the service hold the shared users table as its authenticator.
struct AuthRef(Arc<access::Users>);

#[async_trait::async_trait]
impl s3s::auth::S3Auth for AuthRef {
    async fn get_secret_key(&self, access_key: &str) -> s3s::S3Result<s3s::auth::SecretKey> {
        s3s::auth::S3Auth::get_secret_key(&*self.0, access_key).await
    }
}

fn build(
    cistern: Cistern,
    cfg: &S3Config,
    access: Arc<access::Users>,
) -> Result<s3s::service::S3Service, Error> {
    let mut b = s3s::service::S3ServiceBuilder::new(cistern.with_users(access.clone()));
    b.set_auth(AuthRef(access));
    // SigV4 only; grants are checked per operation in `service.rs` (each
    // knows its bucket and whether it reads or writes).
    b.set_access(access::SigV4Only);
    if let Some(d) = &cfg.domain {
        if d.is_empty() || d.contains('/') {
            return Err(Error::Domain(d.clone()));
        }
        b.set_host(BaseDomain(d.to_ascii_lowercase()));
    }
    Ok(b.build())
}

/// The S3 service (a hyper service) over `engine`'s bucket datasets.
pub fn service(
    engine: Arc<dataset::Engine>,
    cfg: S3Config,
    access: Arc<access::Users>,
) -> Result<s3s::service::S3Service, Error> {
    let cistern = Cistern::new(engine, cfg.clone());
    build(cistern, &cfg, access)
}

/// Serves S3 on `listener` until `shutdown` resolves; also aborts expired
/// multipart uploads every `sweep_interval_secs`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    engine: Arc<dataset::Engine>,
    cfg: S3Config,
    access: Arc<access::Users>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), Error> {
    serve_tls(listener, engine, cfg, access, None, shutdown).await
}

/// [`serve`], over HTTPS when `tls` is given (`tls::server_config` of
/// `tls_cert`/`tls_key`): each connection's TLS handshake runs in its own
/// task under the header timeout.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    engine: Arc<dataset::Engine>,
    cfg: S3Config,
    access: Arc<access::Users>,
    tls: Option<Arc<tls::rustls::ServerConfig>>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), Error> {
    let acceptor = tls.map(tls::TlsAcceptor::from);
    let cistern = Cistern::new(engine, cfg.clone());
    let sweeper = cistern.spawn_sweeper();
    let svc = build(cistern, &cfg, access)?;
    tracing::info!(addr = ?listener.local_addr().ok(), parent = %cfg.parent, "S3 endpoint listening");
    let mut shutdown = std::pin::pin!(shutdown);
    // Bounded: past max_connections, accepting waits for one to end.
    let slots = Arc::new(tokio::sync::Semaphore::new(cfg.max_connections.max(1)));
    let header_timeout = std::time::Duration::from_secs(cfg.header_timeout_secs.max(1));
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (sock, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "S3 accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        tls::tcp::accepted(&sock, peer);
        let svc = svc.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match acceptor {
                None => serve_connection(sock, svc, header_timeout, peer).await,
                Some(a) => match tls::accept(&a, sock, header_timeout).await {
                    Ok(s) => serve_connection(s, svc, header_timeout, peer).await,
                    Err(e) => tracing::debug!(%peer, error = %e, "S3 TLS handshake failed"),
                },
            }
        });
    }
    sweeper.abort();
    Ok(())
}

/// One HTTP/1.1 connection; a client that never finishes its headers is dropped.
async fn serve_connection<IO>(
    io: IO,
    svc: s3s::service::S3Service,
    header_timeout: std::time::Duration,
    peer: std::net::SocketAddr,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header_timeout)
        .serve_connection(hyper_util::rt::TokioIo::new(io), unread::CloseIfUnread(svc));
    if let Err(e) = conn.await {
        tracing::debug!(%peer, error = %e, "S3 connection ended");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_secs("7d"), Ok(7 * 86400));
        assert_eq!(parse_secs("90"), Ok(90));
        assert_eq!(parse_secs("2h"), Ok(7200));
        assert!(parse_secs("x").is_err());
        let c: S3Config =
            toml::from_str("parent = \"tank/s3\"\nmultipart_expiry = \"1h\"").unwrap();
        assert_eq!(c.multipart_expiry, 3600);
        assert!(toml::from_str::<S3Config>("bogus = 1").is_err());
    }

    #[test]
    fn virtual_hosts_under_the_base_domain_only() {
        use s3s::host::S3Host;
        let h = BaseDomain("s3.local".into());
        assert_eq!(
            h.parse_host_header("photos.s3.local:9000")
                .unwrap()
                .bucket(),
            Some("photos")
        );
        assert_eq!(h.parse_host_header("s3.local").unwrap().bucket(), None);
        assert_eq!(
            h.parse_host_header("localhost:9000").unwrap().bucket(),
            None
        );
    }
}

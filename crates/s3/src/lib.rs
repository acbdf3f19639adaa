//! STAND-IN for the S3 front end (branch `s3` writes the real crate; at
//! merge its lib.rs replaces this one). Only what branch `s3access` needs to
//! wire the daemon: [`S3Config`] and [`serve`] with the real signatures, and
//! an s3s service that authenticates (SigV4 via [`access::Users`]) and
//! answers ListBuckets (empty) and NotImplemented for everything else.

pub mod access;

use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The `[s3]` section of the config (same shape as branch `s3`'s).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct S3Config {
    /// Address to listen on (`cistern serve --s3 ADDR`).
    pub listen: Option<String>,
    /// Dataset buckets live under: S3 bucket `photos` is `PARENT/photos`.
    #[serde(alias = "pool")]
    pub parent: String,
    /// Base domain for virtual-host style requests.
    pub domain: Option<String>,
    pub region: String,
    /// Incomplete multipart uploads older than this many seconds are aborted.
    pub multipart_expiry: u64,
    pub sweep_interval_secs: u64,
    pub max_blocking: usize,
    pub list_snapshots: bool,
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
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("S3 listener: {0}")]
    Io(#[from] std::io::Error),
}

/// Lets the service hold the shared users table as its authenticator.
struct AuthRef(Arc<access::Users>);

#[async_trait::async_trait]
impl s3s::auth::S3Auth for AuthRef {
    async fn get_secret_key(&self, access_key: &str) -> s3s::S3Result<s3s::auth::SecretKey> {
        s3s::auth::S3Auth::get_secret_key(&*self.0, access_key).await
    }
}

struct Stub {
    users: Arc<access::Users>,
}

#[async_trait::async_trait]
impl s3s::S3 for Stub {
    async fn list_buckets(
        &self,
        req: s3s::S3Request<s3s::dto::ListBucketsInput>,
    ) -> s3s::S3Result<s3s::S3Response<s3s::dto::ListBucketsOutput>> {
        let cred = req.credentials.as_ref().map(|c| c.access_key.as_str());
        if cred.is_none() && !self.users.anonymous_allowed() {
            return Err(s3s::s3_error!(AccessDenied, "anonymous access is refused"));
        }
        Ok(s3s::S3Response::new(s3s::dto::ListBucketsOutput {
            buckets: Some(Vec::new()),
            ..Default::default()
        }))
    }
}

/// Serves S3 on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    engine: Arc<dataset::Engine>,
    cfg: S3Config,
    access: Arc<access::Users>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), Error> {
    let _ = (engine, cfg);
    let mut b = s3s::service::S3ServiceBuilder::new(Stub {
        users: access.clone(),
    });
    b.set_auth(AuthRef(access));
    b.set_access(access::SigV4Only);
    let svc = b.build();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (sock, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let svc = svc.clone();
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(sock), svc)
                .await;
        });
    }
    Ok(())
}

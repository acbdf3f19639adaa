//! Blocking client for the management API (what the CLI uses).

use crate::{
    AddUser, AttachRequest, ClearRequest, CloneRequest, CreateVolume, DeviceRequest, ErrorBody,
    GrantRequest, Health, HoldRequest, ImportRequest, InheritRequest, LabelclearRequest,
    MountRequest, RenameRequest, ReplaceRequest, RollbackRequest, ScrubRequest, SetProperty,
    ShareList, ShareRequest, SnapshotRequest, UnmountRequest,
};
use dataset::{
    Caller, DatasetInfo, DestroyOptions, DestroyReport, DiffReport, Event, HistoryRecord,
    ImportablePool, PoolSpec, PoolStatus, PoolSummary, PoolVersions, ScrubAction,
};
use serde::de::DeserializeOwned;
use std::io;
use std::path::PathBuf;
use std::time::Duration;
use ureq::http::Response;
use ureq::Body;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing answered at the URL.
    #[error("cannot reach the daemon at {url}: is `cistern serve` running? ({reason})")]
    Unreachable { url: String, reason: String },
    /// The daemon answered with an error.
    #[error("{message}")]
    Api {
        status: u16,
        kind: String,
        message: String,
    },
    /// Connected, but no answer in time.
    #[error("the daemon at {url} did not answer within {secs} s")]
    Timeout { url: String, secs: u64 },
    /// The daemon answered something we do not understand.
    #[error("unexpected answer from {url}: {reason}")]
    Protocol { url: String, reason: String },
    /// The client's own TLS settings (`--ca`) are unusable.
    #[error("{0}")]
    Tls(String),
}

impl ClientError {
    /// The engine error kind (`NotFound`, ...) if the daemon sent one.
    pub fn kind(&self) -> Option<&str> {
        match self {
            ClientError::Api { kind, .. } => Some(kind),
            _ => None,
        }
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// Largest JSON answer read (a listing of 10,000 snapshots is ~15 MiB).
const MAX_RESPONSE_BYTES: u64 = 512 << 20;

/// A handle on one daemon's API. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    base: String,
    agent: ureq::Agent,
    timeout: Duration,
    caller: Option<Caller>,
    /// Sent as `Authorization: Bearer` (crate::auth).
    token: Option<String>,
    /// Whom an `https://` daemon's certificate must chain to.
    tls: ureq::tls::TlsConfig,
}

impl Client {
    /// `base` is like `http://127.0.0.1:10810` (a trailing `/` is ignored;
    /// a bare `host:port` gets `http://`).
    pub fn new(base: &str) -> Self {
        // Pool creation and import can take a while on big devices.
        Self::with_timeout(base, Duration::from_secs(600))
    }

    /// Like [`Client::new`] with a bound on each whole call.
    pub fn with_timeout(base: &str, timeout: Duration) -> Self {
        let base = base.trim_end_matches('/');
        let base = if base.contains("://") {
            base.to_string()
        } else {
            format!("http://{base}")
        };
        // The token of a daemon this user runs here, if it published one.
        let token = crate::auth::token_for(&base);
        // Only an https:// daemon needs roots (the system bundle is parsed then).
        let roots = match base.starts_with("https://") {
            true => system_roots().unwrap_or(ureq::tls::RootCerts::WebPki),
            false => ureq::tls::RootCerts::WebPki,
        };
        let tls = tls_config(roots);
        Self {
            agent: agent(timeout, None, token.clone(), tls.clone()),
            base,
            timeout,
            caller: None,
            token,
            tls,
        }
    }

    /// Trusts the CA certificates of the PEM file `ca` (`--ca`,
    /// `CISTERN_CA`) for an `https://` daemon, instead of the system's.
    pub fn with_ca(mut self, ca: &std::path::Path) -> Result<Self> {
        let pem = std::fs::read(ca)
            .map_err(|e| ClientError::Tls(format!("cannot read CA file {}: {e}", ca.display())))?;
        let certs: Vec<_> = ureq::tls::parse_pem(&pem)
            .filter_map(|i| match i {
                Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                _ => None,
            })
            .collect();
        if certs.is_empty() {
            return Err(ClientError::Tls(format!(
                "CA file {} holds no PEM certificate",
                ca.display()
            )));
        }
        self.tls = tls_config(ureq::tls::RootCerts::new_with_certs(&certs));
        self.agent = self.make_agent(self.timeout);
        Ok(self)
    }

    fn make_agent(&self, timeout: Duration) -> ureq::Agent {
        agent(
            timeout,
            self.caller.clone(),
            self.token.clone(),
            self.tls.clone(),
        )
    }

    /// Sends who runs what with every request ([`crate::HEADER_COMMAND`]...),
    /// so that the pools' histories record it.
    pub fn with_caller(mut self, caller: Caller) -> Self {
        self.caller = Some(caller);
        self.agent = self.make_agent(self.timeout);
        self
    }

    /// The same daemon and credentials with another bound on each call.
    pub fn with_call_timeout(&self, timeout: Duration) -> Self {
        Self {
            agent: self.make_agent(timeout),
            base: self.base.clone(),
            timeout,
            caller: self.caller.clone(),
            token: self.token.clone(),
            tls: self.tls.clone(),
        }
    }

    /// The token and caller sent with every request, for crate::send_local.
    pub(crate) fn credentials(&self) -> (Option<&str>, Option<&Caller>) {
        (self.token.as_deref(), self.caller.as_ref())
    }

    /// Authenticates with `token` (`--token`, `CISTERN_TOKEN`) instead of the
    /// discovered one.
    pub fn with_token(mut self, token: String) -> Self {
        self.token = Some(token);
        self.agent = self.make_agent(self.timeout);
        self
    }

    /// `POST /v1/pools/{pool}/attach`.
    pub fn attach(
        &self,
        pool: &str,
        device: &str,
        new: &std::path::Path,
        force: bool,
    ) -> Result<PoolStatus> {
        let body = AttachRequest {
            device: device.to_string(),
            new: new.to_path_buf(),
            force,
        };
        self.decode(
            self.agent
                .post(self.pool_url(pool, "/attach"))
                .send_json(&body),
        )
    }

    /// `POST /v1/pools/{pool}/detach`.
    pub fn detach(&self, pool: &str, device: &str) -> Result<PoolStatus> {
        let body = DeviceRequest {
            device: device.to_string(),
        };
        self.decode(
            self.agent
                .post(self.pool_url(pool, "/detach"))
                .send_json(&body),
        )
    }

    /// `POST /v1/pools/{pool}/remove`.
    pub fn remove(&self, pool: &str, device: &str) -> Result<PoolStatus> {
        let body = DeviceRequest {
            device: device.to_string(),
        };
        self.decode(
            self.agent
                .post(self.pool_url(pool, "/remove"))
                .send_json(&body),
        )
    }

    /// `GET` (versions) or `POST` (upgrade) `/v1/pools/{pool}/upgrade`.
    pub fn upgrade(&self, pool: &str, apply: bool) -> Result<PoolVersions> {
        let url = self.pool_url(pool, "/upgrade");
        if apply {
            self.decode(self.agent.post(url).send_empty())
        } else {
            self.decode(self.agent.get(url).call())
        }
    }

    /// `GET /v1/pools/{pool}/history`.
    pub fn history(&self, pool: &str) -> Result<Vec<HistoryRecord>> {
        self.decode(self.agent.get(self.pool_url(pool, "/history")).call())
    }

    /// `GET /v1/events`: events after `after` of `pools` (all if empty),
    /// waiting up to `wait` for one.
    pub fn events(&self, after: u64, pools: &[String], wait: Duration) -> Result<Vec<Event>> {
        let mut req = self
            .agent
            .get(self.url("/v1/events"))
            .query("after", after.to_string())
            .query("wait_ms", wait.as_millis().to_string());
        for p in pools {
            req = req.query("pool", p);
        }
        self.decode(req.call())
    }

    /// `DELETE /v1/events`: returns how many were cleared.
    pub fn clear_events(&self, pools: &[String]) -> Result<u64> {
        let mut req = self.agent.delete(self.url("/v1/events"));
        for p in pools {
            req = req.query("pool", p);
        }
        let v: serde_json::Value = self.decode(req.call())?;
        Ok(v.get("cleared").and_then(|c| c.as_u64()).unwrap_or(0))
    }

    /// `POST /v1/labelclear`.
    pub fn labelclear(&self, device: &std::path::Path, force: bool) -> Result<()> {
        let body = LabelclearRequest {
            device: device.to_path_buf(),
            force,
        };
        self.expect_empty(self.agent.post(self.url("/v1/labelclear")).send_json(&body))
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    fn transport_error(&self, err: ureq::Error) -> ClientError {
        let url = self.base.clone();
        match err {
            ureq::Error::Io(e) => match e.kind() {
                io::ErrorKind::ConnectionRefused => ClientError::Unreachable {
                    url,
                    reason: "connection refused".into(),
                },
                io::ErrorKind::TimedOut => ClientError::Unreachable {
                    url,
                    reason: "connection timed out".into(),
                },
                io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::UnexpectedEof => ClientError::Unreachable {
                    url,
                    reason: format!("connection lost: {e}"),
                },
                _ => ClientError::Unreachable {
                    url,
                    reason: e.to_string(),
                },
            },
            ureq::Error::HostNotFound => ClientError::Unreachable {
                url,
                reason: "host not found".into(),
            },
            ureq::Error::ConnectionFailed => ClientError::Unreachable {
                url,
                reason: "connection failed".into(),
            },
            ureq::Error::Timeout(ureq::Timeout::Connect | ureq::Timeout::Resolve) => {
                ClientError::Unreachable {
                    url,
                    reason: "connection timed out".into(),
                }
            }
            ureq::Error::Timeout(_) => ClientError::Timeout {
                url,
                secs: self.timeout.as_secs(),
            },
            ureq::Error::BadUri(u) => ClientError::Protocol {
                url,
                reason: format!("bad URL {u}"),
            },
            other => ClientError::Protocol {
                url,
                reason: other.to_string(),
            },
        }
    }

    /// Turns a response into `T`, or its error body into [`ClientError::Api`].
    /// ureq's default 10 MiB cut `list -t snapshot` off at ~8,000 snapshots.
    fn decode<T: DeserializeOwned>(
        &self,
        resp: std::result::Result<Response<Body>, ureq::Error>,
    ) -> Result<T> {
        let mut resp = resp.map_err(|e| self.transport_error(e))?;
        let status = resp.status();
        if status.is_success() {
            return resp
                .body_mut()
                .with_config()
                .limit(MAX_RESPONSE_BYTES)
                .read_json::<T>()
                .map_err(|e| ClientError::Protocol {
                    url: self.base.clone(),
                    reason: format!("bad response body: {e}"),
                });
        }
        Err(self.api_error(status.as_u16(), &mut resp))
    }

    /// Like [`decode`] for responses without a body.
    fn expect_empty(&self, resp: std::result::Result<Response<Body>, ureq::Error>) -> Result<()> {
        let mut resp = resp.map_err(|e| self.transport_error(e))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        Err(self.api_error(status.as_u16(), &mut resp))
    }

    fn api_error(&self, status: u16, resp: &mut Response<Body>) -> ClientError {
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        match serde_json::from_str::<ErrorBody>(&text) {
            Ok(b) => ClientError::Api {
                status,
                kind: b.kind,
                message: b.error,
            },
            Err(_) => {
                let text = text.trim();
                let message = if text.is_empty() {
                    format!("the daemon answered HTTP {status}")
                } else {
                    format!("the daemon answered HTTP {status}: {text}")
                };
                ClientError::Api {
                    status,
                    kind: "Http".into(),
                    message,
                }
            }
        }
    }

    /// A client for one stream transfer: no bound on the whole call
    /// (a send takes as long as its data), the same credentials.
    fn streaming(&self) -> ureq::Agent {
        agent_with_buffers(
            Duration::from_secs(30 * 24 * 3600),
            self.caller.clone(),
            self.token.clone(),
            self.tls.clone(),
            STREAM_BUF,
        )
    }

    /// `POST /v1/send`: the stream of `opts` copied into `out` as it
    /// arrives; returns its length.
    pub fn send(&self, opts: &dataset::SendOptions, out: &mut dyn io::Write) -> Result<u64> {
        let mut resp = self
            .streaming()
            .post(self.url("/v1/send"))
            .send_json(opts)
            .map_err(|e| self.transport_error(e))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(self.api_error(status.as_u16(), &mut resp));
        }
        let mut body = resp.body_mut().with_config().limit(u64::MAX).reader();
        copy_stream(&mut body, out).map_err(|e| ClientError::Protocol {
            url: self.base.clone(),
            reason: format!("send stream: {e}"),
        })
    }

    /// `POST /v1/send?dry_run=1`: the estimated stream size (`send -n`).
    pub fn send_estimate(&self, opts: &dataset::SendOptions) -> Result<u64> {
        let e: crate::send::SendEstimate = self.decode(
            self.agent
                .post(self.url("/v1/send"))
                .query("dry_run", "1")
                .send_json(opts),
        )?;
        Ok(e.bytes)
    }

    /// `POST /v1/receive`: uploads the stream read from `inp`.
    pub fn receive(
        &self,
        opts: &dataset::ReceiveOptions,
        inp: &mut dyn io::Read,
    ) -> Result<dataset::ReceiveSummary> {
        let req = self
            .streaming()
            .post(self.url("/v1/receive"))
            .query("target", &opts.target)
            .query("force", if opts.force { "1" } else { "0" })
            .query("resumable", if opts.resumable { "1" } else { "0" })
            .header("content-type", "application/octet-stream");
        self.decode(req.send(ureq::SendBody::from_reader(inp)))
    }

    /// `GET /v1/receive?wait_ms=`: waits (at most `wait`) until no receive
    /// into `target` runs, so its `receive_resume_token` is final.
    pub fn receive_wait(&self, target: &str, wait: Duration) -> Result<()> {
        let ms = wait.as_millis().min(u64::MAX as u128) as u64;
        self.expect_empty(
            self.with_call_timeout(self.timeout.max(wait + Duration::from_secs(30)))
                .agent
                .get(self.url("/v1/receive"))
                .query("target", target)
                .query("wait_ms", ms.to_string())
                .call(),
        )
    }

    /// `DELETE /v1/receive`: discards a partially received state (`receive -A`).
    pub fn receive_abort(&self, target: &str) -> Result<()> {
        self.expect_empty(
            self.agent
                .delete(self.url("/v1/receive"))
                .query("target", target)
                .call(),
        )
    }

    /// `POST /v1/bookmarks`: `cistern bookmark SNAP BOOKMARK`.
    pub fn bookmark(&self, snapshot: &str, bookmark: &str) -> Result<()> {
        let body = crate::send::BookmarkRequest {
            snapshot: snapshot.to_string(),
            bookmark: bookmark.to_string(),
        };
        self.expect_empty(self.agent.post(self.url("/v1/bookmarks")).send_json(&body))
    }

    /// `GET /v1/bookmarks`: those of `root` and below (all without it).
    pub fn bookmarks(&self, root: Option<&str>) -> Result<Vec<dataset::BookmarkInfo>> {
        let mut req = self.agent.get(self.url("/v1/bookmarks"));
        if let Some(r) = root {
            req = req.query("root", r);
        }
        self.decode(req.call())
    }

    pub fn health(&self) -> Result<Health> {
        self.decode(self.agent.get(self.url("/v1/health")).call())
    }

    pub fn list_pools(&self) -> Result<Vec<PoolSummary>> {
        self.decode(self.agent.get(self.url("/v1/pools")).call())
    }

    pub fn create_pool(&self, spec: &PoolSpec) -> Result<PoolStatus> {
        self.decode(self.agent.post(self.url("/v1/pools")).send_json(spec))
    }

    /// `GET /v1/pools/{pool}/iostat`: cumulative per-device I/O counters.
    pub fn pool_iostat(&self, pool: &str) -> Result<dataset::PoolIostat> {
        self.decode(self.agent.get(self.pool_url(pool, "/iostat")).call())
    }

    pub fn pool_status(&self, pool: &str) -> Result<PoolStatus> {
        self.decode(self.agent.get(self.pool_url(pool, "")).call())
    }

    pub fn destroy_pool(&self, pool: &str) -> Result<()> {
        self.destroy_pool_with(pool, false)
    }

    /// `force`: disconnect clients of the pool's datasets instead of refusing.
    pub fn destroy_pool_with(&self, pool: &str, force: bool) -> Result<()> {
        self.expect_empty(
            self.agent
                .delete(self.pool_url(pool, ""))
                .query("force", force.to_string())
                .call(),
        )
    }

    pub fn export_pool(&self, pool: &str) -> Result<()> {
        self.export_pool_with(pool, false)
    }

    /// `force`: disconnect clients of the pool's datasets instead of refusing.
    pub fn export_pool_with(&self, pool: &str, force: bool) -> Result<()> {
        self.expect_empty(
            self.agent
                .post(self.pool_url(pool, "/export"))
                .query("force", force.to_string())
                .send_empty(),
        )
    }

    /// Starts, pauses or stops a scrub.
    pub fn scrub(&self, pool: &str, action: ScrubAction) -> Result<PoolStatus> {
        self.decode(
            self.agent
                .post(self.pool_url(pool, "/scrub"))
                .send_json(&ScrubRequest { action }),
        )
    }

    pub fn offline(&self, pool: &str, device: &str) -> Result<PoolStatus> {
        let body = DeviceRequest {
            device: device.to_string(),
        };
        self.decode(
            self.agent
                .post(self.pool_url(pool, "/offline"))
                .send_json(&body),
        )
    }

    pub fn online(&self, pool: &str, device: &str) -> Result<PoolStatus> {
        let body = DeviceRequest {
            device: device.to_string(),
        };
        self.decode(
            self.agent
                .post(self.pool_url(pool, "/online"))
                .send_json(&body),
        )
    }

    pub fn clear(&self, pool: &str, device: Option<&str>) -> Result<PoolStatus> {
        let body = ClearRequest {
            device: device.map(str::to_string),
        };
        self.decode(
            self.agent
                .post(self.pool_url(pool, "/clear"))
                .send_json(&body),
        )
    }

    pub fn replace(
        &self,
        pool: &str,
        old: &str,
        new: &std::path::Path,
        force: bool,
    ) -> Result<PoolStatus> {
        let body = ReplaceRequest {
            old: old.to_string(),
            new: new.to_path_buf(),
            force,
        };
        self.decode(
            self.agent
                .post(self.pool_url(pool, "/replace"))
                .send_json(&body),
        )
    }

    /// `POST /v1/pools/{pool}/add`: append groups to a pool.
    pub fn pool_add(&self, pool: &str, spec: &dataset::PoolAddSpec) -> Result<PoolStatus> {
        self.decode(self.agent.post(self.pool_url(pool, "/add")).send_json(spec))
    }

    /// `POST /v1/pools/{pool}/cache`: add L2ARC cache devices.
    pub fn pool_add_cache(&self, pool: &str, spec: &dataset::CacheAddSpec) -> Result<PoolStatus> {
        self.decode(
            self.agent
                .post(self.pool_url(pool, "/cache"))
                .send_json(spec),
        )
    }

    pub fn importable_pools(&self, dirs: &[PathBuf]) -> Result<Vec<ImportablePool>> {
        let mut req = self.agent.get(self.url("/v1/import"));
        for d in dirs {
            req = req.query("dir", d.to_string_lossy());
        }
        self.decode(req.call())
    }

    pub fn import_pool(&self, pool: &str, dirs: &[PathBuf], force: bool) -> Result<PoolStatus> {
        self.import_pool_with(pool, dirs, force, false)
    }

    /// `missing_log`: `pool import -m` (a missing log device's records may be lost).
    pub fn import_pool_with(
        &self,
        pool: &str,
        dirs: &[PathBuf],
        force: bool,
        missing_log: bool,
    ) -> Result<PoolStatus> {
        let body = ImportRequest {
            pool: pool.to_string(),
            dirs: dirs.to_vec(),
            force,
            missing_log,
        };
        self.decode(self.agent.post(self.url("/v1/import")).send_json(&body))
    }

    pub fn list_datasets(&self, root: Option<&str>) -> Result<Vec<DatasetInfo>> {
        let mut req = self.agent.get(self.url("/v1/datasets"));
        if let Some(root) = root {
            req = req.query("root", root);
        }
        self.decode(req.call())
    }

    pub fn create_volume(
        &self,
        name: &str,
        volsize: u64,
        properties: &[(String, String)],
    ) -> Result<DatasetInfo> {
        self.create_volume_keyed(name, volsize, properties, None)
    }

    /// [`Client::create_volume`] with the key of a new encryption root.
    pub fn create_volume_keyed(
        &self,
        name: &str,
        volsize: u64,
        properties: &[(String, String)],
        key: Option<dataset::KeyMaterial>,
    ) -> Result<DatasetInfo> {
        let body = CreateVolume {
            name: name.to_string(),
            volsize,
            properties: properties.to_vec(),
            kind: None,
            key,
        };
        self.decode(self.agent.post(self.url("/v1/datasets")).send_json(&body))
    }

    /// `POST /v1/datasets` for a dataset that is not a volume (a bucket).
    pub fn create_dataset(
        &self,
        name: &str,
        kind: dataset::DatasetKind,
        properties: &[(String, String)],
    ) -> Result<DatasetInfo> {
        self.create_dataset_keyed(name, kind, properties, None)
    }

    /// [`Client::create_dataset`] with the key of a new encryption root.
    pub fn create_dataset_keyed(
        &self,
        name: &str,
        kind: dataset::DatasetKind,
        properties: &[(String, String)],
        key: Option<dataset::KeyMaterial>,
    ) -> Result<DatasetInfo> {
        let body = CreateVolume {
            name: name.to_string(),
            volsize: 0,
            properties: properties.to_vec(),
            kind: Some(kind),
            key,
        };
        self.decode(self.agent.post(self.url("/v1/datasets")).send_json(&body))
    }

    /// `POST /v1/keys/load`.
    pub fn load_key(&self, req: &crate::LoadKeyRequest) -> Result<crate::KeyResult> {
        self.decode(self.agent.post(self.url("/v1/keys/load")).send_json(req))
    }

    /// `POST /v1/keys/unload`.
    pub fn unload_key(&self, req: &crate::UnloadKeyRequest) -> Result<crate::KeyResult> {
        self.decode(self.agent.post(self.url("/v1/keys/unload")).send_json(req))
    }

    /// `POST /v1/keys/change`.
    pub fn change_key(&self, req: &crate::ChangeKeyRequest) -> Result<crate::KeyResult> {
        self.decode(self.agent.post(self.url("/v1/keys/change")).send_json(req))
    }

    /// `GET /v1/mounts`.
    pub fn mounts(&self) -> Result<Vec<fuse::MountInfo>> {
        self.decode(self.agent.get(self.url("/v1/mounts")).call())
    }

    /// `POST /v1/mounts`.
    pub fn mount(&self, req: &MountRequest) -> Result<Vec<fuse::MountInfo>> {
        self.decode(self.agent.post(self.url("/v1/mounts")).send_json(req))
    }

    /// `POST /v1/unmount`.
    pub fn unmount(&self, req: &UnmountRequest) -> Result<Vec<fuse::MountInfo>> {
        self.decode(self.agent.post(self.url("/v1/unmount")).send_json(req))
    }

    /// `GET /v1/users`.
    pub fn users(&self) -> Result<Vec<s3::access::UserInfo>> {
        self.decode(self.agent.get(self.url("/v1/users")).call())
    }

    /// `POST /v1/users`: the answer holds the secret, shown this once.
    pub fn add_user(
        &self,
        name: &str,
        grants: &[s3::access::Grant],
    ) -> Result<s3::access::NewUser> {
        let body = AddUser {
            name: name.to_string(),
            grants: grants.to_vec(),
        };
        self.decode(self.agent.post(self.url("/v1/users")).send_json(&body))
    }

    /// `DELETE /v1/users/{user}`.
    pub fn remove_user(&self, name: &str) -> Result<()> {
        self.expect_empty(self.agent.delete(self.user_url(name, "")).call())
    }

    /// `POST /v1/users/{user}/grants`.
    pub fn grant(
        &self,
        name: &str,
        bucket: &str,
        access: s3::access::Access,
    ) -> Result<s3::access::UserInfo> {
        let body = GrantRequest {
            bucket: bucket.to_string(),
            access,
        };
        self.decode(
            self.agent
                .post(self.user_url(name, "/grants"))
                .send_json(&body),
        )
    }

    /// `DELETE /v1/users/{user}/grants?bucket=`.
    pub fn revoke(&self, name: &str, bucket: &str) -> Result<s3::access::UserInfo> {
        self.decode(
            self.agent
                .delete(self.user_url(name, "/grants"))
                .query("bucket", bucket)
                .call(),
        )
    }

    fn user_url(&self, name: &str, suffix: &str) -> String {
        format!(
            "{}/v1/users/{}{}",
            self.base,
            percent_encode_segment(name),
            suffix
        )
    }

    pub fn dataset(&self, name: &str) -> Result<DatasetInfo> {
        self.decode(
            self.agent
                .get(self.url("/v1/dataset"))
                .query("name", name)
                .call(),
        )
    }

    /// `cistern pool get`: the pool's properties.
    pub fn pool_properties(&self, pool: &str) -> Result<Vec<dataset::Property>> {
        self.decode(self.agent.get(self.pool_url(pool, "/properties")).call())
    }

    /// `cistern pool set PROP=VALUE POOL`; returns the properties after the change.
    pub fn set_pool_property(
        &self,
        pool: &str,
        property: &str,
        value: &str,
    ) -> Result<Vec<dataset::Property>> {
        let body = SetProperty {
            property: property.to_string(),
            value: value.to_string(),
        };
        self.decode(
            self.agent
                .patch(self.pool_url(pool, "/properties"))
                .send_json(&body),
        )
    }

    pub fn set_property(&self, name: &str, property: &str, value: &str) -> Result<DatasetInfo> {
        let body = SetProperty {
            property: property.to_string(),
            value: value.to_string(),
        };
        self.decode(
            self.agent
                .patch(self.url("/v1/dataset"))
                .query("name", name)
                .send_json(&body),
        )
    }

    pub fn destroy(&self, name: &str, opts: &DestroyOptions) -> Result<DestroyReport> {
        self.decode(
            self.agent
                .delete(self.url("/v1/dataset"))
                .query("name", name)
                .query("recursive", opts.recursive.to_string())
                .query("dry_run", opts.dry_run.to_string())
                .query("force", opts.force.to_string())
                .query("dependents", opts.dependents.to_string())
                .call(),
        )
    }

    pub fn snapshot(&self, names: &[String], recursive: bool) -> Result<Vec<String>> {
        let body = SnapshotRequest {
            names: names.to_vec(),
            recursive,
        };
        self.decode(self.agent.post(self.url("/v1/snapshots")).send_json(&body))
    }

    /// Returns the newer snapshots destroyed on the way (`-r`).
    pub fn rollback(&self, snapshot: &str, recursive: bool) -> Result<Vec<String>> {
        self.rollback_with(snapshot, recursive, false)
    }

    /// `force`: disconnect the dataset's clients instead of refusing.
    pub fn rollback_with(
        &self,
        snapshot: &str,
        recursive: bool,
        force: bool,
    ) -> Result<Vec<String>> {
        let body = RollbackRequest {
            snapshot: snapshot.to_string(),
            recursive,
            force,
            dry_run: false,
        };
        self.decode(self.agent.post(self.url("/v1/rollback")).send_json(&body))
    }

    /// `rollback -n`: what a rollback (-r) to `snapshot` would destroy and discard.
    pub fn rollback_preview(&self, snapshot: &str) -> Result<dataset::RollbackPreview> {
        let body = RollbackRequest {
            snapshot: snapshot.to_string(),
            recursive: true,
            force: false,
            dry_run: true,
        };
        self.decode(self.agent.post(self.url("/v1/rollback")).send_json(&body))
    }

    pub fn clone_snapshot(
        &self,
        snapshot: &str,
        name: &str,
        properties: &[(String, String)],
    ) -> Result<DatasetInfo> {
        let body = CloneRequest {
            snapshot: snapshot.to_string(),
            name: name.to_string(),
            properties: properties.to_vec(),
        };
        self.decode(self.agent.post(self.url("/v1/clone")).send_json(&body))
    }

    pub fn promote(&self, name: &str) -> Result<()> {
        self.expect_empty(
            self.agent
                .post(self.url("/v1/promote"))
                .query("name", name)
                .send_empty(),
        )
    }

    /// Returns the new names.
    pub fn rename(&self, from: &str, to: &str, recursive: bool) -> Result<Vec<String>> {
        let body = RenameRequest {
            from: from.to_string(),
            to: to.to_string(),
            recursive,
        };
        self.decode(self.agent.post(self.url("/v1/rename")).send_json(&body))
    }

    /// `cistern share`: `dataset` None for `-a`; `protocol` None for every protocol.
    pub fn share(&self, dataset: Option<&str>, protocol: Option<&str>) -> Result<ShareList> {
        let body = ShareRequest {
            dataset: dataset.map(str::to_string),
            protocol: protocol.map(str::to_string),
        };
        self.decode(self.agent.post(self.url("/v1/shares")).send_json(&body))
    }

    /// `cistern unshare`; returns the shares removed.
    pub fn unshare(&self, dataset: Option<&str>, protocol: Option<&str>) -> Result<ShareList> {
        let body = ShareRequest {
            dataset: dataset.map(str::to_string),
            protocol: protocol.map(str::to_string),
        };
        self.decode(
            self.agent
                .delete(self.url("/v1/shares"))
                .force_send_body()
                .send_json(&body),
        )
    }

    pub fn shares(&self) -> Result<ShareList> {
        self.decode(self.agent.get(self.url("/v1/shares")).call())
    }

    pub fn inherit(&self, name: &str, property: &str, recursive: bool) -> Result<()> {
        let body = InheritRequest {
            name: name.to_string(),
            property: property.to_string(),
            recursive,
        };
        self.expect_empty(self.agent.post(self.url("/v1/inherit")).send_json(&body))
    }

    pub fn set_hold(
        &self,
        tag: &str,
        snapshots: &[String],
        recursive: bool,
        hold: bool,
    ) -> Result<()> {
        let body = HoldRequest {
            tag: tag.to_string(),
            snapshots: snapshots.to_vec(),
            recursive,
        };
        let url = self.url("/v1/holds");
        let req = if hold {
            self.agent.post(url).send_json(&body)
        } else {
            self.agent.delete(url).force_send_body().send_json(&body)
        };
        self.expect_empty(req)
    }

    pub fn holds(&self, snapshots: &[String]) -> Result<Vec<(String, String)>> {
        self.decode(
            self.agent
                .get(self.url("/v1/holds"))
                .query("name", snapshots.join(","))
                .call(),
        )
    }

    pub fn diff(&self, from: &str, to: Option<&str>) -> Result<DiffReport> {
        let mut req = self.agent.get(self.url("/v1/diff")).query("from", from);
        if let Some(to) = to {
            req = req.query("to", to);
        }
        self.decode(req.call())
    }

    pub fn policies(&self) -> Result<Vec<dataset::PolicyInfo>> {
        self.decode(self.agent.get(self.url("/v1/policies")).call())
    }

    pub fn policy_show(&self, dataset: &str) -> Result<dataset::PolicyShow> {
        self.decode(
            self.agent
                .get(self.url("/v1/policy"))
                .query("name", dataset)
                .call(),
        )
    }

    pub fn policy_run(&self, dataset: &str, dry_run: bool) -> Result<dataset::PolicyRun> {
        let body = crate::PolicyRunRequest {
            dataset: dataset.to_string(),
            dry_run,
        };
        self.decode(self.agent.post(self.url("/v1/policy/run")).send_json(&body))
    }

    pub fn policy_history(&self, dataset: Option<&str>) -> Result<Vec<dataset::PolicyRun>> {
        let mut req = self.agent.get(self.url("/v1/policy/history"));
        if let Some(d) = dataset {
            req = req.query("name", d);
        }
        self.decode(req.call())
    }

    /// The Prometheus text of `/metrics`.
    pub fn metrics(&self) -> Result<String> {
        let mut resp = self
            .agent
            .get(self.url("/metrics"))
            .call()
            .map_err(|e| self.transport_error(e))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(self.api_error(status.as_u16(), &mut resp));
        }
        resp.body_mut()
            .read_to_string()
            .map_err(|e| ClientError::Protocol {
                url: self.base.clone(),
                reason: format!("bad response body: {e}"),
            })
    }

    fn pool_url(&self, pool: &str, suffix: &str) -> String {
        format!(
            "{}/v1/pools/{}{}",
            self.base,
            percent_encode_segment(pool),
            suffix
        )
    }
}

/// Percent-encodes everything but unreserved characters (RFC 3986) for a path segment.
fn percent_encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The HTTP agent: errors as values, no proxy, bounded in time, and the
/// caller's headers on every request when given.
fn tls_config(roots: ureq::tls::RootCerts) -> ureq::tls::TlsConfig {
    ureq::tls::TlsConfig::builder().root_certs(roots).build()
}

/// The system's CA bundle (`SSL_CERT_FILE`, else Debian's and Red Hat's
/// paths); None: ureq's built-in Mozilla roots.
fn system_roots() -> Option<ureq::tls::RootCerts> {
    let candidates = std::env::var_os("SSL_CERT_FILE")
        .map(PathBuf::from)
        .into_iter()
        .chain([
            PathBuf::from("/etc/ssl/certs/ca-certificates.crt"),
            PathBuf::from("/etc/pki/tls/certs/ca-bundle.crt"),
        ]);
    for path in candidates {
        let Ok(pem) = std::fs::read(&path) else {
            continue;
        };
        let certs: Vec<_> = ureq::tls::parse_pem(&pem)
            .filter_map(|i| match i {
                Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                _ => None,
            })
            .collect();
        if !certs.is_empty() {
            return Some(ureq::tls::RootCerts::new_with_certs(&certs));
        }
    }
    None
}

/// Buffer size of a stream transfer's connection and copies: io::copy's
/// 8 KiB (and ureq's 128 KiB) pieces cost a system call and often a
/// context switch each (issue 14's profile of `send | receive`).
pub const STREAM_BUF: usize = 1 << 20;

/// Copies a stream in [`STREAM_BUF`] pieces; returns the bytes copied.
pub fn copy_stream(inp: &mut dyn io::Read, out: &mut dyn io::Write) -> io::Result<u64> {
    let mut buf = vec![0u8; STREAM_BUF];
    let mut n = 0u64;
    loop {
        let got = match inp.read(&mut buf) {
            Ok(0) => return Ok(n),
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        out.write_all(&buf[..got])?;
        n += got as u64;
    }
}

fn agent(
    timeout: Duration,
    caller: Option<Caller>,
    token: Option<String>,
    tls: ureq::tls::TlsConfig,
) -> ureq::Agent {
    agent_with_buffers(timeout, caller, token, tls, 128 << 10)
}

/// [`agent`] with `buffers` bytes of input and output buffer (ureq's
/// default is 128 KiB; a stream transfer takes [`STREAM_BUF`]).
fn agent_with_buffers(
    timeout: Duration,
    caller: Option<Caller>,
    token: Option<String>,
    tls: ureq::tls::TlsConfig,
    buffers: usize,
) -> ureq::Agent {
    let mut config = ureq::Agent::config_builder()
        .tls_config(tls)
        .input_buffer_size(buffers)
        .output_buffer_size(buffers)
        .http_status_as_error(false)
        .proxy(None)
        .timeout_connect(Some(Duration::from_secs(5)))
        .timeout_global(Some(timeout));
    let mut headers = Vec::new();
    if let Some(c) = caller {
        headers.extend([
            (crate::HEADER_COMMAND, crate::encode_header(&c.command)),
            (crate::HEADER_USER, crate::encode_header(&c.user)),
            (crate::HEADER_HOST, crate::encode_header(&c.host)),
        ]);
    }
    if let Some(t) = token {
        headers.push(("authorization", format!("Bearer {t}")));
    }
    if !headers.is_empty() {
        config = config.middleware(
            move |mut req: ureq::http::Request<ureq::SendBody>,
                  next: ureq::middleware::MiddlewareNext| {
                for (name, value) in &headers {
                    if let Ok(v) = ureq::http::HeaderValue::from_str(value) {
                        req.headers_mut().insert(*name, v);
                    }
                }
                next.handle(req)
            },
        );
    }
    config.build().into()
}

/// Generic calls and streams, for daemon-to-daemon use (crates/replication).
impl Client {
    /// `GET path?query` decoded as `T`.
    pub fn get_json<T: DeserializeOwned>(&self, path: &str, query: &[(&str, &str)]) -> Result<T> {
        let mut req = self.agent.get(self.url(path));
        for (k, v) in query {
            req = req.query(*k, *v);
        }
        self.decode(req.call())
    }

    /// `POST path?query` with a JSON body, decoded as `T`.
    pub fn post_json<B: serde::Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, &str)],
        body: &B,
    ) -> Result<T> {
        let mut req = self.agent.post(self.url(path));
        for (k, v) in query {
            req = req.query(*k, *v);
        }
        self.decode(req.send_json(body))
    }

    /// `DELETE path` decoded as `T`.
    pub fn delete_json<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.decode(self.agent.delete(self.url(path)).call())
    }

    /// An agent for long streams: no bound on the whole call, but each read
    /// and write must progress within `stall` (a stopped peer is an error).
    fn stream_agent(&self, stall: Duration) -> ureq::Agent {
        let mut config = ureq::Agent::config_builder()
            .tls_config(self.tls.clone())
            .http_status_as_error(false)
            .proxy(None)
            .timeout_connect(Some(Duration::from_secs(10)))
            .input_buffer_size(STREAM_BUF)
            .output_buffer_size(STREAM_BUF)
            .timeout_per_read(Some(stall))
            .timeout_per_write(Some(stall));
        if let Some(t) = self.token.clone() {
            let v = format!("Bearer {t}");
            config = config.middleware(
                move |mut req: ureq::http::Request<ureq::SendBody>,
                      next: ureq::middleware::MiddlewareNext| {
                    if let Ok(v) = ureq::http::HeaderValue::from_str(&v) {
                        req.headers_mut().insert("authorization", v);
                    }
                    next.handle(req)
                },
            );
        }
        config.build().into()
    }

    /// `POST path?query` whose body is read from `body` as it goes
    /// (chunked; never held whole), decoded as `T`.
    pub fn post_stream<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, &str)],
        body: Box<dyn io::Read + Send>,
        stall: Duration,
    ) -> Result<T> {
        let mut req = self.stream_agent(stall).post(self.url(path));
        for (k, v) in query {
            req = req.query(*k, *v);
        }
        req = req.header("content-type", "application/octet-stream");
        let mut body = body;
        // A stall is a timeout of `stall`, not of the client's whole-call bound.
        self.decode(req.send(ureq::SendBody::from_reader(&mut body)))
            .map_err(|e| match e {
                ClientError::Timeout { url, .. } => ClientError::Timeout {
                    url,
                    secs: stall.as_secs().max(1),
                },
                e => e,
            })
    }

    /// `POST path?query` with a JSON body whose answer is a stream: returns
    /// a reader of it (an error answer is decoded as usual).
    pub fn post_for_stream<B: serde::Serialize>(
        &self,
        path: &str,
        query: &[(&str, &str)],
        body: &B,
        stall: Duration,
    ) -> Result<Box<dyn io::Read + Send>> {
        let mut req = self.stream_agent(stall).post(self.url(path));
        for (k, v) in query {
            req = req.query(*k, *v);
        }
        let mut resp = req.send_json(body).map_err(|e| self.transport_error(e))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(self.api_error(status.as_u16(), &mut resp));
        }
        let reader = resp.into_body().into_with_config().limit(u64::MAX).reader();
        Ok(Box::new(reader))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_path_segments() {
        assert_eq!(percent_encode_segment("tank"), "tank");
        assert_eq!(percent_encode_segment("a/b c"), "a%2Fb%20c");
    }

    #[test]
    fn normalizes_base_url() {
        assert_eq!(Client::new("127.0.0.1:1/").base_url(), "http://127.0.0.1:1");
        assert_eq!(Client::new("http://h:2//").base_url(), "http://h:2");
    }

    #[test]
    fn refused_connection_is_unreachable() {
        // Bind and drop to get a port nothing listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let c = Client::new(&format!("http://127.0.0.1:{port}"));
        let err = c.health().unwrap_err();
        assert!(matches!(err, ClientError::Unreachable { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!("cannot reach the daemon at http://127.0.0.1:{port}: is `cistern serve` running? (connection refused)")
        );
    }
}

//! `cistern serve`: open the engine, serve NBD, the management API and (when
//! asked) S3 until SIGINT/SIGTERM, then commit and close every pool.

use crate::config::{self, Config, Listen, Overrides, Resolved};
use crate::nbd_adapter::EngineExports;
use anyhow::{Context, Result};
use clap::Args;
use dataset::Engine;
use s3::access::Users;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Directory for the daemon's state (pool cache, ...).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// NBD listen address (default 127.0.0.1:10809).
    #[arg(long, value_name = "ADDR")]
    pub nbd: Option<String>,
    /// Serve S3 at this address (default: only with an [s3] config section,
    /// at 127.0.0.1:10811).
    #[arg(long, value_name = "ADDR")]
    pub s3: Option<String>,
    /// Serve NFSv3 (with MOUNT and portmap GETPORT on the same port) at this
    /// address (default: only with an [nfs] config section, at 127.0.0.1:10812).
    #[arg(long, value_name = "ADDR")]
    pub nfs: Option<String>,
    /// TOML config file ([server] and [engine] sections); flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Listen beyond loopback without TLS (labs only; logged as a warning).
    #[arg(long)]
    pub insecure: bool,
    /// Stand by for a bucket pool: tail its log into a warm cache without
    /// owning it; `cistern pool takeover POOL` makes this daemon the owner.
    #[arg(long, num_args = 2, value_names = ["POOL", "LOCATION"])]
    pub standby: Vec<String>,
}

/// The addresses actually bound (ports resolved when 0 was asked for).
#[derive(Debug, Clone)]
pub struct Endpoints {
    pub nbd: SocketAddr,
    pub api: SocketAddr,
    /// The API speaks HTTPS.
    pub api_https: bool,
    /// None: S3 is not served.
    pub s3: Option<SocketAddr>,
    /// S3 speaks HTTPS.
    pub s3_https: bool,
    /// None: NFS is not served.
    pub nfs: Option<SocketAddr>,
    /// smbd's address (it starts with the first share); None: SMB is off.
    pub smb: Option<SocketAddr>,
    /// The daemon's state directory (smbd's config is under smb/).
    pub state_dir: PathBuf,
}

impl Endpoints {
    pub fn nbd_uri(&self, export: &str) -> String {
        format!("nbd://{}/{}", self.nbd, export)
    }

    pub fn api_url(&self) -> String {
        let scheme = if self.api_https { "https" } else { "http" };
        format!("{scheme}://{}", self.api)
    }

    /// The S3 endpoint URL (path style), if S3 is served.
    pub fn s3_url(&self) -> Option<String> {
        let scheme = if self.s3_https { "https" } else { "http" };
        self.s3.map(|a| format!("{scheme}://{a}"))
    }

    /// What libnfs (nfs-ls, nfs-cp) takes for a filesystem's export.
    pub fn nfs_url(&self, dataset: &str) -> Option<String> {
        self.nfs.map(|a| {
            format!(
                "nfs://{}/{dataset}?nfsport={}&mountport={}&version=3",
                a.ip(),
                a.port(),
                a.port()
            )
        })
    }
}

/// Runs after the engine and the S3 users are open and before serving
/// starts (quickstart's setup).
pub type Setup = Box<dyn FnOnce(&Arc<Engine>, &Arc<Users>) -> Result<()> + Send>;
/// Runs once the endpoints are printed (quickstart prints its volumes).
pub type Announce = Box<dyn FnOnce(&Arc<Engine>, &Endpoints) + Send>;

pub fn main(args: ServeArgs, api_flag: Option<String>) -> Result<()> {
    crate::standby::set(&args.standby)?;
    let cfg = match &args.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    let resolved = config::resolve(
        cfg,
        Overrides {
            state_dir: args.state_dir,
            nbd: args.nbd,
            api: api_flag,
            s3: args.s3,
            s3_by_default: false,
            nfs: args.nfs,
            nfs_by_default: false,
            insecure: args.insecure,
        },
        None,
    )?;
    run(resolved, None, None)
}

pub fn init_logging(filter: &str) -> Result<()> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(env) if !env.trim().is_empty() => tracing_subscriber::EnvFilter::try_new(&env)
            .with_context(|| format!("bad RUST_LOG filter '{env}'"))?,
        _ => tracing_subscriber::EnvFilter::try_new(filter)
            .with_context(|| format!("bad log filter '{filter}'"))?,
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
    Ok(())
}

async fn bind(what: &str, l: &Listen) -> Result<TcpListener> {
    TcpListener::bind(l.addr)
        .await
        .with_context(|| format!("cannot listen for {what} on {}", l.addr))
}

/// glibc malloc settings for a long-running daemon, made before any thread
/// starts (see docs/decisions/0013-bounds-and-busy.md): a fixed
/// mmap threshold of 1 MiB, so NBD payloads and reply queues (1-32 MiB) are
/// mapped and unmapped, going back to the OS when freed (glibc's dynamic
/// threshold otherwise rises to 32 MiB after the first large free, and the
/// arenas keep that memory: 220-300 MiB peak instead of ~90 with 16 stalled
/// clients), and at most 4 arenas (instead of 8 per core) so freed memory is
/// not spread over many. A GLIBC_TUNABLES setting in the environment wins.
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("GLIBC_TUNABLES").is_none() {
        // SAFETY: mallopt only changes allocator parameters; called before
        // the runtime starts its threads.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
            libc::mallopt(libc::M_ARENA_MAX, 4);
        }
    }
}

/// Worker threads of the async runtime (decision 0084): the config's, else
/// one fewer than the CPUs (at least one), so that a CPU is left for the
/// kernel's completion work and the blocking threads: on 2 CPUs, 4K+FLUSH
/// gains 6% and its FLUSH p99 falls by a quarter with one worker instead
/// of two, and nothing measured lost. `None`: tokio's own choice
/// (`TOKIO_WORKER_THREADS`, for measuring, when the config says nothing).
fn runtime_threads(configured: Option<usize>) -> Option<usize> {
    if configured.is_some() {
        return configured;
    }
    if std::env::var_os("TOKIO_WORKER_THREADS").is_some() {
        return None;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    Some(cpus.saturating_sub(1).max(1))
}

/// Serves until a signal; `setup` runs once the engine is open.
pub fn run(r: Resolved, setup: Option<Setup>, announce: Option<Announce>) -> Result<()> {
    tune_malloc();
    init_logging(&r.log)?;
    std::fs::create_dir_all(&r.state_dir)
        .with_context(|| format!("cannot create state directory {}", r.state_dir.display()))?;
    let state_dir = std::path::absolute(&r.state_dir).unwrap_or_else(|_| r.state_dir.clone());
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all().thread_name("cistern");
    if let Some(n) = runtime_threads(r.runtime_threads) {
        rt.worker_threads(n);
    }
    let rt = rt.build().context("cannot start the async runtime")?;
    rt.block_on(serve(r, state_dir, setup, announce))
}

async fn serve(
    r: Resolved,
    state_dir: PathBuf,
    setup: Option<Setup>,
    announce: Option<Announce>,
) -> Result<()> {
    // Nothing is exposed beyond loopback without protection (or --insecure).
    crate::exposure::check(&r, r.insecure)?;
    // Before any port opens: a SIGTERM from then on (a service manager's,
    // right after start) shuts down cleanly once started, never by the
    // default action.
    let mut signals = Signals::new().context("cannot take over SIGINT and SIGTERM")?;
    // Bind first: a taken port fails before any pool is touched.
    let nbd_listener = bind("NBD", &r.nbd).await?;
    let api_listener = bind("the API", &r.api).await?;
    let s3_listener = match &r.s3 {
        Some(s3) => Some(bind("S3", &s3.listen).await?),
        None => None,
    };
    let nfs_listener = match &r.nfs {
        Some(n) => Some(bind("NFS", &n.listen).await?),
        None => None,
    };
    let endpoints = Endpoints {
        nbd: nbd_listener.local_addr()?,
        api: api_listener.local_addr()?,
        api_https: r.api_tls.is_some(),
        s3: s3_listener.as_ref().map(|l| l.local_addr()).transpose()?,
        s3_https: r.s3.as_ref().is_some_and(|s| s.tls.is_some()),
        nfs: nfs_listener.as_ref().map(|l| l.local_addr()).transpose()?,
        smb: r.smb.enabled.then_some(r.smb.listen),
        state_dir: state_dir.clone(),
    };

    tracing::info!(state_dir = %state_dir.display(), "opening engine");
    vdev::bucket::configure(&state_dir, r.bucket.clone());
    let engine = open_engine(&state_dir, r.engine.clone()).await?;
    // Kept whether or not S3 is served, so keys can be made before it is.
    let anonymous =
        r.s3.as_ref()
            .map(|s| s.anonymous.clone())
            .unwrap_or_default();
    let users = match Users::open(&state_dir) {
        Ok(u) => Arc::new(u.with_anonymous(anonymous)),
        Err(e) => {
            shutdown_engine(&engine).await;
            return Err(anyhow::Error::new(e).context("cannot open the S3 users"));
        }
    };
    {
        let e = engine.clone();
        if let Err(err) = spawn_blocking(move || crate::standby::start(&e)).await {
            shutdown_engine(&engine).await;
            return Err(err);
        }
    }
    if let Some(setup) = setup {
        let (e, u) = (engine.clone(), users.clone());
        if let Err(err) = spawn_blocking(move || setup(&e, &u)).await {
            shutdown_engine(&engine).await;
            return Err(err);
        }
    }

    engine.set_policies(r.policies.clone());
    engine.start_policy_scheduler();
    // Replication jobs (config and CLI-added); a bad [replication.NAME] stops the start.
    let repl = match replication::Manager::open(
        engine.clone(),
        &state_dir,
        &r.replication,
        r.policies.clone(),
    ) {
        Ok(m) => m,
        Err(e) => {
            shutdown_engine(&engine).await;
            return Err(anyhow::Error::new(e).context("replication jobs"));
        }
    };
    repl.start();

    // SMB: smbd starts with the first share (after the mounts); refreshed after every API change.
    let samba = smb::Samba::new(engine.clone(), r.smb.clone(), &state_dir);

    let (stop_tx, stop_rx) = watch::channel(false);
    let provider = Arc::new(EngineExports::new(engine.clone()));
    let nbd_grace = r.nbd_server.shutdown_grace;
    let mut nbd_task = tokio::spawn(nbd::serve_with_config(
        nbd_listener,
        provider,
        stop_rx.clone(),
        r.nbd_server,
    ));
    let mounts = fuse::Mounts::new(engine.clone(), r.fuse.clone());
    // A rollback of a shared filesystem disconnects its SMB clients first
    // (they reconnect to the rolled-back state); a Time Machine backup's
    // last rename is seen through the POSIX layer.
    {
        let s = samba.clone();
        mounts.on_rollback(Arc::new(move |ds: &str| {
            if let Err(e) = s.disconnect(ds) {
                tracing::warn!(
                    dataset = ds,
                    "SMB clients not disconnected before rollback: {e}"
                );
            }
        }));
        let s = samba.clone();
        posix::observe_renames(Arc::new(move |ds: &str, name: &[u8]| {
            use std::os::unix::ffi::OsStrExt;
            s.renamed(ds, std::ffi::OsStr::from_bytes(name));
        }));
    }
    // Mounted and shared before the API answers: a client that sees the
    // daemon ready finds its filesystems and shares there.
    // Filesystems with a mountpoint (as zfs mount -a at boot); failures are logged.
    {
        let m = mounts.clone();
        let _ = spawn_blocking(move || Ok(m.mount_all(None))).await;
    }
    // Shares after mounts: a share made first would serve the empty directory underneath.
    {
        let s = samba.clone();
        if let Err(e) = spawn_blocking(move || Ok(s.refresh()?)).await {
            tracing::warn!("SMB shares not served: {e:#}");
        }
    }
    let auth = api::auth::Auth::load_or_create(&state_dir)
        .context("the API token")?
        .with_metrics_open(r.api_access.metrics_open);
    // The dashboard's login page and its assets open without the token.
    let auth = ui::PUBLIC.iter().fold(auth, |a, p| a.with_public(p));
    match api::auth::publish(endpoints.api, &auth) {
        Ok(p) => tracing::debug!(path = %p.display(), "API token published for local CLIs"),
        Err(e) => tracing::warn!("local CLIs will need --token: {e}"),
    }
    let state = api::ApiState::new(engine.clone())
        .with_auth(auth)
        .with_metrics(Arc::new(crate::nbd_metrics::render))
        .with_metrics(Arc::new(crate::standby::render_metrics))
        .with_metrics({
            let m = repl.clone();
            Arc::new(move || m.render_metrics())
        })
        .with_users(users.clone())
        .with_share_service(Arc::new(crate::shares::Smb(samba.clone())))
        .with_mounts(mounts.clone());
    // Local `send`/`receive` hand their stream to us (issue 14); else HTTP.
    match api::send_local::listen(&state_dir, state.clone()) {
        Ok(p) => tracing::debug!(path = %p.display(), "local stream socket"),
        Err(e) => tracing::warn!("local send/receive go over HTTP: {e}"),
    }
    let mut api_rx = stop_rx.clone();
    let api_tls = r.api_tls.clone();
    let repl_routes = repl.clone();
    let mut api_task = tokio::spawn(async move {
        let stop = async move {
            let _ = api_rx.wait_for(|stop| *stop).await;
        };
        let pages = ui::router().merge(replication::routes::routes(repl_routes));
        api::server::serve_with(api_listener, api_tls, state, pages, stop).await
    });

    println!(
        "Cistern {} serving {}",
        env!("CARGO_PKG_VERSION"),
        state_dir.display()
    );
    println!("NBD: {}", endpoints.nbd_uri("<export>"));
    println!("API: {}", endpoints.api_url());
    println!(
        "API token: {}",
        state_dir.join(api::auth::TOKEN_FILE).display()
    );
    println!(
        "Web UI: {}/ (log in with the API token)",
        endpoints.api_url().trim_end_matches('/')
    );
    let mut s3_task = match (s3_listener, r.s3) {
        (Some(listener), Some(s3)) => {
            if let Some(url) = endpoints.s3_url() {
                println!("S3: {url}");
            }
            let mut rx = stop_rx.clone();
            Some(tokio::spawn(s3::serve_tls(
                listener,
                engine.clone(),
                s3.service,
                users.clone(),
                s3.tls,
                async move {
                    let _ = rx.wait_for(|stop| *stop).await;
                },
            )))
        }
        _ => None,
    };
    let mut nfs_task = match (nfs_listener, &r.nfs) {
        (Some(listener), Some(n)) => {
            if let Some(a) = endpoints.nfs {
                println!("NFS: nfs://{a}/POOL/DATASET (datasets with sharenfs on; MOUNT and GETPORT on the same port)");
            }
            let server = nfs::Server::new(engine.clone(), n.server.clone());
            Some(tokio::spawn(server.serve(listener, stop_rx.clone())))
        }
        _ => None,
    };
    let nfs_done = async {
        match nfs_task.as_mut() {
            Some(t) => t.await,
            None => std::future::pending().await,
        }
    };
    let s3_done = async {
        match s3_task.as_mut() {
            Some(t) => t.await,
            None => std::future::pending().await,
        }
    };
    if let Some(announce) = announce {
        announce(&engine, &endpoints);
    }
    tracing::info!(nbd = %endpoints.nbd, api = %endpoints.api, "serving");
    // Under systemd (Type=notify): both listeners are bound and pools imported.
    sd_notify::send("READY=1\nSTATUS=serving");

    let mut failed: Option<anyhow::Error> = None;
    tokio::select! {
        name = signals.recv() => tracing::info!("{name}: shutting down"),
        res = &mut nbd_task => {
            failed = Some(task_error("NBD server", res.map(|r| r.map_err(anyhow::Error::from))));
        }
        res = &mut api_task => {
            failed = Some(task_error("API server", res.map(|r| r.map_err(anyhow::Error::from))));
        }
        res = s3_done => {
            failed = Some(task_error("S3 server", res.map(|r| r.map_err(anyhow::Error::from))));
        }
        res = nfs_done => {
            failed = Some(task_error("NFS server", res.map(|r| r.map_err(anyhow::Error::from))));
        }
    }
    let _ = stop_tx.send(true);
    repl.stop();
    sd_notify::send("STOPPING=1\nSTATUS=committing and closing pools");
    // A second signal while we commit ends the process at once; the intent
    // log makes that safe for acknowledged writes.
    tokio::spawn(async move {
        signals.recv().await;
        tracing::warn!("second signal: exiting without a clean shutdown");
        std::process::exit(130);
    });
    // The NBD server gives its connections `shutdown_grace` itself; allow a little more.
    let grace = nbd_grace + Duration::from_secs(5);
    if !nbd_task.is_finished() && tokio::time::timeout(grace, &mut nbd_task).await.is_err() {
        tracing::warn!("NBD connections still open after {grace:?}; closing anyway");
        nbd_task.abort();
    }
    let grace = Duration::from_secs(10);
    if !api_task.is_finished() && tokio::time::timeout(grace, &mut api_task).await.is_err() {
        tracing::warn!("API connections still open after {grace:?}; closing anyway");
        api_task.abort();
    }
    if let Some(mut t) = s3_task {
        if !t.is_finished() && tokio::time::timeout(grace, &mut t).await.is_err() {
            tracing::warn!("S3 connections still open after {grace:?}; closing anyway");
            t.abort();
        }
    }
    if let Some(mut t) = nfs_task {
        if !t.is_finished() && tokio::time::timeout(grace, &mut t).await.is_err() {
            tracing::warn!("NFS connections still open after {grace:?}; closing anyway");
            t.abort();
        }
    }
    // smbd first (it serves from the mounts), then the mounts, before the pools close.
    {
        let s = samba.clone();
        let _ = spawn_blocking(move || {
            s.stop();
            Ok(())
        })
        .await;
    }
    // Mounts go before the pools close: busy ones are detached (their
    // processes see ENOTCONN, as after a crash).
    {
        let m = mounts.clone();
        if let Err(e) = spawn_blocking(move || Ok(m.unmount_all(None, true)?)).await {
            tracing::warn!("unmounting: {e:#}");
        }
    }
    tracing::info!("committing and closing pools");
    let shut = {
        let e = engine.clone();
        spawn_blocking(move || e.shutdown().context("engine shutdown failed")).await
    };
    match (failed, shut) {
        (Some(e), _) => Err(e),
        (None, Err(e)) => Err(e),
        (None, Ok(())) => {
            tracing::info!("stopped");
            Ok(())
        }
    }
}

fn task_error(what: &str, res: Result<Result<()>, tokio::task::JoinError>) -> anyhow::Error {
    match res {
        Ok(Ok(())) => anyhow::anyhow!("{what} stopped unexpectedly"),
        Ok(Err(e)) => e.context(format!("{what} failed")),
        Err(e) => anyhow::anyhow!("{what} crashed: {e}"),
    }
}

async fn open_engine(state_dir: &Path, cfg: dataset::EngineConfig) -> Result<Arc<Engine>> {
    let dir = state_dir.to_path_buf();
    spawn_blocking(move || {
        Engine::open(&dir, cfg)
            .with_context(|| format!("cannot open state directory {}", dir.display()))
    })
    .await
}

async fn shutdown_engine(engine: &Arc<Engine>) {
    let e = engine.clone();
    if let Err(err) = spawn_blocking(move || Ok(e.shutdown()?)).await {
        tracing::error!("engine shutdown failed: {err:#}");
    }
}

async fn spawn_blocking<T, F>(f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => Err(anyhow::anyhow!("engine call crashed: {e}")),
    }
}

/// SIGINT and SIGTERM, taken over from their default action (ending the
/// process) while this lives; a signal that arrives before `recv` is kept.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// The name of the next SIGINT or SIGTERM.
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// systemd's readiness protocol (sd_notify(3)): one datagram to the socket
/// named by NOTIFY_SOCKET (a path, or `@name` in the abstract namespace).
/// Without it (not under systemd) nothing happens.
mod sd_notify {
    pub fn send(state: &str) {
        let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
            return;
        };
        if let Err(e) = send_to(&path, state) {
            tracing::warn!(socket = ?path, error = %e, "cannot notify systemd");
        }
    }

    fn send_to(path: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::net::{SocketAddr, UnixDatagram};
        let sock = UnixDatagram::unbound()?;
        let bytes = path.as_bytes();
        let addr = match bytes.strip_prefix(b"@") {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(name)?
            }
            None => SocketAddr::from_pathname(std::path::Path::new(path))?,
        };
        sock.send_to_addr(state.as_bytes(), &addr)?;
        Ok(())
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn datagram_reaches_the_socket() {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("notify");
            let rx = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
            super::send_to(path.as_os_str(), "READY=1").unwrap();
            let mut buf = [0u8; 64];
            let n = rx.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], b"READY=1");
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_runtime_leaves_a_cpu_unless_told() {
        assert_eq!(super::runtime_threads(Some(5)), Some(5));
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let want = if std::env::var_os("TOKIO_WORKER_THREADS").is_some() {
            None
        } else {
            Some(cpus.saturating_sub(1).max(1))
        };
        assert_eq!(super::runtime_threads(None), want);
    }
}

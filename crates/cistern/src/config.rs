//! The daemon's TOML config file and how flags override it.
//!
//! ```toml
//! [server]
//! nbd = "127.0.0.1:10809"
//! api = "127.0.0.1:10810"
//! state_dir = "/var/lib/cistern"
//! log = "info,dataset=debug"
//!
//! [api]               # ApiSection: the token is STATE_DIR/api.token (0600)
//! metrics_open = false
//!
//! [engine]            # dataset::EngineConfig
//! txg_timeout_secs = 5.0
//! cache_max_bytes = "4G"         # the ARC; 0 = 1/4 of RAM or cgroup limit (decision 0029)
//! cache_min_bytes = "256M"       # memory pressure shrinks it no further
//! multihost_interval_ms = 1000   # or CISTERN_MMP_INTERVAL_MS (decision 0010)
//!
//! [nbd]               # nbd::ServerConfig
//! max_connections = 1024
//! max_in_flight_bytes_total = 268435456
//! shutdown_grace_secs = 30
//!
//! [policy.vm]         # policy::PolicyConfig, assigned with snapshot:policy=vm
//! schedule = "hourly"
//! keep = "hourly=24 daily=7"
//!
//! [fuse]              # fuse::FuseConfig: FUSE mounts of filesystems
//! threads = 4
//! allow_other = false
//! writeback_cache = true
//! attr_timeout_secs = 1.0
//!
//! [s3]                # present: serve S3 (s3::S3Config, plus `anonymous`)
//! listen = "127.0.0.1:10811"
//! parent = "tank"
//! anonymous = "off"   # or "ro", "rw", "public=ro,drop=rw"
//!
//! [smb]               # smb::Settings: the daemon's private smbd (crates/smb/README.md)
//! listen = "127.0.0.1:10445"
//! guest = false
//! [replication.offsite]  # replication::JobConfig (crates/replication)
//! source = "tank/vm"
//! target = "https://backup:10810/tank2/vm"
//! schedule = "1h"
//!
//! [nfs]               # present: serve NFSv3 + MOUNT + portmap GETPORT (nfs::NfsConfig)
//! listen = "127.0.0.1:10812"
//! max_connections = 256
//! max_in_flight = 16          # per connection
//! max_in_flight_total = 128
//! idle_timeout_secs = 3600
//! ```

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

pub const DEFAULT_NBD_ADDR: &str = "127.0.0.1:10809";
/// The S3 endpoint's address when `[s3]` or quickstart turns it on without one.
pub const DEFAULT_S3_ADDR: &str = "127.0.0.1:10811";
/// NFS (with MOUNT and GETPORT on the same port) when `[nfs]` or `--nfs` turns it on without one.
pub const DEFAULT_NFS_ADDR: &str = "127.0.0.1:10812";
pub const DEFAULT_LOG: &str = "info";

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerSection,
    pub engine: dataset::EngineConfig,
    pub nbd: NbdSection,
    /// `[policy.NAME]`: named snapshot policies (`dataset::policy::PolicyConfig`).
    pub policy: std::collections::BTreeMap<String, dataset::policy::PolicyConfig>,
    /// `[s3]`: the S3 endpoint, served when this section (or `--s3`) is there.
    pub s3: Option<S3Section>,
    /// `[smb]`: shares of filesystems with sharesmb/timemachine set.
    pub smb: smb::Settings,
    /// `[fuse]`: how filesystems are mounted.
    pub fuse: fuse::FuseConfig,
    /// `[nfs]`: the NFS server, run when this section (or `--nfs`) is there.
    pub nfs: Option<NfsSection>,
    /// `[api]`: the management API's access rules.
    pub api: ApiSection,
    /// `[replication.NAME]`: replication jobs (`replication::JobConfig`).
    pub replication: std::collections::BTreeMap<String, replication::JobConfig>,
    /// `[bucket]`: how pools in a bucket reach it (decision 0039).
    pub bucket: vdev::bucket::BucketConfig,
}

/// `[api]`: who may call the management API (api::auth). The token itself
/// lives in STATE_DIR/api.token, never in the config.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct ApiSection {
    /// `/metrics` answers without the token (for a Prometheus without credentials).
    pub metrics_open: bool,
    /// HTTPS: PEM certificate chain and key (both or neither).
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
}

/// `[nfs]`: where NFS listens and its bounds; unset keys keep `nfs::NfsConfig`'s defaults.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct NfsSection {
    pub listen: Option<String>,
    pub max_connections: Option<usize>,
    pub max_in_flight: Option<usize>,
    pub max_in_flight_total: Option<usize>,
    pub idle_timeout_secs: Option<f64>,
}

impl NfsSection {
    pub fn server_config(&self) -> Result<nfs::NfsConfig> {
        let mut c = nfs::NfsConfig::default();
        let positive = |name: &str, v: usize| {
            if v == 0 {
                bail!("[nfs] {name} must be at least 1");
            }
            Ok(v)
        };
        if let Some(v) = self.max_connections {
            c.max_connections = positive("max_connections", v)?;
        }
        if let Some(v) = self.max_in_flight {
            c.max_in_flight = positive("max_in_flight", v)?;
        }
        if let Some(v) = self.max_in_flight_total {
            c.max_in_flight_total = positive("max_in_flight_total", v)?;
        }
        if let Some(v) = self.idle_timeout_secs {
            if !(0.001..1e9).contains(&v) {
                bail!("[nfs] idle_timeout_secs must be a positive number of seconds");
            }
            c.idle_timeout = std::time::Duration::from_secs_f64(v);
        }
        Ok(c)
    }
}

/// `[s3]`: the S3 layer's own settings plus who may skip signing.
#[derive(Debug, Clone, Default, Serialize)]
pub struct S3Section {
    /// Unsigned requests: "off" (default), "ro"/"rw" (every bucket) or
    /// grants "public=ro,drop=rw" (`s3::access::parse_anonymous`).
    pub anonymous: Option<String>,
    #[serde(flatten)]
    pub service: s3::S3Config,
}

/// By hand, not `flatten`: serde's flatten would let misspelt keys through
/// (`S3Config` refuses unknown keys only when it reads the table itself).
impl<'de> Deserialize<'de> for S3Section {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let mut table = toml::Table::deserialize(d)?;
        let anonymous = match table.remove("anonymous") {
            None => None,
            Some(toml::Value::String(s)) => Some(s),
            Some(other) => {
                return Err(D::Error::custom(format!(
                    "anonymous = {other}: expected a string such as \"off\" or \"public=ro\""
                )))
            }
        };
        let service = toml::Value::Table(table)
            .try_into::<s3::S3Config>()
            .map_err(D::Error::custom)?;
        Ok(S3Section { anonymous, service })
    }
}

/// A byte size that may be absent: `max_in_flight_bytes = "64M"` or an integer.
fn de_opt_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    let n = dataset::props::de_size(d)?;
    usize::try_from(n)
        .map(Some)
        .map_err(|_| serde::de::Error::custom(format!("size {n} is too large")))
}

/// NBD server tunables; unset keys keep `nbd::ServerConfig`'s defaults.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct NbdSection {
    pub max_connections: Option<usize>,
    pub max_handshakes: Option<usize>,
    pub max_in_flight: Option<usize>,
    pub max_workers: Option<usize>,
    #[serde(deserialize_with = "de_opt_size")]
    pub max_in_flight_bytes: Option<usize>,
    pub max_in_flight_bytes_total: Option<usize>,
    pub handshake_timeout_secs: Option<f64>,
    pub shutdown_grace_secs: Option<f64>,
    pub revoke_grace_secs: Option<f64>,
    pub bad_client_log_interval_secs: Option<f64>,
    /// "off" (default), "on" (STARTTLS offered; exports with nbd:clients
    /// need it) or "require" (nothing but STARTTLS before TLS).
    pub tls: Option<String>,
    /// PEM certificate chain and key of the server.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// PEM CA: clients must present a certificate it signed.
    pub tls_ca: Option<PathBuf>,
}

impl NbdSection {
    pub fn server_config(&self) -> Result<nbd::ServerConfig> {
        let mut c = nbd::ServerConfig::default();
        let positive = |name: &str, v: usize| {
            if v == 0 {
                bail!("[nbd] {name} must be at least 1");
            }
            Ok(v)
        };
        let secs = |name: &str, v: f64| {
            if !(0.0..1e9).contains(&v) {
                bail!("[nbd] {name} must be a number of seconds");
            }
            Ok(std::time::Duration::from_secs_f64(v))
        };
        if let Some(v) = self.max_connections {
            c.max_connections = positive("max_connections", v)?;
        }
        if let Some(v) = self.max_handshakes {
            c.max_handshakes = positive("max_handshakes", v)?;
        }
        if let Some(v) = self.max_in_flight_bytes_total {
            c.max_in_flight_bytes_total = positive("max_in_flight_bytes_total", v)?;
        }
        if let Some(v) = self.revoke_grace_secs {
            c.revoke_grace = secs("revoke_grace_secs", v)?;
        }
        if let Some(v) = self.bad_client_log_interval_secs {
            c.bad_client_log_interval = secs("bad_client_log_interval_secs", v)?;
        }
        if let Some(v) = self.max_in_flight {
            c.max_in_flight = positive("max_in_flight", v)?;
        }
        if let Some(v) = self.max_workers {
            c.max_workers = positive("max_workers", v)?;
        }
        if let Some(v) = self.max_in_flight_bytes {
            c.max_in_flight_bytes = positive("max_in_flight_bytes", v)?;
        }
        if let Some(v) = self.handshake_timeout_secs {
            c.handshake_timeout = secs("handshake_timeout_secs", v)?;
        }
        if let Some(v) = self.shutdown_grace_secs {
            c.shutdown_grace = secs("shutdown_grace_secs", v)?;
        }
        c.tls = self.tls()?;
        Ok(c)
    }

    /// `tls`, `tls_cert`, `tls_key`, `tls_ca`: the certificates are read now,
    /// so a bad path or key stops the daemon at start with the file named.
    fn tls(&self) -> Result<Option<nbd::Tls>> {
        let require = match self.tls.as_deref().unwrap_or("off") {
            "off" => {
                if self.tls_ca.is_some() {
                    bail!("[nbd] tls_ca is set but tls = \"off\": set tls = \"on\" or \"require\"");
                }
                return Ok(None);
            }
            "on" => false,
            "require" => true,
            other => bail!("[nbd] tls = \"{other}\": expected \"off\", \"on\" or \"require\""),
        };
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            bail!("[nbd] tls = \"on\" or \"require\" needs tls_cert and tls_key (PEM files)");
        };
        let config = tls::server_config(cert, key, self.tls_ca.as_deref(), &[])
            .context("[nbd] TLS settings")?;
        Ok(Some(nbd::Tls { config, require }))
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSection {
    /// NBD listen address.
    pub nbd: Option<String>,
    /// Management API listen address.
    pub api: Option<String>,
    pub state_dir: Option<PathBuf>,
    /// tracing filter (RUST_LOG syntax); RUST_LOG wins when set.
    pub log: Option<String>,
    /// Threads of the async runtime that serves the network; absent: one
    /// fewer than the CPUs, at least one (decision 0084).
    pub runtime_threads: Option<usize>,
}

impl Config {
    pub fn parse(text: &str) -> Result<Config> {
        Ok(toml::from_str(text)?)
    }

    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        Config::parse(&text).with_context(|| format!("bad config {}", path.display()))
    }
}

/// What the command line said for `serve`/`quickstart`.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub state_dir: Option<PathBuf>,
    pub nbd: Option<String>,
    pub api: Option<String>,
    /// `--s3 ADDR`: serve S3 there.
    pub s3: Option<String>,
    /// Serve S3 (at DEFAULT_S3_ADDR) even without `--s3` or `[s3]` (quickstart).
    pub s3_by_default: bool,
    /// `--nfs ADDR`: serve NFS there.
    pub nfs: Option<String>,
    /// Serve NFS (at DEFAULT_NFS_ADDR) even without `--nfs` or `[nfs]` (quickstart).
    pub nfs_by_default: bool,
    /// `--insecure`: listeners beyond loopback without TLS are allowed (with a warning).
    pub insecure: bool,
}

/// A listen address and whether the user asked for it (flag or config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listen {
    pub addr: SocketAddr,
    pub explicit: bool,
}

/// Everything `serve` needs, resolved.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub state_dir: PathBuf,
    pub nbd: Listen,
    pub api: Listen,
    pub log: String,
    /// `[server] runtime_threads`, if set.
    pub runtime_threads: Option<usize>,
    pub engine: dataset::EngineConfig,
    pub nbd_server: nbd::ServerConfig,
    /// The config's snapshot policies plus the built-in ones.
    pub policies: dataset::policy::Policies,
    /// The S3 endpoint, when it is on.
    pub s3: Option<S3Resolved>,
    pub smb: smb::Settings,
    pub fuse: fuse::FuseConfig,
    /// The NFS server, when it is on.
    pub nfs: Option<NfsResolved>,
    /// `[nbd] tls_ca` is set: NBD clients must present a certificate.
    pub nbd_client_certs: bool,
    /// HTTPS for the management API (`[api] tls_cert`/`tls_key`).
    pub api_tls: Option<std::sync::Arc<tls::rustls::ServerConfig>>,
    /// `--insecure` (crate::exposure).
    pub insecure: bool,
    pub api_access: ApiSection,
    /// `[replication.NAME]` tables (checked when the daemon opens its jobs).
    pub replication: std::collections::BTreeMap<String, replication::JobConfig>,
    pub bucket: vdev::bucket::BucketConfig,
}

#[derive(Debug, Clone)]
pub struct NfsResolved {
    pub listen: Listen,
    pub server: nfs::NfsConfig,
}

/// The S3 endpoint's settings, resolved.
#[derive(Debug, Clone)]
pub struct S3Resolved {
    pub listen: Listen,
    pub service: s3::S3Config,
    pub anonymous: s3::access::Grants,
    /// HTTPS (`tls_cert`/`tls_key`), read at start.
    pub tls: Option<std::sync::Arc<tls::rustls::ServerConfig>>,
}

/// An HTTPS endpoint's certificate and key (both or neither), read now so a
/// bad path or key stops the daemon at start with the file named.
pub fn https(
    section: &str,
    cert: Option<&Path>,
    key: Option<&Path>,
) -> Result<Option<std::sync::Arc<tls::rustls::ServerConfig>>> {
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(cert), Some(key)) => Ok(Some(
            tls::server_config(cert, key, None, &[b"http/1.1"])
                .with_context(|| format!("[{section}] TLS settings"))?,
        )),
        _ => bail!("[{section}] needs both tls_cert and tls_key (PEM files), or neither"),
    }
}

/// Flags override the config; then the defaults. `default_state_dir` is used
/// when neither names one (quickstart); without it a state dir is required.
pub fn resolve(
    cfg: Config,
    flags: Overrides,
    default_state_dir: Option<&Path>,
) -> Result<Resolved> {
    let state_dir = match flags
        .state_dir
        .or(cfg.server.state_dir)
        .or(default_state_dir.map(Path::to_path_buf))
    {
        Some(d) => d,
        None => bail!(
            "no state directory: pass --state-dir DIR or set [server] state_dir in the config"
        ),
    };
    let nbd = listen(flags.nbd.or(cfg.server.nbd), DEFAULT_NBD_ADDR, "NBD")?;
    let api = listen(flags.api.or(cfg.server.api), api::DEFAULT_API_ADDR, "API")?;
    if nbd.addr == api.addr && nbd.addr.port() != 0 {
        bail!("the NBD and API addresses are both {}", nbd.addr);
    }
    let s3 = match (flags.s3, cfg.s3, flags.s3_by_default) {
        (None, None, false) => None,
        (flag, section, _) => {
            let section = section.unwrap_or_default();
            let listen = listen(
                flag.or(section.service.listen.clone()),
                DEFAULT_S3_ADDR,
                "S3",
            )?;
            for (what, other) in [("NBD", nbd), ("API", api)] {
                if listen.addr == other.addr && listen.addr.port() != 0 {
                    bail!("the S3 and {what} addresses are both {}", listen.addr);
                }
            }
            let anonymous =
                s3::access::parse_anonymous(section.anonymous.as_deref().unwrap_or("off"))
                    .context("bad [s3] anonymous")?;
            let tls = https(
                "s3",
                section.service.tls_cert.as_deref(),
                section.service.tls_key.as_deref(),
            )?;
            Some(S3Resolved {
                listen,
                service: section.service,
                anonymous,
                tls,
            })
        }
    };
    let nfs = match (flags.nfs, cfg.nfs, flags.nfs_by_default) {
        (None, None, false) => None,
        (flag, section, _) => {
            let section = section.unwrap_or_default();
            let listen = listen(flag.or(section.listen.clone()), DEFAULT_NFS_ADDR, "NFS")?;
            let mut others = vec![("NBD", nbd), ("API", api)];
            if let Some(s) = &s3 {
                others.push(("S3", s.listen));
            }
            for (what, other) in others {
                if listen.addr == other.addr && listen.addr.port() != 0 {
                    bail!("the NFS and {what} addresses are both {}", listen.addr);
                }
            }
            Some(NfsResolved {
                listen,
                server: section.server_config()?,
            })
        }
    };
    let mut engine = cfg.engine;
    // Tests shorten the multihost interval without a config file.
    if let Ok(v) = std::env::var("CISTERN_MMP_INTERVAL_MS") {
        engine.multihost_interval_ms = v.parse().with_context(|| {
            format!("CISTERN_MMP_INTERVAL_MS={v} is not a number of milliseconds")
        })?;
    }
    Ok(Resolved {
        state_dir,
        nbd,
        api,
        log: cfg.server.log.unwrap_or_else(|| DEFAULT_LOG.to_string()),
        runtime_threads: match cfg.server.runtime_threads {
            Some(0) => bail!("[server] runtime_threads must be at least 1"),
            n => n,
        },
        nbd_server: cfg.nbd.server_config()?,
        nbd_client_certs: cfg.nbd.tls_ca.is_some(),
        api_tls: https(
            "api",
            cfg.api.tls_cert.as_deref(),
            cfg.api.tls_key.as_deref(),
        )?,
        insecure: flags.insecure,
        policies: dataset::policy::Policies::from_config(&cfg.policy)?,
        engine,
        s3,
        smb: cfg.smb,
        fuse: cfg.fuse,
        nfs,
        api_access: cfg.api,
        replication: cfg.replication,
        bucket: cfg.bucket,
    })
}

fn listen(given: Option<String>, default: &str, what: &str) -> Result<Listen> {
    match given {
        Some(s) => Ok(Listen {
            addr: parse_listen_addr(&s).with_context(|| format!("bad {what} address"))?,
            explicit: true,
        }),
        None => Ok(Listen {
            addr: parse_listen_addr(default)?,
            explicit: false,
        }),
    }
}

/// `127.0.0.1:10810`, `[::1]:10810`, `localhost:10810`, or the same as an
/// `http://` URL (so `--api` takes what the CLI's `--api` takes).
pub fn parse_listen_addr(s: &str) -> Result<SocketAddr> {
    let t = s.trim();
    let t = t
        .strip_prefix("http://")
        .or_else(|| t.strip_prefix("https://"))
        .or_else(|| t.strip_prefix("nbd://"))
        .unwrap_or(t);
    let t = t.trim_end_matches('/');
    if t.contains('/') {
        bail!("'{s}' is not an address (expected HOST:PORT, e.g. 127.0.0.1:10810)");
    }
    if let Ok(a) = t.parse::<SocketAddr>() {
        return Ok(a);
    }
    if !t.contains(':') {
        bail!("'{s}' has no port (expected HOST:PORT, e.g. 127.0.0.1:10810)");
    }
    let mut addrs = t.to_socket_addrs().with_context(|| {
        format!("cannot resolve '{s}' (expected HOST:PORT, e.g. 127.0.0.1:10810)")
    })?;
    match addrs.next() {
        Some(a) => Ok(a),
        None => bail!("'{s}' resolves to no address"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_full_config() {
        let cfg = Config::parse(
            r#"
            [server]
            nbd = "0.0.0.0:10809"
            api = "127.0.0.1:9000"
            state_dir = "/tmp/x"
            log = "debug"
            [engine]
            txg_timeout_secs = 1.5
            multihost_interval_ms = 250
            "#,
        )
        .unwrap();
        assert_eq!(
            cfg.engine.mmp().import_wait(),
            std::time::Duration::from_millis(1250)
        );
        assert_eq!(cfg.server.nbd.as_deref(), Some("0.0.0.0:10809"));
        assert_eq!(cfg.server.state_dir, Some(PathBuf::from("/tmp/x")));
        assert_eq!(cfg.engine.txg_timeout_secs, 1.5);
        // Unset engine keys keep their defaults.
        assert_eq!(
            cfg.engine.dirty_max_bytes,
            dataset::EngineConfig::default().dirty_max_bytes
        );
    }

    #[test]
    fn runtime_threads_is_taken_or_refused_when_zero() {
        let r = |text: &str| {
            resolve(
                Config::parse(text).unwrap(),
                Overrides::default(),
                Some(Path::new("/x")),
            )
        };
        assert_eq!(r("").unwrap().runtime_threads, None);
        assert_eq!(
            r("[server]\nruntime_threads = 3\n")
                .unwrap()
                .runtime_threads,
            Some(3)
        );
        let e = r("[server]\nruntime_threads = 0\n").unwrap_err();
        assert!(
            e.to_string().contains("runtime_threads must be at least 1"),
            "{e}"
        );
    }

    #[test]
    fn nbd_section_overrides_server_defaults() {
        let cfg = Config::parse("[nbd]\nmax_connections = 8\nshutdown_grace_secs = 2.5\n").unwrap();
        let c = cfg.nbd.server_config().unwrap();
        assert_eq!(c.max_connections, 8);
        assert_eq!(c.shutdown_grace, std::time::Duration::from_millis(2500));
        assert_eq!(c.max_workers, nbd::ServerConfig::default().max_workers);
        let bad = Config::parse("[nbd]\nmax_workers = 0\n").unwrap();
        assert!(bad.nbd.server_config().is_err());
        let bad = Config::parse("[nbd]\nhandshake_timeout_secs = -1.0\n").unwrap();
        assert!(bad.nbd.server_config().is_err());
        let cfg = Config::parse(
            "[nbd]\nmax_handshakes = 4\nmax_in_flight_bytes_total = 100000000\n\
             revoke_grace_secs = 0.5\nbad_client_log_interval_secs = 5\n",
        )
        .unwrap();
        let c = cfg.nbd.server_config().unwrap();
        assert_eq!(c.max_handshakes, 4);
        assert_eq!(c.max_in_flight_bytes_total, 100_000_000);
        assert_eq!(c.revoke_grace, std::time::Duration::from_millis(500));
        assert_eq!(c.bad_client_log_interval, std::time::Duration::from_secs(5));
        let bad = Config::parse("[nbd]\nmax_handshakes = 0\n").unwrap();
        assert!(bad.nbd.server_config().is_err());
    }

    #[test]
    fn nfs_is_served_with_its_section_or_flag() {
        let none = resolve(
            Config::default(),
            Overrides::default(),
            Some(Path::new("/x")),
        )
        .unwrap();
        assert!(none.nfs.is_none());
        let cfg = Config::parse("[nfs]\nmax_connections = 4\n").unwrap();
        let r = resolve(cfg, Overrides::default(), Some(Path::new("/x"))).unwrap();
        let n = r.nfs.unwrap();
        assert_eq!(n.listen.addr, parse_listen_addr(DEFAULT_NFS_ADDR).unwrap());
        assert_eq!(n.server.max_connections, 4);
        let flag = Overrides {
            nfs: Some("127.0.0.1:2049".into()),
            ..Overrides::default()
        };
        let r = resolve(Config::default(), flag, Some(Path::new("/x"))).unwrap();
        assert_eq!(r.nfs.unwrap().listen.addr.port(), 2049);
        assert!(Config::parse("[nfs]\nmax_conections = 4\n").is_err());
        let bad = Config::parse("[nfs]\nmax_in_flight = 0\n").unwrap();
        assert!(resolve(bad, Overrides::default(), Some(Path::new("/x"))).is_err());
        let clash = Overrides {
            nfs: Some(DEFAULT_NBD_ADDR.into()),
            ..Overrides::default()
        };
        assert!(resolve(Config::default(), clash, Some(Path::new("/x"))).is_err());
    }

    #[test]
    fn policy_tables_are_checked_at_start() {
        let ok =
            Config::parse("[policy.vm]\nschedule = \"hourly\"\nkeep = \"hourly=24\"\n").unwrap();
        let r = resolve(ok, Overrides::default(), Some(Path::new("/tmp/x"))).unwrap();
        assert!(r.policies.get("vm").is_ok() && r.policies.get("timemachine").is_ok());
        let bad = Config::parse("[policy.vm]\nschedule = \"fortnightly\"\n").unwrap();
        let e = resolve(bad, Overrides::default(), Some(Path::new("/tmp/x"))).unwrap_err();
        assert!(format!("{e:#}").contains("policy 'vm'"), "{e:#}");
        assert!(Config::parse("[policy.vm]\nschedul = \"hourly\"\n").is_err());
    }

    #[test]
    fn sizes_as_the_cli_writes_them_or_integers() {
        let cfg = Config::parse(
            "[engine]\ndirty_max_bytes = \"128M\"\nblock_cache_bytes = 1048576\nscan_rate_bytes = \"1.5G\"\n[nbd]\nmax_in_flight_bytes = \"64M\"\n",
        )
        .unwrap();
        assert_eq!(cfg.engine.dirty_max_bytes, 128 << 20);
        assert_eq!(
            cfg.engine.block_cache_bytes,
            1 << 20,
            "the old name still parses"
        );
        assert_eq!(cfg.engine.scan_rate_bytes, 3 << 29);
        assert_eq!(cfg.nbd.max_in_flight_bytes, Some(64 << 20));
        let cfg = Config::parse("[engine]\ncache_max_bytes = \"2G\"\ncache_min_bytes = \"64M\"\n")
            .unwrap();
        assert_eq!(cfg.engine.block_cache_bytes, 2 << 30);
        assert_eq!(cfg.engine.cache_min_bytes, 64 << 20);
        let err = Config::parse("[engine]\nmeta_cache_bytes = \"12Q\"\n").unwrap_err();
        assert!(format!("{err:#}").contains("12Q"), "{err:#}");
        assert!(Config::parse("[engine]\nmeta_cache_bytes = -5\n").is_err());
    }

    #[test]
    fn example_config_in_packaging_is_valid_and_complete() {
        let text = include_str!("../../../packaging/cistern.toml");
        // Every key is commented out, so the example itself is the defaults...
        let cfg = Config::parse(text).unwrap();
        assert_eq!(cfg.server, ServerSection::default());
        // ...and uncommented it parses too (each key spelled right).
        let live: String = text
            .lines()
            .map(|l| {
                l.strip_prefix("# ")
                    .filter(|r| {
                        r.split_once(" = ").is_some_and(|(k, _)| {
                            k.chars()
                                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                        })
                    })
                    .unwrap_or(l)
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let cfg = Config::parse(&live).unwrap();
        let nfs = cfg.nfs.clone().expect("[nfs] in the example");
        assert_eq!(nfs.listen.as_deref(), Some(DEFAULT_NFS_ADDR));
        assert_eq!(
            nfs.server_config().unwrap().max_in_flight,
            nfs::NfsConfig::default().max_in_flight
        );
        assert_eq!(
            cfg.server.state_dir,
            Some(PathBuf::from("/var/lib/cistern"))
        );
        for key in [
            "txg_timeout_secs",
            "dirty_max_bytes",
            "cache_max_bytes",
            "cache_min_bytes",
            "prefetch_max_bytes",
            "l2arc_write_max_bytes",
            "meta_cache_bytes",
            "log_buffer_bytes",
            "scan_rate_bytes",
            "max_connections",
            "max_in_flight",
            "max_workers",
            "max_in_flight_bytes",
            "handshake_timeout_secs",
            "shutdown_grace_secs",
            "nbd",
            "api",
            "state_dir",
            "log",
            "tls",
            "tls_cert",
            "tls_key",
            "tls_ca",
        ] {
            assert!(
                live.contains(&format!("\n{key} = ")),
                "{key} missing from packaging/cistern.toml"
            );
        }
    }

    #[test]
    fn tls_settings_are_checked_at_start() {
        let err = |text: &str| {
            let cfg = Config::parse(text).unwrap();
            format!(
                "{:#}",
                resolve(cfg, Overrides::default(), Some(Path::new("/x"))).unwrap_err()
            )
        };
        assert!(err("[nbd]\ntls = \"maybe\"\n").contains("expected \"off\""));
        assert!(err("[nbd]\ntls = \"on\"\n").contains("needs tls_cert and tls_key"));
        assert!(err("[nbd]\ntls_ca = \"/ca.pem\"\n").contains("tls = \"off\""));
        let e =
            err("[nbd]\ntls = \"require\"\ntls_cert = \"/nonexistent.pem\"\ntls_key = \"/k\"\n");
        assert!(e.contains("/nonexistent.pem"), "{e}");
        assert!(err("[api]\ntls_cert = \"/c.pem\"\n").contains("both tls_cert and tls_key"));
        assert!(err("[s3]\ntls_key = \"/k.pem\"\n").contains("both tls_cert and tls_key"));
        // Without TLS keys everything stays off.
        let r = resolve(
            Config::default(),
            Overrides::default(),
            Some(Path::new("/x")),
        )
        .unwrap();
        assert!(r.nbd_server.tls.is_none() && r.api_tls.is_none());
    }

    #[test]
    fn smb_section() {
        let cfg = Config::parse("[smb]\nlisten = \"0.0.0.0:445\"\nguest = true\n").unwrap();
        assert_eq!(cfg.smb.listen, "0.0.0.0:445".parse().unwrap());
        assert!(cfg.smb.guest && cfg.smb.enabled);
        assert_eq!(Config::parse("").unwrap().smb, smb::Settings::default());
        let e = Config::parse("[smb]\nport = 445\n").unwrap_err();
        assert!(format!("{e:#}").contains("port"), "{e:#}");
    }

    #[test]
    fn empty_config_is_defaults() {
        let cfg = Config::parse("").unwrap();
        assert_eq!(cfg.server, ServerSection::default());
    }

    #[test]
    fn refuses_unknown_keys() {
        let e = Config::parse("[server]\nnbd_addr = \"x\"\n").unwrap_err();
        assert!(format!("{e:#}").contains("nbd_addr"), "{e:#}");
        assert!(Config::parse("[engine]\nbogus = 1\n").is_err());
        assert!(Config::parse("[serve]\n").is_err());
    }

    #[test]
    fn flags_override_config_and_defaults_apply() {
        let cfg = Config::parse(
            "[server]\nnbd = \"127.0.0.1:1111\"\napi = \"127.0.0.1:2222\"\nstate_dir = \"/cfg\"\n",
        )
        .unwrap();
        let flags = Overrides {
            state_dir: Some("/flag".into()),
            nbd: None,
            api: Some("127.0.0.1:3333".into()),
            ..Overrides::default()
        };
        let r = resolve(cfg, flags, None).unwrap();
        assert_eq!(r.state_dir, PathBuf::from("/flag"));
        assert_eq!(
            r.nbd,
            Listen {
                addr: "127.0.0.1:1111".parse().unwrap(),
                explicit: true
            }
        );
        assert_eq!(
            r.api,
            Listen {
                addr: "127.0.0.1:3333".parse().unwrap(),
                explicit: true
            }
        );

        let r = resolve(
            Config::default(),
            Overrides::default(),
            Some(Path::new("./d")),
        )
        .unwrap();
        assert_eq!(
            r.nbd,
            Listen {
                addr: DEFAULT_NBD_ADDR.parse().unwrap(),
                explicit: false
            }
        );
        assert_eq!(r.api.addr, api::DEFAULT_API_ADDR.parse().unwrap());
        assert_eq!(r.log, "info");
        assert_eq!(r.state_dir, PathBuf::from("./d"));
    }

    #[test]
    fn state_dir_is_required_for_serve() {
        let e = resolve(Config::default(), Overrides::default(), None).unwrap_err();
        assert!(e.to_string().contains("--state-dir"));
    }

    #[test]
    fn same_address_twice_is_refused() {
        let flags = Overrides {
            state_dir: Some("/s".into()),
            nbd: Some("127.0.0.1:5".into()),
            api: Some("127.0.0.1:5".into()),
            ..Overrides::default()
        };
        assert!(resolve(Config::default(), flags, None).is_err());
        let flags = Overrides {
            state_dir: Some("/s".into()),
            api: Some("127.0.0.1:5".into()),
            s3: Some("127.0.0.1:5".into()),
            ..Overrides::default()
        };
        let e = resolve(Config::default(), flags, None).unwrap_err();
        assert!(e.to_string().contains("S3 and API"), "{e}");
    }

    #[test]
    fn s3_is_served_when_asked_for() {
        let state = || Some(PathBuf::from("/s"));
        // Neither flag nor section: off (quickstart turns it on).
        let flags = Overrides {
            state_dir: state(),
            ..Overrides::default()
        };
        assert!(resolve(Config::default(), flags, None)
            .unwrap()
            .s3
            .is_none());
        let flags = Overrides {
            state_dir: state(),
            s3_by_default: true,
            ..Overrides::default()
        };
        let s3 = resolve(Config::default(), flags, None).unwrap().s3.unwrap();
        assert_eq!(s3.listen.addr, DEFAULT_S3_ADDR.parse().unwrap());
        assert!(!s3.listen.explicit && s3.anonymous.is_empty());
        assert_eq!(s3.service.parent, "tank");
        // An [s3] section: on, with its keys (the S3 layer's and ours).
        let cfg = Config::parse(
            "[s3]\nparent = \"tank/s3\"\nanonymous = \"public=ro\"\nmultipart_expiry = 3600\n",
        )
        .unwrap();
        let flags = Overrides {
            state_dir: state(),
            ..Overrides::default()
        };
        let s3 = resolve(cfg.clone(), flags, None).unwrap().s3.unwrap();
        assert_eq!(s3.service.parent, "tank/s3");
        assert_eq!(s3.service.multipart_expiry, 3600);
        assert_eq!(s3.anonymous.get("public"), Some(&s3::access::Access::Read));
        assert_eq!(s3.listen.addr, DEFAULT_S3_ADDR.parse().unwrap());
        // --s3 wins over listen = ...
        let cfg2 = Config::parse("[s3]\nlisten = \"127.0.0.1:7000\"\n").unwrap();
        let flags = Overrides {
            state_dir: state(),
            s3: Some("127.0.0.1:7001".into()),
            ..Overrides::default()
        };
        let s3 = resolve(cfg2, flags, None).unwrap().s3.unwrap();
        assert_eq!(s3.listen.addr, "127.0.0.1:7001".parse().unwrap());
        assert!(s3.listen.explicit);
        // Misspelt keys and bad values are refused by name.
        let e = Config::parse("[s3]\nparnet = \"tank\"\n").unwrap_err();
        assert!(format!("{e:#}").contains("parnet"), "{e:#}");
        let bad = Config::parse("[s3]\nanonymous = \"yes\"\n").unwrap();
        let flags = Overrides {
            state_dir: state(),
            ..Overrides::default()
        };
        let e = resolve(bad, flags, None).unwrap_err();
        assert!(format!("{e:#}").contains("anonymous"), "{e:#}");
    }

    #[test]
    fn bucket_cache_bytes_is_read() {
        let c = Config::parse("[bucket]\ncache_bytes = 1073741824\n").unwrap();
        assert_eq!(c.bucket.cache_bytes, Some(1 << 30));
        assert_eq!(Config::parse("").unwrap().bucket.cache_bytes, None);
        let c = Config::parse("[bucket]\ncache_bytes = \"64M\"\ncache_size = \"1.5G\"\n").unwrap();
        assert_eq!(c.bucket.cache_bytes, Some(64 << 20));
        assert_eq!(c.bucket.cache_size, Some(3 << 29));
        for bad in ["\"64Q\"", "-1", "\"\""] {
            let err = Config::parse(&format!("[bucket]\ncache_bytes = {bad}\n")).unwrap_err();
            let msg = format!("{err:#}");
            assert!(msg.contains("cache_bytes"), "{bad}: {msg}");
        }
    }

    #[test]
    fn parses_listen_addresses() {
        assert_eq!(
            parse_listen_addr("127.0.0.1:10810").unwrap(),
            "127.0.0.1:10810".parse().unwrap()
        );
        assert_eq!(
            parse_listen_addr("http://127.0.0.1:10810/").unwrap(),
            "127.0.0.1:10810".parse().unwrap()
        );
        assert_eq!(
            parse_listen_addr("[::1]:5").unwrap(),
            "[::1]:5".parse().unwrap()
        );
        assert!(parse_listen_addr("localhost:5").unwrap().ip().is_loopback());
        assert!(parse_listen_addr("127.0.0.1")
            .unwrap_err()
            .to_string()
            .contains("no port"));
        assert!(parse_listen_addr("http://h:1/v1").is_err());
    }
}

//! SMB shares of filesystem datasets: the daemon runs its own smbd on its
//! own smb.conf (README.md shows the file), shares every filesystem with
//! `sharesmb` or `timemachine` on at its mountpoint, reloads smbd when that
//! set changes, publishes Bonjour records, and turns the end of a Time
//! Machine backup into an event snapshot.
//!
//! The daemon calls [`Samba::refresh`] whenever datasets or properties
//! change, [`Samba::disconnect`] before a rollback, and
//! [`Samba::renamed`] for every rename the POSIX layer performs.

pub mod avahi;
pub mod conf;
pub mod shares;
pub mod smbd;
pub mod timemachine;

use conf::Dirs;
use dataset::Engine;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use shares::Share;
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use shares::{Plan, Problem};

pub const DEFAULT_LISTEN: &str = "127.0.0.1:10445";
/// After smbd failed to start, refreshes wait this long before trying again
/// (`cistern share` tries at once).
const RETRY_START: Duration = Duration::from_secs(60);
/// How long [`Samba::disconnect`] waits for clients to be gone.
const DISCONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// `[smb]` in the daemon's config.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// false: never start smbd (sharesmb is then only a property).
    pub enabled: bool,
    /// smbd's address: `smb ports` and `interfaces` (0.0.0.0: every interface).
    pub listen: SocketAddr,
    /// Clients without an account get in as guests (`map to guest = Bad
    /// User`, `guest ok` on every share unless `sharesmb=guestok=false`).
    pub guest: bool,
    /// Every file written over SMB belongs to this Unix user (`force user`).
    pub force_user: Option<String>,
    /// Seconds without another `SnapshotHistory.plist` rename before the
    /// Time Machine event snapshot is taken.
    pub timemachine_quiet_secs: f64,
    /// Publish `_smb._tcp` and `_adisk._tcp` through avahi-publish.
    pub bonjour: bool,
    pub smbd: PathBuf,
    pub smbcontrol: PathBuf,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            enabled: true,
            listen: DEFAULT_LISTEN.parse().expect("constant address"),
            guest: false,
            force_user: None,
            timemachine_quiet_secs: 30.0,
            bonjour: true,
            smbd: "smbd".into(),
            smbcontrol: "smbcontrol".into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Engine(#[from] dataset::Error),
    #[error("{0}")]
    Smbd(String),
    /// `cistern share DATASET` of a dataset that cannot be shared, and why.
    #[error("cannot share '{dataset}': {why}")]
    NotShareable { dataset: String, why: String },
}

impl Error {
    fn io(path: &Path, source: std::io::Error) -> Error {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// What the service is doing, guarded by one lock so refreshes do not interleave.
struct State {
    smbd: Option<smbd::Smbd>,
    /// The smb.conf text last written.
    written: String,
    shares: Vec<Share>,
    problems: Vec<Problem>,
    /// `cistern unshare`: not shared until `share` (not kept across restarts, as zfs).
    unshared: BTreeSet<String>,
    /// Said once: smbd is missing or cannot start.
    warned: bool,
    bonjour: avahi::Bonjour,
    stopped: bool,
    /// The last failed start: not retried on every API change for a while.
    start_failed: Option<std::time::Instant>,
}

pub struct Samba {
    engine: Arc<Engine>,
    settings: Settings,
    dirs: Dirs,
    state: Mutex<State>,
    timemachine: Arc<timemachine::Watcher>,
}

impl Samba {
    /// Sets up the service; smbd starts with the first share ([`Self::refresh`]).
    pub fn new(engine: Arc<Engine>, settings: Settings, state_dir: &Path) -> Arc<Samba> {
        let dirs = Dirs::new(state_dir);
        let quiet = Duration::from_secs_f64(settings.timemachine_quiet_secs.clamp(0.0, 86400.0));
        let timemachine = timemachine::Watcher::start(engine.clone(), quiet, None);
        let bonjour = avahi::Bonjour::new(dirs.sub("log").join("avahi-publish.log"));
        Arc::new(Samba {
            engine,
            settings,
            dirs,
            state: Mutex::new(State {
                smbd: None,
                written: String::new(),
                shares: Vec::new(),
                problems: Vec::new(),
                unshared: BTreeSet::new(),
                warned: false,
                bonjour,
                stopped: false,
                start_failed: None,
            }),
            timemachine,
        })
    }

    pub fn conf_path(&self) -> PathBuf {
        self.dirs.conf()
    }

    /// The shares being served.
    pub fn shares(&self) -> Vec<Share> {
        self.state.lock().shares.clone()
    }

    /// Datasets that ask to be shared but are not, and why.
    pub fn problems(&self) -> Vec<Problem> {
        self.state.lock().problems.clone()
    }

    /// Datasets or properties changed: recompute the shares, rewrite
    /// smb.conf if it differs, start or reload smbd, disconnect clients of
    /// shares that went away, update Bonjour. Problems with single datasets
    /// are logged, not returned.
    pub fn refresh(&self) -> Result<(), Error> {
        let mut st = self.state.lock();
        self.refresh_locked(&mut st)
    }

    fn refresh_locked(&self, st: &mut State) -> Result<(), Error> {
        if !self.settings.enabled || st.stopped {
            return Ok(());
        }
        let datasets = self.engine.list_datasets(None)?;
        let mut plan = shares::plan(&datasets, &st.unshared);
        // The FUSE mount (or a plain directory) must be there for smbd to serve it.
        plan.shares.retain(|s| {
            let ok = s.path.is_dir();
            if !ok {
                plan.problems.push(Problem {
                    dataset: s.dataset.clone(),
                    why: format!(
                        "mountpoint {} is not a directory (not mounted?)",
                        s.path.display()
                    ),
                });
            }
            ok
        });
        for p in &plan.problems {
            if !st.problems.contains(p) {
                tracing::warn!(dataset = %p.dataset, "not shared over SMB: {}", p.why);
            }
        }
        st.problems = plan.problems;
        let text = conf::render(&self.settings, &self.dirs, &plan.shares);
        let removed: Vec<String> = st
            .shares
            .iter()
            .filter(|old| !plan.shares.iter().any(|s| s.name == old.name))
            .map(|s| s.name.clone())
            .collect();
        let changed = text != st.written;
        if changed {
            self.write_conf(&text)?;
            st.written = text;
        }
        st.shares = plan.shares;
        if let Some(s) = st.smbd.as_mut() {
            if let Some(status) = s.exited() {
                tracing::error!("smbd exited ({status}); starting it again");
                st.smbd = None;
            }
        }
        match st.smbd.as_ref() {
            Some(s) if changed => {
                s.reload()?;
                for name in removed {
                    // Reload alone leaves connected clients on a removed share.
                    if let Err(e) = s.close_share(&name) {
                        tracing::warn!(share = %name, "cannot disconnect clients: {e}");
                    }
                }
                tracing::info!(shares = st.shares.len(), "smbd reloaded");
            }
            Some(_) => {}
            None if st.shares.is_empty() => {}
            None if st.start_failed.is_some_and(|t| t.elapsed() < RETRY_START) => {
                tracing::debug!("smbd failed to start recently; not retrying yet");
            }
            None => {
                if let Err(e) = self.start_smbd(st) {
                    st.start_failed = Some(std::time::Instant::now());
                    return Err(e);
                }
                st.start_failed = None;
            }
        }
        if self.settings.bonjour {
            let shares = st.shares.clone();
            st.bonjour.update(self.settings.listen.port(), &shares);
        }
        Ok(())
    }

    fn write_conf(&self, text: &str) -> Result<(), Error> {
        for sub in Dirs::SUBDIRS {
            let d = self.dirs.sub(sub);
            std::fs::create_dir_all(&d).map_err(|e| Error::io(&d, e))?;
        }
        // Samba wants its private dir closed to others.
        let private = self.dirs.sub("private");
        let _ = std::fs::set_permissions(
            &private,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        );
        let path = self.dirs.conf();
        let tmp = path.with_extension("conf.tmp");
        std::fs::write(&tmp, text).map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))
    }

    fn start_smbd(&self, st: &mut State) -> Result<(), Error> {
        let Some(bin) = smbd::find_program(&self.settings.smbd) else {
            if !st.warned {
                st.warned = true;
                tracing::warn!(
                    "smbd is not installed (Debian: apt install samba samba-vfs-modules): {} share(s) not served over SMB",
                    st.shares.len()
                );
            }
            return Ok(());
        };
        if !st.warned {
            if let Some(why) = smbd::missing_vfs_modules(&bin) {
                st.warned = true;
                tracing::warn!("{why}");
            }
        }
        let control = smbd::find_program(&self.settings.smbcontrol)
            .unwrap_or_else(|| self.settings.smbcontrol.clone());
        let s = smbd::Smbd::start(&bin, &control, &self.dirs, self.settings.listen)?;
        st.smbd = Some(s);
        Ok(())
    }

    /// `cistern share -a` (None) or `cistern share DATASET`. Returns the
    /// dataset's share; Ok(None) when `sharesmb` and `timemachine` are off
    /// (another protocol may share it).
    pub fn share(&self, dataset: Option<&str>) -> Result<Option<Share>, Error> {
        let mut st = self.state.lock();
        st.start_failed = None;
        match dataset {
            None => st.unshared.clear(),
            Some(d) => {
                st.unshared.remove(d);
            }
        }
        self.refresh_locked(&mut st)?;
        let Some(d) = dataset else {
            return Ok(None);
        };
        if let Some(s) = st.shares.iter().find(|s| s.dataset == d) {
            return Ok(Some(s.clone()));
        }
        if let Some(p) = st.problems.iter().find(|p| p.dataset == d) {
            return Err(Error::NotShareable {
                dataset: d.to_string(),
                why: p.why.clone(),
            });
        }
        self.engine.dataset(d)?;
        Ok(None)
    }

    /// `cistern unshare -a` (None) or `cistern unshare DATASET`: clients
    /// are disconnected and the share is gone until `share` or a restart.
    /// Returns the shares removed.
    pub fn unshare(&self, dataset: Option<&str>) -> Result<Vec<Share>, Error> {
        let mut st = self.state.lock();
        let gone: Vec<Share> = st
            .shares
            .iter()
            .filter(|s| dataset.is_none_or(|d| s.dataset == d))
            .cloned()
            .collect();
        if let Some(d) = dataset {
            self.engine.dataset(d)?;
            st.unshared.insert(d.to_string());
        } else {
            st.unshared.extend(gone.iter().map(|s| s.dataset.clone()));
        }
        self.refresh_locked(&mut st)?;
        Ok(gone)
    }

    /// Before `dataset` is rolled back: disconnect its SMB clients so no
    /// open file outlives the rollback; they reconnect and see the
    /// rolled-back files. Ok when the dataset is not shared or smbd is not
    /// running. One call, from the rollback path.
    pub fn disconnect(&self, dataset: &str) -> Result<(), Error> {
        let st = self.state.lock();
        let Some(smbd) = st.smbd.as_ref() else {
            return Ok(());
        };
        for s in st.shares.iter().filter(|s| s.dataset == dataset) {
            smbd.close_share(&s.name)?;
            // close-share is a message: wait (bounded) until the clients' smbds let go.
            let deadline = std::time::Instant::now() + DISCONNECT_TIMEOUT;
            while smbd.connected(&s.name) == Some(true) {
                if std::time::Instant::now() > deadline {
                    tracing::warn!(share = %s.name, "SMB clients still connected {DISCONNECT_TIMEOUT:?} after close-share");
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            tracing::info!(share = %s.name, dataset, "SMB clients disconnected");
        }
        Ok(())
    }

    /// For the POSIX layer: a rename in `dataset` whose new name is
    /// `target` (the last path component). Cheap; see [`timemachine`].
    pub fn renamed(&self, dataset: &str, target: &OsStr) {
        self.timemachine.renamed(dataset, target);
    }

    /// Stops smbd, Bonjour and the Time Machine thread (daemon shutdown).
    pub fn stop(&self) {
        self.timemachine.stop();
        let mut st = self.state.lock();
        st.stopped = true;
        st.bonjour.stop();
        if let Some(mut s) = st.smbd.take() {
            s.stop();
        }
    }
}

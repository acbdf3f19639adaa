//! The engine: every imported pool, the cache file that brings them back at
//! start (like zpool.cache), and the administrative operations.

use crate::events::{self, class};
use crate::history::{self, Caller, HistoryRecord};
use crate::holders::Scope;
pub(crate) use crate::names::split_dataset;
use crate::props::{self, DatasetRecord, Space};
use crate::scrub;
use crate::txg::{lineage, ImportedPool};
use crate::*;
use meta::redb::ReadableDatabase;
use parking_lot::{Mutex, RwLock};
use pool::{LayoutKind, Pool, Vdev};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;

const CACHE_FILE: &str = "pools.json";
const CACHE_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct CachedPool {
    name: String,
    guid: u64,
    devices: Vec<PathBuf>,
}

#[derive(Debug, Serialize, Deserialize)]
struct CacheFile {
    version: u32,
    pools: Vec<CachedPool>,
}

pub struct EngineInner {
    pub(crate) state_dir: PathBuf,
    pub(crate) config: EngineConfig,
    pub(crate) pools: RwLock<BTreeMap<String, Arc<ImportedPool>>>,
    /// Serializes pool-level changes (create, destroy, import, export).
    pub(crate) admin: Mutex<()>,
    /// Datasets front ends have open (busy checks of destroy, rollback, export).
    pub(crate) holders: Arc<crate::holders::Holders>,
    /// The engine itself, for work that finishes in the background (a
    /// resilver rewrites the cache file when it is done).
    pub(crate) me: std::sync::OnceLock<std::sync::Weak<Engine>>,
    /// Snapshot policies: the scheduler's state (`autosnap.rs`).
    pub(crate) autosnap: crate::autosnap::AutoSnap,
    /// This daemon in labels and MMP stamps (decision 0010).
    pub(crate) owner: pool::Owner,
    lock: Mutex<Option<crate::owner::StateLock>>,
    /// Pools of the cache file or an import that are in an older format:
    /// kept in the cache file until `pool upgrade` converts and imports them.
    awaiting_upgrade: Mutex<Vec<CachedPool>>,
}

fn io(context: &str, e: impl std::fmt::Display) -> Error {
    Error::Io(format!("{context}: {e}"))
}

/// A device path given to `replace` or `attach`: absolute, and not already in the pool.
fn check_new_device_path(p: &ImportedPool, new: &Path) -> Result<()> {
    if !new.is_absolute() {
        return Err(Error::InvalidArgument(format!(
            "device path {} is not absolute",
            new.display()
        )));
    }
    if p.pool.devices().iter().any(|d| d.path() == new) {
        return Err(Error::Busy(format!(
            "{} is already part of pool '{}'",
            new.display(),
            p.pool.name
        )));
    }
    Ok(())
}

/// A new dataset `name` (volume or clone): not taken, and its parent is a filesystem.
pub(crate) fn check_new_dataset(
    datasets: &BTreeMap<String, DatasetRecord>,
    name: &str,
) -> Result<()> {
    if datasets.contains_key(name) {
        return Err(Error::AlreadyExists(format!("dataset '{name}'")));
    }
    let parent = &name[..name.rfind('/').unwrap_or(0)];
    match datasets.get(parent) {
        Some(d) if d.kind == DatasetKind::Filesystem => Ok(()),
        Some(_) => Err(Error::InvalidArgument(format!(
            "parent '{parent}' is not a filesystem"
        ))),
        None => Err(Error::NotFound(format!("parent dataset '{parent}'"))),
    }
}

impl Engine {
    pub fn open(state_dir: &Path, config: EngineConfig) -> Result<Arc<Engine>> {
        std::fs::create_dir_all(state_dir).map_err(|e| io(&state_dir.display().to_string(), e))?;
        // One daemon per state directory: its cache file names pools it alone may own.
        let lock = crate::owner::lock_state_dir(state_dir)?;
        let owner = crate::owner::local_owner(state_dir)?;
        let engine = Engine {
            inner: EngineInner {
                state_dir: state_dir.to_path_buf(),
                config,
                pools: RwLock::new(BTreeMap::new()),
                admin: Mutex::new(()),
                holders: Arc::default(),
                me: std::sync::OnceLock::new(),
                autosnap: Default::default(),
                owner,
                lock: Mutex::new(Some(lock)),
                awaiting_upgrade: Mutex::default(),
            },
        };
        let cache = engine.read_cache()?;
        for cached in cache.pools {
            match engine.import_devices(&cached.devices, Some(cached.guid), false, None, false) {
                Ok(p) => {
                    tracing::info!(pool = %p.pool.name, "imported from cache file");
                    engine.inner.pools.write().insert(p.pool.name.clone(), p);
                }
                Err(e @ Error::NeedsUpgrade(_)) => {
                    tracing::error!(pool = %cached.name, "not imported: {e}");
                    engine.inner.awaiting_upgrade.lock().push(cached);
                }
                Err(e) => {
                    tracing::error!(pool = %cached.name, error = %e, "cannot import pool from cache file")
                }
            }
        }
        let engine = Arc::new(engine);
        let _ = engine.inner.me.set(Arc::downgrade(&engine));
        let pools: Vec<_> = engine.inner.pools.read().values().cloned().collect();
        for p in pools {
            engine.resume_scan(&p);
            if let Err(e) = history::store_vdev_paths(&p) {
                tracing::warn!(pool = %p.pool.name, error = %e, "cannot record device paths");
            }
        }
        let weak = Arc::downgrade(&engine);
        std::thread::Builder::new()
            .name("event-watch".into())
            .spawn(move || watch_devices(weak))
            .map_err(|e| io("cannot start the event watcher", e))?;
        Ok(engine)
    }

    pub fn state_dir(&self) -> &Path {
        &self.inner.state_dir
    }

    fn read_cache(&self) -> Result<CacheFile> {
        let path = self.inner.state_dir.join(CACHE_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => {
                let cache: CacheFile = serde_json::from_slice(&bytes)
                    .map_err(|e| io(&path.display().to_string(), e))?;
                if cache.version > CACHE_VERSION {
                    return Err(Error::InvalidArgument(format!(
                        "{}: cache file version {} is newer than this build understands",
                        path.display(),
                        cache.version
                    )));
                }
                Ok(cache)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(CacheFile {
                version: CACHE_VERSION,
                pools: vec![],
            }),
            Err(e) => Err(io(&path.display().to_string(), e)),
        }
    }

    /// Rewrites the cache file from the imported pools (atomically: temp file, fsync, rename).
    fn write_cache(&self) -> Result<()> {
        let pools = self.inner.pools.read();
        let awaiting = self.inner.awaiting_upgrade.lock();
        let cache = CacheFile {
            version: CACHE_VERSION,
            pools: pools
                .values()
                .map(|p| CachedPool {
                    name: p.pool.name.clone(),
                    guid: p.pool.guid,
                    devices: p.pool.device_paths(),
                })
                .chain(awaiting.iter().cloned())
                .collect(),
        };
        let path = self.inner.state_dir.join(CACHE_FILE);
        let tmp = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(&cache).map_err(|e| io("cache file", e))?;
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(&self.inner.state_dir)?.sync_all()
        };
        write().map_err(|e| io(&path.display().to_string(), e))
    }

    pub(crate) fn pool(&self, name: &str) -> Result<Arc<ImportedPool>> {
        self.inner
            .pools
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("pool '{name}'")))
    }

    pub fn create_pool(&self, spec: PoolSpec) -> Result<PoolStatus> {
        crate::names::check_new_pool_name(&spec.name)?;
        let _admin = self.inner.admin.lock();
        if self.inner.pools.read().contains_key(&spec.name) {
            return Err(Error::AlreadyExists(format!("pool '{}'", spec.name)));
        }
        if spec.groups.is_empty() || spec.groups.iter().any(|g| g.devices.is_empty()) {
            return Err(Error::InvalidArgument(
                "a pool needs at least one device in every group".into(),
            ));
        }
        if spec.groups.iter().filter(|g| g.kind.is_log()).count() > 1 {
            return Err(Error::InvalidArgument(
                "a pool takes one log group (a device or a mirror)".into(),
            ));
        }
        if spec.groups.iter().all(|g| g.kind.is_log()) {
            return Err(Error::InvalidArgument(
                "a pool needs at least one data device besides its log".into(),
            ));
        }
        let kinds: Vec<GroupKind> = spec.groups.iter().map(|g| g.kind).collect();
        let mut groups = self.open_new_devices(&spec.groups, spec.create_size, spec.force)?;
        let log_group = kinds
            .iter()
            .position(|k| k.is_log())
            .map(|i| groups.remove(i));
        let pool = Arc::new(
            Pool::create(&spec.name, groups).map_err(|e| Error::InvalidArgument(e.to_string()))?,
        );
        pool.own_new(self.inner.owner.clone(), self.inner.config.mmp())
            .and_then(|()| pool.start_mmp())
            .and_then(|()| pool.set_exported(false))
            .map_err(|e| Error::Io(e.to_string()))?;
        let imported = ImportedPool::create(pool, self.inner.config.clone())?;
        if let Some((kind, devs)) = log_group {
            add_log(&imported, kind, devs)?;
        }
        self.inner
            .pools
            .write()
            .insert(spec.name.clone(), imported.clone());
        self.write_cache()?;
        history::store_vdev_paths(&imported)?;
        history::log_internal(
            &imported,
            &format!("create pool format {}", meta::META_FORMAT_VERSION),
        );
        events::post_event(&imported.pool, class::POOL_CREATE, &[]);
        tracing::info!(pool = %spec.name, "pool created");
        self.pool_status(&spec.name)
    }

    /// `cistern pool add POOL <groups>`: appends groups to an imported pool
    /// (labels of every device name them; new space is used at once).
    pub fn add_groups(&self, pool: &str, spec: PoolAddSpec) -> Result<PoolStatus> {
        let _admin = self.inner.admin.lock();
        let p = self.pool(pool)?;
        if spec.groups.is_empty() || spec.groups.iter().any(|g| g.devices.is_empty()) {
            return Err(Error::InvalidArgument(
                "name at least one device in every group to add".into(),
            ));
        }
        let members = p.pool.device_paths();
        if let Some(path) = spec
            .groups
            .iter()
            .flat_map(|g| &g.devices)
            .find(|d| members.contains(d))
        {
            return Err(Error::Busy(format!(
                "device {} is already part of pool '{pool}'",
                path.display()
            )));
        }
        let logs = spec.groups.iter().filter(|g| g.kind.is_log()).count();
        if logs > 1 || (logs == 1 && !p.pool.logs().is_empty()) {
            return Err(Error::InvalidArgument(format!(
                "pool '{pool}' takes one log group (a device or a mirror){}",
                if logs == 1 {
                    "; remove the present one first"
                } else {
                    ""
                }
            )));
        }
        let kinds: Vec<GroupKind> = spec.groups.iter().map(|g| g.kind).collect();
        let groups = self.open_new_devices(&spec.groups, spec.create_size, spec.force)?;
        for (gk, (kind, devs)) in kinds.into_iter().zip(groups) {
            if gk.is_log() {
                add_log(&p, kind, devs)?;
            } else {
                p.pool
                    .add_group(kind, devs)
                    .map_err(|e| Error::InvalidArgument(e.to_string()))?;
            }
        }
        self.write_cache()?;
        history::store_vdev_paths(&p)?;
        for g in &spec.groups {
            let paths: Vec<String> = g.devices.iter().map(|d| d.display().to_string()).collect();
            history::log_internal(&p, &format!("vdev add {:?} {}", g.kind, paths.join(" ")));
            events::post_event(&p.pool, class::VDEV_ADD, &[("vdev_path", paths.join(","))]);
        }
        tracing::info!(pool, groups = spec.groups.len(), "groups added");
        self.pool_status(pool)
    }

    /// Opens (or, with `create_size`, creates) the devices of new groups for
    /// `pool create` and `pool add`: absolute paths, each named once, none
    /// holding another pool's label unless `force` (never an imported one's).
    fn open_new_devices(
        &self,
        specs: &[GroupSpec],
        create_size: Option<u64>,
        force: bool,
    ) -> Result<Vec<(LayoutKind, Vec<Vdev>)>> {
        let mut seen = std::collections::HashSet::new();
        let mut groups = Vec::new();
        for g in specs {
            let kind = layout_of(g.kind);
            if kind == LayoutKind::Mirror && g.devices.len() < 2 {
                return Err(Error::InvalidArgument(
                    "a mirror needs at least two devices".into(),
                ));
            }
            let mut devs = Vec::new();
            for path in &g.devices {
                if !path.is_absolute() && !vdev::bucket::is_location(path) {
                    return Err(Error::InvalidArgument(format!(
                        "device path {} is not absolute",
                        path.display()
                    )));
                }
                if !seen.insert(path.clone()) {
                    return Err(Error::InvalidArgument(format!(
                        "device {} is named twice",
                        path.display()
                    )));
                }
                let dev = Vdev::open_or_create(path, create_size)
                    .map_err(|e| Error::InvalidArgument(e.to_string()))?;
                self.check_reusable(&dev, force)?;
                devs.push(dev);
            }
            groups.push((kind, devs));
        }
        Ok(groups)
    }

    /// A device holding the label of a pool may join another only with
    /// `force`, never while that pool is imported here, and never while
    /// another live daemon holds it (its label says ACTIVE and names it).
    fn check_reusable(&self, dev: &Vdev, force: bool) -> Result<()> {
        let Ok(label) = dev.read_label() else {
            return Ok(());
        };
        let in_use = self
            .inner
            .pools
            .read()
            .values()
            .any(|p| p.pool.guid == label.pool_guid);
        let path = dev.path().display();
        let name = &label.pool_name;
        if in_use {
            return Err(Error::Busy(format!(
                "device {path} is part of active pool '{name}' (imported here)"
            )));
        }
        // A live holder's pool is never taken, not even with -f.
        if let Some(h) = self.live_holder(dev, &label) {
            return Err(Error::Busy(format!(
                "device {path} is part of active pool '{name}' (host {}, pid {})",
                h.hostname, h.pid
            )));
        }
        if force {
            return Ok(());
        }
        let state = match label.pool_state() {
            pool::PoolState::Exported => "exported",
            pool::PoolState::Active => "potentially active",
        };
        Err(Error::Busy(format!(
            "device {path} is part of {state} pool '{name}' (use -f to reuse the device)"
        )))
    }

    /// The daemon that may still hold the pool of `label`, by the device's
    /// MMP stamp or else an ACTIVE label's owner ([`pool::live_holder`]).
    fn live_holder(&self, dev: &Vdev, label: &pool::Label) -> Option<pool::Owner> {
        let stamp = dev
            .read_mmp()
            .ok()
            .flatten()
            .filter(|s| s.pool_guid == label.pool_guid);
        let label_owner = label
            .owner
            .as_ref()
            .filter(|_| label.pool_state() == pool::PoolState::Active);
        pool::live_holder(stamp.as_ref(), label_owner, &self.inner.owner)
    }

    /// Opens the devices, checks they form one pool, assembles and imports it.
    /// Only one daemon gets it: the pool's MMP slots are claimed first
    /// (`force`: also from a holder that seems alive, once its stamps stay still).
    fn import_devices(
        &self,
        paths: &[PathBuf],
        guid: Option<u64>,
        force: bool,
        upgrade: Option<&mut Vec<String>>,
        missing_log: bool,
    ) -> Result<Arc<ImportedPool>> {
        let mut devs = Vec::new();
        for path in paths {
            let dev = match Vdev::open(path) {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(error = %e, "device unavailable");
                    continue;
                }
            };
            match dev.read_label() {
                Ok(label) if guid.is_none_or(|g| g == label.pool_guid) => devs.push((dev, label)),
                Ok(_) => {
                    tracing::warn!(device = %path.display(), "device now belongs to another pool")
                }
                Err(e) => tracing::warn!(error = %e, "device has no usable label"),
            }
        }
        self.import_opened(devs, force, upgrade, missing_log)
    }

    /// The second half of [`Engine::import_devices`]: devices already open
    /// with their labels (a bucket device opened by `pool takeover`).
    fn import_opened(
        &self,
        devs: Vec<(Vdev, pool::Label)>,
        force: bool,
        upgrade: Option<&mut Vec<String>>,
        missing_log: bool,
    ) -> Result<Arc<ImportedPool>> {
        if devs.is_empty() {
            return Err(Error::NotFound("no device of the pool is available".into()));
        }
        // A bucket pool's MMP slot is local to this daemon's cache (never
        // shipped), so watching it for the label's owner can only wait: the
        // log's create-if-absent claim has already fenced that owner
        // (decisions 0039, 0048).
        let all_bucket = devs.iter().all(|(d, _)| d.is_bucket());
        let label_owner = devs
            .iter()
            .filter(|_| !all_bucket)
            .filter(|(_, l)| l.pool_state() == pool::PoolState::Active)
            .max_by_key(|(_, l)| l.generation)
            .and_then(|(_, l)| l.owner.clone());
        let pool = Arc::new(Pool::open(devs).map_err(|e| Error::Io(e.to_string()))?);
        if missing_log {
            pool.accept_missing_log();
        }
        if self.inner.pools.read().contains_key(&pool.name) {
            return Err(Error::AlreadyExists(format!(
                "a pool named '{}' is already imported",
                pool.name
            )));
        }
        let claimed = pool
            .claim(
                self.inner.owner.clone(),
                self.inner.config.mmp(),
                force,
                label_owner,
            )
            .and_then(|()| pool.start_mmp());
        if let Err(e) = claimed {
            return Err(match e {
                pool::PoolError::Vdev(_) => Error::Io(e.to_string()),
                e => Error::Busy(e.to_string()),
            });
        }
        let imported = ImportedPool::open(pool.clone(), self.inner.config.clone(), upgrade)
            .and_then(|p| {
                // The labels now name this daemon as the owner of an ACTIVE pool.
                p.pool
                    .set_exported(false)
                    .map_err(|e| Error::Io(e.to_string()))?;
                Ok(p)
            });
        if imported.is_err() {
            pool.release();
        }
        imported
    }

    pub fn list_pools(&self) -> Vec<PoolSummary> {
        self.inner
            .pools
            .read()
            .values()
            .map(|p| summary(p))
            .collect()
    }

    pub fn pool_status(&self, pool: &str) -> Result<PoolStatus> {
        let p = match self.pool(pool) {
            Err(e @ Error::NotFound(_)) => {
                return crate::standby_status::of(pool).ok_or(e);
            }
            r => r?,
        };
        let known = history::vdev_paths(&p).unwrap_or_default();
        let groups = p
            .pool
            .groups()
            .iter()
            .map(|g| {
                let i = g.index;
                let name = match g.kind {
                    LayoutKind::Disk => g
                        .children()
                        .first()
                        .and_then(|c| c.device.as_ref())
                        .map(|d| d.path().display().to_string())
                        .unwrap_or_else(|| format!("disk-{i}")),
                    kind => format!("{}-{i}", kind.name()),
                };
                group_status(g, name, kind_of(g.kind), &known)
            })
            .collect();
        let logs = p
            .pool
            .logs()
            .iter()
            .map(|g| {
                let kind = match g.kind {
                    LayoutKind::Mirror => GroupKind::LogMirror,
                    _ => GroupKind::Log,
                };
                group_status(g, log_group_name(&p, g), kind, &known)
            })
            .collect();
        let (scan, data_errors) = scrub::status(&p);
        let errors = if data_errors.is_empty() {
            vec!["No known data errors".into()]
        } else {
            vec![format!(
                "{} data errors, use '-v' for a list",
                scan.as_ref().map_or(data_errors.len() as u64, |s| s
                    .errors
                    .max(data_errors.len() as u64))
            )]
        };
        let text = p.status_text(data_errors.len());
        Ok(PoolStatus {
            summary: summary(&p),
            groups,
            logs,
            errors,
            scan,
            data_errors,
            status: text.as_ref().map(|t| t.0.clone()),
            action: text.map(|t| t.1),
            suspended: p.health.suspension().map(|s| s.cause),
            memory: Some(p.memory_use()),
            cache: p.cache.l2_status(),
        })
    }

    /// Continues a scan persisted as running (import, restart after a crash).
    fn resume_scan(&self, p: &Arc<ImportedPool>) {
        // Devices taken offline stay offline (their resilver waits for `online`).
        match p.offline_devices() {
            Ok(guids) => {
                for guid in guids {
                    if p.pool.device_by_guid(guid).is_some() {
                        if let Err(e) = p.pool.set_device_state(guid, pool::DeviceState::Offline) {
                            tracing::error!(pool = %p.pool.name, guid, error = %e, "cannot keep device offline");
                        }
                    }
                }
            }
            Err(e) => {
                tracing::error!(pool = %p.pool.name, error = %e, "cannot read offline devices")
            }
        }
        if let Err(e) = scrub::resume_at_import(p) {
            tracing::error!(pool = %p.pool.name, error = %e, "cannot resume scan");
        }
    }

    /// `cistern pool scrub [-p|-s] POOL`.
    pub fn scrub_pool(&self, pool: &str, action: ScrubAction) -> Result<PoolStatus> {
        let p = self.pool(pool)?;
        match action {
            ScrubAction::Start => scrub::start_scrub(&p)?,
            ScrubAction::Pause => scrub::pause(&p)?,
            ScrubAction::Stop => scrub::cancel(&p)?,
        }
        self.pool_status(pool)
    }

    /// `cistern pool offline POOL DEV`: no more I/O to the device; refused
    /// when the group would be left without enough devices to read from.
    pub fn offline_device(&self, pool: &str, device: &str) -> Result<PoolStatus> {
        let p = self.pool(pool)?;
        let (g, guid, dev) = find_device(&p, device)?;
        let Some(dev) = dev else {
            return Err(Error::InvalidArgument(format!(
                "device {device} is missing; it is already unavailable"
            )));
        };
        if dev.state() == pool::DeviceState::Offline {
            return self.pool_status(pool);
        }
        let group = p.pool.group(g).map_err(|e| Error::Io(e.to_string()))?;
        // Readable devices of the group other than this one.
        let others = group
            .children()
            .iter()
            .filter(|c| c.guid != guid && !c.resilvering)
            .filter(|c| {
                c.device.as_ref().is_some_and(|d| {
                    !matches!(
                        d.state(),
                        pool::DeviceState::Offline | pool::DeviceState::Faulted
                    )
                })
            })
            .count();
        if others < min_live(&group) {
            return Err(Error::Busy(format!(
                "cannot offline {device}: no valid replicas (its group would lose data)"
            )));
        }
        {
            // No txg in the middle of its writes while the set of devices changes.
            let _meta = p.meta_lock.lock();
            p.pool
                .set_device_state(guid, pool::DeviceState::Offline)
                .map_err(|e| Error::Io(e.to_string()))?;
            // It misses every write from now on: marked for a rebuild in the
            // labels, so that it is resilvered when it comes back; OFFLINE
            // itself is a pool record, so it stays offline across restarts.
            p.pool
                .begin_resilver(guid)
                .map_err(|e| Error::Io(e.to_string()))?;
            p.store_offline_locked(guid, true)?;
        }
        events::post_event(&p.pool, class::VDEV_OFFLINE, &vdev_fields(&dev, guid));
        tracing::info!(pool, device, "device taken offline");
        self.pool_status(pool)
    }

    /// `cistern pool online POOL DEV`: back in service; what was written
    /// while it was away is resilvered onto it. A FAULTED or REMOVED device
    /// is retried first (reopened at its path) and refused if still unusable.
    pub fn online_device(&self, pool: &str, device: &str) -> Result<PoolStatus> {
        let p = self.pool(pool)?;
        let (_, guid, dev) = find_device(&p, device)?;
        let Some(dev) = dev else {
            return Err(Error::InvalidArgument(format!(
                "device {device} is missing: replace it with `cistern pool replace`"
            )));
        };
        match dev.state() {
            pool::DeviceState::Offline => {
                scrub::preempt(&p)?;
                {
                    let _meta = p.meta_lock.lock();
                    p.pool
                        .set_device_state(guid, pool::DeviceState::Online)
                        .map_err(|e| Error::Io(e.to_string()))?;
                    p.store_offline_locked(guid, false)?;
                }
                self.bring_back(&p, &[guid])?;
            }
            pool::DeviceState::Faulted | pool::DeviceState::Removed => {
                let back = p
                    .pool
                    .clear_errors(Some(guid))
                    .map_err(|e| Error::Io(e.to_string()))?;
                if back.is_empty() {
                    let dev = p.pool.device_by_guid(guid);
                    return Err(Error::Busy(format!(
                        "cannot online {device}: {}",
                        dev.and_then(|d| d.reason())
                            .unwrap_or_else(|| "the device is still unusable".into())
                    )));
                }
                self.bring_back(&p, &back)?;
            }
            _ => return self.pool_status(pool),
        }
        events::post_event(&p.pool, class::VDEV_ONLINE, &vdev_fields(&dev, guid));
        tracing::info!(pool, device, "device brought online; resilvering");
        self.pool_status(pool)
    }

    /// Devices back in service after missing writes (online, clear): each
    /// is marked for a rebuild in the labels and the first one's resilver
    /// starts (the scan takes the others one after another). A device of a
    /// group without redundancy has nothing to be rebuilt from: it is only
    /// trusted again.
    fn bring_back(&self, p: &Arc<ImportedPool>, guids: &[u64]) -> Result<()> {
        let redundant: Vec<u64> = guids
            .iter()
            .copied()
            .filter(|g| {
                p.pool.groups().iter().any(|grp| {
                    grp.children().iter().any(|c| c.guid == *g)
                        && grp.kind.redundancy(grp.width()) > 0
                })
            })
            .collect();
        let Some(&first) = redundant.first() else {
            return Ok(());
        };
        scrub::preempt(p)?;
        let rec = {
            let _meta = p.meta_lock.lock();
            for g in &redundant {
                // Missed the writes made meanwhile: trusted for reads only once rebuilt.
                p.pool
                    .begin_resilver(*g)
                    .map_err(|e| Error::Io(e.to_string()))?;
            }
            let rec = scrub::resilver_record(p, first, first);
            scrub::store_new_locked(p, &rec)?;
            rec
        };
        scrub::start_resilver(p, rec)
    }

    /// `cistern pool clear POOL [DEV]`: error counters to zero; FAULTED and
    /// REMOVED devices retried (resilvered when they come back); a
    /// suspended pool retried and resumed if its commits work again.
    pub fn clear_errors(&self, pool: &str, device: Option<&str>) -> Result<PoolStatus> {
        let p = self.pool(pool)?;
        let guid = match device {
            Some(d) => Some(find_device(&p, d)?.1),
            None => None,
        };
        let back = p
            .pool
            .clear_errors(guid)
            .map_err(|e| Error::Io(e.to_string()))?;
        p.resume()?;
        if !back.is_empty() {
            self.bring_back(&p, &back)?;
        }
        events::post_event(
            &p.pool,
            class::VDEV_CLEAR,
            &[("vdev_guid", guid.map_or("all".into(), |g| g.to_string()))],
        );
        tracing::info!(pool, ?device, devices_back = back.len(), "errors cleared");
        self.pool_status(pool)
    }

    /// `cistern pool get all POOL`.
    pub fn pool_properties(&self, pool: &str) -> Result<Vec<Property>> {
        let p = self.pool(pool)?;
        Ok(p.pool_properties(&summary(&p).health))
    }

    /// `cistern pool set PROP=VALUE POOL`.
    pub fn set_pool_property(&self, pool: &str, prop: &str, value: &str) -> Result<Vec<Property>> {
        let p = self.pool(pool)?;
        p.set_pool_property(prop, value)?;
        Ok(p.pool_properties(&summary(&p).health))
    }

    /// `cistern pool replace POOL OLD NEW`: NEW (an existing file or block
    /// device) takes OLD's place and is resilvered; OLD may be missing.
    pub fn replace_device(
        &self,
        pool: &str,
        old: &str,
        new: &Path,
        force: bool,
    ) -> Result<PoolStatus> {
        let p = self.pool(pool)?;
        let (g, old_guid, old_dev) = find_device(&p, old)?;
        if old_dev.as_ref().is_some_and(|d| d.path() == new) {
            return Err(Error::InvalidArgument(format!(
                "{} is already {old}: give a different device",
                new.display()
            )));
        }
        check_new_device_path(&p, new)?;
        // A running resilver (of another device, or of OLD itself if the
        // device being rebuilt failed) is stopped; a device it left half
        // rebuilt is still marked so in the labels and is resumed after.
        let vdev = Vdev::open(new).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let data_size = p
            .pool
            .group(g)
            .map_err(|e| Error::Io(e.to_string()))?
            .data_size;
        let need = p.pool.regions.data_offset + data_size + pool::LABEL_SIZE;
        if vdev.size() < need {
            return Err(Error::InvalidArgument(format!(
                "{} is {} bytes; the group needs at least {need}",
                new.display(),
                vdev.size()
            )));
        }
        self.check_reusable(&vdev, force)?;
        scrub::preempt(&p)?;
        let rec = {
            // No txg is writing while the device joins: every txg after this
            // writes to it, every block before is in BLOCKS for the walk.
            let _meta = p.meta_lock.lock();
            let new_guid = p
                .pool
                .replace_device(old_guid, vdev)
                .map_err(|e| Error::InvalidArgument(e.to_string()))?;
            let rec = scrub::resilver_record(&p, new_guid, old_guid);
            scrub::store_new_locked(&p, &rec)?;
            rec
        };
        history::store_vdev_paths(&p)?;
        history::log_internal(
            &p,
            &format!(
                "vdev replace {old_guid} with {} {}",
                rec.target_guid,
                new.display()
            ),
        );
        events::post_event(
            &p.pool,
            class::VDEV_ATTACH,
            &[
                ("vdev_path", new.display().to_string()),
                ("vdev_guid", rec.target_guid.to_string()),
                ("replacing", old_guid.to_string()),
            ],
        );
        scrub::start_resilver(&p, rec)?;
        self.write_cache()?;
        tracing::info!(pool, old, new = %new.display(), "replacing device; resilvering");
        self.pool_status(pool)
    }

    /// `pool destroy`: refused while front ends have its datasets open.
    pub fn destroy_pool(&self, pool: &str) -> Result<()> {
        self.destroy_pool_with(pool, false)
    }

    /// `pool destroy [-f]`: with `force`, clients of its datasets are
    /// disconnected first (they see ESHUTDOWN).
    pub fn destroy_pool_with(&self, pool: &str, force: bool) -> Result<()> {
        self.pool(pool)?;
        let _fence = self.fence(Scope::Tree(pool.into()), force, "pool destroy", |who| {
            format!("cannot destroy '{pool}': pool is busy (open by {who}); use -f to disconnect")
        })?;
        let _admin = self.inner.admin.lock();
        let p = self.pool(pool)?;
        scrub::stop(&p);
        self.inner.pools.write().remove(pool);
        let _ = p.close();
        p.pool.release();
        p.pool.wipe_labels().map_err(|e| Error::Io(e.to_string()))?;
        self.write_cache()?;
        events::post_event(&p.pool, class::POOL_DESTROY, &[]);
        tracing::info!(pool, "pool destroyed");
        Ok(())
    }

    /// `pool export`: refused while front ends have its datasets open.
    pub fn export_pool(&self, pool: &str) -> Result<()> {
        self.export_pool_with(pool, false)
    }

    /// `pool export [-f]`: with `force`, clients of its datasets are
    /// disconnected first (they see ESHUTDOWN).
    pub fn export_pool_with(&self, pool: &str, force: bool) -> Result<()> {
        self.pool(pool)?;
        let _fence = self.fence(Scope::Tree(pool.into()), force, "pool export", |who| {
            format!("cannot export '{pool}': pool is busy (open by {who}); use -f to disconnect")
        })?;
        let _admin = self.inner.admin.lock();
        let p = self.pool(pool)?;
        scrub::stop(&p);
        history::log_internal(&p, "export");
        p.close()?;
        // Opened names of its sealed directories leave memory with its keys.
        crate::namerow::forget_pool(p.pool.guid);
        events::post_event(&p.pool, class::POOL_EXPORT, &[]);
        p.pool
            .set_exported(true)
            .map_err(|e| Error::Io(e.to_string()))?;
        p.pool.release();
        self.inner.pools.write().remove(pool);
        self.write_cache()?;
        tracing::info!(pool, "pool exported");
        Ok(())
    }

    /// Labels of every file or block device directly inside `dirs`, grouped by pool.
    /// With each pool: the daemon that may still hold it.
    #[allow(clippy::type_complexity)]
    fn scan(
        &self,
        dirs: &[PathBuf],
    ) -> Result<Vec<(pool::Label, Vec<PathBuf>, Option<pool::Owner>)>> {
        let mut found: HashMap<u64, (pool::Label, Vec<PathBuf>, Option<pool::Owner>)> =
            HashMap::new();
        for dir in dirs {
            let entries = std::fs::read_dir(dir).map_err(|e| io(&dir.display().to_string(), e))?;
            for entry in entries.flatten() {
                let path = entry.path();
                let Ok(ft) = entry.file_type() else { continue };
                use std::os::unix::fs::FileTypeExt;
                if !(ft.is_file() || ft.is_block_device()) {
                    continue;
                }
                let Ok(dev) = Vdev::open(&path) else { continue };
                if let Ok(label) = dev.read_label() {
                    let holder = self.live_holder(&dev, &label);
                    let e = found
                        .entry(label.pool_guid)
                        .or_insert_with(|| (label.clone(), Vec::new(), None));
                    e.1.push(path);
                    if e.2.is_none() {
                        e.2 = holder;
                    }
                }
            }
        }
        let imported: Vec<u64> = self
            .inner
            .pools
            .read()
            .values()
            .map(|p| p.pool.guid)
            .collect();
        Ok(found
            .into_values()
            .filter(|(l, _, _)| !imported.contains(&l.pool_guid))
            .collect())
    }

    pub fn importable_pools(&self, dirs: &[PathBuf]) -> Result<Vec<ImportablePool>> {
        let mut out: Vec<ImportablePool> = self
            .scan(dirs)?
            .into_iter()
            .map(|(label, devices, holder)| {
                let expected: usize = label.groups.iter().map(|g| g.devices.len()).sum();
                let active = label.pool_state() == pool::PoolState::Active;
                ImportablePool {
                    name: label.pool_name,
                    guid: label.pool_guid,
                    complete: devices.len() >= expected,
                    devices,
                    in_use_by: holder.map(|h| format!("host {}, pid {}", h.hostname, h.pid)),
                    active,
                }
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// `cistern pool import -d DIR [-f] POOL`; `force` takes a pool another
    /// daemon seems to hold once its MMP stamps stay still (decision 0010).
    pub fn import_pool(&self, pool: &str, dirs: &[PathBuf], force: bool) -> Result<PoolStatus> {
        self.import_pool_with(pool, dirs, force, false)
    }

    /// [`Engine::import_pool`]; `missing_log` (`-m`): a missing log device's
    /// unreplayed records are given up instead of refusing the import.
    pub fn import_pool_with(
        &self,
        pool: &str,
        dirs: &[PathBuf],
        force: bool,
        missing_log: bool,
    ) -> Result<PoolStatus> {
        if dirs.is_empty() && force {
            // `pool takeover POOL` on a warm standby (decision 0048).
            return self.takeover_pool(pool, Path::new(""));
        }
        if let [dir] = dirs {
            if vdev::bucket::is_location(dir) {
                if !force {
                    return Err(Error::InvalidArgument(format!(
                        "{}: a pool in a bucket is taken over, not imported (cistern pool takeover {pool} {})",
                        dir.display(),
                        dir.display()
                    )));
                }
                return self.takeover_pool(pool, dir);
            }
        }
        let _admin = self.inner.admin.lock();
        let candidates: Vec<_> = self
            .scan(dirs)?
            .into_iter()
            .filter(|(l, _, _)| l.pool_name == pool || l.pool_guid.to_string() == pool)
            .collect();
        let (label, devices, _) = match candidates.len() {
            0 => {
                return Err(Error::NotFound(format!(
                    "no importable pool '{pool}' in the given directories"
                )))
            }
            1 => candidates
                .into_iter()
                .next()
                .ok_or_else(|| Error::NotFound(pool.to_string()))?,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "several pools are named '{pool}': import by numeric guid"
                )))
            }
        };
        let p = match self.import_devices(&devices, Some(label.pool_guid), force, None, missing_log)
        {
            Err(e @ Error::NeedsUpgrade(_)) => {
                // Remembered, so `pool upgrade` finds its devices.
                let mut awaiting = self.inner.awaiting_upgrade.lock();
                awaiting.retain(|c| c.guid != label.pool_guid);
                awaiting.push(CachedPool {
                    name: label.pool_name.clone(),
                    guid: label.pool_guid,
                    devices: devices.clone(),
                });
                return Err(e);
            }
            r => r?,
        };
        let name = p.pool.name.clone();
        self.inner.pools.write().insert(name.clone(), p.clone());
        self.write_cache()?;
        tracing::info!(pool = %name, "pool imported");
        if let Err(e) = history::store_vdev_paths(&p) {
            tracing::warn!(pool = %name, error = %e, "cannot record device paths");
        }
        history::log_internal(&p, "import");
        events::post_event(&p.pool, class::POOL_IMPORT, &[]);
        self.resume_scan(&p);
        self.pool_status(&name)
    }

    /// `cistern pool takeover POOL LOCATION` (decision 0039): claims the
    /// pool's log in the bucket (which fences its previous owner: its next
    /// ship fails and it acknowledges nothing more), replays it into a local
    /// cache and imports the pool.
    pub fn takeover_pool(&self, pool: &str, location: &Path) -> Result<PoolStatus> {
        let _admin = self.inner.admin.lock();
        if self.inner.pools.read().contains_key(pool) {
            return Err(Error::AlreadyExists(format!(
                "a pool named '{pool}' is already imported"
            )));
        }
        let started = std::time::Instant::now();
        // A warm standby of this pool claims from where it has applied the
        // log (decision 0048); otherwise the whole log is replayed.
        let loc = location.to_string_lossy();
        let warm = vdev::standby::take_over(pool, Some(loc.as_ref()).filter(|l| !l.is_empty()));
        let dev = match warm {
            Some(r) => r,
            None if loc.is_empty() => {
                return Err(Error::NotFound(format!(
                    "this daemon is no standby of pool '{pool}': give its location (cistern pool takeover {pool} s3://BUCKET/PREFIX)"
                )))
            }
            None => Vdev::take_over(location),
        }
        .map_err(|e| Error::Io(e.to_string()))?;
        let label = dev.read_label().map_err(|e| Error::Io(e.to_string()))?;
        if label.pool_name != pool && label.pool_guid.to_string() != pool {
            return Err(Error::NotFound(format!(
                "{} holds pool '{}', not '{pool}'",
                location.display(),
                label.pool_name
            )));
        }
        let p = self.import_opened(vec![(dev, label)], true, None, false)?;
        let name = p.pool.name.clone();
        self.inner.pools.write().insert(name.clone(), p.clone());
        self.write_cache()?;
        tracing::info!(pool = %name, location = %location.display(), ms = started.elapsed().as_millis() as u64, "pool taken over");
        if let Err(e) = history::store_vdev_paths(&p) {
            tracing::warn!(pool = %name, error = %e, "cannot record device paths");
        }
        history::log_internal(&p, &format!("takeover {}", location.display()));
        events::post_event(&p.pool, class::POOL_IMPORT, &[]);
        self.resume_scan(&p);
        self.pool_status(&name)
    }

    pub fn create_volume(
        &self,
        name: &str,
        volsize: u64,
        props_in: &[(String, String)],
    ) -> Result<DatasetInfo> {
        self.create_volume_keyed(name, volsize, props_in, None)
    }

    /// [`Engine::create_volume`] with the key of a new encryption root
    /// (`keylocation=prompt`; decision 0026).
    pub fn create_volume_keyed(
        &self,
        name: &str,
        volsize: u64,
        props_in: &[(String, String)],
        key: Option<&crate::KeyMaterial>,
    ) -> Result<DatasetInfo> {
        self.create_volume_as(name, volsize, props_in, key, &|_| {})
    }

    /// [`Engine::create_volume_keyed`]; `finish` completes the record
    /// before its one store (a receive marks it as being received in the
    /// same transaction that creates it, decision 0051).
    pub(crate) fn create_volume_as(
        &self,
        name: &str,
        volsize: u64,
        props_in: &[(String, String)],
        key: Option<&crate::KeyMaterial>,
        finish: &dyn Fn(&mut DatasetRecord),
    ) -> Result<DatasetInfo> {
        let (pool_name, Some(_)) = split_dataset(name)? else {
            return Err(Error::InvalidArgument(format!(
                "'{name}': a volume is named POOL/VOLUME"
            )));
        };
        let p = self.pool(pool_name)?;
        check_new_dataset(&p.datasets.read(), name)?;
        let (mut crypt, props_in) = crate::crypt::prepare_create(&p, name, props_in, key)?;
        let props_in = &props_in[..];
        let mut volblocksize = props::DEFAULT_VOLBLOCKSIZE;
        let mut local = BTreeMap::new();
        for (k, v) in props_in {
            match k.as_str() {
                "volblocksize" => {
                    let n = props::parse_size(v)
                        .map_err(|e| Error::InvalidArgument(format!("volblocksize: {e}")))?;
                    volblocksize = props::validate_volblocksize(n)?;
                }
                "volsize" => {
                    return Err(Error::InvalidArgument(
                        "give the size with -V, not -o volsize".into(),
                    ))
                }
                _ => {
                    props::check_kind(k, DatasetKind::Volume)?;
                    local.insert(k.clone(), props::normalize(k, v)?);
                }
            }
        }
        if volsize == 0 || volsize % volblocksize as u64 != 0 {
            return Err(Error::InvalidArgument(format!(
                "volsize {volsize} must be a positive multiple of volblocksize {volblocksize}"
            )));
        }
        // Not sparse (`create -s` sets refreservation=none): the volume reserves its size.
        let auto = p.volume_reservation(volsize, volblocksize);
        match local.get("refreservation").map(String::as_str) {
            None | Some("auto") => {
                local.insert("refreservation".into(), auto.to_string());
            }
            _ => {}
        }
        local.retain(|_, v| v != "none");
        p.check_new(&p.datasets.read(), name, &local)?;
        let id = p.next_dataset_id()?;
        let crypt_rec = crate::crypt::record_for(id, &mut crypt)?;
        let mut rec = DatasetRecord {
            id,
            crypt: crypt_rec,
            name: name.to_string(),
            kind: DatasetKind::Volume,
            volsize,
            volblocksize,
            local,
            created_txg: p.open.lock().txg,
            creation: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            ..Default::default()
        };
        finish(&mut rec);
        p.store_dataset(&rec)?;
        crate::crypt::after_store(&p, id, crypt);
        tracing::info!(dataset = name, volsize, volblocksize, "volume created");
        self.dataset(name)
    }

    pub fn list_datasets(&self, root: Option<&str>) -> Result<Vec<DatasetInfo>> {
        let pools: Vec<Arc<ImportedPool>> = match root {
            Some(r) => vec![self.pool(split_dataset(r)?.0)?],
            None => self.inner.pools.read().values().cloned().collect(),
        };
        let mut out = Vec::new();
        let mut policies = HashMap::new();
        for p in pools {
            let datasets = p.datasets.read();
            if let Some(r) = root {
                if !datasets.contains_key(r) {
                    return Err(Error::NotFound(format!("dataset '{r}'")));
                }
            }
            for rec in datasets.values() {
                let below = |r: &str| {
                    rec.name == r
                        || rec.name.starts_with(&format!("{r}/"))
                        || rec.name.starts_with(&format!("{r}@"))
                };
                if root.is_none_or(below) {
                    let mut i = info(&p, &datasets, rec);
                    if rec.is_snapshot() {
                        self.add_auto_property(&datasets, &mut i, &mut policies);
                    }
                    out.push(i);
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// One page of [`Engine::list_datasets`]: the datasets at or below `root`
    /// of the given kinds (empty: all), in name order except that snapshots
    /// of one dataset are in creation order (newest last), and the total
    /// before paging. `depth` as `list -d`: 1 is the root's children and
    /// snapshots. Properties are computed only for the page, so a page of a
    /// pool with 10,000 snapshots costs what the page holds.
    pub fn list_datasets_page(
        &self,
        root: Option<&str>,
        kinds: &[DatasetKind],
        depth: Option<usize>,
        offset: usize,
        limit: usize,
    ) -> Result<(usize, Vec<DatasetInfo>)> {
        let pools: Vec<Arc<ImportedPool>> = match root {
            Some(r) => vec![self.pool(split_dataset(r)?.0)?],
            None => self.inner.pools.read().values().cloned().collect(),
        };
        let mut total = 0;
        let mut out = Vec::new();
        let mut sorted: Vec<(String, Arc<ImportedPool>)> = pools
            .into_iter()
            .map(|p| (p.pool.name.clone(), p))
            .collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        let mut policies = HashMap::new();
        for (_, p) in sorted {
            let datasets = p.datasets.read();
            if let Some(r) = root {
                if !datasets.contains_key(r) {
                    return Err(Error::NotFound(format!("dataset '{r}'")));
                }
            }
            // Depth below the root (a snapshot one more than its dataset), if below it.
            let below = |name: &str| -> Option<usize> {
                let level = |n: &str| {
                    n.split('@').next().unwrap_or(n).matches('/').count()
                        + usize::from(n.contains('@'))
                };
                match root {
                    None => Some(level(name) + 1),
                    Some(r) if name == r => Some(0),
                    Some(r) => name
                        .strip_prefix(r)
                        .filter(|rest| rest.starts_with('/') || rest.starts_with('@'))
                        .map(|_| level(name) - level(r)),
                }
            };
            let mut recs: Vec<&DatasetRecord> = datasets
                .values()
                .filter(|r| {
                    below(&r.name).is_some_and(|d| depth.is_none_or(|max| d <= max))
                        && (kinds.is_empty() || kinds.contains(&r.kind))
                })
                .collect();
            // Sort key: the dataset's name, then snapshots by creation.
            recs.sort_by(|a, b| {
                let ka = a.name.split_once('@').map_or(a.name.as_str(), |x| x.0);
                let kb = b.name.split_once('@').map_or(b.name.as_str(), |x| x.0);
                ka.cmp(kb)
                    .then(a.is_snapshot().cmp(&b.is_snapshot()))
                    .then(a.created_txg.cmp(&b.created_txg))
                    .then(a.name.cmp(&b.name))
            });
            let start = offset.saturating_sub(total).min(recs.len());
            let room = limit.saturating_sub(out.len());
            for rec in recs.iter().skip(start).take(room) {
                let mut i = info(&p, &datasets, rec);
                if rec.is_snapshot() {
                    self.add_auto_property(&datasets, &mut i, &mut policies);
                }
                out.push(i);
            }
            total += recs.len();
        }
        Ok((total, out))
    }

    pub fn dataset(&self, name: &str) -> Result<DatasetInfo> {
        let (pool, _) = split_dataset(name)?;
        let p = self.pool(pool)?;
        let datasets = p.datasets.read();
        let rec = datasets
            .get(name)
            .ok_or_else(|| Error::NotFound(format!("dataset '{name}'")))?;
        let mut i = info(&p, &datasets, rec);
        if rec.is_snapshot() {
            self.add_auto_property(&datasets, &mut i, &mut HashMap::new());
        }
        Ok(i)
    }

    pub fn set_property(&self, name: &str, prop: &str, value: &str) -> Result<()> {
        let (pool, _) = split_dataset(name)?;
        let p = self.pool(pool)?;
        let mut rec = p
            .datasets
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("dataset '{name}'")))?;
        let cannot = |why: String| {
            Err(Error::InvalidArgument(format!(
                "cannot set property for '{name}': {why}"
            )))
        };
        if prop == crate::AUTO_PROPERTY {
            return cannot(format!(
                "{prop} is read-only: it names the snapshot policy whose prefix a snapshot's name has"
            ));
        }
        if crate::names::is_user_property(prop) {
            rec.local
                .insert(prop.to_string(), props::normalize(prop, value)?);
            p.store_dataset(&rec)?;
            tracing::info!(dataset = name, prop, value, "user property set");
            return Ok(());
        }
        crate::names::check_property_name(prop).or_else(|e| cannot(e.to_string()))?;
        if rec.is_snapshot() {
            return cannot("this property can not be modified for snapshots".into());
        }
        // keylocation (roots only); keyformat and pbkdf2iters through change-key.
        if let Some(done) = crate::crypt::set_property(&p, name, prop, value) {
            return done;
        }
        match prop {
            "volsize" => {
                if rec.kind != DatasetKind::Volume {
                    return Err(Error::InvalidArgument(format!("'{name}' is not a volume")));
                }
                let n: u64 = props::normalize(prop, value)?
                    .parse()
                    .map_err(|_| Error::InvalidArgument(value.into()))?;
                if n < rec.volsize {
                    return Err(Error::InvalidArgument(format!(
                        "cannot shrink volsize of '{name}' from {} to {}: shrinking would discard data",
                        rec.volsize, n
                    )));
                }
                if n % rec.volblocksize as u64 != 0 {
                    return Err(Error::InvalidArgument(format!(
                        "volsize {n} must be a multiple of volblocksize {}",
                        rec.volblocksize
                    )));
                }
                // A refreservation that follows the size grows with it (as zfs).
                let auto = p.volume_reservation(rec.volsize, rec.volblocksize);
                if crate::space::limit(&rec, "refreservation") == auto {
                    let grown = p.volume_reservation(n, rec.volblocksize);
                    p.check_limit(&p.datasets.read(), name, "refreservation", grown)?;
                    rec.local.insert("refreservation".into(), grown.to_string());
                }
                rec.volsize = n;
            }
            l if props::LIMITS.contains(&l) => {
                if rec.is_snapshot() {
                    return Err(Error::InvalidArgument(format!(
                        "cannot set property for '{name}': {prop} cannot be set on a snapshot"
                    )));
                }
                let mut v = props::normalize(prop, value)?;
                if v == "auto" {
                    if rec.kind != DatasetKind::Volume {
                        return Err(Error::InvalidArgument(format!(
                            "cannot set property for '{name}': refreservation=auto is only for volumes"
                        )));
                    }
                    v = p
                        .volume_reservation(rec.volsize, rec.volblocksize)
                        .to_string();
                }
                let n = v.parse().unwrap_or(0);
                p.check_limit(&p.datasets.read(), name, prop, n)?;
                if n == 0 {
                    rec.local.remove(prop);
                } else {
                    rec.local.insert(prop.to_string(), v);
                }
            }
            "volblocksize" => {
                return Err(Error::InvalidArgument(
                    "volblocksize can only be set when the volume is created".into(),
                ))
            }
            p if props::SETTABLE.contains(&p) => {
                if !rec.is_snapshot() {
                    props::check_kind(p, rec.kind)?;
                }
                rec.local
                    .insert(prop.to_string(), props::normalize(prop, value)?);
            }
            _ => return cannot(format!("'{prop}' is readonly")),
        }
        p.store_dataset(&rec)?;
        tracing::info!(dataset = name, prop, value, "property set");
        Ok(())
    }

    /// Registers a front end's hold on `dataset` (`client` names it in busy
    /// messages, e.g. "NBD client 127.0.0.1:40312"). While held, destroy,
    /// rollback and pool export/destroy refuse unless forced, and forced
    /// call `revoke` first. Refused while such an operation runs on it.
    pub fn open_handle(&self, dataset: &str, client: &str, revoke: Revoke) -> Result<OpenHandle> {
        self.inner
            .holders
            .open(dataset, client.to_string(), revoke, None)
    }

    /// [`Engine::open_handle`] for a holder that follows rollbacks (a
    /// mounted filesystem, as ZFS rolls back mounted filesystems): a
    /// rollback of `dataset` does not wait for it or revoke it, but calls
    /// `follow` before (write back caches) and after (drop them). Destroy
    /// and export still see the dataset busy.
    pub fn open_handle_following(
        &self,
        dataset: &str,
        client: &str,
        revoke: Revoke,
        follow: crate::holders::FollowRollback,
    ) -> Result<OpenHandle> {
        self.inner
            .holders
            .open(dataset, client.to_string(), revoke, Some(follow))
    }

    /// Holders of `root`, what is below it and their snapshots (all: `None`).
    pub fn holders(&self, root: Option<&str>) -> Vec<HolderInfo> {
        match root {
            Some(r) => self.inner.holders.list(&Scope::Tree(r.into())),
            None => self.inner.holders.list(&Scope::All),
        }
    }

    /// Fences `scope` for an operation; see `Holders::fence`.
    pub(crate) fn fence(
        &self,
        scope: Scope,
        force: bool,
        reason: &str,
        busy: impl FnOnce(&str) -> String,
    ) -> Result<crate::holders::Fence> {
        self.inner.holders.fence(scope, force, reason, busy, false)
    }

    /// [`Engine::fence`] that lets rollback followers stay (see `open_handle_following`).
    pub(crate) fn fence_for_rollback(
        &self,
        scope: Scope,
        force: bool,
        busy: impl FnOnce(&str) -> String,
    ) -> Result<crate::holders::Fence> {
        self.inner
            .holders
            .fence(scope, force, "rollback", busy, true)
    }

    pub(crate) fn rollback_followers(&self, dataset: &str) -> Vec<crate::holders::FollowRollback> {
        self.inner.holders.followers(dataset)
    }

    pub fn open_volume(&self, name: &str) -> Result<Arc<Volume>> {
        let (pool, _) = split_dataset(name)?;
        let p = self.pool(pool)?;
        let id = {
            let datasets = p.datasets.read();
            let rec = datasets
                .get(name)
                .ok_or_else(|| Error::NotFound(format!("volume '{name}'")))?;
            if rec.volblocksize == 0 {
                return Err(Error::InvalidArgument(format!("'{name}' is not a volume")));
            }
            rec.id
        };
        // An encrypted volume without its key is not served (decision 0026).
        p.key_of(id)?;
        Ok(Arc::new(Volume::new(p, id, name.to_string())))
    }

    /// A property of a dataset or snapshot as it applies now (local,
    /// inherited, or its default; `-` for an unset user property).
    pub fn property_value(&self, name: &str, prop: &str) -> Result<String> {
        let (pool, _) = split_dataset(name.split('@').next().unwrap_or(name))?;
        let p = self.pool(pool)?;
        let datasets = p.datasets.read();
        let rec = datasets
            .get(name)
            .ok_or_else(|| Error::NotFound(format!("dataset '{name}'")))?;
        Ok(crate::txg::lineage(&datasets, rec).resolve(prop).0)
    }

    pub fn volume_names(&self) -> Vec<String> {
        let mut out = Vec::new();
        for p in self.inner.pools.read().values() {
            let datasets = p.datasets.read();
            out.extend(
                datasets
                    .values()
                    .filter(|d| d.volblocksize != 0)
                    // Not exported without its key (decision 0026).
                    .filter(|d| crate::crypt::key_loaded(p, &datasets, d.id))
                    .map(|d| d.name.clone()),
            );
        }
        out
    }

    pub fn stats(&self) -> Vec<PoolStats> {
        self.inner
            .pools
            .read()
            .values()
            .map(|p| p.stats())
            .collect()
    }

    /// Commits the open txg of every pool now (used by tests and `sync`).
    pub fn sync_all(&self) -> Result<()> {
        let pools: Vec<_> = self.inner.pools.read().values().cloned().collect();
        for p in pools {
            p.sync_now()?;
        }
        Ok(())
    }

    /// Leaves everything as kill -9 would (tests of crash recovery inside
    /// one process): no more writes or MMP stamps to any pool, the state
    /// directory unlocked, nothing closed or freed.
    pub fn forget_as_if_killed(engine: Arc<Engine>) {
        for p in engine.inner.pools.read().values() {
            p.pool.halt();
        }
        engine.inner.lock.lock().take();
        std::mem::forget(engine);
    }

    pub fn shutdown(&self) -> Result<()> {
        self.stop_policy_scheduler();
        let pools: Vec<_> = self.inner.pools.read().values().cloned().collect();
        let mut first_err = None;
        for p in pools {
            scrub::stop(&p);
            if let Err(e) = p.close() {
                tracing::error!(pool = %p.pool.name, error = %e, "final txg commit failed");
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

fn summary(p: &ImportedPool) -> PoolSummary {
    let (size, allocated) = (p.pool.size(), p.pool.allocated());
    // Raw figures as zpool's SIZE/ALLOC: raidz counts parity, a mirror one copy.
    let (mut raw_size, mut raw_allocated) = (0u64, 0u64);
    let fragmentation = {
        let alloc = p.pool.allocator();
        for g in p.pool.groups() {
            let used = alloc.group_allocated(g.index as usize);
            match g.kind {
                LayoutKind::Raidz { parity } => {
                    let (w, d) = (g.width() as u64, g.width() as u64 - parity as u64);
                    raw_size += g.data_size * w;
                    raw_allocated += (used as u128 * w as u128 / d.max(1) as u128) as u64;
                }
                _ => {
                    raw_size += g.data_size;
                    raw_allocated += used;
                }
            }
        }
        alloc.fragmentation()
    };
    let states: Vec<pool::DeviceState> = p.pool.groups().iter().map(|g| g.state()).collect();
    let unavail = states
        .iter()
        .any(|s| matches!(s, pool::DeviceState::Unavail | pool::DeviceState::Faulted));
    let degraded = states.iter().any(|s| *s != pool::DeviceState::Online);
    PoolSummary {
        name: p.pool.name.clone(),
        guid: p.pool.guid,
        size,
        allocated,
        free: size - allocated,
        health: if p.is_suspended() {
            "SUSPENDED"
        } else if unavail {
            "UNAVAIL"
        } else if degraded {
            "DEGRADED"
        } else {
            "ONLINE"
        }
        .into(),
        txg: p.open.lock().txg.saturating_sub(1),
        raw_size,
        raw_allocated,
        fragmentation,
        bucket: bucket_space(p),
    }
}

/// The bucket figures of a pool whose devices live in a bucket.
pub(crate) fn bucket_space(p: &ImportedPool) -> Option<vdev::compact::Space> {
    let mut out: Option<vdev::compact::Space> = None;
    for s in p.pool.devices().iter().filter_map(|d| d.bucket_space()) {
        let o = out.get_or_insert_with(Default::default);
        if let Some(b) = s.physical_bytes {
            o.physical_bytes = Some(o.physical_bytes.unwrap_or(0) + b);
        }
        o.log_objects += s.log_objects;
        o.log_bytes += s.log_bytes;
        o.segment_objects += s.segment_objects;
        o.segment_bytes += s.segment_bytes;
        o.checkpoints += s.checkpoints;
        o.deleted_objects += s.deleted_objects;
        o.deleted_bytes += s.deleted_bytes;
        o.last_copied_bytes += s.last_copied_bytes;
        if let Some(c) = &s.cache {
            o.cache.get_or_insert_with(Default::default).add(c);
        }
    }
    out
}

/// A pool-layer error as a sentence (without "invalid layout:").
fn layout_msg(e: pool::PoolError) -> String {
    match e {
        pool::PoolError::Layout(m) => m,
        other => other.to_string(),
    }
}

/// `vdev_path`/`vdev_guid` fields of an event.
fn vdev_fields(dev: &Vdev, guid: u64) -> [(&'static str, String); 2] {
    [
        ("vdev_path", dev.path().display().to_string()),
        ("vdev_guid", guid.to_string()),
    ]
}

/// What the watcher last saw of one device or group.
#[derive(Clone, PartialEq, Eq)]
struct Seen {
    state: String,
    counters: [u64; 3],
}

/// The engine's event watcher (ZFS posts ereports from the I/O path; here
/// the lower layers only count): every 200 ms, compares each device's
/// READ/WRITE/CKSUM counters and each device's, group's and pool's state
/// with what it saw before and posts `ereport.fs.cistern.{io,checksum}`
/// and `resource.fs.cistern.statechange` events. Ends with the engine.
fn watch_devices(engine: std::sync::Weak<Engine>) {
    let mut seen: HashMap<(u64, u64, u32), Seen> = HashMap::new();
    let mut first = true;
    loop {
        if !first {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        first = false;
        let Some(engine) = engine.upgrade() else {
            return;
        };
        let pools: Vec<_> = engine.inner.pools.read().values().cloned().collect();
        drop(engine);
        let mut now: HashMap<(u64, u64, u32), Seen> = HashMap::new();
        for p in pools.iter().filter(|p| !p.is_closed()) {
            let pool_health = summary(p).health;
            let key = (p.pool.guid, 0, u32::MAX);
            now.insert(
                key,
                Seen {
                    state: pool_health,
                    counters: [0; 3],
                },
            );
            for g in p.pool.groups() {
                now.insert(
                    (p.pool.guid, 0, g.index),
                    Seen {
                        state: g.state().as_str().to_string(),
                        counters: [0; 3],
                    },
                );
                for c in g.children() {
                    let (state, counters) = match &c.device {
                        Some(d) => (
                            d.state().as_str().to_string(),
                            [
                                d.errors.read.load(Ordering::Relaxed),
                                d.errors.write.load(Ordering::Relaxed),
                                d.errors.checksum.load(Ordering::Relaxed),
                            ],
                        ),
                        None => ("UNAVAIL".to_string(), [0; 3]),
                    };
                    now.insert((p.pool.guid, c.guid, g.index), Seen { state, counters });
                }
            }
            for (key, cur) in now.iter().filter(|(k, _)| k.0 == p.pool.guid) {
                // Counters start at zero when a pool is imported: errors
                // counted before the first look are events too.
                let before = seen.get(key);
                let before_counters = before.map_or([0; 3], |b| b.counters);
                let (_, dev_guid, group) = *key;
                let mut fields: Vec<(&str, String)> = Vec::new();
                if dev_guid != 0 {
                    if let Some(d) = p.pool.device_by_guid(dev_guid) {
                        fields.push(("vdev_path", d.path().display().to_string()));
                    }
                    fields.push(("vdev_guid", dev_guid.to_string()));
                } else if group != u32::MAX {
                    fields.push(("vdev_group", group.to_string()));
                }
                for (i, class) in [(0, class::IO), (1, class::IO), (2, class::CHECKSUM)] {
                    if cur.counters[i] > before_counters[i] {
                        let mut f = fields.clone();
                        f.push(("errors", (cur.counters[i] - before_counters[i]).to_string()));
                        if class == class::IO {
                            f.push(("zio_type", if i == 0 { "read" } else { "write" }.into()));
                        }
                        events::post_event(&p.pool, class, &f);
                    }
                }
                if let Some(before) = before.filter(|b| b.state != cur.state) {
                    let mut f = fields.clone();
                    f.push(("vdev_state", cur.state.clone()));
                    f.push(("vdev_laststate", before.state.clone()));
                    events::post_event(&p.pool, class::STATECHANGE, &f);
                }
            }
        }
        seen = now;
    }
}

pub(crate) fn info(
    p: &ImportedPool,
    datasets: &BTreeMap<String, DatasetRecord>,
    rec: &DatasetRecord,
) -> DatasetInfo {
    let referenced = rec.physical_used + rec.inherited;
    let logical_referenced = rec.logical_used + rec.inherited_logical;
    let space = if rec.is_snapshot() {
        let used = p.destroy_estimate(datasets, &[rec.id]).unwrap_or_else(|e| {
            tracing::warn!(snapshot = %rec.name, error = %e, "cannot compute snapshot space");
            0
        });
        Space {
            used,
            logical_used: logical_referenced,
            referenced,
            logical_referenced,
            available: 0,
            snapshots: 0,
            written: rec.written,
            compressratio: props::ratio(logical_referenced, referenced),
            usedby: Default::default(),
        }
    } else {
        // A dataset's USED: its live blocks, what its snapshots hold, its
        // unused refreservation and its children's (crate::space).
        let usedby = crate::space::figures(datasets, &HashMap::new())
            .remove(&rec.name)
            .unwrap_or_default();
        let prefix = format!("{}/", rec.name);
        let (mut logical, mut live) = (rec.logical_used, rec.physical_used);
        for d in datasets
            .values()
            .filter(|d| !d.is_snapshot() && d.name.starts_with(&prefix))
        {
            logical += d.logical_used;
            live += d.physical_used;
        }
        Space {
            used: usedby.used(),
            usedby,
            logical_used: logical,
            referenced,
            logical_referenced,
            available: p.available_of(datasets, &rec.name),
            snapshots: rec.snapshot_used,
            written: rec.written,
            compressratio: props::ratio(logical, live),
        }
    };
    let lineage = lineage(datasets, rec);
    let mut properties = props::properties(rec, &lineage, space);
    properties.extend(crate::crypt::properties(p, datasets, rec));
    if !rec.is_snapshot() {
        let own = rec.physical_used + rec.snapshot_used;
        let more = [
            ("usedbydataset", rec.physical_used),
            ("usedbychildren", space.used.saturating_sub(own)),
            ("usedbyrefreservation", 0),
        ];
        for (name, n) in more {
            if !properties.iter().any(|p| p.name == name) {
                properties.push(Property {
                    name: name.into(),
                    value: props::format_size(n),
                    parsable: n.to_string(),
                    source: "-".into(),
                });
            }
        }
    }
    let stat = |name: &str, value: String| Property {
        name: name.into(),
        parsable: value.clone(),
        value,
        source: "-".into(),
    };
    let by_id = |id: u64| {
        datasets
            .values()
            .find(|d| d.id == id)
            .map(|d| d.name.clone())
    };
    if let Some(origin) = &rec.origin {
        properties.push(stat(
            "origin",
            by_id(origin.snapshot).unwrap_or_else(|| "-".into()),
        ));
    }
    if rec.is_snapshot() {
        let clones: Vec<String> = datasets
            .values()
            .filter(|d| d.origin.as_ref().is_some_and(|o| o.snapshot == rec.id))
            .map(|d| d.name.clone())
            .collect();
        properties.push(stat("clones", clones.join(",")));
        properties.push(stat("userrefs", rec.holds.len().to_string()));
    }
    if let Some(token) = rec.receive.as_ref().and_then(|r| r.token()) {
        properties.push(stat("receive_resume_token", token));
    }
    properties.extend(lineage.user_properties());
    DatasetInfo {
        name: rec.name.clone(),
        kind: rec.kind,
        properties,
    }
}

/// The group index, guid and (if present) device named by `spec`: its path,
/// its file name, or its guid (missing devices only by guid).
fn find_device(p: &ImportedPool, spec: &str) -> Result<(u32, u64, Option<Arc<Vdev>>)> {
    let as_guid = spec.parse::<u64>().ok();
    let as_path = Path::new(spec);
    let canonical = std::fs::canonicalize(as_path).ok();
    let known = history::vdev_paths(p).unwrap_or_default();
    let mut found = Vec::new();
    for group in p.pool.groups() {
        for c in group.children() {
            // A missing device also answers to the path it had (`was /path`).
            let was = c
                .device
                .is_none()
                .then(|| known.get(&c.guid))
                .flatten()
                .is_some_and(|w| {
                    w == as_path
                        || (!spec.contains('/') && w.file_name().is_some_and(|f| f == spec))
                });
            let matches = as_guid == Some(c.guid)
                || was
                || spec == format!("(missing device {})", c.guid)
                || c.device.as_ref().is_some_and(|d| {
                    let path = d.path();
                    Some(path) == canonical.as_deref()
                        || path == as_path
                        || (!spec.contains('/') && path.file_name().is_some_and(|f| f == spec))
                });
            if matches {
                found.push((group.index, c.guid, c.device.clone()));
            }
        }
    }
    match found.len() {
        0 => Err(Error::NotFound(format!(
            "device '{spec}' in pool '{}' (give its path, file name or guid)",
            p.pool.name
        ))),
        1 => Ok(found.remove(0)),
        _ => Err(Error::InvalidArgument(format!(
            "'{spec}' names several devices of pool '{}': give the full path or the guid",
            p.pool.name
        ))),
    }
}

/// Devices a group must keep readable so that no block is lost.
fn min_live(group: &pool::Group) -> usize {
    let n = group.width();
    n - group.kind.redundancy(n)
}

/// The pool layer's kind of a group asked for by the API.
fn layout_of(kind: GroupKind) -> LayoutKind {
    match kind {
        GroupKind::Disk => LayoutKind::Disk,
        GroupKind::Mirror => LayoutKind::Mirror,
        GroupKind::Raidz1 => LayoutKind::Raidz { parity: 1 },
        GroupKind::Raidz2 => LayoutKind::Raidz { parity: 2 },
        GroupKind::Raidz3 => LayoutKind::Raidz { parity: 3 },
        GroupKind::Log => LayoutKind::Disk,
        GroupKind::LogMirror => LayoutKind::Mirror,
    }
}

/// Status of one group: its devices with their counters and states.
fn group_status(
    g: &pool::Group,
    name: String,
    kind: GroupKind,
    known: &std::collections::HashMap<u64, PathBuf>,
) -> GroupStatus {
    let children = g.children();
    GroupStatus {
        name,
        kind,
        state: g.state().as_str().to_string(),
        devices: children
            .iter()
            .map(|c| match &c.device {
                Some(d) => DeviceStatus {
                    path: d.path().to_path_buf(),
                    guid: c.guid,
                    state: d.state().as_str().to_string(),
                    read_errors: d.errors.read.load(Ordering::Relaxed),
                    write_errors: d.errors.write.load(Ordering::Relaxed),
                    checksum_errors: d.errors.checksum.load(Ordering::Relaxed),
                    resilvering: c.resilvering && d.state() != pool::DeviceState::Offline,
                    was: None,
                    reason: d.reason(),
                },
                None => DeviceStatus {
                    path: PathBuf::from(format!("(missing device {})", c.guid)),
                    guid: c.guid,
                    state: "UNAVAIL".into(),
                    read_errors: 0,
                    write_errors: 0,
                    checksum_errors: 0,
                    resilvering: c.resilvering,
                    was: known.get(&c.guid).cloned(),
                    reason: Some("cannot open".into()),
                },
            })
            .collect(),
    }
}

/// A log group's name as `pool status` shows it: the device of a single
/// log device, else `mirror-N` with N after the data groups (as zpool
/// numbers top-level vdevs).
fn log_group_name(p: &ImportedPool, g: &pool::Group) -> String {
    let n = p.pool.groups().len() + g.index as usize;
    match g.kind {
        LayoutKind::Disk => g
            .children()
            .first()
            .and_then(|c| c.device.as_ref())
            .map(|d| d.path().display().to_string())
            .unwrap_or_else(|| format!("log-{n}")),
        kind => format!("{}-{n}", kind.name()),
    }
}

/// The API's name for a group kind of the pool layer.
fn kind_of(kind: LayoutKind) -> GroupKind {
    match kind {
        LayoutKind::Disk => GroupKind::Disk,
        LayoutKind::Mirror => GroupKind::Mirror,
        LayoutKind::Raidz { parity: 1 } => GroupKind::Raidz1,
        LayoutKind::Raidz { parity: 2 } => GroupKind::Raidz2,
        LayoutKind::Raidz { .. } => GroupKind::Raidz3,
    }
}

/// Pool-level verbs of `zpool` beyond create/import/export: history,
/// attach/detach/remove, labelclear, upgrade.
impl Engine {
    /// Records a command that changed `pool` (`pool history`).
    pub fn log_history(&self, pool: &str, caller: &Caller) -> Result<()> {
        let p = self.pool(pool)?;
        history::log_command(&p, caller)
    }

    /// `pool history`: every record kept, oldest first.
    pub fn pool_history(&self, pool: &str) -> Result<Vec<HistoryRecord>> {
        history::read(&*self.pool(pool)?)
    }

    /// `pool attach POOL DEV NEW`: NEW mirrors DEV (a single disk becomes
    /// a mirror, a mirror gets one more copy) and is resilvered.
    pub fn attach_device(
        &self,
        pool: &str,
        device: &str,
        new: &Path,
        force: bool,
    ) -> Result<PoolStatus> {
        let p = self.pool(pool)?;
        let (_, guid, dev) = find_device(&p, device)?;
        if dev.is_none() {
            return Err(Error::InvalidArgument(format!(
                "device {device} is missing: attach to a device that is present, or `pool replace` it"
            )));
        }
        check_new_device_path(&p, new)?;
        let vdev = Vdev::open(new).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        self.check_reusable(&vdev, force)?;
        scrub::preempt(&p)?;
        let rec = {
            let _meta = p.meta_lock.lock();
            let new_guid = p.pool.attach_device(guid, vdev).map_err(|e| {
                Error::InvalidArgument(format!("cannot attach to {device}: {}", layout_msg(e)))
            })?;
            let rec = scrub::resilver_record(&p, new_guid, new_guid);
            scrub::store_new_locked(&p, &rec)?;
            rec
        };
        history::store_vdev_paths(&p)?;
        history::log_internal(&p, &format!("vdev attach {} to {guid}", new.display()));
        events::post_event(
            &p.pool,
            class::VDEV_ATTACH,
            &[
                ("vdev_path", new.display().to_string()),
                ("vdev_guid", rec.target_guid.to_string()),
            ],
        );
        scrub::start_resilver(&p, rec)?;
        self.write_cache()?;
        tracing::info!(pool, device, new = %new.display(), "device attached; resilvering");
        self.pool_status(pool)
    }

    /// `pool detach POOL DEV`: DEV leaves its mirror.
    pub fn detach_device(&self, pool: &str, device: &str) -> Result<PoolStatus> {
        let p = self.pool(pool)?;
        let (_, guid, dev) = find_device(&p, device)?;
        if p.pool.is_resilvering(guid) && scrub::is_running(&p) {
            return Err(Error::Busy(format!(
                "{device} is being resilvered: wait for it (`cistern pool wait -t resilver {pool}`) before detaching"
            )));
        }
        scrub::preempt(&p)?;
        {
            let _meta = p.meta_lock.lock();
            p.pool.detach_device(guid).map_err(|e| {
                Error::InvalidArgument(format!("cannot detach {device}: {}", layout_msg(e)))
            })?;
            p.store_offline_locked(guid, false)?;
        }
        history::store_vdev_paths(&p)?;
        let path = dev
            .map(|d| d.path().display().to_string())
            .unwrap_or_default();
        history::log_internal(&p, &format!("vdev detach {guid} {path}"));
        events::post_event(
            &p.pool,
            class::VDEV_REMOVE,
            &[("vdev_path", path), ("vdev_guid", guid.to_string())],
        );
        // A scan stopped for the change carries on.
        self.resume_scan(&p);
        self.write_cache()?;
        tracing::info!(pool, device, "device detached");
        self.pool_status(pool)
    }

    /// `pool remove POOL DEV|GROUP`: removes a whole top-level group,
    /// where the layout allows (today: the last group, holding no data).
    pub fn remove_device(&self, pool: &str, target: &str) -> Result<PoolStatus> {
        if let Some(status) = self.remove_cache_device(pool, target)? {
            return Ok(status);
        }
        let _admin = self.inner.admin.lock();
        let p = self.pool(pool)?;
        let log = p.pool.logs().into_iter().find(|g| {
            log_group_name(&p, g) == target
                || g.children().iter().any(|c| {
                    c.guid.to_string() == target
                        || format!("{:#x}", c.guid) == target
                        || c.device.as_ref().is_some_and(|d| {
                            d.path() == Path::new(target)
                                || d.path().file_name().is_some_and(|n| n == target)
                        })
                })
        });
        if let Some(g) = log {
            return self.remove_log(&p, &g, target);
        }
        let groups = p.pool.groups();
        let index = match groups.iter().find(|g| {
            format!("{}-{}", g.kind.name(), g.index) == target
                || (g.kind == LayoutKind::Disk && format!("disk-{}", g.index) == target)
        }) {
            Some(g) => g.index,
            None => {
                let (g, _, _) = find_device(&p, target)?;
                let group = p.pool.group(g).map_err(|e| Error::Io(e.to_string()))?;
                if group.kind != LayoutKind::Disk {
                    let name = format!("{}-{}", group.kind.name(), group.index);
                    return Err(Error::InvalidArgument(match group.kind {
                        LayoutKind::Mirror => format!(
                            "{target} is part of {name}: take it out of the mirror with `cistern pool detach {pool} {target}`, or remove the whole group with `cistern pool remove {pool} {name}`"
                        ),
                        _ => format!(
                            "{target} is part of {name}: a raidz device cannot be removed (replace it with `cistern pool replace`)"
                        ),
                    }));
                }
                g
            }
        };
        scrub::preempt(&p)?;
        let removed = {
            let _meta = p.meta_lock.lock();
            p.pool.remove_last_group(index).map_err(|e| {
                Error::InvalidArgument(format!("cannot remove {target}: {}", layout_msg(e)))
            })
        };
        self.resume_scan(&p);
        let removed = removed?;
        history::store_vdev_paths(&p)?;
        let paths: Vec<String> = removed.iter().map(|d| d.display().to_string()).collect();
        history::log_internal(
            &p,
            &format!("vdev remove group {index} {}", paths.join(" ")),
        );
        events::post_event(
            &p.pool,
            class::VDEV_REMOVE,
            &[
                ("vdev_group", index.to_string()),
                ("vdev_path", paths.join(",")),
            ],
        );
        self.write_cache()?;
        tracing::info!(pool, target, "group removed");
        self.pool_status(pool)
    }

    /// `pool labelclear [-f] DEV`: wipes a device's pool label. Refused for
    /// a device of a pool imported here, and without `force` for one whose
    /// pool was not exported (it may be in use elsewhere).
    pub fn labelclear(&self, device: &Path, force: bool) -> Result<()> {
        let dev = Vdev::open(device).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let label = match dev.read_label() {
            Ok(l) => l,
            Err(e) => {
                return Err(Error::InvalidArgument(format!(
                    "{}: no pool label to clear ({e})",
                    device.display()
                )))
            }
        };
        if let Some(p) = self
            .inner
            .pools
            .read()
            .values()
            .find(|p| p.pool.guid == label.pool_guid)
        {
            return Err(Error::Busy(format!(
                "{} is part of pool '{}', imported here: destroy the pool, or detach/remove the device first",
                device.display(),
                p.pool.name
            )));
        }
        if !label.exported && !force {
            return Err(Error::Busy(format!(
                "{} is part of pool '{}', which was not exported (it may be in use on another host); use -f to clear it anyway",
                device.display(),
                label.pool_name
            )));
        }
        dev.clear_label().map_err(|e| Error::Io(e.to_string()))?;
        tracing::info!(device = %device.display(), pool = %label.pool_name, "label cleared");
        Ok(())
    }

    /// `pool upgrade`: the pool's format versions against this build's;
    /// with `apply`, runs the upgrades there are (none yet: every format
    /// this build reads, it also writes in place). This is where a future
    /// format change adds its conversion step.
    pub fn upgrade_pool(&self, pool: &str, apply: bool) -> Result<PoolVersions> {
        let mut upgraded: Vec<String> = Vec::new();
        let awaiting = {
            let list = self.inner.awaiting_upgrade.lock();
            list.iter().find(|c| c.name == pool).cloned()
        };
        if let (Some(cached), true) = (awaiting, apply) {
            let _admin = self.inner.admin.lock();
            let p = self.import_devices(
                &cached.devices,
                Some(cached.guid),
                false,
                Some(&mut upgraded),
                false,
            )?;
            self.inner
                .awaiting_upgrade
                .lock()
                .retain(|c| c.guid != cached.guid);
            self.inner
                .pools
                .write()
                .insert(p.pool.name.clone(), p.clone());
            self.write_cache()?;
            history::log_internal(&p, "upgrade");
            tracing::info!(pool, "pool upgraded and imported");
        }
        let p = self.pool(pool)?;
        let meta_format = {
            let tx = p.db().begin_read().map_err(crate::txg::meta_err)?;
            let r = tx
                .open_table(meta::schema::POOL_RECORDS)
                .map_err(crate::txg::meta_err)?;
            r.get(meta::schema::RECORD_FORMAT)
                .map_err(crate::txg::meta_err)?
                .map_or(0, |v| v.value())
        };
        let label_version = p
            .pool
            .devices()
            .iter()
            .filter_map(|d| d.read_label().ok())
            .map(|l| l.version)
            .max()
            .unwrap_or(0);
        Ok(PoolVersions {
            pool: pool.to_string(),
            meta_format,
            // Formats 4 and 5 are 3 with encryption (sealed names) in use: current, not an upgrade.
            meta_format_supported: meta::META_FORMAT_VERSION
                .max(meta_format.min(meta::META_FORMAT_SEALED_NAMES)),
            label_version,
            label_version_supported: vdev::LABEL_VERSION,
            upgraded,
        })
    }
}

/// Adds a log group (SLOG) to an imported pool and moves the intent log
/// onto it: the labels name it first, then a txg commits a checkpoint that
/// points replay at it (decision 0030).
fn add_log(p: &Arc<ImportedPool>, kind: LayoutKind, devs: Vec<Vdev>) -> Result<()> {
    let tag = p
        .pool
        .add_log(kind, devs)
        .map_err(|e| Error::InvalidArgument(e.to_string()))?;
    let region = p
        .pool
        .slog_region(tag)
        .ok_or_else(|| Error::Io("log group added but not found".into()))?;
    p.move_log(region)?;
    tracing::info!(pool = %p.pool.name, tag, "intent log now on the log device");
    Ok(())
}

impl Engine {
    /// `pool remove POOL LOGDEV`: moves the intent log back to the main
    /// devices (a committed txg whose checkpoint names them, so every record
    /// on the log device is in the pool or no longer needed), then takes the
    /// log group out of the labels.
    fn remove_log(
        &self,
        p: &Arc<ImportedPool>,
        g: &pool::Group,
        target: &str,
    ) -> Result<PoolStatus> {
        let tag = Pool::log_tag(g);
        if p.log.region_tag() == tag {
            p.move_log(p.pool.log_region())?;
        }
        let removed = p
            .pool
            .remove_log(tag)
            .map_err(|e| Error::InvalidArgument(format!("cannot remove {target}: {e}")))?;
        history::store_vdev_paths(p)?;
        let paths: Vec<String> = removed.iter().map(|d| d.display().to_string()).collect();
        history::log_internal(p, &format!("vdev remove log {}", paths.join(" ")));
        events::post_event(
            &p.pool,
            class::VDEV_REMOVE,
            &[("vdev_path", paths.join(","))],
        );
        self.write_cache()?;
        tracing::info!(pool = %p.pool.name, target, "log device removed");
        self.pool_status(&p.pool.name)
    }
}

fn device_iostat(name: String, d: Option<&Vdev>) -> DeviceIostat {
    let Some(d) = d else {
        return DeviceIostat {
            name,
            read_hist: vec![0; pool::LATENCY_BUCKETS],
            write_hist: vec![0; pool::LATENCY_BUCKETS],
            ..Default::default()
        };
    };
    let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    DeviceIostat {
        name,
        read_ops: l(&d.io.read_ops),
        write_ops: l(&d.io.write_ops),
        read_bytes: l(&d.io.read_bytes),
        write_bytes: l(&d.io.write_bytes),
        read_wait_ns: l(&d.io.read_nanos),
        write_wait_ns: l(&d.io.write_nanos),
        read_hist: d.io.read_hist.iter().map(l).collect(),
        write_hist: d.io.write_hist.iter().map(l).collect(),
    }
}

fn group_iostat(name: String, g: &pool::Group) -> GroupIostat {
    GroupIostat {
        name,
        devices: g
            .children()
            .iter()
            .map(|c| match &c.device {
                Some(d) => device_iostat(d.path().display().to_string(), Some(d)),
                None => device_iostat(format!("(missing device {})", c.guid), None),
            })
            .collect(),
    }
}

impl Engine {
    /// `GET /v1/pools/{pool}/iostat`: cumulative per-device counters.
    pub fn pool_iostat(&self, pool: &str) -> Result<PoolIostat> {
        let p = self.pool(pool)?;
        let groups = p
            .pool
            .groups()
            .iter()
            .map(|g| {
                let name = match g.kind {
                    LayoutKind::Disk => g
                        .children()
                        .first()
                        .and_then(|c| c.device.as_ref())
                        .map(|d| d.path().display().to_string())
                        .unwrap_or_else(|| format!("disk-{}", g.index)),
                    kind => format!("{}-{}", kind.name(), g.index),
                };
                group_iostat(name, g)
            })
            .collect();
        let logs = p
            .pool
            .logs()
            .iter()
            .map(|g| group_iostat(log_group_name(&p, g), g))
            .collect();
        let log = p.log.stats();
        let allocated = p.pool.allocated();
        Ok(PoolIostat {
            pool: pool.to_string(),
            timestamp_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            uptime_ms: p.imported_at.elapsed().as_millis() as u64,
            allocated,
            free: p.pool.size().saturating_sub(allocated),
            groups,
            logs,
            log_syncs: log.syncs.load(Ordering::Relaxed),
            log_records: log.records.load(Ordering::Relaxed),
            log_commits: log.commits.load(Ordering::Relaxed),
            log_flushes: log.flushes.load(Ordering::Relaxed),
            log_overlapped: log.overlapped.load(Ordering::Relaxed),
            log_deferred: log.deferred.load(Ordering::Relaxed),
            log_ring: log.ring.load(Ordering::Relaxed),
            log_thread: log.thread.load(Ordering::Relaxed),
            log_wait_ns: log.wait.nanos.load(Ordering::Relaxed),
            log_wait_hist: log
                .wait
                .hist
                .iter()
                .map(|h| h.load(Ordering::Relaxed))
                .collect(),
        })
    }
}

//! The engine: every imported pool, the cache file that brings them back at
//! start (like zpool.cache), and the administrative operations.

use crate::props::{self, DatasetRecord, Space};
use crate::scrub;
use crate::txg::{lineage, ImportedPool};
use crate::*;
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
    /// The engine itself, for work that finishes in the background (a
    /// resilver rewrites the cache file when it is done).
    pub(crate) me: std::sync::OnceLock<std::sync::Weak<Engine>>,
}

fn io(context: &str, e: impl std::fmt::Display) -> Error {
    Error::Io(format!("{context}: {e}"))
}

/// Pool and dataset name components: a letter first, then letters, digits, `_-.:`.
pub(crate) fn check_component(kind: &str, s: &str) -> Result<()> {
    let ok = s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && s.len() <= 200
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c));
    if !ok {
        return Err(Error::InvalidArgument(format!(
            "invalid {kind} name '{s}': must start with a letter and contain only letters, digits, '_', '-', '.', ':'"
        )));
    }
    if kind == "pool"
        && [
            "mirror", "raidz", "raidz1", "raidz2", "raidz3", "spare", "log", "cache",
        ]
        .contains(&s)
    {
        return Err(Error::InvalidArgument(format!(
            "'{s}' is a reserved word, not a pool name"
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

/// `pool[/a/b][@snap]` -> (pool, rest of the dataset path). Snapshot names
/// follow the component rules too.
pub(crate) fn split_dataset(name: &str) -> Result<(&str, Option<&str>)> {
    let dataset = match name.split_once('@') {
        Some((ds, snap)) => {
            check_component("snapshot", snap)?;
            ds
        }
        None => name,
    };
    match dataset.split_once('/') {
        None => {
            check_component("pool", dataset)?;
            Ok((dataset, None))
        }
        Some((pool, rest)) => {
            check_component("pool", pool)?;
            for part in rest.split('/') {
                check_component("dataset", part)?;
            }
            Ok((pool, Some(rest)))
        }
    }
}

impl Engine {
    pub fn open(state_dir: &Path, config: EngineConfig) -> Result<Arc<Engine>> {
        std::fs::create_dir_all(state_dir).map_err(|e| io(&state_dir.display().to_string(), e))?;
        let engine = Engine {
            inner: EngineInner {
                state_dir: state_dir.to_path_buf(),
                config,
                pools: RwLock::new(BTreeMap::new()),
                admin: Mutex::new(()),
                me: std::sync::OnceLock::new(),
            },
        };
        let cache = engine.read_cache()?;
        for cached in cache.pools {
            match engine.import_devices(&cached.devices, Some(cached.guid)) {
                Ok(p) => {
                    tracing::info!(pool = %p.pool.name, "imported from cache file");
                    engine.inner.pools.write().insert(p.pool.name.clone(), p);
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
        }
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
        let cache = CacheFile {
            version: CACHE_VERSION,
            pools: pools
                .values()
                .map(|p| CachedPool {
                    name: p.pool.name.clone(),
                    guid: p.pool.guid,
                    devices: p.pool.device_paths(),
                })
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
        check_component("pool", &spec.name)?;
        let _admin = self.inner.admin.lock();
        if self.inner.pools.read().contains_key(&spec.name) {
            return Err(Error::AlreadyExists(format!("pool '{}'", spec.name)));
        }
        if spec.groups.is_empty() || spec.groups.iter().any(|g| g.devices.is_empty()) {
            return Err(Error::InvalidArgument(
                "a pool needs at least one device in every group".into(),
            ));
        }
        let groups = self.open_new_devices(&spec.groups, spec.create_size, spec.force)?;
        let pool = Arc::new(
            Pool::create(&spec.name, groups).map_err(|e| Error::InvalidArgument(e.to_string()))?,
        );
        let imported = ImportedPool::create(pool, self.inner.config.clone())?;
        self.inner.pools.write().insert(spec.name.clone(), imported);
        self.write_cache()?;
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
        let groups = self.open_new_devices(&spec.groups, spec.create_size, spec.force)?;
        for (kind, devs) in groups {
            p.pool
                .add_group(kind, devs)
                .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        }
        self.write_cache()?;
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
                if !path.is_absolute() {
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
    /// `force`, and never while that pool is imported here.
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
        if in_use || !force {
            return Err(Error::Busy(format!(
                "device {} is part of pool '{}'{}",
                dev.path().display(),
                label.pool_name,
                match (in_use, label.exported) {
                    (true, _) => " (imported here)",
                    (false, true) => " (exported; use -f to reuse the device)",
                    (false, false) => " (use -f to reuse the device)",
                }
            )));
        }
        Ok(())
    }

    /// Opens the devices, checks they form one pool, assembles and imports it.
    fn import_devices(&self, paths: &[PathBuf], guid: Option<u64>) -> Result<Arc<ImportedPool>> {
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
        if devs.is_empty() {
            return Err(Error::NotFound("no device of the pool is available".into()));
        }
        let pool = Arc::new(Pool::open(devs).map_err(|e| Error::Io(e.to_string()))?);
        if self.inner.pools.read().contains_key(&pool.name) {
            return Err(Error::AlreadyExists(format!(
                "a pool named '{}' is already imported",
                pool.name
            )));
        }
        ImportedPool::open(pool, self.inner.config.clone())
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
        let p = self.pool(pool)?;
        let groups = p
            .pool
            .groups()
            .iter()
            .map(|g| {
                let i = g.index;
                let children = g.children();
                GroupStatus {
                    name: match g.kind {
                        LayoutKind::Disk => children
                            .first()
                            .and_then(|c| c.device.as_ref())
                            .map(|d| d.path().display().to_string())
                            .unwrap_or_else(|| format!("disk-{i}")),
                        kind => format!("{}-{i}", kind.name()),
                    },
                    kind: kind_of(g.kind),
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
                                resilvering: c.resilvering
                                    && d.state() != pool::DeviceState::Offline,
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
                                reason: Some("cannot open".into()),
                            },
                        })
                        .collect(),
                }
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
            errors,
            scan,
            data_errors,
            status: text.as_ref().map(|t| t.0.clone()),
            action: text.map(|t| t.1),
            suspended: p.health.suspension().map(|s| s.cause),
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
        if !new.is_absolute() {
            return Err(Error::InvalidArgument(format!(
                "device path {} is not absolute",
                new.display()
            )));
        }
        if old_dev.as_ref().is_some_and(|d| d.path() == new) {
            return Err(Error::InvalidArgument(format!(
                "{} is already {old}: give a different device",
                new.display()
            )));
        }
        if p.pool.devices().iter().any(|d| d.path() == new) {
            return Err(Error::Busy(format!(
                "{} is already part of pool '{pool}'",
                new.display()
            )));
        }
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
        scrub::start_resilver(&p, rec)?;
        self.write_cache()?;
        tracing::info!(pool, old, new = %new.display(), "replacing device; resilvering");
        self.pool_status(pool)
    }

    pub fn destroy_pool(&self, pool: &str) -> Result<()> {
        let _admin = self.inner.admin.lock();
        let p = self.pool(pool)?;
        scrub::stop(&p);
        self.inner.pools.write().remove(pool);
        let _ = p.close();
        p.pool.wipe_labels().map_err(|e| Error::Io(e.to_string()))?;
        self.write_cache()?;
        tracing::info!(pool, "pool destroyed");
        Ok(())
    }

    pub fn export_pool(&self, pool: &str) -> Result<()> {
        let _admin = self.inner.admin.lock();
        let p = self.pool(pool)?;
        scrub::stop(&p);
        p.close()?;
        p.pool
            .set_exported(true)
            .map_err(|e| Error::Io(e.to_string()))?;
        self.inner.pools.write().remove(pool);
        self.write_cache()?;
        tracing::info!(pool, "pool exported");
        Ok(())
    }

    /// Labels of every file or block device directly inside `dirs`, grouped by pool.
    fn scan(&self, dirs: &[PathBuf]) -> Result<Vec<(pool::Label, Vec<PathBuf>)>> {
        let mut found: HashMap<u64, (pool::Label, Vec<PathBuf>)> = HashMap::new();
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
                    found
                        .entry(label.pool_guid)
                        .or_insert_with(|| (label.clone(), Vec::new()))
                        .1
                        .push(path);
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
            .filter(|(l, _)| !imported.contains(&l.pool_guid))
            .collect())
    }

    pub fn importable_pools(&self, dirs: &[PathBuf]) -> Result<Vec<ImportablePool>> {
        let mut out: Vec<ImportablePool> = self
            .scan(dirs)?
            .into_iter()
            .map(|(label, devices)| {
                let expected: usize = label.groups.iter().map(|g| g.devices.len()).sum();
                ImportablePool {
                    name: label.pool_name,
                    guid: label.pool_guid,
                    complete: devices.len() >= expected,
                    devices,
                }
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    pub fn import_pool(&self, pool: &str, dirs: &[PathBuf]) -> Result<PoolStatus> {
        let _admin = self.inner.admin.lock();
        let candidates: Vec<_> = self
            .scan(dirs)?
            .into_iter()
            .filter(|(l, _)| l.pool_name == pool || l.pool_guid.to_string() == pool)
            .collect();
        let (label, devices) = match candidates.len() {
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
        let p = self.import_devices(&devices, Some(label.pool_guid))?;
        p.pool
            .set_exported(false)
            .map_err(|e| Error::Io(e.to_string()))?;
        let name = p.pool.name.clone();
        self.inner.pools.write().insert(name.clone(), p.clone());
        self.write_cache()?;
        tracing::info!(pool = %name, "pool imported");
        self.resume_scan(&p);
        self.pool_status(&name)
    }

    pub fn create_volume(
        &self,
        name: &str,
        volsize: u64,
        props_in: &[(String, String)],
    ) -> Result<DatasetInfo> {
        let (pool_name, Some(_)) = split_dataset(name)? else {
            return Err(Error::InvalidArgument(format!(
                "'{name}': a volume is named POOL/VOLUME"
            )));
        };
        let p = self.pool(pool_name)?;
        check_new_dataset(&p.datasets.read(), name)?;
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
                    local.insert(k.clone(), props::normalize(k, v)?);
                }
            }
        }
        if volsize == 0 || volsize % volblocksize as u64 != 0 {
            return Err(Error::InvalidArgument(format!(
                "volsize {volsize} must be a positive multiple of volblocksize {volblocksize}"
            )));
        }
        let id = p.next_dataset_id()?;
        let rec = DatasetRecord {
            id,
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
        p.store_dataset(&rec)?;
        tracing::info!(dataset = name, volsize, volblocksize, "volume created");
        self.dataset(name)
    }

    pub fn list_datasets(&self, root: Option<&str>) -> Result<Vec<DatasetInfo>> {
        let pools: Vec<Arc<ImportedPool>> = match root {
            Some(r) => vec![self.pool(split_dataset(r)?.0)?],
            None => self.inner.pools.read().values().cloned().collect(),
        };
        let mut out = Vec::new();
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
                    out.push(info(&p, &datasets, rec));
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    pub fn dataset(&self, name: &str) -> Result<DatasetInfo> {
        let (pool, _) = split_dataset(name)?;
        let p = self.pool(pool)?;
        let datasets = p.datasets.read();
        let rec = datasets
            .get(name)
            .ok_or_else(|| Error::NotFound(format!("dataset '{name}'")))?;
        Ok(info(&p, &datasets, rec))
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
                rec.volsize = n;
            }
            "volblocksize" => {
                return Err(Error::InvalidArgument(
                    "volblocksize can only be set when the volume is created".into(),
                ))
            }
            p if props::SETTABLE.contains(&p) => {
                rec.local
                    .insert(prop.to_string(), props::normalize(prop, value)?);
            }
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "property '{prop}' is read-only or unknown"
                )))
            }
        }
        p.store_dataset(&rec)?;
        tracing::info!(dataset = name, prop, value, "property set");
        Ok(())
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
        Ok(Arc::new(Volume::new(p, id, name.to_string())))
    }

    pub fn volume_names(&self) -> Vec<String> {
        let mut out = Vec::new();
        for p in self.inner.pools.read().values() {
            out.extend(
                p.datasets
                    .read()
                    .values()
                    .filter(|d| d.volblocksize != 0)
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

    pub fn shutdown(&self) -> Result<()> {
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
    }
}

pub(crate) fn info(
    p: &ImportedPool,
    datasets: &BTreeMap<String, DatasetRecord>,
    rec: &DatasetRecord,
) -> DatasetInfo {
    let reserve = p.pool.size() / 32;
    let available = p.pool.allocator().free_bytes().saturating_sub(reserve);
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
        }
    } else {
        // A dataset's USED: its live blocks, what its snapshots hold, and its children's.
        let prefix = format!("{}/", rec.name);
        let (mut used, mut logical, mut live) = (
            rec.physical_used + rec.snapshot_used,
            rec.logical_used,
            rec.physical_used,
        );
        for d in datasets
            .values()
            .filter(|d| !d.is_snapshot() && d.name.starts_with(&prefix))
        {
            used += d.physical_used + d.snapshot_used;
            logical += d.logical_used;
            live += d.physical_used;
        }
        Space {
            used,
            logical_used: logical,
            referenced,
            logical_referenced,
            available,
            snapshots: rec.snapshot_used,
            written: rec.written,
            compressratio: props::ratio(logical, live),
        }
    };
    let mut properties = props::properties(rec, &lineage(datasets, rec), space);
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
    let mut found = Vec::new();
    for group in p.pool.groups() {
        for c in group.children() {
            let matches = as_guid == Some(c.guid)
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

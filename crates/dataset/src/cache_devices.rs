//! Cache devices (L2ARC) of a pool: `cistern pool add POOL cache DEV`,
//! `cistern pool remove POOL DEV`, opened at import (decision 0029). They
//! are recorded in the metadata table `cache_devices` (guid -> path), not in
//! vdev labels; an absent or refused device is reported UNAVAIL and never
//! stops an import.

use crate::l2arc::{L2Device, L2Stats};
use crate::txg::{meta_err, ImportedPool};
use crate::{Engine, Error, PoolStatus, Result};
use meta::schema::CACHE_DEVICES;
use std::path::PathBuf;
use std::sync::Arc;

/// Cache devices recorded in the pool's metadata: (guid, path).
fn recorded(p: &ImportedPool) -> Result<Vec<(u64, PathBuf)>> {
    use meta::redb::{ReadableDatabase, ReadableTable};
    let tx = p.db().begin_read().map_err(meta_err)?;
    let t = match tx.open_table(CACHE_DEVICES) {
        Ok(t) => t,
        Err(meta::redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(meta_err(e)),
    };
    let mut out = Vec::new();
    for row in t.iter().map_err(meta_err)? {
        let (k, v) = row.map_err(meta_err)?;
        out.push((k.value(), PathBuf::from(v.value())));
    }
    Ok(out)
}

fn record(p: &ImportedPool, guid: u64, path: Option<&std::path::Path>) -> Result<()> {
    let _meta = p.meta_lock.lock();
    let tx = p.db().begin_write().map_err(meta_err)?;
    {
        let mut t = tx.open_table(CACHE_DEVICES).map_err(meta_err)?;
        match path {
            Some(path) => {
                let s = path.to_str().ok_or_else(|| {
                    Error::InvalidArgument(format!("{}: not a UTF-8 path", path.display()))
                })?;
                t.insert(guid, s).map_err(meta_err)?;
            }
            None => {
                t.remove(guid).map_err(meta_err)?;
            }
        }
    }
    tx.commit().map_err(meta_err)?;
    Ok(())
}

/// Opens the pool's recorded cache devices in the background (reading a
/// device's index takes a scan of it; the pool serves meanwhile).
pub(crate) fn open_recorded(p: &Arc<ImportedPool>) {
    let list = match recorded(p) {
        Ok(l) if l.is_empty() => return,
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(pool = %p.pool.name, error = %e, "cannot read the cache device list");
            return;
        }
    };
    let weak = Arc::downgrade(p);
    let spawned = std::thread::Builder::new()
        .name("l2arc-open".into())
        .spawn(move || {
            for (guid, path) in list {
                let Some(p) = weak.upgrade() else { return };
                match L2Device::open(&path, p.pool.guid, guid) {
                    Ok(dev) => {
                        dev.start_feed(p.config.l2arc_write_max_bytes);
                        tracing::info!(pool = %p.pool.name, device = %path.display(),
                            entries = dev.stats().entries, "cache device opened");
                        p.cache.attach_l2(dev);
                    }
                    Err(e) => {
                        tracing::warn!(pool = %p.pool.name, device = %path.display(),
                            error = %e, "cache device unavailable (the pool runs without it)");
                        p.cache.note_missing_l2(L2Stats {
                            path,
                            guid,
                            state: "UNAVAIL".into(),
                            ..Default::default()
                        });
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the cache device opener");
    }
}

impl Engine {
    /// `cistern pool add POOL cache DEV...`.
    pub fn add_cache_devices(&self, pool: &str, spec: crate::CacheAddSpec) -> Result<PoolStatus> {
        {
            let _admin = self.inner.admin.lock();
            let p = self.pool(pool)?;
            if spec.devices.is_empty() {
                return Err(Error::InvalidArgument(
                    "name at least one cache device".into(),
                ));
            }
            let members = p.pool.device_paths();
            let known = recorded(&p)?;
            for dev in &spec.devices {
                if members.contains(dev) || known.iter().any(|(_, k)| k == dev) {
                    return Err(Error::Busy(format!(
                        "device {} is already part of pool '{pool}'",
                        dev.display()
                    )));
                }
                if !spec.force {
                    if let Some(label) =
                        pool::Vdev::open(dev).ok().and_then(|v| v.read_label().ok())
                    {
                        return Err(Error::Busy(format!(
                            "{} holds a device label of pool '{}' (use -f to overwrite it)",
                            dev.display(),
                            label.pool_name
                        )));
                    }
                }
            }
            for dev in &spec.devices {
                let guid = loop {
                    let g: u64 = rand::random();
                    if g != 0 && !known.iter().any(|(k, _)| *k == g) {
                        break g;
                    }
                };
                L2Device::create(dev, p.pool.guid, guid)
                    .map_err(|e| Error::InvalidArgument(e.to_string()))?;
                let l2 =
                    L2Device::open(dev, p.pool.guid, guid).map_err(|e| Error::Io(e.to_string()))?;
                record(&p, guid, Some(dev))?;
                l2.start_feed(p.config.l2arc_write_max_bytes);
                p.cache.attach_l2(l2);
                crate::history::log_internal(&p, &format!("cache add {}", dev.display()));
                tracing::info!(pool, device = %dev.display(), "cache device added");
            }
        }
        self.pool_status(pool)
    }

    /// `cistern pool remove POOL DEV` for a cache device (by path or guid);
    /// `None` when `target` names none.
    pub(crate) fn remove_cache_device(
        &self,
        pool: &str,
        target: &str,
    ) -> Result<Option<PoolStatus>> {
        {
            let _admin = self.inner.admin.lock();
            let p = self.pool(pool)?;
            let known = recorded(&p)?;
            let Some((guid, path)) = known
                .into_iter()
                .find(|(g, path)| g.to_string() == target || path.as_os_str() == target)
            else {
                return Ok(None);
            };
            record(&p, guid, None)?;
            if let Some(dev) = p.cache.detach_l2(guid) {
                dev.close();
            }
            crate::history::log_internal(&p, &format!("cache remove {}", path.display()));
            tracing::info!(pool, device = %path.display(), "cache device removed");
        }
        self.pool_status(pool).map(Some)
    }
}

//! A pool: top-level groups of devices, their regions, data allocation and
//! redundant, self-healing I/O.

mod alloc;

pub use alloc::Allocator;
pub use vdev::{
    DeviceState, GroupLayout, Label, LayoutKind, Regions, Vdev, VdevError, LABEL_SIZE, SECTOR,
};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Smallest device a pool accepts.
pub const MIN_DEVICE_SIZE: u64 = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error(transparent)]
    Vdev(#[from] VdevError),
    #[error(transparent)]
    Label(#[from] vdev::LabelError),
    #[error("invalid layout: {0}")]
    Layout(String),
    #[error("pool {pool}: device {guid:#x} of group {group} is missing")]
    MissingDevice {
        pool: String,
        group: usize,
        guid: u64,
    },
    #[error("pool {pool}: group {group} has no readable device")]
    GroupUnavailable { pool: String, group: usize },
    #[error("no valid copy of block at group {group} offset {offset}: {reason}")]
    Unrecoverable {
        group: u32,
        offset: u64,
        reason: String,
    },
    #[error("out of space")]
    NoSpace,
}

/// Data virtual address: where one copy-set of a block lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Dva {
    pub group: u32,
    /// Byte offset inside the group's data region (a multiple of SECTOR).
    pub offset: u64,
    /// Allocated bytes (a multiple of SECTOR).
    pub asize: u32,
}

pub struct Group {
    pub kind: LayoutKind,
    pub devices: Vec<Arc<Vdev>>,
    /// Guids the label names for this group that were not found at import.
    pub missing: Vec<u64>,
    pub data_size: u64,
}

impl Group {
    /// Mirror: ONLINE if all children are, DEGRADED if some, UNAVAIL if none.
    pub fn state(&self) -> DeviceState {
        let online = self
            .devices
            .iter()
            .filter(|d| d.state() == DeviceState::Online)
            .count();
        match online {
            n if n == self.devices.len() && self.missing.is_empty() => DeviceState::Online,
            0 => DeviceState::Unavail,
            _ => DeviceState::Degraded,
        }
    }
}

pub struct Pool {
    pub name: String,
    pub guid: u64,
    pub groups: Vec<Group>,
    pub regions: Regions,
    allocator: Mutex<Allocator>,
}

fn is_live(d: &Vdev) -> bool {
    !matches!(d.state(), DeviceState::Offline | DeviceState::Faulted)
}

/// A redundant write succeeds if any copy was written; a device that failed
/// is FAULTED so later I/O skips it.
fn settle_writes(
    pool: &str,
    group: usize,
    devices: &[&Arc<Vdev>],
    results: Vec<Result<(), VdevError>>,
) -> Result<(), PoolError> {
    let mut written = 0;
    let mut last = None;
    for (dev, r) in devices.iter().zip(results) {
        match r {
            Ok(()) => written += 1,
            Err(e) => {
                tracing::error!(device = %dev.path().display(), error = %e, "write failed; device FAULTED");
                dev.set_state(DeviceState::Faulted);
                last = Some(e);
            }
        }
    }
    match (written, last) {
        (0, Some(e)) => Err(e.into()),
        (0, None) => Err(PoolError::GroupUnavailable {
            pool: pool.to_string(),
            group,
        }),
        _ => Ok(()),
    }
}

/// Runs `op` on every device at once (one thread each; inline for one device).
fn on_each(
    devices: &[&Arc<Vdev>],
    op: impl Fn(&Vdev) -> Result<(), VdevError> + Sync,
) -> Vec<Result<(), VdevError>> {
    if devices.len() == 1 {
        return vec![op(devices[0])];
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = devices.iter().map(|d| s.spawn(|| op(d))).collect();
        handles
            .into_iter()
            .zip(devices)
            .map(|(h, d)| {
                h.join().unwrap_or_else(|_| {
                    Err(VdevError::Io {
                        path: d.path().to_path_buf(),
                        op: "io thread",
                        offset: 0,
                        source: std::io::Error::other("panicked"),
                    })
                })
            })
            .collect()
    })
}

/// Region sizes for a pool whose smallest device has `min_size` bytes.
fn plan_regions(min_size: u64) -> Regions {
    let round = |v: u64| v / SECTOR * SECTOR;
    let meta_size = round((min_size / 16).clamp(16 << 20, 4 << 30));
    let log_size = round((min_size / 32).clamp(16 << 20, 512 << 20));
    Regions {
        meta_offset: LABEL_SIZE,
        meta_size,
        log_offset: LABEL_SIZE + meta_size,
        log_size,
        data_offset: LABEL_SIZE + meta_size + log_size,
    }
}

impl Pool {
    /// Lays out a new pool on `groups` and writes every label.
    pub fn create(name: &str, groups: Vec<(LayoutKind, Vec<Vdev>)>) -> Result<Pool, PoolError> {
        if groups.is_empty() {
            return Err(PoolError::Layout("a pool needs at least one device".into()));
        }
        let mut min_size = u64::MAX;
        for (kind, devices) in &groups {
            match (kind, devices.len()) {
                (LayoutKind::Disk, 1) => {}
                (LayoutKind::Disk, n) => {
                    return Err(PoolError::Layout(format!(
                        "a disk group has one device, not {n}"
                    )))
                }
                (LayoutKind::Mirror, n) if n < 2 => {
                    return Err(PoolError::Layout(
                        "a mirror needs at least two devices".into(),
                    ))
                }
                _ => {}
            }
            for d in devices {
                if d.size() < MIN_DEVICE_SIZE {
                    return Err(VdevError::TooSmall {
                        path: d.path().to_path_buf(),
                        size: d.size(),
                        min: MIN_DEVICE_SIZE,
                    }
                    .into());
                }
                min_size = min_size.min(d.size());
            }
        }
        let regions = plan_regions(min_size);
        let pool_guid = rand::random::<u64>() | 1;
        let layouts: Vec<GroupLayout> = groups
            .iter()
            .map(|(kind, devices)| {
                let smallest = devices.iter().map(|d| d.size()).min().unwrap_or(0);
                let data_size = (smallest - regions.data_offset - LABEL_SIZE) / SECTOR * SECTOR;
                GroupLayout {
                    kind: *kind,
                    devices: devices.iter().map(|_| rand::random::<u64>() | 1).collect(),
                    data_size,
                }
            })
            .collect();
        let mut built = Vec::new();
        for (g, ((kind, devices), layout)) in groups.into_iter().zip(&layouts).enumerate() {
            let mut arcs = Vec::new();
            for (c, dev) in devices.into_iter().enumerate() {
                let label = Label {
                    version: vdev::LABEL_VERSION,
                    pool_name: name.to_string(),
                    pool_guid,
                    device_guid: layout.devices[c],
                    group: g as u32,
                    child: c as u32,
                    groups: layouts.clone(),
                    regions,
                    exported: false,
                };
                // Old data in the metadata region's header must not be mistaken for ours.
                dev.write_at(regions.meta_offset, &vec![0u8; 2 * SECTOR as usize])?;
                dev.fill_zeros(regions.log_offset, regions.log_size)?;
                dev.write_label(&label)?;
                arcs.push(Arc::new(dev));
            }
            built.push(Group {
                kind,
                devices: arcs,
                missing: Vec::new(),
                data_size: layout.data_size,
            });
        }
        Ok(Pool::assemble(name.to_string(), pool_guid, built, regions))
    }

    fn assemble(name: String, guid: u64, groups: Vec<Group>, regions: Regions) -> Pool {
        let allocator = Allocator::new(groups.iter().map(|g| g.data_size).collect());
        Pool {
            name,
            guid,
            groups,
            regions,
            allocator: Mutex::new(allocator),
        }
    }

    /// Assembles a pool from opened devices that carry its labels. Missing
    /// mirror children are tolerated (the group is DEGRADED); a group with
    /// no device is an error.
    pub fn open(devices: Vec<(Vdev, Label)>) -> Result<Pool, PoolError> {
        let Some((_, first)) = devices.first() else {
            return Err(PoolError::Layout("no devices given".into()));
        };
        let layout = first.clone();
        let mut by_guid: HashMap<u64, Vdev> = HashMap::new();
        for (dev, label) in devices {
            if label.pool_guid != layout.pool_guid {
                return Err(PoolError::Layout(format!(
                    "{} belongs to another pool",
                    dev.path().display()
                )));
            }
            by_guid.insert(label.device_guid, dev);
        }
        let mut groups = Vec::new();
        for (g, gl) in layout.groups.iter().enumerate() {
            let mut devs = Vec::new();
            let mut missing = Vec::new();
            for guid in &gl.devices {
                match by_guid.remove(guid) {
                    Some(d) => devs.push(Arc::new(d)),
                    None if gl.kind == LayoutKind::Mirror => {
                        missing.push(*guid);
                        tracing::warn!(pool = %layout.pool_name, group = g, guid, "mirror device missing; pool is DEGRADED");
                    }
                    None => {
                        return Err(PoolError::MissingDevice {
                            pool: layout.pool_name.clone(),
                            group: g,
                            guid: *guid,
                        })
                    }
                }
            }
            if devs.is_empty() {
                return Err(PoolError::GroupUnavailable {
                    pool: layout.pool_name.clone(),
                    group: g,
                });
            }
            groups.push(Group {
                kind: gl.kind,
                devices: devs,
                missing,
                data_size: gl.data_size,
            });
        }
        Ok(Pool::assemble(
            layout.pool_name,
            layout.pool_guid,
            groups,
            layout.regions,
        ))
    }

    pub fn devices(&self) -> impl Iterator<Item = &Arc<Vdev>> {
        self.groups.iter().flat_map(|g| g.devices.iter())
    }

    pub fn device_paths(&self) -> Vec<PathBuf> {
        self.devices().map(|d| d.path().to_path_buf()).collect()
    }

    /// Rewrites every label with `exported` set or cleared.
    pub fn set_exported(&self, exported: bool) -> Result<(), PoolError> {
        for dev in self.devices() {
            let mut label = dev.read_label()?;
            label.exported = exported;
            dev.write_label(&label)?;
        }
        Ok(())
    }

    /// Wipes the labels: the devices are free for other use.
    pub fn wipe_labels(&self) -> Result<(), PoolError> {
        for dev in self.devices() {
            dev.clear_label()?;
        }
        Ok(())
    }

    pub fn allocator(&self) -> parking_lot::MutexGuard<'_, Allocator> {
        self.allocator.lock()
    }

    /// Usable data bytes.
    pub fn size(&self) -> u64 {
        self.groups.iter().map(|g| g.data_size).sum()
    }

    pub fn allocated(&self) -> u64 {
        self.allocator.lock().allocated()
    }

    /// Writes `data` (length <= dva.asize) to every copy of `dva`.
    pub fn write(&self, dva: Dva, data: &[u8]) -> Result<(), PoolError> {
        self.write_vectored(dva, &[data])
    }

    /// Writes the concatenation of `bufs` (length <= dva.asize) to every copy of `dva`.
    /// Succeeds if at least one copy was written; failed devices are faulted.
    pub fn write_vectored(&self, dva: Dva, bufs: &[&[u8]]) -> Result<(), PoolError> {
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        assert!(
            len as u64 <= dva.asize as u64,
            "write larger than its allocation"
        );
        let group = self.group(dva.group)?;
        assert!(
            dva.offset + dva.asize as u64 <= group.data_size,
            "dva beyond group data region"
        );
        let at = self.regions.data_offset + dva.offset;
        // Whole-sector runs go through O_DIRECT from one aligned copy (decision 0004).
        let direct = (dva.offset % SECTOR == 0
            && len as u64 == dva.asize as u64
            && len >= 64 << 10)
            .then(|| {
                let mut buf = vdev::AlignedBuf::zeroed(len);
                let mut at = 0;
                for b in bufs {
                    buf.as_mut_slice()[at..at + b.len()].copy_from_slice(b);
                    at += b.len();
                }
                buf
            });
        let devices: Vec<&Arc<Vdev>> = group.devices.iter().filter(|d| is_live(d)).collect();
        let results = devices.iter().map(|dev| match &direct {
            Some(buf) => dev.write_direct_at(at, buf),
            None => dev.write_vectored_at(at, bufs),
        });
        settle_writes(&self.name, dva.group as usize, &devices, results.collect())
    }

    /// Reads `len` bytes of `dva`, trying each copy until `verify` accepts
    /// one; copies that failed to read or verify are rewritten with the good
    /// data and their READ/CKSUM counters raised.
    pub fn read_verified(
        &self,
        dva: Dva,
        len: usize,
        verify: impl Fn(&[u8]) -> bool,
    ) -> Result<Vec<u8>, PoolError> {
        let group = self.group(dva.group)?;
        let at = self.regions.data_offset + dva.offset;
        let mut bad: Vec<&Arc<Vdev>> = Vec::new();
        let mut reason = String::from("no readable copy");
        for dev in &group.devices {
            if !is_live(dev) {
                continue;
            }
            let mut buf = vec![0u8; len];
            match dev.read_at(at, &mut buf) {
                Ok(()) if verify(&buf) => {
                    for b in bad {
                        tracing::warn!(device = %b.path().display(), offset = at, "healing bad copy");
                        if let Err(e) = b.write_at(at, &buf) {
                            tracing::error!(device = %b.path().display(), error = %e, "heal write failed");
                        }
                    }
                    return Ok(buf);
                }
                Ok(()) => {
                    dev.errors.checksum.fetch_add(1, Ordering::Relaxed);
                    reason = format!("checksum mismatch on {}", dev.path().display());
                    bad.push(dev);
                }
                Err(e) => {
                    reason = e.to_string();
                    bad.push(dev);
                }
            }
        }
        Err(PoolError::Unrecoverable {
            group: dva.group,
            offset: dva.offset,
            reason,
        })
    }

    /// Reads a run of adjacent blocks from the first readable copy, without
    /// verifying: callers verify each block and fall back to
    /// [`Pool::read_verified`] (which heals) for any that fail.
    pub fn read_run(
        &self,
        group: u32,
        offset: u64,
        len: usize,
    ) -> Result<vdev::AlignedBuf, PoolError> {
        let g = self.group(group)?;
        let at = self.regions.data_offset + offset;
        let mut last = None;
        for dev in g.devices.iter().filter(|d| is_live(d)) {
            let mut buf = vdev::AlignedBuf::zeroed(len);
            match dev.read_direct_at(at, &mut buf) {
                Ok(()) => return Ok(buf),
                Err(e) => last = Some(e),
            }
        }
        Err(last
            .map(PoolError::from)
            .unwrap_or(PoolError::GroupUnavailable {
                pool: self.name.clone(),
                group: group as usize,
            }))
    }

    fn group(&self, index: u32) -> Result<&Group, PoolError> {
        self.groups.get(index as usize).ok_or_else(|| {
            PoolError::Layout(format!(
                "block names group {index}, pool has {}",
                self.groups.len()
            ))
        })
    }

    /// Makes every completed write on every device durable, devices in parallel.
    pub fn sync_all(&self) -> Result<(), PoolError> {
        let devices: Vec<&Arc<Vdev>> = self
            .devices()
            .filter(|d| d.state() != DeviceState::Offline)
            .collect();
        let results = on_each(&devices, |d| d.sync());
        let ok = results.iter().filter(|r| r.is_ok()).count();
        if ok == 0 {
            if let Some(Err(e)) = results.into_iter().next() {
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// The metadata region, mirrored on every device.
    pub fn meta_region(self: &Arc<Self>) -> MirroredRegion {
        MirroredRegion {
            pool: self.clone(),
            offset: self.regions.meta_offset,
            size: self.regions.meta_size,
        }
    }

    /// The intent-log region, mirrored on every device.
    pub fn log_region(self: &Arc<Self>) -> MirroredRegion {
        MirroredRegion {
            pool: self.clone(),
            offset: self.regions.log_offset,
            size: self.regions.log_size,
        }
    }
}

/// A byte range at the same place on every device of the pool, written to
/// all of them and read from the first that answers. Used for the metadata
/// store and the intent log, which are kept at least as redundant as data.
#[derive(Clone)]
pub struct MirroredRegion {
    pool: Arc<Pool>,
    offset: u64,
    size: u64,
}

impl std::fmt::Debug for MirroredRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MirroredRegion({}, {}+{})",
            self.pool.name, self.offset, self.size
        )
    }
}

impl MirroredRegion {
    pub fn size(&self) -> u64 {
        self.size
    }

    fn check(&self, offset: u64, len: usize) -> Result<u64, VdevError> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.size => Ok(self.offset + offset),
            _ => Err(VdevError::OutOfRange {
                path: PathBuf::from(format!("{}:region", self.pool.name)),
                offset,
                len,
                size: self.size,
            }),
        }
    }

    fn live(&self) -> impl Iterator<Item = &Arc<Vdev>> {
        self.pool.devices().filter(|d| is_live(d))
    }

    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), PoolError> {
        let at = self.check(offset, data.len())?;
        let devices: Vec<&Arc<Vdev>> = self.live().collect();
        let results = devices.iter().map(|d| d.write_at(at, data)).collect();
        settle_writes(&self.pool.name, 0, &devices, results)
    }

    /// Writes to every device in parallel, each write durable on return.
    pub fn write_durable(&self, offset: u64, data: &[u8]) -> Result<(), PoolError> {
        let at = self.check(offset, data.len())?;
        let devices: Vec<&Arc<Vdev>> = self.live().collect();
        let results = on_each(&devices, |d| d.write_durable_at(at, data));
        settle_writes(&self.pool.name, 0, &devices, results)
    }

    /// Reads from the first device that answers.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), PoolError> {
        self.read_verified(offset, buf, |_| true)
    }

    /// Reads from each device in turn until `verify` accepts; heals the others.
    pub fn read_verified(
        &self,
        offset: u64,
        buf: &mut [u8],
        verify: impl Fn(&[u8]) -> bool,
    ) -> Result<(), PoolError> {
        let at = self.check(offset, buf.len())?;
        let mut bad: Vec<&Arc<Vdev>> = Vec::new();
        let mut reason = String::from("no readable device");
        for dev in self.live() {
            match dev.read_at(at, buf) {
                Ok(()) if verify(buf) => {
                    for b in bad {
                        b.errors.checksum.fetch_add(1, Ordering::Relaxed);
                        let _ = Vdev::write_at(b, at, buf);
                    }
                    return Ok(());
                }
                // Counted only once another copy proves this one wrong: callers
                // also probe past the end of the log, where no copy verifies.
                Ok(()) => {
                    reason = format!("checksum mismatch on {}", dev.path().display());
                    bad.push(dev);
                }
                Err(e) => {
                    reason = e.to_string();
                    bad.push(dev);
                }
            }
        }
        Err(PoolError::Unrecoverable {
            group: u32::MAX,
            offset,
            reason,
        })
    }

    pub fn sync(&self) -> Result<(), PoolError> {
        self.pool.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devs(dir: &std::path::Path, n: usize) -> Vec<Vdev> {
        (0..n)
            .map(|i| Vdev::open_or_create(&dir.join(format!("d{i}")), Some(128 << 20)).unwrap())
            .collect()
    }

    #[test]
    fn mirror_read_heals_a_corrupted_copy() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::create("tank", vec![(LayoutKind::Mirror, devs(dir.path(), 2))]).unwrap();
        let dva = pool.allocator().allocate(8192).unwrap();
        let data = vec![7u8; 8192];
        pool.write(dva, &data).unwrap();
        let dev0 = pool.groups[0].devices[0].clone();
        dev0.write_at(pool.regions.data_offset + dva.offset + 10, &[1, 2, 3])
            .unwrap();
        let got = pool
            .read_verified(dva, 8192, |b| b == data.as_slice())
            .unwrap();
        assert_eq!(got, data);
        assert_eq!(dev0.errors.checksum.load(Ordering::Relaxed), 1);
        // Healed: the first copy is right again.
        let mut buf = vec![0u8; 8192];
        dev0.read_at(pool.regions.data_offset + dva.offset, &mut buf)
            .unwrap();
        assert_eq!(buf, data);
    }

    #[test]
    fn reassembles_from_labels_and_refuses_missing_stripe_member() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::create(
            "tank",
            vec![
                (LayoutKind::Disk, devs(dir.path(), 1)),
                (LayoutKind::Disk, devs(&dir.path().join(""), 0)),
            ],
        )
        .err();
        assert!(pool.is_some(), "a disk group without a device is refused");
        let ds = devs(dir.path(), 2);
        let groups = ds
            .into_iter()
            .map(|d| (LayoutKind::Disk, vec![d]))
            .collect();
        let pool = Pool::create("tank", groups).unwrap();
        let paths = pool.device_paths();
        drop(pool);
        let opened: Vec<_> = paths
            .iter()
            .map(|p| {
                let v = Vdev::open(p).unwrap();
                let l = v.read_label().unwrap();
                (v, l)
            })
            .collect();
        let pool = Pool::open(opened).unwrap();
        assert_eq!(pool.groups.len(), 2);
        let one: Vec<_> = paths[..1]
            .iter()
            .map(|p| {
                let v = Vdev::open(p).unwrap();
                let l = v.read_label().unwrap();
                (v, l)
            })
            .collect();
        assert!(matches!(
            Pool::open(one),
            Err(PoolError::MissingDevice { .. })
        ));
    }
}

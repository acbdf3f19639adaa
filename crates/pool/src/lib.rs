//! A pool: top-level groups of devices, their regions, data allocation and
//! redundant, self-healing I/O.
//!
//! Groups are disks (one device), n-way mirrors or raidz1/2/3 (Reed-Solomon
//! parity, full-stripe writes only: `raidz.rs`, decision 0006). Every group
//! is a list of child *slots*: a slot names a device guid and holds the
//! device if it is present. Slots are swapped at run time by
//! [`Pool::replace_device`]; a device being rebuilt is written but not read
//! until [`Pool::finish_resilver`]. Groups are added by [`Pool::add_group`].

mod alloc;
mod mmp;
mod raidz;
pub mod ratelog;

pub use alloc::Allocator;
pub use mmp::{
    holder_is_gone, live_holder, MmpConfig, DEFAULT_MMP_INTERVAL, IMPORT_INTERVALS, LEASE_INTERVALS,
};
pub use raidz::{MAX_RAIDZ_WIDTH, ROTATE_ROWS};
pub use ratelog::RateLog;
pub use vdev::{
    DeviceState, GroupLayout, Label, LayoutKind, MmpKind, MmpStamp, Owner, PoolState, ProbeFault,
    Regions, Vdev, VdevError, LABEL_SIZE, LATENCY_BUCKETS, SECTOR,
};

use parking_lot::{Mutex, RwLock};
use raidz::Geometry;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use vdev::AlignedBuf;

/// Smallest device a pool accepts.
pub const MIN_DEVICE_SIZE: u64 = 64 << 20;
/// Smallest log area of a log device (besides its two labels).
pub const LOG_DEVICE_MIN: u64 = 16 << 20;

/// Reads and writes of at least this many bytes per device go through
/// O_DIRECT (decision 0004) and, with several devices, run in parallel.
const DIRECT_MIN: usize = 64 << 10;

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
    #[error(
        "pool {pool}: {kind} group {group} is UNAVAIL: {} of its devices are missing ({}), it survives the loss of {tolerated}",
        missing.len(),
        missing.iter().map(|g| format!("{g:#x}")).collect::<Vec<_>>().join(", ")
    )]
    TooManyMissing {
        pool: String,
        group: usize,
        kind: String,
        missing: Vec<u64>,
        tolerated: usize,
    },
    #[error("no valid copy of block at group {group} offset {offset}: {reason}")]
    Unrecoverable {
        group: u32,
        offset: u64,
        reason: String,
    },
    #[error("{path}: device is {size} bytes, {needed} needed to hold this pool's regions and group data")]
    DeviceTooSmall {
        path: PathBuf,
        size: u64,
        needed: u64,
    },
    #[error("pool {pool}: no device with guid {guid:#x}")]
    NoSuchDevice { pool: String, guid: u64 },
    #[error("parity: {0}")]
    Parity(String),
    #[error("out of space")]
    NoSpace,
    #[error("cannot import '{pool}': pool may be in use from another system (host {host}, pid {pid}), use -f to import anyway")]
    InUse {
        pool: String,
        host: String,
        pid: u32,
    },
    #[error("cannot import '{pool}': pool is active on host {host} (pid {pid}): its MMP sequence advanced from {from} to {to}")]
    ActiveElsewhere {
        pool: String,
        host: String,
        pid: u32,
        from: u64,
        to: u64,
    },
    /// Another daemon took the pool over; this one writes nothing more to it.
    #[error("{0}; writes refused")]
    Fenced(String),
    #[error("{0}")]
    Ownership(String),
}

/// Data virtual address: where one copy-set of a block lives.
///
/// For disks and mirrors `offset`/`asize` are bytes of each device's data
/// region. For raidz they are bytes of the group's logical data space, in
/// whole rows (`data columns x SECTOR`); see `raidz.rs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Dva {
    pub group: u32,
    /// Byte offset inside the group's data space (a multiple of its unit).
    pub offset: u64,
    /// Allocated bytes (a multiple of the group's unit).
    pub asize: u32,
}

/// What [`Pool::scrub_block`] found and fixed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubOutcome {
    /// Bytes rewritten on devices whose copy or column was wrong or unreadable.
    pub repaired_bytes: u64,
    /// Guids of the devices whose copy or column was wrong or unreadable.
    pub bad_devices: Vec<u64>,
}

/// One position in a group: the guid the labels name there and the device,
/// if present.
struct Child {
    guid: AtomicU64,
    dev: RwLock<Option<Arc<Vdev>>>,
    /// Written but not trusted for reads until a resilver completes.
    resilvering: AtomicBool,
}

impl Child {
    fn new(guid: u64, dev: Option<Arc<Vdev>>, resilvering: bool) -> Child {
        Child {
            guid: AtomicU64::new(guid),
            dev: RwLock::new(dev),
            resilvering: AtomicBool::new(resilvering),
        }
    }

    fn device(&self) -> Option<Arc<Vdev>> {
        self.dev.read().clone()
    }

    fn guid(&self) -> u64 {
        self.guid.load(Ordering::Acquire)
    }

    fn resilvering(&self) -> bool {
        self.resilvering.load(Ordering::Acquire)
    }

    /// Present, not offline or faulted, and not being rebuilt.
    fn readable(&self) -> Option<Arc<Vdev>> {
        self.device().filter(|d| is_live(d) && !self.resilvering())
    }

    /// Present and not offline or faulted (resilvering devices included).
    fn writable(&self) -> Option<Arc<Vdev>> {
        self.device().filter(|d| is_live(d))
    }
}

/// A snapshot of one child slot, for status and for callers choosing targets.
#[derive(Debug, Clone)]
pub struct ChildInfo {
    pub guid: u64,
    /// `None`: the device was not found at import (UNAVAIL).
    pub device: Option<Arc<Vdev>>,
    /// Being rebuilt: written, not read (`pool status` shows "resilvering").
    pub resilvering: bool,
}

/// A top-level group of the pool.
pub struct Group {
    pub index: u32,
    pub kind: LayoutKind,
    /// Usable data bytes on each device of the group.
    pub data_size: u64,
    children: Vec<Child>,
}

impl Group {
    pub fn width(&self) -> usize {
        self.children.len()
    }

    /// Every slot in order: guid, device if present, resilvering.
    pub fn children(&self) -> Vec<ChildInfo> {
        self.children
            .iter()
            .map(|c| ChildInfo {
                guid: c.guid(),
                device: c.device(),
                resilvering: c.resilvering(),
            })
            .collect()
    }

    /// The devices present, in slot order.
    pub fn devices(&self) -> Vec<Arc<Vdev>> {
        self.children.iter().filter_map(|c| c.device()).collect()
    }

    /// Guids the labels name for this group whose device is not present.
    pub fn missing(&self) -> Vec<u64> {
        self.children
            .iter()
            .filter(|c| c.device().is_none())
            .map(|c| c.guid())
            .collect()
    }

    fn geometry(&self) -> Option<Geometry> {
        match self.kind {
            LayoutKind::Raidz { parity } => Some(Geometry::new(self.width(), parity as usize)),
            _ => None,
        }
    }

    /// Allocation unit: a sector, or one raidz row of data sectors.
    pub fn unit(&self) -> u64 {
        self.geometry().map_or(SECTOR, |g| g.unit())
    }

    /// Allocatable bytes (data only: raidz parity is not counted).
    pub fn capacity(&self) -> u64 {
        match self.geometry() {
            Some(g) => g.capacity(self.data_size),
            None => self.data_size,
        }
    }

    /// Disk: ONLINE, or the device's own state / UNAVAIL. Mirror: ONLINE if
    /// every child is, UNAVAIL if none is, else DEGRADED. Raidz: ONLINE,
    /// DEGRADED while at most `parity` children are not ONLINE (missing,
    /// faulted, offline or resilvering), else UNAVAIL.
    pub fn state(&self) -> DeviceState {
        let healthy = self
            .children
            .iter()
            .filter(|c| {
                !c.resilvering() && c.device().is_some_and(|d| d.state() == DeviceState::Online)
            })
            .count();
        let bad = self.width() - healthy;
        if bad == 0 {
            return DeviceState::Online;
        }
        match self.kind {
            LayoutKind::Disk => match self.children.first().and_then(|c| c.device()) {
                Some(d) if d.state() != DeviceState::Online => d.state(),
                _ => DeviceState::Unavail,
            },
            LayoutKind::Mirror if healthy == 0 => DeviceState::Unavail,
            LayoutKind::Mirror => DeviceState::Degraded,
            LayoutKind::Raidz { parity } if bad <= parity as usize => DeviceState::Degraded,
            LayoutKind::Raidz { .. } => DeviceState::Unavail,
        }
    }

    fn position(&self, guid: u64) -> Option<usize> {
        self.children.iter().position(|c| c.guid() == guid)
    }

    fn layout(&self) -> GroupLayout {
        GroupLayout {
            kind: self.kind,
            devices: self.children.iter().map(|c| c.guid()).collect(),
            data_size: self.data_size,
            resilvering: self
                .children
                .iter()
                .filter(|c| c.resilvering())
                .map(|c| c.guid())
                .collect(),
        }
    }
}

pub struct Pool {
    pub name: String,
    pub guid: u64,
    pub regions: Regions,
    groups: RwLock<Vec<Arc<Group>>>,
    /// Separate intent-log groups (SLOG; at most one, a disk or a mirror):
    /// their devices hold only the log, from LABEL_SIZE on (decision 0030).
    logs: RwLock<Vec<Arc<Group>>>,
    /// The newest label said EXPORTED when the pool was assembled: the last
    /// run committed everything, so its log holds nothing to replay.
    was_exported: bool,
    missing_log_ok: AtomicBool,
    allocator: Mutex<Allocator>,
    /// Serializes layout changes and label rewrites.
    admin: Mutex<()>,
    /// Label generation last written.
    generation: AtomicU64,
    /// Held shared by mirrored-region writes and exclusively while a chunk
    /// of the regions is copied to a device being rebuilt, so the copy never
    /// overwrites a newer write.
    region_lock: RwLock<()>,
    /// Who owns the pool: claim, heartbeat and fence (mmp.rs, decision 0010).
    own: mmp::Ownership,
}

/// Neither offline, faulted nor removed: I/O may go to it.
pub fn is_live(d: &Vdev) -> bool {
    !matches!(
        d.state(),
        DeviceState::Offline | DeviceState::Faulted | DeviceState::Removed
    )
}

/// A redundant write succeeds if any copy was written; a device that failed
/// while others took the write misses data and is FAULTED so later I/O skips
/// it. When every copy failed nothing is faulted: the write fails and the
/// caller (the txg) suspends the pool until the cause is gone (a full
/// filesystem under the device files must not take every device out).
fn settle_writes(
    pool: &str,
    group: usize,
    devices: &[Arc<Vdev>],
    results: Vec<Result<(), VdevError>>,
) -> Result<(), PoolError> {
    let written = results.iter().filter(|r| r.is_ok()).count();
    let mut last = None;
    for (dev, r) in devices.iter().zip(results) {
        if let Err(e) = r {
            if written > 0 {
                fault(dev, &e);
            }
            last = Some(e);
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

/// A write to `dev` failed while the rest of its group took it: FAULTED.
pub(crate) fn fault(dev: &Vdev, e: &VdevError) {
    let subject = format!("fault {}", dev.path().display());
    if let Some(more) = ratelog::DEVICE_EVENTS.admit(&subject) {
        tracing::error!(device = %dev.path().display(), error = %e, more_errors = more, "write failed while the rest of the group took it; device FAULTED");
    }
    dev.set_failed(DeviceState::Faulted, format!("write failed: {e}"));
}

/// One log line per device per minute for healed copies (the count of the
/// ones left out goes in the next line; a scan's totals in its summary).
pub(crate) fn note_heal(dev: &Vdev, at: u64, what: &str) {
    let subject = format!("heal {}", dev.path().display());
    if let Some(more) = ratelog::DEVICE_EVENTS.admit(&subject) {
        tracing::warn!(device = %dev.path().display(), offset = at, more_healed = more, "{what}");
    }
}

/// Runs `op` on every item at once (one thread each; inline for one item).
fn on_each<T: Sync, R: Send>(items: &[T], op: impl Fn(&T) -> R + Sync) -> Vec<R> {
    if items.len() <= 1 {
        return items.iter().map(&op).collect();
    }
    std::thread::scope(|s| {
        let op = &op;
        let handles: Vec<_> = items.iter().map(|d| s.spawn(move || op(d))).collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(r) => r,
                Err(p) => std::panic::resume_unwind(p),
            })
            .collect()
    })
}

/// Writes `buf` at `at`, through O_DIRECT when it is large.
fn write_buf(dev: &Vdev, at: u64, buf: &AlignedBuf, len: usize) -> Result<(), VdevError> {
    if len >= DIRECT_MIN && len == buf.len() {
        dev.write_direct_at(at, buf)
    } else {
        dev.write_at(at, &buf[..len])
    }
}

/// Reads `buf.len()` bytes at `at`, through O_DIRECT when it is large.
fn read_buf(dev: &Vdev, at: u64, buf: &mut AlignedBuf) -> Result<(), VdevError> {
    if buf.len() >= DIRECT_MIN {
        dev.read_direct_at(at, buf)
    } else {
        dev.read_at(at, buf.as_mut_slice())
    }
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

/// Checks a group's kind against its number of devices.
fn check_group(kind: LayoutKind, n: usize) -> Result<(), PoolError> {
    match (kind, n) {
        (LayoutKind::Disk, 1) => Ok(()),
        (LayoutKind::Disk, n) => Err(PoolError::Layout(format!(
            "a disk group has one device, not {n}"
        ))),
        (LayoutKind::Mirror, n) if n < 2 => Err(PoolError::Layout(
            "a mirror needs at least two devices".into(),
        )),
        (LayoutKind::Mirror, _) => Ok(()),
        (LayoutKind::Raidz { parity }, _) if !(1..=3).contains(&parity) => Err(PoolError::Layout(
            format!("raidz parity is 1, 2 or 3, not {parity}"),
        )),
        (LayoutKind::Raidz { parity }, n) if n < parity as usize + 1 => {
            Err(PoolError::Layout(format!(
                "raidz{parity} needs at least {} devices, {n} given ({} or more recommended)",
                parity + 1,
                parity + 2
            )))
        }
        (LayoutKind::Raidz { parity }, n) if n > MAX_RAIDZ_WIDTH => Err(PoolError::Layout(format!(
            "raidz{parity} of {n} devices: at most {MAX_RAIDZ_WIDTH} devices per raidz group (use several groups)"
        ))),
        (LayoutKind::Raidz { .. }, _) => Ok(()),
    }
}

/// Zeroes the metadata header and the log region of a device joining a pool.
fn prepare_device(dev: &Vdev, regions: &Regions) -> Result<(), PoolError> {
    // Old data in the metadata region's header must not be mistaken for ours.
    dev.write_at(regions.meta_offset, &vec![0u8; 2 * SECTOR as usize])?;
    dev.fill_zeros(regions.log_offset, regions.log_size)?;
    Ok(())
}

fn label_version(groups: &[GroupLayout], logs: &[GroupLayout]) -> u32 {
    if !logs.is_empty() {
        return vdev::LABEL_VERSION;
    }
    groups
        .iter()
        .map(|g| {
            if g.resilvering.is_empty() {
                g.kind.label_version()
            } else {
                vdev::LABEL_VERSION_RAIDZ
            }
        })
        .max()
        .unwrap_or(vdev::LABEL_VERSION_PLAIN)
}

impl Pool {
    /// Lays out a new pool on `groups` and writes every label.
    pub fn create(name: &str, groups: Vec<(LayoutKind, Vec<Vdev>)>) -> Result<Pool, PoolError> {
        if groups.is_empty() {
            return Err(PoolError::Layout("a pool needs at least one device".into()));
        }
        let mut min_size = u64::MAX;
        for (kind, devices) in &groups {
            check_group(*kind, devices.len())?;
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
        let mut built = Vec::new();
        for (g, (kind, devices)) in groups.into_iter().enumerate() {
            let smallest = devices.iter().map(|d| d.size()).min().unwrap_or(0);
            let data_size = (smallest - regions.data_offset - LABEL_SIZE) / SECTOR * SECTOR;
            let mut children = Vec::new();
            for dev in devices {
                prepare_device(&dev, &regions)?;
                children.push(Child::new(
                    rand::random::<u64>() | 1,
                    Some(Arc::new(dev)),
                    false,
                ));
            }
            built.push(Arc::new(Group {
                index: g as u32,
                kind,
                data_size,
                children,
            }));
        }
        let pool = Pool::assemble(name.to_string(), pool_guid, built, Vec::new(), regions, 0);
        pool.write_labels(false)?;
        Ok(pool)
    }

    fn assemble(
        name: String,
        guid: u64,
        groups: Vec<Arc<Group>>,
        logs: Vec<Arc<Group>>,
        regions: Regions,
        generation: u64,
    ) -> Pool {
        let allocator =
            Allocator::with_units(groups.iter().map(|g| (g.capacity(), g.unit())).collect());
        Pool {
            name,
            guid,
            regions,
            groups: RwLock::new(groups),
            logs: RwLock::new(logs),
            was_exported: false,
            missing_log_ok: AtomicBool::new(false),
            allocator: Mutex::new(allocator),
            admin: Mutex::new(()),
            generation: AtomicU64::new(generation),
            region_lock: RwLock::new(()),
            own: Default::default(),
        }
    }

    /// Assembles a pool from opened devices that carry its labels. The label
    /// with the highest generation gives the layout; devices it does not
    /// name (replaced ones) are ignored. A group may miss as many devices as
    /// its redundancy allows (mirror: all but one; raidz: `parity`) and is
    /// then DEGRADED; more is [`PoolError::TooManyMissing`] (a disk group:
    /// [`PoolError::MissingDevice`]).
    pub fn open(devices: Vec<(Vdev, Label)>) -> Result<Pool, PoolError> {
        let Some((_, first)) = devices.first() else {
            return Err(PoolError::Layout("no devices given".into()));
        };
        let pool_guid = first.pool_guid;
        let mut layout = first.clone();
        for (dev, label) in &devices {
            if label.pool_guid != pool_guid {
                return Err(PoolError::Layout(format!(
                    "{} belongs to another pool",
                    dev.path().display()
                )));
            }
            if label.generation > layout.generation {
                layout = label.clone();
            }
        }
        let mut by_guid: HashMap<u64, Vdev> = HashMap::new();
        for (dev, label) in devices {
            by_guid.insert(label.device_guid, dev);
        }
        let mut groups = Vec::new();
        for (g, gl) in layout.groups.iter().enumerate() {
            check_group(gl.kind, gl.devices.len())?;
            let mut children = Vec::new();
            let mut missing = Vec::new();
            // A device shorter than its layout needs (a truncated file) cannot
            // hold its data: it imports FAULTED, to be replaced.
            let needed = layout.regions.data_offset + gl.data_size + LABEL_SIZE;
            for guid in &gl.devices {
                let dev = by_guid.remove(guid).map(Arc::new);
                match &dev {
                    None => missing.push(*guid),
                    Some(d) if d.size() < needed => {
                        tracing::error!(pool = %layout.pool_name, device = %d.path().display(), size = d.size(), needed, "device is shorter than the pool needs (truncated?); FAULTED");
                        d.set_failed(
                            DeviceState::Faulted,
                            format!(
                                "device is {} bytes, shorter than the {needed} its label says",
                                d.size()
                            ),
                        );
                    }
                    Some(_) => {}
                }
                children.push(Child::new(*guid, dev, gl.resilvering.contains(guid)));
            }
            let tolerated = gl.kind.redundancy(gl.devices.len());
            if missing.len() > tolerated {
                return Err(match gl.kind {
                    LayoutKind::Disk => PoolError::MissingDevice {
                        pool: layout.pool_name.clone(),
                        group: g,
                        guid: missing[0],
                    },
                    LayoutKind::Mirror => PoolError::GroupUnavailable {
                        pool: layout.pool_name.clone(),
                        group: g,
                    },
                    kind => PoolError::TooManyMissing {
                        pool: layout.pool_name.clone(),
                        group: g,
                        kind: kind.name(),
                        missing,
                        tolerated,
                    },
                });
            }
            if !missing.is_empty() {
                tracing::warn!(pool = %layout.pool_name, group = g, ?missing, "devices missing; pool is DEGRADED");
            }
            groups.push(Arc::new(Group {
                index: g as u32,
                kind: gl.kind,
                data_size: gl.data_size,
                children,
            }));
        }
        // Log groups may miss every device: whether the pool can do without
        // them depends on the log checkpoint (the dataset layer decides).
        let mut logs = Vec::new();
        for (g, gl) in layout.logs.iter().enumerate() {
            if !matches!(gl.kind, LayoutKind::Disk | LayoutKind::Mirror) {
                return Err(PoolError::Layout(format!(
                    "log group {g} is {}: only disks and mirrors hold a log",
                    gl.kind.name()
                )));
            }
            let mut children = Vec::new();
            for guid in &gl.devices {
                let dev = by_guid.remove(guid).map(Arc::new);
                match &dev {
                    None => {
                        tracing::warn!(pool = %layout.pool_name, log_group = g, guid, "log device missing")
                    }
                    Some(d) if d.size() < gl.data_size + 2 * LABEL_SIZE => {
                        d.set_failed(
                            DeviceState::Faulted,
                            format!(
                                "log device is {} bytes, shorter than the {} its label says",
                                d.size(),
                                gl.data_size + 2 * LABEL_SIZE
                            ),
                        );
                    }
                    Some(_) => {}
                }
                children.push(Child::new(*guid, dev, false));
            }
            logs.push(Arc::new(Group {
                index: g as u32,
                kind: gl.kind,
                data_size: gl.data_size,
                children,
            }));
        }
        for (guid, dev) in by_guid {
            tracing::warn!(pool = %layout.pool_name, device = %dev.path().display(), guid, "device not in the pool's current layout (replaced?); ignored");
        }
        let mut pool = Pool::assemble(
            layout.pool_name.clone(),
            layout.pool_guid,
            groups,
            logs,
            layout.regions,
            layout.generation,
        );
        pool.was_exported = layout.pool_state() == PoolState::Exported;
        Ok(pool)
    }

    /// The newest label said EXPORTED when the pool was assembled.
    pub fn was_exported(&self) -> bool {
        self.was_exported
    }

    /// `pool import -m`: a missing log device's unreplayed records may be lost.
    pub fn accept_missing_log(&self) {
        self.missing_log_ok.store(true, Ordering::Release);
    }

    pub fn missing_log_accepted(&self) -> bool {
        self.missing_log_ok.load(Ordering::Acquire)
    }

    /// The separate log groups (SLOG), in index order.
    pub fn logs(&self) -> Vec<Arc<Group>> {
        self.logs.read().clone()
    }

    /// The log devices present.
    pub fn log_devices(&self) -> Vec<Arc<Vdev>> {
        self.logs.read().iter().flat_map(|g| g.devices()).collect()
    }

    /// The tag the log checkpoint stores for a log group: the guid of its
    /// first device (log groups are never reshaped, so it is stable).
    pub fn log_tag(group: &Group) -> u64 {
        group.children.first().map_or(0, |c| c.guid())
    }

    /// The log group a checkpoint tag names, if the labels list it.
    pub fn log_group_by_tag(&self, tag: u64) -> Option<Arc<Group>> {
        self.logs
            .read()
            .iter()
            .find(|g| Pool::log_tag(g) == tag)
            .cloned()
    }

    /// `pool add POOL log DEV | log mirror A B`: a separate log group. Its
    /// devices hold only the intent log, from LABEL_SIZE to the end label.
    /// Every label names it before the caller moves the log there. Returns
    /// the group's tag ([`Pool::log_tag`]).
    pub fn add_log(&self, kind: LayoutKind, devices: Vec<Vdev>) -> Result<u64, PoolError> {
        let _admin = self.admin.lock();
        match (kind, devices.len()) {
            (LayoutKind::Disk, 1) => {}
            (LayoutKind::Mirror, n) if n >= 2 => {}
            (LayoutKind::Mirror, _) => {
                return Err(PoolError::Layout(
                    "a log mirror needs at least two devices".into(),
                ))
            }
            (LayoutKind::Disk, n) => {
                return Err(PoolError::Layout(format!(
                    "a log device is one device, not {n} (use `log mirror A B`)"
                )))
            }
            (k, _) => {
                return Err(PoolError::Layout(format!(
                    "a log is a device or a mirror, not {}",
                    k.name()
                )))
            }
        }
        if !self.logs.read().is_empty() {
            return Err(PoolError::Layout(format!(
                "pool {} already has a log group (remove it first)",
                self.name
            )));
        }
        let needed = 2 * LABEL_SIZE + LOG_DEVICE_MIN;
        let present = self.device_paths();
        for d in &devices {
            if d.size() < needed {
                return Err(PoolError::DeviceTooSmall {
                    path: d.path().to_path_buf(),
                    size: d.size(),
                    needed,
                });
            }
            if present.iter().any(|p| p == d.path()) {
                return Err(PoolError::Layout(format!(
                    "{} is already part of pool {}",
                    d.path().display(),
                    self.name
                )));
            }
        }
        let smallest = devices.iter().map(|d| d.size()).min().unwrap_or(0);
        let data_size = (smallest - 2 * LABEL_SIZE) / SECTOR * SECTOR;
        let mut children = Vec::new();
        for dev in devices {
            // Records a former pool left here never verify (the pool guid is
            // in their checksum); zeroing the start keeps dumps readable.
            dev.write_at(LABEL_SIZE, &vec![0u8; SECTOR as usize * 16])?;
            children.push(Child::new(
                rand::random::<u64>() | 1,
                Some(Arc::new(dev)),
                false,
            ));
        }
        let group = Arc::new(Group {
            index: 0,
            kind,
            data_size,
            children,
        });
        let tag = Pool::log_tag(&group);
        self.logs.write().push(group);
        if let Err(e) = self.relabel() {
            self.logs.write().pop();
            return Err(e);
        }
        tracing::info!(pool = %self.name, kind = %kind.name(), tag, "log group added");
        Ok(tag)
    }

    /// Takes the log group `tag` out of the layout and wipes its devices'
    /// labels. The caller has moved the log off it first (a committed txg
    /// whose checkpoint names another region), so nothing on it is needed.
    pub fn remove_log(&self, tag: u64) -> Result<Vec<PathBuf>, PoolError> {
        let _admin = self.admin.lock();
        let removed = {
            let mut logs = self.logs.write();
            let Some(i) = logs.iter().position(|g| Pool::log_tag(g) == tag) else {
                return Err(PoolError::NoSuchDevice {
                    pool: self.name.clone(),
                    guid: tag,
                });
            };
            logs.remove(i)
        };
        self.relabel()?;
        let mut paths = Vec::new();
        for dev in removed.devices() {
            if let Err(e) = dev.clear_label() {
                tracing::warn!(device = %dev.path().display(), error = %e, "could not wipe the removed log device's label");
            }
            paths.push(dev.path().to_path_buf());
        }
        tracing::info!(pool = %self.name, tag, "log group removed");
        Ok(paths)
    }

    /// The intent-log region on log group `tag` (a SLOG), if it is listed.
    pub fn slog_region(self: &Arc<Self>, tag: u64) -> Option<MirroredRegion> {
        let g = self.log_group_by_tag(tag)?;
        Some(MirroredRegion {
            pool: self.clone(),
            offset: LABEL_SIZE,
            size: g.data_size,
            log_group: Some(g),
        })
    }

    /// The groups, in index order (a snapshot: `pool add` may append more).
    pub fn groups(&self) -> Vec<Arc<Group>> {
        self.groups.read().clone()
    }

    pub fn group(&self, index: u32) -> Result<Arc<Group>, PoolError> {
        let groups = self.groups.read();
        match groups.get(index as usize) {
            Some(g) => Ok(g.clone()),
            None => Err(PoolError::Layout(format!(
                "block names group {index}, pool has {}",
                groups.len()
            ))),
        }
    }

    /// Every device present, group by group.
    pub fn devices(&self) -> Vec<Arc<Vdev>> {
        self.groups
            .read()
            .iter()
            .flat_map(|g| g.devices())
            .collect()
    }

    /// Paths of every device present, log devices included.
    pub fn device_paths(&self) -> Vec<PathBuf> {
        self.devices()
            .iter()
            .chain(self.log_devices().iter())
            .map(|d| d.path().to_path_buf())
            .collect()
    }

    /// The device with this guid, if present.
    pub fn device_by_guid(&self, guid: u64) -> Option<Arc<Vdev>> {
        self.find(guid)
            .ok()
            .and_then(|(g, c)| g.children[c].device())
    }

    /// The guid of a present device (by identity).
    pub fn guid_of(&self, dev: &Vdev) -> Option<u64> {
        for g in self.groups.read().iter() {
            for c in &g.children {
                if c.device().is_some_and(|d| std::ptr::eq(&*d, dev)) {
                    return Some(c.guid());
                }
            }
        }
        None
    }

    fn find(&self, guid: u64) -> Result<(Arc<Group>, usize), PoolError> {
        for g in self.groups.read().iter() {
            if let Some(c) = g.position(guid) {
                return Ok((g.clone(), c));
            }
        }
        Err(PoolError::NoSuchDevice {
            pool: self.name.clone(),
            guid,
        })
    }

    /// Writes the current layout into the label of every present device
    /// (failures on one device are logged; all failing is an error).
    fn write_labels(&self, exported: bool) -> Result<(), PoolError> {
        self.check_owner()?;
        let mut written = 0;
        let mut last = None;
        for (dev, label) in self.device_labels(exported) {
            if dev.state() == DeviceState::Faulted {
                continue;
            }
            match dev.write_label(&label) {
                Ok(()) => written += 1,
                Err(e) => {
                    tracing::error!(device = %dev.path().display(), error = %e, "label write failed");
                    last = Some(e);
                }
            }
        }
        match (written, last) {
            (0, Some(e)) => Err(e.into()),
            _ => Ok(()),
        }
    }

    /// Raises the generation and rewrites every label.
    fn relabel(&self) -> Result<(), PoolError> {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.write_labels(false)
    }

    /// Rewrites every label with `exported` set or cleared.
    pub fn set_exported(&self, exported: bool) -> Result<(), PoolError> {
        let _admin = self.admin.lock();
        self.write_labels(exported)
    }

    /// Wipes the labels: the devices are free for other use.
    pub fn wipe_labels(&self) -> Result<(), PoolError> {
        for dev in self.devices().into_iter().chain(self.log_devices()) {
            dev.clear_label()?;
        }
        Ok(())
    }

    pub fn allocator(&self) -> parking_lot::MutexGuard<'_, Allocator> {
        self.allocator.lock()
    }

    /// Usable data bytes (raidz parity excluded).
    pub fn size(&self) -> u64 {
        self.groups.read().iter().map(|g| g.capacity()).sum()
    }

    pub fn allocated(&self) -> u64 {
        self.allocator.lock().allocated()
    }

    // ---------------------------------------------------------------
    // Layout changes

    /// Adds a group (`pool add`): new devices get the pool's regions (the
    /// metadata and log regions are copied onto them from a healthy device),
    /// every label names the new group, then the allocator starts using it.
    /// Each new device must hold the pool's regions plus at least 16 MiB of
    /// data, and be at least MIN_DEVICE_SIZE.
    pub fn add_group(&self, kind: LayoutKind, devices: Vec<Vdev>) -> Result<(), PoolError> {
        let _admin = self.admin.lock();
        check_group(kind, devices.len())?;
        let needed = (self.regions.data_offset + LABEL_SIZE + (16 << 20)).max(MIN_DEVICE_SIZE);
        for d in &devices {
            if d.size() < needed {
                return Err(PoolError::DeviceTooSmall {
                    path: d.path().to_path_buf(),
                    size: d.size(),
                    needed,
                });
            }
            let present = self.devices();
            if present.iter().any(|p| p.path() == d.path()) {
                return Err(PoolError::Layout(format!(
                    "{} is already part of pool {}",
                    d.path().display(),
                    self.name
                )));
            }
        }
        let smallest = devices.iter().map(|d| d.size()).min().unwrap_or(0);
        let data_size = (smallest - self.regions.data_offset - LABEL_SIZE) / SECTOR * SECTOR;
        let mut children = Vec::new();
        for dev in devices {
            prepare_device(&dev, &self.regions)?;
            // Flagged until the regions are copied: written, not read.
            children.push(Child::new(
                rand::random::<u64>() | 1,
                Some(Arc::new(dev)),
                true,
            ));
        }
        let group = {
            let mut groups = self.groups.write();
            let group = Arc::new(Group {
                index: groups.len() as u32,
                kind,
                data_size,
                children,
            });
            groups.push(group.clone());
            group
        };
        let result = (|| {
            for c in &group.children {
                self.resilver_regions(c.guid())?;
            }
            for c in &group.children {
                c.resilvering.store(false, Ordering::Release);
            }
            self.relabel()
        })();
        if let Err(e) = result {
            // Not in any label yet (or only in some): take it out again.
            self.groups.write().pop();
            return Err(e);
        }
        self.allocator
            .lock()
            .add_group(group.capacity(), group.unit());
        tracing::info!(pool = %self.name, group = group.index, kind = %kind.name(), "group added");
        Ok(())
    }

    /// A device joining `group` (replace, attach): big enough for the
    /// group's data, and not already in the pool (except `leaving`, the
    /// device it replaces, which may be re-used in place).
    fn check_new_device(
        &self,
        group: &Group,
        new: &Vdev,
        leaving: Option<Arc<Vdev>>,
    ) -> Result<(), PoolError> {
        let needed = self.regions.data_offset + group.data_size + LABEL_SIZE;
        if new.size() < needed {
            return Err(PoolError::DeviceTooSmall {
                path: new.path().to_path_buf(),
                size: new.size(),
                needed,
            });
        }
        if self
            .devices()
            .iter()
            .any(|d| d.path() == new.path() && leaving.as_ref().is_none_or(|o| !Arc::ptr_eq(o, d)))
        {
            return Err(PoolError::Layout(format!(
                "{} is already part of pool {}",
                new.path().display(),
                self.name
            )));
        }
        Ok(())
    }

    /// Puts `new` in the slot of the device `old_guid` (present or missing).
    /// The new device gets a new guid and is marked resilvering: written by
    /// every write, read by nothing until [`Pool::finish_resilver`]. All
    /// labels are rewritten to name it instead of the old device, whose own
    /// label is wiped if it is still present. The caller then rebuilds it
    /// with [`Pool::resilver_regions`] and [`Pool::resilver_block`] for every
    /// live block. Returns the new device's guid.
    pub fn replace_device(&self, old_guid: u64, new: Vdev) -> Result<u64, PoolError> {
        let _admin = self.admin.lock();
        let (group, c) = self.find(old_guid)?;
        if group.kind == LayoutKind::Disk {
            return Err(PoolError::Layout(format!(
                "device {old_guid:#x} is a single-disk group: without redundancy there is nothing to rebuild it from"
            )));
        }
        self.check_new_device(&group, &new, group.children[c].device())?;
        // Rebuilding needs enough of the rest of the group.
        let others_ok = group
            .children
            .iter()
            .enumerate()
            .filter(|(i, ch)| *i != c && ch.readable().is_some())
            .count();
        let need = group.width() - group.kind.redundancy(group.width());
        if others_ok < need {
            return Err(PoolError::Layout(format!(
                "group {} has {others_ok} readable devices besides the one replaced, {need} needed to rebuild it",
                group.index
            )));
        }
        let child = &group.children[c];
        if let Some(old) = child.device() {
            if old.path() != new.path() {
                if let Err(e) = old.clear_label() {
                    tracing::warn!(device = %old.path().display(), error = %e, "could not wipe the replaced device's label");
                }
            }
        }
        prepare_device(&new, &self.regions)?;
        let new_guid = rand::random::<u64>() | 1;
        {
            let mut slot = child.dev.write();
            child.resilvering.store(true, Ordering::Release);
            child.guid.store(new_guid, Ordering::Release);
            *slot = Some(Arc::new(new));
        }
        tracing::info!(pool = %self.name, old = old_guid, new = new_guid, "device replaced; resilver needed");
        self.relabel()?;
        Ok(new_guid)
    }

    /// `pool attach`: `new` joins the group of the device `guid` as one
    /// more mirror copy; a single-disk group becomes a mirror. The new
    /// device is marked resilvering (written, not read) and gets the pool's
    /// regions; the caller rebuilds its blocks with a resilver. Raidz
    /// groups cannot be widened this way. Returns the new device's guid.
    pub fn attach_device(&self, guid: u64, new: Vdev) -> Result<u64, PoolError> {
        let _admin = self.admin.lock();
        let (group, _) = self.find(guid)?;
        if matches!(group.kind, LayoutKind::Raidz { .. }) {
            return Err(PoolError::Layout(format!(
                "cannot attach to a device of {}-{}: only single disks and mirrors take another copy",
                group.kind.name(),
                group.index
            )));
        }
        self.check_new_device(&group, &new, None)?;
        prepare_device(&new, &self.regions)?;
        let new_guid = rand::random::<u64>() | 1;
        let mut children: Vec<Child> = group
            .children
            .iter()
            .map(|c| Child::new(c.guid(), c.device(), c.resilvering()))
            .collect();
        children.push(Child::new(new_guid, Some(Arc::new(new)), true));
        self.swap_group(&group, LayoutKind::Mirror, children);
        tracing::info!(pool = %self.name, group = group.index, new = new_guid, "device attached; resilver needed");
        self.relabel()?;
        Ok(new_guid)
    }

    /// `pool detach`: takes a device out of a mirror (a two-way mirror
    /// becomes a single disk). Refused when no other copy is readable. The
    /// detached device's label is wiped.
    pub fn detach_device(&self, guid: u64) -> Result<(), PoolError> {
        let _admin = self.admin.lock();
        let (group, c) = self.find(guid)?;
        if group.kind != LayoutKind::Mirror {
            return Err(PoolError::Layout(format!(
                "only a device of a mirror can be detached (this one is in a {} group; `pool remove` takes out a whole group)",
                group.kind.name()
            )));
        }
        let others = group
            .children
            .iter()
            .enumerate()
            .filter(|(i, ch)| *i != c && ch.readable().is_some())
            .count();
        if others == 0 {
            return Err(PoolError::Layout(
                "no valid replicas: the other copies of the mirror are missing, faulted or being rebuilt".into(),
            ));
        }
        let old = group.children[c].device();
        let children: Vec<Child> = group
            .children
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != c)
            .map(|(_, ch)| Child::new(ch.guid(), ch.device(), ch.resilvering()))
            .collect();
        let kind = if children.len() == 1 {
            LayoutKind::Disk
        } else {
            LayoutKind::Mirror
        };
        self.swap_group(&group, kind, children);
        self.relabel()?;
        if let Some(old) = old {
            if let Err(e) = old.clear_label() {
                tracing::warn!(device = %old.path().display(), error = %e, "could not wipe the detached device's label");
            }
        }
        tracing::info!(pool = %self.name, group = group.index, guid, "device detached");
        Ok(())
    }

    /// `pool remove`: drops the last top-level group if it holds no block
    /// (the others keep their indexes, which block pointers name). Its
    /// devices' labels are wiped. Evacuating a group with data is not
    /// supported: refused, naming why.
    pub fn remove_last_group(&self, index: u32) -> Result<Vec<PathBuf>, PoolError> {
        let _admin = self.admin.lock();
        let groups = self.groups();
        if groups.len() < 2 {
            return Err(PoolError::Layout(
                "cannot remove the only group of a pool (destroy the pool instead)".into(),
            ));
        }
        if index as usize + 1 != groups.len() {
            return Err(PoolError::Layout(format!(
                "only the last group ({}) can be removed: block addresses name groups by position",
                groups.len() - 1
            )));
        }
        {
            let mut alloc = self.allocator.lock();
            let used = alloc.group_allocated(index as usize);
            if used > 0 || !alloc.remove_last_group() {
                return Err(PoolError::Layout(format!(
                    "group {index} holds {used} bytes of data: evacuating a group is not supported (only an empty group can be removed)"
                )));
            }
        }
        let removed = self.groups.write().pop();
        self.relabel()?;
        let mut paths = Vec::new();
        for dev in removed.iter().flat_map(|g| g.devices()) {
            if let Err(e) = dev.clear_label() {
                tracing::warn!(device = %dev.path().display(), error = %e, "could not wipe the removed device's label");
            }
            paths.push(dev.path().to_path_buf());
        }
        tracing::info!(pool = %self.name, group = index, "group removed");
        Ok(paths)
    }

    /// Puts a rebuilt copy of `group` (same index and data size) in its place.
    fn swap_group(&self, group: &Group, kind: LayoutKind, children: Vec<Child>) {
        let mut groups = self.groups.write();
        groups[group.index as usize] = Arc::new(Group {
            index: group.index,
            kind,
            data_size: group.data_size,
            children,
        });
    }

    /// Marks a present device as being rebuilt (e.g. brought back online
    /// after being offline while writes went on): written, not read.
    pub fn begin_resilver(&self, guid: u64) -> Result<(), PoolError> {
        let _admin = self.admin.lock();
        let (group, c) = self.find(guid)?;
        group.children[c].resilvering.store(true, Ordering::Release);
        self.relabel()
    }

    /// Ends a rebuild: the device is trusted for reads again and the labels
    /// say so.
    pub fn finish_resilver(&self, guid: u64) -> Result<(), PoolError> {
        let _admin = self.admin.lock();
        let (group, c) = self.find(guid)?;
        group.children[c]
            .resilvering
            .store(false, Ordering::Release);
        self.relabel()
    }

    /// Whether the device is being rebuilt.
    pub fn is_resilvering(&self, guid: u64) -> bool {
        self.find(guid)
            .is_ok_and(|(g, c)| g.children[c].resilvering())
    }

    /// Sets a present device's state (`offline`/`online`). Not persisted.
    pub fn set_device_state(&self, guid: u64, state: DeviceState) -> Result<(), PoolError> {
        let dev = self.device_by_guid(guid).ok_or(PoolError::NoSuchDevice {
            pool: self.name.clone(),
            guid,
        })?;
        dev.set_state(state);
        Ok(())
    }

    /// Zeroes the READ/WRITE/CKSUM counters of one device or of all, and
    /// retries FAULTED and REMOVED devices (as `zpool clear`): a device
    /// whose path names its own file again, as large as its label says, is
    /// reopened and comes back ONLINE; one still gone or short keeps its
    /// state and reason. Returns the guids of the devices brought back (they
    /// may have missed writes: the caller resilvers them).
    pub fn clear_errors(&self, guid: Option<u64>) -> Result<Vec<u64>, PoolError> {
        let _admin = self.admin.lock();
        let mut slots = Vec::new();
        for g in self.groups() {
            for (c, child) in g.children.iter().enumerate() {
                if guid.is_none_or(|x| x == child.guid()) {
                    slots.push((g.clone(), c));
                }
            }
        }
        if let (Some(g), true) = (guid, slots.is_empty()) {
            return Err(PoolError::NoSuchDevice {
                pool: self.name.clone(),
                guid: g,
            });
        }
        let mut back = Vec::new();
        for (g, c) in slots {
            let child = &g.children[c];
            let Some(d) = child.device() else { continue };
            d.errors.read.store(0, Ordering::Relaxed);
            d.errors.write.store(0, Ordering::Relaxed);
            d.errors.checksum.store(0, Ordering::Relaxed);
            if !matches!(d.state(), DeviceState::Faulted | DeviceState::Removed) {
                continue;
            }
            let needed = self.regions.data_offset + g.data_size + LABEL_SIZE;
            match self.reopen(&d, child.guid(), needed) {
                Ok(fresh) => {
                    if let Some(fresh) = fresh {
                        *child.dev.write() = Some(Arc::new(fresh));
                    } else {
                        d.set_state(DeviceState::Online);
                    }
                    ratelog::DEVICE_EVENTS.reset(&format!("fault {}", d.path().display()));
                    tracing::info!(pool = %self.name, device = %d.path().display(), "device retried; ONLINE");
                    back.push(child.guid());
                }
                Err(why) => {
                    tracing::warn!(pool = %self.name, device = %d.path().display(), reason = %why, "device retried; still unusable");
                    let state = match d.state() {
                        DeviceState::Removed => DeviceState::Removed,
                        _ => DeviceState::Faulted,
                    };
                    d.set_failed(state, why);
                }
            }
        }
        Ok(back)
    }

    /// Whether a failed device can serve again: the same file, large
    /// enough (`Ok(None)`), or a file at its path that carries this pool's
    /// label for this slot (`Ok(Some)`: opened afresh; a device re-attached).
    fn reopen(&self, d: &Vdev, guid: u64, needed: u64) -> Result<Option<Vdev>, String> {
        match d.probe() {
            None if d.size() >= needed => return Ok(None),
            None => {
                return Err(format!(
                    "device is {} bytes, shorter than the {needed} its label says",
                    d.size()
                ))
            }
            Some(ProbeFault::Shrunk { size, .. }) => {
                return Err(format!(
                    "device is {size} bytes, shorter than the {needed} its label says"
                ))
            }
            Some(ProbeFault::Gone(_)) => {}
        }
        let fresh = Vdev::open(d.path()).map_err(|e| e.to_string())?;
        let label = fresh.read_label().map_err(|e| e.to_string())?;
        if label.pool_guid != self.guid || label.device_guid != guid {
            return Err(format!(
                "{} now holds another device (guid {:#x} of pool {})",
                d.path().display(),
                label.device_guid,
                label.pool_name
            ));
        }
        if fresh.size() < needed {
            return Err(format!(
                "device is {} bytes, shorter than the {needed} its label says",
                fresh.size()
            ));
        }
        Ok(Some(fresh))
    }

    /// Checks every present device as zed would on a udev event (path gone
    /// or replaced: REMOVED; shorter than its label says: FAULTED). Returns
    /// the devices whose state changed, with the reason.
    pub fn probe_devices(&self) -> Vec<(Arc<Vdev>, DeviceState, String)> {
        let mut out = Vec::new();
        for g in self.groups() {
            let needed = self.regions.data_offset + g.data_size + LABEL_SIZE;
            for child in &g.children {
                let Some(d) = child.device().filter(|d| is_live(d)) else {
                    continue;
                };
                let found = match d.probe() {
                    Some(ProbeFault::Gone(why)) => Some((DeviceState::Removed, why)),
                    Some(ProbeFault::Shrunk { size, .. }) => Some((
                        DeviceState::Faulted,
                        format!("device is {size} bytes, shorter than the {needed} its label says"),
                    )),
                    None => None,
                };
                if let Some((state, why)) = found {
                    d.set_failed(state, why.clone());
                    out.push((d, state, why));
                }
            }
        }
        out
    }

    /// Faults a device for repeated I/O errors (the caller counts them).
    pub fn fault_device(&self, dev: &Vdev, reason: String) {
        dev.set_failed(DeviceState::Faulted, reason);
    }

    /// Every present device (data groups, then log groups) with the label
    /// this daemon writes on it: the current layout, generation and owner.
    fn device_labels(&self, exported: bool) -> Vec<(Arc<Vdev>, Label)> {
        let groups = self.groups();
        let logs = self.logs();
        let layouts: Vec<GroupLayout> = groups.iter().map(|g| g.layout()).collect();
        let log_layouts: Vec<GroupLayout> = logs.iter().map(|g| g.layout()).collect();
        let version = label_version(&layouts, &log_layouts);
        let generation = self.generation.load(Ordering::Acquire);
        let owner = self.owner();
        let all = groups
            .iter()
            .map(|g| (g, false))
            .chain(logs.iter().map(|g| (g, true)));
        let mut out = Vec::new();
        for (g, is_log) in all {
            for (c, child) in g.children.iter().enumerate() {
                let Some(dev) = child.device() else { continue };
                let label = Label {
                    version,
                    pool_name: self.name.clone(),
                    pool_guid: self.guid,
                    device_guid: child.guid(),
                    group: g.index,
                    child: c as u32,
                    groups: layouts.clone(),
                    regions: self.regions,
                    exported,
                    state: Some(if exported {
                        PoolState::Exported
                    } else {
                        PoolState::Active
                    }),
                    owner: owner.clone(),
                    generation,
                    logs: log_layouts.clone(),
                    log_device: is_log,
                };
                out.push((dev, label));
            }
        }
        out
    }

    /// Checks both labels of every live device against the current layout
    /// and rewrites the labels of devices where either copy is damaged or
    /// stale (scrub). Returns the paths of the devices whose labels were
    /// rewritten and of those that could not be.
    pub fn check_labels(&self) -> (Vec<PathBuf>, Vec<(PathBuf, String)>) {
        let _admin = self.admin.lock();
        let (mut fixed, mut failed) = (Vec::new(), Vec::new());
        for (dev, label) in self.device_labels(false) {
            if !is_live(&dev) {
                continue;
            }
            match dev.labels_match(&label) {
                Ok(true) => {}
                Ok(false) | Err(_) => match dev.write_label(&label) {
                    Ok(()) => fixed.push(dev.path().to_path_buf()),
                    Err(e) => failed.push((dev.path().to_path_buf(), e.to_string())),
                },
            }
        }
        (fixed, failed)
    }

    /// An empty space map for the current groups, to be filled with
    /// [`Allocator::claim`] and installed with [`Pool::set_allocator`]
    /// (import, and a suspended pool resumed on a reopened metadata store).
    pub fn empty_allocator(&self) -> Allocator {
        let groups = self.groups();
        Allocator::with_units(groups.iter().map(|g| (g.capacity(), g.unit())).collect())
    }

    pub fn set_allocator(&self, alloc: Allocator) {
        *self.allocator.lock() = alloc;
    }

    /// Copies the metadata and intent-log regions onto a device (being
    /// rebuilt or newly added) from a readable one, 1 MiB at a time; each
    /// chunk is copied with mirrored-region writes held off, so a newer
    /// write is never overwritten. Returns the bytes written. The copy is
    /// raw: a metadata page that was wrong on the source is caught and
    /// healed by `meta::verify_all` afterwards.
    pub fn resilver_regions(&self, target_guid: u64) -> Result<u64, PoolError> {
        const CHUNK: u64 = 1 << 20;
        let target = self
            .device_by_guid(target_guid)
            .ok_or(PoolError::NoSuchDevice {
                pool: self.name.clone(),
                guid: target_guid,
            })?;
        let mut written = 0;
        for (start, size) in [
            (self.regions.meta_offset, self.regions.meta_size),
            (self.regions.log_offset, self.regions.log_size),
        ] {
            let mut buf = AlignedBuf::zeroed(CHUNK as usize);
            let mut at = start;
            while at < start + size {
                let n = CHUNK.min(start + size - at) as usize;
                let _excl = self.region_lock.write();
                let mut copied = false;
                let mut last = None;
                for src in self.region_readers() {
                    if Arc::ptr_eq(&src, &target) {
                        continue;
                    }
                    let r = if n == CHUNK as usize {
                        src.read_direct_at(at, &mut buf)
                    } else {
                        src.read_at(at, &mut buf[..n])
                    };
                    match r {
                        Ok(()) => {
                            write_buf(&target, at, &buf, n)?;
                            copied = true;
                            break;
                        }
                        Err(e) => last = Some(e),
                    }
                }
                if !copied {
                    return Err(last
                        .map(PoolError::from)
                        .unwrap_or(PoolError::Unrecoverable {
                            group: u32::MAX,
                            offset: at,
                            reason: "no readable device to copy the regions from".into(),
                        }));
                }
                written += n as u64;
                at += n as u64;
            }
        }
        target.sync()?;
        Ok(written)
    }

    /// Devices the mirrored regions may be read from.
    fn region_readers(&self) -> Vec<Arc<Vdev>> {
        self.region_devices(Child::readable)
    }

    fn region_devices(&self, pick: fn(&Child) -> Option<Arc<Vdev>>) -> Vec<Arc<Vdev>> {
        self.groups
            .read()
            .iter()
            .flat_map(|g| g.children.iter().filter_map(pick).collect::<Vec<_>>())
            .collect()
    }

    // ---------------------------------------------------------------
    // Block I/O

    /// Writes `data` (length <= dva.asize) to every copy of `dva`.
    pub fn write(&self, dva: Dva, data: &[u8]) -> Result<(), PoolError> {
        self.write_vectored(dva, &[data])
    }

    /// Writes the concatenation of `bufs` (length <= dva.asize) to `dva`.
    ///
    /// Mirror/disk: every copy; succeeds if at least one copy was written.
    /// Raidz: the data columns plus parity computed over them (bytes up to
    /// `asize` are zeros), one write per device; devices missing or failing
    /// are tolerated up to the parity. Failed devices are faulted.
    ///
    /// `dva` may cover a run of adjacent blocks (the txg writes runs of up
    /// to 8 MiB this way): for raidz each block owns whole rows and parity
    /// is per row, so the run lands exactly as its blocks written one by one.
    pub fn write_vectored(&self, dva: Dva, bufs: &[&[u8]]) -> Result<(), PoolError> {
        self.check_owner()?;
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        assert!(
            len as u64 <= dva.asize as u64,
            "write larger than its allocation"
        );
        let group = self.group(dva.group)?;
        assert!(
            dva.offset + dva.asize as u64 <= group.capacity(),
            "dva beyond group data region"
        );
        if let Some(geo) = group.geometry() {
            return raidz::write(self, &group, geo, dva, bufs);
        }
        let at = self.regions.data_offset + dva.offset;
        // Whole-sector runs go through O_DIRECT from one aligned copy (decision 0004).
        let direct = (dva.offset % SECTOR == 0
            && len as u64 == dva.asize as u64
            && len >= DIRECT_MIN)
            .then(|| {
                // A spare buffer (every byte is overwritten below): a fresh
                // zeroed one per txg run cost page faults and page clearing,
                // a tenth of the daemon's CPU under 4K+FLUSH (decision 0053).
                let mut buf = AlignedBuf::for_read(len);
                buf.as_mut_slice()[len..].fill(0);
                let mut at = 0;
                for b in bufs {
                    buf.as_mut_slice()[at..at + b.len()].copy_from_slice(b);
                    at += b.len();
                }
                buf
            });
        let devices: Vec<Arc<Vdev>> = group.children.iter().filter_map(|c| c.writable()).collect();
        let results = devices
            .iter()
            .map(|dev| match &direct {
                Some(buf) => dev.write_direct_at(at, buf),
                None => dev.write_vectored_at(at, bufs),
            })
            .collect();
        settle_writes(&self.name, dva.group as usize, &devices, results)
    }

    /// The space of `dva` was freed (its txg committed): devices in a
    /// bucket ship it as zeros so compaction can drop it (decision 0054).
    /// Call before the allocator may hand the space out again. A failure
    /// only leaves the bytes live in the bucket, so it is logged, not raised.
    pub fn discard<'a>(&self, dvas: impl IntoIterator<Item = &'a Dva>) {
        if !self.devices().iter().any(|d| d.is_bucket()) {
            return;
        }
        let mut touched: Vec<Arc<Vdev>> = Vec::new();
        for dva in dvas {
            let Ok(group) = self.group(dva.group) else {
                continue;
            };
            if group.geometry().is_some() {
                continue;
            }
            let at = self.regions.data_offset + dva.offset;
            for dev in group.children.iter().filter_map(|c| c.writable()) {
                if !dev.is_bucket() {
                    continue;
                }
                match dev.discard(at, dva.asize as u64) {
                    Ok(()) if !touched.iter().any(|d| Arc::ptr_eq(d, &dev)) => touched.push(dev),
                    Ok(()) => {}
                    Err(e) => tracing::warn!(pool = %self.name, "discarding freed space: {e}"),
                }
            }
        }
        // Shipped now: an idle pool has no later commit to carry them.
        for dev in touched {
            if let Err(e) = dev.sync() {
                tracing::warn!(pool = %self.name, "shipping discarded space: {e}");
            }
        }
    }

    /// Reads `len` bytes of `dva` and returns them once `verify` accepts.
    ///
    /// Mirror: tries each copy until one verifies. Raidz: reads the data
    /// columns; if they do not verify (or a device is missing or fails to
    /// read), reads the parity too and tries reconstructing every
    /// combination of up to `parity` suspect columns until the result
    /// verifies. Copies/columns found wrong are rewritten in place with the
    /// right bytes and their device's CKSUM counter raised (READ for read
    /// errors). Wrong data is never returned: [`PoolError::Unrecoverable`].
    pub fn read_verified(
        &self,
        dva: Dva,
        len: usize,
        verify: impl Fn(&[u8]) -> bool,
    ) -> Result<Vec<u8>, PoolError> {
        let group = self.group(dva.group)?;
        if let Some(geo) = group.geometry() {
            return raidz::repair(self, &group, geo, dva, len, &verify, raidz::Mode::Read)
                .map(|r| r.data);
        }
        check_extent(&group, dva)?;
        let at = self.regions.data_offset + dva.offset;
        let mut bad: Vec<Arc<Vdev>> = Vec::new();
        let mut reason = String::from("no readable copy");
        for dev in group.children.iter().filter_map(|c| c.readable()) {
            let mut buf = vec![0u8; len];
            match dev.read_at(at, &mut buf) {
                Ok(()) if verify(&buf) => {
                    for b in bad {
                        note_heal(&b, at, "healing bad copy");
                        if let Err(e) = b.write_at(at, &buf) {
                            fault(&b, &e);
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

    /// Verifies every copy (mirror) or every column including parity
    /// (raidz) of a block, not just until one verifies: every copy/column
    /// that is wrong or unreadable is rewritten from the good data and
    /// counted (CKSUM, or READ for read errors) on its device. Devices
    /// being resilvered are not examined. A block with no good copy (or
    /// more bad columns than parity) is [`PoolError::Unrecoverable`]; a
    /// disk group's only copy is just verified.
    pub fn scrub_block(
        &self,
        dva: Dva,
        len: usize,
        verify: impl Fn(&[u8]) -> bool,
    ) -> Result<ScrubOutcome, PoolError> {
        let group = self.group(dva.group)?;
        if let Some(geo) = group.geometry() {
            let r = raidz::repair(self, &group, geo, dva, len, &verify, raidz::Mode::Scrub)?;
            return Ok(ScrubOutcome {
                repaired_bytes: r.repaired_bytes,
                bad_devices: r.bad,
            });
        }
        check_extent(&group, dva)?;
        let at = self.regions.data_offset + dva.offset;
        let readers: Vec<(u64, Arc<Vdev>)> = group
            .children
            .iter()
            .filter_map(|c| c.readable().map(|d| (c.guid(), d)))
            .collect();
        // Every copy at once, straight from the disk when aligned (decision 0004).
        let direct = at % SECTOR == 0 && len as u64 % SECTOR == 0;
        let copies: Vec<Result<AlignedBuf, VdevError>> = on_each(&readers, |(_, d)| {
            let mut buf = AlignedBuf::zeroed(len);
            if direct {
                d.read_direct_at(at, &mut buf).map(|()| buf)
            } else {
                d.read_at(at, &mut buf.as_mut_slice()[..len]).map(|()| buf)
            }
        });
        let good = copies
            .iter()
            .position(|c| c.as_ref().is_ok_and(|b| verify(&b[..len])));
        let mut out = ScrubOutcome::default();
        let mut reason = String::from("no readable copy");
        for ((guid, dev), copy) in readers.iter().zip(&copies) {
            let bad = match copy {
                Ok(b)
                    if good.is_some_and(|g| {
                        copies[g].as_ref().is_ok_and(|gb| gb[..len] == b[..len])
                    }) =>
                {
                    false
                }
                Ok(b) if verify(&b[..len]) => false,
                Ok(_) => {
                    dev.errors.checksum.fetch_add(1, Ordering::Relaxed);
                    reason = format!("checksum mismatch on {}", dev.path().display());
                    true
                }
                Err(e) => {
                    reason = e.to_string();
                    true
                }
            };
            if !bad {
                continue;
            }
            out.bad_devices.push(*guid);
            if let Some(Ok(data)) = good.map(|g| &copies[g]) {
                note_heal(dev, at, "scrub: healing bad copy");
                match dev.write_at(at, &data[..len]) {
                    Ok(()) => out.repaired_bytes += len as u64,
                    Err(e) => fault(dev, &e),
                }
            }
        }
        if good.is_none() {
            return Err(PoolError::Unrecoverable {
                group: dva.group,
                offset: dva.offset,
                reason,
            });
        }
        Ok(out)
    }

    /// Rebuilds one block on the device `target_guid` (being resilvered):
    /// reads verified data from the other devices (reconstructing from
    /// parity if needed; bad copies found on the way are healed and counted
    /// as by [`Pool::read_verified`]) and writes only the target's copy or
    /// column. Returns the bytes written to the target. The caller must
    /// keep the block's space from being freed and reused meanwhile.
    pub fn resilver_block(
        &self,
        dva: Dva,
        len: usize,
        verify: impl Fn(&[u8]) -> bool,
        target_guid: u64,
    ) -> Result<u64, PoolError> {
        let group = self.group(dva.group)?;
        let Some(c) = group.position(target_guid) else {
            return Err(PoolError::NoSuchDevice {
                pool: self.name.clone(),
                guid: target_guid,
            });
        };
        if let Some(geo) = group.geometry() {
            let r = raidz::repair(
                self,
                &group,
                geo,
                dva,
                len,
                &verify,
                raidz::Mode::Resilver(c),
            )?;
            return Ok(r.written);
        }
        check_extent(&group, dva)?;
        let target = group.children[c]
            .writable()
            .ok_or(PoolError::NoSuchDevice {
                pool: self.name.clone(),
                guid: target_guid,
            })?;
        let at = self.regions.data_offset + dva.offset;
        let mut reason = String::from("no readable copy besides the target");
        for (i, child) in group.children.iter().enumerate() {
            let Some(dev) = child.readable().filter(|_| i != c) else {
                continue;
            };
            let mut buf = vec![0u8; len];
            match dev.read_at(at, &mut buf) {
                Ok(()) if verify(&buf) => {
                    target.write_at(at, &buf)?;
                    return Ok(len as u64);
                }
                Ok(()) => {
                    dev.errors.checksum.fetch_add(1, Ordering::Relaxed);
                    reason = format!("checksum mismatch on {}", dev.path().display());
                }
                Err(e) => reason = e.to_string(),
            }
        }
        Err(PoolError::Unrecoverable {
            group: dva.group,
            offset: dva.offset,
            reason,
        })
    }

    /// Reads a run of adjacent blocks (`len` bytes of the group's data space
    /// from `offset`) without verifying: callers verify each block and fall
    /// back to [`Pool::read_verified`] (which heals) for any that fail.
    /// Mirror: the first readable copy. Raidz: one read per device holding
    /// data in the run; with devices missing or failing (up to parity), the
    /// parity is read too and the data reconstructed.
    pub fn read_run(&self, group: u32, offset: u64, len: usize) -> Result<AlignedBuf, PoolError> {
        let g = self.group(group)?;
        if let Some(geo) = g.geometry() {
            return raidz::read_run(self, &g, geo, offset, len);
        }
        self.read_mirror_run(&g, group, offset, len, |dev, at| {
            let mut buf = AlignedBuf::for_read(len);
            dev.read_direct_at(at, &mut buf).map(|()| buf)
        })
    }

    /// Reads a run of mirror group `g` with `read(device, device offset)`
    /// from the first readable side that gives it. Sides take turns by
    /// 1 MiB of offset, so that concurrent runs (prefetch workers,
    /// requests) keep every side busy.
    fn read_mirror_run<T>(
        &self,
        g: &Group,
        group: u32,
        offset: u64,
        len: usize,
        mut read: impl FnMut(&Vdev, u64) -> Result<T, VdevError>,
    ) -> Result<T, PoolError> {
        check_extent(
            g,
            Dva {
                group,
                offset,
                asize: len.min(u32::MAX as usize) as u32,
            },
        )?;
        let at = self.regions.data_offset + offset;
        let mut last = None;
        let n = g.children.len().max(1);
        let start = (offset >> 20) as usize % n;
        let sides = g.children.iter().cycle().skip(start).take(n);
        for dev in sides.filter_map(|c| c.readable()) {
            match read(&dev, at) {
                Ok(v) => return Ok(v),
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

    /// [`Pool::read_run`] into the caller's buffers, in order (their lengths
    /// add up to the run's): one scatter read of a mirror side straight into
    /// them (decision 0069). Raidz runs are read and reconstructed as
    /// usual, then copied. Unverified, as `read_run`.
    pub fn read_run_into(
        &self,
        group: u32,
        offset: u64,
        bufs: &mut [&mut [u8]],
    ) -> Result<(), PoolError> {
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        let g = self.group(group)?;
        if g.geometry().is_some() {
            let run = self.read_run(group, offset, len)?;
            let mut at = 0;
            for b in bufs.iter_mut() {
                let n = b.len();
                b.copy_from_slice(&run[at..at + n]);
                at += n;
            }
            return Ok(());
        }
        // The same side as `read_run` would take.
        self.read_mirror_run(&g, group, offset, len, |dev, at| {
            dev.read_direct_vectored(at, bufs)
        })
    }

    /// Makes every completed write on every device durable, devices in parallel.
    pub fn sync_all(&self) -> Result<(), PoolError> {
        self.check_owner()?;
        let devices: Vec<Arc<Vdev>> = self.devices().into_iter().filter(|d| is_live(d)).collect();
        let results = on_each(&devices, |d| d.sync());
        // A device whose sync failed may have lost what was written to it.
        settle_writes(&self.name, 0, &devices, results)
    }

    /// The metadata region, mirrored on every device.
    pub fn meta_region(self: &Arc<Self>) -> MirroredRegion {
        MirroredRegion {
            pool: self.clone(),
            offset: self.regions.meta_offset,
            size: self.regions.meta_size,
            log_group: None,
        }
    }

    /// The intent-log region, mirrored on every device.
    pub fn log_region(self: &Arc<Self>) -> MirroredRegion {
        MirroredRegion {
            pool: self.clone(),
            offset: self.regions.log_offset,
            size: self.regions.log_size,
            log_group: None,
        }
    }
}

/// A DVA read from disk must lie inside its group (never trusted blindly).
fn check_extent(group: &Group, dva: Dva) -> Result<(), PoolError> {
    let unit = group.unit();
    let ok = dva.asize > 0
        && dva.offset % unit == 0
        && dva.asize as u64 % unit == 0
        && dva
            .offset
            .checked_add(dva.asize as u64)
            .is_some_and(|end| end <= group.capacity());
    if ok {
        Ok(())
    } else {
        Err(PoolError::Unrecoverable {
            group: dva.group,
            offset: dva.offset,
            reason: format!(
                "address {}+{} is not a valid extent of the group (capacity {}, unit {unit})",
                dva.offset,
                dva.asize,
                group.capacity()
            ),
        })
    }
}

/// A byte range at the same place on every device of the pool, written to
/// all of them (devices being resilvered included) and read from the first
/// readable one that answers. Used for the metadata store and the intent
/// log, which are kept at least as redundant as data (decision 0001).
#[derive(Clone)]
pub struct MirroredRegion {
    pool: Arc<Pool>,
    offset: u64,
    size: u64,
    /// A SLOG: the region lies on this log group's devices only, not on
    /// every data device.
    log_group: Option<Arc<Group>>,
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

/// Devices an asynchronous durable write goes to, with the region's shared
/// lock held ([`MirroredRegion::start_durable`]).
pub struct DurableWrite {
    pool: Arc<Pool>,
    pub targets: Vec<DurableTarget>,
}

/// One copy of an asynchronous durable write.
pub struct DurableTarget {
    pub vdev: Arc<Vdev>,
    /// The O_DSYNC descriptor, and the O_DIRECT one where the device has it.
    pub dsync_fd: std::os::fd::RawFd,
    pub direct_fd: Option<std::os::fd::RawFd>,
    /// Device offset of the region's start.
    pub offset: u64,
}

impl DurableWrite {
    /// The writes are done: per piece, its length and one result per
    /// target. A device that failed a piece another device took is
    /// FAULTED, as for [`MirroredRegion::write_durable`]; `Err` when a
    /// piece reached no device. Releases the region's lock.
    pub fn finish(
        self,
        pieces: Vec<(usize, Vec<std::io::Result<()>>)>,
        started: std::time::Instant,
    ) -> Result<(), PoolError> {
        let devices: Vec<Arc<Vdev>> = self.targets.iter().map(|t| t.vdev.clone()).collect();
        let mut outcome = Ok(());
        for (len, results) in pieces {
            let results = self
                .targets
                .iter()
                .zip(results)
                .map(|(t, r)| match r {
                    Ok(()) => {
                        t.vdev.durable_write_done(len, started);
                        Ok(())
                    }
                    Err(source) => {
                        t.vdev.errors.write.fetch_add(1, Ordering::Relaxed);
                        Err(VdevError::Io {
                            path: t.vdev.path().to_path_buf(),
                            op: "write",
                            offset: t.offset,
                            source,
                        })
                    }
                })
                .collect();
            if let Err(e) = settle_writes(&self.pool.name, 0, &devices, results) {
                outcome = Err(e);
            }
        }
        outcome
    }
}

impl Drop for DurableWrite {
    fn drop(&mut self) {
        use parking_lot::lock_api::RawRwLock as _;
        // SAFETY: taken in `start_durable` for this value, released once here.
        unsafe { self.pool.region_lock.raw().unlock_shared() };
    }
}

impl MirroredRegion {
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Byte offset of the region on every device.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Some device holding the region can be read.
    pub fn available(&self) -> bool {
        !self.holders(Child::readable).is_empty()
    }

    /// The log group's tag when the region is a SLOG, else 0 (the main devices).
    pub fn log_tag(&self) -> u64 {
        self.log_group.as_ref().map_or(0, |g| Pool::log_tag(g))
    }

    /// Devices that hold the region: readable (trusted) or writable ones.
    fn holders(&self, pick: fn(&Child) -> Option<Arc<Vdev>>) -> Vec<Arc<Vdev>> {
        match &self.log_group {
            Some(g) => g.children.iter().filter_map(pick).collect(),
            None => self.pool.region_devices(pick),
        }
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

    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), PoolError> {
        let at = self.check(offset, data.len())?;
        self.pool.check_owner()?;
        let _shared = self.pool.region_lock.read();
        let devices = self.holders(Child::writable);
        let results = devices.iter().map(|d| d.write_at(at, data)).collect();
        settle_writes(&self.pool.name, 0, &devices, results)
    }

    /// Writes to every device in parallel, each write durable on return.
    pub fn write_durable(&self, offset: u64, data: &[u8]) -> Result<(), PoolError> {
        let at = self.check(offset, data.len())?;
        self.pool.check_owner()?;
        let _shared = self.pool.region_lock.read();
        let devices = self.holders(Child::writable);
        let results = on_each(&devices, |d| d.write_durable_at(at, data));
        settle_writes(&self.pool.name, 0, &devices, results)
    }

    /// Where an asynchronous durable write of `len` bytes at `offset` goes
    /// (the intent log's io_uring path, decision 0068): one descriptor and
    /// device offset per writable holder. The region's shared lock is held
    /// until the returned value is dropped, as [`MirroredRegion::write_durable`]
    /// holds it for its write. `Ok(None)`: take the blocking way (a bucket
    /// device, or the region is being copied).
    pub fn start_durable(
        &self,
        offset: u64,
        len: usize,
    ) -> Result<Option<DurableWrite>, PoolError> {
        use parking_lot::lock_api::RawRwLock as _;
        let at = self.check(offset, len)?;
        self.pool.check_owner()?;
        // SAFETY: the shared lock taken here is released exactly once, by
        // `DurableWrite`'s drop (parking_lot's raw lock may be released on
        // another thread than the one that took it).
        let raw = unsafe { self.pool.region_lock.raw() };
        if !raw.try_lock_shared() {
            return Ok(None);
        }
        // Built first so that every return below releases the lock.
        let mut write = DurableWrite {
            pool: self.pool.clone(),
            targets: Vec::new(),
        };
        for d in self.holders(Child::writable) {
            match d.durable_write_fd(false) {
                Some(fd) if d.in_range(at, len) => write.targets.push(DurableTarget {
                    direct_fd: d.durable_write_fd(true),
                    dsync_fd: fd,
                    offset: at,
                    vdev: d,
                }),
                _ => return Ok(None),
            }
        }
        if write.targets.is_empty() {
            return Ok(None);
        }
        Ok(Some(write))
    }

    /// Reads from the first device that answers.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), PoolError> {
        self.read_verified(offset, buf, |_| true)
    }

    /// Reads from each device in turn until `verify` accepts; heals the
    /// others and raises their CKSUM counter.
    pub fn read_verified(
        &self,
        offset: u64,
        buf: &mut [u8],
        verify: impl Fn(&[u8]) -> bool,
    ) -> Result<(), PoolError> {
        let at = self.check(offset, buf.len())?;
        let mut bad: Vec<(Arc<Vdev>, bool)> = Vec::new();
        let mut reason = String::from("no readable device");
        for dev in self.holders(Child::readable) {
            match dev.read_at(at, buf) {
                Ok(()) if verify(buf) => {
                    for (b, mismatch) in bad {
                        if mismatch {
                            b.errors.checksum.fetch_add(1, Ordering::Relaxed);
                        }
                        note_heal(&b, at, "healing bad region copy");
                        let _ = b.write_at(at, buf);
                    }
                    return Ok(());
                }
                // Counted only once another copy proves this one wrong: callers
                // also probe past the end of the log, where no copy verifies.
                Ok(()) => {
                    reason = format!("checksum mismatch on {}", dev.path().display());
                    bad.push((dev, true));
                }
                Err(e) => {
                    reason = e.to_string();
                    bad.push((dev, false));
                }
            }
        }
        Err(PoolError::Unrecoverable {
            group: u32::MAX,
            offset,
            reason,
        })
    }

    /// Reads every device's copy of `len` bytes at `offset` (devices being
    /// resilvered included), and rewrites every copy that `verify` refuses
    /// or that fails to read with a copy that verifies. CKSUM is counted on
    /// readable devices whose copy was wrong, not on resilvering ones.
    /// Returns the good bytes and what was repaired; no good copy is
    /// [`PoolError::Unrecoverable`] (nothing is rewritten then).
    pub fn scrub(
        &self,
        offset: u64,
        len: usize,
        verify: impl Fn(&[u8]) -> bool,
    ) -> Result<(Vec<u8>, ScrubOutcome), PoolError> {
        let (good, out, lost) = self.scrub_pages(offset, len, len.max(1), |_, b| verify(b))?;
        if !lost.is_empty() {
            return Err(PoolError::Unrecoverable {
                group: u32::MAX,
                offset,
                reason: "no copy of the region range verifies".into(),
            });
        }
        Ok((good, out))
    }

    /// [`MirroredRegion::scrub`] page by page: reads each device's copy of
    /// the whole range once, then for each `page`-byte page (`verify` gets
    /// its index in the range) rewrites only the copies of that page that
    /// are wrong, from one that verifies. Returns the best bytes (pages
    /// without a good copy as the first device read them), what was
    /// repaired, and the indexes of pages with no good copy.
    pub fn scrub_pages(
        &self,
        offset: u64,
        len: usize,
        page: usize,
        verify: impl Fn(usize, &[u8]) -> bool,
    ) -> Result<(Vec<u8>, ScrubOutcome, Vec<usize>), PoolError> {
        assert!(page > 0);
        let at = self.check(offset, len)?;
        // (guid, device, resilvering, what it holds)
        type Copy = (u64, Arc<Vdev>, bool, Result<Vec<u8>, VdevError>);
        let mut copies: Vec<Copy> = Vec::new();
        let groups = match &self.log_group {
            Some(g) => vec![g.clone()],
            None => self.pool.groups(),
        };
        for g in groups {
            for c in &g.children {
                let Some(dev) = c.writable() else { continue };
                let mut buf = vec![0u8; len];
                let r = dev.read_at(at, &mut buf).map(|()| buf);
                copies.push((c.guid(), dev, c.resilvering(), r));
            }
        }
        // Trusted devices first: a resilvering copy is used only if no other verifies.
        copies.sort_by_key(|c| c.2);
        let mut best = copies
            .iter()
            .find_map(|c| c.3.as_ref().ok().cloned())
            .unwrap_or_else(|| vec![0u8; len]);
        let mut out = ScrubOutcome::default();
        let mut lost = Vec::new();
        for (i, start) in (0..len).step_by(page).enumerate() {
            let end = (start + page).min(len);
            let good = copies.iter().find_map(|c| {
                c.3.as_ref()
                    .ok()
                    .map(|b| &b[start..end])
                    .filter(|b| verify(i, b))
            });
            let Some(good) = good else {
                lost.push(i);
                continue;
            };
            best[start..end].copy_from_slice(good);
            for (guid, dev, resilvering, copy) in &copies {
                let wrong = match copy {
                    Ok(b) => !verify(i, &b[start..end]),
                    Err(_) => true,
                };
                if !wrong {
                    continue;
                }
                if !resilvering {
                    if copy.is_ok() {
                        dev.errors.checksum.fetch_add(1, Ordering::Relaxed);
                    }
                    if !out.bad_devices.contains(guid) {
                        out.bad_devices.push(*guid);
                    }
                }
                note_heal(dev, at + start as u64, "scrub: healing region copy");
                match dev.write_at(at + start as u64, good) {
                    Ok(()) => out.repaired_bytes += (end - start) as u64,
                    Err(e) => fault(dev, &e),
                }
            }
        }
        Ok((best, out, lost))
    }

    pub fn sync(&self) -> Result<(), PoolError> {
        self.pool.sync_all()
    }
}

#[cfg(test)]
mod tests;

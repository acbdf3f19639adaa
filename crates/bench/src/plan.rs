//! `cistern pool plan`: the layouts N drives can make, with their capacity,
//! the failures they survive and their predicted speed, before the drives
//! are bought. Pure arithmetic; the per-drive figures come from the user or
//! from [`crate::measure`].
//!
//! # Capacity
//!
//! Every drive carries what `pool::Pool::create` puts on it: a label at each
//! end ([`LABEL_SIZE`] each), the metadata region (size/16, clamped to
//! 16 MiB..4 GiB) and the intent-log region (size/32, clamped to
//! 16 MiB..512 MiB), both rounded down to a 4 KiB sector. The rest, rounded
//! down to a sector, is the drive's data region ([`DeviceRegions`]).
//!
//! A block of `k` sectors goes into a group of width `w` with `p` parity
//! columns in `ceil(k / (w - p))` whole rows of `w` sectors: parity and
//! padding included, every device of the group gives `rows` sectors to it.
//! A mirror (`w - p` counted as 1: every device holds a whole copy) and a
//! single drive give `k` sectors per device. So a group holds
//! `floor(data sectors per device / rows)` blocks, and the layout's usable
//! capacity is `groups x that x block size`: what volumes with that
//! volblocksize and incompressible data can store. Compressed blocks are
//! smaller and are padded the same way, row by row. Volumes can fill all but
//! 1/32 of it (the engine keeps that free): `available`.
//!
//! # Speed
//!
//! Per drive: random read and write IOPS (small blocks) and streaming read
//! and write MB/s. Per layout, with `d` drives in `g` groups of width `w`:
//!
//! | layout | random read | random write | streaming read | streaming write |
//! |--------|-------------|--------------|----------------|-----------------|
//! | stripe | d x iops    | d x iops     | d x MB/s       | d x MB/s        |
//! | mirror | d x iops    | g x iops     | d x MB/s       | g x MB/s        |
//! | raidz  | g x iops    | g x iops     | g(w-p) x MB/s  | g(w-p) x MB/s   |
//!
//! A mirror reads a block from any one copy but writes every copy; a raidz
//! block touches every device of its group, so the group does one random
//! operation at a time like one drive, while a stream is cut across its
//! data columns. Spare drives add nothing.

use serde::Serialize;

pub use pool::{LABEL_SIZE, MIN_DEVICE_SIZE, SECTOR};

/// Share of the usable capacity the engine keeps free (`size / 32`).
pub const RESERVE_DIVISOR: u64 = 32;

/// Drives a plan accepts (a bound on the work, not on any real pool).
pub const MAX_DRIVES: u32 = 10_000;

/// A kind of group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Single drives, striped: no redundancy.
    Stripe,
    /// 2-way mirrors.
    Mirror2,
    /// 3-way mirrors.
    Mirror3,
    /// Single parity.
    Raidz1,
    /// Double parity.
    Raidz2,
    /// Triple parity.
    Raidz3,
}

impl Family {
    pub const ALL: [Family; 6] = [
        Family::Stripe,
        Family::Mirror2,
        Family::Mirror3,
        Family::Raidz1,
        Family::Raidz2,
        Family::Raidz3,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Family::Stripe => "stripe",
            Family::Mirror2 => "mirror2",
            Family::Mirror3 => "mirror3",
            Family::Raidz1 => "raidz1",
            Family::Raidz2 => "raidz2",
            Family::Raidz3 => "raidz3",
        }
    }

    /// Parses a name: the [`Family::name`]s and `mirror` (2-way),
    /// `mirror-2`, `mirror-3`, `raidz` (single parity).
    pub fn parse(s: &str) -> Result<Family, PlanError> {
        let f = match s.trim().to_ascii_lowercase().as_str() {
            "stripe" => Family::Stripe,
            "mirror" | "mirror2" | "mirror-2" => Family::Mirror2,
            "mirror3" | "mirror-3" => Family::Mirror3,
            "raidz" | "raidz1" => Family::Raidz1,
            "raidz2" => Family::Raidz2,
            "raidz3" => Family::Raidz3,
            _ => return Err(PlanError::UnknownLayout(s.trim().to_string())),
        };
        Ok(f)
    }

    /// Drives of a group that may fail without losing it.
    pub fn redundancy(self) -> u32 {
        match self {
            Family::Stripe => 0,
            Family::Mirror2 | Family::Raidz1 => 1,
            Family::Mirror3 | Family::Raidz2 => 2,
            Family::Raidz3 => 3,
        }
    }

    pub fn is_raidz(self) -> bool {
        matches!(self, Family::Raidz1 | Family::Raidz2 | Family::Raidz3)
    }

    pub fn is_mirror(self) -> bool {
        matches!(self, Family::Mirror2 | Family::Mirror3)
    }

    /// The group width of a stripe or mirror; None for raidz (any width
    /// from parity + 2).
    pub fn fixed_width(self) -> Option<u32> {
        match self {
            Family::Stripe => Some(1),
            Family::Mirror2 => Some(2),
            Family::Mirror3 => Some(3),
            _ => None,
        }
    }

    /// The narrowest group: a raidz group has at least two data columns
    /// (narrower is a mirror with extra work).
    pub fn min_width(self) -> u32 {
        self.fixed_width().unwrap_or(self.redundancy() + 2)
    }

    /// Data sectors in one row of a group of `width`: a stripe or a mirror
    /// holds a whole block on each device (1), raidz `width - parity`.
    pub fn data_columns(self, width: u32) -> u32 {
        if self.is_raidz() {
            width - self.redundancy()
        } else {
            1
        }
    }
}

/// Parses `a,b,c` into families (in the order given, without repeats).
pub fn parse_families(s: &str) -> Result<Vec<Family>, PlanError> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let f = Family::parse(part)?;
        if !out.contains(&f) {
            out.push(f);
        }
    }
    if out.is_empty() {
        return Err(PlanError::UnknownLayout(s.to_string()));
    }
    Ok(out)
}

/// One drive as the plan sees it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Drive {
    /// Bytes.
    pub size: u64,
    /// Random small-block reads per second.
    pub read_iops: f64,
    /// Random small-block (synchronous) writes per second.
    pub write_iops: f64,
    /// Streaming reads, MB/s (10^6 bytes).
    pub read_mbps: f64,
    /// Streaming writes, MB/s.
    pub write_mbps: f64,
}

/// What to plan for.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Drives bought, spares included.
    pub drives: u32,
    /// Drives kept out of the layout.
    pub spares: u32,
    pub drive: Drive,
    /// The volblocksize capacity is computed for (a multiple of 4 KiB).
    pub block_size: u64,
    /// Families to consider (empty: all).
    pub families: Vec<Family>,
    /// Narrowest and widest raidz group.
    pub min_width: Option<u32>,
    pub max_width: Option<u32>,
}

/// What `Pool::create` does with one drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DeviceRegions {
    pub size: u64,
    /// Both labels together.
    pub labels: u64,
    pub metadata: u64,
    pub intent_log: u64,
    /// The data region: what groups allocate blocks from.
    pub data: u64,
}

/// The regions `pool::Pool::create` lays out on a drive of `size` bytes
/// (the same arithmetic as its `plan_regions`; a test holds them equal).
pub fn device_regions(size: u64) -> DeviceRegions {
    let round = |v: u64| v / SECTOR * SECTOR;
    let metadata = round((size / 16).clamp(16 << 20, 4 << 30));
    let intent_log = round((size / 32).clamp(16 << 20, 512 << 20));
    let labels = 2 * LABEL_SIZE;
    let data = round(size.saturating_sub(labels + metadata + intent_log));
    DeviceRegions {
        size,
        labels,
        metadata,
        intent_log,
        data,
    }
}

/// One layout and what it is predicted to give.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Layout {
    pub family: Family,
    /// `2x raidz2-6`, `6x mirror2`, `12x stripe`.
    pub name: String,
    pub groups: u32,
    pub width: u32,
    /// Drives in the layout (groups x width).
    pub drives: u32,
    pub spares: u32,
    /// Drives whose share is data: groups x (width - parity) for raidz,
    /// groups for mirrors, every drive for a stripe.
    pub data_drives: u32,
    /// Drives of a group that may fail.
    pub lose_per_group: u32,
    /// Drives that may fail whichever they are (= per group).
    pub lose_any: u32,
    /// Drives that may fail at best (per group, in every group).
    pub lose_max: u32,
    /// Sectors one block takes on the group (parity and padding included).
    pub sectors_per_block: u64,
    /// What the block would take without padding (k x width / data columns).
    pub sectors_per_block_unpadded: f64,
    /// Bytes of volume data the layout holds at the block size.
    pub usable_bytes: u64,
    /// `usable_bytes` less the 1/32 the engine keeps free.
    pub available_bytes: u64,
    /// usable / the bytes of every drive bought (spares included), percent.
    pub efficiency_pct: f64,
    pub random_read_iops: f64,
    pub random_write_iops: f64,
    pub seq_read_mbps: f64,
    pub seq_write_mbps: f64,
    /// Flags: no redundancy, padding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Every layout that fits, and why the families asked for did not.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub drives: u32,
    pub spares: u32,
    pub drive: Drive,
    pub block_size: u64,
    pub regions: DeviceRegions,
    pub layouts: Vec<Layout>,
    /// Families asked for that have no layout here, with the reason.
    pub skipped: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("-n/--drives must be at least 1 (got {0})")]
    NoDrives(u32),
    #[error("-n/--drives must be at most {MAX_DRIVES} (got {0})")]
    TooManyDrives(u32),
    #[error("--spares {spares} leaves no drive of {drives} for the pool")]
    AllSpares { drives: u32, spares: u32 },
    #[error("drive size {0} bytes is below the smallest device a pool takes ({MIN_DEVICE_SIZE} bytes, 64M)")]
    DriveTooSmall(u64),
    #[error("{what} must be a positive number (got {value})")]
    BadRate { what: &'static str, value: f64 },
    #[error("--block-size must be a multiple of 4K from 4K to 16M (got {0})")]
    BadBlockSize(u64),
    #[error("unknown layout '{0}' (valid: stripe, mirror2 (or mirror), mirror3, raidz1 (or raidz), raidz2, raidz3)")]
    UnknownLayout(String),
    #[error("--min-width {min} is above --max-width {max}")]
    BadWidths { min: u32, max: u32 },
    #[error("no layout fits: {0}")]
    NothingFits(String),
}

fn check(req: &Request) -> Result<(), PlanError> {
    if req.drives == 0 {
        return Err(PlanError::NoDrives(req.drives));
    }
    if req.drives > MAX_DRIVES {
        return Err(PlanError::TooManyDrives(req.drives));
    }
    if req.spares >= req.drives {
        return Err(PlanError::AllSpares {
            drives: req.drives,
            spares: req.spares,
        });
    }
    if req.drive.size < MIN_DEVICE_SIZE {
        return Err(PlanError::DriveTooSmall(req.drive.size));
    }
    for (what, value) in [
        ("read IOPS", req.drive.read_iops),
        ("write IOPS", req.drive.write_iops),
        ("read MB/s", req.drive.read_mbps),
        ("write MB/s", req.drive.write_mbps),
    ] {
        if !(value.is_finite() && value > 0.0) {
            return Err(PlanError::BadRate { what, value });
        }
    }
    let bs = req.block_size;
    if bs == 0 || bs % SECTOR != 0 || bs > 16 << 20 {
        return Err(PlanError::BadBlockSize(bs));
    }
    if let (Some(min), Some(max)) = (req.min_width, req.max_width) {
        if min > max {
            return Err(PlanError::BadWidths { min, max });
        }
    }
    Ok(())
}

/// The layout of `groups` groups of `width` drives of `family`.
pub fn layout(req: &Request, family: Family, groups: u32, width: u32) -> Layout {
    let d = &req.drive;
    let regions = device_regions(d.size);
    let drives = groups * width;
    let parity = family.redundancy();
    let cols = family.data_columns(width);
    let k = req.block_size / SECTOR;
    let rows = k.div_ceil(u64::from(cols));
    let group_blocks = regions.data / SECTOR / rows;
    let usable = u64::from(groups) * group_blocks * req.block_size;
    let data_drives = match family {
        Family::Stripe => drives,
        Family::Mirror2 | Family::Mirror3 => groups,
        _ => groups * cols,
    };
    let (g, n) = (f64::from(groups), f64::from(drives));
    let (rr, rw, sr, sw) = match family {
        Family::Stripe => (
            n * d.read_iops,
            n * d.write_iops,
            n * d.read_mbps,
            n * d.write_mbps,
        ),
        Family::Mirror2 | Family::Mirror3 => (
            n * d.read_iops,
            g * d.write_iops,
            n * d.read_mbps,
            g * d.write_mbps,
        ),
        _ => {
            let data = f64::from(data_drives);
            (
                g * d.read_iops,
                g * d.write_iops,
                data * d.read_mbps,
                data * d.write_mbps,
            )
        }
    };
    // Sectors a block takes on the group: every device gives it `rows`
    // (a stripe's group is one device).
    let sectors_per_block = rows * u64::from(width);
    let unpadded = if family.is_mirror() {
        (k * u64::from(width)) as f64
    } else {
        k as f64 * f64::from(width) / f64::from(cols)
    };
    let name = if family.is_raidz() {
        format!("{groups}x {}-{width}", family.name())
    } else {
        format!("{groups}x {}", family.name())
    };
    let note = if family == Family::Stripe {
        Some("no redundancy".to_string())
    } else if (sectors_per_block as f64) > unpadded + 1e-9 {
        Some(format!(
            "padding: a {} block takes {}",
            short_size(req.block_size),
            short_size(sectors_per_block * SECTOR)
        ))
    } else {
        None
    };
    let raw_all = u128::from(d.size) * u128::from(drives + req.spares);
    Layout {
        family,
        name,
        groups,
        width,
        drives,
        spares: req.spares,
        data_drives,
        lose_per_group: parity,
        lose_any: parity,
        lose_max: parity * groups,
        sectors_per_block,
        sectors_per_block_unpadded: unpadded,
        usable_bytes: usable,
        available_bytes: usable - usable / RESERVE_DIVISOR,
        efficiency_pct: (usable as f64 / raw_all as f64) * 100.0,
        random_read_iops: rr,
        random_write_iops: rw,
        seq_read_mbps: sr,
        seq_write_mbps: sw,
        note,
    }
}

/// `16K`, `48K`, `1M`: block sizes in notes.
fn short_size(b: u64) -> String {
    if b % (1 << 20) == 0 {
        format!("{}M", b >> 20)
    } else if b % (1 << 10) == 0 {
        format!("{}K", b >> 10)
    } else {
        format!("{b}B")
    }
}

/// Every layout of the drives (less spares) in equal groups: a stripe, 2-
/// and 3-way mirrors, raidz1/2/3 of every width from parity + 2 that
/// divides the drive count (within the width bounds). Sorted by usable
/// capacity, largest first (see [`sort`]).
pub fn plan(req: &Request) -> Result<Plan, PlanError> {
    check(req)?;
    let d = req.drives - req.spares;
    let families: Vec<Family> = if req.families.is_empty() {
        Family::ALL.to_vec()
    } else {
        req.families.clone()
    };
    let min_w = req.min_width.unwrap_or(0);
    let max_w = req.max_width.unwrap_or(u32::MAX);
    let mut layouts = Vec::new();
    let mut skipped = Vec::new();
    let spare_hint = |w: u32| {
        let r = d % w;
        if r == 0 {
            String::new()
        } else {
            format!(" (--spares {} would leave {})", req.spares + r, d - r)
        }
    };
    for f in families {
        let before = layouts.len();
        if let Some(w) = f.fixed_width() {
            if d % w == 0 {
                layouts.push(layout(req, f, d / w, w));
            } else {
                skipped.push(format!(
                    "{}: {d} drives are not a multiple of {w}{}",
                    f.name(),
                    spare_hint(w)
                ));
            }
            continue;
        }
        let lo = f.min_width().max(min_w);
        let hi = d.min(max_w);
        for w in lo..=hi {
            if d % w == 0 {
                layouts.push(layout(req, f, d / w, w));
            }
        }
        if layouts.len() == before {
            let why = if d < f.min_width() {
                format!(
                    "{}: a group needs at least {} drives, there are {d}",
                    f.name(),
                    f.min_width()
                )
            } else {
                format!(
                    "{}: no group width from {lo} to {hi} divides {d} drives",
                    f.name()
                )
            };
            skipped.push(why);
        }
    }
    if layouts.is_empty() {
        return Err(PlanError::NothingFits(skipped.join("; ")));
    }
    sort(&mut layouts, SortKey::Usable);
    Ok(Plan {
        drives: req.drives,
        spares: req.spares,
        drive: req.drive,
        block_size: req.block_size,
        regions: device_regions(req.drive.size),
        layouts,
        skipped,
    })
}

/// What to sort layouts by: the largest value first (better first), the
/// layout name alphabetically.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKey {
    Layout,
    Usable,
    Efficiency,
    Lose,
    LoseMax,
    RandomRead,
    RandomWrite,
    SeqRead,
    SeqWrite,
    Groups,
    Width,
}

impl SortKey {
    pub const NAMES: &'static str =
        "layout, usable, eff, lose, lose-max, riops, wiops, rmbps, wmbps, groups, width";

    pub fn parse(s: &str) -> Option<SortKey> {
        let k = match s.trim().to_ascii_lowercase().as_str() {
            "layout" | "name" => SortKey::Layout,
            "usable" | "size" | "capacity" | "avail" => SortKey::Usable,
            "eff" | "efficiency" => SortKey::Efficiency,
            "lose" => SortKey::Lose,
            "lose-max" => SortKey::LoseMax,
            "riops" => SortKey::RandomRead,
            "wiops" => SortKey::RandomWrite,
            "rmbps" => SortKey::SeqRead,
            "wmbps" => SortKey::SeqWrite,
            "groups" => SortKey::Groups,
            "width" => SortKey::Width,
            _ => return None,
        };
        Some(k)
    }
}

/// Sorts by `key` (largest first; layout names A-Z), then by capacity,
/// family and width so the order is total and stable.
pub fn sort(layouts: &mut [Layout], key: SortKey) {
    use std::cmp::Ordering;
    let num = |l: &Layout| -> f64 {
        match key {
            SortKey::Layout => 0.0,
            SortKey::Usable => l.usable_bytes as f64,
            SortKey::Efficiency => l.efficiency_pct,
            SortKey::Lose => f64::from(l.lose_any),
            SortKey::LoseMax => f64::from(l.lose_max),
            SortKey::RandomRead => l.random_read_iops,
            SortKey::RandomWrite => l.random_write_iops,
            SortKey::SeqRead => l.seq_read_mbps,
            SortKey::SeqWrite => l.seq_write_mbps,
            SortKey::Groups => f64::from(l.groups),
            SortKey::Width => f64::from(l.width),
        }
    };
    layouts.sort_by(|a, b| {
        let first = if key == SortKey::Layout {
            (a.family, a.width).cmp(&(b.family, b.width))
        } else {
            num(b).partial_cmp(&num(a)).unwrap_or(Ordering::Equal)
        };
        first
            .then(b.usable_bytes.cmp(&a.usable_bytes))
            .then(a.family.cmp(&b.family))
            .then(a.width.cmp(&b.width))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1 << 40;

    fn req(drives: u32, size: u64) -> Request {
        Request {
            drives,
            spares: 0,
            drive: Drive {
                size,
                read_iops: 180.0,
                write_iops: 180.0,
                read_mbps: 250.0,
                write_mbps: 250.0,
            },
            block_size: 16 << 10,
            families: Vec::new(),
            min_width: None,
            max_width: None,
        }
    }

    fn find<'a>(p: &'a Plan, name: &str) -> &'a Layout {
        p.layouts
            .iter()
            .find(|l| l.name == name)
            .unwrap_or_else(|| panic!("{name} not in {:?}", names(p)))
    }

    fn names(p: &Plan) -> Vec<&str> {
        p.layouts.iter().map(|l| l.name.as_str()).collect()
    }

    #[test]
    fn regions_of_an_8t_drive() {
        let r = device_regions(8 * T);
        assert_eq!(r.metadata, 4 << 30, "size/16 clamped to 4G");
        assert_eq!(r.intent_log, 512 << 20, "size/32 clamped to 512M");
        assert_eq!(r.labels, 512 << 10);
        assert_eq!(r.data, 8 * T - (4 << 30) - (512 << 20) - (512 << 10));
        // A small drive: both regions at their 16M floor.
        let r = device_regions(128 << 20);
        assert_eq!((r.metadata, r.intent_log), (16 << 20, 16 << 20));
        // In between: the fractions, rounded to a sector.
        let r = device_regions(10 << 30);
        assert_eq!(r.metadata, 640 << 20);
        assert_eq!(r.intent_log, 320 << 20);
    }

    /// The planner's regions are the pool's: a real pool on one sparse
    /// device has exactly the planned data region.
    #[test]
    fn regions_match_a_real_pool() {
        let dir = tempfile::tempdir().unwrap();
        for size in [64u64 << 20, (1 << 30) + 12_345] {
            let path = dir.path().join(format!("d{size}"));
            let dev = pool::Vdev::open_or_create(&path, Some(size)).unwrap();
            let size = dev.size();
            let p = pool::Pool::create("t", vec![(pool::LayoutKind::Disk, vec![dev])]).unwrap();
            assert_eq!(p.size(), device_regions(size).data, "size {size}");
        }
    }

    #[test]
    fn twelve_8t_drives() {
        let p = plan(&req(12, 8 * T)).unwrap();
        let data = device_regions(8 * T).data;
        // Sorted by capacity (D = one drive's data region): 12D, then 8D
        // (raidz1-3 and -6, raidz2-6), 6D, 4D; ties by family and width.
        assert_eq!(
            names(&p),
            [
                "12x stripe",
                "4x raidz1-3",
                "2x raidz1-6",
                "2x raidz2-6",
                "6x mirror2",
                "3x raidz1-4",
                "3x raidz2-4",
                "4x mirror3",
                "1x raidz1-12",
                "1x raidz2-12",
                "2x raidz3-6",
                "1x raidz3-12",
            ]
        );
        assert_eq!(p.layouts.len(), 12);

        let m = find(&p, "6x mirror2");
        assert_eq!((m.groups, m.width, m.drives, m.data_drives), (6, 2, 12, 6));
        assert_eq!(m.random_read_iops, 2160.0);
        assert_eq!(m.random_write_iops, 1080.0);
        assert_eq!(m.seq_read_mbps, 3000.0);
        assert_eq!(m.seq_write_mbps, 1500.0);
        assert_eq!(m.usable_bytes, 6 * data);
        assert_eq!(
            m.usable_bytes,
            48 * T - 6 * ((4 << 30) + (512 << 20) + (512 << 10))
        );
        assert_eq!(m.available_bytes, 6 * data - 6 * data / 32);
        assert_eq!((m.lose_any, m.lose_max), (1, 6));
        assert!(m.note.is_none());

        let z = find(&p, "2x raidz2-6");
        assert_eq!(z.random_read_iops, 360.0);
        assert_eq!(z.random_write_iops, 360.0);
        assert_eq!(z.seq_read_mbps, 2000.0);
        assert_eq!(z.seq_write_mbps, 2000.0);
        // 16K = 4 sectors = exactly the 4 data columns: one row, no padding.
        assert_eq!(z.sectors_per_block, 6);
        assert_eq!(z.usable_bytes, 8 * data);
        assert_eq!((z.lose_any, z.lose_max, z.data_drives), (2, 4, 8));
        assert!(z.note.is_none());
        assert!((z.efficiency_pct - 100.0 * 8.0 * data as f64 / (96 * T) as f64).abs() < 1e-9);

        let s = find(&p, "12x stripe");
        assert_eq!(s.usable_bytes, 12 * data);
        assert_eq!((s.random_read_iops, s.random_write_iops), (2160.0, 2160.0));
        assert_eq!((s.seq_read_mbps, s.seq_write_mbps), (3000.0, 3000.0));
        assert_eq!(s.lose_any, 0);
        assert!(s.note.as_deref().unwrap().contains("no redundancy"));

        let m3 = find(&p, "4x mirror3");
        assert_eq!(m3.usable_bytes, 4 * data);
        assert_eq!((m3.random_read_iops, m3.random_write_iops), (2160.0, 720.0));
        assert_eq!((m3.lose_any, m3.lose_max), (2, 8));
    }

    #[test]
    fn raidz_widths_and_padding() {
        let p = plan(&req(12, 8 * T)).unwrap();
        let data = device_regions(8 * T).data;
        let mut rz: Vec<&str> = p
            .layouts
            .iter()
            .filter(|l| l.family.is_raidz())
            .map(|l| l.name.as_str())
            .collect();
        rz.sort();
        assert_eq!(
            rz,
            [
                "1x raidz1-12",
                "1x raidz2-12",
                "1x raidz3-12",
                "2x raidz1-6",
                "2x raidz2-6",
                "2x raidz3-6",
                "3x raidz1-4",
                "3x raidz2-4",
                "4x raidz1-3",
            ]
        );
        // raidz1-4: 3 data columns, a 16K block (4 sectors) needs 2 rows of
        // 4 sectors: 8 sectors for 4 of data, 50% rather than 75%.
        let z = find(&p, "3x raidz1-4");
        assert_eq!(z.sectors_per_block, 8);
        assert_eq!(z.usable_bytes, 3 * (data / 4096 / 2) * 16384);
        assert_eq!(z.note.as_deref(), Some("padding: a 16K block takes 32K"));
        assert_eq!((z.random_read_iops, z.seq_read_mbps), (540.0, 2250.0));
        // raidz3-12: one row of 12 for 4 data sectors: a third.
        let z = find(&p, "1x raidz3-12");
        assert_eq!(z.sectors_per_block, 12);
        assert_eq!(z.usable_bytes, data / 4096 * 16384);
        assert_eq!((z.random_read_iops, z.seq_read_mbps), (180.0, 2250.0));
        // Larger blocks waste less: at 128K (32 sectors, 9 columns) 4 rows
        // of 12 = 48 sectors for 32: 2/3 of the drives, ideal 3/4.
        let mut r = req(12, 8 * T);
        r.block_size = 128 << 10;
        let p = plan(&r).unwrap();
        let z = find(&p, "1x raidz3-12");
        assert_eq!(z.sectors_per_block, 48);
        assert_eq!(z.usable_bytes, data / 4096 / 4 * (128 << 10));
    }

    #[test]
    fn spares_filters_and_odd_counts() {
        let mut r = req(11, 4 * T);
        let p = plan(&r).unwrap();
        // 11 is prime: stripe, raidz of 11 only.
        let mut n = names(&p);
        n.sort();
        assert_eq!(
            n,
            ["11x stripe", "1x raidz1-11", "1x raidz2-11", "1x raidz3-11"]
        );
        assert!(p.skipped.iter().any(|s| s.starts_with("mirror2:")
            && s.contains("not a multiple of 2")
            && s.contains("--spares 1 would leave 10")));
        r.spares = 1;
        let p = plan(&r).unwrap();
        let m = find(&p, "5x mirror2");
        assert_eq!((m.drives, m.spares), (10, 1));
        assert_eq!(m.random_read_iops, 1800.0, "spares add nothing");
        // Efficiency counts the spare as bought.
        let data = device_regions(4 * T).data;
        assert!((m.efficiency_pct - 100.0 * (5 * data) as f64 / (44 * T) as f64).abs() < 1e-9);

        r.spares = 0;
        r.drives = 12;
        r.families = parse_families("raidz2, mirror").unwrap();
        r.min_width = Some(5);
        let p = plan(&r).unwrap();
        let mut n = names(&p);
        n.sort();
        assert_eq!(n, ["1x raidz2-12", "2x raidz2-6", "6x mirror2"]);
        r.max_width = Some(8);
        let p = plan(&r).unwrap();
        let mut n = names(&p);
        n.sort();
        assert_eq!(n, ["2x raidz2-6", "6x mirror2"]);

        r.families = vec![Family::Raidz3];
        r.drives = 4;
        r.min_width = None;
        r.max_width = None;
        let e = plan(&r).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no layout fits: raidz3: a group needs at least 5 drives, there are 4"
        );
    }

    #[test]
    fn bad_requests() {
        let mut r = req(0, 8 * T);
        assert_eq!(
            plan(&r).unwrap_err().to_string(),
            "-n/--drives must be at least 1 (got 0)"
        );
        r.drives = 4;
        r.spares = 4;
        assert!(matches!(plan(&r), Err(PlanError::AllSpares { .. })));
        r.spares = 0;
        r.drive.size = 1 << 20;
        assert!(matches!(plan(&r), Err(PlanError::DriveTooSmall(_))));
        r.drive.size = T;
        r.drive.write_iops = 0.0;
        assert!(plan(&r).unwrap_err().to_string().contains("write IOPS"));
        r.drive.write_iops = 1.0;
        r.block_size = 6000;
        assert!(matches!(plan(&r), Err(PlanError::BadBlockSize(6000))));
        r.block_size = 4096;
        r.min_width = Some(6);
        r.max_width = Some(4);
        assert!(matches!(plan(&r), Err(PlanError::BadWidths { .. })));
        let e = parse_families("mirror,raid5").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("unknown layout 'raid5' (valid: stripe"),
            "{e}"
        );
        assert_eq!(
            parse_families("raidz,mirror,raidz1").unwrap(),
            [Family::Raidz1, Family::Mirror2]
        );
    }

    #[test]
    fn sorting() {
        let mut p = plan(&req(12, 8 * T)).unwrap();
        // Default: capacity, largest first; the stripe has the most.
        assert_eq!(p.layouts[0].name, "12x stripe");
        let caps: Vec<u64> = p.layouts.iter().map(|l| l.usable_bytes).collect();
        assert!(caps.windows(2).all(|w| w[0] >= w[1]));
        sort(&mut p.layouts, SortKey::RandomWrite);
        assert_eq!(p.layouts[0].name, "12x stripe");
        assert_eq!(p.layouts[1].name, "6x mirror2");
        sort(&mut p.layouts, SortKey::Lose);
        assert_eq!(p.layouts[0].lose_any, 3);
        sort(&mut p.layouts, SortKey::Layout);
        assert_eq!(p.layouts[0].name, "12x stripe");
        assert_eq!(p.layouts[3].name, "4x raidz1-3");
        assert_eq!(SortKey::parse("WIOPS"), Some(SortKey::RandomWrite));
        assert_eq!(SortKey::parse("bogus"), None);
    }
}

//! Space accounting as ZFS does it (decision 0011): slop space kept back,
//! `reservation`/`refreservation` charged to the tree, `quota`/`refquota`
//! enforced, and writes admitted against what is available when they enter
//! the open txg (ZFS's dsl_dir_tempreserve), so a txg commit never runs out
//! of space for data it already acknowledged.

use crate::props::DatasetRecord;
use crate::txg::ImportedPool;
use crate::{Error, Result};
use std::collections::{BTreeMap, HashMap};

/// zfs spa_slop_shift: 1/32 of the pool is kept back for frees ...
const SLOP_SHIFT: u32 = 5;
/// ... but at least this much (at most half of a tiny pool) ...
const SLOP_MIN: u64 = 16 << 20;
/// ... and at most this much (zfs spa_max_slop).
const SLOP_MAX: u64 = 128 << 30;

/// Space ordinary writes may not use: what frees, TRIM and zeroing may.
pub fn slop(size: u64) -> u64 {
    (size >> SLOP_SHIFT)
        .max(SLOP_MIN.min(size / 2))
        .min(SLOP_MAX)
}

/// What a change may dip into (zfs_space_check_t).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Ordinary writes: never the slop; quotas and others' reservations hold.
    Write,
    /// Allocated zeros (WRITE_ZEROES with NO_HOLE), and writes of a dataset
    /// still within its refreservation (the copy-on-write copy of an
    /// overwrite is only in flight until its txg frees the old block): half the slop.
    Reserved,
    /// TRIM and zeroing that deallocate: all of the slop, no quota.
    Free,
}

/// A locally set size property (`none`/unset: 0).
pub fn limit(rec: &DatasetRecord, prop: &str) -> u64 {
    rec.local
        .get(prop)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// What a non-snapshot dataset is charged, as zfs shows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Figures {
    /// usedbydataset: its own live blocks (+ changes in flight).
    pub dataset: u64,
    pub snapshots: u64,
    /// usedbyrefreservation: refreservation not yet consumed by unique data.
    pub refreservation: u64,
    /// usedbychildren: each child's used, or its reservation if larger.
    pub children: u64,
    /// Data only this dataset's head references (blocks born after its newest snapshot).
    pub unique: u64,
    pub referenced: u64,
}

impl Figures {
    pub fn used(&self) -> u64 {
        self.dataset + self.snapshots + self.refreservation + self.children
    }
}

/// Figures of every non-snapshot dataset by name, `pending` (bytes in the
/// open and syncing txgs by dataset id) counted as written.
pub fn figures(
    datasets: &BTreeMap<String, DatasetRecord>,
    pending: &HashMap<u64, u64>,
) -> HashMap<String, Figures> {
    let mut out: HashMap<String, Figures> = HashMap::new();
    // Deepest first, so each child is complete before it is added to its parent.
    let mut recs: Vec<&DatasetRecord> = datasets.values().filter(|r| !r.is_snapshot()).collect();
    recs.sort_by_key(|r| std::cmp::Reverse(r.name.matches('/').count()));
    for rec in recs {
        let p = pending.get(&rec.id).copied().unwrap_or(0);
        let f = out.entry(rec.name.clone()).or_default();
        f.dataset = rec.physical_used + p;
        f.snapshots = rec.snapshot_used;
        f.unique = rec.written + p;
        f.referenced = rec.physical_used + rec.inherited + p;
        f.refreservation = limit(rec, "refreservation").saturating_sub(f.unique);
        let charged = f.used().max(limit(rec, "reservation"));
        if let Some((parent, _)) = rec.name.rsplit_once('/') {
            out.entry(parent.to_string()).or_default().children += charged;
        }
    }
    out
}

/// Space the pool can still promise: its size less slop and what the
/// root is charged (every dataset's data, snapshots, changes in flight and
/// unused reservations). From the figures, not the allocator: a txg being
/// committed is then counted once, whether or not its blocks are placed yet.
pub fn pool_available(
    size: u64,
    keep: u64,
    datasets: &BTreeMap<String, DatasetRecord>,
    figs: &HashMap<String, Figures>,
) -> u64 {
    let root = datasets.values().find(|r| r.id == 0);
    let used = root.and_then(|r| figs.get(&r.name)).map_or(0, |f| f.used());
    size.saturating_sub(keep).saturating_sub(used)
}

/// zfs `available` of `name` given what the pool can promise: its own and its
/// ancestors' unused reservations added, quotas and refquota applied. The
/// second value names the limit that binds (None: the pool).
pub fn available(
    datasets: &BTreeMap<String, DatasetRecord>,
    figs: &HashMap<String, Figures>,
    pool_avail: u64,
    name: &str,
) -> (u64, Option<String>) {
    let mut avail = pool_avail;
    let mut why = None;
    let mut path = String::new();
    for (i, part) in name.split('/').enumerate() {
        if i > 0 {
            path.push('/');
        }
        path.push_str(part);
        let (Some(rec), Some(f)) = (datasets.get(&path), figs.get(&path)) else {
            continue;
        };
        if i > 0 {
            avail += limit(rec, "reservation").saturating_sub(f.used());
        }
        let quota = limit(rec, "quota");
        if quota > 0 && quota.saturating_sub(f.used()) < avail {
            avail = quota.saturating_sub(f.used());
            why = Some(format!("quota of '{path}'"));
        }
    }
    if let (Some(rec), Some(f)) = (datasets.get(name), figs.get(name)) {
        avail += f.refreservation;
        let refquota = limit(rec, "refquota");
        if refquota > 0 && refquota.saturating_sub(f.referenced) < avail {
            avail = refquota.saturating_sub(f.referenced);
            why = Some(format!("refquota of '{name}'"));
        }
    }
    (avail, why)
}

/// What a change of `class` to dataset `ds` may still add to the open txg.
pub struct Budget {
    pub bytes: u64,
    /// `OpenTxg::charged_ever` when measured: what others charged since is
    /// taken off, so concurrent writers cannot both spend the same space.
    pub ever: u64,
    /// The error to give when the budget is exceeded.
    pub why: String,
}

/// Space charged for changes not yet in the dataset figures.
pub(crate) struct Pending {
    /// By dataset: the open txg's charges and the committing txg's.
    pub by_ds: HashMap<u64, u64>,
    /// Of those, what is not allocated yet (the committing txg's charges
    /// only until its blocks are placed).
    pub unplaced: u64,
    /// `OpenTxg::charged_ever` when measured.
    pub ever: u64,
}

/// `OpenTxg::charged` of the txg being committed, and whether its blocks
/// are placed (allocated) yet.
#[derive(Default)]
pub struct SyncingCharges {
    pub by_ds: HashMap<u64, u64>,
    pub placed: bool,
}

impl ImportedPool {
    pub(crate) fn pending(&self) -> Pending {
        let open = self.open.lock();
        let mut by_ds = open.charged.clone();
        let mut unplaced: u64 = by_ds.values().sum();
        let syncing = self.syncing_charged.lock();
        for (id, n) in &syncing.by_ds {
            *by_ds.entry(*id).or_default() += n;
            if !syncing.placed {
                unplaced += n;
            }
        }
        Pending {
            by_ds,
            unplaced,
            ever: open.charged_ever,
        }
    }

    /// Worst-case allocation of one block of `bs` bytes: rounded up to the
    /// largest allocation unit (a raidz row) of any group.
    pub(crate) fn charge_of(&self, bs: u32) -> u64 {
        let unit = self
            .pool
            .groups()
            .iter()
            .map(|g| g.unit())
            .max()
            .unwrap_or(pool::SECTOR);
        (bs as u64).div_ceil(unit) * unit
    }

    /// `available` of a dataset for display and admin checks (with what is in flight).
    pub(crate) fn available_of(
        &self,
        datasets: &BTreeMap<String, DatasetRecord>,
        name: &str,
    ) -> u64 {
        let figs = figures(datasets, &self.pending().by_ds);
        let size = self.pool.size();
        let pool = pool_available(size, slop(size), datasets, &figs);
        available(datasets, &figs, pool, name).0
    }

    /// The refreservation of a non-sparse volume (`auto`): every block at
    /// its worst-case allocation (volsize itself unless raidz rows pad blocks).
    pub(crate) fn volume_reservation(&self, volsize: u64, bs: u32) -> u64 {
        volsize / bs as u64 * self.charge_of(bs)
    }

    /// A new dataset (`name`, locally set `local`) fits: what it reserves
    /// (the larger of its reservation and refreservation) is available.
    pub(crate) fn check_new(
        &self,
        datasets: &BTreeMap<String, DatasetRecord>,
        name: &str,
        local: &BTreeMap<String, String>,
    ) -> Result<()> {
        let reserved = ["refreservation", "reservation"]
            .iter()
            .filter_map(|k| local.get(*k).and_then(|v| v.parse::<u64>().ok()))
            .max()
            .unwrap_or(0);
        self.check_limit(datasets, name, "", reserved)
    }

    /// zfs's checks for a new `prop` value of `name` (bytes, 0 = none), or
    /// (`name` not created yet) for a new dataset holding `new` reserved.
    pub(crate) fn check_limit(
        &self,
        datasets: &BTreeMap<String, DatasetRecord>,
        name: &str,
        prop: &str,
        new: u64,
    ) -> Result<()> {
        let figs = figures(datasets, &self.pending().by_ds);
        let size = self.pool.size();
        let pool = pool_available(size, slop(size), datasets, &figs);
        let parent = name.rsplit_once('/').map_or("", |(p, _)| p);
        let Some(rec) = datasets.get(name) else {
            let avail = available(datasets, &figs, pool, parent).0;
            if new > avail {
                return Err(Error::NoSpace(format!(
                    "cannot create '{name}': out of space (its reservation needs {}, {} is available; create -s makes a sparse volume)",
                    crate::props::format_size(new),
                    crate::props::format_size(avail)
                )));
            }
            return Ok(());
        };
        let f = figs.get(name).copied().unwrap_or_default();
        let old = limit(rec, prop);
        let (floor, delta, avail) = match prop {
            "quota" => (f.used(), 0, 0),
            "refquota" => (f.referenced, 0, 0),
            "reservation" => (
                0,
                new.max(f.used()).saturating_sub(old.max(f.used())),
                available(datasets, &figs, pool, parent).0,
            ),
            _ => (
                0,
                new.max(f.unique).saturating_sub(old.max(f.unique)),
                available(datasets, &figs, pool, name).0 - f.refreservation,
            ),
        };
        if new != 0 && new < floor {
            return Err(Error::InvalidArgument(format!(
                "cannot set property for '{name}': size is less than current used or reserved space ({prop} {} < {})",
                crate::props::format_size(new),
                crate::props::format_size(floor)
            )));
        }
        if delta > avail {
            return Err(Error::NoSpace(format!(
                "cannot set property for '{name}': size is greater than available space ({} more needed, {} available)",
                crate::props::format_size(delta),
                crate::props::format_size(avail)
            )));
        }
        Ok(())
    }

    /// A snapshot makes all of a dataset's data shared, so its
    /// refreservation is charged in full again: as zfs, refused unless the
    /// pool can hold that (`ids`: the datasets to snapshot).
    pub(crate) fn check_snapshot(
        &self,
        datasets: &BTreeMap<String, DatasetRecord>,
        ids: &[u64],
    ) -> Result<()> {
        let figs = figures(datasets, &self.pending().by_ds);
        let need: u64 = datasets
            .values()
            .filter(|r| ids.contains(&r.id))
            .map(|r| limit(r, "refreservation").min(figs.get(&r.name).map_or(0, |f| f.unique)))
            .sum();
        if need == 0 {
            return Ok(());
        }
        let size = self.pool.size();
        let pool = pool_available(size, slop(size), datasets, &figs);
        if need > pool {
            return Err(Error::NoSpace(format!(
                "cannot create snapshot: out of space (refreservation needs {} more after the snapshot, {} is available)",
                crate::props::format_size(need),
                crate::props::format_size(pool)
            )));
        }
        Ok(())
    }

    /// How much more a change of `class` to dataset `ds` may charge now.
    pub(crate) fn budget(&self, ds: u64, class: Class) -> Result<Budget> {
        let Pending {
            by_ds: pending,
            unplaced,
            ever,
        } = self.pending();
        let size = self.pool.size();
        let free = self.pool.allocator().free_bytes();
        let datasets = self.datasets.read();
        let rec = datasets
            .values()
            .find(|r| r.id == ds)
            .ok_or_else(|| Error::NotFound(format!("dataset {ds}")))?;
        let pool_name = &self.pool.name;
        let full = || format!("out of space in pool {pool_name}");
        // Physical space, whatever the accounting says (a snapshot can put
        // a refreservation over what is free).
        let physical = |keep: u64| free.saturating_sub(keep).saturating_sub(unplaced);
        if class == Class::Free {
            return Ok(Budget {
                bytes: physical(0),
                ever,
                why: full(),
            });
        }
        let figs = figures(&datasets, &pending);
        // Committed unique data still inside the refreservation.
        let own_pending = pending.get(&ds).copied().unwrap_or(0);
        let reserved = limit(rec, "refreservation");
        let within_refreservation = figs
            .get(&rec.name)
            .is_some_and(|f| reserved > 0 && reserved >= f.unique.saturating_sub(own_pending));
        let keep = match class {
            Class::Write if !within_refreservation => slop(size),
            _ => slop(size) / 2,
        };
        let pool = pool_available(size, keep, &datasets, &figs);
        let (logical, why) = available(&datasets, &figs, pool, &rec.name);
        let phys = physical(keep);
        Ok(match why {
            Some(limit) if logical <= phys => Budget {
                bytes: logical,
                ever,
                why: format!("dataset '{}': disk quota exceeded ({limit})", rec.name),
            },
            _ => Budget {
                bytes: logical.min(phys),
                ever,
                why: full(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DatasetKind;

    fn rec(id: u64, name: &str, phys: u64, props: &[(&str, u64)]) -> DatasetRecord {
        DatasetRecord {
            id,
            name: name.into(),
            kind: if id == 0 {
                DatasetKind::Filesystem
            } else {
                DatasetKind::Volume
            },
            physical_used: phys,
            written: phys,
            local: props
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    fn tree(recs: Vec<DatasetRecord>) -> BTreeMap<String, DatasetRecord> {
        recs.into_iter().map(|r| (r.name.clone(), r)).collect()
    }

    const M: u64 = 1 << 20;

    #[test]
    fn slop_is_a_32nd_bounded() {
        assert_eq!(slop(1 << 40), (1 << 40) / 32);
        assert_eq!(slop(256 * M), 16 * M);
        assert_eq!(slop(16 * M), 8 * M);
        assert_eq!(slop(1 << 50), 128 << 30);
    }

    #[test]
    fn a_refreservation_is_charged_until_written_and_is_available_to_its_owner() {
        let ds = tree(vec![
            rec(0, "tank", 0, &[]),
            rec(1, "tank/thick", 10 * M, &[("refreservation", 100 * M)]),
            rec(2, "tank/thin", 5 * M, &[]),
        ]);
        let figs = figures(&ds, &HashMap::new());
        assert_eq!(figs["tank/thick"].refreservation, 90 * M);
        assert_eq!(figs["tank/thick"].used(), 100 * M);
        assert_eq!(figs["tank"].used(), 105 * M);
        // A 1000M pool, 32M slop.
        let pool = pool_available(1000 * M, 32 * M, &ds, &figs);
        assert_eq!(pool, 1000 * M - 32 * M - 15 * M - 90 * M);
        assert_eq!(available(&ds, &figs, pool, "tank/thin").0, pool);
        assert_eq!(available(&ds, &figs, pool, "tank/thick").0, pool + 90 * M);
        // Writes in flight to the thick volume consume its reservation first.
        let pending = HashMap::from([(1, 30 * M)]);
        let figs = figures(&ds, &pending);
        assert_eq!(figs["tank/thick"].refreservation, 60 * M);
        assert_eq!(figs["tank"].used(), 105 * M);
        let pool2 = pool_available(1000 * M, 32 * M, &ds, &figs);
        assert_eq!(
            pool2, pool,
            "in-flight writes within a refreservation cost others nothing"
        );
    }

    #[test]
    fn quotas_and_reservations_include_descendants() {
        let mut fs = rec(
            1,
            "tank/fs",
            0,
            &[("quota", 50 * M), ("reservation", 40 * M)],
        );
        fs.kind = DatasetKind::Filesystem;
        let ds = tree(vec![
            rec(0, "tank", 0, &[]),
            fs,
            rec(2, "tank/fs/a", 10 * M, &[("refquota", 12 * M)]),
            rec(3, "tank/fs/b", 20 * M, &[]),
        ]);
        let figs = figures(&ds, &HashMap::new());
        assert_eq!(figs["tank/fs"].children, 30 * M);
        // The filesystem's reservation (40M > 30M used) is charged to the pool root.
        assert_eq!(figs["tank"].children, 40 * M);
        let pool = pool_available(1000 * M, 0, &ds, &figs);
        assert_eq!(pool, 1000 * M - 30 * M - 10 * M);
        // Below the filesystem: its unused reservation, capped by its quota.
        let (b, why) = available(&ds, &figs, pool, "tank/fs/b");
        assert_eq!((b, why.as_deref()), (20 * M, Some("quota of 'tank/fs'")));
        let (a, why) = available(&ds, &figs, pool, "tank/fs/a");
        assert_eq!(
            (a, why.as_deref()),
            (2 * M, Some("refquota of 'tank/fs/a'"))
        );
        // Snapshots count against a quota, not against a refquota.
        let mut ds2 = ds.clone();
        ds2.get_mut("tank/fs/a").unwrap().snapshot_used = 15 * M;
        let figs = figures(&ds2, &HashMap::new());
        assert_eq!(available(&ds2, &figs, pool, "tank/fs/a").0, 2 * M);
        assert_eq!(available(&ds2, &figs, pool, "tank/fs/b").0, 5 * M);
    }
}

//! Snapshots, clones, rollback and destroy: what a txg commit does to the
//! block map and dead lists when a block is replaced, and the
//! administrative actions that ride on a txg commit (so each is atomic
//! with the data before it and ordered against every acknowledged write).
//!
//! Space rules (as ZFS, design brief "Snapshots: birth time and dead lists"):
//! a replaced version born after the dataset's newest snapshot is freed at
//! once; an older one stays in BLOCKS and gets a DEADLIST row keyed by the
//! txg it died in. Destroying snapshot S (previous P, next N or the head)
//! frees exactly the dead rows with death in (S, N] and birth > P.

use crate::blockmap::{self, Chain, Key, KeyType};
use crate::props::{DatasetRecord, Origin};
use crate::txg::ImportedPool;
use crate::{DatasetKind, Error, Result};
use block::BlockPointer;
use meta::redb::{ReadableDatabase, ReadableTable, Table, WriteTransaction};
use meta::schema::{BLOCK_MAP, DEAD_LIST};
use pool::Dva;
use std::collections::{BTreeMap, HashSet};

/// A dead-list row: (dataset, death txg, address, birth txg).
type DeadKey = (u64, u64, Vec<u8>, u64);
type DeadKeyType = (u64, u64, &'static [u8], u64);
/// Above every address (block addresses start with 0, names with 1).
const ADDR_MAX: &[u8] = &[0xff];

use crate::txg::meta_err;

/// Space changes of one dataset during a txg, applied to its record at commit.
#[derive(Debug, Default)]
pub(crate) struct SpaceDelta {
    own: i64,
    own_logical: i64,
    inherited: i64,
    inherited_logical: i64,
    snapshots: i64,
    written: i64,
}

fn add(v: &mut u64, d: i64) {
    let n = *v as i64 + d;
    debug_assert!(n >= 0, "space figure would go negative: {v} + {d}");
    *v = n.max(0) as u64;
}

impl SpaceDelta {
    pub(crate) fn apply_to(&self, rec: &mut DatasetRecord) {
        add(&mut rec.physical_used, self.own);
        add(&mut rec.logical_used, self.own_logical);
        add(&mut rec.inherited, self.inherited);
        add(&mut rec.inherited_logical, self.inherited_logical);
        add(&mut rec.snapshot_used, self.snapshots);
        add(&mut rec.written, self.written);
    }
}

/// One row of one dataset (a block or a name) gets a new version in `txg`.
pub(crate) struct VersionChange<'a> {
    pub ds: u64,
    pub addr: &'a [u8],
    pub txg: u64,
    /// Txg of the dataset's newest snapshot (0 if none).
    pub latest_snapshot: u64,
    /// Txg of the dataset's newest bookmark (0 if none): a row that existed
    /// then gets a tombstone when removed, so an incremental stream from the
    /// bookmark says it was removed (decision 0040).
    pub latest_bookmark: u64,
    /// For clones: the levels below the clone's own block map.
    pub origin: Option<&'a Chain>,
    /// The new value (an encoded block pointer, a name's target), or
    /// `None` for a hole / a removed name.
    pub new: Option<Vec<u8>>,
}

impl VersionChange<'_> {
    /// Invariant kept: the newest version of a row in its dataset's map
    /// is live (the head's); everything older is on a dead list.
    pub(crate) fn apply(
        &self,
        blocks: &mut Table<KeyType, &'static [u8]>,
        dead: &mut Table<DeadKeyType, u64>,
        d: &mut SpaceDelta,
        freed: &mut Vec<Dva>,
    ) -> Result<()> {
        let (ds, addr) = (self.ds, self.addr);
        let (old, older_exists) = {
            let mut rows = blocks
                .range((ds, addr, 0)..=(ds, addr, u64::MAX))
                .map_err(meta_err)?
                .rev();
            let old = match rows.next() {
                Some(row) => {
                    let (k, v) = row.map_err(meta_err)?;
                    Some((k.value().2, v.value().to_vec()))
                }
                None => None,
            };
            (old, rows.next().is_some())
        };
        if self.new.is_none() && old.as_ref().is_some_and(|(_, v)| v.is_empty()) {
            return Ok(()); // a hole over a live tombstone changes nothing
        }
        // Whether some older version stays in the map after `old` is handled.
        let mut shadowed = false;
        match &old {
            Some((birth, value)) => {
                let (phys, logical) = blockmap::sizes(addr, value)?;
                let (phys, logical) = (phys as i64, logical as i64);
                d.own -= phys;
                d.own_logical -= logical;
                if *birth > self.latest_snapshot {
                    // No snapshot can see it: free now.
                    blocks.remove((ds, addr, *birth)).map_err(meta_err)?;
                    if let Some(bp) = blockmap::decode(addr, value)? {
                        freed.extend(bp.dvas.iter().copied());
                    }
                    d.written -= phys;
                    shadowed = older_exists || *birth <= self.latest_bookmark;
                } else {
                    dead.insert((ds, self.txg, addr, *birth), phys as u64)
                        .map_err(meta_err)?;
                    d.snapshots += phys;
                    shadowed = true;
                }
            }
            None => {
                if let Some(chain) = self.origin {
                    if let Some(v) = blockmap::resolve(&*blocks, chain, addr)? {
                        let (phys, logical) = blockmap::sizes(addr, &v)?;
                        d.inherited -= phys as i64;
                        d.inherited_logical -= logical as i64;
                    }
                }
            }
        }
        match &self.new {
            Some(value) => {
                blocks
                    .insert((ds, addr, self.txg), value.as_slice())
                    .map_err(meta_err)?;
                let (phys, logical) = blockmap::sizes(addr, value)?;
                d.own += phys as i64;
                d.own_logical += logical as i64;
                d.written += phys as i64;
            }
            None => {
                // A tombstone hides what would otherwise show through: an
                // older version kept for a snapshot, or the clone's origin.
                let hides = shadowed
                    || match self.origin {
                        Some(chain) => blockmap::resolve(&*blocks, chain, addr)?.is_some(),
                        None => false,
                    };
                if hides {
                    blocks
                        .insert((ds, addr, self.txg), &[][..])
                        .map_err(meta_err)?;
                }
            }
        }
        Ok(())
    }
}

/// A new snapshot: its dataset, a fresh record id and its full name.
#[derive(Debug, Clone)]
pub(crate) struct NewSnapshot {
    pub dataset: u64,
    pub id: u64,
    pub name: String,
}

/// Administrative changes committed in the same metadata transaction as a txg.
#[derive(Debug)]
pub(crate) enum Action {
    /// Snapshots taken at the end of this txg (all at one point in time).
    Snapshot(Vec<NewSnapshot>),
    /// Snapshots destroyed, in this order.
    DestroySnapshots(Vec<u64>),
    /// Back to `snapshot` (the dataset's newest once `destroy_later` are gone).
    Rollback {
        dataset: u64,
        snapshot: u64,
        destroy_later: Vec<u64>,
    },
    Clone(Box<DatasetRecord>),
    /// A dataset, its snapshots and every block it holds.
    DestroyDataset(u64),
    /// The clone takes over its origin's history up to the origin snapshot.
    Promote(u64),
    /// Records get new names (`rename`): (record id, new name), all at once.
    Rename(Vec<(u64, String)>),
}

impl Action {
    /// The dataset whose uncommitted changes the action throws away.
    pub(crate) fn discards(&self) -> Option<u64> {
        match self {
            Action::Rollback { dataset, .. } | Action::DestroyDataset(dataset) => Some(*dataset),
            _ => None,
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ActionOutcome {
    /// Allocated bytes the action freed.
    pub freed: u64,
}

/// A snapshot can go unless a user holds it or a clone depends on it
/// (checked before a dry run and again inside the committing transaction).
pub(crate) fn check_destroyable<'a>(
    snap: &DatasetRecord,
    mut records: impl Iterator<Item = &'a DatasetRecord>,
) -> Result<()> {
    snap.check_not_held()?;
    match records.find(|r| r.origin.as_ref().is_some_and(|o| o.snapshot == snap.id)) {
        Some(clone) => Err(Error::Busy(format!(
            "snapshot '{}' has dependent clone '{}': destroy it (or use -R) or promote it first",
            snap.name, clone.name
        ))),
        None => Ok(()),
    }
}

/// Snapshot txgs of dataset `ds`, oldest first.
fn snapshot_txgs<'a>(records: impl Iterator<Item = &'a DatasetRecord>, ds: u64) -> Vec<u64> {
    let mut v: Vec<u64> = records
        .filter(|r| r.is_snapshot() && r.data_id() == ds)
        .map(|r| r.created_txg)
        .collect();
    v.sort_unstable();
    v
}

/// The snapshot before `first` (0 if none) and the point after `last` (u64::MAX: the head).
fn neighbours(txgs: &[u64], first: u64, last: u64) -> (u64, u64) {
    let prev = txgs
        .iter()
        .copied()
        .filter(|&t| t < first)
        .max()
        .unwrap_or(0);
    let next = txgs
        .iter()
        .copied()
        .filter(|&t| t > last)
        .min()
        .unwrap_or(u64::MAX);
    (prev, next)
}

/// Dead rows of `ds` with death in (after, upto] and birth > born_after.
fn dead_rows<T: ReadableTable<DeadKeyType, u64>>(
    dead: &T,
    ds: u64,
    after: u64,
    upto: u64,
    born_after: u64,
) -> Result<Vec<(DeadKey, u64)>> {
    if after >= upto {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for row in dead
        .range((ds, after + 1, &[][..], 0)..=(ds, upto, ADDR_MAX, u64::MAX))
        .map_err(meta_err)?
    {
        let (k, v) = row.map_err(meta_err)?;
        let (ds, death, addr, birth) = k.value();
        if birth > born_after {
            out.push(((ds, death, addr.to_vec(), birth), v.value()));
        }
    }
    Ok(out)
}

/// Removes the block-map rows of `ds` whose birth `doomed` picks; their
/// space goes to `freed`. Returns the allocated bytes.
fn remove_rows(
    tx: &WriteTransaction,
    ds: u64,
    doomed: impl Fn(u64) -> bool,
    freed: &mut Vec<Dva>,
) -> Result<u64> {
    let mut blocks = tx.open_table(BLOCK_MAP).map_err(meta_err)?;
    let rows: Vec<(Key, Vec<u8>)> = blocks
        .range((ds, &[][..], 0)..=(ds, ADDR_MAX, u64::MAX))
        .map_err(meta_err)?
        .filter(|r| r.as_ref().map_or(true, |(k, _)| doomed(k.value().2)))
        .map(|r| {
            r.map(|(k, v)| {
                let (ds, addr, birth) = k.value();
                ((ds, addr.to_vec(), birth), v.value().to_vec())
            })
        })
        .collect::<std::result::Result<_, _>>()
        .map_err(meta_err)?;
    let mut bytes = 0;
    for (k, v) in rows {
        blocks
            .remove((k.0, k.1.as_slice(), k.2))
            .map_err(meta_err)?;
        if let Some(bp) = blockmap::decode(&k.1, &v)? {
            bytes += bp.asize();
            freed.extend(bp.dvas);
        }
    }
    Ok(bytes)
}

/// Contiguous runs (in the dataset's snapshot order) of the txgs in `doomed`.
fn runs(all: &[u64], doomed: &[u64]) -> Vec<(u64, u64)> {
    debug_assert!(doomed.is_sorted());
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut open: Option<(u64, u64)> = None;
    for &t in all {
        if doomed.binary_search(&t).is_ok() {
            open = Some(open.map_or((t, t), |(a, _)| (a, t)));
        } else if let Some(r) = open.take() {
            out.push(r);
        }
    }
    out.extend(open);
    out
}

impl ImportedPool {
    /// Runs `action` inside the txg commit's metadata transaction. `recs`
    /// (every record of the pool, by id) is updated in place.
    pub(crate) fn run_action(
        &self,
        action: Action,
        txg: u64,
        tx: &WriteTransaction,
        recs: &mut BTreeMap<u64, DatasetRecord>,
        freed: &mut Vec<Dva>,
    ) -> Result<ActionOutcome> {
        let mut outcome = ActionOutcome::default();
        match action {
            Action::Snapshot(list) => {
                for s in &list {
                    if recs.values().any(|r| r.name == s.name) {
                        return Err(Error::AlreadyExists(format!("snapshot '{}'", s.name)));
                    }
                    let head = recs
                        .get_mut(&s.dataset)
                        .ok_or_else(|| Error::NotFound(s.name.clone()))?;
                    let snap = DatasetRecord {
                        id: s.id,
                        name: s.name.clone(),
                        kind: DatasetKind::Snapshot,
                        volsize: head.volsize,
                        volblocksize: head.volblocksize,
                        local: BTreeMap::new(),
                        created_txg: txg,
                        creation: crate::txg::now_secs(),
                        logical_used: head.logical_used,
                        physical_used: head.physical_used,
                        inherited: head.inherited,
                        inherited_logical: head.inherited_logical,
                        snapshot_used: 0,
                        written: head.written,
                        origin: None,
                        snapshot_of: Some(s.dataset),
                        holds: Default::default(),
                        next_object: head.next_object,
                        // Keys come from the dataset (crypt::crypt_of).
                        crypt: None,
                        receive: None,
                        bookmarks: BTreeMap::new(),
                    };
                    head.written = 0;
                    recs.insert(snap.id, snap);
                }
            }
            Action::DestroySnapshots(ids) => {
                for id in ids {
                    outcome.freed += self.destroy_snapshot_in(tx, recs, id, freed)?;
                }
            }
            Action::Rollback {
                dataset,
                snapshot,
                destroy_later,
            } => {
                for id in destroy_later {
                    outcome.freed += self.destroy_snapshot_in(tx, recs, id, freed)?;
                }
                let snap = recs
                    .get(&snapshot)
                    .cloned()
                    .ok_or_else(|| Error::NotFound(format!("snapshot {snapshot}")))?;
                let at = snap.created_txg;
                if snapshot_txgs(recs.values(), dataset).last() != Some(&at) {
                    return Err(Error::Busy(format!(
                        "'{}' is not the most recent snapshot",
                        snap.name
                    )));
                }
                // Versions born after the snapshot: only the head has them.
                outcome.freed += remove_rows(tx, dataset, |birth| birth > at, freed)?;
                // Versions that died after the snapshot are the head's again.
                let mut dead = tx.open_table(DEAD_LIST).map_err(meta_err)?;
                let revived = dead_rows(&dead, dataset, at, u64::MAX, 0)?;
                let head = recs
                    .get_mut(&dataset)
                    .ok_or_else(|| Error::NotFound(format!("dataset {dataset}")))?;
                for (k, asize) in revived {
                    dead.remove((k.0, k.1, k.2.as_slice(), k.3))
                        .map_err(meta_err)?;
                    add(&mut head.snapshot_used, -(asize as i64));
                }
                head.physical_used = snap.physical_used;
                head.logical_used = snap.logical_used;
                head.inherited = snap.inherited;
                head.inherited_logical = snap.inherited_logical;
                head.written = 0;
            }
            Action::Clone(rec) => {
                if recs.values().any(|r| r.name == rec.name) {
                    return Err(Error::AlreadyExists(format!("dataset '{}'", rec.name)));
                }
                let Some(Origin { snapshot, .. }) = rec.origin else {
                    return Err(Error::InvalidArgument("a clone needs an origin".into()));
                };
                let snap = recs
                    .get(&snapshot)
                    .ok_or_else(|| Error::NotFound(format!("snapshot {snapshot}")))?;
                let mut rec = rec;
                // Its objects keep their ids: new ones start past the origin's.
                rec.next_object = snap.next_object;
                rec.inherited = snap.physical_used + snap.inherited;
                rec.inherited_logical = snap.logical_used + snap.inherited_logical;
                recs.insert(rec.id, *rec);
            }
            Action::Promote(clone) => self.promote_in(tx, recs, clone)?,
            Action::Rename(list) => {
                let moving = |id: u64| list.iter().any(|(i, _)| *i == id);
                for (id, new) in &list {
                    if recs.values().any(|r| r.name == *new && !moving(r.id)) {
                        return Err(Error::AlreadyExists(format!(
                            "cannot rename to '{new}': dataset"
                        )));
                    }
                    if !recs.contains_key(id) {
                        return Err(Error::NotFound(format!("dataset {id}")));
                    }
                }
                for (id, new) in list {
                    if let Some(r) = recs.get_mut(&id) {
                        r.name = new;
                    }
                }
            }
            Action::DestroyDataset(id) => {
                if let Some(clone) = recs
                    .values()
                    .find(|r| r.origin.as_ref().is_some_and(|o| o.dataset == id) && r.id != id)
                {
                    return Err(Error::Busy(format!(
                        "dataset {id} has dependent clone '{}'",
                        clone.name
                    )));
                }
                outcome.freed += remove_rows(tx, id, |_| true, freed)?;
                let mut dead = tx.open_table(DEAD_LIST).map_err(meta_err)?;
                for (k, _) in dead_rows(&dead, id, 0, u64::MAX, 0)? {
                    dead.remove((k.0, k.1, k.2.as_slice(), k.3))
                        .map_err(meta_err)?;
                }
                recs.retain(|_, r| r.id != id && r.snapshot_of != Some(id));
            }
        }
        Ok(outcome)
    }

    /// `promote`: clone C of O@S takes over O's history up to S. O's rows
    /// born at or before S move to C's key range (C's own rows are all born
    /// later, so keys never collide), with their dead-list rows; O's
    /// snapshots up to S become C's; O becomes a clone of C@S. Record ids
    /// stay, so open volumes keep working. O(rows of O's history).
    fn promote_in(
        &self,
        tx: &WriteTransaction,
        recs: &mut BTreeMap<u64, DatasetRecord>,
        clone: u64,
    ) -> Result<()> {
        let c = recs
            .get(&clone)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("dataset {clone}")))?;
        let origin = c
            .origin
            .clone()
            .ok_or_else(|| Error::InvalidArgument(format!("'{}' is not a clone", c.name)))?;
        let (o_id, s_txg) = (origin.dataset, origin.txg);
        let o = recs
            .get(&o_id)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("dataset {o_id}")))?;
        // O's snapshots up to S are renamed onto C.
        let moving: Vec<u64> = recs
            .values()
            .filter(|r| r.is_snapshot() && r.data_id() == o_id && r.created_txg <= s_txg)
            .map(|r| r.id)
            .collect();
        for id in &moving {
            let short = recs[id].name.split_once('@').map_or("", |x| x.1);
            let new_name = format!("{}@{short}", c.name);
            if recs.values().any(|r| r.name == new_name) {
                return Err(Error::AlreadyExists(format!(
                    "snapshot '{new_name}' (rename it before promoting)"
                )));
            }
        }
        let mut blocks = tx.open_table(BLOCK_MAP).map_err(meta_err)?;
        let mut dead = tx.open_table(DEAD_LIST).map_err(meta_err)?;
        // History rows of O (born <= S) move to C.
        let history: Vec<(Key, Vec<u8>)> = blocks
            .range((o_id, &[][..], 0)..=(o_id, ADDR_MAX, u64::MAX))
            .map_err(meta_err)?
            .filter(|r| r.as_ref().map_or(true, |(k, _)| k.value().2 <= s_txg))
            .map(|r| {
                r.map(|(k, v)| {
                    let (ds, addr, birth) = k.value();
                    ((ds, addr.to_vec(), birth), v.value().to_vec())
                })
            })
            .collect::<std::result::Result<_, _>>()
            .map_err(meta_err)?;
        // Versions visible at S, per row: C's rows above them decide whether they die in C.
        let mut visible_at_s: BTreeMap<Vec<u8>, (u64, u64)> = BTreeMap::new();
        for ((_, addr, birth), v) in &history {
            let asize = blockmap::sizes(addr, v)?.0;
            visible_at_s.insert(addr.clone(), (*birth, asize));
            blocks
                .remove((o_id, addr.as_slice(), *birth))
                .map_err(meta_err)?;
            blocks
                .insert((clone, addr.as_slice(), *birth), v.as_slice())
                .map_err(meta_err)?;
        }
        // Dead rows of O: deaths up to S are history (held by the moving
        // snapshots) and move; later deaths of history versions were O's
        // overwrites and are redone against C's rows below.
        for (k, asize) in dead_rows(&dead, o_id, 0, u64::MAX, 0)? {
            let (_, death, addr, birth) = k;
            if birth > s_txg {
                continue; // O's own post-S versions stay O's
            }
            dead.remove((o_id, death, addr.as_slice(), birth))
                .map_err(meta_err)?;
            if death <= s_txg {
                dead.insert((clone, death, addr.as_slice(), birth), asize)
                    .map_err(meta_err)?;
            }
        }
        for (addr, &(birth, asize)) in &visible_at_s {
            let addr = addr.as_slice();
            // C's oldest own row of this block (born after S) is where the history version died for C.
            let first_own = blocks
                .range((clone, addr, s_txg + 1)..=(clone, addr, u64::MAX))
                .map_err(meta_err)?
                .next()
                .transpose()
                .map_err(meta_err)?
                .map(|(k, _)| k.value().2);
            if let Some(death) = first_own {
                dead.insert((clone, death, addr, birth), asize)
                    .map_err(meta_err)?;
            }
        }
        drop(blocks);
        drop(dead);
        // Records: snapshots, origins, then space recomputed from the rows.
        for id in &moving {
            let r = recs.get_mut(id).expect("listed above");
            let short = r.name.split_once('@').map_or("", |x| x.1).to_string();
            r.name = format!("{}@{short}", c.name);
            r.snapshot_of = Some(clone);
        }
        let s_id = origin.snapshot;
        for r in recs.values_mut() {
            if let Some(orig) = r.origin.as_mut() {
                if orig.dataset == o_id && orig.txg <= s_txg && r.id != clone {
                    orig.dataset = clone;
                }
            }
        }
        if let Some(cr) = recs.get_mut(&clone) {
            cr.origin = o.origin.clone();
        }
        if let Some(or) = recs.get_mut(&o_id) {
            or.origin = Some(Origin {
                dataset: clone,
                txg: s_txg,
                snapshot: s_id,
            });
        }
        crate::crypt::promote_root(recs, o_id, clone);
        self.recount(tx, recs, o_id)?;
        self.recount(tx, recs, clone)?;
        Ok(())
    }

    /// Recomputes a dataset's space figures (and its snapshots' own/inherited
    /// split) from its rows; what it references does not change.
    fn recount(
        &self,
        tx: &WriteTransaction,
        recs: &mut BTreeMap<u64, DatasetRecord>,
        ds: u64,
    ) -> Result<()> {
        let blocks = tx.open_table(BLOCK_MAP).map_err(meta_err)?;
        let dead = tx.open_table(DEAD_LIST).map_err(meta_err)?;
        let mut snaps: Vec<(u64, u64)> = recs
            .values()
            .filter(|r| r.is_snapshot() && r.data_id() == ds)
            .map(|r| (r.created_txg, r.id))
            .collect();
        snaps.sort_unstable();
        let latest = snaps.last().map_or(0, |s| s.0);
        // Own bytes visible at each snapshot and at the head.
        let mut at_snap: Vec<(u64, u64)> = vec![(0, 0); snaps.len()];
        let (mut live, mut live_logical, mut written) = (0u64, 0u64, 0u64);
        let mut rows: Vec<(Vec<u8>, u64, Option<BlockPointer>)> = Vec::new();
        let mut flush = |rows: &mut Vec<(Vec<u8>, u64, Option<BlockPointer>)>| {
            for (i, (t, _)) in snaps.iter().enumerate() {
                if let Some((_, _, Some(bp))) = rows.iter().rev().find(|r| r.1 <= *t) {
                    at_snap[i].0 += bp.asize();
                    at_snap[i].1 += bp.lsize as u64;
                }
            }
            if let Some((_, birth, Some(bp))) = rows.last() {
                live += bp.asize();
                live_logical += bp.lsize as u64;
                if *birth > latest {
                    written += bp.asize();
                }
            }
            rows.clear();
        };
        for row in blocks
            .range((ds, &[][..], 0)..=(ds, ADDR_MAX, u64::MAX))
            .map_err(meta_err)?
        {
            let (k, v) = row.map_err(meta_err)?;
            let (_, addr, birth) = k.value();
            if rows.first().is_some_and(|r| r.0 != addr) {
                flush(&mut rows);
            }
            rows.push((addr.to_vec(), birth, blockmap::decode(addr, v.value())?));
        }
        flush(&mut rows);
        let held: u64 = dead_rows(&dead, ds, 0, u64::MAX, 0)?
            .iter()
            .map(|(_, a)| a)
            .sum();
        for (i, (_, id)) in snaps.iter().enumerate() {
            if let Some(r) = recs.get_mut(id) {
                let (refer, refer_logical) = (
                    r.physical_used + r.inherited,
                    r.logical_used + r.inherited_logical,
                );
                r.physical_used = at_snap[i].0;
                r.logical_used = at_snap[i].1;
                r.inherited = refer.saturating_sub(at_snap[i].0);
                r.inherited_logical = refer_logical.saturating_sub(at_snap[i].1);
            }
        }
        if let Some(r) = recs.get_mut(&ds) {
            let (refer, refer_logical) = (
                r.physical_used + r.inherited,
                r.logical_used + r.inherited_logical,
            );
            r.physical_used = live;
            r.logical_used = live_logical;
            r.inherited = refer.saturating_sub(live);
            r.inherited_logical = refer_logical.saturating_sub(live_logical);
            r.snapshot_used = held;
            r.written = written;
        }
        Ok(())
    }

    /// Frees what only snapshot `id` holds and removes it; returns the bytes freed.
    fn destroy_snapshot_in(
        &self,
        tx: &WriteTransaction,
        recs: &mut BTreeMap<u64, DatasetRecord>,
        id: u64,
        freed: &mut Vec<Dva>,
    ) -> Result<u64> {
        let snap = recs
            .get(&id)
            .filter(|r| r.is_snapshot())
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("snapshot {id}")))?;
        check_destroyable(&snap, recs.values())?;
        let ds = snap.data_id();
        let txgs = snapshot_txgs(recs.values(), ds);
        let (prev, next) = neighbours(&txgs, snap.created_txg, snap.created_txg);
        let mut dead = tx.open_table(DEAD_LIST).map_err(meta_err)?;
        let mut blocks = tx.open_table(BLOCK_MAP).map_err(meta_err)?;
        let mut bytes = 0;
        for (k, asize) in dead_rows(&dead, ds, snap.created_txg, next, prev)? {
            let (_, death, addr, birth) = k;
            dead.remove((ds, death, addr.as_slice(), birth))
                .map_err(meta_err)?;
            if let Some(v) = blocks
                .remove((ds, addr.as_slice(), birth))
                .map_err(meta_err)?
            {
                if let Some(bp) = blockmap::decode(&addr, v.value())? {
                    freed.extend(bp.dvas.iter().copied());
                }
            }
            bytes += asize;
        }
        if let Some(head) = recs.get_mut(&ds) {
            add(&mut head.snapshot_used, -(bytes as i64));
        }
        // What the snapshot's blocks born since `prev` still account for
        // moves to the next point: the freed ones were all born since `prev`.
        let next_rec = recs.values_mut().find(|r| {
            if next == u64::MAX {
                r.id == ds
            } else {
                r.is_snapshot() && r.data_id() == ds && r.created_txg == next
            }
        });
        if let Some(n) = next_rec {
            n.written += snap.written.saturating_sub(bytes);
        }
        recs.remove(&id);
        Ok(bytes)
    }

    /// What destroying the snapshots `ids` would free, exactly: for each run
    /// of adjacent doomed snapshots, the dead rows between its first and the
    /// next kept point born after the kept one before. `datasets` is the
    /// caller's view of the pool's records (its read guard of `self.datasets`:
    /// taking that lock again here could deadlock behind a waiting writer).
    pub fn destroy_estimate(
        &self,
        datasets: &BTreeMap<String, DatasetRecord>,
        ids: &[u64],
    ) -> Result<u64> {
        let mut by_ds: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        // A few ids (a listing asks one at a time): a search each, which
        // stops at the first match; a set (policy pruning asks about
        // thousands): one pass over the records.
        let snaps: Vec<&DatasetRecord> = if ids.len() <= 8 {
            ids.iter()
                .map(|id| {
                    datasets
                        .values()
                        .find(|r| r.id == *id && r.is_snapshot())
                        .ok_or_else(|| Error::NotFound(format!("snapshot {id}")))
                })
                .collect::<Result<_>>()?
        } else {
            let wanted: HashSet<u64> = ids.iter().copied().collect();
            let found: Vec<&DatasetRecord> = datasets
                .values()
                .filter(|r| r.is_snapshot() && wanted.contains(&r.id))
                .collect();
            if found.len() < wanted.len() {
                return Err(Error::NotFound(format!(
                    "{} of {} snapshots",
                    wanted.len() - found.len(),
                    wanted.len()
                )));
            }
            found
        };
        for snap in snaps {
            by_ds
                .entry(snap.data_id())
                .or_default()
                .push(snap.created_txg);
        }
        for txgs in by_ds.values_mut() {
            txgs.sort_unstable();
        }
        let tx = self.db().begin_read().map_err(meta_err)?;
        let dead = tx.open_table(DEAD_LIST).map_err(meta_err)?;
        let mut total = 0;
        for (ds, doomed) in by_ds {
            let txgs = snapshot_txgs(datasets.values(), ds);
            for (first, last) in runs(&txgs, &doomed) {
                let (prev, next) = neighbours(&txgs, first, last);
                total += dead_rows(&dead, ds, first, next, prev)?
                    .iter()
                    .map(|(_, a)| a)
                    .sum::<u64>();
            }
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_group_adjacent_snapshots() {
        assert_eq!(runs(&[1, 2, 3, 4, 5], &[2, 3, 5]), vec![(2, 3), (5, 5)]);
        assert_eq!(runs(&[1, 2], &[]), vec![]);
        assert_eq!(neighbours(&[1, 2, 3], 2, 2), (1, 3));
        assert_eq!(neighbours(&[1, 2, 3], 1, 3), (0, u64::MAX));
    }
}

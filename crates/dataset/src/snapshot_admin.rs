//! The engine's snapshot commands: snapshot, destroy (datasets, snapshots,
//! ranges, dry runs), rollback, clone, holds and diff. Each change to the
//! block map rides on a txg commit (see `snapshot.rs`).

use crate::blockmap::{Chain, MAX_CHAIN};
use crate::engine::{check_new_dataset, split_dataset};
use crate::holders::Scope;
use crate::props::{self, DatasetRecord, Origin};
use crate::snapshot::{check_destroyable, Action, NewSnapshot};
use crate::txg::ImportedPool;
use crate::*;
use std::collections::BTreeMap;

/// Names of every dataset at or below `root` (not snapshots), deepest first.
pub(crate) fn subtree(datasets: &BTreeMap<String, DatasetRecord>, root: &str) -> Vec<String> {
    let prefix = format!("{root}/");
    let mut names: Vec<String> = datasets
        .values()
        .filter(|d| !d.is_snapshot() && (d.name == root || d.name.starts_with(&prefix)))
        .map(|d| d.name.clone())
        .collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.matches('/').count()));
    names
}

/// Snapshots of dataset `ds` (by name), oldest first.
fn snapshots_of<'a>(
    datasets: &'a BTreeMap<String, DatasetRecord>,
    ds: &str,
) -> Vec<&'a DatasetRecord> {
    let prefix = format!("{ds}@");
    let mut v: Vec<&DatasetRecord> = datasets
        .values()
        .filter(|d| d.is_snapshot() && d.name.starts_with(&prefix))
        .collect();
    v.sort_by_key(|d| d.created_txg);
    v
}

fn split_snapshot(name: &str) -> Result<(&str, &str)> {
    name.split_once('@')
        .filter(|(d, s)| !d.is_empty() && !s.is_empty())
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "'{name}' is not a snapshot name (DATASET@SNAPSHOT)"
            ))
        })
}

/// `a`, `a%b`, `%b`, `a%`, and comma lists of them, over one dataset's snapshots.
fn select_snapshots<'a>(
    snaps: &[&'a DatasetRecord],
    ds: &str,
    spec: &str,
) -> Result<Vec<&'a DatasetRecord>> {
    let index = |short: &str| -> Result<usize> {
        let full = format!("{ds}@{short}");
        snaps
            .iter()
            .position(|s| s.name == full)
            .ok_or_else(|| Error::NotFound(format!("snapshot '{full}'")))
    };
    let mut picked: Vec<usize> = Vec::new();
    for item in spec.split(',') {
        match item.split_once('%') {
            Some((a, b)) => {
                let lo = if a.is_empty() { 0 } else { index(a)? };
                let hi = if b.is_empty() {
                    snaps.len().saturating_sub(1)
                } else {
                    index(b)?
                };
                if snaps.is_empty() || lo > hi {
                    return Err(Error::InvalidArgument(format!(
                        "snapshot range '{item}': the first snapshot is newer than the last"
                    )));
                }
                picked.extend(lo..=hi);
            }
            None => picked.push(index(item)?),
        }
    }
    picked.sort_unstable();
    picked.dedup();
    Ok(picked.into_iter().map(|i| snaps[i]).collect())
}

impl Engine {
    /// `cistern snapshot [-r] DS@NAME...`: every snapshot at one point in
    /// time, the end of one txg: writes acknowledged before are in it,
    /// writes issued after it returns are not.
    pub fn snapshot(&self, names: &[String], recursive: bool) -> Result<Vec<String>> {
        let mut pool_name: Option<&str> = None;
        for name in names {
            let (pool, _) = split_dataset(name)?;
            split_snapshot(name)?;
            if pool_name.is_some_and(|p| p != pool) {
                return Err(Error::InvalidArgument(
                    "snapshots taken together must be in one pool".into(),
                ));
            }
            pool_name = Some(pool);
        }
        let Some(pool_name) = pool_name else {
            return Ok(Vec::new());
        };
        let p = self.pool(pool_name)?;
        let mut wanted: Vec<(u64, String)> = Vec::new();
        {
            let datasets = p.datasets.read();
            for name in names {
                let (ds, snap) = split_snapshot(name)?;
                let rec = datasets
                    .get(ds)
                    .filter(|d| !d.is_snapshot())
                    .ok_or_else(|| Error::NotFound(format!("dataset '{ds}'")))?;
                let targets = if recursive {
                    subtree(&datasets, ds)
                } else {
                    vec![rec.name.clone()]
                };
                for t in targets {
                    let full = format!("{t}@{snap}");
                    if datasets.contains_key(&full) || wanted.iter().any(|(_, n)| *n == full) {
                        return Err(Error::AlreadyExists(format!("snapshot '{full}'")));
                    }
                    wanted.push((datasets[&t].id, full));
                }
            }
            let ids: Vec<u64> = wanted.iter().map(|w| w.0).collect();
            p.check_snapshot(&datasets, &ids)?;
        }
        let first = p.next_dataset_ids(wanted.len() as u64)?;
        let list: Vec<NewSnapshot> = wanted
            .into_iter()
            .zip(first..)
            .map(|((dataset, name), id)| NewSnapshot { dataset, id, name })
            .collect();
        let created: Vec<String> = list.iter().map(|s| s.name.clone()).collect();
        p.commit_txg(Some(Action::Snapshot(list)))?;
        tracing::info!(snapshots = ?created, "snapshot taken");
        Ok(created)
    }

    /// `cistern destroy [-r] [-n] NAME`: a dataset (with `-r` its children
    /// and snapshots), or snapshots `DS@a`, `DS@a%b`, `DS@a,b`.
    pub fn destroy(&self, name: &str, opts: &DestroyOptions) -> Result<DestroyReport> {
        if name.contains('#') {
            return self.destroy_bookmark(name, opts.dry_run);
        }
        if let Some((ds, spec)) = name.split_once('@') {
            // The spec (`a%b,c`) is checked name by name against existing snapshots.
            let (pool, _) = split_dataset(ds)?;
            if spec.is_empty() {
                return Err(Error::InvalidArgument(format!(
                    "'{name}': no snapshot name after '@'"
                )));
            }
            return self.destroy_snapshots(&*self.pool(pool)?, ds, spec, opts);
        }
        let (pool, rest) = split_dataset(name)?;
        let p = self.pool(pool)?;
        if rest.is_none() {
            return Err(Error::InvalidArgument(format!(
                "'{name}' is a pool's root dataset: use `cistern pool destroy`"
            )));
        }
        let (heads, all, freed) = {
            let datasets = p.datasets.read();
            if !datasets.contains_key(name) {
                return Err(Error::NotFound(format!("dataset '{name}'")));
            }
            let mut heads = subtree(&datasets, name);
            if !opts.recursive && !opts.dependents {
                let below: Vec<String> = heads[..heads.len() - 1]
                    .iter()
                    .cloned()
                    .chain(snapshots_of(&datasets, name).iter().map(|s| s.name.clone()))
                    .collect();
                if !below.is_empty() {
                    let what = match (heads.len() > 1, below.iter().any(|n| n.contains('@'))) {
                        (true, true) => "children and snapshots",
                        (true, false) => "children",
                        _ => "snapshots",
                    };
                    return Err(Error::Busy(format!(
                        "cannot destroy '{name}': it has {what}\nuse '-r' to destroy the following datasets:\n{}",
                        below.join("\n")
                    )));
                }
            }
            // -R: clones of any snapshot going, with everything below them, until none is left.
            loop {
                let ids: Vec<u64> = heads.iter().map(|n| datasets[n].id).collect();
                let clones: Vec<String> = datasets
                    .values()
                    .filter(|d| {
                        d.origin.as_ref().is_some_and(|o| ids.contains(&o.dataset))
                            && !ids.contains(&d.id)
                    })
                    .map(|d| d.name.clone())
                    .collect();
                if clones.is_empty() {
                    break;
                }
                if !opts.dependents {
                    return Err(Error::Busy(format!(
                        "cannot destroy '{name}': it has dependent clones\nuse '-R' to destroy the following datasets:\n{}",
                        clones.join("\n")
                    )));
                }
                for c in clones {
                    for n in subtree(&datasets, &c) {
                        if !heads.contains(&n) {
                            heads.push(n);
                        }
                    }
                }
            }
            let ids: Vec<u64> = heads.iter().map(|n| datasets[n].id).collect();
            crate::crypt::check_destroy(&datasets, &ids)?;
            for snap in datasets
                .values()
                .filter(|d| d.is_snapshot() && ids.contains(&d.data_id()))
            {
                snap.check_not_held()?;
            }
            // Children before parents and clones before their origins.
            let mut order: Vec<String> = Vec::new();
            let mut left = heads.clone();
            while !left.is_empty() {
                let blocks = |n: &String| {
                    let id = datasets[n].id;
                    left.iter().any(|o| {
                        o != n
                            && (o.starts_with(&format!("{n}/"))
                                || datasets[o].origin.as_ref().is_some_and(|g| g.dataset == id))
                    })
                };
                let Some(i) = left.iter().position(|n| !blocks(n)) else {
                    return Err(Error::Busy(format!(
                        "cannot destroy '{name}': its clones depend on each other"
                    )));
                };
                order.push(left.remove(i));
            }
            let freed: u64 = order
                .iter()
                .map(|n| datasets[n].physical_used + datasets[n].snapshot_used)
                .sum();
            let mut all = Vec::new();
            for n in &order {
                all.extend(snapshots_of(&datasets, n).iter().map(|s| s.name.clone()));
                all.push(n.clone());
            }
            (order, all, freed)
        };
        if !opts.dry_run {
            // Every dataset and snapshot going, -R clones included.
            let _fence = self.fence(Scope::Names(all.clone()), opts.force, "destroy", |who| {
                format!("cannot destroy '{name}': dataset is busy (open by {who}); use -f to disconnect")
            })?;
            for n in &heads {
                p.destroy_dataset(n)?;
                tracing::info!(dataset = %n, "dataset destroyed");
            }
        }
        Ok(DestroyReport {
            destroyed: all,
            freed,
            dry_run: opts.dry_run,
        })
    }

    fn destroy_snapshots(
        &self,
        p: &ImportedPool,
        ds: &str,
        spec: &str,
        opts: &DestroyOptions,
    ) -> Result<DestroyReport> {
        let mut first = DestroyReport {
            destroyed: Vec::new(),
            freed: 0,
            dry_run: opts.dry_run,
        };
        if opts.dependents {
            // -R: the clones of these snapshots (and their dependents) go first.
            let clones: Vec<String> = {
                let datasets = p.datasets.read();
                let picked = self.pick_snapshots(&datasets, ds, spec, opts.recursive)?;
                let ids: Vec<u64> = picked.iter().map(|s| s.id).collect();
                datasets
                    .values()
                    .filter(|d| d.origin.as_ref().is_some_and(|o| ids.contains(&o.snapshot)))
                    .map(|d| d.name.clone())
                    .collect()
            };
            for c in clones {
                let r = self.destroy(&c, opts)?;
                first.destroyed.extend(r.destroyed);
                first.freed += r.freed;
            }
            if opts.dry_run && !first.destroyed.is_empty() {
                // The snapshots' own figures would count blocks the clones still share.
                let names = {
                    let datasets = p.datasets.read();
                    self.pick_snapshots(&datasets, ds, spec, opts.recursive)?
                        .iter()
                        .map(|s| s.name.clone())
                        .collect::<Vec<_>>()
                };
                first.destroyed.extend(names);
                return Ok(first);
            }
        }
        let (ids, names, estimate) = {
            let datasets = p.datasets.read();
            if datasets.get(ds).is_none_or(|d| d.is_snapshot()) {
                return Err(Error::NotFound(format!("dataset '{ds}'")));
            }
            let mut ids = Vec::new();
            let mut names = Vec::new();
            for s in self.pick_snapshots(&datasets, ds, spec, opts.recursive)? {
                check_destroyable(s, datasets.values())?;
                ids.push(s.id);
                names.push(s.name.clone());
            }
            let estimate = if opts.dry_run {
                Some(p.destroy_estimate(&datasets, &ids)?)
            } else {
                None
            };
            (ids, names, estimate)
        };
        let freed = if let Some(estimate) = estimate {
            estimate
        } else {
            let _fence = self.fence(Scope::Names(names.clone()), opts.force, "destroy", |who| {
                format!(
                    "cannot destroy '{ds}@{spec}': dataset is busy (open by {who}); use -f to disconnect"
                )
            })?;
            let outcome = p.commit_txg(Some(Action::DestroySnapshots(ids)))?;
            tracing::info!(snapshots = ?names, freed = outcome.freed, "snapshots destroyed");
            outcome.freed
        };
        first.destroyed.extend(names);
        Ok(DestroyReport {
            destroyed: first.destroyed,
            freed: first.freed + freed,
            dry_run: opts.dry_run,
        })
    }

    /// The snapshots `spec` names on `ds` (with `recursive`, on every
    /// dataset below that has them, as zfs).
    fn pick_snapshots<'a>(
        &self,
        datasets: &'a BTreeMap<String, DatasetRecord>,
        ds: &str,
        spec: &str,
        recursive: bool,
    ) -> Result<Vec<&'a DatasetRecord>> {
        let targets = if recursive {
            subtree(datasets, ds)
        } else {
            vec![ds.to_string()]
        };
        let mut out = Vec::new();
        for t in &targets {
            let snaps = snapshots_of(datasets, t);
            match select_snapshots(&snaps, t, spec) {
                Ok(v) => out.extend(v),
                // With -r, children without that snapshot are skipped (as zfs).
                Err(Error::NotFound(_)) if recursive && t != ds => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// `cistern rollback [-r] DS@SNAP`: the dataset becomes what it was at
    /// the snapshot; with `-r`, newer snapshots are destroyed first (in the
    /// same transaction).
    ///
    /// Refused while front ends have the dataset (or a snapshot `-r` would
    /// destroy) open: their view of the data would change under them.
    pub fn rollback(&self, snapshot: &str, recursive: bool) -> Result<Vec<String>> {
        self.rollback_with(snapshot, recursive, false)
    }

    /// [`Engine::rollback`]; `force` disconnects those clients first (they
    /// see ESHUTDOWN and must reconnect to see the rolled-back data).
    pub fn rollback_with(
        &self,
        snapshot: &str,
        recursive: bool,
        force: bool,
    ) -> Result<Vec<String>> {
        let (pool, _) = split_dataset(snapshot)?;
        let (ds, _) = split_snapshot(snapshot)?;
        let p = self.pool(pool)?;
        let (dataset, snap_id, later) = {
            let datasets = p.datasets.read();
            let snap = datasets
                .get(snapshot)
                .filter(|d| d.is_snapshot())
                .ok_or_else(|| Error::NotFound(format!("snapshot '{snapshot}'")))?;
            let later: Vec<&DatasetRecord> = snapshots_of(&datasets, ds)
                .into_iter()
                .filter(|s| s.created_txg > snap.created_txg)
                .collect();
            if !later.is_empty() && !recursive {
                return Err(Error::Busy(format!(
                    "'{snapshot}' is not the most recent snapshot; newer: {}; use -r to destroy them",
                    later
                        .iter()
                        .map(|s| s.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            (
                snap.data_id(),
                snap.id,
                later
                    .iter()
                    .map(|s| (s.id, s.name.clone()))
                    .collect::<Vec<_>>(),
            )
        };
        let mut fenced = vec![ds.to_string()];
        fenced.extend(later.iter().map(|l| l.1.clone()));
        // Mounted filesystems follow the rollback (as ZFS's): they write
        // back their caches first and drop them after.
        let followers = self.rollback_followers(ds);
        for f in &followers {
            f(crate::holders::RollbackPhase::Before);
        }
        let done = (|| {
            let _fence = self.fence_for_rollback(Scope::Names(fenced), force, |who| {
                format!(
                    "cannot rollback '{ds}': dataset is busy (open by {who}); its clients would see \
                     its data change under them: use -f to disconnect them first"
                )
            })?;
            p.commit_txg(Some(Action::Rollback {
                dataset,
                snapshot: snap_id,
                destroy_later: later.iter().map(|l| l.0).collect(),
            }))
        })();
        for f in &followers {
            f(crate::holders::RollbackPhase::After);
        }
        done?;
        tracing::info!(snapshot, destroyed = later.len(), "rolled back");
        Ok(later.into_iter().map(|l| l.1).collect())
    }

    /// What `rollback -r SNAP` would do, changing nothing: the newer
    /// snapshots it destroys, the bytes only they hold (freed with them),
    /// and the bytes of the dataset changed since SNAP (discarded).
    pub fn rollback_preview(&self, snapshot: &str) -> Result<RollbackPreview> {
        let (pool, _) = split_dataset(snapshot)?;
        let (ds, _) = split_snapshot(snapshot)?;
        let p = self.pool(pool)?;
        let (later, frees) = {
            let datasets = p.datasets.read();
            let snap = datasets
                .get(snapshot)
                .filter(|d| d.is_snapshot())
                .ok_or_else(|| Error::NotFound(format!("snapshot '{snapshot}'")))?;
            let later: Vec<&DatasetRecord> = snapshots_of(&datasets, ds)
                .into_iter()
                .filter(|s| s.created_txg > snap.created_txg)
                .collect();
            let ids: Vec<u64> = later.iter().map(|s| s.id).collect();
            let frees = if ids.is_empty() {
                0
            } else {
                p.destroy_estimate(&datasets, &ids)?
            };
            (
                later.iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
                frees,
            )
        };
        let changed = self.diff(snapshot, None)?.changed_bytes;
        Ok(RollbackPreview {
            snapshot: snapshot.to_string(),
            destroys: later,
            frees_snapshot_bytes: frees,
            discards_changed_bytes: changed,
        })
    }

    /// `cistern clone SNAP NEW`: a writable dataset that starts as the
    /// snapshot and shares its blocks until it overwrites them.
    pub fn clone_snapshot(
        &self,
        snapshot: &str,
        name: &str,
        props_in: &[(String, String)],
    ) -> Result<DatasetInfo> {
        let (pool, _) = split_dataset(snapshot)?;
        let (new_pool, rest) = split_dataset(name)?;
        if name.contains('@') || rest.is_none() {
            return Err(Error::InvalidArgument(format!(
                "'{name}': a clone is named POOL/DATASET"
            )));
        }
        if new_pool != pool {
            return Err(Error::InvalidArgument(format!(
                "'{name}': a clone must be in the pool of its origin ('{pool}')"
            )));
        }
        let p = self.pool(pool)?;
        let mut rec = {
            let datasets = p.datasets.read();
            let snap = datasets
                .get(snapshot)
                .filter(|d| d.is_snapshot())
                .ok_or_else(|| Error::NotFound(format!("snapshot '{snapshot}'")))?;
            check_new_dataset(&datasets, name)?;
            if Chain::of(snap, datasets.values()).0.len() >= MAX_CHAIN {
                return Err(Error::InvalidArgument(format!(
                    "'{snapshot}' is a clone {MAX_CHAIN} levels deep; promote or copy instead"
                )));
            }
            let mut local = BTreeMap::new();
            for (k, v) in props_in {
                local.insert(k.clone(), props::normalize(k, v)?);
            }
            // A clone's names were made under its origin's name rules: it keeps them.
            let head = datasets.values().find(|r| r.id == snap.data_id());
            if head.is_some_and(|h| h.kind == DatasetKind::Filesystem) {
                let origin = crate::txg::lineage(&datasets, snap);
                for prop in props::CREATE_ONLY {
                    let theirs = origin.resolve(prop).0;
                    if local.get(*prop).is_some_and(|v| *v != theirs) {
                        return Err(Error::InvalidArgument(format!(
                            "'{name}': a clone keeps its origin's {prop} ({theirs})"
                        )));
                    }
                }
                props::pin_create_only(&origin, &mut local);
            }
            // Clones are sparse unless asked (as zfs); space limits as on create.
            if let Some(v) = local.get_mut("refreservation").filter(|v| *v == "auto") {
                *v = p
                    .volume_reservation(snap.volsize, snap.volblocksize)
                    .to_string();
            }
            local.retain(|_, v| v != "none");
            p.check_new(&datasets, name, &local)?;
            DatasetRecord {
                id: 0,
                name: name.to_string(),
                // The kind of its origin: a bucket's clone is a bucket.
                kind: match datasets.values().find(|r| r.id == snap.data_id()) {
                    Some(head) => head.kind,
                    None if snap.volblocksize != 0 => DatasetKind::Volume,
                    None => DatasetKind::Filesystem,
                },
                volsize: snap.volsize,
                volblocksize: snap.volblocksize,
                local,
                created_txg: p.open.lock().txg,
                creation: crate::txg::now_secs(),
                origin: Some(Origin {
                    dataset: snap.data_id(),
                    txg: snap.created_txg,
                    snapshot: snap.id,
                }),
                // A clone reads its origin's blocks: it shares the origin's
                // encryption root and key (as zfs).
                crypt: crate::crypt::crypt_of(&datasets, snap.id).map(|c| {
                    Box::new(crate::crypt::CryptRecord {
                        root: c.root,
                        algo: c.algo,
                        wrap: None,
                        names: c.names,
                        wrapped_by: None,
                    })
                }),
                ..Default::default()
            }
        };
        rec.id = p.next_dataset_id()?;
        p.commit_txg(Some(Action::Clone(Box::new(rec))))?;
        tracing::info!(origin = snapshot, clone = name, "clone created");
        self.dataset(name)
    }

    /// `cistern promote CLONE`: the clone takes over its origin's snapshots
    /// up to the origin snapshot (renamed `CLONE@...`) and the origin becomes
    /// a clone of it, so the origin can be destroyed without the clone.
    pub fn promote(&self, name: &str) -> Result<()> {
        let (pool, _) = split_dataset(name)?;
        let p = self.pool(pool)?;
        let id = {
            let datasets = p.datasets.read();
            let rec = datasets
                .get(name)
                .filter(|d| !d.is_snapshot())
                .ok_or_else(|| Error::NotFound(format!("dataset '{name}'")))?;
            if rec.origin.is_none() {
                return Err(Error::InvalidArgument(format!("'{name}' is not a clone")));
            }
            rec.id
        };
        // The encryption root may move to the clone (crypt::promote_root).
        let origin = p
            .datasets
            .read()
            .values()
            .find(|d| d.id == id)
            .and_then(|d| d.origin.as_ref().map(|o| o.dataset));
        if let Some(o) = origin {
            p.keys.share(o, id);
        }
        let done = p.commit_txg(Some(Action::Promote(id)));
        p.keys.retain_roots(&p.datasets.read());
        done?;
        tracing::info!(dataset = name, "clone promoted");
        Ok(())
    }

    /// `cistern hold TAG SNAP...` / `cistern release TAG SNAP...`.
    pub fn set_hold(
        &self,
        tag: &str,
        snapshots: &[String],
        recursive: bool,
        hold: bool,
    ) -> Result<()> {
        if tag.is_empty() || tag.len() > 256 {
            return Err(Error::InvalidArgument(format!(
                "hold tag '{tag}' must be 1 to 256 characters"
            )));
        }
        for snapshot in snapshots {
            let (pool, _) = split_dataset(snapshot)?;
            let (ds, snap) = split_snapshot(snapshot)?;
            let p = self.pool(pool)?;
            let targets: Vec<DatasetRecord> = {
                let datasets = p.datasets.read();
                let names = if recursive {
                    subtree(&datasets, ds)
                } else {
                    vec![ds.to_string()]
                };
                let mut out = Vec::new();
                for n in names {
                    match datasets.get(&format!("{n}@{snap}")) {
                        Some(r) => out.push(r.clone()),
                        None if recursive && n != ds => {}
                        None => return Err(Error::NotFound(format!("snapshot '{snapshot}'"))),
                    }
                }
                out
            };
            for mut rec in targets {
                if hold && !rec.holds.insert(tag.to_string()) {
                    return Err(Error::AlreadyExists(format!(
                        "hold '{tag}' on '{}'",
                        rec.name
                    )));
                }
                if !hold && !rec.holds.remove(tag) {
                    return Err(Error::NotFound(format!("hold '{tag}' on '{}'", rec.name)));
                }
                p.store_dataset(&rec)?;
                tracing::info!(snapshot = %rec.name, tag, hold, "hold changed");
            }
        }
        Ok(())
    }

    /// `cistern holds SNAP...`: (snapshot, tag) pairs.
    pub fn holds(&self, snapshots: &[String]) -> Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        for snapshot in snapshots {
            let (pool, _) = split_dataset(snapshot)?;
            let p = self.pool(pool)?;
            let datasets = p.datasets.read();
            let rec = datasets
                .get(snapshot)
                .filter(|d| d.is_snapshot())
                .ok_or_else(|| Error::NotFound(format!("snapshot '{snapshot}'")))?;
            out.extend(rec.holds.iter().map(|t| (rec.name.clone(), t.clone())));
        }
        Ok(out)
    }

    /// `cistern diff SNAP [SNAP|DS]`: byte ranges whose blocks changed
    /// between a snapshot and a later snapshot or the dataset now.
    pub fn diff(&self, from: &str, to: Option<&str>) -> Result<DiffReport> {
        let (pool, _) = split_dataset(from)?;
        let (ds, _) = split_snapshot(from)?;
        let p = self.pool(pool)?;
        let (data_id, after, upto, bs, size, to_name, chains, filesystem) = {
            let datasets = p.datasets.read();
            let snap = datasets
                .get(from)
                .filter(|d| d.is_snapshot())
                .ok_or_else(|| Error::NotFound(format!("snapshot '{from}'")))?;
            let to_name = to.unwrap_or(ds).to_string();
            let upto = match to {
                None => u64::MAX,
                Some(t) if t == ds => u64::MAX,
                Some(t) => {
                    let later = datasets
                        .get(t)
                        .filter(|d| d.is_snapshot() && d.dataset_name() == ds)
                        .ok_or_else(|| {
                            Error::InvalidArgument(format!(
                                "'{t}' is neither '{ds}' nor one of its snapshots"
                            ))
                        })?;
                    if later.created_txg < snap.created_txg {
                        return Err(Error::InvalidArgument(format!(
                            "'{t}' is older than '{from}'"
                        )));
                    }
                    later.created_txg
                }
            };
            // Buckets and filesystems: what changed is names and objects.
            let objects = snap.volblocksize == 0;
            let chains = objects.then(|| {
                let to_rec = datasets.get(&to_name).unwrap_or(snap);
                (
                    crate::blockmap::Chain::of(snap, datasets.values()),
                    crate::blockmap::Chain::of(to_rec, datasets.values()),
                )
            });
            (
                snap.data_id(),
                snap.created_txg,
                upto,
                snap.volblocksize.max(1) as u64,
                snap.volsize,
                to_name,
                chains,
                datasets
                    .get(ds)
                    .is_some_and(|h| h.kind == DatasetKind::Filesystem),
            )
        };
        if upto == u64::MAX {
            p.sync_now()?; // uncommitted writes count
        }
        if let Some((from_chain, to_chain)) = chains {
            let names = if filesystem {
                crate::objects::diff_paths(&p, data_id, &from_chain, &to_chain, after, upto)?
            } else {
                crate::objects::diff_names(&p, data_id, &from_chain, &to_chain, after, upto)?
            };
            return Ok(DiffReport {
                from: from.to_string(),
                to: to_name,
                changed_bytes: 0,
                ranges: Vec::new(),
                names,
            });
        }
        let changed = p.view()?.changed(
            data_id,
            crate::objects::VOLUME_OBJECT,
            0,
            u64::MAX,
            after,
            upto,
        )?;
        let mut ranges: Vec<ChangedRange> = Vec::new();
        for blk in changed {
            let offset = blk * bs;
            match ranges.last_mut() {
                Some(r) if r.offset + r.length == offset => r.length += bs,
                _ => ranges.push(ChangedRange { offset, length: bs }),
            }
        }
        for r in &mut ranges {
            r.length = r.length.min(size.saturating_sub(r.offset));
        }
        Ok(DiffReport {
            from: from.to_string(),
            to: to_name,
            changed_bytes: ranges.iter().map(|r| r.length).sum(),
            ranges,
            names: Vec::new(),
        })
    }
}

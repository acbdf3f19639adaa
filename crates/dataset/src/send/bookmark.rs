//! Bookmarks (`cistern bookmark POOL/DS@SNAP POOL/DS#NAME`), as ZFS: a
//! snapshot's point in time (its txg) kept after the snapshot is destroyed,
//! usable as the source of an incremental send. A bookmark holds no
//! blocks: an incremental stream only needs the rows born after its txg
//! (birth txgs) and the tombstones of rows removed since, which the txg
//! commit keeps while a bookmark is older than them (snapshot.rs
//! `VersionChange::latest_bookmark`). Stored in the dataset's record
//! (`bookmarks`, absent when empty; decision 0040).

use crate::engine::split_dataset;
use crate::names::check_component;
use crate::*;
use serde::{Deserialize, Serialize};

/// One bookmark, kept in its dataset's record under its short name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Bookmark {
    /// The snapshot it was made from (`@short`): what a receiver must hold
    /// to apply an incremental stream from this bookmark.
    pub snapshot: String,
    /// The snapshot's txg (`createtxg`).
    pub txg: u64,
    /// The snapshot's creation time (unix seconds).
    pub creation: u64,
    /// The snapshot's record id (its identity on this pool, as ZFS's guid).
    pub guid: u64,
}

/// A bookmark as listed (`cistern list -t bookmark`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BookmarkInfo {
    /// `pool/ds#name`.
    pub name: String,
    pub snapshot: String,
    pub createtxg: u64,
    pub creation: u64,
    pub guid: u64,
}

/// `pool/ds#name` (or `#name` with `ds` given) into (dataset, name).
pub(crate) fn split_bookmark<'a>(name: &'a str, ds: Option<&'a str>) -> Result<(&'a str, &'a str)> {
    let (d, b) = name.split_once('#').ok_or_else(|| {
        Error::InvalidArgument(format!(
            "'{name}' is not a bookmark name (DATASET#BOOKMARK)"
        ))
    })?;
    let d = if d.is_empty() { ds.unwrap_or("") } else { d };
    if d.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "'{name}': a bookmark's dataset must be named (DATASET#BOOKMARK)"
        )));
    }
    check_component("bookmark", b)?;
    Ok((d, b))
}

impl Engine {
    /// `cistern bookmark SNAP BOOKMARK`: keeps `snapshot`'s point in time
    /// as `dataset#name` (`#name`: the snapshot's dataset).
    pub fn bookmark(&self, snapshot: &str, bookmark: &str) -> Result<()> {
        let (ds, snap) = snapshot.split_once('@').ok_or_else(|| {
            Error::InvalidArgument(format!(
                "cannot create bookmark: '{snapshot}' is not a snapshot (DATASET@SNAPSHOT)"
            ))
        })?;
        let (bds, name) = split_bookmark(bookmark, Some(ds))?;
        if bds != ds {
            return Err(Error::InvalidArgument(format!(
                "cannot create bookmark '{bookmark}': it must be in the snapshot's dataset '{ds}'"
            )));
        }
        let (pool, _) = split_dataset(ds)?;
        let p = self.pool(pool)?;
        let head = {
            let datasets = p.datasets.read();
            let s = datasets
                .get(snapshot)
                .filter(|r| r.is_snapshot())
                .ok_or_else(|| Error::NotFound(format!("snapshot '{snapshot}'")))?;
            let head = datasets
                .get(ds)
                .cloned()
                .ok_or_else(|| Error::NotFound(format!("dataset '{ds}'")))?;
            if head.bookmarks.contains_key(name) {
                return Err(Error::AlreadyExists(format!("bookmark '{ds}#{name}'")));
            }
            let mut head = head;
            head.bookmarks.insert(
                name.to_string(),
                Bookmark {
                    snapshot: snap.to_string(),
                    txg: s.created_txg,
                    creation: s.creation,
                    guid: s.id,
                },
            );
            head
        };
        p.store_dataset(&head)?;
        tracing::info!(snapshot, bookmark = %format!("{ds}#{name}"), "bookmark created");
        Ok(())
    }

    /// `cistern destroy POOL/DS#NAME`.
    pub fn destroy_bookmark(&self, bookmark: &str, dry_run: bool) -> Result<DestroyReport> {
        let (ds, name) = split_bookmark(bookmark, None)?;
        let (pool, _) = split_dataset(ds)?;
        let p = self.pool(pool)?;
        let mut head = p
            .datasets
            .read()
            .get(ds)
            .filter(|r| !r.is_snapshot())
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("dataset '{ds}'")))?;
        if head.bookmarks.remove(name).is_none() {
            return Err(Error::NotFound(format!("bookmark '{ds}#{name}'")));
        }
        if !dry_run {
            p.store_dataset(&head)?;
            tracing::info!(bookmark, "bookmark destroyed");
        }
        Ok(DestroyReport {
            destroyed: vec![format!("{ds}#{name}")],
            freed: 0,
            dry_run,
        })
    }

    /// The bookmarks of `root` and the datasets below it (every one when
    /// `root` is `None`), by name.
    pub fn bookmarks(&self, root: Option<&str>) -> Result<Vec<BookmarkInfo>> {
        let pools: Vec<String> = match root {
            Some(r) => vec![split_dataset(r)?.0.to_string()],
            None => self.list_pools().into_iter().map(|p| p.name).collect(),
        };
        let mut out = Vec::new();
        for pool in pools {
            let p = self.pool(&pool)?;
            let datasets = p.datasets.read();
            if let Some(r) = root {
                if !datasets.contains_key(r) {
                    return Err(Error::NotFound(format!("dataset '{r}'")));
                }
            }
            for rec in datasets.values().filter(|r| !r.is_snapshot()) {
                let inside =
                    root.is_none_or(|r| rec.name == r || rec.name.starts_with(&format!("{r}/")));
                if !inside {
                    continue;
                }
                for (name, b) in &rec.bookmarks {
                    out.push(BookmarkInfo {
                        name: format!("{}#{name}", rec.name),
                        snapshot: format!("{}@{}", rec.name, b.snapshot),
                        createtxg: b.txg,
                        creation: b.creation,
                        guid: b.guid,
                    });
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

//! `pool history`: the commands that changed a pool, kept on the pool itself
//! (a table of its metadata store), so they survive export, import and
//! restarts. As ZFS's pool history: a ring bounded in bytes whose first
//! record (the creation) is never dropped, plus internal events (`-i`)
//! stamped with the open txg.

use crate::txg::{meta_err, now_secs, ImportedPool};
use crate::{Error, Result};
use meta::redb::{ReadableDatabase, ReadableTable};
use meta::schema::{HISTORY, POOL_RECORDS, RECORD_HISTORY_BYTES, RECORD_HISTORY_NEXT, VDEV_PATHS};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::PathBuf;

/// Bytes of history kept per pool (ZFS keeps at least 128 KiB).
pub const HISTORY_MAX_BYTES: u64 = 128 << 10;
/// Longest command line kept (longer ones are cut).
const MAX_COMMAND: usize = 4096;

/// Who ran a command and what they typed, as the client sent it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Caller {
    pub command: String,
    pub user: String,
    pub host: String,
}

/// One history record.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HistoryRecord {
    /// Unix seconds.
    pub time: u64,
    /// The command line (user commands) or what happened (internal events).
    pub command: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub user: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host: String,
    /// An internal event (`pool history -i`).
    #[serde(default)]
    pub internal: bool,
    /// The txg open when it was recorded.
    pub txg: u64,
}

/// Appends a record and trims the ring to [`HISTORY_MAX_BYTES`].
pub(crate) fn append(p: &ImportedPool, mut rec: HistoryRecord) -> Result<()> {
    if rec.command.len() > MAX_COMMAND {
        let mut end = MAX_COMMAND;
        while !rec.command.is_char_boundary(end) {
            end -= 1;
        }
        rec.command.truncate(end);
        rec.command.push_str("...");
    }
    let bytes = serde_json::to_vec(&rec).map_err(meta_err)?;
    let _meta = p.meta_lock.lock();
    let tx = p.db().begin_write().map_err(meta_err)?;
    {
        let mut r = tx.open_table(POOL_RECORDS).map_err(meta_err)?;
        let get = |r: &meta::redb::Table<&str, u64>, k: &str| -> Result<u64> {
            Ok(r.get(k).map_err(meta_err)?.map_or(0, |v| v.value()))
        };
        let seq = get(&r, RECORD_HISTORY_NEXT)?;
        let mut total = get(&r, RECORD_HISTORY_BYTES)? + bytes.len() as u64;
        let mut h = tx.open_table(HISTORY).map_err(meta_err)?;
        h.insert(seq, bytes.as_slice()).map_err(meta_err)?;
        // Oldest first, keeping the first record (the pool's creation).
        let mut drop = Vec::new();
        if total > HISTORY_MAX_BYTES {
            for row in h.iter().map_err(meta_err)?.skip(1) {
                let (k, v) = row.map_err(meta_err)?;
                if total <= HISTORY_MAX_BYTES || k.value() == seq {
                    break;
                }
                total -= v.value().len() as u64;
                drop.push(k.value());
            }
        }
        for k in drop {
            h.remove(k).map_err(meta_err)?;
        }
        r.insert(RECORD_HISTORY_NEXT, seq + 1).map_err(meta_err)?;
        r.insert(RECORD_HISTORY_BYTES, total).map_err(meta_err)?;
    }
    tx.commit().map_err(meta_err)
}

/// A user command that changed the pool.
pub(crate) fn log_command(p: &ImportedPool, caller: &Caller) -> Result<()> {
    // Read in a statement of its own: a guard taken inside the call below
    // would live through `append`, which takes meta_lock, while a txg
    // commit holds meta_lock and waits for `open` (a deadlock).
    let txg = p.open.lock().txg;
    append(
        p,
        HistoryRecord {
            time: now_secs(),
            command: caller.command.clone(),
            user: caller.user.clone(),
            host: caller.host.clone(),
            internal: false,
            txg,
        },
    )
}

/// An internal event (`pool history -i`); failures are logged, not returned:
/// the change it describes has happened.
pub(crate) fn log_internal(p: &ImportedPool, what: &str) {
    if p.is_closed() {
        return;
    }
    let rec = HistoryRecord {
        time: now_secs(),
        command: what.to_string(),
        user: String::new(),
        host: String::new(),
        internal: true,
        txg: p.open.lock().txg,
    };
    if let Err(e) = append(p, rec) {
        tracing::warn!(pool = %p.pool.name, error = %e, "cannot record history");
    }
}

/// Every record kept, oldest first.
pub(crate) fn read(p: &ImportedPool) -> Result<Vec<HistoryRecord>> {
    read_json_rows(p, HISTORY, "history record")
}

/// The JSON records of a log table keyed by sequence number, oldest first;
/// none when a pool made before the table existed lacks it.
pub(crate) fn read_json_rows<T: serde::de::DeserializeOwned>(
    p: &ImportedPool,
    table: meta::redb::TableDefinition<u64, &[u8]>,
    what: &str,
) -> Result<Vec<T>> {
    let tx = p.db().begin_read().map_err(meta_err)?;
    let h = match tx.open_table(table) {
        Ok(h) => h,
        Err(meta::redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(meta_err(e)),
    };
    let mut out = Vec::new();
    for row in h.iter().map_err(meta_err)? {
        let (_, v) = row.map_err(meta_err)?;
        out.push(
            serde_json::from_slice(v.value())
                .map_err(|e| Error::Corrupt(format!("{what}: {e}")))?,
        );
    }
    Ok(out)
}

/// Records the path each present device was opened at (create, import,
/// add, replace, attach), so a device missing later is named by it.
pub(crate) fn store_vdev_paths(p: &ImportedPool) -> Result<()> {
    let present: Vec<(u64, PathBuf)> = p
        .pool
        .groups()
        .iter()
        .flat_map(|g| g.children())
        .filter_map(|c| c.device.map(|d| (c.guid, d.path().to_path_buf())))
        .collect();
    let known = vdev_paths(p)?;
    if present.iter().all(|(g, path)| known.get(g) == Some(path)) {
        return Ok(());
    }
    let _meta = p.meta_lock.lock();
    let tx = p.db().begin_write().map_err(meta_err)?;
    {
        let mut t = tx.open_table(VDEV_PATHS).map_err(meta_err)?;
        // Only guids of the current layout: replaced devices are forgotten.
        let current: Vec<u64> = p
            .pool
            .groups()
            .iter()
            .flat_map(|g| g.children())
            .map(|c| c.guid)
            .collect();
        let stale: Vec<u64> = known
            .keys()
            .filter(|g| !current.contains(g))
            .copied()
            .collect();
        for g in stale {
            t.remove(g).map_err(meta_err)?;
        }
        for (g, path) in &present {
            t.insert(*g, path.to_string_lossy().as_ref())
                .map_err(meta_err)?;
        }
    }
    tx.commit().map_err(meta_err)
}

/// Device guid -> last known path.
pub(crate) fn vdev_paths(p: &ImportedPool) -> Result<HashMap<u64, PathBuf>> {
    let tx = p.db().begin_read().map_err(meta_err)?;
    let t = match tx.open_table(VDEV_PATHS) {
        Ok(t) => t,
        Err(meta::redb::TableError::TableDoesNotExist(_)) => return Ok(HashMap::new()),
        Err(e) => return Err(meta_err(e)),
    };
    let mut out = HashMap::new();
    for row in t.iter().map_err(meta_err)? {
        let (k, v) = row.map_err(meta_err)?;
        out.insert(k.value(), PathBuf::from(v.value()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Engine, EngineConfig, GroupKind, GroupSpec, PoolSpec};

    fn engine_with_pool(dir: &std::path::Path) -> std::sync::Arc<Engine> {
        let engine = Engine::open(
            &dir.join("state"),
            EngineConfig {
                txg_timeout_secs: 3600.0,
                ..Default::default()
            },
        )
        .unwrap();
        engine
            .create_pool(PoolSpec {
                name: "tank".into(),
                groups: vec![GroupSpec {
                    kind: GroupKind::Mirror,
                    devices: vec![dir.join("d0"), dir.join("d1")],
                }],
                create_size: Some(128 << 20),
                force: false,
            })
            .unwrap();
        engine
    }

    #[test]
    fn ring_is_bounded_and_keeps_the_creation() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine_with_pool(dir.path());
        let p = engine.pool("tank").unwrap();
        // ~1 KiB a record: 200 of them overflow the ring.
        let pad = "x".repeat(1000);
        for i in 0..200 {
            let caller = Caller {
                command: format!("cistern set com.example:note={pad} tank/v{i}"),
                user: "root".into(),
                host: "h".into(),
            };
            log_command(&p, &caller).unwrap();
        }
        let recs = read(&p).unwrap();
        let bytes: usize = recs
            .iter()
            .map(|r| serde_json::to_vec(r).unwrap().len())
            .sum();
        assert!(bytes as u64 <= HISTORY_MAX_BYTES, "{bytes}");
        assert!(recs[0].internal && recs[0].command.starts_with("create pool"));
        assert!(recs.last().unwrap().command.ends_with("tank/v199"));
        assert!(recs.len() > 100, "{}", recs.len());
    }

    /// A pool made before the history existed (no `history`/`vdev_paths`
    /// tables) reads as an empty history, and gets both at its next import.
    #[test]
    fn pool_without_the_tables_opens_with_an_empty_history() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine_with_pool(dir.path());
        {
            let p = engine.pool("tank").unwrap();
            let _meta = p.meta_lock.lock();
            let tx = p.db().begin_write().unwrap();
            tx.delete_table(HISTORY).unwrap();
            tx.delete_table(VDEV_PATHS).unwrap();
            {
                let mut r = tx.open_table(POOL_RECORDS).unwrap();
                r.remove(RECORD_HISTORY_NEXT).unwrap();
                r.remove(RECORD_HISTORY_BYTES).unwrap();
            }
            tx.commit().unwrap();
        }
        {
            let p = engine.pool("tank").unwrap();
            assert!(read(&p).unwrap().is_empty());
            assert!(vdev_paths(&p).unwrap().is_empty());
            // The table is gone: the read transaction must not create it.
            let tx = p.db().begin_read().unwrap();
            assert!(tx.open_table(HISTORY).is_err());
        }
        engine.export_pool("tank").unwrap();
        engine
            .import_pool("tank", &[dir.path().to_path_buf()], false)
            .unwrap();
        let p = engine.pool("tank").unwrap();
        let recs = read(&p).unwrap();
        let what: Vec<&str> = recs.iter().map(|r| r.command.as_str()).collect();
        assert_eq!(what, ["export", "import"]);
        assert_eq!(vdev_paths(&p).unwrap().len(), 2);
    }
}

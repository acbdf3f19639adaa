//! `cistern send` and `cistern receive` (ZFS's send streams): a snapshot
//! as the object layer's rows — block rows `(dataset, address, birth)`,
//! name rows and tombstones — so volumes, buckets and filesystems all send
//! the same way. An incremental stream holds the rows whose newest version
//! at the snapshot was born after the source snapshot's txg, found from the
//! block map's birth txgs, never by comparing data (decision 0033).

pub mod bookmark;
pub mod stream;

use crate::blockmap::{self, block_of, Addr, Chain};
use crate::engine::split_dataset;
use crate::objects::FIRST_DYNAMIC_OBJECT;
use crate::props::DatasetRecord;
use crate::txg::{meta_err, Dirty, ImportedPool};
use crate::*;
use serde::{Deserialize, Serialize};
use stream::Kind;

/// What `cistern send` sends.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SendOptions {
    /// `pool/ds@snap`.
    pub snapshot: String,
    /// Incremental source: `pool/ds@snap`, `@snap` (`-i`).
    pub from: Option<String>,
    /// `-I`: every snapshot between `from` and `snapshot` too.
    pub intermediates: bool,
    /// `-R`: the dataset, its children, their snapshots and properties.
    pub recursive: bool,
    /// `-w`: blocks exactly as stored.
    pub raw: bool,
    /// `-t`: continue the transfer this `receive_resume_token` describes.
    pub resume_token: Option<String>,
}

/// What a send wrote.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SendSummary {
    /// Snapshots in the stream, in order (full names).
    pub snapshots: Vec<String>,
    pub bytes: u64,
    pub records: u64,
}

/// What `cistern receive` does with a stream.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ReceiveOptions {
    /// `pool/ds` (or `pool/ds@snap` to name the received snapshot).
    pub target: String,
    /// `-F`: roll the target back to the stream's source snapshot first.
    pub force: bool,
    /// `-s`: keep an interrupted receive's state for `send -t`.
    pub resumable: bool,
}

/// What a receive made.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReceiveSummary {
    /// Snapshots created, in order (full names).
    pub snapshots: Vec<String>,
    /// `receive -F` of an incremental `-R` stream: datasets destroyed
    /// because the source no longer has them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub destroyed: Vec<String>,
    pub bytes: u64,
    pub records: u64,
}

/// The record that opens one snapshot's part of a stream.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Begin {
    /// The snapshot sent, full source name.
    pub snapshot: String,
    /// Incremental: the source snapshot's short name (`@a`).
    pub from: Option<String>,
    pub from_txg: u64,
    pub to_txg: u64,
    pub kind: DatasetKind,
    pub volsize: u64,
    pub volblocksize: u32,
    pub next_object: u64,
    /// A resumed transfer (`send -t`): rows after this address (hex) only.
    pub resume_after: Option<String>,
    /// `-R` streams: the dataset below the stream's top (`""` the top
    /// itself, `/child/grandchild`), received under the target the same way.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dataset: Option<String>,
    /// `-R` streams: the dataset's locally set properties (a new dataset
    /// is created with them).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub props: std::collections::BTreeMap<String, String>,
}

/// What a dataset's record keeps while a receive into it runs (and, with
/// `-s`, after one was interrupted): enough to put the target back as it
/// was, or to resume.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReceiveState {
    /// The source snapshot received (its full name on the sender).
    pub snapshot: String,
    /// The snapshot's name on the target (`@short`).
    pub short: String,
    /// Incremental: the target's snapshot the stream applies to.
    pub base: Option<String>,
    /// Incremental: the source's short name of that snapshot.
    pub from: Option<String>,
    pub from_txg: u64,
    pub to_txg: u64,
    /// `-s`: kept after an interruption, with a resume token.
    pub resumable: bool,
    /// Every row up to this address (hex) is committed.
    pub after: Option<String>,
}

/// What a resume token carries (`receive_resume_token`, `send -t`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
struct Token {
    snapshot: String,
    from: Option<String>,
    from_txg: u64,
    to_txg: u64,
    after: Option<String>,
}

const TOKEN_PREFIX: &str = "1-";

impl ReceiveState {
    /// The resume token of an interrupted `-s` receive.
    pub fn token(&self) -> Option<String> {
        if !self.resumable {
            return None;
        }
        let t = Token {
            snapshot: self.snapshot.clone(),
            from: self.from.clone(),
            from_txg: self.from_txg,
            to_txg: self.to_txg,
            after: self.after.clone(),
        };
        let json = serde_json::to_vec(&t).ok()?;
        Some(format!("{TOKEN_PREFIX}{}", hex(&json)))
    }
}

fn decode_token(t: &str) -> Result<Token> {
    let bad = || Error::InvalidArgument(format!("cannot resume send: invalid resume token '{t}'"));
    let body = t.trim().strip_prefix(TOKEN_PREFIX).ok_or_else(bad)?;
    let json = unhex(body).ok_or_else(bad)?;
    serde_json::from_slice(&json).map_err(|_| bad())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The address of a received row (its place in the stream's order).
fn row_addr(r: &Row) -> Vec<u8> {
    match r {
        Row::Data { obj, blk, .. } => blockmap::block_addr(*obj, *blk).to_vec(),
        Row::Free { addr } => addr.clone(),
        Row::Name { dir, name, .. } => blockmap::name_addr(*dir, name),
    }
}

/// Writes (or clears) the receive state of `target` in its record, durably.
fn set_state(p: &ImportedPool, target: &str, st: Option<ReceiveState>) -> Result<()> {
    let mut rec = p
        .datasets
        .read()
        .get(target)
        .cloned()
        .ok_or_else(|| Error::NotFound(format!("dataset '{target}'")))?;
    rec.receive = st.map(Box::new);
    p.store_dataset(&rec)
}

/// At import: every receive that was running when the daemon died. One
/// whose snapshot exists had finished; one with `-s` keeps its partial
/// rows and token; any other is undone (the dataset it created destroyed,
/// or the target rolled back to the stream's base snapshot).
pub(crate) fn recover_receives(p: &ImportedPool) {
    let marked: Vec<DatasetRecord> = p
        .datasets
        .read()
        .values()
        .filter(|r| r.receive.is_some())
        .cloned()
        .collect();
    for rec in marked {
        let Some(st) = rec.receive.as_deref().cloned() else {
            continue;
        };
        let done = p
            .datasets
            .read()
            .contains_key(&format!("{}@{}", rec.name, st.short));
        let outcome = if done {
            set_state(p, &rec.name, None)
        } else if st.resumable {
            tracing::info!(dataset = %rec.name, "interrupted receive kept: resume it with send -t");
            continue;
        } else {
            undo_at_import(p, &rec, &st)
        };
        match outcome {
            Ok(()) => {
                tracing::info!(dataset = %rec.name, finished = done, "interrupted receive cleaned up")
            }
            Err(e) => {
                tracing::error!(dataset = %rec.name, error = %e, "cannot clean up an interrupted receive")
            }
        }
    }
}

fn undo_at_import(p: &ImportedPool, rec: &DatasetRecord, st: &ReceiveState) -> Result<()> {
    use crate::snapshot::Action;
    let (base, later, has_snaps) = {
        let datasets = p.datasets.read();
        let base = st.base.as_ref().and_then(|b| datasets.get(b)).cloned();
        let snaps: Vec<&DatasetRecord> = datasets
            .values()
            .filter(|r| r.is_snapshot() && r.data_id() == rec.id)
            .collect();
        let later: Vec<u64> = base.as_ref().map_or(Vec::new(), |b| {
            snaps
                .iter()
                .filter(|s| s.created_txg > b.created_txg)
                .map(|s| s.id)
                .collect()
        });
        (base, later, !snaps.is_empty())
    };
    match base {
        Some(b) => {
            p.commit_txg(Some(Action::Rollback {
                dataset: rec.id,
                snapshot: b.id,
                destroy_later: later,
            }))?;
            set_state(p, &rec.name, None)
        }
        None if st.base.is_none() && !has_snaps => p
            .commit_txg(Some(Action::DestroyDataset(rec.id)))
            .map(|_| ()),
        None => set_state(p, &rec.name, None),
    }
}

/// One row of a stream, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Row {
    Data { obj: u64, blk: u64, bytes: Vec<u8> },
    Free { addr: Vec<u8> },
    Name { dir: u64, name: String, target: u64 },
}

impl Row {
    /// The record (kind and payload) that carries this row.
    pub fn encode(&self) -> (Kind, Vec<u8>) {
        match self {
            Row::Data { obj, blk, bytes } => {
                let mut p = Vec::with_capacity(16 + bytes.len());
                p.extend_from_slice(&obj.to_be_bytes());
                p.extend_from_slice(&blk.to_be_bytes());
                p.extend_from_slice(bytes);
                (Kind::Data, p)
            }
            Row::Free { addr } => (Kind::Free, addr.clone()),
            Row::Name { dir, name, target } => {
                let mut p = blockmap::name_addr(*dir, name);
                p.extend_from_slice(&target.to_le_bytes());
                (Kind::Name, p)
            }
        }
    }

    /// The row from a stream record of kind Data, Free or Name.
    pub fn decode(kind: Kind, p: &[u8]) -> Result<Row> {
        let bad = |w: &str| Error::InvalidArgument(format!("invalid send stream: {w}"));
        let u64_at = |b: &[u8], at: usize| -> Result<u64> {
            b.get(at..at + 8)
                .and_then(|s| s.try_into().ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| bad("short row"))
        };
        match kind {
            Kind::Data => Ok(Row::Data {
                obj: u64_at(p, 0)?,
                blk: u64_at(p, 8)?,
                bytes: p[16..].to_vec(),
            }),
            Kind::Free => {
                Addr::parse(p).map_err(|_| bad("bad address in a free record"))?;
                Ok(Row::Free { addr: p.to_vec() })
            }
            Kind::Name => {
                if p.len() < 8 {
                    return Err(bad("short name row"));
                }
                let (addr, t) = p.split_at(p.len() - 8);
                let target = u64::from_le_bytes(t.try_into().map_err(|_| bad("name row"))?);
                match Addr::parse(addr).map_err(|_| bad("bad name address"))? {
                    Addr::Name { dir, name } => Ok(Row::Name { dir, name, target }),
                    Addr::Block { .. } => Err(bad("a name record with a block address")),
                }
            }
            _ => Err(bad("not a row record")),
        }
    }
}

/// What [`scan_rows`] calls per row: (address, value).
type RowFn<'a> = dyn FnMut(&[u8], &[u8]) -> Result<()> + 'a;

/// A resumable receive commits and records its position every this many
/// bytes, at most (half the dirty data that forces a txg commit anyway).
const CHECKPOINT_BYTES: u64 = 64 << 20;

/// The block-map address of block `blk` of object `obj` (for stream tools and tests).
pub fn block_address(obj: u64, blk: u64) -> Vec<u8> {
    blockmap::block_addr(obj, blk).to_vec()
}

/// The block-map address of `name` in directory `dir`.
pub fn name_address(dir: u64, name: &str) -> Vec<u8> {
    blockmap::name_addr(dir, name)
}

fn bad_stream(w: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("invalid send stream: {w}"))
}

/// Visits the rows of `chain` as of txg `to`: all of them (`from` None,
/// tombstones left out) or those whose newest version at `to` was born
/// after `from` (tombstones included: what was removed). Address order.
fn scan_rows(
    p: &ImportedPool,
    chain: &Chain,
    from: Option<u64>,
    to: u64,
    after: Option<&[u8]>,
    mut f: impl FnMut(&[u8], &[u8]) -> Result<()>,
) -> Result<()> {
    let view = p.view()?;
    let (lo, hi): (&[u8], &[u8]) = (after.unwrap_or(&[]), &[2u8]);
    let mut f = |a: &[u8], v: &[u8]| match after {
        Some(x) if a <= x => Ok(()),
        _ => f(a, v),
    };
    if from.is_none() && chain.0.len() > 1 {
        // A clone's full stream includes what it sees of its origins.
        let bounded = Chain(
            chain
                .0
                .iter()
                .enumerate()
                .map(|(i, &(d, b))| (d, if i == 0 { to } else { b }))
                .collect(),
        );
        for (addr, v) in blockmap::resolve_range(&view.blocks, &bounded, lo, hi)? {
            f(&addr, &v)?;
        }
        return Ok(());
    }
    let ds = chain.data_id();
    let mut cur: Option<(Vec<u8>, u64, Vec<u8>)> = None;
    let emit = |c: Option<(Vec<u8>, u64, Vec<u8>)>, f: &mut RowFn<'_>| {
        if let Some((addr, birth, v)) = c {
            let wanted = match from {
                None => !v.is_empty(),
                Some(after) => birth > after,
            };
            if wanted {
                return f(&addr, &v);
            }
        }
        Ok(())
    };
    for row in view
        .blocks
        .range((ds, lo, 0)..=(ds, hi, u64::MAX))
        .map_err(meta_err)?
    {
        let (k, v) = row.map_err(meta_err)?;
        let (_, addr, birth) = k.value();
        if birth > to {
            continue;
        }
        match &mut cur {
            Some((a, b, val)) if a.as_slice() == addr => {
                *b = birth;
                *val = v.value().to_vec();
            }
            _ => {
                emit(cur.take(), &mut f)?;
                cur = Some((addr.to_vec(), birth, v.value().to_vec()));
            }
        }
    }
    emit(cur.take(), &mut f)
}

/// An incremental source resolved: its name as given (for messages), the
/// snapshot's short name the receiver must hold, and its txg.
struct From {
    name: String,
    short: String,
    txg: u64,
}

/// One snapshot's part of a send: source and bounds.
struct Part {
    rec: DatasetRecord,
    head: DatasetRecord,
    chain: Chain,
    from: Option<(String, u64)>,
    /// `send -t`: rows after this address only.
    after: Option<Vec<u8>>,
    /// `-R`: the dataset below the top (`""`: the top).
    rel: Option<String>,
}

impl Engine {
    /// A resumed incremental's source: the snapshot `@short`, or, once
    /// that is destroyed, a bookmark of the same point in time.
    fn resume_source(&self, tok: &Token, short: &str) -> String {
        let Some((ds, _)) = tok.snapshot.split_once('@') else {
            return format!("@{short}");
        };
        let Ok((pool, _)) = split_dataset(ds) else {
            return format!("@{short}");
        };
        let Ok(p) = self.pool(pool) else {
            return format!("@{short}");
        };
        let datasets = p.datasets.read();
        if datasets.contains_key(&format!("{ds}@{short}")) {
            return format!("@{short}");
        }
        datasets
            .get(ds)
            .and_then(|r| {
                r.bookmarks
                    .iter()
                    .find(|(_, b)| b.txg == tok.from_txg && b.snapshot == short)
            })
            .map_or(format!("@{short}"), |(name, _)| format!("#{name}"))
    }

    /// `send -R`: the parts of the dataset and of every dataset below it
    /// that has the snapshot, parents first. Incremental where the child
    /// has the source snapshot, full where it does not (a child created
    /// since, as zfs).
    fn send_parts_recursive(&self, opts: &SendOptions) -> Result<(Arc<ImportedPool>, Vec<Part>)> {
        let snap = &opts.snapshot;
        let (ds, short) = snap.split_once('@').ok_or_else(|| {
            Error::InvalidArgument(format!(
                "cannot send '{snap}': not a snapshot (name it DATASET@SNAPSHOT)"
            ))
        })?;
        let from_short = match &opts.from {
            None => None,
            Some(f) if f.contains('#') => {
                return Err(Error::InvalidArgument(
                    "cannot send -R from a bookmark: name a snapshot (as zfs)".into(),
                ))
            }
            Some(f) => Some(f.split_once('@').map_or(f.as_str(), |(_, s)| s).to_string()),
        };
        let (pool, _) = split_dataset(ds)?;
        let p = self.pool(pool)?;
        let names: Vec<String> = {
            let datasets = p.datasets.read();
            if !datasets.get(snap).is_some_and(|r| r.is_snapshot()) {
                return Err(Error::NotFound(format!("snapshot '{snap}'")));
            }
            let mut n: Vec<String> = crate::snapshot_admin::subtree(&datasets, ds)
                .into_iter()
                .filter(|n| datasets.contains_key(&format!("{n}@{short}")))
                .collect();
            n.sort_by(|a, b| {
                (a.matches('/').count(), a.as_str()).cmp(&(b.matches('/').count(), b.as_str()))
            });
            n
        };
        let mut parts = Vec::new();
        for n in names {
            let from = from_short.as_ref().and_then(|f| {
                let has = p.datasets.read().contains_key(&format!("{n}@{f}"));
                (has || n == ds).then(|| format!("@{f}"))
            });
            let one = SendOptions {
                snapshot: format!("{n}@{short}"),
                intermediates: opts.intermediates && from.is_some(),
                from,
                ..Default::default()
            };
            let (_, mut ps) = self.send_parts(&one)?;
            let rel = n[ds.len()..].to_string();
            for part in &mut ps {
                part.rel = Some(rel.clone());
            }
            parts.extend(ps);
        }
        Ok((p, parts))
    }

    /// Resolves the snapshots a send covers, oldest first.
    fn send_parts(&self, opts: &SendOptions) -> Result<(Arc<ImportedPool>, Vec<Part>)> {
        if let Some(t) = &opts.resume_token {
            let tok = decode_token(t)?;
            let again = SendOptions {
                snapshot: tok.snapshot.clone(),
                from: tok.from.as_ref().map(|f| self.resume_source(&tok, f)),
                ..Default::default()
            };
            let (p, mut parts) = self.send_parts(&again)?;
            let part = parts
                .first_mut()
                .ok_or_else(|| Error::NotFound(tok.snapshot.clone()))?;
            if part.rec.created_txg != tok.to_txg
                || part.from.as_ref().map_or(0, |f| f.1) != tok.from_txg
            {
                return Err(Error::InvalidArgument(format!(
                    "cannot resume send: '{}' is not the snapshot the token was made for (destroyed and taken again?)",
                    tok.snapshot
                )));
            }
            // Always Some: a token taken before the receiver's first
            // checkpoint (nothing committed yet) still makes a resume
            // stream (`resume_after` ""), not a new one the receiver must
            // refuse because the target holds partial state.
            part.after = Some(match &tok.after {
                None => Vec::new(),
                Some(h) => unhex(h).ok_or_else(|| {
                    Error::InvalidArgument("cannot resume send: invalid resume token".into())
                })?,
            });
            return Ok((p, parts));
        }
        if opts.raw {
            return Err(Error::InvalidArgument(
                "send -w is not supported yet".into(),
            ));
        }
        if opts.recursive {
            return self.send_parts_recursive(opts);
        }
        let snap = &opts.snapshot;
        let (pool, _) = split_dataset(snap)?;
        let Some((ds, _)) = snap.split_once('@') else {
            return Err(Error::InvalidArgument(format!(
                "cannot send '{snap}': not a snapshot (name it DATASET@SNAPSHOT)"
            )));
        };
        let p = self.pool(pool)?;
        let datasets = p.datasets.read();
        let rec = datasets
            .get(snap)
            .filter(|r| r.is_snapshot())
            .ok_or_else(|| Error::NotFound(format!("snapshot '{snap}'")))?;
        let head = datasets
            .get(ds)
            .ok_or_else(|| Error::NotFound(format!("dataset '{ds}'")))?;
        let chain = Chain::of(rec, datasets.values());
        let mut parts = Vec::new();
        match &opts.from {
            None => {
                if opts.intermediates {
                    return Err(Error::InvalidArgument(
                        "-I needs an incremental source".into(),
                    ));
                }
                parts.push(Part {
                    rec: rec.clone(),
                    head: head.clone(),
                    chain,
                    from: None,
                    after: None,
                    rel: None,
                });
            }
            Some(from) => {
                // The source: a snapshot, or a bookmark (`#b`, `ds#b`) that
                // stands for the snapshot it was made from.
                let f = if from.contains('#') {
                    let (bds, b) = bookmark::split_bookmark(from, Some(ds))?;
                    let bm = datasets
                        .get(bds)
                        .filter(|r| !r.is_snapshot())
                        .and_then(|r| r.bookmarks.get(b).map(|bm| (r.id, bm)))
                        .ok_or_else(|| {
                            Error::NotFound(format!("incremental source '{bds}#{b}'"))
                        })?;
                    if bm.0 != rec.data_id() {
                        return Err(Error::InvalidArgument(format!(
                            "cannot send '{snap}': incremental source '{bds}#{b}' is not a bookmark of '{ds}'"
                        )));
                    }
                    From {
                        name: format!("{bds}#{b}"),
                        short: bm.1.snapshot.clone(),
                        txg: bm.1.txg,
                    }
                } else {
                    let from_name = match from.strip_prefix('@') {
                        Some(short) => format!("{ds}@{short}"),
                        None if from.contains('@') => from.clone(),
                        None => format!("{ds}@{from}"),
                    };
                    let f = datasets
                        .get(&from_name)
                        .filter(|r| r.is_snapshot())
                        .ok_or_else(|| {
                            Error::NotFound(format!("incremental source '{from_name}'"))
                        })?;
                    if f.data_id() != rec.data_id() {
                        return Err(Error::InvalidArgument(format!(
                            "cannot send '{snap}': incremental source '{from_name}' is not a snapshot of '{ds}'"
                        )));
                    }
                    From {
                        name: from_name,
                        short: short_of(&f.name),
                        txg: f.created_txg,
                    }
                };
                let from_name = f.name.clone();
                if f.txg >= rec.created_txg {
                    return Err(Error::InvalidArgument(format!(
                        "cannot send '{snap}': incremental source '{from_name}' must be earlier than it"
                    )));
                }
                let mut snaps: Vec<&DatasetRecord> = if opts.intermediates {
                    datasets
                        .values()
                        .filter(|r| {
                            r.is_snapshot()
                                && r.data_id() == rec.data_id()
                                && r.created_txg > f.txg
                                && r.created_txg <= rec.created_txg
                        })
                        .collect()
                } else {
                    vec![rec]
                };
                snaps.sort_by_key(|r| r.created_txg);
                let mut prev = (f.short.clone(), f.txg);
                for s in snaps {
                    parts.push(Part {
                        rec: s.clone(),
                        head: head.clone(),
                        chain: Chain::of(s, datasets.values()),
                        from: Some(prev.clone()),
                        after: None,
                        rel: None,
                    });
                    prev = (short_of(&s.name), s.created_txg);
                }
            }
        }
        drop(datasets);
        // Sealed names (decision 0035) are rows keyed by a keyed hash; the
        // stream carries names in the clear and resumes by row address, so
        // those datasets need a raw send (-w), which is not built yet.
        if let Some(part) = parts.first() {
            if part.head.kind != DatasetKind::Volume
                && matches!(
                    crate::namerow::NameLayout::of(&p, part.chain.data_id())?,
                    crate::namerow::NameLayout::Sealed(_)
                )
            {
                return Err(Error::InvalidArgument(format!(
                    "cannot send '{}': its names are encrypted (sealed); sending it needs a raw stream (-w), which is not supported yet",
                    opts.snapshot
                )));
            }
        }
        Ok((p, parts))
    }

    /// `cistern send`: writes the stream of `opts` to `out`.
    pub fn send(&self, opts: &SendOptions, out: &mut dyn std::io::Write) -> Result<SendSummary> {
        let (p, parts) = self.send_parts(opts)?;
        let flags = if opts.recursive {
            stream::FLAG_RECURSIVE
        } else {
            0
        };
        let mut w = stream::Writer::new(out, flags)?;
        let mut sum = SendSummary::default();
        for part in parts {
            let begin = Begin {
                snapshot: part.rec.name.clone(),
                from: part.from.as_ref().map(|f| f.0.clone()),
                from_txg: part.from.as_ref().map_or(0, |f| f.1),
                to_txg: part.rec.created_txg,
                kind: part.head.kind,
                volsize: part.rec.volsize.max(part.head.volsize),
                volblocksize: part.head.volblocksize,
                next_object: part.rec.next_object.max(part.head.next_object),
                resume_after: part.after.as_deref().map(hex),
                props: if part.rel.is_some() {
                    part.head.local.clone()
                } else {
                    Default::default()
                },
                dataset: part.rel.clone(),
            };
            let json = serde_json::to_vec(&begin).map_err(meta_err)?;
            w.record(Kind::Begin, &[&json])?;
            sum.records += 1;
            let key = p.key_of(part.chain.data_id())?;
            // A volume's blocks are read in runs (adjacent blocks in one
            // I/O, as NBD reads are), the way nbdcopy would read them.
            let bs = part.head.volblocksize.max(1);
            let mut run: Vec<u64> = Vec::new();
            let flush = |run: &mut Vec<u64>, w: &mut stream::Writer<'_>| -> Result<()> {
                if run.is_empty() {
                    return Ok(());
                }
                let view = p.view()?;
                let got = crate::volume::read_outside_open(
                    &p,
                    &view,
                    &part.chain,
                    objects::VOLUME_OBJECT,
                    false,
                    bs,
                    run,
                )?;
                for b in run.drain(..) {
                    let obj = objects::VOLUME_OBJECT;
                    match got.get(&b).cloned().flatten() {
                        Some(bytes) => {
                            w.record(Kind::Data, &[&obj.to_be_bytes(), &b.to_be_bytes(), &bytes])?
                        }
                        None => w.record(Kind::Free, &[&blockmap::block_addr(obj, b)])?,
                    }
                }
                Ok(())
            };
            scan_rows(
                &p,
                &part.chain,
                part.from.as_ref().map(|f| f.1),
                part.rec.created_txg,
                part.after.as_deref(),
                |addr, v| {
                    sum.records += 1;
                    let bp = blockmap::decode(addr, v)?;
                    match (block_of(addr), bp) {
                        (Some((obj, blk)), Some(_)) if obj == objects::VOLUME_OBJECT => {
                            run.push(blk);
                            if run.len() >= 512 {
                                flush(&mut run, &mut w)?;
                            }
                            return Ok(());
                        }
                        _ => flush(&mut run, &mut w)?,
                    }
                    if let Some((obj, blk)) = block_of(addr) {
                        match blockmap::decode(addr, v)? {
                            None => w.record(Kind::Free, &[addr]),
                            Some(bp) => {
                                let unseal = block::Unseal {
                                    key: key.as_deref(),
                                    object: obj,
                                    block: blk,
                                };
                                let bytes = block::read_block_keyed(&p.pool, &bp, Some(unseal))
                                    .map_err(|e| {
                                        Error::Corrupt(format!(
                                            "{}: object {obj} block {blk}: {e}",
                                            part.rec.name
                                        ))
                                    })?;
                                w.record(
                                    Kind::Data,
                                    &[&obj.to_be_bytes(), &blk.to_be_bytes(), &bytes],
                                )
                            }
                        }
                    } else if v.is_empty() {
                        w.record(Kind::Free, &[addr])
                    } else {
                        w.record(Kind::Name, &[addr, v])
                    }
                },
            )?;
            flush(&mut run, &mut w)?;
            w.checkpoint(Kind::SnapEnd)?;
            sum.records += 1;
            sum.snapshots.push(part.rec.name.clone());
        }
        w.checkpoint(Kind::End)?;
        w.flush()?;
        sum.records += 1;
        sum.bytes = w.bytes;
        tracing::info!(snapshot = %opts.snapshot, from = ?opts.from, bytes = sum.bytes, "sent");
        Ok(sum)
    }

    /// `cistern send -nv`: the stream's size in bytes, without reading data.
    pub fn send_estimate(&self, opts: &SendOptions) -> Result<u64> {
        let (p, parts) = self.send_parts(opts)?;
        // Header, end record; per snapshot a begin (~300 bytes) and its end.
        let mut total = 32 + 53;
        for part in parts {
            total += 300 + 53;
            scan_rows(
                &p,
                &part.chain,
                part.from.as_ref().map(|f| f.1),
                part.rec.created_txg,
                part.after.as_deref(),
                |addr, v| {
                    total += 21 + addr.len() as u64;
                    if let Some(bp) = blockmap::decode(addr, v)? {
                        total += bp.lsize as u64;
                    } else if block_of(addr).is_none() {
                        total += v.len() as u64;
                    }
                    Ok(())
                },
            )?;
        }
        Ok(total)
    }

    /// `cistern receive`: reads a stream from `inp` into `opts.target`.
    /// A snapshot appears only once all its records arrived and verified;
    /// a stream that fails leaves the target as it was.
    pub fn receive(
        &self,
        opts: &ReceiveOptions,
        inp: &mut dyn std::io::Read,
    ) -> Result<ReceiveSummary> {
        let (target, snap_name) = match opts.target.split_once('@') {
            Some((t, s)) => (t.to_string(), Some(s.to_string())),
            None => (opts.target.clone(), None),
        };
        let (pool, _) = split_dataset(&target)?;
        let p = self.pool(pool)?;
        // One receive per target at a time: a client that lost its
        // connection may retry (send -t) while the daemon still unwinds
        // the first one.
        let _running = Receiving::enter(&p, &target)?;
        let mut r = stream::Reader::new(inp)?;
        let mut sum = ReceiveSummary::default();
        let mut seen: std::collections::BTreeSet<String> = Default::default();
        let mut incremental = false;
        loop {
            let rec = r
                .read_record()?
                .ok_or_else(|| bad_stream("no end record"))?;
            sum.records += 1;
            match rec.kind {
                Kind::End => break,
                Kind::Begin => {
                    let begin: Begin = serde_json::from_slice(&rec.payload)
                        .map_err(|e| bad_stream(format!("begin record: {e}")))?;
                    // -R: each dataset of the tree lands at the same place below the target.
                    let one_target = match &begin.dataset {
                        Some(rel) if r.flags & stream::FLAG_RECURSIVE != 0 => {
                            if !(rel.is_empty() || rel.starts_with('/'))
                                || rel.contains('@')
                                || rel.contains('#')
                            {
                                return Err(bad_stream(format!(
                                    "dataset '{rel}' in a begin record"
                                )));
                            }
                            format!("{target}{rel}")
                        }
                        Some(_) => return Err(bad_stream("a dataset in a stream without -R")),
                        None => target.clone(),
                    };
                    let short = match &snap_name {
                        Some(s) if sum.snapshots.is_empty() => s.clone(),
                        _ => short_of(&begin.snapshot),
                    };
                    if begin.from.is_some() {
                        incremental = true;
                    }
                    seen.insert(one_target.clone());
                    let made =
                        self.receive_one(&p, opts, &one_target, &short, &begin, &mut r, &mut sum);
                    match made {
                        Ok(name) => sum.snapshots.push(name),
                        Err(e) => return Err(e),
                    }
                }
                k => {
                    return Err(bad_stream(format!(
                        "unexpected {k:?} record outside a snapshot"
                    )))
                }
            }
        }
        // receive -F of an incremental -R stream: what the source no longer
        // has below the top (a child destroyed there) goes here too (as zfs).
        if opts.force && incremental && r.flags & stream::FLAG_RECURSIVE != 0 {
            let gone: Vec<String> = {
                let datasets = p.datasets.read();
                crate::snapshot_admin::subtree(&datasets, &target)
                    .into_iter()
                    .filter(|n| {
                        !seen.contains(n) && !seen.iter().any(|s| s.starts_with(&format!("{n}/")))
                    })
                    .collect()
            };
            for n in gone {
                if p.datasets.read().contains_key(&n) {
                    self.destroy(
                        &n,
                        &DestroyOptions {
                            recursive: true,
                            force: true,
                            ..Default::default()
                        },
                    )?;
                    tracing::info!(dataset = %n, "destroyed: no longer in the -R source");
                    sum.destroyed.push(n);
                }
            }
        }
        sum.bytes = r.bytes;
        tracing::info!(target = %opts.target, snapshots = ?sum.snapshots, bytes = sum.bytes, "received");
        Ok(sum)
    }

    /// One snapshot of a stream: prepares the target, applies the rows,
    /// snapshots it; on any failure puts the target back as it was.
    #[allow(clippy::too_many_arguments)]
    fn receive_one(
        &self,
        p: &Arc<ImportedPool>,
        opts: &ReceiveOptions,
        target: &str,
        short: &str,
        begin: &Begin,
        r: &mut stream::Reader<'_>,
        sum: &mut ReceiveSummary,
    ) -> Result<String> {
        let snap_full = format!("{target}@{short}");
        let existing = p.datasets.read().get(target).cloned();
        let state = match &begin.resume_after {
            Some(after) => self.prepare_resume(target, existing, begin, after)?,
            None => self.prepare_receive(p, opts, target, short, begin, existing)?,
        };
        let resumable = state.resumable;
        // From here the record says a receive runs: a crash is undone at
        // import (or kept for resuming, with -s).
        set_state(p, target, Some(state.clone()))?;
        let applied = self.apply_rows(p, target, begin, r, sum, &state);
        // The record after the snapshot's end is read (and verified) first:
        // the last snapshot of a stream appears only with a sound end record.
        let applied = applied.and_then(|()| r.peek().map(|_| ()));
        let done = applied.and_then(|()| {
            self.snapshot(std::slice::from_ref(&snap_full), false)?;
            set_state(p, target, None)
        });
        if let Err(e) = done {
            if resumable {
                let token = p
                    .datasets
                    .read()
                    .get(target)
                    .and_then(|r| r.receive.as_ref().and_then(|s| s.token()));
                if let Some(token) = token {
                    return Err(Error::InvalidArgument(format!(
                        "{e}\npartially received snapshot is saved; resume the transfer with\n`cistern send -t {token}` (or discard it: `cistern receive -A {target}`)"
                    )));
                }
            }
            if let Err(c) = self.undo_receive(target, &state) {
                tracing::error!(target, error = %c, "cannot undo a failed receive");
            }
            return Err(e);
        }
        Ok(snap_full)
    }

    /// A resumed stream (`send -t`): the target must hold the matching
    /// partial state, committed at least up to where the stream restarts.
    fn prepare_resume(
        &self,
        target: &str,
        existing: Option<DatasetRecord>,
        begin: &Begin,
        after: &str,
    ) -> Result<ReceiveState> {
        let st = existing
            .as_ref()
            .and_then(|r| r.receive.as_deref())
            .filter(|s| s.resumable && s.snapshot == begin.snapshot && s.to_txg == begin.to_txg)
            .cloned()
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "cannot receive resume stream: '{target}' has no partially received state of '{}'",
                    begin.snapshot
                ))
            })?;
        let have = st.after.as_deref().and_then(unhex).unwrap_or_default();
        let from = unhex(after).ok_or_else(|| bad_stream("resume address"))?;
        if from > have {
            return Err(Error::InvalidArgument(format!(
                "cannot receive resume stream: it starts after what '{target}' holds (use its current receive_resume_token)"
            )));
        }
        Ok(st)
    }

    /// Checks and prepares the target of a new (not resumed) stream: a
    /// new dataset for a full stream, the base snapshot for an incremental one.
    fn prepare_receive(
        &self,
        p: &Arc<ImportedPool>,
        opts: &ReceiveOptions,
        target: &str,
        short: &str,
        begin: &Begin,
        existing: Option<DatasetRecord>,
    ) -> Result<ReceiveState> {
        let snap_full = format!("{target}@{short}");
        if existing.as_ref().is_some_and(|r| r.receive.is_some()) {
            return Err(Error::Busy(format!(
                "cannot receive: destination '{target}' contains partially-complete state from \"cistern receive -s\"\n(resume it with send -t, or discard it with receive -A)"
            )));
        }
        let mut state = ReceiveState {
            snapshot: begin.snapshot.clone(),
            short: short.to_string(),
            base: None,
            from: begin.from.clone(),
            from_txg: begin.from_txg,
            to_txg: begin.to_txg,
            resumable: opts.resumable,
            after: None,
        };
        match (&begin.from, existing) {
            (None, Some(_)) if !opts.force => {
                return Err(Error::AlreadyExists(format!(
                    "cannot receive new {} stream: destination '{target}' exists\nmust specify -F to overwrite it",
                    kind_word(begin.kind)
                )))
            }
            (None, Some(rec)) => {
                let snaps = self.snapshot_names(p, rec.id);
                if let Some(s) = snaps.first() {
                    return Err(Error::Busy(format!(
                        "cannot receive new {} stream: destination has snapshots (eg. {s})\nmust destroy them to overwrite it",
                        kind_word(begin.kind)
                    )));
                }
                self.destroy(target, &DestroyOptions::default())?;
                self.create_for_receive(target, begin)?;
            }
            (None, None) => self.create_for_receive(target, begin)?,
            (Some(_), None) => {
                return Err(Error::NotFound(format!(
                    "cannot receive incremental stream: destination '{target}'"
                )))
            }
            (Some(from), Some(rec)) => {
                if rec.kind != begin.kind {
                    return Err(Error::InvalidArgument(format!(
                        "cannot receive incremental stream: '{target}' is a {}, the stream a {}",
                        kind_word(rec.kind),
                        kind_word(begin.kind)
                    )));
                }
                let base = format!("{target}@{from}");
                let snaps = self.snapshot_names(p, rec.id);
                if !snaps.contains(&base) {
                    return Err(Error::NotFound(format!(
                        "cannot receive incremental stream: most recent snapshot of '{target}' does not\nmatch incremental source ('{base}')"
                    )));
                }
                if p.datasets.read().contains_key(&snap_full) {
                    return Err(Error::AlreadyExists(format!(
                        "cannot receive incremental stream: destination snapshot '{snap_full}'"
                    )));
                }
                let latest = snaps.last().cloned().unwrap_or_default();
                if opts.force {
                    self.rollback_with(&base, true, false)?;
                } else if latest != base {
                    return Err(Error::Busy(format!(
                        "cannot receive incremental stream: destination '{target}' has newer snapshots than '{base}' ({latest})\nmust specify -F to destroy them"
                    )));
                } else if self.modified_since(p, rec.id, &base)? {
                    return Err(Error::Busy(format!(
                        "cannot receive incremental stream: destination '{target}' has been modified\nsince most recent snapshot"
                    )));
                }
                state.base = Some(base);
            }
        }
        Ok(state)
    }

    /// Puts a target back as it was before a receive: the dataset a full
    /// stream created is destroyed, an incremental's target rolled back.
    fn undo_receive(&self, target: &str, st: &ReceiveState) -> Result<()> {
        match &st.base {
            None => self
                .destroy(
                    target,
                    &DestroyOptions {
                        force: true,
                        ..Default::default()
                    },
                )
                .map(|_| ()),
            Some(base) => {
                self.rollback_with(base, true, true)?;
                let (pool, _) = split_dataset(target)?;
                set_state(&*self.pool(pool)?, target, None)
            }
        }
    }

    /// `cistern receive -A`: discards the partially received state of
    /// `target` (what an interrupted `receive -s` kept).
    pub fn receive_abort(&self, target: &str) -> Result<()> {
        let (pool, _) = split_dataset(target)?;
        let p = self.pool(pool)?;
        // Not under a receive still running (a client that lost its
        // connection may abort while the daemon unwinds the receive).
        let _running = Receiving::enter(&p, target)?;
        let rec = p
            .datasets
            .read()
            .get(target)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("dataset '{target}'")))?;
        let Some(st) = rec.receive.as_deref().cloned() else {
            return Err(Error::InvalidArgument(format!(
                "cannot abort receive: '{target}' does not have any resumable receive state to abort"
            )));
        };
        self.undo_receive(target, &st)?;
        tracing::info!(target, "partially received state discarded");
        Ok(())
    }

    fn snapshot_names(&self, p: &ImportedPool, id: u64) -> Vec<String> {
        let datasets = p.datasets.read();
        let mut s: Vec<&DatasetRecord> = datasets
            .values()
            .filter(|r| r.is_snapshot() && r.data_id() == id)
            .collect();
        s.sort_by_key(|r| r.created_txg);
        s.into_iter().map(|r| r.name.clone()).collect()
    }

    /// Anything changed in `id` since snapshot `base` (committed rows born
    /// after it, or uncommitted changes).
    fn modified_since(&self, p: &ImportedPool, id: u64, base: &str) -> Result<bool> {
        let txg = p
            .datasets
            .read()
            .get(base)
            .map(|r| r.created_txg)
            .ok_or_else(|| Error::NotFound(format!("snapshot '{base}'")))?;
        {
            let open = p.open.lock();
            if open.dirty.keys().any(|k| k.0 == id) || open.names.keys().any(|k| k.0 == id) {
                return Ok(true);
            }
        }
        if p.view()?.syncing.as_ref().is_some_and(|s| {
            s.blocks.keys().any(|k| k.0 == id) || s.names.keys().any(|k| k.0 == id)
        }) {
            return Ok(true);
        }
        let chain = Chain(vec![(id, u64::MAX)]);
        let mut changed = false;
        scan_rows(p, &chain, Some(txg), u64::MAX, None, |_, _| {
            changed = true;
            Err(Error::Busy(String::new())) // stops the scan at the first row
        })
        .or_else(|e| if changed { Ok(()) } else { Err(e) })?;
        Ok(changed)
    }

    fn create_for_receive(&self, target: &str, begin: &Begin) -> Result<()> {
        // -R: the source's locally set properties, but not what makes the
        // source's keys or sizes (the target chooses those).
        let mut props: Vec<(String, String)> = begin
            .props
            .iter()
            .filter(|(k, _)| {
                !matches!(
                    k.as_str(),
                    "encryption"
                        | "keyformat"
                        | "keylocation"
                        | "pbkdf2iters"
                        | "volsize"
                        | "volblocksize"
                        | "refreservation"
                        | "reservation"
                        | "readonly"
                )
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        match begin.kind {
            DatasetKind::Volume => {
                props.push(("volblocksize".to_string(), begin.volblocksize.to_string()));
                self.create_volume(target, begin.volsize, &props)?;
            }
            DatasetKind::Bucket | DatasetKind::Filesystem => {
                self.create_dataset(target, begin.kind, &props)?;
            }
            DatasetKind::Snapshot => {
                return Err(bad_stream("a snapshot's begin names a snapshot kind"))
            }
        }
        Ok(())
    }

    /// Reads rows until the snapshot's end record and applies them to the
    /// target's open txg, in batches.
    fn apply_rows(
        &self,
        p: &ImportedPool,
        target: &str,
        begin: &Begin,
        r: &mut stream::Reader<'_>,
        sum: &mut ReceiveSummary,
        state: &ReceiveState,
    ) -> Result<()> {
        let mut state = state.clone();
        let mut since_checkpoint = 0usize;
        let checkpoint = (p.config.dirty_max_bytes / 2).clamp(1 << 20, CHECKPOINT_BYTES) as usize;
        let rec = p
            .datasets
            .read()
            .get(target)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("dataset '{target}'")))?;
        let ds = rec.id;
        if rec.kind == DatasetKind::Volume && rec.volblocksize != begin.volblocksize {
            return Err(Error::InvalidArgument(format!(
                "cannot receive: '{target}' has volblocksize {}, the stream {}",
                rec.volblocksize, begin.volblocksize
            )));
        }
        let bs = rec.volblocksize as usize;
        let mut batch: Vec<Row> = Vec::new();
        let mut batch_bytes = 0usize;
        loop {
            let record = r
                .read_record()?
                .ok_or_else(|| bad_stream("ended inside a snapshot"))?;
            sum.records += 1;
            match record.kind {
                Kind::SnapEnd => break,
                Kind::Data | Kind::Free | Kind::Name => {
                    let row = Row::decode(record.kind, &record.payload)?;
                    if let Row::Data { obj, bytes, blk } = &row {
                        let volume = rec.kind == DatasetKind::Volume;
                        let ok = if volume {
                            *obj == objects::VOLUME_OBJECT
                                && bytes.len() == bs
                                && blk.saturating_add(1).saturating_mul(bs as u64) <= rec.volsize
                        } else {
                            *obj != objects::VOLUME_OBJECT
                        };
                        if !ok {
                            return Err(bad_stream(format!(
                                "block {blk} of object {obj} ({} bytes) does not fit '{target}'",
                                bytes.len()
                            )));
                        }
                        batch_bytes += bytes.len();
                    }
                    let last = row_addr(&row);
                    batch.push(row);
                    if batch.len() >= 1024 || batch_bytes >= checkpoint.min(8 << 20) {
                        put_rows(p, ds, std::mem::take(&mut batch))?;
                        since_checkpoint += batch_bytes.max(1);
                        batch_bytes = 0;
                        // -s: commit what arrived and say so in the record,
                        // so an interruption resumes from here.
                        if state.resumable && since_checkpoint >= checkpoint {
                            p.sync_now()?;
                            state.after = Some(hex(&last));
                            set_state(p, target, Some(state.clone()))?;
                            since_checkpoint = 0;
                        }
                    }
                }
                k => {
                    return Err(bad_stream(format!(
                        "unexpected {k:?} record inside a snapshot"
                    )))
                }
            }
        }
        put_rows(p, ds, batch)?;
        if begin.next_object > 0 && rec.kind != DatasetKind::Volume {
            let mut open = p.open.lock();
            let next = open.next_object.entry(ds).or_insert(FIRST_DYNAMIC_OBJECT);
            *next = (*next).max(begin.next_object);
        }
        Ok(())
    }
}

/// The receives running in this process, by pool and target.
static RECEIVING: parking_lot::Mutex<Vec<(usize, String)>> = parking_lot::Mutex::new(Vec::new());

/// A running receive's claim on its target (released when dropped).
struct Receiving(usize, String);

impl Receiving {
    fn enter(p: &Arc<ImportedPool>, target: &str) -> Result<Receiving> {
        let key = (Arc::as_ptr(p) as usize, target.to_string());
        let mut running = RECEIVING.lock();
        if running.contains(&key) {
            return Err(Error::Busy(format!(
                "cannot receive: a receive into '{target}' is running"
            )));
        }
        running.push(key.clone());
        Ok(Receiving(key.0, key.1))
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        RECEIVING
            .lock()
            .retain(|(p, t)| !(*p == self.0 && *t == self.1));
    }
}

fn kind_word(k: DatasetKind) -> &'static str {
    match k {
        DatasetKind::Volume => "volume",
        DatasetKind::Bucket => "bucket",
        DatasetKind::Filesystem => "filesystem",
        DatasetKind::Snapshot => "snapshot",
    }
}

/// `snap` of `pool/ds@snap`.
fn short_of(full: &str) -> String {
    full.split_once('@').map_or(full, |(_, s)| s).to_string()
}

/// Puts received rows into the open txg of dataset `ds` (throttled like
/// any writer; sealed and placed by the txg commit like any change).
fn put_rows(p: &ImportedPool, ds: u64, rows: Vec<Row>) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    p.throttle();
    let root = p.crypt_root(ds)?;
    let mut open = p.open.lock();
    p.check_writable(ds, root)?;
    for row in rows {
        match row {
            Row::Data { obj, blk, bytes } => {
                let n = bytes.len() as u64;
                if open
                    .dirty
                    .insert((ds, obj, blk), Dirty::Data(Arc::new(bytes)))
                    .is_none()
                {
                    open.dirty_bytes += n;
                }
                if obj >= FIRST_DYNAMIC_OBJECT {
                    let next = open.next_object.entry(ds).or_insert(FIRST_DYNAMIC_OBJECT);
                    *next = (*next).max(obj + 1);
                }
            }
            Row::Free { addr } => match Addr::parse(&addr)? {
                Addr::Block { obj, blk } => {
                    open.dirty.insert((ds, obj, blk), Dirty::Hole);
                }
                Addr::Name { dir, name } => {
                    open.names.insert((ds, dir, name), None);
                }
            },
            Row::Name { dir, name, target } => {
                open.names.insert((ds, dir, name), Some(target));
            }
        }
    }
    Ok(())
}

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
    /// Raw (`-w`) streams of an encrypted dataset: its master key as the
    /// source keeps it (wrapped by the user's key), so the target opens
    /// with the source's passphrase (decision 0044).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crypt: Option<RawCrypt>,
    /// `-R` streams: the whole `-R` send this part belongs to, so a
    /// receive interrupted in it resumes across the tree (decision 0051).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tree: Option<TreeSend>,
}

/// The `-R` send a part belongs to (decision 0051): what `send -t` needs
/// to send the parts after an interrupted one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TreeSend {
    /// The `-R` send's snapshot: its top's full source name (`tank/top@c`).
    pub snapshot: String,
    /// Incremental source's short name (`a` of `-i @a`), if any.
    pub from: Option<String>,
    /// `-I`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub intermediates: bool,
    /// In a receive state and its token: the interrupted part's dataset
    /// below the top (`""`, `/child`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rel: Option<String>,
}

impl TreeSend {
    /// The order of `send -R` parts: parents first, then by name.
    fn order(rel: &str) -> (usize, &str) {
        (rel.matches('/').count(), rel)
    }
}

/// An encrypted dataset's key material in a raw stream: wrapped, never
/// the key itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RawCrypt {
    pub algo: String,
    pub keyformat: String,
    /// hex
    pub salt: String,
    pub iters: u32,
    /// hex: nonce | wrapped master key | tag
    pub wrapped: String,
    /// The record id the wrap's associated data names (the source root's).
    pub aad_root: u64,
    /// Name layout (decision 0035): 1 sealed.
    pub names: u8,
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
    /// A raw (`-w`) stream: its token resumes raw.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub raw: bool,
    /// A part of a `-R` stream: its token resumes the rest of the tree.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tree: Option<TreeSend>,
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
    /// A raw (`-w`) transfer: resumed raw (decision 0044).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    raw: bool,
    /// A part of a `-R` transfer: `send -t` also sends the parts after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    tree: Option<TreeSend>,
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
            raw: self.raw,
            tree: self.tree.clone(),
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
        Row::Raw { obj, blk, .. } => blockmap::block_addr(*obj, *blk).to_vec(),
        Row::RawName { addr, .. } => addr.clone(),
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
    Data {
        obj: u64,
        blk: u64,
        bytes: Vec<u8>,
    },
    Free {
        addr: Vec<u8>,
    },
    Name {
        dir: u64,
        name: String,
        target: u64,
    },
    /// A block as stored (`-w`): an embedded-form pointer holding the
    /// stored bytes, which matched its checksum when decoded.
    Raw {
        obj: u64,
        blk: u64,
        bp: Arc<block::BlockPointer>,
    },
    /// A name row as stored (`-w`); `None`: a tombstone.
    RawName {
        addr: Vec<u8>,
        value: Option<Vec<u8>>,
    },
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
            Row::Raw { obj, blk, bp } => {
                let mut p = Vec::with_capacity(16 + 128 + bp.psize as usize);
                p.extend_from_slice(&obj.to_be_bytes());
                p.extend_from_slice(&blk.to_be_bytes());
                p.extend_from_slice(&bp.encode());
                (Kind::Raw, p)
            }
            Row::RawName { addr, value } => {
                let mut p = Vec::with_capacity(2 + addr.len() + 64);
                p.extend_from_slice(&(addr.len() as u16).to_be_bytes());
                p.extend_from_slice(addr);
                p.extend_from_slice(value.as_deref().unwrap_or_default());
                (Kind::RawName, p)
            }
        }
    }

    /// A RAW record's row; `stored`: its stored bytes read apart from the
    /// payload ([`stream::Reader::read_record_split`]), taken uncopied.
    pub fn decode_raw(p: &[u8], stored: Option<Vec<u8>>) -> Result<Row> {
        let bad = |w: &str| Error::InvalidArgument(format!("invalid send stream: {w}"));
        let u64_at = |at: usize| -> Result<u64> {
            p.get(at..at + 8)
                .and_then(|s| s.try_into().ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| bad("short row"))
        };
        let (obj, blk) = (u64_at(0)?, u64_at(8)?);
        let bp = match stored {
            Some(stored) => block::BlockPointer::decode_with_body(&p[16..], stored),
            None => block::BlockPointer::decode(&p[16..]),
        }
        .map_err(|e| bad(&format!("raw block {blk} of object {obj}: {e}")))?;
        // Stored as they came: their own checksum is the only check
        // they get here (never decompressed nor re-checksummed).
        let ok = bp.dvas.is_empty()
            && bp.embedded.as_ref().is_some_and(|b| {
                b.len() == bp.psize as usize && bp.checksum_algo.compute(b) == bp.checksum
            });
        if !ok {
            return Err(bad(&format!(
                "raw block {blk} of object {obj} fails its checksum"
            )));
        }
        Ok(Row::Raw {
            obj,
            blk,
            bp: Arc::new(bp),
        })
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
            Kind::Raw => Row::decode_raw(p, None),
            Kind::RawName => {
                let n = p
                    .get(..2)
                    .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
                    .ok_or_else(|| bad("short raw name row"))?;
                let addr = p.get(2..2 + n).ok_or_else(|| bad("short raw name row"))?;
                // Name rows only: never a block row under another kind.
                if addr.first() != Some(&0x01) {
                    return Err(bad("a raw name record with a block address"));
                }
                let value = &p[2 + n..];
                Ok(Row::RawName {
                    addr: addr.to_vec(),
                    value: (!value.is_empty()).then(|| value.to_vec()),
                })
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
                raw: opts.raw,
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
                raw: tok.raw || opts.raw,
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
            // A part of a -R transfer: the parts of that send after it
            // follow (decision 0051), as the -R stream would have sent them.
            if let Some(t) = &tok.tree {
                let rel = t.rel.clone().unwrap_or_default();
                part.rel = Some(rel.clone());
                let all = SendOptions {
                    snapshot: t.snapshot.clone(),
                    from: t.from.as_ref().map(|f| format!("@{f}")),
                    intermediates: t.intermediates,
                    recursive: true,
                    raw: tok.raw || opts.raw,
                    ..Default::default()
                };
                let (_, rest) = self.send_parts_recursive(&all)?;
                let at = TreeSend::order(&rel);
                parts.extend(rest.into_iter().filter(|q| {
                    let r = q.rel.as_deref().unwrap_or_default();
                    TreeSend::order(r) > at || (r == rel && q.rec.created_txg > tok.to_txg)
                }));
            }
            return Ok((p, parts));
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
        if let Some(part) = parts.first().filter(|_| !opts.raw) {
            if part.head.kind != DatasetKind::Volume
                && matches!(
                    crate::namerow::NameLayout::of(&p, part.chain.data_id())?,
                    crate::namerow::NameLayout::Sealed(_)
                )
            {
                return Err(Error::InvalidArgument(format!(
                    "cannot send '{}': its names are encrypted (sealed); send it raw (-w)",
                    opts.snapshot
                )));
            }
        }
        Ok((p, parts))
    }

    /// `cistern send`: writes the stream of `opts` to `out`.
    pub fn send(&self, opts: &SendOptions, out: &mut dyn std::io::Write) -> Result<SendSummary> {
        self.send_to(opts, stream::Out::Write(out))
    }

    /// [`Engine::send`] handing the stream's buffers to `sink` whole
    /// (uncopied; the API passes them to the connection).
    pub fn send_chunks(
        &self,
        opts: &SendOptions,
        sink: &mut dyn stream::ChunkSink,
    ) -> Result<SendSummary> {
        self.send_to(opts, stream::Out::Chunks(sink))
    }

    fn send_to(&self, opts: &SendOptions, out: stream::Out<'_>) -> Result<SendSummary> {
        let (p, parts) = self.send_parts(opts)?;
        let raw = opts.raw || opts.resume_token.as_deref().is_some_and(token_is_raw);
        // The -R send each part belongs to (a resumed -R transfer: the
        // token's), so an interruption anywhere resumes across the tree.
        let tree = match &opts.resume_token {
            Some(t) => decode_token(t)?.tree.map(|t| TreeSend { rel: None, ..t }),
            None if opts.recursive => Some(TreeSend {
                snapshot: opts.snapshot.clone(),
                from: opts.from.as_deref().map(short_of),
                intermediates: opts.intermediates,
                rel: None,
            }),
            None => None,
        };
        let mut flags = if tree.is_some() {
            stream::FLAG_RECURSIVE
        } else {
            0
        };
        if raw {
            flags |= stream::FLAG_RAW;
        }
        let mut w = match out {
            stream::Out::Write(o) => stream::Writer::new(o, flags)?,
            stream::Out::Chunks(sink) => stream::Writer::to_sink(sink, flags)?,
        };
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
                tree: tree.clone().filter(|_| part.rel.is_some()),
                crypt: if raw {
                    raw_crypt(&p, part.chain.data_id(), &part.rec.name)?
                } else {
                    None
                },
            };
            let json = serde_json::to_vec(&begin).map_err(meta_err)?;
            w.record(Kind::Begin, &[&json])?;
            sum.records += 1;
            if raw {
                send_rows_raw(&p, &part, &mut w, &mut sum)?;
                w.checkpoint(Kind::SnapEnd)?;
                sum.records += 1;
                sum.snapshots.push(part.rec.name.clone());
                continue;
            }
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
        let mut resumed = false;
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
                    resumed |= begin.resume_after.is_some();
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
        // Not after a resumed -R stream: it holds only the parts after the
        // interrupted one, so `seen` is not the source's tree.
        if opts.force && incremental && !resumed && r.flags & stream::FLAG_RECURSIVE != 0 {
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
        let raw = r.flags & stream::FLAG_RAW != 0;
        if raw && begin.resume_after.is_none() {
            check_raw_target(p, opts, target, begin, existing.as_ref())?;
        }
        let mut state = match &begin.resume_after {
            Some(after) => self.prepare_resume(target, existing, begin, after)?,
            None => self.prepare_receive(p, opts, target, short, begin, existing, raw)?,
        };
        state.raw |= raw;
        let resumable = state.resumable;
        crash_point::at("prepared", target);
        // From here the record says a receive runs: a crash is undone at
        // import (or kept for resuming, with -s). A dataset a full stream
        // created already says so: it was created with this state (and,
        // raw and encrypted, with the source's wrapped key) in one
        // transaction, so no crash leaves it empty and unmarked.
        let marked = p
            .datasets
            .read()
            .get(target)
            .and_then(|r| r.receive.as_deref().cloned());
        if marked.as_ref() != Some(&state) {
            set_state(p, target, Some(state.clone()))?;
        }
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
                    // A -R part: the token resumes the whole rest of the
                    // tree, received into the top (decision 0051).
                    let top = state
                        .tree
                        .as_ref()
                        .and_then(|t| target.strip_suffix(t.rel.as_deref().unwrap_or_default()))
                        .filter(|_| r.flags & stream::FLAG_RECURSIVE != 0);
                    if let Some(top) = top {
                        return Err(Error::InvalidArgument(format!(
                            "{e}\npartially received snapshot of '{target}' is saved; it and the rest of the -R stream after it\n(what is left: `{short}` of '{target}', then the datasets after it) resume with\n`cistern send -t {token} | cistern receive -s {top}`\n(or discard it: `cistern receive -A {target}`)"
                        )));
                    }
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
                // A -R transfer's resume stream goes into the tree's top.
                let hint = match &begin.dataset {
                    Some(rel) if !rel.is_empty() => format!(
                        "\n(a -R transfer resumes into its top: receive it into the dataset that '{rel}' is below)"
                    ),
                    _ => String::new(),
                };
                Error::InvalidArgument(format!(
                    "cannot receive resume stream: '{target}' has no partially received state of '{}'{hint}",
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
    #[allow(clippy::too_many_arguments)]
    fn prepare_receive(
        &self,
        p: &Arc<ImportedPool>,
        opts: &ReceiveOptions,
        target: &str,
        short: &str,
        begin: &Begin,
        existing: Option<DatasetRecord>,
        raw: bool,
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
            raw,
            tree: begin.tree.clone().map(|mut t| {
                t.rel = Some(begin.dataset.clone().unwrap_or_default());
                t
            }),
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
                self.create_for_receive(target, begin, &state)?;
            }
            (None, None) => self.create_for_receive(target, begin, &state)?,
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

    /// Waits, at most `timeout`, until no receive into `target` runs in this
    /// daemon. A receive whose connection was cut goes on applying what it
    /// had buffered and then saves its resume state: a retry must read the
    /// target's `receive_resume_token` after that, or it resends (or
    /// refuses) what has landed meanwhile. Busy when one still runs.
    pub fn receive_wait(&self, target: &str, timeout: std::time::Duration) -> Result<()> {
        let (pool, _) = split_dataset(target)?;
        let p = self.pool(pool)?;
        match Receiving::wait_idle(&p, target, timeout) {
            Some(_) => Ok(()),
            None => Err(Error::Busy(format!(
                "a receive into '{target}' is still running after {} s",
                timeout.as_secs_f64()
            ))),
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

    /// Creates a full stream's dataset already marked with its receive
    /// `state` (one transaction: a kill -9 cannot leave it empty and
    /// unmarked, which the next full receive would refuse without -F).
    fn create_for_receive(&self, target: &str, begin: &Begin, state: &ReceiveState) -> Result<()> {
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
        // A raw encrypted stream's dataset takes the source's key as it
        // was wrapped (keystatus unavailable until load-key), from its
        // creation on: nothing is ever sealed with an inherited key.
        let adopt = begin.crypt.as_ref().filter(|_| state.raw);
        let finish = |rec: &mut DatasetRecord| {
            rec.receive = Some(Box::new(state.clone()));
            if let Some(c) = adopt {
                rec.crypt = Some(Box::new(adopted_crypt(rec.id, c)));
            }
        };
        match begin.kind {
            DatasetKind::Volume => {
                props.push(("volblocksize".to_string(), begin.volblocksize.to_string()));
                self.create_volume_as(target, begin.volsize, &props, None, &finish)?;
            }
            DatasetKind::Bucket | DatasetKind::Filesystem => {
                self.create_dataset_as(target, begin.kind, &props, None, &finish)?;
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
            let (record, stored) = r
                .read_record_split()?
                .ok_or_else(|| bad_stream("ended inside a snapshot"))?;
            sum.records += 1;
            match record.kind {
                Kind::SnapEnd => break,
                Kind::Raw | Kind::RawName if !state.raw => {
                    return Err(bad_stream("a raw record in a stream without -w"));
                }
                Kind::Data | Kind::Free | Kind::Name | Kind::Raw | Kind::RawName => {
                    let row = match record.kind {
                        Kind::Raw => Row::decode_raw(&record.payload, stored)?,
                        k => Row::decode(k, &record.payload)?,
                    };
                    if let Row::Raw { obj, blk, bp } = &row {
                        let volume = rec.kind == DatasetKind::Volume;
                        let ok = if volume {
                            *obj == objects::VOLUME_OBJECT
                                && bp.lsize as usize == bs
                                && blk.saturating_add(1).saturating_mul(bs as u64) <= rec.volsize
                        } else {
                            *obj != objects::VOLUME_OBJECT
                        };
                        if !ok {
                            return Err(bad_stream(format!(
                                "raw block {blk} of object {obj} ({} bytes) does not fit '{target}'",
                                bp.lsize
                            )));
                        }
                        batch_bytes += bp.psize as usize;
                    }
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

/// A resume token of a raw transfer.
fn token_is_raw(t: &str) -> bool {
    decode_token(t).is_ok_and(|t| t.raw)
}

/// The key material a raw stream of dataset `id` carries: its encryption
/// root's wrapped master key (`None`: not encrypted).
fn raw_crypt(p: &ImportedPool, id: u64, name: &str) -> Result<Option<RawCrypt>> {
    let datasets = p.datasets.read();
    let Some(c) = crate::crypt::crypt_of(&datasets, id) else {
        return Ok(None);
    };
    let root = datasets
        .values()
        .find(|d| d.id == c.root)
        .and_then(|d| d.crypt.as_deref());
    let Some(w) = root.and_then(|r| r.wrap.as_ref()) else {
        return Err(Error::InvalidArgument(format!(
            "cannot send '{name}' raw: its key is wrapped by another dataset's (change-key -i); run `cistern change-key` on its encryption root first"
        )));
    };
    Ok(Some(RawCrypt {
        algo: c.algo.clone(),
        keyformat: w.keyformat.clone(),
        salt: w.salt.clone(),
        iters: w.iters,
        wrapped: w.wrapped.clone(),
        aad_root: w.aad_root.unwrap_or(c.root),
        names: c.names,
    }))
}

/// The stored bytes of a block, verified against its checksum (a bad
/// copy is passed over for the next), neither decrypted nor decompressed.
fn read_stored(p: &ImportedPool, bp: &block::BlockPointer) -> Result<Vec<u8>> {
    if let Some(e) = &bp.embedded {
        if bp.checksum_algo.compute(e) != bp.checksum {
            return Err(Error::Corrupt("embedded block fails its checksum".into()));
        }
        return Ok(e.clone());
    }
    let mut last = None;
    for dva in &bp.dvas {
        let verify = |b: &[u8]| bp.checksum_algo.compute(b) == bp.checksum;
        match p.pool.read_verified(*dva, bp.psize as usize, verify) {
            Ok(b) => return Ok(b),
            Err(e) => last = Some(e.to_string()),
        }
    }
    Err(Error::Corrupt(
        last.unwrap_or_else(|| "block without a copy".into()),
    ))
}

/// Raw block rows wait here to be read in runs (adjacent first copies in
/// one I/O, as the logical path and NBD reads do); at most this many.
const RAW_RUN_ROWS: usize = 4096;
/// Largest single read of a run.
const RAW_RUN_BYTES: u64 = 8 << 20;

/// Writes the pending raw block rows, reading their stored bytes in runs
/// of back-to-back first copies; each block is checked against its own
/// checksum, and one that fails is read copy by copy ([`read_stored`]).
/// The runs are read one ahead on a second thread, so the device reads
/// the next run while this one is verified and written (a raw send spent
/// a fifth of its time waiting for each read); at most three runs are in
/// memory.
fn flush_raw(
    p: &ImportedPool,
    name: &str,
    pending: &mut Vec<(u64, u64, block::BlockPointer)>,
    w: &mut stream::Writer<'_>,
) -> Result<()> {
    // Rows [i, j) and, for more than one row, the extent they fill.
    let mut runs = Vec::new();
    let mut i = 0;
    while i < pending.len() {
        let mut j = i + 1;
        let mut span = None;
        if let Some(first) = pending[i].2.dvas.first().copied() {
            let mut end = first.offset + first.asize as u64;
            while j < pending.len() {
                match pending[j].2.dvas.first() {
                    Some(d)
                        if d.group == first.group
                            && d.offset == end
                            && end - first.offset + d.asize as u64 <= RAW_RUN_BYTES =>
                    {
                        end += d.asize as u64;
                        j += 1;
                    }
                    _ => break,
                }
            }
            if j > i + 1 {
                span = Some((first.group, first.offset, (end - first.offset) as usize));
            }
        }
        runs.push((i, j, span));
        i = j;
    }
    // A failed run read leaves each block to read_stored.
    let read_span = |span: Option<(u32, u64, usize)>| {
        span.and_then(|(group, off, len)| p.pool.read_run(group, off, len).ok().map(|r| (off, r)))
    };
    let spans: Vec<_> = runs.iter().map(|r| r.2).collect();
    std::thread::scope(|s| -> Result<()> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let reader = std::thread::Builder::new()
            .name("send-read".into())
            .spawn_scoped(s, move || {
                for span in spans {
                    // Err: the send stopped and dropped its end.
                    if tx.send(read_span(span)).is_err() {
                        return;
                    }
                }
            });
        // Without a thread each run is read here, as before.
        let ahead = reader.is_ok().then_some(rx);
        for &(i, j, span) in &runs {
            let run_bytes = match &ahead {
                Some(rx) => rx.recv().ok().flatten(),
                None => read_span(span),
            };
            for (obj, blk, bp) in pending[i..j].iter_mut() {
                let quick = run_bytes.as_ref().and_then(|(base, r)| {
                    let at = (bp.dvas[0].offset - base) as usize;
                    let b = r.get(at..at + bp.psize as usize)?;
                    (bp.checksum_algo.compute(b) == bp.checksum).then_some(b)
                });
                let slow;
                let stored: &[u8] = match quick {
                    Some(b) => b,
                    None => {
                        slow = read_stored(p, bp).map_err(|e| {
                            Error::Corrupt(format!("{name}: object {obj} block {blk}: {e}"))
                        })?;
                        &slow
                    }
                };
                // The embedded form: the pointer, then the stored bytes, written
                // from the read buffer as they are (not copied into the pointer).
                bp.dvas.clear();
                bp.embedded = Some(Vec::new());
                let head = bp.encode();
                w.record(
                    Kind::Raw,
                    &[&obj.to_be_bytes(), &blk.to_be_bytes(), &head, stored],
                )?;
            }
        }
        Ok(())
    })?;
    pending.clear();
    Ok(())
}

/// `send -w`: one snapshot's rows as stored (decision 0044).
fn send_rows_raw(
    p: &ImportedPool,
    part: &Part,
    w: &mut stream::Writer<'_>,
    sum: &mut SendSummary,
) -> Result<()> {
    let name = part.rec.name.as_str();
    let mut pending: Vec<(u64, u64, block::BlockPointer)> = Vec::with_capacity(RAW_RUN_ROWS);
    scan_rows(
        p,
        &part.chain,
        part.from.as_ref().map(|f| f.1),
        part.rec.created_txg,
        part.after.as_deref(),
        |addr, v| {
            sum.records += 1;
            let Some((obj, blk)) = block_of(addr) else {
                flush_raw(p, name, &mut pending, w)?;
                let row = Row::RawName {
                    addr: addr.to_vec(),
                    value: (!v.is_empty()).then(|| v.to_vec()),
                };
                let (k, payload) = row.encode();
                return w.record(k, &[&payload]);
            };
            match blockmap::decode(addr, v)? {
                None => {
                    flush_raw(p, name, &mut pending, w)?;
                    w.record(Kind::Free, &[addr])
                }
                Some(bp) => {
                    pending.push((obj, blk, bp));
                    if pending.len() >= RAW_RUN_ROWS {
                        flush_raw(p, name, &mut pending, w)?;
                    }
                    Ok(())
                }
            }
        },
    )?;
    flush_raw(p, name, &mut pending, w)
}

/// The receives running in this process, by pool and target.
static RECEIVING: parking_lot::Mutex<Vec<(usize, String)>> = parking_lot::Mutex::new(Vec::new());
/// Signalled when a receive releases its target.
static RECEIVING_DONE: parking_lot::Condvar = parking_lot::Condvar::new();

/// How long a receive waits for one into the same target to end before it
/// is refused: a receive whose connection was just cut is still saving its
/// resume state, and the client's retry (`send -t`, a replication run)
/// comes right after.
const RECEIVE_BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The locked list of running receives (pool, target).
type RunningReceives = parking_lot::MutexGuard<'static, Vec<(usize, String)>>;

/// A running receive's claim on its target (released when dropped).
struct Receiving(usize, String);

impl Receiving {
    fn enter(p: &Arc<ImportedPool>, target: &str) -> Result<Receiving> {
        let (mut running, key) =
            Receiving::wait_idle(p, target, RECEIVE_BUSY_WAIT).ok_or_else(|| {
                Error::Busy(format!(
                    "cannot receive: a receive into '{target}' is running"
                ))
            })?;
        running.push(key.clone());
        Ok(Receiving(key.0, key.1))
    }

    /// Waits, at most `timeout`, until no receive into `target` of pool `p`
    /// runs; answers with the list still locked (so a caller can claim the
    /// target before another does) and the target's key. None: one still runs.
    fn wait_idle(
        p: &Arc<ImportedPool>,
        target: &str,
        timeout: std::time::Duration,
    ) -> Option<(RunningReceives, (usize, String))> {
        let key = (Arc::as_ptr(p) as usize, target.to_string());
        let deadline = std::time::Instant::now() + timeout;
        let mut running = RECEIVING.lock();
        while running.contains(&key) {
            if RECEIVING_DONE
                .wait_until(&mut running, deadline)
                .timed_out()
                && running.contains(&key)
            {
                return None;
            }
        }
        Some((running, key))
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        RECEIVING
            .lock()
            .retain(|(p, t)| !(*p == self.0 && *t == self.1));
        RECEIVING_DONE.notify_all();
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
    // Rows as stored (raw) need no key; rows in the clear are sealed with it.
    let clear = rows
        .iter()
        .any(|r| matches!(r, Row::Data { .. } | Row::Name { .. }));
    let root = if clear { p.crypt_root(ds)? } else { None };
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
            Row::Raw { obj, blk, bp } => {
                let n = bp.psize as u64;
                // The stored bytes move into the dirty block, uncopied.
                let mut bp = Arc::unwrap_or_clone(bp);
                let stored = Arc::new(bp.embedded.take().unwrap_or_default());
                let raw = crate::txg::RawBlock { bp, stored };
                if open
                    .dirty
                    .insert((ds, obj, blk), Dirty::Raw(Arc::new(raw)))
                    .is_none()
                {
                    open.dirty_bytes += n;
                }
                if obj >= FIRST_DYNAMIC_OBJECT && blk != objects::ATTR_BLOCK {
                    let next = open.next_object.entry(ds).or_insert(FIRST_DYNAMIC_OBJECT);
                    *next = (*next).max(obj + 1);
                }
            }
            Row::RawName { addr, value } => {
                open.raw_names.insert((ds, addr), value);
            }
        }
    }
    Ok(())
}

/// A raw stream's target: refused where zfs refuses it, before anything
/// changes. An encrypted stream goes into a new dataset (it takes the
/// source's key) or, incrementally, into one holding the same key; an
/// unencrypted one never into (or under) an encrypted dataset, where its
/// blocks would sit in the clear. Compression differs freely: each block
/// carries its own, the property only steers new writes.
fn check_raw_target(
    p: &ImportedPool,
    opts: &ReceiveOptions,
    target: &str,
    begin: &Begin,
    existing: Option<&DatasetRecord>,
) -> Result<()> {
    let datasets = p.datasets.read();
    let replaced = begin.from.is_none() && opts.force;
    let target_crypt = match existing {
        Some(rec) if !replaced => crate::crypt::crypt_of(&datasets, rec.id),
        _ => {
            // A new dataset: what it would inherit from its parent.
            let parent = target.rsplit_once('/').map(|(a, _)| a);
            parent
                .and_then(|n| datasets.get(n))
                .and_then(|r| crate::crypt::crypt_of(&datasets, r.id))
                .filter(|_| begin.crypt.is_none())
        }
    };
    match (&begin.crypt, target_crypt) {
        (None, None) => Ok(()),
        (None, Some(_)) => Err(Error::InvalidArgument(format!(
            "cannot receive raw stream: '{target}' is (or would be) encrypted and the stream is not: its blocks would be stored unencrypted\n(receive it elsewhere, or send without -w)"
        ))),
        (Some(_), None) if existing.is_some() && !replaced => Err(Error::InvalidArgument(format!(
            "cannot receive raw incremental stream: '{target}' is not encrypted and the stream is"
        ))),
        (Some(_), None) => Ok(()),
        (Some(c), Some(t)) => {
            let wrap = datasets
                .values()
                .find(|d| d.id == t.root)
                .and_then(|d| d.crypt.as_deref())
                .and_then(|c| c.wrap.clone());
            if wrap.is_some_and(|w| w.wrapped == c.wrapped) {
                Ok(())
            } else {
                Err(Error::InvalidArgument(format!(
                    "cannot receive raw incremental stream: '{target}' is not encrypted with the stream's key (a different dataset, or its key was changed since)"
                )))
            }
        }
    }
}

/// The crypt record that makes the dataset a raw stream creates (record
/// id `id`) an encryption root with the source's wrapped master key:
/// `load-key` with the source's key opens it.
fn adopted_crypt(id: u64, c: &RawCrypt) -> crate::crypt::CryptRecord {
    crate::crypt::CryptRecord {
        root: id,
        algo: c.algo.clone(),
        wrap: Some(crate::crypt::WrapRecord {
            keyformat: c.keyformat.clone(),
            // The source's key file path means nothing here (as zfs: prompt).
            keylocation: "prompt".into(),
            salt: c.salt.clone(),
            iters: c.iters,
            wrapped: c.wrapped.clone(),
            aad_root: Some(c.aad_root),
        }),
        names: c.names,
        wrapped_by: None,
    }
}

/// Kill -9 windows of a receive, for tests: a hook called at named points
/// with the target (`prepared`: the target is ready, its receive state
/// not yet written when it existed before). A test blocks there and
/// drops the engine as if killed. Not part of the API.
#[doc(hidden)]
pub mod crash_point {
    /// Called with (point, target).
    pub type Hook = std::sync::Arc<dyn Fn(&str, &str) + Send + Sync>;

    static HOOK: parking_lot::Mutex<Option<Hook>> = parking_lot::Mutex::new(None);

    pub fn set(h: Option<Hook>) {
        *HOOK.lock() = h;
    }

    pub(crate) fn at(point: &str, target: &str) {
        let h = HOOK.lock().clone();
        if let Some(h) = h {
            h(point, target);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A raw record's stored bytes are checked against its own pointer's
    /// checksum (a sender bug or a forged record with a good record sum).
    #[test]
    fn raw_rows_round_trip_and_bad_stored_bytes_are_refused() {
        let e = block::encode(
            &[7u8; 4096],
            block::Compression::Lz4,
            block::ChecksumAlgo::Blake3,
        );
        let bp = e.embedded(42);
        let row = Row::Raw {
            obj: objects::VOLUME_OBJECT,
            blk: 3,
            bp: Arc::new(bp),
        };
        let (k, payload) = row.encode();
        assert_eq!(k, Kind::Raw);
        assert_eq!(Row::decode(k, &payload).unwrap(), row);
        let mut bad = payload.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let err = Row::decode(k, &bad).unwrap_err().to_string();
        assert!(err.contains("fails its checksum"), "{err}");
        let name = Row::RawName {
            addr: blockmap::name_addr(5, "x"),
            value: Some(vec![1, 2, 3]),
        };
        let (k, payload) = name.encode();
        assert_eq!(Row::decode(k, &payload).unwrap(), name);
        let block_as_name = Row::RawName {
            addr: blockmap::block_addr(5, 1).to_vec(),
            value: None,
        };
        let (k, payload) = block_as_name.encode();
        assert!(Row::decode(k, &payload).is_err());
    }
}

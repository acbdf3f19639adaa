//! A pool's commit log in an object store (issue 18, decision 0038).
//!
//! The log is a numbered sequence of objects `PREFIX/log/00000000000000000001`,
//! each written once with create-if-absent (`PutMode::Create`, S3
//! `If-None-Match: *`). That single primitive gives one writer per pool
//! without clocks or leases:
//! - an owner appends record N+1 only if nobody has; if someone has, it is
//!   fenced for good and acknowledges nothing more;
//! - a standby takes over by creating the next record itself (a `Claim`),
//!   which is exactly what makes the old owner's next append fail;
//! - an append whose answer is lost is resolved by reading the key back: the
//!   record is ours (durable), someone else's (fenced), or absent (retried
//!   with the same bytes). An outcome still unknown is reported as an error,
//!   never acknowledged, and resolved before the next append.
//!
//! [`Log`] is the protocol, [`GroupCommit`] shares one PUT among concurrent
//! appenders, [`faults::FaultyStore`] injects the failures the tests need.

pub mod faults;
pub mod location;
pub mod record;

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};
use record::{Kind, Record};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Who writes: a stable node name (host id) and a random epoch per process
/// start, so a restarted owner and its previous incarnation differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerId {
    pub node: String,
    pub epoch: u64,
}

impl OwnerId {
    pub fn new(node: &str) -> Result<OwnerId, LogError> {
        if node.is_empty() || node.len() > record::MAX_NODE {
            return Err(LogError::BadNode(node.to_string()));
        }
        Ok(OwnerId {
            node: node.to_string(),
            epoch: rand::random(),
        })
    }
}

impl std::fmt::Display for OwnerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (epoch {:016x})", self.node, self.epoch)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("fenced: log record {seq} was written by {by}; this daemon acknowledges nothing more")]
    Fenced { seq: u64, by: String },
    #[error("the pool's log is owned by {owner}; take it over explicitly (cistern pool takeover)")]
    OwnedByOther { owner: String },
    #[error("the pool's log already exists (last record {last}); it cannot be created again")]
    NotEmpty { last: u64 },
    #[error("the pool's log is empty: there is no pool at this location")]
    Empty,
    #[error("log record {seq} is corrupt: {why}")]
    Corrupt { seq: u64, why: String },
    #[error("log record {seq} has format version {version}, which this build does not read")]
    Version { seq: u64, version: u16 },
    #[error("log record {seq}: outcome unknown after {attempts} attempts ({last}); nothing was acknowledged")]
    Unknown {
        seq: u64,
        attempts: u32,
        last: String,
    },
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("invalid node name {0:?} (1 to 255 bytes)")]
    BadNode(String),
    #[error("{0}")]
    Location(String),
    #[error("the log writer has stopped")]
    Stopped,
    #[error("a batch of {0} bytes is larger than a record may be")]
    TooLarge(usize),
    /// A reader (a standby) is behind the stored log: the record it needs
    /// next was deleted by compaction (decision 0055). It must start again
    /// from the last checkpoint; nothing was claimed.
    #[error("log record {next} is gone (compacted away) while later ones exist: read again from the last checkpoint")]
    Behind { next: u64 },
}

/// How an owner opens the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// `pool create`: only an empty log; of two creators exactly one wins.
    Create,
    /// A restart of the owner: the last claim must be this node's.
    Resume,
    /// `pool takeover`: claim whatever the last owner was.
    Takeover,
}

/// Retries of one PUT whose outcome is unknown, and the claim rounds of a
/// takeover racing a still-active owner: both bounded.
const PUT_ATTEMPTS: u32 = 5;
const CLAIM_ROUNDS: u32 = 64;
const LIST_BATCH_LIMIT: usize = 1 << 20;

fn log_key(prefix: &Path, seq: u64) -> Path {
    prefix.child("log").child(format!("{seq:020}"))
}

/// The writer side of the log. Not `Clone`: one per owner.
#[derive(Debug)]
pub struct Log {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    owner: OwnerId,
    next: u64,
    /// A record whose PUT outcome is unknown: resolved before the next append.
    unresolved: Option<u64>,
    /// Set once another owner's record is found where ours should be.
    fenced: Option<(u64, String)>,
}

/// Every record from the first still stored up to the end, in order, checked.
pub async fn read_all(store: &dyn ObjectStore, prefix: &Path) -> Result<Vec<Record>, LogError> {
    let mut seqs = Vec::new();
    let mut listing = store.list(Some(&prefix.child("log")));
    while let Some(meta) = listing.next().await {
        let meta = meta?;
        if let Some(seq) = meta.location.filename().and_then(|n| n.parse::<u64>().ok()) {
            seqs.push(seq);
        }
        if seqs.len() > LIST_BATCH_LIMIT {
            break;
        }
    }
    seqs.sort_unstable();
    let mut out = Vec::with_capacity(seqs.len());
    let mut expect = seqs.first().copied();
    for seq in seqs {
        if Some(seq) != expect {
            return Err(LogError::Corrupt {
                seq,
                why: "a gap before this record".into(),
            });
        }
        let rec = read_record(store, prefix, seq)
            .await?
            .ok_or_else(|| LogError::Corrupt {
                seq,
                why: "listed but gone".into(),
            })?;
        out.push(rec);
        expect = Some(seq + 1);
    }
    // The list may lag a record created meanwhile: follow the sequence.
    let mut next = out.last().map(|r| r.seq + 1).unwrap_or(1);
    while let Some(rec) = read_record(store, prefix, next).await? {
        out.push(rec);
        next += 1;
    }
    Ok(out)
}

/// The record at `seq`, or `None` if it does not exist (yet).
pub async fn read_record(
    store: &dyn ObjectStore,
    prefix: &Path,
    seq: u64,
) -> Result<Option<Record>, LogError> {
    match read_raw(store, prefix, seq).await? {
        Some(b) => record::decode(seq, &b).map(Some),
        None => Ok(None),
    }
}

async fn read_raw(
    store: &dyn ObjectStore,
    prefix: &Path,
    seq: u64,
) -> Result<Option<Bytes>, LogError> {
    match store.get(&log_key(prefix, seq)).await {
        Ok(r) => Ok(Some(r.bytes().await?)),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether any log record after `seq` is stored (one LIST, stopped at the
/// first key found). Records are only ever created in order, and the last
/// one is never deleted (compaction deletes only records before its own
/// checkpoint), so "record `seq` is absent but a later one exists" means
/// `seq` was deleted: a reader that needs it is behind (decision 0055).
pub async fn record_after(
    store: &dyn ObjectStore,
    prefix: &Path,
    seq: u64,
) -> Result<Option<u64>, LogError> {
    let mut listing = store.list_with_offset(Some(&prefix.child("log")), &log_key(prefix, seq));
    while let Some(meta) = listing.next().await {
        let meta = meta?;
        if let Some(s) = meta
            .location
            .filename()
            .and_then(|n| n.parse::<u64>().ok())
            .filter(|s| *s > seq)
        {
            return Ok(Some(s));
        }
    }
    Ok(None)
}

/// The owner of the last claim in `records`; once compaction deleted the
/// claim (decision 0049), the writer of the last record: every record after
/// a claim is its owner's.
pub fn last_owner(records: &[Record]) -> Option<&OwnerId> {
    records
        .iter()
        .rev()
        .find(|r| r.kind == Kind::Claim)
        .or(records.last())
        .map(|r| &r.owner)
}

impl Log {
    /// Opens the log as its owner: reads every record (returned for replay)
    /// and appends this owner's claim. Of several daemons opening at once,
    /// create-if-absent lets exactly one claim each sequence number.
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        prefix: Path,
        owner: OwnerId,
        mode: OpenMode,
    ) -> Result<(Log, Vec<Record>), LogError> {
        let mut records = read_all(store.as_ref(), &prefix).await?;
        match (mode, records.last()) {
            (OpenMode::Create, Some(last)) => return Err(LogError::NotEmpty { last: last.seq }),
            (OpenMode::Resume | OpenMode::Takeover, None) => return Err(LogError::Empty),
            _ => {}
        }
        for _round in 0..CLAIM_ROUNDS {
            if mode == OpenMode::Resume {
                if let Some(o) = last_owner(&records).filter(|o| o.node != owner.node) {
                    return Err(LogError::OwnedByOther {
                        owner: o.to_string(),
                    });
                }
            }
            let next = records.last().map(|r| r.seq + 1).unwrap_or(1);
            let mut log = Log {
                store: store.clone(),
                prefix: prefix.clone(),
                owner: owner.clone(),
                next,
                unresolved: None,
                fenced: None,
            };
            match log.append_record(Kind::Claim, &[]).await {
                Ok(_) => {
                    tracing::info!(owner = %owner, seq = next, "claimed the pool's log");
                    return Ok((log, records));
                }
                Err(LogError::Fenced { .. }) => {
                    // Someone wrote `next` first: read on and try the one after.
                    if mode == OpenMode::Create {
                        return Err(LogError::NotEmpty { last: next });
                    }
                    while let Some(rec) = read_record(
                        store.as_ref(),
                        &prefix,
                        records.last().map(|r| r.seq + 1).unwrap_or(1),
                    )
                    .await?
                    {
                        records.push(rec);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Err(LogError::Unknown {
            seq: records.last().map(|r| r.seq + 1).unwrap_or(1),
            attempts: CLAIM_ROUNDS,
            last: "the log kept growing while claiming it".into(),
        })
    }

    /// A warm standby's takeover: the records before `next` are already
    /// applied, so only those from `next` on are read (returned for replay)
    /// before the claim. Fencing is the same create-if-absent claim as
    /// [`Log::open`] with `Takeover`. `fencing` is the node of the owner the
    /// standby means to fence (the last claim it applied): a claim by any
    /// other node found on the way means another standby took over first,
    /// and this one backs off, so of several racing takers exactly one owns
    /// the pool.
    pub async fn take_over_from(
        store: Arc<dyn ObjectStore>,
        prefix: Path,
        owner: OwnerId,
        next: u64,
        fencing: Option<&str>,
    ) -> Result<(Log, Vec<Record>), LogError> {
        let mut records: Vec<Record> = Vec::new();
        let mut at = next.max(1);
        let mut fencing = fencing.map(str::to_string);
        for _round in 0..CLAIM_ROUNDS {
            while let Some(rec) = read_record(store.as_ref(), &prefix, at).await? {
                if rec.kind == Kind::Claim {
                    match &fencing {
                        Some(node) if *node != rec.owner.node => {
                            return Err(LogError::OwnedByOther {
                                owner: rec.owner.to_string(),
                            })
                        }
                        Some(_) => {}
                        None => fencing = Some(rec.owner.node.clone()),
                    }
                }
                records.push(rec);
                at += 1;
                if records.len() > LIST_BATCH_LIMIT {
                    return Err(LogError::Unknown {
                        seq: at,
                        attempts: CLAIM_ROUNDS,
                        last: "the log kept growing while claiming it".into(),
                    });
                }
            }
            if at == 1 {
                return Err(LogError::Empty);
            }
            // `at` is absent: the end of the log, or compacted away while
            // this standby lagged. Claiming a deleted number would put our
            // claim before records that exist and fence nobody.
            if record_after(store.as_ref(), &prefix, at).await?.is_some() {
                return Err(LogError::Behind { next: at });
            }
            let mut log = Log {
                store: store.clone(),
                prefix: prefix.clone(),
                owner: owner.clone(),
                next: at,
                unresolved: None,
                fenced: None,
            };
            match log.append_record(Kind::Claim, &[]).await {
                Ok(_) => {
                    tracing::info!(owner = %owner, seq = at, "claimed the pool's log (warm standby)");
                    return Ok((log, records));
                }
                // Someone wrote `at` first: read on (another taker's claim
                // stops this one above) and claim the one after.
                Err(LogError::Fenced { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Err(LogError::Unknown {
            seq: at,
            attempts: CLAIM_ROUNDS,
            last: "the log kept growing while claiming it".into(),
        })
    }

    pub fn owner(&self) -> &OwnerId {
        &self.owner
    }

    /// The sequence number the next append will use.
    pub fn next_seq(&self) -> u64 {
        self.next
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced.is_some()
    }

    /// Appends one batch of entries as one object. `Ok(seq)` means durable in
    /// the store and ours; any error means "not acknowledged".
    pub async fn append(&mut self, entries: &[Bytes]) -> Result<u64, LogError> {
        let size: usize = entries.iter().map(|e| 4 + e.len()).sum();
        if size > record::MAX_PAYLOAD {
            return Err(LogError::TooLarge(size));
        }
        self.append_record(Kind::Batch, entries).await
    }

    async fn append_record(&mut self, kind: Kind, entries: &[Bytes]) -> Result<u64, LogError> {
        if let Some((seq, by)) = &self.fenced {
            return Err(LogError::Fenced {
                seq: *seq,
                by: by.clone(),
            });
        }
        if let Some(seq) = self.unresolved.take() {
            // Its callers were told it failed. If it landed after all it
            // stays (ours, in order); if not, an empty batch takes its place
            // so that it can never land later. Either way the number is
            // settled before the next record.
            let empty = record::encode(seq, Kind::Batch, &self.owner, &[]);
            self.put_once(seq, empty).await?;
            self.next = seq + 1;
        }
        let seq = self.next;
        let body = record::encode(seq, kind, &self.owner, entries);
        self.put_once(seq, body).await?;
        self.next = seq + 1;
        Ok(seq)
    }

    /// Puts `body` at `seq` with create-if-absent until the outcome is known.
    async fn put_once(&mut self, seq: u64, body: Bytes) -> Result<(), LogError> {
        let key = log_key(&self.prefix, seq);
        let mut last = String::new();
        for attempt in 0..PUT_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(20 << attempt.min(6))).await;
            }
            let opts = PutOptions {
                mode: PutMode::Create,
                ..Default::default()
            };
            match self
                .store
                .put_opts(&key, PutPayload::from_bytes(body.clone()), opts)
                .await
            {
                Ok(_) => return Ok(()),
                Err(object_store::Error::AlreadyExists { .. }) => {}
                Err(e) => last = e.to_string(),
            }
            // Exists, or the answer was lost: the stored record decides. Only
            // this process has this epoch, so a record with our owner is ours.
            match read_raw(self.store.as_ref(), &self.prefix, seq).await {
                Ok(Some(stored)) if stored == body => return Ok(()),
                Ok(Some(stored)) => {
                    let by = match record::decode(seq, &stored) {
                        Ok(r) if r.owner == self.owner => return Ok(()),
                        Ok(r) => r.owner.to_string(),
                        Err(e) => format!("an unreadable record ({e})"),
                    };
                    tracing::error!(seq, by = %by, "fenced: another owner wrote the pool's log; stopping all writes");
                    self.fenced = Some((seq, by.clone()));
                    return Err(LogError::Fenced { seq, by });
                }
                Ok(None) => {}
                Err(e) => last = e.to_string(),
            }
        }
        self.unresolved = Some(seq);
        Err(LogError::Unknown {
            seq,
            attempts: PUT_ATTEMPTS,
            last,
        })
    }
}

/// Group commit: appenders send entries; one task writes whatever queued up
/// while the previous PUT was in flight as one record. The queue is bounded,
/// so a slow store pushes back on writers instead of growing memory.
#[derive(Clone)]
pub struct GroupCommit {
    tx: mpsc::Sender<(Bytes, oneshot::Sender<Result<u64, LogError>>)>,
}

/// Bytes per record a batch may gather (well under `record::MAX_PAYLOAD`).
const BATCH_BYTES: usize = 8 << 20;

impl GroupCommit {
    /// Starts the committer task on the current runtime; it ends when every
    /// `GroupCommit` is dropped, returning the log.
    pub fn start(log: Log, queue: usize) -> (GroupCommit, tokio::task::JoinHandle<Log>) {
        GroupCommit::start_with(log, queue, false)
    }

    /// As [`GroupCommit::start`]; with `strict`, once one append fails every
    /// later one fails too without being written. A device shipping its
    /// writes needs this: a sync acknowledged after an earlier one failed
    /// would claim writes durable that the failed record carried.
    pub fn start_with(
        mut log: Log,
        queue: usize,
        strict: bool,
    ) -> (GroupCommit, tokio::task::JoinHandle<Log>) {
        assert!(queue > 0);
        let (tx, mut rx) = mpsc::channel::<(Bytes, oneshot::Sender<Result<u64, LogError>>)>(queue);
        let task = tokio::spawn(async move {
            let mut failed: Option<LogError> = None;
            while let Some(first) = rx.recv().await {
                let mut size = first.0.len();
                let mut batch = vec![first];
                while size < BATCH_BYTES {
                    match rx.try_recv() {
                        Ok(next) => {
                            size += next.0.len();
                            batch.push(next);
                        }
                        Err(_) => break,
                    }
                }
                let entries: Vec<Bytes> = batch.iter().map(|(e, _)| e.clone()).collect();
                let result = match &failed {
                    Some(f) => Err(copy_error(f)),
                    None => log.append(&entries).await,
                };
                if strict && failed.is_none() {
                    if let Err(e) = &result {
                        failed = Some(copy_error(e));
                    }
                }
                for (_, done) in batch {
                    let _ = done.send(match &result {
                        Ok(seq) => Ok(*seq),
                        Err(LogError::Fenced { seq, by }) => Err(LogError::Fenced {
                            seq: *seq,
                            by: by.clone(),
                        }),
                        Err(e) => Err(LogError::Unknown {
                            seq: log.next_seq(),
                            attempts: PUT_ATTEMPTS,
                            last: e.to_string(),
                        }),
                    });
                }
            }
            log
        });
        (GroupCommit { tx }, task)
    }

    /// Queues the entry and returns what will tell its outcome: the queue
    /// order is the log order, so a caller can queue under its own lock and
    /// wait outside it.
    pub async fn enqueue(
        &self,
        entry: Bytes,
    ) -> Result<oneshot::Receiver<Result<u64, LogError>>, LogError> {
        let (done, wait) = oneshot::channel();
        self.tx
            .send((entry, done))
            .await
            .map_err(|_| LogError::Stopped)?;
        Ok(wait)
    }

    /// Returns once the entry is durable in the log, with its record's
    /// sequence number; an error means it was not acknowledged.
    pub async fn append(&self, entry: Bytes) -> Result<u64, LogError> {
        let (done, wait) = oneshot::channel();
        self.tx
            .send((entry, done))
            .await
            .map_err(|_| LogError::Stopped)?;
        wait.await.map_err(|_| LogError::Stopped)?
    }
}

/// A copy of an append's error for every waiter of a batch (and, in strict
/// mode, every later one): fenced stays fenced, anything else is "unknown".
fn copy_error(e: &LogError) -> LogError {
    match e {
        LogError::Fenced { seq, by } => LogError::Fenced {
            seq: *seq,
            by: by.clone(),
        },
        LogError::Unknown {
            seq,
            attempts,
            last,
        } => LogError::Unknown {
            seq: *seq,
            attempts: *attempts,
            last: last.clone(),
        },
        e => LogError::Unknown {
            seq: 0,
            attempts: PUT_ATTEMPTS,
            last: e.to_string(),
        },
    }
}

/// A standby's view: follows the log from a position, record by record.
pub struct Tail {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    next: u64,
}

impl Tail {
    pub fn new(store: Arc<dyn ObjectStore>, prefix: Path, next: u64) -> Tail {
        Tail {
            store,
            prefix,
            next,
        }
    }

    /// The records written since the last call, in order (possibly none).
    pub async fn poll(&mut self, max: usize) -> Result<Vec<Record>, LogError> {
        let mut out = Vec::new();
        while out.len() < max {
            match read_record(self.store.as_ref(), &self.prefix, self.next).await? {
                Some(r) => {
                    out.push(r);
                    self.next += 1;
                }
                None => break,
            }
        }
        Ok(out)
    }

    pub fn next_seq(&self) -> u64 {
        self.next
    }
}

#[cfg(test)]
mod tests;

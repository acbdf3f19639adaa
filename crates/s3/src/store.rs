//! Bucket semantics over the object layer: every function here is blocking
//! (it calls [`ObjectSet`]) and runs on tokio's blocking pool, bounded by the
//! service's semaphore. The protocol side is in `service.rs`.
//!
//! Crash safety rests on the object layer's rules: an object is written in
//! full before any name points at it, every op is atomic and logged in
//! order, and a write is acknowledged only after [`ObjectSet::commit`]. A
//! version that moves keeps a name at every instant (named in its new
//! place before the old name goes), and a multipart object (a Dir of parts)
//! is named in TRASH_DIR before its last other name goes, so a crash never
//! orphans its parts (see `reap`).

use crate::record::*;
use crate::S3Config;
use dataset::objects::{ObjectAttrs, ObjectKind, ROOT_DIR};
use dataset::{DatasetKind, Engine, ObjectSet};
use parking_lot::Mutex;
use s3s::dto::ETagCondition;
use s3s::{s3_error, S3Error, S3ErrorCode};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub type R<T> = Result<T, S3Error>;

/// Separates a bucket from its snapshot in a read-only snapshot bucket's
/// name: `photos--snap--daily1` is `PARENT/photos@daily1`.
pub const SNAP_SEP: &str = "--snap--";

/// Bytes moved per object-layer read or write.
pub const CHUNK: usize = 1 << 20;

/// Smallest part of a multipart upload but the last (S3's rule).
pub const MIN_PART: u64 = 5 << 20;

/// An engine error at the S3 edge.
pub fn ds_err(e: dataset::Error) -> S3Error {
    use dataset::Error as E;
    match e {
        E::NotFound(m) => S3Error::with_message(S3ErrorCode::NoSuchBucket, m),
        E::AlreadyExists(m) => S3Error::with_message(S3ErrorCode::BucketAlreadyOwnedByYou, m),
        E::InvalidArgument(m) => S3Error::with_message(S3ErrorCode::InvalidArgument, m),
        E::Busy(m) => S3Error::with_message(S3ErrorCode::OperationAborted, m),
        E::NoSpace(m) => {
            // Ceph RGW's code for a quota; a full pool is 507 as MinIO's.
            let quota = m.contains("quota");
            let code = if quota {
                "QuotaExceeded"
            } else {
                "XCisternStorageFull"
            };
            let mut err = S3Error::with_message(
                S3ErrorCode::from_bytes(code.as_bytes()).unwrap_or(S3ErrorCode::InternalError),
                m,
            );
            err.set_status_code(if quota {
                http::StatusCode::FORBIDDEN
            } else {
                http::StatusCode::INSUFFICIENT_STORAGE
            });
            err
        }
        E::ReadOnly(m) => {
            S3Error::with_message(S3ErrorCode::AccessDenied, format!("{m} is read-only"))
        }
        E::Corrupt(m) => {
            S3Error::with_message(S3ErrorCode::InternalError, format!("data error: {m}"))
        }
        E::Io(m) => S3Error::with_message(S3ErrorCode::InternalError, format!("I/O error: {m}")),
        e @ E::NeedsUpgrade(_) => {
            S3Error::with_message(S3ErrorCode::ServiceUnavailable, e.to_string())
        }
        e @ E::KeyUnavailable(_) => S3Error::with_message(S3ErrorCode::AccessDenied, e.to_string()),
    }
}

trait Ctx<T> {
    fn s3(self) -> R<T>;
}
impl<T> Ctx<T> for dataset::Result<T> {
    fn s3(self) -> R<T> {
        self.map_err(ds_err)
    }
}

pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The S3 name of snapshot `snap` of bucket `bucket`, if it makes a valid
/// bucket name: lowercased, every character outside `[a-z0-9.-]` as `-`.
pub fn snapshot_bucket_name(bucket: &str, snap: &str) -> Option<String> {
    let s: String = snap
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let name = format!("{bucket}{SNAP_SEP}{s}");
    s3s::path::check_bucket_name(&name).then_some(name)
}

/// A name CreateBucket accepts: S3's rules, and not a snapshot bucket's.
pub fn check_new_bucket_name(bucket: &str) -> R<()> {
    if bucket.contains(SNAP_SEP) || !s3s::path::check_bucket_name(bucket) {
        return Err(s3_error!(
            InvalidBucketName,
            "The specified bucket is not valid: '{bucket}'"
        ));
    }
    Ok(())
}

/// An open bucket (or snapshot of one).
pub struct Bucket {
    /// The S3 name.
    pub name: String,
    pub os: Arc<ObjectSet>,
    pub snapshot: bool,
}

/// One version of a key, found.
#[derive(Debug, Clone)]
pub struct Found {
    pub obj: u64,
    pub attrs: ObjectAttrs,
    pub rec: ObjectRecord,
    /// The current version of its key.
    pub latest: bool,
    /// Its name in VERSIONS_DIR if it is noncurrent.
    pub vname: Option<String>,
}

/// Preconditions of a write, checked against the current version under the key's lock.
#[derive(Debug, Default, Clone)]
pub struct WriteCond {
    pub if_match: Option<ETagCondition>,
    pub if_none_match: Option<ETagCondition>,
}

pub struct Store {
    pub engine: Arc<Engine>,
    pub cfg: S3Config,
    sets: Mutex<HashMap<String, Arc<ObjectSet>>>,
    /// Striped locks: one writer at a time per (bucket, key).
    locks: Vec<Mutex<()>>,
    seq: AtomicU64,
}

fn record_of(attrs: &ObjectAttrs) -> ObjectRecord {
    ObjectRecord::decode(&attrs.payload).unwrap_or_else(|| ObjectRecord {
        v: RECORD_VERSION,
        size: attrs.size,
        mtime_ns: attrs.mtime_ns,
        ..Default::default()
    })
}

pub fn load(os: &ObjectSet, obj: u64) -> R<Option<(ObjectAttrs, ObjectRecord)>> {
    Ok(os.attrs(obj).s3()?.map(|a| {
        let r = record_of(&a);
        (a, r)
    }))
}

pub fn settings(os: &ObjectSet) -> R<BucketSettings> {
    Ok(os
        .attrs(ROOT_DIR)
        .s3()?
        .map(|a| BucketSettings::decode(&a.payload))
        .unwrap_or_default())
}

pub fn current(os: &ObjectSet, key: &str) -> R<Option<Found>> {
    let Some(obj) = os.lookup(ROOT_DIR, key).s3()? else {
        return Ok(None);
    };
    Ok(load(os, obj)?.map(|(attrs, rec)| Found {
        obj,
        attrs,
        rec,
        latest: true,
        vname: None,
    }))
}

/// The noncurrent null version of a key (suspended versioning), scanning its versions.
fn noncurrent_null(os: &ObjectSet, key: &str) -> R<Option<Found>> {
    let prefix = format!("{key}{SEP}");
    let mut after: Option<String> = None;
    loop {
        let batch = os
            .list(VERSIONS_DIR, &prefix, after.as_deref(), 1000)
            .s3()?;
        let Some(last) = batch.last() else {
            return Ok(None);
        };
        after = Some(last.0.clone());
        for (name, obj) in batch {
            if let Some((attrs, rec)) = load(os, obj)? {
                if rec.version_id.is_none() {
                    return Ok(Some(Found {
                        obj,
                        attrs,
                        rec,
                        latest: false,
                        vname: Some(name),
                    }));
                }
            }
        }
    }
}

/// A version of a key: the current one (`None`), `null`, or by id.
pub fn find_version(os: &ObjectSet, key: &str, vid: Option<&str>) -> R<Found> {
    let cur = current(os, key)?;
    let Some(vid) = vid else {
        return cur.ok_or_else(|| s3_error!(NoSuchKey, "The specified key does not exist."));
    };
    let no_version = || s3_error!(NoSuchVersion, "The specified version does not exist.");
    if vid == "null" {
        if let Some(c) = cur.filter(|c| c.rec.version_id.is_none()) {
            return Ok(c);
        }
        return noncurrent_null(os, key)?.ok_or_else(no_version);
    }
    let seq = parse_version_id(vid)
        .ok_or_else(|| s3_error!(InvalidArgument, "Invalid version id specified"))?;
    if let Some(c) = cur.filter(|c| c.rec.version_id.as_deref() == Some(vid)) {
        return Ok(c);
    }
    let name = version_name(key, seq);
    let Some(obj) = os.lookup(VERSIONS_DIR, &name).s3()? else {
        return Err(no_version());
    };
    match load(os, obj)? {
        Some((attrs, rec)) if rec.version_id.as_deref() == Some(vid) => Ok(Found {
            obj,
            attrs,
            rec,
            latest: false,
            vname: Some(name),
        }),
        _ => Err(no_version()),
    }
}

/// Before the last name of a multipart object (a Dir) goes: name it in
/// TRASH_DIR, so a crash cannot leave its parts without an owner.
fn pre_discard(os: &ObjectSet, obj: u64, attrs: &ObjectAttrs) -> R<()> {
    if attrs.kind == ObjectKind::Dir {
        os.link(TRASH_DIR, &trash_name(obj), obj).s3()?;
    }
    Ok(())
}

/// After a name of `obj` went: free it if nothing names it any more.
fn post_discard(os: &ObjectSet, obj: u64, kind: ObjectKind) -> R<()> {
    match kind {
        ObjectKind::Dir => reap(os, obj),
        _ => {
            if os.attrs(obj).s3()?.is_some_and(|a| a.nlink == 0) {
                os.remove(obj).s3()?;
            }
            Ok(())
        }
    }
}

/// Frees a trashed multipart object or upload with its parts, unless another
/// name still points at it (a crash between two steps of a move).
pub fn reap(os: &ObjectSet, obj: u64) -> R<()> {
    let tname = trash_name(obj);
    let Some(a) = os.attrs(obj).s3()? else {
        os.unlink(TRASH_DIR, &tname).s3()?;
        return Ok(());
    };
    if a.nlink > 1 {
        return Ok(());
    }
    loop {
        let batch = os.list(obj, "", None, 256).s3()?;
        if batch.is_empty() {
            break;
        }
        for (name, part) in batch {
            os.unlink(obj, &name).s3()?;
            if os.attrs(part).s3()?.is_some_and(|a| a.nlink == 0) {
                os.remove(part).s3()?;
            }
        }
    }
    os.unlink(TRASH_DIR, &tname).s3()?;
    os.remove(obj).s3()?;
    Ok(())
}

fn reap_all(os: &ObjectSet) -> R<()> {
    for (_, obj) in os.list(TRASH_DIR, "", None, usize::MAX).s3()? {
        reap(os, obj)?;
    }
    Ok(())
}

fn etag_matches(cond: &ETagCondition, etag: &str) -> bool {
    match cond {
        ETagCondition::Any => true,
        ETagCondition::ETag(e) => e.value() == etag,
    }
}

/// Read-side preconditions (GET, HEAD, copy source), RFC 9110 order as S3
/// applies it: If-Match beats If-Unmodified-Since, If-None-Match beats
/// If-Modified-Since.
#[derive(Clone, Copy)]
pub struct ReadCond<'a> {
    pub if_match: Option<&'a ETagCondition>,
    pub if_none_match: Option<&'a ETagCondition>,
    pub if_modified_since: Option<i64>,
    pub if_unmodified_since: Option<i64>,
    /// GET/HEAD answer 304 where a copy source answers 412.
    pub not_modified_is_304: bool,
}

pub fn check_read_cond(c: &ReadCond<'_>, etag: &str, mtime_ns: u64) -> R<()> {
    let secs = (mtime_ns / 1_000_000_000) as i64;
    let failed = || {
        s3_error!(
            PreconditionFailed,
            "At least one of the pre-conditions you specified did not hold"
        )
    };
    let not_modified = || {
        if c.not_modified_is_304 {
            S3Error::new(S3ErrorCode::NotModified)
        } else {
            failed()
        }
    };
    match c.if_match {
        Some(m) if !etag_matches(m, etag) => return Err(failed()),
        Some(_) => {}
        None => {
            if c.if_unmodified_since.is_some_and(|t| secs > t) {
                return Err(failed());
            }
        }
    }
    match c.if_none_match {
        Some(m) if etag_matches(m, etag) => return Err(not_modified()),
        Some(_) => {}
        None => {
            if c.if_modified_since.is_some_and(|t| secs <= t) {
                return Err(not_modified());
            }
        }
    }
    Ok(())
}

fn check_write_cond(c: &WriteCond, cur: Option<&Found>) -> R<()> {
    let live = cur.filter(|f| !f.rec.delete_marker);
    if let Some(m) = &c.if_none_match {
        if live.is_some_and(|f| etag_matches(m, &f.rec.etag)) {
            return Err(s3_error!(
                PreconditionFailed,
                "At least one of the pre-conditions you specified did not hold"
            ));
        }
    }
    if let Some(m) = &c.if_match {
        match live {
            None => return Err(s3_error!(NoSuchKey, "The specified key does not exist.")),
            Some(f) if !etag_matches(m, &f.rec.etag) => {
                return Err(s3_error!(
                    PreconditionFailed,
                    "At least one of the pre-conditions you specified did not hold"
                ));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// One page of ListObjects.
#[derive(Default)]
pub struct Listing {
    pub keys: Vec<(String, ObjectRecord)>,
    pub prefixes: Vec<String>,
    pub truncated: bool,
    /// Where the next page starts (after this name).
    pub next: Option<String>,
}

/// One page of ListObjectVersions.
#[derive(Default)]
pub struct VersionListing {
    pub versions: Vec<(String, ObjectRecord, bool)>,
    pub prefixes: Vec<String>,
    pub truncated: bool,
    pub next_key: Option<String>,
    pub next_version: Option<String>,
}

/// The largest char: `cp + MAX_CHAR` sorts after every name under `cp`.
const MAX_CHAR: char = char::MAX;

/// A common prefix `name` rolls up into, if any.
fn rollup<'a>(name: &'a str, prefix: &str, delim: Option<&str>) -> Option<&'a str> {
    let d = delim.filter(|d| !d.is_empty())?;
    let pos = name.get(prefix.len()..)?.find(d)?;
    Some(&name[..prefix.len() + pos + d.len()])
}

/// An upload in progress.
pub struct Upload {
    pub dir: u64,
    pub name: String,
    pub attrs: ObjectAttrs,
    pub rec: ObjectRecord,
}

/// Part numbers and ETags a CompleteMultipartUpload lists.
pub struct CompletePart {
    pub number: i32,
    pub etag: String,
}

impl Store {
    pub fn new(engine: Arc<Engine>, cfg: S3Config) -> Self {
        Self {
            engine,
            cfg,
            sets: Mutex::new(HashMap::new()),
            locks: (0..64).map(|_| Mutex::new(())).collect(),
            seq: AtomicU64::new(now_ns()),
        }
    }

    /// Increasing across this process, near wall-clock ns.
    pub fn next_seq(&self) -> u64 {
        let now = now_ns();
        let mut prev = self.seq.load(Ordering::Relaxed);
        loop {
            let next = now.max(prev + 1);
            match self
                .seq
                .compare_exchange(prev, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return next,
                Err(p) => prev = p,
            }
        }
    }

    fn lock(&self, b: &Bucket, key: &str) -> parking_lot::MutexGuard<'_, ()> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        b.name.hash(&mut h);
        key.hash(&mut h);
        self.locks[(h.finish() as usize) % self.locks.len()].lock()
    }

    pub fn dataset_of(&self, bucket: &str) -> String {
        format!("{}/{bucket}", self.cfg.parent)
    }

    pub fn forget(&self, bucket: &str) {
        self.sets.lock().remove(bucket);
    }

    /// Opens a bucket by its S3 name (a bucket dataset under the parent, or
    /// a snapshot of one), creating the S3 layer's fixed directories.
    pub fn open(&self, bucket: &str) -> R<Bucket> {
        let no_bucket = || s3_error!(NoSuchBucket, "The specified bucket does not exist");
        let cached = self.sets.lock().get(bucket).cloned();
        if let Some(os) = cached {
            // Still there, under the same name (not destroyed, not renamed)?
            let snapshot = bucket.contains(SNAP_SEP);
            if os.is_readonly().is_ok() && (snapshot || os.name() == self.dataset_of(bucket)) {
                return Ok(Bucket {
                    name: bucket.to_string(),
                    snapshot,
                    os,
                });
            }
            self.forget(bucket);
        }
        let (ds, snapshot) = match bucket.split_once(SNAP_SEP) {
            Some((base, snap)) => {
                let base_ds = self.dataset_of(base);
                let all = self
                    .engine
                    .list_datasets(Some(&base_ds))
                    .map_err(|_| no_bucket())?;
                let at = format!("{base_ds}@");
                let hits: Vec<String> = all
                    .into_iter()
                    .filter(|d| d.kind == DatasetKind::Snapshot)
                    .filter_map(|d| {
                        let s = d.name.strip_prefix(&at)?;
                        (snapshot_bucket_name(base, s)?
                            .strip_prefix(base)?
                            .strip_prefix(SNAP_SEP)
                            == Some(snap))
                        .then(|| d.name.clone())
                    })
                    .collect();
                if hits.len() != 1 {
                    return Err(no_bucket());
                }
                (hits[0].clone(), true)
            }
            None => {
                let info = self
                    .engine
                    .dataset(&self.dataset_of(bucket))
                    .map_err(|_| no_bucket())?;
                if info.kind != DatasetKind::Bucket {
                    return Err(no_bucket());
                }
                (info.name, false)
            }
        };
        let os = self.engine.open_objects(&ds).map_err(|e| match e {
            dataset::Error::NotFound(_) => no_bucket(),
            e => ds_err(e),
        })?;
        if !snapshot && !os.is_readonly().s3()? {
            self.init(&os)?;
        }
        self.sets.lock().insert(bucket.to_string(), os.clone());
        Ok(Bucket {
            name: bucket.to_string(),
            os,
            snapshot,
        })
    }

    /// The fixed directories (idempotent) and what a crash left in the trash.
    fn init(&self, os: &ObjectSet) -> R<()> {
        for d in [VERSIONS_DIR, UPLOADS_DIR, TRASH_DIR] {
            os.create_fixed(d, ObjectKind::Dir).s3()?;
        }
        reap_all(os)?;
        os.commit().s3()
    }

    /// Writes need a bucket that is neither a snapshot nor `readonly=on`.
    pub fn writable(&self, b: &Bucket) -> R<()> {
        if b.snapshot {
            return Err(s3_error!(
                AccessDenied,
                "bucket '{}' is a snapshot: read-only",
                b.name
            ));
        }
        if b.os.is_readonly().s3()? {
            return Err(s3_error!(
                AccessDenied,
                "bucket '{}' is read-only (readonly=on)",
                b.name
            ));
        }
        Ok(())
    }

    pub fn create_bucket(&self, bucket: &str) -> R<()> {
        check_new_bucket_name(bucket)?;
        let ds = self.dataset_of(bucket);
        match self.engine.create_dataset(&ds, DatasetKind::Bucket, &[]) {
            Ok(_) => {}
            Err(dataset::Error::AlreadyExists(_)) => {
                return Err(s3_error!(
                    BucketAlreadyOwnedByYou,
                    "bucket '{bucket}' already exists"
                ));
            }
            Err(dataset::Error::NotFound(m)) => {
                return Err(s3_error!(
                    InternalError,
                    "the S3 parent dataset is missing: {m}"
                ));
            }
            Err(e) => return Err(ds_err(e)),
        }
        self.forget(bucket);
        self.open(bucket).map(|_| ())
    }

    /// BucketNotEmpty while any key or version remains; uploads in
    /// progress go with the bucket (as in S3).
    pub fn delete_bucket(&self, b: &Bucket) -> R<()> {
        self.writable(b)?;
        let os = &b.os;
        for d in [ROOT_DIR, VERSIONS_DIR] {
            if !os.list(d, "", None, 1).s3()?.is_empty() {
                return Err(s3_error!(
                    BucketNotEmpty,
                    "The bucket you tried to delete is not empty"
                ));
            }
        }
        let opts = dataset::DestroyOptions::default();
        self.engine
            .destroy(&self.dataset_of(&b.name), &opts)
            .map_err(|e| match e {
                dataset::Error::Busy(m) => S3Error::with_message(S3ErrorCode::BucketNotEmpty, m),
                e => ds_err(e),
            })?;
        self.forget(&b.name);
        Ok(())
    }

    pub fn put_settings(&self, b: &Bucket, f: impl FnOnce(&mut BucketSettings) -> R<()>) -> R<()> {
        self.writable(b)?;
        let _g = self.lock(b, "");
        let mut s = settings(&b.os)?;
        f(&mut s)?;
        s.v = RECORD_VERSION;
        b.os.set_payload(ROOT_DIR, &s.encode()).s3()?;
        b.os.commit().s3()
    }

    /// Makes `new` (written in full) the current version of `key`, keeping
    /// or dropping the old one as versioning says; `done` is an upload's
    /// name to drop once it is the object. Durable when it returns.
    pub fn install(
        &self,
        b: &Bucket,
        key: &str,
        new: u64,
        rec: ObjectRecord,
        cond: &WriteCond,
        done: Option<&str>,
    ) -> R<ObjectRecord> {
        let _g = self.lock(b, key);
        self.install_locked(b, key, new, rec, cond, done)
    }

    /// [`Store::install`] with the key's lock held by the caller.
    fn install_locked(
        &self,
        b: &Bucket,
        key: &str,
        new: u64,
        mut rec: ObjectRecord,
        cond: &WriteCond,
        done: Option<&str>,
    ) -> R<ObjectRecord> {
        let os = &b.os;
        let st = settings(os)?;
        let cur = current(os, key)?;
        check_write_cond(cond, cur.as_ref())?;
        rec.v = RECORD_VERSION;
        rec.key = key.to_string();
        rec.seq = self.next_seq();
        rec.mtime_ns = now_ns();
        rec.upload = false;
        rec.version_id = st.versioning_enabled().then(|| version_id(rec.seq));
        os.set_payload(new, &rec.encode()).s3()?;
        self.replace_current(os, key, new, &rec, cur, &st)?;
        if let Some(name) = done {
            os.unlink(UPLOADS_DIR, name).s3()?;
        }
        os.commit().s3()?;
        Ok(rec)
    }

    fn replace_current(
        &self,
        os: &ObjectSet,
        key: &str,
        new: u64,
        rec: &ObjectRecord,
        cur: Option<Found>,
        st: &BucketSettings,
    ) -> R<()> {
        let keep_old = match st.versioning.as_deref() {
            Some("Enabled") => cur.is_some(),
            Some(_) => cur.as_ref().is_some_and(|c| c.rec.version_id.is_some()),
            None => false,
        };
        if st.versioning.is_some() && rec.version_id.is_none() {
            // Suspended: the new null version replaces any older null one.
            if let Some(old) = noncurrent_null(os, key)? {
                pre_discard(os, old.obj, &old.attrs)?;
                os.unlink(VERSIONS_DIR, old.vname.as_deref().unwrap_or_default())
                    .s3()?;
                post_discard(os, old.obj, old.attrs.kind)?;
            }
        }
        if let Some(c) = &cur {
            if keep_old {
                os.link(VERSIONS_DIR, &version_name(key, c.rec.seq), c.obj)
                    .s3()?;
            } else {
                pre_discard(os, c.obj, &c.attrs)?;
            }
        }
        os.link(ROOT_DIR, key, new).s3()?;
        if let Some(c) = cur {
            if !keep_old && c.obj != new {
                post_discard(os, c.obj, c.attrs.kind)?;
            }
        }
        Ok(())
    }

    /// DeleteObject without a version: removes the key (unversioned) or
    /// puts a delete marker on top. (delete marker?, its version id)
    pub fn delete_current(&self, b: &Bucket, key: &str) -> R<(bool, Option<String>)> {
        self.writable(b)?;
        let os = &b.os;
        let _g = self.lock(b, key);
        let st = settings(os)?;
        let cur = current(os, key)?;
        if st.versioning.is_none() {
            if let Some(c) = cur {
                pre_discard(os, c.obj, &c.attrs)?;
                os.unlink(ROOT_DIR, key).s3()?;
                post_discard(os, c.obj, c.attrs.kind)?;
                os.commit().s3()?;
            }
            return Ok((false, None));
        }
        let seq = self.next_seq();
        let rec = ObjectRecord {
            v: RECORD_VERSION,
            key: key.to_string(),
            seq,
            version_id: st.versioning_enabled().then(|| version_id(seq)),
            delete_marker: true,
            mtime_ns: now_ns(),
            ..Default::default()
        };
        let m = os.create(ObjectKind::File, &rec.encode()).s3()?;
        self.replace_current(os, key, m, &rec, cur, &st)?;
        os.commit().s3()?;
        Ok((true, Some(rec.version_str())))
    }

    /// DeleteObject of one version, for good. (was a delete marker?)
    /// A version that does not exist is no error (S3 deletes are idempotent).
    pub fn delete_version(&self, b: &Bucket, key: &str, vid: &str) -> R<bool> {
        self.writable(b)?;
        let os = &b.os;
        let _g = self.lock(b, key);
        let f = match find_version(os, key, Some(vid)) {
            Ok(f) => f,
            Err(e)
                if matches!(
                    e.code(),
                    S3ErrorCode::NoSuchVersion | S3ErrorCode::NoSuchKey
                ) =>
            {
                return Ok(false)
            }
            Err(e) => return Err(e),
        };
        pre_discard(os, f.obj, &f.attrs)?;
        if f.latest {
            // The newest noncurrent version becomes current.
            let next = os
                .list(VERSIONS_DIR, &format!("{key}{SEP}"), None, 2)
                .s3()?
                .into_iter()
                .find(|(_, o)| *o != f.obj);
            match next {
                Some((name, o)) => {
                    os.link(ROOT_DIR, key, o).s3()?;
                    os.unlink(VERSIONS_DIR, &name).s3()?;
                }
                None => {
                    os.unlink(ROOT_DIR, key).s3()?;
                }
            }
        } else if let Some(name) = &f.vname {
            os.unlink(VERSIONS_DIR, name).s3()?;
        }
        post_discard(os, f.obj, f.attrs.kind)?;
        os.commit().s3()?;
        Ok(f.rec.delete_marker)
    }

    /// Rewrites one version's record in place (tags).
    pub fn update_record(
        &self,
        b: &Bucket,
        key: &str,
        vid: Option<&str>,
        f: impl FnOnce(&mut ObjectRecord) -> R<()>,
    ) -> R<ObjectRecord> {
        self.writable(b)?;
        let _g = self.lock(b, key);
        let mut found = find_version(&b.os, key, vid)?;
        if found.rec.delete_marker {
            return Err(s3_error!(
                MethodNotAllowed,
                "The specified method is not allowed against a delete marker"
            ));
        }
        f(&mut found.rec)?;
        b.os.set_payload(found.obj, &found.rec.encode()).s3()?;
        b.os.commit().s3()?;
        Ok(found.rec)
    }

    /// ListObjects: keys after `after` (exclusive) under `prefix`, rolled
    /// up at `delim`, at most `max` entries (keys + prefixes).
    pub fn list(
        &self,
        b: &Bucket,
        prefix: &str,
        delim: Option<&str>,
        after: Option<String>,
        max: usize,
    ) -> R<Listing> {
        let os = &b.os;
        let mut out = Listing::default();
        let mut after = after;
        if max == 0 {
            return Ok(out);
        }
        'pages: loop {
            let batch = os
                .list(ROOT_DIR, prefix, after.as_deref(), 1000.min(max + 1))
                .s3()?;
            if batch.is_empty() {
                return Ok(out);
            }
            for (name, obj) in batch {
                if out.keys.len() + out.prefixes.len() >= max {
                    out.truncated = true;
                    return Ok(out);
                }
                if let Some(cp) = rollup(&name, prefix, delim) {
                    let cp = cp.to_string();
                    after = Some(format!("{cp}{MAX_CHAR}"));
                    out.next = after.clone();
                    out.prefixes.push(cp);
                    continue 'pages;
                }
                after = Some(name.clone());
                if let Some((_, rec)) = load(os, obj)? {
                    if rec.delete_marker {
                        continue;
                    }
                    out.next = Some(name.clone());
                    out.keys.push((name, rec));
                }
            }
        }
    }

    /// ListObjectVersions: every version of every key under `prefix`, keys
    /// in order, newest version first; resumes after (`key_marker`,
    /// `vid_marker`).
    pub fn list_versions(
        &self,
        b: &Bucket,
        prefix: &str,
        delim: Option<&str>,
        key_marker: Option<&str>,
        vid_marker: Option<&str>,
        max: usize,
    ) -> R<VersionListing> {
        let os = &b.os;
        let mut out = VersionListing::default();
        if max == 0 {
            return Ok(out);
        }
        // Resume inside key_marker's versions, or after it.
        let mut pending: Option<(String, Option<String>)> = None;
        let mut after_key: Option<String> = key_marker.map(str::to_string);
        if let (Some(k), Some(v)) = (key_marker, vid_marker) {
            let f = find_version(os, k, Some(v));
            if let Ok(f) = f {
                let from = if f.latest { None } else { f.vname.clone() };
                pending = Some((k.to_string(), from.or(Some(String::new()))));
            }
        }
        let mut count = 0usize;
        loop {
            let (key, resume) = match pending.take() {
                Some(p) => p,
                None => {
                    // The next key after `after_key` in ROOT_DIR or VERSIONS_DIR.
                    let r = os.list(ROOT_DIR, prefix, after_key.as_deref(), 1).s3()?;
                    let vafter = after_key.as_ref().map(|k| format!("{k}{SEP}g"));
                    let v = os.list(VERSIONS_DIR, prefix, vafter.as_deref(), 1).s3()?;
                    let rk = r.first().map(|(n, _)| n.clone());
                    let vk = v
                        .first()
                        .and_then(|(n, _)| parse_version_name(n).map(|(k, _)| k.to_string()));
                    let next = match (rk, vk) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    let Some(k) = next else { return Ok(out) };
                    if let Some(cp) = rollup(&k, prefix, delim) {
                        if count >= max {
                            out.truncated = true;
                            return Ok(out);
                        }
                        let cp = cp.to_string();
                        after_key = Some(format!("{cp}{MAX_CHAR}"));
                        out.next_key = after_key.clone();
                        out.next_version = None;
                        out.prefixes.push(cp);
                        count += 1;
                        continue;
                    }
                    (k, None)
                }
            };
            // resume: None = start with the current version; Some("") =
            // noncurrent from the start; Some(name) = noncurrent after name.
            let cur = current(os, &key)?;
            if resume.is_none() {
                if let Some(c) = &cur {
                    if count >= max {
                        out.truncated = true;
                        return Ok(out);
                    }
                    out.next_key = Some(key.clone());
                    out.next_version = Some(c.rec.version_str());
                    out.versions.push((key.clone(), c.rec.clone(), true));
                    count += 1;
                }
            }
            let vprefix = format!("{key}{SEP}");
            let mut vafter = resume.filter(|s| !s.is_empty());
            loop {
                let batch = os
                    .list(VERSIONS_DIR, &vprefix, vafter.as_deref(), 1000)
                    .s3()?;
                let Some(last) = batch.last() else { break };
                vafter = Some(last.0.clone());
                for (_, obj) in batch {
                    if cur.as_ref().is_some_and(|c| c.obj == obj) {
                        continue;
                    }
                    let Some((_, rec)) = load(os, obj)? else {
                        continue;
                    };
                    if count >= max {
                        out.truncated = true;
                        return Ok(out);
                    }
                    out.next_key = Some(key.clone());
                    out.next_version = Some(rec.version_str());
                    out.versions.push((key.clone(), rec, false));
                    count += 1;
                }
            }
            after_key = Some(key);
        }
    }

    // ---- multipart uploads ----

    pub fn create_upload(&self, b: &Bucket, key: &str, mut rec: ObjectRecord) -> R<String> {
        self.writable(b)?;
        let os = &b.os;
        rec.v = RECORD_VERSION;
        rec.key = key.to_string();
        rec.seq = self.next_seq();
        rec.mtime_ns = now_ns();
        rec.upload = true;
        let id = version_id(rec.seq);
        let dir = os.create(ObjectKind::Dir, &rec.encode()).s3()?;
        os.link(UPLOADS_DIR, &upload_name(key, &id), dir).s3()?;
        os.commit().s3()?;
        Ok(id)
    }

    pub fn upload(&self, b: &Bucket, key: &str, id: &str) -> R<Upload> {
        let none = || {
            s3_error!(NoSuchUpload, "The specified upload does not exist. The upload ID may be invalid, or the upload may have been aborted or completed.")
        };
        if parse_version_id(id).is_none() {
            return Err(none());
        }
        let name = upload_name(key, id);
        let dir = b.os.lookup(UPLOADS_DIR, &name).s3()?.ok_or_else(none)?;
        let (attrs, rec) = load(&b.os, dir)?.ok_or_else(none)?;
        Ok(Upload {
            dir,
            name,
            attrs,
            rec,
        })
    }

    /// Names a written part in its upload, replacing a part of the same number.
    pub fn add_part(
        &self,
        b: &Bucket,
        key: &str,
        id: &str,
        number: i32,
        part: u64,
        rec: &ObjectRecord,
    ) -> R<()> {
        let os = &b.os;
        os.set_payload(part, &rec.encode()).s3()?;
        let _g = self.lock(b, key);
        let up = match self.upload(b, key, id) {
            Ok(u) => u,
            Err(e) => {
                os.remove(part).s3()?;
                return Err(e);
            }
        };
        if let Some(old) = os.link(up.dir, &part_name(number), part).s3()? {
            post_discard(os, old, ObjectKind::File)?;
        }
        os.commit().s3()
    }

    /// Parts of an upload in order: (number, part object, its record).
    pub fn parts(
        &self,
        os: &ObjectSet,
        dir: u64,
        after: Option<i32>,
        limit: usize,
    ) -> R<Vec<(i32, u64, ObjectRecord)>> {
        let after = after.map(part_name);
        let mut out = Vec::new();
        for (name, obj) in os.list(dir, "", after.as_deref(), limit).s3()? {
            let Ok(n) = name.parse::<i32>() else { continue };
            if let Some((a, mut rec)) = load(os, obj)? {
                rec.size = a.size;
                out.push((n, obj, rec));
            }
        }
        Ok(out)
    }

    /// CompleteMultipartUpload: checks the list, drops parts it does not
    /// name, and makes the upload's Dir the object (no data copied).
    pub fn complete(
        &self,
        b: &Bucket,
        key: &str,
        id: &str,
        list: &[CompletePart],
        cond: &WriteCond,
        claimed: &Checksums,
    ) -> R<ObjectRecord> {
        self.writable(b)?;
        let os = &b.os;
        // One writer of the key: parts cannot change under the check.
        let _g = self.lock(b, key);
        let up = match self.upload(b, key, id) {
            Ok(u) => u,
            Err(e) => {
                // Completing again answers as the first time (as S3 does).
                if let Some(c) = current(os, key)? {
                    if c.rec.upload_id.as_deref() == Some(id) {
                        return Ok(c.rec);
                    }
                }
                return Err(e);
            }
        };
        if list.is_empty() {
            return Err(s3_error!(
                MalformedXML,
                "You must specify at least one part"
            ));
        }
        for w in list.windows(2) {
            if w[1].number <= w[0].number {
                return Err(s3_error!(InvalidPartOrder, "The list of parts was not in ascending order. The parts list must be specified in order by part number."));
            }
        }
        let have: HashMap<i32, (u64, ObjectRecord)> = self
            .parts(os, up.dir, None, usize::MAX)?
            .into_iter()
            .map(|(n, o, r)| (n, (o, r)))
            .collect();
        let mut md5s = Vec::with_capacity(list.len() * 16);
        let mut size = 0u64;
        let mut sums: Vec<&Checksums> = Vec::new();
        for (i, p) in list.iter().enumerate() {
            let Some((_, rec)) = have.get(&p.number) else {
                return Err(s3_error!(
                    InvalidPart,
                    "One or more of the specified parts could not be found (part {}).",
                    p.number
                ));
            };
            if p.etag.trim_matches('"') != rec.etag {
                return Err(s3_error!(InvalidPart, "One or more of the specified parts could not be found (part {}: ETag mismatch).", p.number));
            }
            if i + 1 < list.len() && rec.size < MIN_PART {
                return Err(s3_error!(EntityTooSmall, "Your proposed upload is smaller than the minimum allowed object size (part {}).", p.number));
            }
            md5s.extend(hex_decode(&rec.etag));
            size += rec.size;
            sums.push(&rec.checksums);
        }
        let etag = format!(
            "{}-{}",
            hex(&<s3s::crypto::Md5 as s3s::crypto::Checksum>::checksum(
                &md5s
            )),
            list.len()
        );
        let checksums = composite_checksums(up.rec.checksum_algorithm.as_deref(), &sums);
        for (name, want, got) in [
            ("CRC32", &claimed.crc32, &checksums.crc32),
            ("CRC32C", &claimed.crc32c, &checksums.crc32c),
            ("SHA1", &claimed.sha1, &checksums.sha1),
            ("SHA256", &claimed.sha256, &checksums.sha256),
        ] {
            let Some(want) = want else { continue };
            let got = got.as_deref().unwrap_or_default();
            if want != got && got.split_once('-').map(|(g, _)| g) != Some(want.as_str()) {
                return Err(s3_error!(
                    BadDigest,
                    "The {name} you specified did not match the calculated checksum."
                ));
            }
        }
        // Parts the list does not name go before the object is visible.
        let keep: std::collections::HashSet<i32> = list.iter().map(|p| p.number).collect();
        for (n, (obj, _)) in &have {
            if !keep.contains(n) {
                os.unlink(up.dir, &part_name(*n)).s3()?;
                post_discard(os, *obj, ObjectKind::File)?;
            }
        }
        let rec = ObjectRecord {
            etag,
            size,
            parts: list.len() as u32,
            checksums,
            upload_id: Some(id.to_string()),
            ..up.rec.clone()
        };
        self.install_locked(b, key, up.dir, rec, cond, Some(&up.name))
    }

    pub fn abort(&self, b: &Bucket, key: &str, id: &str) -> R<()> {
        self.writable(b)?;
        let os = &b.os;
        let _g = self.lock(b, key);
        let up = self.upload(b, key, id)?;
        os.link(TRASH_DIR, &trash_name(up.dir), up.dir).s3()?;
        os.unlink(UPLOADS_DIR, &up.name).s3()?;
        reap(os, up.dir)?;
        os.commit().s3()
    }

    /// Uploads under `prefix` after (`key_marker`, `id_marker`).
    pub fn list_uploads(
        &self,
        b: &Bucket,
        prefix: &str,
        delim: Option<&str>,
        key_marker: Option<&str>,
        id_marker: Option<&str>,
        max: usize,
    ) -> R<(Vec<Upload>, Vec<String>, bool)> {
        let os = &b.os;
        let mut after = match (key_marker, id_marker) {
            (Some(k), Some(i)) => Some(upload_name(k, i)),
            (Some(k), None) => Some(format!("{k}{SEP}g")),
            _ => None,
        };
        let (mut ups, mut cps) = (Vec::new(), Vec::new());
        if max == 0 {
            return Ok((ups, cps, false));
        }
        'pages: loop {
            let batch = os.list(UPLOADS_DIR, prefix, after.as_deref(), 1000).s3()?;
            if batch.is_empty() {
                return Ok((ups, cps, false));
            }
            for (name, dir) in batch {
                if ups.len() + cps.len() >= max {
                    return Ok((ups, cps, true));
                }
                let Some((key, _)) = parse_upload_name(&name) else {
                    continue;
                };
                if let Some(cp) = rollup(key, prefix, delim) {
                    let cp = cp.to_string();
                    after = Some(format!("{cp}{MAX_CHAR}"));
                    cps.push(cp);
                    continue 'pages;
                }
                after = Some(name.clone());
                if let Some((attrs, rec)) = load(os, dir)? {
                    ups.push(Upload {
                        dir,
                        name,
                        attrs,
                        rec,
                    });
                }
            }
        }
    }

    /// Aborts uploads older than `multipart_expiry` or than a bucket's
    /// AbortIncompleteMultipartUpload rule. Returns how many went.
    pub fn expire_uploads(&self) -> R<usize> {
        let parent = &self.cfg.parent;
        let all = match self.engine.list_datasets(Some(parent)) {
            Err(dataset::Error::NotFound(_)) => return Ok(0),
            r => r.map_err(ds_err)?,
        };
        let mut n = 0;
        for d in all.iter().filter(|d| d.kind == DatasetKind::Bucket) {
            let Some(name) = d.name.strip_prefix(&format!("{parent}/")) else {
                continue;
            };
            if name.contains('/') {
                continue;
            }
            let Ok(b) = self.open(name) else { continue };
            if self.writable(&b).is_err() {
                continue;
            }
            let st = settings(&b.os)?;
            let now = now_ns();
            for (uname, dir) in b.os.list(UPLOADS_DIR, "", None, usize::MAX).s3()? {
                let Some((key, id)) = parse_upload_name(&uname) else {
                    continue;
                };
                let Some((attrs, _)) = load(&b.os, dir)? else {
                    continue;
                };
                let age_s = now.saturating_sub(attrs.crtime_ns) / 1_000_000_000;
                let mut limit = self.cfg.multipart_expiry;
                for r in st
                    .lifecycle
                    .iter()
                    .filter(|r| r.enabled && key.starts_with(&r.prefix))
                {
                    if let Some(d) = r.abort_incomplete_days {
                        limit = limit.min(u64::from(d) * 86400);
                    }
                }
                if limit > 0 && age_s >= limit {
                    let (key, id) = (key.to_string(), id.to_string());
                    match self.abort(&b, &key, &id) {
                        Ok(()) => n += 1,
                        Err(e) => {
                            tracing::warn!(bucket = name, key, error = %e, "cannot expire upload")
                        }
                    }
                }
            }
        }
        Ok(n)
    }

    /// Buckets under the parent: (S3 name, creation, dataset name).
    pub fn buckets(&self) -> R<Vec<(String, u64)>> {
        let parent = &self.cfg.parent;
        // No parent (its pool not imported or created yet): no buckets, as
        // an empty server answers.
        let all = match self.engine.list_datasets(Some(parent)) {
            Err(dataset::Error::NotFound(_)) => Vec::new(),
            r => r.map_err(ds_err)?,
        };
        let mut out = Vec::new();
        let creation = |d: &dataset::DatasetInfo| {
            d.property("creation")
                .and_then(|p| p.parsable.parse::<u64>().ok())
                .unwrap_or(0)
        };
        for d in &all {
            let Some(rest) = d.name.strip_prefix(&format!("{parent}/")) else {
                continue;
            };
            match d.kind {
                DatasetKind::Bucket
                    if !rest.contains('/') && s3s::path::check_bucket_name(rest) =>
                {
                    out.push((rest.to_string(), creation(d)));
                }
                DatasetKind::Snapshot if self.cfg.list_snapshots => {
                    let Some((base, snap)) = rest.split_once('@') else {
                        continue;
                    };
                    if base.contains('/') {
                        continue;
                    }
                    if let Some(n) = snapshot_bucket_name(base, snap) {
                        out.push((n, creation(d)));
                    }
                }
                _ => {}
            }
        }
        out.sort();
        Ok(out)
    }

    /// The pieces of a version to read for bytes `start..end`: (object, offset, len).
    pub fn plan(&self, os: &ObjectSet, f: &Found, start: u64, end: u64) -> R<Vec<(u64, u64, u64)>> {
        if f.attrs.kind != ObjectKind::Dir {
            return Ok(vec![(f.obj, start, end - start)]);
        }
        let mut out = Vec::new();
        let mut pos = 0u64;
        let mut after: Option<String> = None;
        'pages: loop {
            let batch = os.list(f.obj, "", after.as_deref(), 1000).s3()?;
            let Some(last) = batch.last() else { break };
            after = Some(last.0.clone());
            for (_, part) in batch {
                if pos >= end {
                    break 'pages;
                }
                let size = os.attrs(part).s3()?.map(|a| a.size).unwrap_or(0);
                let (s, e) = (start.max(pos), end.min(pos + size));
                if s < e {
                    out.push((part, s - pos, e - s));
                }
                pos += size;
            }
        }
        Ok(out)
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn hex_decode(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .filter_map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

/// S3's COMPOSITE checksum of a multipart object: the algorithm over the
/// concatenated binary part checksums, `-N` appended.
fn composite_checksums(alg: Option<&str>, parts: &[&Checksums]) -> Checksums {
    use base64::Engine as _;
    use s3s::crypto::{Checksum, Crc32, Crc32c, Sha1, Sha256};
    let b64 = &base64::engine::general_purpose::STANDARD;
    let mut out = Checksums::default();
    let Some(alg) = alg else { return out };
    let pick = |c: &Checksums| -> Option<String> {
        match alg {
            "CRC32" => c.crc32.clone(),
            "CRC32C" => c.crc32c.clone(),
            "SHA1" => c.sha1.clone(),
            "SHA256" => c.sha256.clone(),
            _ => None,
        }
    };
    let mut raw = Vec::new();
    for p in parts {
        let Some(v) = pick(p).and_then(|s| b64.decode(s).ok()) else {
            return out;
        };
        raw.extend(v);
    }
    let sum = match alg {
        "CRC32" => Crc32::checksum(&raw).to_vec(),
        "CRC32C" => Crc32c::checksum(&raw).to_vec(),
        "SHA1" => Sha1::checksum(&raw).to_vec(),
        "SHA256" => Sha256::checksum(&raw).to_vec(),
        _ => return out,
    };
    let v = Some(format!("{}-{}", b64.encode(sum), parts.len()));
    match alg {
        "CRC32" => out.crc32 = v,
        "CRC32C" => out.crc32c = v,
        "SHA1" => out.sha1 = v,
        _ => out.sha256 = v,
    }
    out.kind = Some("COMPOSITE".into());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_names_map_to_valid_bucket_names_or_none() {
        assert_eq!(
            snapshot_bucket_name("photos", "daily1").as_deref(),
            Some("photos--snap--daily1")
        );
        assert_eq!(
            snapshot_bucket_name("photos", "Auto_2026-11-23:10").as_deref(),
            Some("photos--snap--auto-2026-11-23-10")
        );
        // Must end with a letter or digit.
        assert_eq!(snapshot_bucket_name("photos", "x_"), None);
        assert_eq!(snapshot_bucket_name("photos", &"a".repeat(60)), None);
    }

    #[test]
    fn rollup_finds_common_prefixes() {
        assert_eq!(rollup("a/b/c", "a/", Some("/")), Some("a/b/"));
        assert_eq!(rollup("a/b", "a/", Some("/")), None);
        assert_eq!(rollup("a/b", "a/", None), None);
        assert_eq!(rollup("xyz", "", Some("")), None);
    }

    #[test]
    fn conditions_follow_rfc_precedence() {
        let etag = "abc";
        let any = ETagCondition::Any;
        let other = ETagCondition::ETag(s3s::dto::ETag::Strong("zzz".into()));
        let same = ETagCondition::ETag(s3s::dto::ETag::Strong("abc".into()));
        let t = 1_000_000_000_000u64; // 1000 s
        let base = ReadCond {
            if_match: None,
            if_none_match: None,
            if_modified_since: None,
            if_unmodified_since: None,
            not_modified_is_304: true,
        };
        assert!(check_read_cond(
            &ReadCond {
                if_match: Some(&same),
                ..base
            },
            etag,
            t
        )
        .is_ok());
        let e = check_read_cond(
            &ReadCond {
                if_match: Some(&other),
                ..base
            },
            etag,
            t,
        )
        .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::PreconditionFailed);
        let e = check_read_cond(
            &ReadCond {
                if_none_match: Some(&any),
                ..base
            },
            etag,
            t,
        )
        .unwrap_err();
        assert_eq!(*e.code(), S3ErrorCode::NotModified);
        // If-Match true beats a failing If-Unmodified-Since.
        let c = ReadCond {
            if_match: Some(&same),
            if_unmodified_since: Some(10),
            ..base
        };
        assert!(check_read_cond(&c, etag, t).is_ok());
        let c = ReadCond {
            if_unmodified_since: Some(10),
            ..base
        };
        assert!(check_read_cond(&c, etag, t).is_err());
        let c = ReadCond {
            if_modified_since: Some(1000),
            ..base
        };
        assert_eq!(
            *check_read_cond(&c, etag, t).unwrap_err().code(),
            S3ErrorCode::NotModified
        );
        let c = ReadCond {
            if_modified_since: Some(999),
            ..base
        };
        assert!(check_read_cond(&c, etag, t).is_ok());
    }

    #[test]
    fn composite_checksum_has_part_count() {
        let p = Checksums {
            crc32: Some("AAAAAA==".into()),
            ..Default::default()
        };
        let c = composite_checksums(Some("CRC32"), &[&p, &p]);
        assert!(c.crc32.unwrap().ends_with("-2"));
        assert!(composite_checksums(Some("SHA1"), &[&p]).sha1.is_none());
    }
}

//! The `s3s::S3` trait over [`Store`]: request parsing, access checks,
//! streaming bodies in and out in [`CHUNK`]s (never a whole object in
//! memory), and the S3 answers. Every object-layer call runs on the
//! blocking pool through [`Cistern::run`], at most `max_blocking` at once.

use crate::access::{Access, Users};
use crate::record::*;
use crate::store::Bucket as Bkt;
use crate::store::*;
use crate::S3Config;
use bytes::{Bytes, BytesMut};
use dataset::objects::ObjectKind;
use dataset::{Engine, ObjectSet};
use futures::StreamExt;
use s3s::checksum::ChecksumHasher;
use s3s::crypto::{Checksum as _, Md5};
use s3s::dto::*;
use s3s::dto::{Bucket, LifecycleRule};
use s3s::stream::{ByteStream, RemainingLength};
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, S3};
use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, UNIX_EPOCH};
use tokio::sync::Semaphore;

/// Largest single PUT / CopyObject source (S3's limit).
const MAX_PUT: u64 = 5 << 30;
/// Largest user metadata, bytes of names and values (S3's limit).
const MAX_META: usize = 2048;

/// The S3 implementation handed to s3s.
pub struct Cistern {
    store: Arc<Store>,
    sem: Arc<Semaphore>,
    /// Set by the builder; None only in unit tests.
    users: Option<Arc<Users>>,
}

fn creds<T>(req: &S3Request<T>) -> Option<String> {
    req.credentials.as_ref().map(|c| c.access_key.clone())
}

fn ts(ns: u64) -> Timestamp {
    Timestamp::from(UNIX_EPOCH + Duration::from_nanos(ns))
}

fn ts_secs(t: &Timestamp) -> i64 {
    time::OffsetDateTime::from(t.clone()).unix_timestamp()
}

fn etag(s: &str) -> ETag {
    ETag::Strong(s.to_string())
}

fn body_err(e: s3s::StdError) -> S3Error {
    match e.downcast::<S3Error>() {
        Ok(e) => *e,
        Err(e) => s3_error!(IncompleteBody, "request body: {e}"),
    }
}

/// Percent-encoding of `encoding-type=url` (everything but unreserved and `/`).
fn url_encode(s: &str) -> String {
    const SET: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~')
        .remove(b'/');
    percent_encoding::utf8_percent_encode(s, SET).to_string()
}

fn check_key(key: &str) -> S3Result<()> {
    if key.is_empty() {
        return Err(s3_error!(InvalidArgument, "empty object key"));
    }
    if key.contains(SEP) {
        return Err(s3_error!(
            InvalidArgument,
            "object keys may not contain NUL"
        ));
    }
    if key.len() > 1024 {
        return Err(s3_error!(KeyTooLongError, "Your key is too long"));
    }
    Ok(())
}

fn user_meta(m: Option<Metadata>) -> S3Result<BTreeMap<String, String>> {
    let m: BTreeMap<String, String> = m
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect();
    let size: usize = m.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_META {
        return Err(s3_error!(MetadataTooLarge, "Your metadata headers exceed the maximum allowed metadata size ({size} > {MAX_META} bytes)"));
    }
    Ok(m)
}

fn validate_tags(tags: &[(String, String)]) -> S3Result<()> {
    if tags.len() > 10 {
        return Err(s3_error!(
            InvalidTag,
            "Object tags cannot be greater than 10"
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for (k, v) in tags {
        if k.is_empty() || k.chars().count() > 128 {
            return Err(s3_error!(
                InvalidTag,
                "The TagKey you have provided is invalid"
            ));
        }
        if v.chars().count() > 256 {
            return Err(s3_error!(
                InvalidTag,
                "The TagValue you have provided is invalid"
            ));
        }
        if !seen.insert(k) {
            return Err(s3_error!(
                InvalidTag,
                "Cannot provide multiple Tags with the same key"
            ));
        }
    }
    Ok(())
}

/// `x-amz-tagging: k1=v1&k2=v2` (URL-encoded).
fn parse_tagging_header(s: &str) -> S3Result<Vec<(String, String)>> {
    let dec = |x: &str| {
        percent_encoding::percent_decode_str(&x.replace('+', " "))
            .decode_utf8()
            .map(|c| c.into_owned())
            .map_err(|_| s3_error!(InvalidTag, "tagging header is not valid UTF-8"))
    };
    let mut out = Vec::new();
    for pair in s.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.push((dec(k)?, dec(v)?));
    }
    validate_tags(&out)?;
    out.sort();
    Ok(out)
}

fn tagset(tags: &[(String, String)]) -> TagSet {
    tags.iter()
        .map(|(k, v)| Tag {
            key: Some(k.clone()),
            value: Some(v.clone()),
        })
        .collect()
}

fn from_tagset(t: TagSet) -> S3Result<Vec<(String, String)>> {
    let mut tags: Vec<(String, String)> = t
        .into_iter()
        .map(|t| (t.key.unwrap_or_default(), t.value.unwrap_or_default()))
        .collect();
    validate_tags(&tags)?;
    tags.sort();
    Ok(tags)
}

/// Which checksums a request asks for, and the values it claims.
#[derive(Default, Clone)]
struct Wanted {
    algs: Vec<&'static str>,
    claimed: Checksums,
}

impl Wanted {
    fn new(alg: Option<&ChecksumAlgorithm>, claimed: Checksums) -> S3Result<Self> {
        let mut w = Wanted {
            algs: Vec::new(),
            claimed,
        };
        if let Some(a) = alg {
            w.add(a.as_str())?;
        }
        let c = w.claimed.clone();
        for (name, v) in [
            ("CRC32", &c.crc32),
            ("CRC32C", &c.crc32c),
            ("SHA1", &c.sha1),
            ("SHA256", &c.sha256),
            ("CRC64NVME", &c.crc64nvme),
        ] {
            if v.is_some() {
                w.add(name)?;
            }
        }
        Ok(w)
    }

    fn add(&mut self, a: &str) -> S3Result<()> {
        let a: &'static str = match a.to_ascii_uppercase().as_str() {
            "CRC32" => "CRC32",
            "CRC32C" => "CRC32C",
            "SHA1" => "SHA1",
            "SHA256" => "SHA256",
            "CRC64NVME" => "CRC64NVME",
            other => {
                return Err(s3_error!(
                    InvalidRequest,
                    "checksum algorithm {other} is not supported"
                ))
            }
        };
        if !self.algs.contains(&a) {
            self.algs.push(a);
        }
        Ok(())
    }

    fn hasher(&self) -> ChecksumHasher {
        let mut h = ChecksumHasher::default();
        for a in &self.algs {
            match *a {
                "CRC32" => h.crc32 = Some(Default::default()),
                "CRC32C" => h.crc32c = Some(Default::default()),
                "SHA1" => h.sha1 = Some(Default::default()),
                "CRC64NVME" => h.crc64nvme = Some(Default::default()),
                _ => h.sha256 = Some(Default::default()),
            }
        }
        h
    }

    /// Values from trailing headers (aws-chunked uploads send them last).
    fn take_trailers(&mut self, t: Option<&s3s::TrailingHeaders>) {
        let Some(h) = t.and_then(|t| t.take()) else {
            return;
        };
        let get = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
        for (n, slot) in [
            ("x-amz-checksum-crc32", &mut self.claimed.crc32),
            ("x-amz-checksum-crc32c", &mut self.claimed.crc32c),
            ("x-amz-checksum-sha1", &mut self.claimed.sha1),
            ("x-amz-checksum-sha256", &mut self.claimed.sha256),
            ("x-amz-checksum-crc64nvme", &mut self.claimed.crc64nvme),
        ] {
            if let Some(v) = get(n) {
                *slot = Some(v);
            }
        }
    }

    /// BadDigest if a claimed value differs from what the body hashed to.
    fn verify(&self, got: &Checksums) -> S3Result<()> {
        let c = &self.claimed;
        for (name, claimed, got) in [
            ("CRC32", &c.crc32, &got.crc32),
            ("CRC32C", &c.crc32c, &got.crc32c),
            ("SHA1", &c.sha1, &got.sha1),
            ("SHA256", &c.sha256, &got.sha256),
            ("CRC64NVME", &c.crc64nvme, &got.crc64nvme),
        ] {
            if let Some(want) = claimed {
                if Some(want) != got.as_ref() {
                    return Err(s3_error!(
                        BadDigest,
                        "The {name} you specified did not match the calculated checksum."
                    ));
                }
            }
        }
        Ok(())
    }
}

fn to_checksums(c: s3s::dto::Checksum) -> Checksums {
    Checksums {
        crc32: c.checksum_crc32,
        crc32c: c.checksum_crc32c,
        sha1: c.checksum_sha1,
        sha256: c.checksum_sha256,
        crc64nvme: c.checksum_crc64nvme,
        kind: None,
    }
}

/// Hashes a body as it goes to disk.
struct Hashing {
    md5: Md5,
    sums: ChecksumHasher,
}

impl Hashing {
    fn update(&mut self, d: &[u8]) {
        self.md5.update(d);
        self.sums.update(d);
    }
}

/// An object written from a body: not yet named.
struct Written {
    obj: u64,
    size: u64,
    md5: [u8; 16],
    sums: Checksums,
}

/// A GET body: chunks read on the blocking pool, passed through a small
/// channel so at most a few chunks per request are in memory.
/// A version about to be read (`Cistern::prepare_read`).
struct Read {
    b: Arc<Bkt>,
    f: Found,
    st: BucketSettings,
    size: u64,
    /// Bytes [start, end) of it; `ranged`: a Range or partNumber asked for less.
    start: u64,
    end: u64,
    ranged: bool,
    /// A part's own checksums (partNumber reads).
    part_sums: Option<Checksums>,
}

/// The conditions of a GET or HEAD (two s3s input types, the same fields).
macro_rules! read_cond {
    ($i:expr) => {
        ReadCond {
            if_match: $i.if_match.as_ref(),
            if_none_match: $i.if_none_match.as_ref(),
            if_modified_since: $i.if_modified_since.as_ref().map(ts_secs),
            if_unmodified_since: $i.if_unmodified_since.as_ref().map(ts_secs),
            not_modified_is_304: true,
        }
    };
}

/// The object headers a GET and a HEAD answer alike: s3s gives them two
/// output types with the same fields, so one list fills both; `$extra` adds
/// the fields only one of them has.
macro_rules! read_output {
    ($ty:ident, $read:expr, $checksum_mode:expr, $part_number:expr, { $($extra:tt)* }) => {{
        let Read { f, st, size, start, end, ranged, part_sums, .. } = $read;
        let r = &f.rec;
        let sums = stored_sums(part_sums, ranged, $checksum_mode, r);
        $ty {
            content_length: Some((end - start) as i64),
            content_range: ranged.then(|| format!("bytes {start}-{}/{size}", end.max(1) - 1)),
            accept_ranges: Some("bytes".into()),
            e_tag: Some(etag(&r.etag)),
            last_modified: Some(ts(r.mtime_ns)),
            metadata: (!r.meta.is_empty()).then(|| r.meta.clone().into_iter().collect()),
            content_type: r.headers.content_type.clone(),
            content_encoding: r.headers.content_encoding.clone(),
            content_disposition: r.headers.content_disposition.clone(),
            content_language: r.headers.content_language.clone(),
            cache_control: r.headers.cache_control.clone(),
            expires: obj_headers(&r.headers)?,
            checksum_crc32: sums.crc32,
            checksum_crc32c: sums.crc32c,
            checksum_sha1: sums.sha1,
            checksum_sha256: sums.sha256,
            checksum_crc64nvme: sums.crc64nvme,
            checksum_type: sums.kind.map(ChecksumType::from),
            version_id: Cistern::version_out(st.versioning.is_some(), r),
            parts_count: ($part_number.is_some() && r.parts > 0).then_some(r.parts as i32),
            $($extra)*
            ..Default::default()
        }
    }};
}

/// The checksums a GET or HEAD answers with: a part's own, or the whole
/// object's when asked for (ChecksumMode) and the whole object is read.
fn stored_sums(
    part: Option<Checksums>,
    ranged: bool,
    asked: bool,
    rec: &ObjectRecord,
) -> Checksums {
    match part {
        Some(p) => p,
        None if !ranged && asked => rec.checksums.clone(),
        None => Checksums::default(),
    }
}

struct ChanStream {
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, S3Error>>,
    left: usize,
}

impl futures::Stream for ChanStream {
    type Item = Result<Bytes, s3s::StdError>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(Ok(b))) => {
                self.left = self.left.saturating_sub(b.len());
                Poll::Ready(Some(Ok(b)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ByteStream for ChanStream {
    fn remaining_length(&self) -> RemainingLength {
        RemainingLength::new_exact(self.left)
    }
}

fn obj_headers(h: &ContentHeaders) -> S3Result<Option<Timestamp>> {
    Ok(h.expires
        .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok())
        .map(Timestamp::from))
}

struct PutHeaders {
    headers: ContentHeaders,
}

fn content_headers(
    content_type: Option<String>,
    content_encoding: Option<String>,
    content_disposition: Option<String>,
    content_language: Option<String>,
    cache_control: Option<String>,
    expires: Option<Timestamp>,
) -> PutHeaders {
    PutHeaders {
        headers: ContentHeaders {
            content_type,
            content_encoding,
            content_disposition,
            content_language,
            cache_control,
            expires: expires.as_ref().map(ts_secs),
        },
    }
}

fn delete_marker_error(vid: Option<&str>, rec: &ObjectRecord) -> S3Error {
    let mut e = if vid.is_some() {
        s3_error!(
            MethodNotAllowed,
            "The specified method is not allowed against this resource."
        )
    } else {
        s3_error!(NoSuchKey, "The specified key does not exist.")
    };
    let mut h = http::HeaderMap::new();
    h.insert(
        "x-amz-delete-marker",
        http::HeaderValue::from_static("true"),
    );
    if let Ok(v) = http::HeaderValue::from_str(&rec.version_str()) {
        h.insert("x-amz-version-id", v);
    }
    e.set_headers(h);
    e
}

/// `bytes=a-b` of UploadPartCopy.
fn parse_copy_range(r: &str, size: u64) -> S3Result<(u64, u64)> {
    let bad = || {
        s3_error!(InvalidArgument, "The x-amz-copy-source-range value must be of the form bytes=first-last where first and last are the zero-based offsets of the first and last bytes to copy")
    };
    let (a, b) = r
        .strip_prefix("bytes=")
        .and_then(|s| s.split_once('-'))
        .ok_or_else(bad)?;
    let a: u64 = a.parse().map_err(|_| bad())?;
    let b: u64 = b.parse().map_err(|_| bad())?;
    if a > b {
        return Err(bad());
    }
    if b >= size {
        return Err(s3_error!(
            InvalidRange,
            "The requested range is not satisfiable"
        ));
    }
    Ok((a, b + 1))
}

impl Cistern {
    pub fn new(engine: Arc<Engine>, cfg: S3Config) -> Self {
        let permits = cfg.max_blocking.max(1);
        Self {
            store: Arc::new(Store::new(engine, cfg)),
            sem: Arc::new(Semaphore::new(permits)),
            users: None,
        }
    }

    pub(crate) fn with_users(mut self, users: Arc<Users>) -> Self {
        self.users = Some(users);
        self
    }

    /// Aborts expired uploads now and then.
    pub(crate) fn spawn_sweeper(&self) -> tokio::task::JoinHandle<()> {
        let store = self.store.clone();
        let sem = self.sem.clone();
        let every = Duration::from_secs(store.cfg.sweep_interval_secs.max(1));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Ok(_p) = sem.acquire().await else { return };
                let s = store.clone();
                match tokio::task::spawn_blocking(move || s.expire_uploads()).await {
                    Ok(Ok(n)) if n > 0 => {
                        tracing::info!(uploads = n, "expired incomplete multipart uploads")
                    }
                    Ok(Err(e)) => tracing::warn!(error = %e, "multipart expiry sweep failed"),
                    _ => {}
                }
            }
        })
    }

    /// Runs blocking object-layer work, bounded.
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Store) -> S3Result<T> + Send + 'static,
    ) -> S3Result<T> {
        let _p = self
            .sem
            .acquire()
            .await
            .map_err(|_| s3_error!(ServiceUnavailable, "shutting down"))?;
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|e| s3_error!(InternalError, "task failed: {e}"))?
    }

    /// Changes an opened (writable) bucket's settings durably.
    async fn edit_settings(
        &self,
        b: Arc<Bkt>,
        f: impl FnOnce(&mut BucketSettings) + Send + 'static,
    ) -> S3Result<()> {
        self.run(move |s| {
            s.put_settings(&b, |st| {
                f(st);
                Ok(())
            })
        })
        .await
    }

    fn check(&self, cred: Option<&str>, bucket: &str, want: Access) -> S3Result<()> {
        match &self.users {
            Some(u) => u.check(cred, bucket, want),
            None => Ok(()),
        }
    }

    /// Checks the grant and opens the bucket (writable, for writes).
    async fn bucket(&self, name: &str, cred: Option<&str>, want: Access) -> S3Result<Arc<Bkt>> {
        self.check(cred, name, want)?;
        let n = name.to_string();
        let r = self
            .run(move |s| {
                let b = s.open(&n)?;
                if want == Access::Write {
                    s.writable(&b)?;
                }
                Ok(Arc::new(b))
            })
            .await;
        if let Err(e) = &r {
            if *e.code() == S3ErrorCode::NoSuchBucket {
                self.store.forget(name);
            }
        }
        r
    }

    /// Streams a request body into a new object (nlink 0 until installed).
    async fn write_body(
        &self,
        b: &Arc<Bkt>,
        body: Option<StreamingBlob>,
        want: &Wanted,
    ) -> S3Result<Written> {
        let os = b.os.clone();
        let obj = self
            .run(move |_| os.create(ObjectKind::File, &[]).map_err(ds_err))
            .await?;
        let r = self.fill(b, obj, body, want).await;
        if r.is_err() {
            let os = b.os.clone();
            let _ = self.run(move |_| os.remove(obj).map_err(ds_err)).await;
        }
        r
    }

    async fn fill(
        &self,
        b: &Arc<Bkt>,
        obj: u64,
        body: Option<StreamingBlob>,
        want: &Wanted,
    ) -> S3Result<Written> {
        let mut h = Some(Hashing {
            md5: Md5::new(),
            sums: want.hasher(),
        });
        let mut buf = BytesMut::with_capacity(CHUNK);
        let mut off = 0u64;
        let mut body = body;
        loop {
            let next = match body.as_mut() {
                Some(s) => s.next().await,
                None => None,
            };
            let end = next.is_none();
            if let Some(chunk) = next {
                let chunk = chunk.map_err(body_err)?;
                buf.extend_from_slice(&chunk);
                if off + buf.len() as u64 > MAX_PUT {
                    return Err(s3_error!(
                        EntityTooLarge,
                        "Your proposed upload exceeds the maximum allowed object size."
                    ));
                }
            }
            if buf.len() >= CHUNK || (end && !buf.is_empty()) {
                let data = buf.split().freeze();
                let len = data.len() as u64;
                let os = b.os.clone();
                let mut st = h
                    .take()
                    .ok_or_else(|| s3_error!(InternalError, "hash state lost"))?;
                let at = off;
                h = Some(
                    self.run(move |_| {
                        st.update(&data);
                        os.write(obj, at, &data).map_err(ds_err)?;
                        Ok(st)
                    })
                    .await?,
                );
                off += len;
            }
            if end {
                break;
            }
        }
        let st = h.ok_or_else(|| s3_error!(InternalError, "hash state lost"))?;
        Ok(Written {
            obj,
            size: off,
            md5: st.md5.finalize(),
            sums: to_checksums(st.sums.finalize()),
        })
    }

    /// Streams `plan` out of the object layer.
    fn stream(&self, os: Arc<ObjectSet>, plan: Vec<(u64, u64, u64)>) -> StreamingBlob {
        let total: u64 = plan.iter().map(|p| p.2).sum();
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let sem = self.sem.clone();
        tokio::spawn(async move {
            for (obj, mut off, mut len) in plan {
                while len > 0 {
                    let n = len.min(CHUNK as u64);
                    let Ok(permit) = sem.acquire().await else {
                        return;
                    };
                    let os2 = os.clone();
                    let r = tokio::task::spawn_blocking(move || os2.read(obj, off, n)).await;
                    drop(permit);
                    let item = match r {
                        Ok(Ok(d)) if d.len() as u64 == n => Ok(Bytes::from(d)),
                        Ok(Ok(d)) => Err(s3_error!(
                            InternalError,
                            "object {obj} is short: {} of {n} bytes at {off}",
                            d.len()
                        )),
                        Ok(Err(e)) => Err(ds_err(e)),
                        Err(e) => Err(s3_error!(InternalError, "read task failed: {e}")),
                    };
                    let failed = item.is_err();
                    if let Err(e) = &item {
                        tracing::warn!(object = obj, error = %e, "S3 GET failed mid-body");
                    }
                    if tx.send(item).await.is_err() || failed {
                        return;
                    }
                    off += n;
                    len -= n;
                }
            }
        });
        StreamingBlob::new(ChanStream {
            rx,
            left: total as usize,
        })
    }

    /// Copies bytes `start..end` of a version into a new object, hashing.
    async fn copy_data(
        &self,
        src: &Arc<Bkt>,
        f: &Found,
        start: u64,
        end: u64,
        dst: &Arc<Bkt>,
        want: &Wanted,
    ) -> S3Result<Written> {
        let (src_os, dst_os, f) = (src.os.clone(), dst.os.clone(), f.clone());
        let mut st = Hashing {
            md5: Md5::new(),
            sums: want.hasher(),
        };
        self.run(move |s| {
            let plan = s.plan(&src_os, &f, start, end)?;
            let obj = dst_os.create(ObjectKind::File, &[]).map_err(ds_err)?;
            let res = (|| {
                let mut at = 0u64;
                for (o, mut off, mut len) in plan {
                    while len > 0 {
                        let n = len.min(CHUNK as u64);
                        let d = src_os.read(o, off, n).map_err(ds_err)?;
                        if d.len() as u64 != n {
                            return Err(s3_error!(
                                InternalError,
                                "copy source object {o} is short"
                            ));
                        }
                        st.update(&d);
                        dst_os.write(obj, at, &d).map_err(ds_err)?;
                        at += n;
                        off += n;
                        len -= n;
                    }
                }
                Ok(at)
            })();
            match res {
                Ok(size) => Ok(Written {
                    obj,
                    size,
                    md5: st.md5.finalize(),
                    sums: to_checksums(st.sums.finalize()),
                }),
                Err(e) => {
                    let _ = dst_os.remove(obj);
                    Err(e)
                }
            }
        })
        .await
    }

    /// Source of a copy: its bucket (read grant) and version, conditions checked.
    async fn copy_source(
        &self,
        cs: &CopySource,
        cred: Option<&str>,
        cond: ReadCond<'_>,
    ) -> S3Result<(Arc<Bkt>, Found)> {
        let CopySource::Bucket {
            bucket,
            key,
            version_id,
        } = cs
        else {
            return Err(s3_error!(
                NotImplemented,
                "access point copy sources are not supported"
            ));
        };
        let sb = self.bucket(bucket, cred, Access::Read).await?;
        let (os, key, vid) = (
            sb.os.clone(),
            key.to_string(),
            version_id.as_deref().map(str::to_string),
        );
        let f = self
            .run(move |_| find_version(&os, &key, vid.as_deref()))
            .await?;
        if f.rec.delete_marker {
            return Err(delete_marker_error(version_id.as_deref(), &f.rec));
        }
        check_read_cond(&cond, &f.rec.etag, f.rec.mtime_ns)?;
        Ok((sb, f))
    }

    fn version_out(st_versioned: bool, rec: &ObjectRecord) -> Option<String> {
        st_versioned.then(|| rec.version_str())
    }

    async fn versioned(&self, b: &Arc<Bkt>) -> S3Result<bool> {
        let os = b.os.clone();
        Ok(self.run(move |_| settings(&os)).await?.versioning.is_some())
    }

    fn object_entry(key: String, rec: &ObjectRecord, enc: bool, owner: bool) -> Object {
        Object {
            key: Some(if enc { url_encode(&key) } else { key }),
            e_tag: Some(etag(&rec.etag)),
            size: Some(rec.size as i64),
            last_modified: Some(ts(rec.mtime_ns)),
            storage_class: Some(ObjectStorageClass::from_static(
                ObjectStorageClass::STANDARD,
            )),
            owner: owner.then(owner_of),
            ..Default::default()
        }
    }
}

fn owner_of() -> Owner {
    Owner {
        display_name: Some("cistern".into()),
        id: Some("cistern".into()),
    }
}

/// ACLs are not stored: access is `cistern user grant` (access.rs). The
/// owner has full control; setting anything but that is refused, never
/// silently ignored.
fn owner_grants() -> Grants {
    vec![Grant {
        grantee: Some(Grantee {
            display_name: Some("cistern".into()),
            id: Some("cistern".into()),
            type_: Type::from_static(Type::CANONICAL_USER),
            email_address: None,
            uri: None,
        }),
        permission: Some(Permission::from_static(Permission::FULL_CONTROL)),
    }]
}

fn only_private(
    canned: Option<&str>,
    policy: Option<&AccessControlPolicy>,
    grants: [&Option<String>; 3],
) -> S3Result<()> {
    let refuse = || {
        s3_error!(
            NotImplemented,
            "ACLs other than private are not supported: grant access with `cistern user grant`"
        )
    };
    if canned.is_some_and(|c| c != "private") || grants.iter().any(|g| g.is_some()) {
        return Err(refuse());
    }
    if let Some(p) = policy {
        let only_owner = p.grants.iter().flatten().all(|g| {
            g.permission
                .as_ref()
                .is_some_and(|p| p.as_str() == Permission::FULL_CONTROL)
                && g.grantee.as_ref().is_some_and(|g| g.uri.is_none())
        });
        if !only_owner {
            return Err(refuse());
        }
    }
    Ok(())
}

fn max_keys(m: Option<i32>) -> S3Result<usize> {
    match m {
        None => Ok(1000),
        Some(n) if n < 0 => Err(s3_error!(InvalidArgument, "max-keys must be non-negative")),
        Some(n) => Ok((n as usize).min(1000)),
    }
}

fn is_url(e: &Option<EncodingType>) -> S3Result<bool> {
    match e.as_ref().map(|e| e.as_str()) {
        None => Ok(false),
        Some("url") => Ok(true),
        Some(o) => Err(s3_error!(
            InvalidArgument,
            "Invalid Encoding Method specified in Request: {o}"
        )),
    }
}

fn enc_opt(s: Option<String>, enc: bool) -> Option<String> {
    s.map(|s| if enc { url_encode(&s) } else { s })
}

fn token_encode(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
}

/// A listing's rolled-up prefixes as the three list calls answer them
/// (absent when there are none, URL-encoded when asked).
fn common_prefixes(prefixes: Vec<String>, enc: bool) -> Option<Vec<CommonPrefix>> {
    (!prefixes.is_empty()).then(|| {
        prefixes
            .into_iter()
            .map(|p| CommonPrefix {
                prefix: enc_opt(Some(p), enc),
            })
            .collect()
    })
}

fn token_decode(s: &str) -> S3Result<String> {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| {
            s3_error!(
                InvalidArgument,
                "The continuation token provided is incorrect"
            )
        })
}

/// Where a v1 marker / start-after resumes: past a whole common prefix if it is one.
fn resume_after(m: &str, prefix: &str, delim: Option<&str>) -> String {
    match delim {
        Some(d) if !d.is_empty() && m.starts_with(prefix) && m.ends_with(d) => {
            format!("{m}{}", char::MAX)
        }
        _ => m.to_string(),
    }
}

fn strip_max(s: &str) -> String {
    s.trim_end_matches(char::MAX).to_string()
}

#[async_trait::async_trait]
impl S3 for Cistern {
    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        // Anonymous callers are refused unless `[s3] anonymous` grants
        // something; then they see the buckets it grants.
        let cred = creds(&req);
        if cred.is_none() && !self.users.as_ref().is_some_and(|u| u.anonymous_allowed()) {
            return Err(s3_error!(AccessDenied, "anonymous access is refused"));
        }
        let all = self.run(|s| s.buckets()).await?;
        let prefix = req.input.prefix.clone().unwrap_or_default();
        let buckets = all
            .into_iter()
            .filter(|(n, _)| n.starts_with(&prefix))
            .filter(|(n, _)| {
                self.users
                    .as_ref()
                    .is_none_or(|u| u.visible(cred.as_deref(), n))
            })
            .map(|(n, c)| Bucket {
                name: Some(n),
                creation_date: Some(ts(c.saturating_mul(1_000_000_000))),
                bucket_region: None,
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            owner: Some(owner_of()),
            prefix: req.input.prefix,
            ..Default::default()
        }))
    }

    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let cred = creds(&req);
        let name = req.input.bucket;
        // A bad name is that before it is anyone's to create.
        crate::store::check_new_bucket_name(&name)?;
        self.check(cred.as_deref(), &name, Access::Write)?;
        let n = name.clone();
        self.run(move |s| s.create_bucket(&n)).await?;
        Ok(S3Response::new(CreateBucketOutput {
            location: Some(format!("/{name}")),
        }))
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let b = self
            .bucket(&req.input.bucket, creds(&req).as_deref(), Access::Write)
            .await?;
        self.run(move |s| s.delete_bucket(&b)).await?;
        Ok(S3Response::new(DeleteBucketOutput {}))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.bucket(&req.input.bucket, creds(&req).as_deref(), Access::Read)
            .await?;
        Ok(S3Response::new(HeadBucketOutput {
            bucket_region: Some(self.store.cfg.region.clone()),
            ..Default::default()
        }))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.bucket(&req.input.bucket, creds(&req).as_deref(), Access::Read)
            .await?;
        let r = &self.store.cfg.region;
        Ok(S3Response::new(GetBucketLocationOutput {
            location_constraint: (r != "us-east-1")
                .then(|| BucketLocationConstraint::from(r.clone())),
        }))
    }

    async fn get_bucket_versioning(
        &self,
        req: S3Request<GetBucketVersioningInput>,
    ) -> S3Result<S3Response<GetBucketVersioningOutput>> {
        let b = self
            .bucket(&req.input.bucket, creds(&req).as_deref(), Access::Read)
            .await?;
        let os = b.os.clone();
        let st = self.run(move |_| settings(&os)).await?;
        Ok(S3Response::new(GetBucketVersioningOutput {
            status: st.versioning.map(BucketVersioningStatus::from),
            mfa_delete: None,
        }))
    }

    async fn put_bucket_versioning(
        &self,
        req: S3Request<PutBucketVersioningInput>,
    ) -> S3Result<S3Response<PutBucketVersioningOutput>> {
        let b = self
            .bucket(&req.input.bucket, creds(&req).as_deref(), Access::Write)
            .await?;
        let status = match req
            .input
            .versioning_configuration
            .status
            .as_ref()
            .map(|s| s.as_str())
        {
            Some("Enabled") => "Enabled",
            Some("Suspended") => "Suspended",
            _ => {
                return Err(s3_error!(
                    MalformedXML,
                    "versioning status must be Enabled or Suspended"
                ))
            }
        };
        self.edit_settings(b, move |st| st.versioning = Some(status.to_string()))
            .await?;
        Ok(S3Response::new(PutBucketVersioningOutput {}))
    }

    async fn get_bucket_tagging(
        &self,
        req: S3Request<GetBucketTaggingInput>,
    ) -> S3Result<S3Response<GetBucketTaggingOutput>> {
        let b = self
            .bucket(&req.input.bucket, creds(&req).as_deref(), Access::Read)
            .await?;
        let os = b.os.clone();
        let st = self.run(move |_| settings(&os)).await?;
        if st.tags.is_empty() {
            return Err(s3_error!(NoSuchTagSet, "The TagSet does not exist"));
        }
        Ok(S3Response::new(GetBucketTaggingOutput {
            tag_set: tagset(&st.tags),
        }))
    }

    async fn put_bucket_tagging(
        &self,
        req: S3Request<PutBucketTaggingInput>,
    ) -> S3Result<S3Response<PutBucketTaggingOutput>> {
        let b = self
            .bucket(&req.input.bucket, creds(&req).as_deref(), Access::Write)
            .await?;
        let tags = from_tagset(req.input.tagging.tag_set)?;
        self.edit_settings(b, move |st| st.tags = tags).await?;
        Ok(S3Response::new(PutBucketTaggingOutput {}))
    }

    async fn delete_bucket_tagging(
        &self,
        req: S3Request<DeleteBucketTaggingInput>,
    ) -> S3Result<S3Response<DeleteBucketTaggingOutput>> {
        let b = self
            .bucket(&req.input.bucket, creds(&req).as_deref(), Access::Write)
            .await?;
        self.edit_settings(b, move |st| st.tags.clear()).await?;
        Ok(S3Response::new(DeleteBucketTaggingOutput {}))
    }

    async fn put_bucket_lifecycle_configuration(
        &self,
        req: S3Request<PutBucketLifecycleConfigurationInput>,
    ) -> S3Result<S3Response<PutBucketLifecycleConfigurationOutput>> {
        let b = self
            .bucket(&req.input.bucket, creds(&req).as_deref(), Access::Write)
            .await?;
        let rules: Vec<crate::record::LifecycleRule> = req
            .input
            .lifecycle_configuration
            .map(|c| c.rules)
            .unwrap_or_default()
            .into_iter()
            .map(|r| crate::record::LifecycleRule {
                id: r.id,
                prefix: r
                    .filter
                    .and_then(|f| f.prefix)
                    .or(r.prefix)
                    .unwrap_or_default(),
                enabled: r.status.as_str() == ExpirationStatus::ENABLED,
                abort_incomplete_days: r
                    .abort_incomplete_multipart_upload
                    .and_then(|a| a.days_after_initiation)
                    .map(|d| d.max(0) as u32),
                expiration_days: r.expiration.and_then(|e| e.days).map(|d| d.max(0) as u32),
            })
            .collect();
        self.edit_settings(b, move |st| st.lifecycle = rules)
            .await?;
        Ok(S3Response::new(
            PutBucketLifecycleConfigurationOutput::default(),
        ))
    }

    async fn get_bucket_lifecycle_configuration(
        &self,
        req: S3Request<GetBucketLifecycleConfigurationInput>,
    ) -> S3Result<S3Response<GetBucketLifecycleConfigurationOutput>> {
        let b = self
            .bucket(&req.input.bucket, creds(&req).as_deref(), Access::Read)
            .await?;
        let os = b.os.clone();
        let st = self.run(move |_| settings(&os)).await?;
        if st.lifecycle.is_empty() {
            return Err(s3_error!(
                NoSuchLifecycleConfiguration,
                "The lifecycle configuration does not exist"
            ));
        }
        let rules = st
            .lifecycle
            .into_iter()
            .map(|r| LifecycleRule {
                id: r.id,
                filter: Some(LifecycleRuleFilter {
                    prefix: Some(r.prefix),
                    ..Default::default()
                }),
                status: ExpirationStatus::from_static(if r.enabled {
                    ExpirationStatus::ENABLED
                } else {
                    ExpirationStatus::DISABLED
                }),
                abort_incomplete_multipart_upload: r.abort_incomplete_days.map(|d| {
                    AbortIncompleteMultipartUpload {
                        days_after_initiation: Some(d as i32),
                    }
                }),
                expiration: r.expiration_days.map(|d| LifecycleExpiration {
                    days: Some(d as i32),
                    ..Default::default()
                }),
                noncurrent_version_expiration: None,
                noncurrent_version_transitions: None,
                prefix: None,
                transitions: None,
            })
            .collect();
        Ok(S3Response::new(GetBucketLifecycleConfigurationOutput {
            rules: Some(rules),
            ..Default::default()
        }))
    }

    async fn delete_bucket_lifecycle(
        &self,
        req: S3Request<DeleteBucketLifecycleInput>,
    ) -> S3Result<S3Response<DeleteBucketLifecycleOutput>> {
        let b = self
            .bucket(&req.input.bucket, creds(&req).as_deref(), Access::Write)
            .await?;
        self.edit_settings(b, move |st| st.lifecycle.clear())
            .await?;
        Ok(S3Response::new(DeleteBucketLifecycleOutput {}))
    }

    async fn get_bucket_acl(
        &self,
        req: S3Request<GetBucketAclInput>,
    ) -> S3Result<S3Response<GetBucketAclOutput>> {
        let cred = creds(&req);
        self.bucket(&req.input.bucket, cred.as_deref(), Access::Read)
            .await?;
        Ok(S3Response::new(GetBucketAclOutput {
            grants: Some(owner_grants()),
            owner: Some(owner_of()),
        }))
    }

    async fn put_bucket_acl(
        &self,
        req: S3Request<PutBucketAclInput>,
    ) -> S3Result<S3Response<PutBucketAclOutput>> {
        let cred = creds(&req);
        let i = req.input;
        self.bucket(&i.bucket, cred.as_deref(), Access::Write)
            .await?;
        only_private(
            i.acl.as_ref().map(|a| a.as_str()),
            i.access_control_policy.as_ref(),
            [&i.grant_read, &i.grant_write, &i.grant_full_control],
        )?;
        Ok(S3Response::new(PutBucketAclOutput {}))
    }

    async fn get_object_acl(
        &self,
        req: S3Request<GetObjectAclInput>,
    ) -> S3Result<S3Response<GetObjectAclOutput>> {
        let cred = creds(&req);
        let i = req.input;
        let b = self
            .bucket(&i.bucket, cred.as_deref(), Access::Read)
            .await?;
        let (os, key, vid) = (b.os.clone(), i.key, i.version_id.clone());
        let f = self
            .run(move |_| find_version(&os, &key, vid.as_deref()))
            .await?;
        if f.rec.delete_marker {
            return Err(delete_marker_error(i.version_id.as_deref(), &f.rec));
        }
        Ok(S3Response::new(GetObjectAclOutput {
            grants: Some(owner_grants()),
            owner: Some(owner_of()),
            ..Default::default()
        }))
    }

    async fn put_object_acl(
        &self,
        req: S3Request<PutObjectAclInput>,
    ) -> S3Result<S3Response<PutObjectAclOutput>> {
        let cred = creds(&req);
        let i = req.input;
        let b = self
            .bucket(&i.bucket, cred.as_deref(), Access::Write)
            .await?;
        let (os, key, vid) = (b.os.clone(), i.key.clone(), i.version_id.clone());
        self.run(move |_| find_version(&os, &key, vid.as_deref()))
            .await?;
        only_private(
            i.acl.as_ref().map(|a| a.as_str()),
            i.access_control_policy.as_ref(),
            [&i.grant_read, &i.grant_write, &i.grant_full_control],
        )?;
        Ok(S3Response::new(PutObjectAclOutput::default()))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let cred = creds(&req);
        let trailers = req.trailing_headers.clone();
        let i = req.input;
        check_key(&i.key)?;
        let b = self
            .bucket(&i.bucket, cred.as_deref(), Access::Write)
            .await?;
        if i.content_length.is_some_and(|l| l as u64 > MAX_PUT) {
            return Err(s3_error!(
                EntityTooLarge,
                "Your proposed upload exceeds the maximum allowed object size."
            ));
        }
        let meta = user_meta(i.metadata)?;
        let tags = match &i.tagging {
            Some(t) => parse_tagging_header(t)?,
            None => Vec::new(),
        };
        let claimed = Checksums {
            crc32: i.checksum_crc32,
            crc32c: i.checksum_crc32c,
            sha1: i.checksum_sha1,
            sha256: i.checksum_sha256,
            crc64nvme: i.checksum_crc64nvme,
            kind: None,
        };
        let mut want = Wanted::new(i.checksum_algorithm.as_ref(), claimed)?;
        let h = content_headers(
            i.content_type,
            i.content_encoding,
            i.content_disposition,
            i.content_language,
            i.cache_control,
            i.expires,
        );
        let w = self.write_body(&b, i.body, &want).await?;
        want.take_trailers(trailers.as_ref());
        let verified = want
            .verify(&w.sums)
            .and_then(|()| check_content_md5(i.content_md5.as_deref(), &w.md5));
        if let Err(e) = verified {
            let os = b.os.clone();
            let obj = w.obj;
            let _ = self.run(move |_| os.remove(obj).map_err(ds_err)).await;
            return Err(e);
        }
        let rec = ObjectRecord {
            etag: hex(&w.md5),
            size: w.size,
            headers: h.headers,
            meta,
            checksums: w.sums.clone(),
            tags,
            ..Default::default()
        };
        let cond = WriteCond {
            if_match: i.if_match,
            if_none_match: i.if_none_match,
        };
        let (key, obj, b2) = (i.key, w.obj, b.clone());
        let r = self
            .run(move |s| s.install(&b2, &key, obj, rec, &cond, None))
            .await;
        let rec = match r {
            Ok(r) => r,
            Err(e) => {
                let os = b.os.clone();
                let _ = self.run(move |_| os.remove(obj).map_err(ds_err)).await;
                return Err(e);
            }
        };
        Ok(S3Response::new(PutObjectOutput {
            e_tag: Some(etag(&rec.etag)),
            version_id: rec.version_id.clone(),
            checksum_crc32: w.sums.crc32,
            checksum_crc32c: w.sums.crc32c,
            checksum_sha1: w.sums.sha1,
            checksum_sha256: w.sums.sha256,

            checksum_crc64nvme: w.sums.crc64nvme,
            ..Default::default()
        }))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let cred = creds(&req);
        let i = req.input;
        let read = self
            .prepare_read(
                cred.as_deref(),
                (&i.bucket, &i.key, i.version_id.as_deref()),
                &read_cond!(i),
                i.range,
                i.part_number,
            )
            .await?;
        let (os, f, start, end) = (read.b.os.clone(), read.f.clone(), read.start, read.end);
        let plan = self.run(move |s| s.plan(&os, &f, start, end)).await?;
        let body = self.stream(read.b.os.clone(), plan);
        let tag_count = (!read.f.rec.tags.is_empty()).then_some(read.f.rec.tags.len() as i32);
        Ok(S3Response::new(read_output!(
            GetObjectOutput,
            read,
            i.checksum_mode.is_some(),
            i.part_number,
            {
                body: Some(body),
                tag_count,
                storage_class: None,
            }
        )))
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let cred = creds(&req);
        let i = req.input;
        let read = self
            .prepare_read(
                cred.as_deref(),
                (&i.bucket, &i.key, i.version_id.as_deref()),
                &read_cond!(i),
                i.range,
                i.part_number,
            )
            .await?;
        // HeadObjectOutput has no tag count field: it travels as a header.
        let mut headers = http::HeaderMap::new();
        if !read.f.rec.tags.is_empty() {
            headers.insert(
                "x-amz-tagging-count",
                http::HeaderValue::from(read.f.rec.tags.len()),
            );
        }
        Ok(S3Response::with_headers(
            read_output!(
                HeadObjectOutput,
                read,
                i.checksum_mode.is_some(),
                i.part_number,
                {}
            ),
            headers,
        ))
    }

    async fn get_object_attributes(
        &self,
        req: S3Request<GetObjectAttributesInput>,
    ) -> S3Result<S3Response<GetObjectAttributesOutput>> {
        let cred = creds(&req);
        let i = req.input;
        let b = self
            .bucket(&i.bucket, cred.as_deref(), Access::Read)
            .await?;
        // The header may arrive as one comma-separated value.
        let want = |a: &str| {
            i.object_attributes
                .iter()
                .any(|x| x.as_str().split(',').any(|y| y.trim() == a))
        };
        let (os, key, vid) = (b.os.clone(), i.key.clone(), i.version_id.clone());
        let (f, st) = self
            .run(move |_| Ok((find_version(&os, &key, vid.as_deref())?, settings(&os)?)))
            .await?;
        if f.rec.delete_marker {
            return Err(delete_marker_error(i.version_id.as_deref(), &f.rec));
        }
        let r = &f.rec;
        let parts = if want(ObjectAttributes::OBJECT_PARTS) && f.attrs.kind == ObjectKind::Dir {
            let max = i.max_parts.map_or(1000, |m| m.clamp(0, 1000) as usize);
            let marker = i.part_number_marker.filter(|m| *m > 0);
            let (os, dir) = (b.os.clone(), f.obj);
            let mut ps = self
                .run(move |s| s.parts(&os, dir, marker, max + 1))
                .await?;
            let truncated = ps.len() > max;
            ps.truncate(max);
            Some(GetObjectAttributesParts {
                is_truncated: Some(truncated),
                max_parts: Some(max as i32),
                next_part_number_marker: ps.last().map(|p| p.0),
                part_number_marker: i.part_number_marker,
                total_parts_count: Some(r.parts as i32),
                parts: Some(
                    ps.into_iter()
                        .map(|(n, _, pr)| ObjectPart {
                            part_number: Some(n),
                            size: Some(pr.size as i64),
                            checksum_crc32: pr.checksums.crc32,
                            checksum_crc32c: pr.checksums.crc32c,
                            checksum_sha1: pr.checksums.sha1,
                            checksum_sha256: pr.checksums.sha256,
                            checksum_crc64nvme: pr.checksums.crc64nvme,
                        })
                        .collect(),
                ),
            })
        } else {
            None
        };
        let c = &r.checksums;
        let checksum =
            (want(ObjectAttributes::CHECKSUM) && !c.is_empty()).then(|| s3s::dto::Checksum {
                checksum_crc32: c.crc32.clone(),
                checksum_crc32c: c.crc32c.clone(),
                checksum_sha1: c.sha1.clone(),
                checksum_sha256: c.sha256.clone(),
                checksum_crc64nvme: c.crc64nvme.clone(),
                checksum_type: Some(ChecksumType::from(
                    c.kind.clone().unwrap_or_else(|| "FULL_OBJECT".into()),
                )),
            });
        Ok(S3Response::new(GetObjectAttributesOutput {
            checksum,
            e_tag: want(ObjectAttributes::ETAG).then(|| etag(&r.etag)),
            last_modified: Some(ts(r.mtime_ns)),
            object_parts: parts,
            object_size: want(ObjectAttributes::OBJECT_SIZE).then_some(r.size as i64),
            storage_class: want(ObjectAttributes::STORAGE_CLASS)
                .then(|| StorageClass::from_static(StorageClass::STANDARD)),
            version_id: Cistern::version_out(st.versioning.is_some(), r),
            ..Default::default()
        }))
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let cred = creds(&req);
        let i = req.input;
        let b = self
            .bucket(&i.bucket, cred.as_deref(), Access::Write)
            .await?;
        let (key, vid) = (i.key, i.version_id);
        let out = match vid {
            Some(v) => {
                let v2 = v.clone();
                let marker = self.run(move |s| s.delete_version(&b, &key, &v2)).await?;
                DeleteObjectOutput {
                    delete_marker: marker.then_some(true),
                    version_id: Some(v),
                    ..Default::default()
                }
            }
            None => {
                let (marker, v) = self.run(move |s| s.delete_current(&b, &key)).await?;
                DeleteObjectOutput {
                    delete_marker: marker.then_some(true),
                    version_id: v,
                    ..Default::default()
                }
            }
        };
        Ok(S3Response::new(out))
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let cred = creds(&req);
        let i = req.input;
        let b = self
            .bucket(&i.bucket, cred.as_deref(), Access::Write)
            .await?;
        if i.delete.objects.len() > 1000 {
            return Err(s3_error!(
                MalformedXML,
                "at most 1000 keys per DeleteObjects"
            ));
        }
        let quiet = i.delete.quiet.unwrap_or(false);
        let list = i.delete.objects;
        let res = self
            .run(move |s| {
                let mut out = Vec::new();
                for o in list {
                    let r = match &o.version_id {
                        Some(v) => s
                            .delete_version(&b, &o.key, v)
                            .map(|m| (m, Some(v.clone()))),
                        None => s.delete_current(&b, &o.key),
                    };
                    out.push((o, r));
                }
                Ok(out)
            })
            .await?;
        let (mut deleted, mut errors) = (Vec::new(), Vec::new());
        for (o, r) in res {
            match r {
                Ok((marker, v)) => {
                    if !quiet {
                        let by_version = o.version_id.is_some();
                        deleted.push(DeletedObject {
                            key: Some(o.key),
                            version_id: if by_version { v.clone() } else { None },
                            delete_marker: marker.then_some(true),
                            delete_marker_version_id: if marker && !by_version { v } else { None },
                        });
                    }
                }
                Err(e) => errors.push(Error {
                    code: Some(e.code().as_str().to_string()),
                    key: Some(o.key),
                    message: e.message().map(str::to_string),
                    version_id: o.version_id,
                }),
            }
        }
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: Some(deleted),
            errors: (!errors.is_empty()).then_some(errors),
            ..Default::default()
        }))
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let cred = creds(&req);
        let i = req.input;
        check_key(&i.key)?;
        let db = self
            .bucket(&i.bucket, cred.as_deref(), Access::Write)
            .await?;
        let cond = ReadCond {
            if_match: i.copy_source_if_match.as_ref(),
            if_none_match: i.copy_source_if_none_match.as_ref(),
            if_modified_since: i.copy_source_if_modified_since.as_ref().map(ts_secs),
            if_unmodified_since: i.copy_source_if_unmodified_since.as_ref().map(ts_secs),
            not_modified_is_304: false,
        };
        let (sb, f) = self
            .copy_source(&i.copy_source, cred.as_deref(), cond)
            .await?;
        let replace = match i.metadata_directive.as_ref().map(|d| d.as_str()) {
            None | Some("COPY") => false,
            Some("REPLACE") => true,
            Some(o) => return Err(s3_error!(InvalidArgument, "Unknown metadata directive {o}")),
        };
        let replace_tags = match i.tagging_directive.as_ref().map(|d| d.as_str()) {
            None | Some("COPY") => false,
            Some("REPLACE") => true,
            Some(o) => return Err(s3_error!(InvalidArgument, "Unknown tagging directive {o}")),
        };
        let CopySource::Bucket { key: skey, .. } = &i.copy_source else {
            return Err(s3_error!(NotImplemented));
        };
        let same = sb.name == db.name && **skey == *i.key;
        if same
            && !replace
            && !replace_tags
            && i.checksum_algorithm.is_none()
            && i.storage_class.is_none()
        {
            return Err(s3_error!(InvalidRequest, "This copy request is illegal because it is trying to copy an object to itself without changing the object's metadata, storage class, website redirect location or encryption attributes."));
        }
        let size = if f.attrs.kind == ObjectKind::Dir {
            f.rec.size
        } else {
            f.attrs.size
        };
        if size > MAX_PUT {
            return Err(s3_error!(InvalidRequest, "The specified copy source is larger than the maximum allowable size for a copy source: 5368709120"));
        }
        let (headers, meta) = if replace {
            let h = content_headers(
                i.content_type,
                i.content_encoding,
                i.content_disposition,
                i.content_language,
                i.cache_control,
                i.expires,
            );
            (h.headers, user_meta(i.metadata)?)
        } else {
            (f.rec.headers.clone(), f.rec.meta.clone())
        };
        let tags = if replace_tags {
            match &i.tagging {
                Some(t) => parse_tagging_header(t)?,
                None => Vec::new(),
            }
        } else {
            f.rec.tags.clone()
        };
        // Keep the source's full-object checksums (recomputed), add a requested one.
        let mut want = Wanted::default();
        if f.rec.checksums.kind.is_none() {
            let c = &f.rec.checksums;
            for (n, v) in [
                ("CRC32", &c.crc32),
                ("CRC32C", &c.crc32c),
                ("SHA1", &c.sha1),
                ("SHA256", &c.sha256),
                ("CRC64NVME", &c.crc64nvme),
            ] {
                if v.is_some() {
                    want.add(n)?;
                }
            }
        }
        if let Some(a) = &i.checksum_algorithm {
            want.add(a.as_str())?;
        }
        let w = self.copy_data(&sb, &f, 0, size, &db, &want).await?;
        let rec = ObjectRecord {
            etag: hex(&w.md5),
            size: w.size,
            headers,
            meta,
            checksums: w.sums.clone(),
            tags,
            ..Default::default()
        };
        let (key, obj, db2) = (i.key, w.obj, db.clone());
        let r = self
            .run(move |s| s.install(&db2, &key, obj, rec, &WriteCond::default(), None))
            .await;
        let rec = match r {
            Ok(r) => r,
            Err(e) => {
                let os = db.os.clone();
                let _ = self.run(move |_| os.remove(obj).map_err(ds_err)).await;
                return Err(e);
            }
        };
        let src_versioned = self.versioned(&sb).await?;
        Ok(S3Response::new(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(etag(&rec.etag)),
                last_modified: Some(ts(rec.mtime_ns)),
                checksum_crc32: w.sums.crc32,
                checksum_crc32c: w.sums.crc32c,
                checksum_sha1: w.sums.sha1,
                checksum_sha256: w.sums.sha256,

                checksum_crc64nvme: w.sums.crc64nvme,
                ..Default::default()
            }),
            version_id: rec.version_id.clone(),
            copy_source_version_id: Cistern::version_out(src_versioned, &f.rec),
            ..Default::default()
        }))
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let cred = creds(&req);
        let i = req.input;
        let b = self
            .bucket(&i.bucket, cred.as_deref(), Access::Read)
            .await?;
        let enc = is_url(&i.encoding_type)?;
        let max = max_keys(i.max_keys)?;
        let prefix = i.prefix.clone().unwrap_or_default();
        let delim = i.delimiter.clone().filter(|d| !d.is_empty());
        let after = i
            .marker
            .as_deref()
            .map(|m| resume_after(m, &prefix, delim.as_deref()));
        let (p2, d2) = (prefix.clone(), delim.clone());
        let l = self
            .run(move |s| s.list(&b, &p2, d2.as_deref(), after, max))
            .await?;
        let next_marker = (l.truncated && delim.is_some())
            .then(|| l.next.as_deref().map(strip_max))
            .flatten();
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(i.bucket),
            // v1 answers the prefix as given (clients decode only the rest).
            prefix: Some(prefix),
            marker: enc_opt(Some(i.marker.unwrap_or_default()), enc),
            next_marker: enc_opt(next_marker, enc),
            max_keys: Some(max as i32),
            is_truncated: Some(l.truncated),
            contents: Some(
                l.keys
                    .into_iter()
                    .map(|(k, r)| Cistern::object_entry(k, &r, enc, true))
                    .collect(),
            ),
            common_prefixes: common_prefixes(l.prefixes, enc),
            delimiter: enc_opt(i.delimiter.filter(|d| !d.is_empty()), enc),
            encoding_type: i.encoding_type,
            ..Default::default()
        }))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let cred = creds(&req);
        let i = req.input;
        let b = self
            .bucket(&i.bucket, cred.as_deref(), Access::Read)
            .await?;
        let enc = is_url(&i.encoding_type)?;
        let max = max_keys(i.max_keys)?;
        let prefix = i.prefix.clone().unwrap_or_default();
        let delim = i.delimiter.clone().filter(|d| !d.is_empty());
        let after = match &i.continuation_token {
            Some(t) => Some(token_decode(t)?),
            None => i
                .start_after
                .as_deref()
                .map(|m| resume_after(m, &prefix, delim.as_deref())),
        };
        let (p2, d2) = (prefix.clone(), delim.clone());
        let l = self
            .run(move |s| s.list(&b, &p2, d2.as_deref(), after, max))
            .await?;
        let count = l.keys.len() + l.prefixes.len();
        let owner = i.fetch_owner.unwrap_or(false);
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(i.bucket),
            prefix: Some(if enc { url_encode(&prefix) } else { prefix }),
            max_keys: Some(max as i32),
            key_count: Some(count as i32),
            continuation_token: i.continuation_token,
            next_continuation_token: l
                .truncated
                .then(|| l.next.as_deref().map(token_encode))
                .flatten(),
            is_truncated: Some(l.truncated),
            contents: Some(
                l.keys
                    .into_iter()
                    .map(|(k, r)| Cistern::object_entry(k, &r, enc, owner))
                    .collect(),
            ),
            common_prefixes: common_prefixes(l.prefixes, enc),
            delimiter: enc_opt(i.delimiter.filter(|d| !d.is_empty()), enc),
            encoding_type: i.encoding_type,
            start_after: enc_opt(i.start_after, enc),
            ..Default::default()
        }))
    }

    async fn list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        let cred = creds(&req);
        let i = req.input;
        let b = self
            .bucket(&i.bucket, cred.as_deref(), Access::Read)
            .await?;
        let enc = is_url(&i.encoding_type)?;
        let max = max_keys(i.max_keys)?;
        let prefix = i.prefix.clone().unwrap_or_default();
        let delim = i.delimiter.clone().filter(|d| !d.is_empty());
        let (p2, d2, km, vm) = (
            prefix.clone(),
            delim.clone(),
            i.key_marker.clone(),
            i.version_id_marker.clone(),
        );
        let l = self
            .run(move |s| {
                s.list_versions(&b, &p2, d2.as_deref(), km.as_deref(), vm.as_deref(), max)
            })
            .await?;
        let (mut versions, mut markers) = (Vec::new(), Vec::new());
        for (key, r, latest) in l.versions {
            let key = if enc { url_encode(&key) } else { key };
            if r.delete_marker {
                markers.push(DeleteMarkerEntry {
                    key: Some(key),
                    version_id: Some(r.version_str()),
                    is_latest: Some(latest),
                    last_modified: Some(ts(r.mtime_ns)),
                    owner: Some(owner_of()),
                });
            } else {
                versions.push(ObjectVersion {
                    key: Some(key),
                    version_id: Some(r.version_str()),
                    is_latest: Some(latest),
                    last_modified: Some(ts(r.mtime_ns)),
                    e_tag: Some(etag(&r.etag)),
                    size: Some(r.size as i64),
                    storage_class: Some(ObjectVersionStorageClass::from_static(
                        ObjectVersionStorageClass::STANDARD,
                    )),
                    owner: Some(owner_of()),
                    ..Default::default()
                });
            }
        }
        let (nk, nv) = if l.truncated {
            (l.next_key.as_deref().map(strip_max), l.next_version)
        } else {
            (None, None)
        };
        Ok(S3Response::new(ListObjectVersionsOutput {
            name: Some(i.bucket),
            prefix: Some(if enc { url_encode(&prefix) } else { prefix }),
            key_marker: enc_opt(i.key_marker, enc),
            version_id_marker: i.version_id_marker,
            next_key_marker: enc_opt(nk, enc),
            next_version_id_marker: nv,
            max_keys: Some(max as i32),
            is_truncated: Some(l.truncated),
            versions: (!versions.is_empty()).then_some(versions),
            delete_markers: (!markers.is_empty()).then_some(markers),
            common_prefixes: common_prefixes(l.prefixes, enc),
            delimiter: enc_opt(i.delimiter.filter(|d| !d.is_empty()), enc),
            encoding_type: i.encoding_type,
            ..Default::default()
        }))
    }

    async fn put_object_tagging(
        &self,
        req: S3Request<PutObjectTaggingInput>,
    ) -> S3Result<S3Response<PutObjectTaggingOutput>> {
        let cred = creds(&req);
        let i = req.input;
        let b = self
            .bucket(&i.bucket, cred.as_deref(), Access::Write)
            .await?;
        let tags = from_tagset(i.tagging.tag_set)?;
        let b2 = b.clone();
        let rec = self
            .run(move |s| {
                s.update_record(&b2, &i.key, i.version_id.as_deref(), |r| {
                    r.tags = tags;
                    Ok(())
                })
            })
            .await?;
        let versioned = self.versioned(&b).await?;
        Ok(S3Response::new(PutObjectTaggingOutput {
            version_id: Cistern::version_out(versioned, &rec),
        }))
    }

    async fn get_object_tagging(
        &self,
        req: S3Request<GetObjectTaggingInput>,
    ) -> S3Result<S3Response<GetObjectTaggingOutput>> {
        let cred = creds(&req);
        let i = req.input;
        let b = self
            .bucket(&i.bucket, cred.as_deref(), Access::Read)
            .await?;
        let (os, key, vid) = (b.os.clone(), i.key, i.version_id.clone());
        let (f, st) = self
            .run(move |_| Ok((find_version(&os, &key, vid.as_deref())?, settings(&os)?)))
            .await?;
        if f.rec.delete_marker {
            return Err(delete_marker_error(i.version_id.as_deref(), &f.rec));
        }
        Ok(S3Response::new(GetObjectTaggingOutput {
            tag_set: tagset(&f.rec.tags),
            version_id: Cistern::version_out(st.versioning.is_some(), &f.rec),
        }))
    }

    async fn delete_object_tagging(
        &self,
        req: S3Request<DeleteObjectTaggingInput>,
    ) -> S3Result<S3Response<DeleteObjectTaggingOutput>> {
        let cred = creds(&req);
        let i = req.input;
        let b = self
            .bucket(&i.bucket, cred.as_deref(), Access::Write)
            .await?;
        let b2 = b.clone();
        let rec = self
            .run(move |s| {
                s.update_record(&b2, &i.key, i.version_id.as_deref(), |r| {
                    r.tags.clear();
                    Ok(())
                })
            })
            .await?;
        let versioned = self.versioned(&b).await?;
        Ok(S3Response::new(DeleteObjectTaggingOutput {
            version_id: Cistern::version_out(versioned, &rec),
        }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let cred = creds(&req);
        let i = req.input;
        check_key(&i.key)?;
        let b = self
            .bucket(&i.bucket, cred.as_deref(), Access::Write)
            .await?;
        let tags = match &i.tagging {
            Some(t) => parse_tagging_header(t)?,
            None => Vec::new(),
        };
        let alg = match &i.checksum_algorithm {
            Some(a) => {
                let mut w = Wanted::default();
                w.add(a.as_str())?;
                w.algs.first().map(|s| s.to_string())
            }
            None => None,
        };
        let h = content_headers(
            i.content_type,
            i.content_encoding,
            i.content_disposition,
            i.content_language,
            i.cache_control,
            i.expires,
        );
        let rec = ObjectRecord {
            headers: h.headers,
            meta: user_meta(i.metadata)?,
            tags,
            checksum_algorithm: alg.clone(),
            ..Default::default()
        };
        let key = i.key.clone();
        let id = self.run(move |s| s.create_upload(&b, &key, rec)).await?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(i.bucket),
            key: Some(i.key),
            upload_id: Some(id),
            checksum_algorithm: alg.map(ChecksumAlgorithm::from),
            checksum_type: i
                .checksum_algorithm
                .as_ref()
                .map(|_| ChecksumType::from_static(ChecksumType::COMPOSITE)),
            ..Default::default()
        }))
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let trailers = req.trailing_headers.clone();
        let cred = creds(&req);
        let i = req.input;
        if !(1..=10000).contains(&i.part_number) {
            return Err(s3_error!(
                InvalidArgument,
                "Part number must be an integer between 1 and 10000, inclusive"
            ));
        }
        let b = self
            .bucket(&i.bucket, cred.as_deref(), Access::Write)
            .await?;
        let (b2, key, id) = (b.clone(), i.key.clone(), i.upload_id.clone());
        let up_alg = self
            .run(move |s| Ok(s.upload(&b2, &key, &id)?.rec.checksum_algorithm))
            .await?;
        let claimed = Checksums {
            crc32: i.checksum_crc32,
            crc32c: i.checksum_crc32c,
            sha1: i.checksum_sha1,
            sha256: i.checksum_sha256,
            crc64nvme: i.checksum_crc64nvme,
            kind: None,
        };
        let mut want = Wanted::new(i.checksum_algorithm.as_ref(), claimed)?;
        if let Some(a) = &up_alg {
            want.add(a)?;
        }
        let w = self.write_body(&b, i.body, &want).await?;
        want.take_trailers(trailers.as_ref());
        let ok = want
            .verify(&w.sums)
            .and_then(|()| check_content_md5(i.content_md5.as_deref(), &w.md5));
        if let Err(e) = ok {
            let os = b.os.clone();
            let obj = w.obj;
            let _ = self.run(move |_| os.remove(obj).map_err(ds_err)).await;
            return Err(e);
        }
        let rec = ObjectRecord {
            v: RECORD_VERSION,
            etag: hex(&w.md5),
            size: w.size,
            checksums: w.sums.clone(),
            mtime_ns: now_ns(),
            ..Default::default()
        };
        let etag_s = rec.etag.clone();
        let (key, id, n, obj) = (i.key, i.upload_id, i.part_number, w.obj);
        self.run(move |s| s.add_part(&b, &key, &id, n, obj, &rec))
            .await?;
        Ok(S3Response::new(UploadPartOutput {
            e_tag: Some(etag(&etag_s)),
            checksum_crc32: w.sums.crc32,
            checksum_crc32c: w.sums.crc32c,
            checksum_sha1: w.sums.sha1,
            checksum_sha256: w.sums.sha256,

            checksum_crc64nvme: w.sums.crc64nvme,
            ..Default::default()
        }))
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let cred = creds(&req);
        let i = req.input;
        if !(1..=10000).contains(&i.part_number) {
            return Err(s3_error!(
                InvalidArgument,
                "Part number must be an integer between 1 and 10000, inclusive"
            ));
        }
        let db = self
            .bucket(&i.bucket, cred.as_deref(), Access::Write)
            .await?;
        let (b2, key, id) = (db.clone(), i.key.clone(), i.upload_id.clone());
        let up_alg = self
            .run(move |s| Ok(s.upload(&b2, &key, &id)?.rec.checksum_algorithm))
            .await?;
        let cond = ReadCond {
            if_match: i.copy_source_if_match.as_ref(),
            if_none_match: i.copy_source_if_none_match.as_ref(),
            if_modified_since: i.copy_source_if_modified_since.as_ref().map(ts_secs),
            if_unmodified_since: i.copy_source_if_unmodified_since.as_ref().map(ts_secs),
            not_modified_is_304: false,
        };
        let (sb, f) = self
            .copy_source(&i.copy_source, cred.as_deref(), cond)
            .await?;
        let size = if f.attrs.kind == ObjectKind::Dir {
            f.rec.size
        } else {
            f.attrs.size
        };
        let (start, end) = match &i.copy_source_range {
            Some(r) => parse_copy_range(r, size)?,
            None => (0, size),
        };
        let mut want = Wanted::default();
        if let Some(a) = &up_alg {
            want.add(a)?;
        }
        let w = self.copy_data(&sb, &f, start, end, &db, &want).await?;
        let rec = ObjectRecord {
            v: RECORD_VERSION,
            etag: hex(&w.md5),
            size: w.size,
            checksums: w.sums.clone(),
            mtime_ns: now_ns(),
            ..Default::default()
        };
        let (etag_s, mtime) = (rec.etag.clone(), rec.mtime_ns);
        let (key, id, n, obj) = (i.key, i.upload_id, i.part_number, w.obj);
        self.run(move |s| s.add_part(&db, &key, &id, n, obj, &rec))
            .await?;
        let src_versioned = self.versioned(&sb).await?;
        Ok(S3Response::new(UploadPartCopyOutput {
            copy_part_result: Some(CopyPartResult {
                e_tag: Some(etag(&etag_s)),
                last_modified: Some(ts(mtime)),
                checksum_crc32: w.sums.crc32,
                checksum_crc32c: w.sums.crc32c,
                checksum_sha1: w.sums.sha1,
                checksum_sha256: w.sums.sha256,

                checksum_crc64nvme: w.sums.crc64nvme,
            }),
            copy_source_version_id: Cistern::version_out(src_versioned, &f.rec),
            ..Default::default()
        }))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let cred = creds(&req);
        let i = req.input;
        let b = self
            .bucket(&i.bucket, cred.as_deref(), Access::Write)
            .await?;
        let parts: Vec<CompletePart> = i
            .multipart_upload
            .and_then(|m| m.parts)
            .unwrap_or_default()
            .into_iter()
            .map(|p| CompletePart {
                number: p.part_number.unwrap_or(0),
                etag: p.e_tag.map(|e| e.value().to_string()).unwrap_or_default(),
            })
            .collect();
        let cond = WriteCond {
            if_match: i.if_match,
            if_none_match: i.if_none_match,
        };
        let claimed = Checksums {
            crc32: i.checksum_crc32,
            crc32c: i.checksum_crc32c,
            sha1: i.checksum_sha1,
            sha256: i.checksum_sha256,
            crc64nvme: i.checksum_crc64nvme,
            kind: None,
        };
        let (b2, key, id) = (b.clone(), i.key.clone(), i.upload_id);
        let rec = self
            .run(move |s| s.complete(&b2, &key, &id, &parts, &cond, &claimed))
            .await?;
        let c = &rec.checksums;
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(i.bucket.clone()),
            key: Some(i.key.clone()),
            location: Some(format!("/{}/{}", i.bucket, i.key)),
            e_tag: Some(etag(&rec.etag)),
            version_id: rec.version_id.clone(),
            checksum_crc32: c.crc32.clone(),
            checksum_crc32c: c.crc32c.clone(),
            checksum_sha1: c.sha1.clone(),
            checksum_sha256: c.sha256.clone(),

            checksum_crc64nvme: c.crc64nvme.clone(),
            checksum_type: c.kind.clone().map(ChecksumType::from),
            ..Default::default()
        }))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let cred = creds(&req);
        let i = req.input;
        let b = self
            .bucket(&i.bucket, cred.as_deref(), Access::Write)
            .await?;
        self.run(move |s| s.abort(&b, &i.key, &i.upload_id)).await?;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let cred = creds(&req);
        let i = req.input;
        let b = self
            .bucket(&i.bucket, cred.as_deref(), Access::Read)
            .await?;
        let max = match i.max_parts {
            Some(n) if n < 0 => {
                return Err(s3_error!(InvalidArgument, "max-parts must be non-negative"))
            }
            Some(n) => (n as usize).min(1000),
            None => 1000,
        };
        let marker = i.part_number_marker.filter(|m| *m > 0);
        let (b2, key, id) = (b.clone(), i.key.clone(), i.upload_id.clone());
        let (up, mut parts) = self
            .run(move |s| {
                let up = s.upload(&b2, &key, &id)?;
                let parts = s.parts(&b2.os, up.dir, marker, max + 1)?;
                Ok((up.rec, parts))
            })
            .await?;
        let truncated = parts.len() > max;
        parts.truncate(max);
        let next = parts.last().map(|p| p.0);
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(i.bucket),
            key: Some(i.key),
            upload_id: Some(i.upload_id),
            part_number_marker: i.part_number_marker,
            next_part_number_marker: truncated.then_some(next).flatten(),
            max_parts: Some(max as i32),
            is_truncated: Some(truncated),
            checksum_algorithm: up.checksum_algorithm.map(ChecksumAlgorithm::from),
            initiator: Some(Initiator {
                display_name: Some("cistern".into()),
                id: Some("cistern".into()),
            }),
            owner: Some(owner_of()),
            storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
            parts: Some(
                parts
                    .into_iter()
                    .map(|(n, _, r)| Part {
                        part_number: Some(n),
                        e_tag: Some(etag(&r.etag)),
                        size: Some(r.size as i64),
                        last_modified: Some(ts(r.mtime_ns)),
                        checksum_crc32: r.checksums.crc32,
                        checksum_crc32c: r.checksums.crc32c,
                        checksum_sha1: r.checksums.sha1,
                        checksum_sha256: r.checksums.sha256,

                        checksum_crc64nvme: r.checksums.crc64nvme,
                    })
                    .collect(),
            ),
            ..Default::default()
        }))
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let cred = creds(&req);
        let i = req.input;
        let b = self
            .bucket(&i.bucket, cred.as_deref(), Access::Read)
            .await?;
        let enc = is_url(&i.encoding_type)?;
        let max = match i.max_uploads {
            Some(n) if n < 0 => {
                return Err(s3_error!(
                    InvalidArgument,
                    "max-uploads must be non-negative"
                ))
            }
            Some(n) => (n as usize).min(1000),
            None => 1000,
        };
        let prefix = i.prefix.clone().unwrap_or_default();
        let (p2, d2, km, um) = (
            prefix.clone(),
            i.delimiter.clone(),
            i.key_marker.clone(),
            i.upload_id_marker.clone(),
        );
        let (ups, cps, truncated) = self
            .run(move |s| s.list_uploads(&b, &p2, d2.as_deref(), km.as_deref(), um.as_deref(), max))
            .await?;
        let last = ups.last().and_then(|u| {
            parse_upload_name(&u.name).map(|(k, id)| (k.to_string(), id.to_string()))
        });
        let uploads = ups
            .iter()
            .filter_map(|u| {
                let (k, id) = parse_upload_name(&u.name)?;
                Some(MultipartUpload {
                    key: Some(if enc { url_encode(k) } else { k.to_string() }),
                    upload_id: Some(id.to_string()),
                    initiated: Some(ts(u.attrs.crtime_ns.max(u.rec.mtime_ns))),
                    initiator: Some(Initiator {
                        display_name: Some("cistern".into()),
                        id: Some("cistern".into()),
                    }),
                    owner: Some(owner_of()),
                    storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
                    checksum_algorithm: u
                        .rec
                        .checksum_algorithm
                        .clone()
                        .map(ChecksumAlgorithm::from),
                    ..Default::default()
                })
            })
            .collect();
        let (nk, nu) = match (truncated, last) {
            (true, Some((k, id))) => (Some(k), Some(id)),
            _ => (None, None),
        };
        Ok(S3Response::new(ListMultipartUploadsOutput {
            bucket: Some(i.bucket),
            prefix: Some(prefix),
            delimiter: i.delimiter,
            key_marker: i.key_marker,
            upload_id_marker: i.upload_id_marker,
            next_key_marker: enc_opt(nk, enc),
            next_upload_id_marker: nu,
            max_uploads: Some(max as i32),
            is_truncated: Some(truncated),
            uploads: Some(uploads),
            common_prefixes: (!cps.is_empty()).then(|| {
                cps.into_iter()
                    .map(|p| CommonPrefix {
                        prefix: enc_opt(Some(p), enc),
                    })
                    .collect()
            }),
            encoding_type: i.encoding_type,
            ..Default::default()
        }))
    }
}

impl Cistern {
    /// Bytes to send: a Range, a part of a multipart object, or all of it.
    /// (start, end, is it a part of the object?)
    /// What GET and HEAD share: the bucket and version read (never a
    /// delete marker), the conditions checked, the range or part chosen.
    async fn prepare_read(
        &self,
        cred: Option<&str>,
        (bucket, key, vid): (&str, &str, Option<&str>),
        cond: &ReadCond<'_>,
        range: Option<Range>,
        part: Option<i32>,
    ) -> S3Result<Read> {
        let b = self.bucket(bucket, cred, Access::Read).await?;
        let (os, k, v) = (b.os.clone(), key.to_string(), vid.map(str::to_string));
        let (f, st) = self
            .run(move |_| Ok((find_version(&os, &k, v.as_deref())?, settings(&os)?)))
            .await?;
        if f.rec.delete_marker {
            return Err(delete_marker_error(vid, &f.rec));
        }
        check_read_cond(cond, &f.rec.etag, f.rec.mtime_ns)?;
        // A multipart object is a directory of parts: its size is the record's.
        let size = if f.attrs.kind == ObjectKind::Dir {
            f.rec.size
        } else {
            f.attrs.size
        };
        let (start, end, ranged, part_sums) = self.select(&b, &f, size, range, part).await?;
        Ok(Read {
            b,
            f,
            st,
            size,
            start,
            end,
            ranged,
            part_sums,
        })
    }

    async fn select(
        &self,
        b: &Arc<Bkt>,
        f: &Found,
        size: u64,
        range: Option<Range>,
        part: Option<i32>,
    ) -> S3Result<(u64, u64, bool, Option<Checksums>)> {
        if let Some(r) = range {
            let r = r
                .check(size)
                .map_err(|_| s3_error!(InvalidRange, "The requested range is not satisfiable"))?;
            return Ok((r.start, r.end, r.start != 0 || r.end != size, None));
        }
        let Some(n) = part else {
            return Ok((0, size, false, None));
        };
        if f.attrs.kind != ObjectKind::Dir {
            if n == 1 {
                return Ok((0, size, false, None));
            }
            return Err(bad_part_number());
        }
        let (os, dir) = (b.os.clone(), f.obj);
        let parts = self
            .run(move |s| s.parts(&os, dir, None, usize::MAX))
            .await?;
        let mut pos = 0;
        for (pn, _, r) in parts {
            if pn == n {
                // A part answers with its own checksums (the object's are composite).
                let mut c = r.checksums;
                c.kind = f.rec.checksums.kind.clone();
                return Ok((pos, pos + r.size, true, Some(c).filter(|c| !c.is_empty())));
            }
            pos += r.size;
        }
        Err(bad_part_number())
    }
}

fn bad_part_number() -> S3Error {
    let code =
        S3ErrorCode::from_bytes(b"InvalidPartNumber").unwrap_or(S3ErrorCode::InvalidArgument);
    let mut e = S3Error::with_message(code, "The requested partnumber is not satisfiable");
    e.set_status_code(http::StatusCode::RANGE_NOT_SATISFIABLE);
    e
}

/// Content-MD5 (base64 of the binary digest): InvalidDigest if malformed, BadDigest if different.
fn check_content_md5(claimed: Option<&str>, md5: &[u8; 16]) -> S3Result<()> {
    use base64::Engine as _;
    let Some(c) = claimed else { return Ok(()) };
    let raw = base64::engine::general_purpose::STANDARD
        .decode(c.trim())
        .map_err(|_| s3_error!(InvalidDigest, "The Content-MD5 you specified was invalid."))?;
    if raw.len() != 16 {
        return Err(s3_error!(
            InvalidDigest,
            "The Content-MD5 you specified was invalid."
        ));
    }
    if raw != md5 {
        return Err(s3_error!(
            BadDigest,
            "The Content-MD5 you specified did not match what we received."
        ));
    }
    Ok(())
}

/// Entry points for the fuzz targets (`fuzz/`, decision 0027): what this
/// crate parses from requests itself (s3s parses the XML bodies and the
/// HTTP framing). Not part of the API.
pub mod fuzzing {
    use super::*;

    /// `x-amz-tagging`; `Err`: the S3 error code.
    pub fn tagging_header(s: &str) -> Result<Vec<(String, String)>, String> {
        parse_tagging_header(s).map_err(|e| format!("{:?}", e.code()))
    }

    /// `x-amz-copy-source-range` against an object of `size` bytes.
    pub fn copy_range(r: &str, size: u64) -> Result<(u64, u64), String> {
        parse_copy_range(r, size).map_err(|e| format!("{:?}", e.code()))
    }

    /// A ListObjectsV2 continuation token, and how one is made.
    pub fn decode_token(s: &str) -> Result<String, String> {
        token_decode(s).map_err(|e| format!("{:?}", e.code()))
    }
    pub fn encode_token(s: &str) -> String {
        token_encode(s)
    }

    pub fn key(s: &str) -> Result<(), String> {
        check_key(s).map_err(|e| format!("{:?}", e.code()))
    }

    /// A Content-MD5 header against the body's digest.
    pub fn content_md5(claimed: &str, md5: &[u8; 16]) -> Result<(), String> {
        check_content_md5(Some(claimed), md5).map_err(|e| format!("{:?}", e.code()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_encoding_keeps_slashes() {
        assert_eq!(url_encode("a b/c+d"), "a%20b/c%2Bd");
        assert_eq!(url_encode("ü"), "%C3%BC");
    }

    #[test]
    fn tagging_header_parses_and_validates() {
        assert_eq!(
            parse_tagging_header("a=1&b%20c=x+y").unwrap(),
            vec![("a".into(), "1".into()), ("b c".into(), "x y".into())]
        );
        let many: Vec<String> = (0..11).map(|i| format!("k{i}=v")).collect();
        assert_eq!(
            *parse_tagging_header(&many.join("&")).unwrap_err().code(),
            S3ErrorCode::InvalidTag
        );
        assert!(parse_tagging_header("a=1&a=2").is_err());
    }

    #[test]
    fn copy_ranges() {
        assert_eq!(parse_copy_range("bytes=0-9", 10).unwrap(), (0, 10));
        assert_eq!(
            *parse_copy_range("bytes=0-10", 10).unwrap_err().code(),
            S3ErrorCode::InvalidRange
        );
        assert!(parse_copy_range("0-1", 10).is_err());
    }

    #[test]
    fn continuation_tokens_round_trip() {
        let t = token_encode("a/b\u{10FFFF}");
        assert_eq!(token_decode(&t).unwrap(), "a/b\u{10FFFF}");
        assert!(token_decode("!!").is_err());
    }

    #[test]
    fn content_md5_checks() {
        let md5 = Md5::checksum(b"hello");
        use base64::Engine as _;
        let good = base64::engine::general_purpose::STANDARD.encode(md5);
        assert!(check_content_md5(Some(&good), &md5).is_ok());
        let other = base64::engine::general_purpose::STANDARD.encode([0u8; 16]);
        assert_eq!(
            *check_content_md5(Some(&other), &md5).unwrap_err().code(),
            S3ErrorCode::BadDigest
        );
        assert_eq!(
            *check_content_md5(Some("xx"), &md5).unwrap_err().code(),
            S3ErrorCode::InvalidDigest
        );
    }
}

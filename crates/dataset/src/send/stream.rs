//! The send stream: a versioned header, then typed records, each with its
//! own blake3 checksum; a snapshot's records close with a record carrying
//! the checksum of the whole stream so far, the stream with an end record
//! (docs/send-stream.md).
//!
//! ```text
//! header:  "CISTSTRM" | version u32 LE | flags u32 LE | blake3(previous 16 bytes)[..16]
//! record:  kind u8 | len u32 LE | payload[len] | blake3(kind | len | payload)[..16]
//! ```
//!
//! Version 3 (decision 0050) hashes every byte once: a checkpoint carries
//! blake3 of the header and the record checksums before it (not of every
//! byte), and a RAW record's checksum leaves out its stored bytes, which
//! the block pointer it covers checksums already ([`Reader::read_record`]).

use crate::{Error, Result};
use std::io::{Read, Write};

pub const MAGIC: &[u8; 8] = b"CISTSTRM";
/// The stream version this build writes; it reads 1..=VERSION. Versions
/// 1 (no feature flags) and 2 (flags) hash every stream byte into the
/// checkpoints and every payload byte into its record's checksum; version
/// 3 (decision 0050) chains the record checksums instead and leaves a RAW
/// record's stored bytes to its pointer's checksum, so each byte is hashed
/// once on either side. Earlier builds refuse version 3 with a clear error.
pub const VERSION: u32 = 3;
/// Header flag: a `-R` stream (BEGIN records name the dataset below the top).
pub const FLAG_RECURSIVE: u32 = 1;
/// Header flag: a raw stream (`-w`, decision 0044): blocks as stored
/// (RAW records), name rows as stored (RAW_NAME), the key wrapped.
pub const FLAG_RAW: u32 = 2;
/// The flags this build understands.
pub const KNOWN_FLAGS: u32 = FLAG_RECURSIVE | FLAG_RAW;
/// Largest record payload a reader accepts (a block of 16 MiB plus its address).
pub const MAX_RECORD: u32 = (16 << 20) + 4096;
const SUM_LEN: usize = 16;

/// Record kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// JSON [`super::Begin`]: one snapshot's records follow.
    Begin = 1,
    /// A block row: object u64 BE | block u64 BE | logical bytes.
    Data = 2,
    /// A tombstone: the row's address (its older versions are gone).
    Free = 3,
    /// A name row: address (name address) length u16 BE | address | target u64 LE.
    Name = 4,
    /// The snapshot is complete: blake3 of the stream before this record.
    SnapEnd = 5,
    /// The end of the stream: blake3 of the stream before this record.
    End = 6,
    /// A block row as stored (raw, `-w`): object u64 BE | block u64 BE |
    /// the block pointer in its embedded form (no DVAs; the stored bytes
    /// follow it, as an embedded pointer carries them).
    Raw = 7,
    /// A name row as stored (raw, `-w`): address length u16 BE | address |
    /// value (empty: a tombstone). Sealed names travel without the key.
    RawName = 8,
}

impl Kind {
    /// The kind of a record's first byte.
    pub fn from_u8(k: u8) -> Option<Kind> {
        Some(match k {
            1 => Kind::Begin,
            2 => Kind::Data,
            3 => Kind::Free,
            4 => Kind::Name,
            5 => Kind::SnapEnd,
            6 => Kind::End,
            7 => Kind::Raw,
            8 => Kind::RawName,
            _ => return None,
        })
    }
}

fn sum16(parts: &[&[u8]]) -> [u8; SUM_LEN] {
    let mut h = blake3::Hasher::new();
    for p in parts {
        h.update(p);
    }
    let mut out = [0u8; SUM_LEN];
    out.copy_from_slice(&h.finalize().as_bytes()[..SUM_LEN]);
    out
}

/// Version 3: how much of a RAW record's payload its record checksum
/// covers: object, block and the embedded pointer, not the `psize` stored
/// bytes after it (the pointer's checksum covers those). The pointer's
/// psize is at payload bytes 24..28 (docs/send-stream.md).
fn raw_covered(payload: &[u8]) -> Option<usize> {
    raw_covered_of(payload.len(), payload)
}

/// [`raw_covered`] of a payload of `len` bytes whose first 28 are `start`.
fn raw_covered_of(len: usize, start: &[u8]) -> Option<usize> {
    let psize = start.get(24..28)?;
    let psize = u32::from_le_bytes([psize[0], psize[1], psize[2], psize[3]]) as usize;
    len.checked_sub(psize).filter(|c| *c >= 28)
}

fn io_err(e: std::io::Error) -> Error {
    Error::Io(format!("writing the send stream: {e}"))
}

/// Records gather in a buffer this big before they are hashed into the
/// stream checksum and written: blake3 hashes a long run at full SIMD width,
/// where record-sized pieces at odd offsets keep it to one chunk at a time.
const BATCH: usize = 1 << 20;

/// Takes a stream's buffers whole, to pass them on uncopied (the daemon
/// hands them to the connection): [`ChunkSink::put`] gets a filled buffer
/// and returns an empty one (any capacity) to fill next.
pub trait ChunkSink {
    fn put(&mut self, chunk: Vec<u8>) -> std::io::Result<Vec<u8>>;
    fn flush(&mut self) -> std::io::Result<()>;
}

/// Where a [`Writer`] drains to.
pub enum Out<'a> {
    /// Copied out of the writer's buffer.
    Write(&'a mut dyn Write),
    /// The writer's buffer itself.
    Chunks(&'a mut dyn ChunkSink),
}

/// Writes a stream; counts its bytes and hashes them into the checkpoints.
pub struct Writer<'a> {
    out: Out<'a>,
    version: u32,
    /// Versions 1 and 2: every byte drained; 3: the header and every
    /// record checksum.
    hash: blake3::Hasher,
    /// Whole records not yet in `hash` nor written.
    buf: Vec<u8>,
    pub bytes: u64,
}

impl<'a> Writer<'a> {
    pub fn new(out: &'a mut dyn Write, flags: u32) -> Result<Writer<'a>> {
        Self::with_version(out, flags, VERSION)
    }

    /// A stream whose buffers go to `sink` whole.
    pub fn to_sink(sink: &'a mut dyn ChunkSink, flags: u32) -> Result<Writer<'a>> {
        Self::with_out(Out::Chunks(sink), flags, VERSION)
    }

    /// A stream of an earlier `version` (1 without flags, 2 with them):
    /// what earlier builds wrote, for tests that receive old streams.
    #[doc(hidden)]
    pub fn with_version(out: &'a mut dyn Write, flags: u32, version: u32) -> Result<Writer<'a>> {
        Self::with_out(Out::Write(out), flags, version)
    }

    fn with_out(out: Out<'a>, flags: u32, version: u32) -> Result<Writer<'a>> {
        let version = match version {
            3 => 3,
            _ if flags == 0 => 1,
            _ => 2,
        };
        let mut w = Writer {
            out,
            version,
            hash: blake3::Hasher::new(),
            buf: Vec::with_capacity(BATCH + (64 << 10)),
            bytes: 0,
        };
        let mut head = Vec::with_capacity(32);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&version.to_le_bytes());
        head.extend_from_slice(&flags.to_le_bytes());
        let s = sum16(&[&head]);
        head.extend_from_slice(&s);
        if version >= 3 {
            w.hash.update(&head);
        }
        w.buf.extend_from_slice(&head);
        w.bytes += head.len() as u64;
        Ok(w)
    }

    /// Hashes and writes what the buffer holds.
    fn drain(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        if self.version < 3 {
            self.hash.update(&self.buf);
        }
        match &mut self.out {
            Out::Write(w) => {
                w.write_all(&self.buf).map_err(io_err)?;
                self.buf.clear();
            }
            Out::Chunks(sink) => {
                let full = std::mem::take(&mut self.buf);
                self.buf = sink.put(full).map_err(io_err)?;
                self.buf.clear();
                self.buf.reserve(BATCH + (64 << 10));
            }
        }
        Ok(())
    }

    /// One record made of `parts` (concatenated as its payload).
    pub fn record(&mut self, kind: Kind, parts: &[&[u8]]) -> Result<()> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let len = u32::try_from(len)
            .ok()
            .filter(|l| *l <= MAX_RECORD)
            .ok_or_else(|| Error::InvalidArgument(format!("send record of {len} bytes")))?;
        let start = self.buf.len();
        self.buf.push(kind as u8);
        self.buf.extend_from_slice(&len.to_le_bytes());
        for p in parts {
            self.buf.extend_from_slice(p);
        }
        let covered = if self.version >= 3 && kind == Kind::Raw {
            raw_covered(&self.buf[start + 5..]).ok_or_else(|| {
                self.buf.truncate(start);
                Error::InvalidArgument("a raw send record without its pointer".into())
            })?
        } else {
            len as usize
        };
        // The record is contiguous here: one hash call over all of it.
        let s = blake3::hash(&self.buf[start..start + 5 + covered]);
        self.buf.extend_from_slice(&s.as_bytes()[..SUM_LEN]);
        if self.version >= 3 {
            self.hash.update(&s.as_bytes()[..SUM_LEN]);
        }
        self.bytes += (self.buf.len() - start) as u64;
        if self.buf.len() >= BATCH {
            self.drain()?;
        }
        Ok(())
    }

    /// A record carrying the checksum of everything written before it.
    pub fn checkpoint(&mut self, kind: Kind) -> Result<()> {
        self.drain()?;
        let sum = *self.hash.finalize().as_bytes();
        self.record(kind, &[&sum])?;
        // Written through, as every record was before the batching.
        self.drain()
    }

    pub fn flush(&mut self) -> Result<()> {
        self.drain()?;
        match &mut self.out {
            Out::Write(w) => w.flush(),
            Out::Chunks(sink) => sink.flush(),
        }
        .map_err(io_err)
    }
}

/// One record as read and verified.
#[derive(Debug, PartialEq, Eq)]
pub struct Record {
    pub kind: Kind,
    pub payload: Vec<u8>,
}

fn bad(why: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("invalid send stream: {why}"))
}

/// Reads and verifies a stream record by record.
pub struct Reader<'a> {
    inp: &'a mut dyn Read,
    hash: blake3::Hasher,
    /// Read ahead: `buf[pos..end]` is not consumed yet; `buf[..hashed]` is
    /// in `hash` (consumed bytes are hashed in long runs, lazily).
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    hashed: usize,
    pub bytes: u64,
    pub version: u32,
    pub flags: u32,
    ended: bool,
    peeked: Option<(Record, Option<Vec<u8>>)>,
}

impl<'a> Reader<'a> {
    pub fn new(inp: &'a mut dyn Read) -> Result<Reader<'a>> {
        let mut r = Reader {
            inp,
            hash: blake3::Hasher::new(),
            buf: vec![0u8; BATCH],
            pos: 0,
            end: 0,
            hashed: 0,
            bytes: 0,
            version: 0,
            flags: 0,
            ended: false,
            peeked: None,
        };
        let mut head = [0u8; 32];
        r.take(&mut head)
            .map_err(|_| bad("too short for a header (not a send stream?)"))?;
        if &head[..8] != MAGIC {
            return Err(bad("bad magic (not a cistern send stream)"));
        }
        if head[16..] != sum16(&[&head[..16]]) {
            return Err(bad("header checksum mismatch"));
        }
        r.version = u32::from_le_bytes(head[8..12].try_into().unwrap_or_default());
        if r.version >= 3 {
            r.hash.update(&head);
        }
        r.flags = u32::from_le_bytes(head[12..16].try_into().unwrap_or_default());
        if r.version == 0 || r.version > VERSION {
            return Err(bad(format!(
                "stream version {} (this build reads 1 to {VERSION})",
                r.version
            )));
        }
        if r.flags & !KNOWN_FLAGS != 0 || (r.version == 1 && r.flags != 0) {
            return Err(bad(format!(
                "unknown stream feature flags {:#x} (this build knows {KNOWN_FLAGS:#x})",
                r.flags
            )));
        }
        Ok(r)
    }

    /// Puts every consumed byte into the stream checksum (versions 1, 2).
    fn hash_consumed(&mut self) {
        if self.version >= 3 {
            self.hashed = self.pos;
            return;
        }
        if self.hashed < self.pos {
            self.hash.update(&self.buf[self.hashed..self.pos]);
            self.hashed = self.pos;
        }
    }

    /// Makes at least one unconsumed byte available.
    fn fill(&mut self) -> Result<()> {
        if self.pos < self.end {
            return Ok(());
        }
        self.hash_consumed();
        self.pos = 0;
        self.end = 0;
        self.hashed = 0;
        loop {
            match self.inp.read(&mut self.buf) {
                Ok(0) => return Err(bad(format!("truncated at byte {}", self.bytes))),
                Ok(n) => {
                    self.end = n;
                    return Ok(());
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return Err(bad(format!("truncated at byte {}", self.bytes)))
                }
                Err(e) => return Err(Error::Io(format!("reading the send stream: {e}"))),
            }
        }
    }

    /// Consumes `n` bytes, handing them to `f` in the pieces the buffer holds.
    fn consume(&mut self, mut n: usize, mut f: impl FnMut(&[u8])) -> Result<()> {
        while n > 0 {
            self.fill()?;
            let k = n.min(self.end - self.pos);
            f(&self.buf[self.pos..self.pos + k]);
            self.pos += k;
            self.bytes += k as u64;
            n -= k;
        }
        Ok(())
    }

    fn take(&mut self, out: &mut [u8]) -> Result<()> {
        let mut at = 0;
        self.consume(out.len(), |b| {
            out[at..at + b.len()].copy_from_slice(b);
            at += b.len();
        })
    }

    /// `n` bytes in a buffer of their own: what the read-ahead holds, then
    /// (version 3, where consumed bytes need no hashing) the rest straight
    /// from the input, never staged in the read-ahead.
    fn take_vec(&mut self, n: usize) -> Result<Vec<u8>> {
        let mut v = Vec::with_capacity(n);
        let k = n.min(self.end - self.pos);
        v.extend_from_slice(&self.buf[self.pos..self.pos + k]);
        self.pos += k;
        self.bytes += k as u64;
        if self.version < 3 || v.len() == n {
            self.consume(n - v.len(), |b| v.extend_from_slice(b))?;
            return Ok(v);
        }
        // The read-ahead is empty here (all of it was taken above).
        let mut got = v.len();
        v.resize(n, 0);
        while got < n {
            match self.inp.read(&mut v[got..]) {
                Ok(0) => return Err(bad(format!("truncated at byte {}", self.bytes))),
                Ok(k) => {
                    got += k;
                    self.bytes += k as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    return Err(bad(format!("truncated at byte {}", self.bytes)))
                }
                Err(e) => return Err(Error::Io(format!("reading the send stream: {e}"))),
            }
        }
        Ok(v)
    }

    /// The next record; `None` after the end record. Checkpoint records
    /// (SnapEnd, End) are checked against the stream's own checksum here.
    pub fn read_record(&mut self) -> Result<Option<Record>> {
        Ok(self.read_record_split()?.map(|(mut r, stored)| {
            if let Some(stored) = stored {
                r.payload.extend_from_slice(&stored);
            }
            r
        }))
    }

    /// [`Reader::read_record`], with a version 3 RAW record's stored bytes
    /// apart: the payload holds object, block and the embedded pointer,
    /// the second part the pointer's psize stored bytes, read into a
    /// buffer of their own that becomes the received block (no copy).
    /// `None` as the second part: the whole payload is in the record.
    pub fn read_record_split(&mut self) -> Result<Option<(Record, Option<Vec<u8>>)>> {
        if let Some(r) = self.peeked.take() {
            return Ok(Some(r));
        }
        if self.ended {
            return Ok(None);
        }
        // The stream checksum is only wanted before a checkpoint record.
        self.fill()?;
        let before = if matches!(
            Kind::from_u8(self.buf[self.pos]),
            Some(Kind::SnapEnd | Kind::End)
        ) {
            self.hash_consumed();
            Some(*self.hash.finalize().as_bytes())
        } else {
            None
        };
        let mut head = [0u8; 5];
        self.take(&mut head)?;
        let len = u32::from_le_bytes(head[1..5].try_into().unwrap_or_default());
        if len > MAX_RECORD {
            return Err(bad(format!("record of {len} bytes at byte {}", self.bytes)));
        }
        let len = len as usize;
        let split = self.version >= 3 && head[0] == Kind::Raw as u8 && len >= 28;
        let (payload, stored) = if split {
            // The pointer's psize (payload bytes 24..28) says where the
            // stored bytes start; a psize that leaves no whole pointer
            // is read as one payload and refused below.
            let mut payload = vec![0u8; 28];
            self.take(&mut payload)?;
            match raw_covered_of(len, &payload) {
                Some(covered) => {
                    self.consume(covered - 28, |b| payload.extend_from_slice(b))?;
                    let stored = self.take_vec(len - covered)?;
                    (payload, Some(stored))
                }
                None => {
                    self.consume(len - 28, |b| payload.extend_from_slice(b))?;
                    (payload, None)
                }
            }
        } else {
            let mut payload = Vec::with_capacity(len);
            self.consume(len, |b| payload.extend_from_slice(b))?;
            (payload, None)
        };
        let mut sum = [0u8; SUM_LEN];
        let at = self.bytes;
        self.take(&mut sum)?;
        // Version 3: a RAW record's checksum covers its pointer, not the
        // stored bytes after it (the pointer's psize of them); those are
        // checked against the pointer's own checksum when the row is
        // decoded (`Row::decode`), before anything is stored.
        let covered = if stored.is_some() {
            payload.len()
        } else if self.version >= 3 && head[0] == Kind::Raw as u8 {
            raw_covered(&payload).ok_or_else(|| bad(format!("short raw record at byte {at}")))?
        } else {
            payload.len()
        };
        if sum != sum16(&[&head, &payload[..covered]]) {
            return Err(bad(format!("record checksum mismatch at byte {at}")));
        }
        if self.version >= 3 {
            self.hash.update(&sum);
        }
        let kind = Kind::from_u8(head[0])
            .ok_or_else(|| bad(format!("unknown record kind {} at byte {at}", head[0])))?;
        if matches!(kind, Kind::SnapEnd | Kind::End) && before.is_none_or(|b| payload[..] != b[..])
        {
            return Err(bad(format!("stream checksum mismatch at byte {at}")));
        }
        if kind == Kind::End {
            self.ended = true;
        }
        Ok(Some((Record { kind, payload }, stored)))
    }

    /// The next record's kind without consuming it (read and verified now).
    pub fn peek(&mut self) -> Result<Option<Kind>> {
        if self.peeked.is_none() {
            self.peeked = self.read_record_split()?;
        }
        Ok(self.peeked.as_ref().map(|r| r.0.kind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::send::Row;
    use std::sync::Arc;

    /// A stream of `version` with one row of each kind a volume sends.
    fn sample_v(version: u32, flags: u32) -> Vec<u8> {
        let mut out = Vec::new();
        let mut w = Writer::with_version(&mut out, flags, version).unwrap();
        w.record(Kind::Begin, &[b"{}"]).unwrap();
        w.record(Kind::Data, &[&[7u8; 20]]).unwrap();
        let e = block::encode(
            &[9u8; 300],
            block::Compression::Off,
            block::ChecksumAlgo::Blake3,
        );
        let (k, raw) = Row::Raw {
            obj: 1,
            blk: 2,
            bp: Arc::new(e.embedded(5)),
        }
        .encode();
        w.record(k, &[&raw]).unwrap();
        w.checkpoint(Kind::SnapEnd).unwrap();
        w.checkpoint(Kind::End).unwrap();
        out
    }

    fn sample() -> Vec<u8> {
        sample_v(VERSION, 0)
    }

    /// Collects the buffers a writer hands over whole.
    struct Collect(Vec<u8>, usize);

    impl ChunkSink for Collect {
        fn put(&mut self, chunk: Vec<u8>) -> std::io::Result<Vec<u8>> {
            self.0.extend_from_slice(&chunk);
            self.1 += 1;
            Ok(chunk)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_sink_gets_the_same_stream_in_whole_buffers() {
        let mut sink = Collect(Vec::new(), 0);
        let mut out = Vec::new();
        {
            let mut a = Writer::to_sink(&mut sink, FLAG_RAW).unwrap();
            let mut b = Writer::new(&mut out, FLAG_RAW).unwrap();
            for w in [&mut a, &mut b] {
                w.record(Kind::Begin, &[b"{}"]).unwrap();
                // More than one buffer's worth of records.
                for i in 0..40u8 {
                    w.record(Kind::Data, &[&[i; 64 << 10]]).unwrap();
                }
                w.checkpoint(Kind::SnapEnd).unwrap();
                w.checkpoint(Kind::End).unwrap();
                w.flush().unwrap();
            }
        }
        assert_eq!(sink.0, out);
        assert!(sink.1 >= 3, "{} buffers", sink.1);
        let mut inp = &sink.0[..];
        let mut r = Reader::new(&mut inp).unwrap();
        let mut n = 0;
        while r.read_record().unwrap().is_some() {
            n += 1;
        }
        assert_eq!(n, 43);
    }

    /// Reads a stream as a receive does: rows decoded (a RAW row's stored
    /// bytes checked against its pointer) as they arrive.
    fn read_all(b: &[u8]) -> Result<Vec<Kind>> {
        let mut inp = b;
        let mut r = Reader::new(&mut inp)?;
        let mut kinds = Vec::new();
        while let Some(rec) = r.read_record()? {
            if rec.kind == Kind::Raw {
                Row::decode(rec.kind, &rec.payload)?;
            }
            kinds.push(rec.kind);
        }
        Ok(kinds)
    }

    /// This build writes version 3 (decision 0050); earlier versions are
    /// written on request (v1 plain, v2 flagged) and still read; unknown
    /// versions and flags, or flags on a v1 header, are refused.
    #[test]
    fn feature_flags_are_versioned() {
        let s = sample();
        assert_eq!(&s[8..12], &3u32.to_le_bytes());
        assert_eq!(&sample_v(2, 0)[8..12], &1u32.to_le_bytes());
        assert_eq!(&sample_v(2, FLAG_RAW)[8..12], &2u32.to_le_bytes());
        let head = |version: u32, flags: u32| {
            let mut h = Vec::new();
            h.extend_from_slice(MAGIC);
            h.extend_from_slice(&version.to_le_bytes());
            h.extend_from_slice(&flags.to_le_bytes());
            let sum = sum16(&[&h]);
            h.extend_from_slice(&sum);
            h
        };
        let mut out = Vec::new();
        // The writer batches its output: flush before looking at the header.
        Writer::with_version(&mut out, FLAG_RECURSIVE, 2)
            .unwrap()
            .flush()
            .unwrap();
        assert_eq!(out, head(2, FLAG_RECURSIVE));
        let mut ok = &out[..];
        assert_eq!(Reader::new(&mut ok).unwrap().flags, FLAG_RECURSIVE);
        let mut out = Vec::new();
        Writer::new(&mut out, FLAG_RAW).unwrap().flush().unwrap();
        assert_eq!(out, head(3, FLAG_RAW));
        for (v, f) in [(2, 1 << 7), (1, FLAG_RECURSIVE), (1, FLAG_RAW), (4, 0)] {
            let h = head(v, f);
            let mut inp = &h[..];
            let e = Reader::new(&mut inp).err().unwrap().to_string();
            assert!(e.contains("invalid send stream"), "{e}");
        }
    }

    /// Every flipped bit and every cut is refused, in each version this
    /// build reads; in version 3 a RAW row's stored bytes are refused by
    /// their pointer's checksum, the rest by the stream's own.
    #[test]
    fn round_trip_and_every_damage_is_refused() {
        for (version, flags) in [(1, 0), (2, FLAG_RAW), (3, 0), (3, FLAG_RAW)] {
            let s = sample_v(version, flags);
            assert_eq!(
                read_all(&s).unwrap(),
                vec![Kind::Begin, Kind::Data, Kind::Raw, Kind::SnapEnd, Kind::End]
            );
            for i in 0..s.len() {
                let mut bad = s.clone();
                bad[i] ^= 0x10;
                assert!(
                    read_all(&bad).is_err(),
                    "v{version}: flipped byte {i} accepted"
                );
            }
            for n in 0..s.len() {
                let e = read_all(&s[..n]).unwrap_err().to_string();
                assert!(e.contains("invalid send stream"), "{e}");
            }
        }
    }

    /// Version 3 checkpoints chain the record checksums: records dropped,
    /// repeated or swapped (each intact) fail the next checkpoint.
    #[test]
    fn reordered_records_fail_the_checkpoint() {
        let s = sample();
        // Record boundaries after the header: Begin (5+2+16), Data (5+20+16).
        let (b, d) = (32 + 23, 32 + 23 + 41);
        let mut swapped = s[..32].to_vec();
        swapped.extend_from_slice(&s[b..d]);
        swapped.extend_from_slice(&s[32..b]);
        swapped.extend_from_slice(&s[d..]);
        let mut dropped = s[..32].to_vec();
        dropped.extend_from_slice(&s[b..]);
        let mut twice = s[..d].to_vec();
        twice.extend_from_slice(&s[b..]);
        for bad in [swapped, dropped, twice] {
            let e = read_all(&bad).unwrap_err().to_string();
            assert!(e.contains("stream checksum mismatch"), "{e}");
        }
    }
}

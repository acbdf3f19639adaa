//! Transmission phase: read requests, run each on the blocking pool, send
//! replies through one writer task.
//!
//! ```text
//!  reader (this task) --spawn_blocking--> handler --Outgoing--> writer task --> socket
//!         \--------------- early error replies ----------------/
//! ```
//! The reader bounds the work in flight per connection by two semaphores
//! (request count, payload bytes); the permits travel with the reply and are
//! released once it has been written, so memory held by queued replies is
//! bounded too.

use std::fmt;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, warn};

use crate::handshake::Negotiated;
use crate::proto::*;
use crate::stats::{stats, ServerStats};
use crate::{BlockExport, ExportError, ReadChunk, ServerConfig, StatusExtent};

/// Why a session ended.
#[derive(Debug)]
pub(crate) enum End {
    /// `NBD_CMD_DISC`.
    Disconnect,
    /// The client closed the connection between requests.
    Eof,
    /// The server is shutting down.
    Shutdown,
    /// The client broke the protocol (hard disconnect).
    Protocol(String),
    /// Reading from or writing to the socket failed.
    Io(io::Error),
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::Disconnect => write!(f, "client disconnected (NBD_CMD_DISC)"),
            End::Eof => write!(f, "client closed the connection"),
            End::Shutdown => write!(f, "server shutdown"),
            End::Protocol(m) => write!(f, "protocol violation: {m}"),
            End::Io(e) => write!(f, "i/o error: {e}"),
        }
    }
}

/// How a successful READ is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadMode {
    /// Simple reply, holes expanded to zeros.
    Simple,
    /// Structured: one OFFSET_DATA / OFFSET_HOLE chunk per [`ReadChunk`].
    Structured,
    /// Structured with `NBD_CMD_FLAG_DF`: exactly one content chunk.
    DontFragment,
}

/// One complete reply to one request, written contiguously by the writer.
#[derive(Debug)]
pub(crate) enum Reply {
    /// Simple reply without payload (success, or any error when structured
    /// replies were not negotiated).
    Simple { handle: u64, error: u32 },
    /// Structured error chunk, final.
    Error {
        handle: u64,
        error: u32,
        message: String,
        offset: Option<u64>,
    },
    /// Structured `NBD_REPLY_TYPE_NONE`, final.
    Done { handle: u64 },
    /// Successful READ: `chunks` cover exactly `len` bytes, none empty.
    Read {
        handle: u64,
        offset: u64,
        len: u32,
        chunks: Vec<ReadChunk>,
        mode: ReadMode,
    },
    /// Successful BLOCK_STATUS: one encoded payload (id + descriptors) per context.
    BlockStatus { handle: u64, payloads: Vec<Vec<u8>> },
}

/// A reply plus the flow-control permits it holds until it is on the wire.
struct Outgoing {
    reply: Reply,
    _permits: Permits,
}

#[derive(Default)]
struct Permits {
    _slot: Option<OwnedSemaphorePermit>,
    _bytes: Option<OwnedSemaphorePermit>,
}

/// What every handler of one connection needs.
struct Session {
    export: Arc<dyn BlockExport>,
    structured: bool,
    contexts: Vec<(u32, String)>,
}

/// A failed request: errno, message, and the offset for `ERROR_OFFSET`.
struct Fail {
    errno: u32,
    message: String,
    offset: Option<u64>,
}

impl Fail {
    fn new(errno: u32, message: impl Into<String>) -> Fail {
        Fail {
            errno,
            message: message.into(),
            offset: None,
        }
    }
    /// An error from the export while working on a request at `offset`.
    fn export(e: ExportError, offset: u64, len: u64) -> Fail {
        Fail {
            errno: errno_of(&e),
            message: e.to_string(),
            offset: (len > 0).then_some(offset),
        }
    }
}

fn error_reply(structured: bool, handle: u64, f: Fail) -> Reply {
    ServerStats::add(&stats().errors, 1);
    if structured {
        Reply::Error {
            handle,
            error: f.errno,
            message: f.message,
            offset: f.offset,
        }
    } else {
        Reply::Simple {
            handle,
            error: f.errno,
        }
    }
}

/// Runs the transmission phase until the client disconnects, breaks the
/// protocol, or the server shuts down; all replies for requests already
/// read are sent before this returns.
pub(crate) async fn run<R, W>(
    mut rd: R,
    wr: W,
    neg: Negotiated,
    mut shutdown: watch::Receiver<bool>,
    cfg: &ServerConfig,
) -> End
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let session = Arc::new(Session {
        export: neg.export,
        structured: neg.structured,
        contexts: neg.contexts,
    });
    let slots = Arc::new(Semaphore::new(cfg.max_in_flight.max(1)));
    let budget = cfg.max_in_flight_bytes.max(MAX_PAYLOAD as usize);
    let bytes = Arc::new(Semaphore::new(budget));
    let (tx, rx) = mpsc::channel::<Outgoing>(cfg.max_in_flight.max(1) + 16);
    let writer = tokio::spawn(writer_task(wr, rx));
    let st = stats();

    let end = loop {
        // ---- request header
        let mut hdr = [0u8; Request::SIZE];
        let n = tokio::select! {
            biased;
            r = read_full(&mut rd, &mut hdr) => match r {
                Ok(n) => n,
                Err(e) => break End::Io(e),
            },
            _ = crate::server::shutdown_requested(&mut shutdown) => break End::Shutdown,
            _ = tx.closed() => break End::Io(io::Error::new(io::ErrorKind::BrokenPipe, "reply writer stopped")),
        };
        if n == 0 {
            break End::Eof;
        }
        if n < hdr.len() {
            break End::Protocol(format!(
                "truncated request header ({n} of {} bytes)",
                hdr.len()
            ));
        }
        let req = match Request::parse(&hdr) {
            Ok(r) => r,
            Err(magic) => break End::Protocol(format!("bad request magic {magic:#010x}")),
        };
        st.count_request(req.command);
        let structured = session.structured;
        let early = |f: Fail| Outgoing {
            reply: error_reply(structured, req.handle, f),
            _permits: Permits::default(),
        };

        // ---- checks that need no export call
        match req.command {
            Command::Disc => break End::Disconnect,
            Command::Unknown(t) => {
                if tx
                    .send(early(Fail::new(EINVAL, format!("unknown command {t}"))))
                    .await
                    .is_err()
                {
                    break End::Io(io::ErrorKind::BrokenPipe.into());
                }
                continue;
            }
            Command::Write if req.len > MAX_PAYLOAD => {
                // The payload cannot be skipped safely: answer, then hard disconnect.
                let msg = format!(
                    "write of {} bytes exceeds the maximum payload {MAX_PAYLOAD}",
                    req.len
                );
                let _ = tx.send(early(Fail::new(EINVAL, msg.clone()))).await;
                break End::Protocol(msg);
            }
            Command::Read if req.len > MAX_PAYLOAD => {
                let errno = if structured { EOVERFLOW } else { EINVAL };
                let msg = format!(
                    "read of {} bytes exceeds the maximum payload {MAX_PAYLOAD}",
                    req.len
                );
                if tx.send(early(Fail::new(errno, msg))).await.is_err() {
                    break End::Io(io::ErrorKind::BrokenPipe.into());
                }
                continue;
            }
            _ => {}
        }

        // ---- flow control, then the payload
        let slot = match slots.clone().acquire_owned().await {
            Ok(p) => p,
            Err(_) => break End::Shutdown,
        };
        let cost = match req.command {
            Command::Read | Command::Write => req.len,
            _ => 0,
        };
        let byte_permit = if cost > 0 {
            match bytes.clone().acquire_many_owned(cost).await {
                Ok(p) => Some(p),
                Err(_) => break End::Shutdown,
            }
        } else {
            None
        };
        let payload = if req.command == Command::Write {
            match read_payload(&mut rd, req.len as usize).await {
                Ok(p) => p,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    break End::Protocol(format!(
                        "truncated WRITE payload (expected {} bytes)",
                        req.len
                    ))
                }
                Err(e) => break End::Io(e),
            }
        } else {
            Vec::new()
        };
        let permits = Permits {
            _slot: Some(slot),
            _bytes: byte_permit,
        };

        let bad = req.flags & !req.command.allowed_flags(structured);
        if bad != 0 {
            let f = Fail::new(
                EINVAL,
                format!("flags {bad:#x} are not valid for {}", req.command.name()),
            );
            if tx
                .send(Outgoing {
                    reply: error_reply(structured, req.handle, f),
                    _permits: permits,
                })
                .await
                .is_err()
            {
                break End::Io(io::ErrorKind::BrokenPipe.into());
            }
            continue;
        }

        // ---- run it on the blocking pool
        let s = session.clone();
        let tx2 = tx.clone();
        tokio::task::spawn_blocking(move || {
            let reply = match catch_unwind(AssertUnwindSafe(|| execute(&s, &req, payload))) {
                Ok(r) => r,
                Err(_) => {
                    tracing::error!(
                        command = req.command.name(),
                        offset = req.offset,
                        len = req.len,
                        "export panicked"
                    );
                    error_reply(s.structured, req.handle, Fail::new(EIO, "internal error"))
                }
            };
            // Fails only when the writer is gone (connection lost).
            let _ = tx2.blocking_send(Outgoing {
                reply,
                _permits: permits,
            });
        });
    };

    // Every handler holds a sender: the writer ends once all replies are out.
    drop(tx);
    match writer.await {
        Ok(Ok(())) => end,
        Ok(Err(e)) => match end {
            End::Disconnect | End::Eof | End::Shutdown => End::Io(e),
            other => other,
        },
        Err(e) => End::Io(io::Error::other(e)),
    }
}

/// Reads until `buf` is full or EOF; returns how many bytes were read.
async fn read_full<R: AsyncRead + Unpin>(rd: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        let n = rd.read(&mut buf[filled..]).await?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(filled)
}

/// Reads exactly `len` payload bytes without zero-filling the buffer first.
async fn read_payload<R: AsyncRead + Unpin>(rd: &mut R, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(len);
    let mut take = rd.take(len as u64);
    while buf.len() < len {
        if take.read_buf(&mut buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(buf)
}

fn in_range(offset: u64, len: u64, size: u64) -> bool {
    offset.checked_add(len).is_some_and(|end| end <= size)
}

/// Executes one request against the export (on the blocking pool).
fn execute(s: &Session, req: &Request, payload: Vec<u8>) -> Reply {
    let h = req.handle;
    match execute_inner(s, req, payload) {
        Ok(r) => r,
        Err(f) => {
            debug!(command = req.command.name(), offset = req.offset, len = req.len, errno = f.errno,
                message = %f.message, "request failed");
            error_reply(s.structured, h, f)
        }
    }
}

fn execute_inner(s: &Session, req: &Request, payload: Vec<u8>) -> Result<Reply, Fail> {
    let e = &*s.export;
    let (h, off, len) = (req.handle, req.offset, u64::from(req.len));
    let fua = req.flags & CMD_FLAG_FUA != 0;
    let ok = Reply::Simple {
        handle: h,
        error: 0,
    };
    let check = |errno: u32, what: &str| -> Result<(), Fail> {
        let size = e.size();
        if in_range(off, len, size) {
            Ok(())
        } else {
            Err(Fail::new(
                errno,
                format!("{what} of {len} bytes at offset {off} is beyond the export size {size}"),
            ))
        }
    };
    let writable = |what: &str| -> Result<(), Fail> {
        if e.read_only() {
            Err(Fail::new(EPERM, format!("{what} on a read-only export")))
        } else {
            Ok(())
        }
    };
    match req.command {
        Command::Read => {
            check(EINVAL, "read")?;
            let mode = if !s.structured {
                ReadMode::Simple
            } else if req.flags & CMD_FLAG_DF != 0 {
                ReadMode::DontFragment
            } else {
                ReadMode::Structured
            };
            if len == 0 {
                return Ok(if s.structured {
                    Reply::Done { handle: h }
                } else {
                    ok
                });
            }
            let chunks = e.read(off, len).map_err(|x| Fail::export(x, off, len))?;
            let chunks = normalize_read(chunks, len).map_err(|m| Fail {
                errno: EIO,
                message: m,
                offset: Some(off),
            })?;
            ServerStats::add(&stats().bytes_read, len);
            Ok(Reply::Read {
                handle: h,
                offset: off,
                len: req.len,
                chunks,
                mode,
            })
        }
        Command::Write => {
            writable("write")?;
            check(ENOSPC, "write")?;
            if len > 0 {
                e.write(off, &payload, fua)
                    .map_err(|x| Fail::export(x, off, len))?;
                ServerStats::add(&stats().bytes_written, len);
            }
            Ok(ok)
        }
        Command::Flush => {
            e.flush().map_err(|x| Fail::export(x, 0, 0))?;
            Ok(ok)
        }
        Command::Trim => {
            writable("trim")?;
            check(EINVAL, "trim")?;
            if len > 0 {
                e.trim(off, len, fua)
                    .map_err(|x| Fail::export(x, off, len))?;
            }
            Ok(ok)
        }
        Command::WriteZeroes => {
            writable("write zeroes")?;
            check(ENOSPC, "write zeroes")?;
            // NBD_CMD_FLAG_FAST_ZERO: zeroing is never slower than writing
            // here, so it is simply carried out.
            let allocate = req.flags & CMD_FLAG_NO_HOLE != 0;
            if len > 0 {
                e.write_zeroes(off, len, allocate, fua)
                    .map_err(|x| Fail::export(x, off, len))?;
            }
            Ok(ok)
        }
        Command::Cache => {
            check(EINVAL, "cache")?;
            Ok(ok)
        }
        Command::BlockStatus => {
            if s.contexts.is_empty() {
                return Err(Fail::new(EINVAL, "no metadata context was negotiated"));
            }
            if len == 0 {
                return Err(Fail::new(EINVAL, "block status of 0 bytes"));
            }
            check(EINVAL, "block status")?;
            let req_one = req.flags & CMD_FLAG_REQ_ONE != 0;
            let mut payloads = Vec::with_capacity(s.contexts.len());
            for (id, name) in &s.contexts {
                let ext = e
                    .block_status(name, off, len)
                    .map_err(|x| Fail::export(x, off, len))?;
                payloads.push(encode_extents(*id, &ext, req.len, req_one));
            }
            Ok(Reply::BlockStatus {
                handle: h,
                payloads,
            })
        }
        Command::Disc | Command::Unknown(_) => Err(Fail::new(EINVAL, "unexpected command")),
    }
}

/// Checks that the export's chunks cover exactly `len` bytes; drops empty ones.
fn normalize_read(chunks: Vec<ReadChunk>, len: u64) -> Result<Vec<ReadChunk>, String> {
    let total: u64 = chunks
        .iter()
        .map(|c| match c {
            ReadChunk::Data(d) => d.len() as u64,
            ReadChunk::Hole(n) => *n,
        })
        .fold(0u64, |a, b| a.saturating_add(b));
    if total != len {
        return Err(format!("export returned {total} bytes for a read of {len}"));
    }
    Ok(chunks
        .into_iter()
        .filter(|c| match c {
            ReadChunk::Data(d) => !d.is_empty(),
            ReadChunk::Hole(n) => *n > 0,
        })
        .collect())
}

/// Encodes one `NBD_REPLY_TYPE_BLOCK_STATUS` payload: the export's extents
/// clipped to the request, zero-length ones dropped, equal neighbours
/// merged, long ones split to fit `u32`, at most [`MAX_EXTENTS`] (one with
/// `req_one`). An empty answer becomes one extent of status 0 (always safe).
pub(crate) fn encode_extents(
    id: u32,
    extents: &[StatusExtent],
    len: u32,
    req_one: bool,
) -> Vec<u8> {
    let mut merged: Vec<(u64, u32)> = Vec::new();
    let mut left = u64::from(len);
    for x in extents {
        if left == 0 {
            break;
        }
        let l = x.len.min(left);
        if l == 0 {
            continue;
        }
        match merged.last_mut() {
            Some(last) if last.1 == x.flags => last.0 += l,
            _ => merged.push((l, x.flags)),
        }
        left -= l;
    }
    if merged.is_empty() {
        merged.push((u64::from(len), 0));
    }
    let max = if req_one { 1 } else { MAX_EXTENTS };
    let mut out = Vec::with_capacity(4 + 8 * merged.len().min(max));
    out.extend_from_slice(&id.to_be_bytes());
    let mut count = 0;
    'outer: for (mut l, flags) in merged {
        while l > 0 {
            if count == max {
                break 'outer;
            }
            let piece = l.min(MAX_EXTENT_LEN);
            out.extend_from_slice(&(piece as u32).to_be_bytes());
            out.extend_from_slice(&flags.to_be_bytes());
            l -= piece;
            count += 1;
        }
    }
    out
}

// ---------------------------------------------------------------- writer

static ZEROS: [u8; 64 * 1024] = [0u8; 64 * 1024];

async fn write_zeros<W: AsyncWrite + Unpin>(w: &mut W, mut n: u64) -> io::Result<()> {
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        w.write_all(&ZEROS[..k]).await?;
        n -= k as u64;
    }
    Ok(())
}

async fn write_pieces<W: AsyncWrite + Unpin>(w: &mut W, chunks: &[ReadChunk]) -> io::Result<()> {
    for c in chunks {
        match c {
            ReadChunk::Data(d) => w.write_all(d).await?,
            ReadChunk::Hole(n) => write_zeros(w, *n).await?,
        }
    }
    Ok(())
}

/// Writes one reply (all its chunks) into `w`.
pub(crate) async fn write_reply<W: AsyncWrite + Unpin>(w: &mut W, r: &Reply) -> io::Result<()> {
    match r {
        Reply::Simple { handle, error } => w.write_all(&simple_reply_header(*error, *handle)).await,
        Reply::Error {
            handle,
            error,
            message,
            offset,
        } => {
            let p = error_payload(*error, message, *offset);
            let ty = if offset.is_some() {
                REPLY_TYPE_ERROR_OFFSET
            } else {
                REPLY_TYPE_ERROR
            };
            w.write_all(&structured_header(
                REPLY_FLAG_DONE,
                ty,
                *handle,
                p.len() as u32,
            ))
            .await?;
            w.write_all(&p).await
        }
        Reply::Done { handle } => {
            w.write_all(&structured_header(
                REPLY_FLAG_DONE,
                REPLY_TYPE_NONE,
                *handle,
                0,
            ))
            .await
        }
        Reply::Read {
            handle,
            offset,
            len,
            chunks,
            mode,
        } => match mode {
            ReadMode::Simple => {
                w.write_all(&simple_reply_header(0, *handle)).await?;
                write_pieces(w, chunks).await
            }
            ReadMode::DontFragment if !matches!(chunks.as_slice(), [ReadChunk::Hole(_)]) => {
                w.write_all(&structured_header(
                    REPLY_FLAG_DONE,
                    REPLY_TYPE_OFFSET_DATA,
                    *handle,
                    8 + *len,
                ))
                .await?;
                w.write_all(&offset.to_be_bytes()).await?;
                write_pieces(w, chunks).await
            }
            _ => {
                let mut at = *offset;
                let last = chunks.len().saturating_sub(1);
                for (i, c) in chunks.iter().enumerate() {
                    let flags = if i == last { REPLY_FLAG_DONE } else { 0 };
                    match c {
                        ReadChunk::Data(d) => {
                            let hdr = structured_header(
                                flags,
                                REPLY_TYPE_OFFSET_DATA,
                                *handle,
                                8 + d.len() as u32,
                            );
                            w.write_all(&hdr).await?;
                            w.write_all(&at.to_be_bytes()).await?;
                            w.write_all(d).await?;
                            at += d.len() as u64;
                        }
                        ReadChunk::Hole(n) => {
                            w.write_all(&structured_header(
                                flags,
                                REPLY_TYPE_OFFSET_HOLE,
                                *handle,
                                12,
                            ))
                            .await?;
                            w.write_all(&at.to_be_bytes()).await?;
                            w.write_all(&(*n as u32).to_be_bytes()).await?;
                            at += *n;
                        }
                    }
                }
                Ok(())
            }
        },
        Reply::BlockStatus { handle, payloads } => {
            let last = payloads.len().saturating_sub(1);
            for (i, p) in payloads.iter().enumerate() {
                let flags = if i == last { REPLY_FLAG_DONE } else { 0 };
                w.write_all(&structured_header(
                    flags,
                    REPLY_TYPE_BLOCK_STATUS,
                    *handle,
                    p.len() as u32,
                ))
                .await?;
                w.write_all(p).await?;
            }
            Ok(())
        }
    }
}

/// The single writer of a connection: writes replies as they come, flushing
/// whenever the queue runs empty (so bursts share a syscall). Ends when every
/// sender is gone, after flushing and shutting down the write side.
async fn writer_task<W: AsyncWrite + Unpin>(
    mut w: W,
    mut rx: mpsc::Receiver<Outgoing>,
) -> io::Result<()> {
    while let Some(first) = rx.recv().await {
        write_reply(&mut w, &first.reply).await?;
        drop(first);
        while let Ok(next) = rx.try_recv() {
            write_reply(&mut w, &next.reply).await?;
        }
        w.flush().await?;
    }
    w.flush().await?;
    let _ = w.shutdown().await;
    Ok(())
}

/// Logs the end of a session (warn for protocol violations).
pub(crate) fn log_end(peer: std::net::SocketAddr, export: &str, end: &End) {
    match end {
        End::Protocol(m) => {
            ServerStats::add(&stats().protocol_errors, 1);
            warn!(%peer, export, "protocol error, closing connection: {m}");
        }
        End::Io(e) => debug!(%peer, export, "connection ended: {e}"),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(p: &[u8]) -> (u32, Vec<(u32, u32)>) {
        let id = u32::from_be_bytes([p[0], p[1], p[2], p[3]]);
        let d = p[4..]
            .chunks(8)
            .map(|c| {
                (
                    u32::from_be_bytes([c[0], c[1], c[2], c[3]]),
                    u32::from_be_bytes([c[4], c[5], c[6], c[7]]),
                )
            })
            .collect();
        (id, d)
    }

    #[test]
    fn extents_clip_merge_split() {
        let x = |len, flags| StatusExtent { len, flags };
        // merge equal neighbours, drop empties, clip to the request
        let p = encode_extents(
            3,
            &[x(512, 0), x(0, 1), x(512, 0), x(4096, 3), x(1 << 40, 0)],
            2048,
            false,
        );
        assert_eq!(decode(&p), (3, vec![(1024, 0), (1024, 3)]));
        // REQ_ONE: one extent, within the request
        let p = encode_extents(1, &[x(512, 0), x(512, 3)], 4096, true);
        assert_eq!(decode(&p), (1, vec![(512, 0)]));
        // empty answer -> one extent of status 0
        let p = encode_extents(1, &[], 100, false);
        assert_eq!(decode(&p), (1, vec![(100, 0)]));
        // an extent over u32 is split
        let p = encode_extents(1, &[x(u64::MAX, 3)], u32::MAX, false);
        let (_, d) = decode(&p);
        assert_eq!(
            d.iter().map(|e| u64::from(e.0)).sum::<u64>(),
            u64::from(u32::MAX)
        );
        assert!(d
            .iter()
            .all(|e| e.1 == 3 && u64::from(e.0) <= MAX_EXTENT_LEN));
    }

    #[test]
    fn read_normalization() {
        assert!(normalize_read(vec![ReadChunk::Data(vec![1; 10])], 11).is_err());
        let v = normalize_read(
            vec![
                ReadChunk::Data(vec![]),
                ReadChunk::Hole(5),
                ReadChunk::Hole(0),
            ],
            5,
        )
        .unwrap();
        assert_eq!(v, vec![ReadChunk::Hole(5)]);
        assert!(normalize_read(vec![ReadChunk::Hole(u64::MAX), ReadChunk::Hole(2)], 1).is_err());
    }
}

//! The single reply writer of a connection.
//!
//! Whoever finishes a request (a blocking-pool thread, or the reader task
//! for early errors) calls [`Sink::send`], which under one mutex encodes the
//! reply as an `iovec` list (headers, then the payload slices as they are:
//! no copy) and writes it with one non-blocking `writev`. That needs no
//! thread hand-off in the common case. When the socket is full, the reply
//! itself is queued (its shared payload slices by reference, not copied:
//! a copy of every 1 MiB reply that met a full socket was a quarter of a
//! cached read's CPU) with how much of it was written, and the
//! connection's drain task writes the rest as the socket becomes writable;
//! later replies queue behind it, so every reply stays contiguous and in
//! completion order. The drain's `writev` runs outside the mutex (decision
//! 0070): the thread that finishes the next reply queues it instead of
//! sleeping on the lock while the kernel copies.
//!
//! Over TLS ([`Wire::Tls`], decision 0043) the same thread seals the reply
//! into TLS records straight from those slices (rustls under the
//! connection's mutex: no gathering copy, no hand-off) and writes the
//! records with one non-blocking `writev`; what the socket does not take
//! stays queued in rustls for the drain task.
//!
//! Flow control: the permits of a queued reply are released only once its
//! bytes are on the wire, so a client that stops reading stops the reader
//! (see `transmission`), and memory stays bounded.

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{watch, Notify, OwnedSemaphorePermit};

use crate::proto::*;
use crate::ReadChunk;

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

/// One complete reply to one request, written contiguously.
#[derive(Debug, Clone)]
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

/// Flow-control permits a request holds until its reply is on the wire.
#[derive(Default)]
pub(crate) struct Permits {
    pub _slot: Option<OwnedSemaphorePermit>,
    /// Payload bytes: the connection's budget and the daemon-wide one.
    pub bytes: Option<OwnedSemaphorePermit>,
    pub global: Option<OwnedSemaphorePermit>,
}

impl Permits {
    /// Gives the payload bytes back early (a WRITE's payload is freed once
    /// it ran; only its slot waits for the reply).
    pub(crate) fn release_bytes(&mut self) {
        self.bytes = None;
        self.global = None;
    }
}

static ZEROS: [u8; 64 * 1024] = [0u8; 64 * 1024];

/// Pieces of an encoded reply: ranges of a header buffer, borrowed payload
/// slices, and runs of zeros.
enum Part<'a> {
    Head(usize, usize),
    Bytes(&'a [u8]),
    Zeros(u64),
}

struct Encoder<'a> {
    head: Vec<u8>,
    parts: Vec<Part<'a>>,
}

impl<'a> Encoder<'a> {
    fn new() -> Self {
        Encoder {
            head: Vec::with_capacity(64),
            parts: Vec::with_capacity(4),
        }
    }
    fn head(&mut self, b: &[u8]) {
        let start = self.head.len();
        self.head.extend_from_slice(b);
        let end = self.head.len();
        match self.parts.last_mut() {
            Some(Part::Head(_, e)) if *e == start => *e = end,
            _ => self.parts.push(Part::Head(start, end)),
        }
    }
    fn bytes(&mut self, b: &'a [u8]) {
        if !b.is_empty() {
            self.parts.push(Part::Bytes(b));
        }
    }
    fn content(&mut self, chunks: &'a [ReadChunk]) {
        for c in chunks {
            match c {
                ReadChunk::Hole(n) => self.parts.push(Part::Zeros(*n)),
                // normalize_read checked shared ranges.
                c => self.bytes(c.data().unwrap_or_default()),
            }
        }
    }

    fn encode(&mut self, r: &'a Reply) {
        match r {
            Reply::Simple { handle, error } => self.head(&simple_reply_header(*error, *handle)),
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
                self.head(&structured_header(
                    REPLY_FLAG_DONE,
                    ty,
                    *handle,
                    p.len() as u32,
                ));
                self.head(&p);
            }
            Reply::Done { handle } => self.head(&structured_header(
                REPLY_FLAG_DONE,
                REPLY_TYPE_NONE,
                *handle,
                0,
            )),
            Reply::Read {
                handle,
                offset,
                len,
                chunks,
                mode,
            } => match mode {
                ReadMode::Simple => {
                    self.head(&simple_reply_header(0, *handle));
                    self.content(chunks);
                }
                ReadMode::DontFragment if !matches!(chunks.as_slice(), [ReadChunk::Hole(_)]) => {
                    self.head(&structured_header(
                        REPLY_FLAG_DONE,
                        REPLY_TYPE_OFFSET_DATA,
                        *handle,
                        8 + *len,
                    ));
                    self.head(&offset.to_be_bytes());
                    self.content(chunks);
                }
                _ => {
                    // One OFFSET_DATA chunk per run of data chunks (an
                    // export may return one per cached block), one
                    // OFFSET_HOLE chunk per hole.
                    let mut at = *offset;
                    let mut i = 0;
                    while i < chunks.len() {
                        if let ReadChunk::Hole(n) = chunks[i] {
                            let flags = if i + 1 == chunks.len() {
                                REPLY_FLAG_DONE
                            } else {
                                0
                            };
                            self.head(&structured_header(
                                flags,
                                REPLY_TYPE_OFFSET_HOLE,
                                *handle,
                                12,
                            ));
                            self.head(&at.to_be_bytes());
                            self.head(&(n as u32).to_be_bytes());
                            at += n;
                            i += 1;
                            continue;
                        }
                        let run = chunks[i..]
                            .iter()
                            .take_while(|c| !matches!(c, ReadChunk::Hole(_)))
                            .count();
                        let bytes: u64 = chunks[i..i + run].iter().map(ReadChunk::len).sum();
                        let flags = if i + run == chunks.len() {
                            REPLY_FLAG_DONE
                        } else {
                            0
                        };
                        self.head(&structured_header(
                            flags,
                            REPLY_TYPE_OFFSET_DATA,
                            *handle,
                            8 + bytes as u32,
                        ));
                        self.head(&at.to_be_bytes());
                        self.content(&chunks[i..i + run]);
                        at += bytes;
                        i += run;
                    }
                }
            },
            Reply::BlockStatus { handle, payloads } => {
                let last = payloads.len().saturating_sub(1);
                for (i, p) in payloads.iter().enumerate() {
                    let flags = if i == last { REPLY_FLAG_DONE } else { 0 };
                    self.head(&structured_header(
                        flags,
                        REPLY_TYPE_BLOCK_STATUS,
                        *handle,
                        p.len() as u32,
                    ));
                    self.bytes(p);
                }
            }
        }
    }

    /// Bytes of the encoded reply.
    fn len(&self) -> usize {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Head(s, e) => e - s,
                Part::Bytes(b) => b.len(),
                Part::Zeros(n) => *n as usize,
            })
            .sum()
    }

    fn slices(&self) -> Vec<IoSlice<'_>> {
        let mut v = Vec::with_capacity(self.parts.len() + 1);
        self.slices_into(&mut v);
        v
    }

    fn slices_into<'s>(&'s self, v: &mut Vec<IoSlice<'s>>) {
        for p in &self.parts {
            match p {
                Part::Head(s, e) => v.push(IoSlice::new(&self.head[*s..*e])),
                Part::Bytes(b) => v.push(IoSlice::new(b)),
                Part::Zeros(n) => {
                    let mut n = *n;
                    while n > 0 {
                        let k = n.min(ZEROS.len() as u64) as usize;
                        v.push(IoSlice::new(&ZEROS[..k]));
                        n -= k as u64;
                    }
                }
            }
        }
    }
}

/// A reply the socket did not take whole: sent from `reply` again (its
/// encoding is deterministic), `written` bytes of it are on the wire.
struct Queued {
    reply: Reply,
    written: usize,
    len: usize,
    /// Released once the reply is on the wire.
    _permits: Permits,
}

/// Most iovecs the drain hands one writev (IOV_MAX is 1024).
const DRAIN_IOVECS: usize = 512;

/// Encodes a reply into one contiguous byte vector (tests and the fuzzer).
pub(crate) fn encode_to_vec(r: &Reply) -> Vec<u8> {
    let mut e = Encoder::new();
    e.encode(r);
    e.slices().iter().flat_map(|s| s.iter().copied()).collect()
}

#[derive(Default)]
struct State {
    /// Replies the socket did not take yet, in order (plain TCP).
    pending: std::collections::VecDeque<Queued>,
    /// Bytes of `pending` still to go.
    pending_bytes: usize,
    /// TLS wire: permits of the replies queued in rustls.
    held: Vec<Permits>,
    /// The drain task owns `pending` (the socket was full).
    draining: bool,
    /// No more replies will come: the drain task exits when done.
    closing: bool,
    /// The socket failed; further replies are dropped.
    failed: bool,
    /// While draining: when the socket last took bytes (or draining began).
    progress: Option<Instant>,
    /// TLS wire: reply bytes (plaintext) queued in rustls as records the
    /// socket did not take yet.
    queued: usize,
}

/// Where replies go, written from whichever thread finished the request: a
/// plain TCP socket (non-blocking writev), or a TLS connection (sealed into
/// records there, then the same).
pub(crate) enum Wire {
    Tcp(OwnedWriteHalf),
    Tls(Arc<tls::SharedTls>),
}

/// How long a closing TLS connection tries to deliver its `close_notify`.
const CLOSE_NOTIFY_TIMEOUT: Duration = Duration::from_secs(1);

pub(crate) struct Sink {
    sock: Wire,
    peer: Option<SocketAddr>,
    state: Mutex<State>,
    wake: Notify,
    /// Set to `true` when writing fails, so the reader can stop.
    broken: watch::Sender<bool>,
}

impl Sink {
    /// A sink over `sock`, its drain task, and a receiver that turns `true`
    /// if the socket breaks.
    pub(crate) fn start(
        sock: Wire,
        peer: Option<SocketAddr>,
    ) -> (
        Arc<Sink>,
        tokio::task::JoinHandle<io::Result<()>>,
        watch::Receiver<bool>,
    ) {
        let (broken, broken_rx) = watch::channel(false);
        let sink = Arc::new(Sink {
            sock,
            peer,
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            broken,
        });
        let task = tokio::spawn(drain(sink.clone()));
        (sink, task, broken_rx)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave `State` inconsistent
        // in a way that matters more than losing the connection.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fail(&self, st: &mut State, e: &io::Error) {
        if !st.failed {
            tracing::debug!("reply write failed: {e}");
        }
        st.failed = true;
        st.pending.clear();
        st.pending_bytes = 0;
        st.held.clear();
        st.draining = false;
        self.broken.send_replace(true);
        self.wake.notify_one();
    }

    /// Sends one reply (never blocks on the network). `permits` are
    /// released once the reply is fully on the wire (or dropped if the
    /// connection is broken).
    pub(crate) fn send(&self, reply: Reply, permits: Permits) {
        let mut enc = Encoder::new();
        enc.encode(&reply);
        let mut slices = enc.slices();
        let mut st = self.lock();
        if st.failed {
            return;
        }
        let total: usize = slices.iter().map(|b| b.len()).sum();
        let mut bufs: &mut [IoSlice<'_>] = &mut slices[..];
        if let Wire::Tls(conn) = &self.sock {
            match conn.send(bufs) {
                Err(e) => self.fail(&mut st, &e),
                // Everything queued so far is on the wire.
                Ok(true) => {
                    st.held.clear();
                    st.queued = 0;
                }
                Ok(false) => {
                    st.held.push(permits);
                    st.queued += total;
                    if !st.draining {
                        st.draining = true;
                        st.progress = Some(Instant::now());
                        self.wake.notify_one();
                    }
                }
            }
            return;
        }
        if let (false, Wire::Tcp(sock)) = (st.draining, &self.sock) {
            while !bufs.is_empty() {
                match sock.try_write_vectored(bufs) {
                    Ok(0) => {
                        self.fail(&mut st, &io::ErrorKind::WriteZero.into());
                        return;
                    }
                    Ok(n) => IoSlice::advance_slices(&mut bufs, n),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        self.fail(&mut st, &e);
                        return;
                    }
                }
            }
        }
        // Socket full (or already backed up): queue the reply itself, in
        // order (its payload slices are the shared buffers, not copies).
        let left: usize = bufs.iter().map(|b| b.len()).sum();
        drop(slices);
        drop(enc);
        if left == 0 {
            return;
        }
        self.enqueue(&mut st, reply, total - left, total, permits);
    }

    /// Queues a reply for the drain task without writing it now: the caller
    /// is about to answer more requests the client already sent, and the
    /// drain writes their replies together in one `writev` (decision 0074:
    /// one 1 MiB `writev` per reply cost the daemon and the client more CPU
    /// per byte than a few replies per call). Same order, flow control and
    /// failure handling as a reply that met a full socket.
    pub(crate) fn queue(&self, reply: Reply, permits: Permits) {
        if self.is_tls() {
            // Sealing happens in `send`; TLS replies are not batched here.
            return self.send(reply, permits);
        }
        let total = {
            let mut enc = Encoder::new();
            enc.encode(&reply);
            enc.len()
        };
        let mut st = self.lock();
        if st.failed || total == 0 {
            return;
        }
        self.enqueue(&mut st, reply, 0, total, permits);
    }

    /// Puts `reply` (`written` of its `total` bytes on the wire) behind the
    /// queued ones and hands the queue to the drain task.
    fn enqueue(
        &self,
        st: &mut State,
        reply: Reply,
        written: usize,
        total: usize,
        permits: Permits,
    ) {
        st.pending.push_back(Queued {
            reply,
            written,
            len: total,
            _permits: permits,
        });
        st.pending_bytes += total - written;
        if !st.draining {
            st.draining = true;
            st.progress = Some(Instant::now());
            self.wake.notify_one();
        }
    }

    /// Replies are sealed into TLS records by the thread that sends them.
    pub(crate) fn is_tls(&self) -> bool {
        matches!(self.sock, Wire::Tls(_))
    }

    pub(crate) fn peer(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// Reply bytes queued behind a socket that took nothing for `d`.
    pub(crate) fn stalled_for(&self, d: Duration) -> Option<usize> {
        let st = self.lock();
        let stalled = st.draining && !st.failed && st.progress.is_some_and(|t| t.elapsed() >= d);
        stalled.then(|| st.pending_bytes + st.queued)
    }

    /// Drops every queued reply and its permits, and ends the connection.
    pub(crate) fn abort(&self) {
        let mut st = self.lock();
        self.fail(&mut st, &io::Error::other("connection evicted"));
    }

    /// No more replies will be sent; the drain task ends once the pending
    /// bytes are written.
    pub(crate) fn close(&self) {
        self.lock().closing = true;
        self.wake.notify_one();
    }
}

/// Writes `pending` out whenever the socket was full.
async fn drain(sink: Arc<Sink>) -> io::Result<()> {
    let sock = match &sink.sock {
        Wire::Tcp(s) => s,
        Wire::Tls(conn) => {
            let r = drain_tls(&sink, conn).await;
            if r.is_ok() {
                // close_notify; a client that is gone does not matter. The
                // FIN follows when the connection's last owner drops it.
                conn.close_notify();
                let _ = tokio::time::timeout(CLOSE_NOTIFY_TIMEOUT, async {
                    while let Ok((_, false)) = conn.try_flush() {
                        if conn.writable().await.is_err() {
                            break;
                        }
                    }
                })
                .await;
            }
            return r;
        }
    };
    let mut broken = sink.broken.subscribe();
    loop {
        // Wait for work (or the end).
        loop {
            {
                let st = sink.lock();
                if st.failed {
                    return Err(io::ErrorKind::BrokenPipe.into());
                }
                if st.draining {
                    break;
                }
                if st.closing {
                    return Ok(());
                }
            }
            sink.wake.notified().await;
        }
        // Drain. The replies are taken out of the state for the writev, so
        // the mutex is not held while the kernel copies them: a reply
        // finished meanwhile (the reader answers cached READs itself) is
        // queued behind them instead of waiting for the lock (a futex sleep
        // and wake-up per request, decision 0070). While the drain waits
        // for the socket, they are back in the state, where `abort` drops
        // them with their permits.
        let mut batch = std::collections::VecDeque::new();
        loop {
            let ready = tokio::select! {
                r = sock.writable() => r,
                _ = broken.wait_for(|b| *b) => Err(io::ErrorKind::BrokenPipe.into()),
            };
            if let Err(e) = ready {
                let mut st = sink.lock();
                sink.fail(&mut st, &e);
                return Err(e);
            }
            {
                let mut st = sink.lock();
                if st.failed {
                    return Err(io::ErrorKind::BrokenPipe.into());
                }
                std::mem::swap(&mut batch, &mut st.pending);
            }
            let r = write_pending(sock, &batch);
            let mut written = 0;
            if let Ok(mut n) = r {
                written = n;
                // Replies wholly on the wire go (and their permits with
                // them, outside the lock).
                while let Some(q) = batch.front_mut() {
                    let k = n.min(q.len - q.written);
                    q.written += k;
                    n -= k;
                    if q.written < q.len {
                        break;
                    }
                    batch.pop_front();
                }
            }
            let mut st = sink.lock();
            if st.failed {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            // Back in front of what was queued meanwhile.
            batch.append(&mut st.pending);
            std::mem::swap(&mut batch, &mut st.pending);
            match r {
                Ok(0) => {
                    let e = io::Error::from(io::ErrorKind::WriteZero);
                    sink.fail(&mut st, &e);
                    return Err(e);
                }
                Ok(_) => {
                    st.progress = Some(Instant::now());
                    st.pending_bytes -= written;
                    if st.pending.is_empty() {
                        st.draining = false;
                        break;
                    }
                }
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    sink.fail(&mut st, &e);
                    return Err(e);
                }
            }
        }
    }
}

/// One non-blocking writev of the front of `pending` (up to
/// [`DRAIN_IOVECS`] slices), from where the first reply stopped.
fn write_pending(
    sock: &OwnedWriteHalf,
    pending: &std::collections::VecDeque<Queued>,
) -> io::Result<usize> {
    let mut encs: Vec<Encoder<'_>> = Vec::new();
    let mut parts = 0;
    for q in pending {
        let mut e = Encoder::new();
        e.encode(&q.reply);
        parts += e.parts.len();
        encs.push(e);
        if parts >= DRAIN_IOVECS {
            break;
        }
    }
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(parts + 8);
    for e in &encs {
        e.slices_into(&mut slices);
    }
    let mut bufs: &mut [IoSlice<'_>] = &mut slices[..];
    if let Some(q) = pending.front() {
        IoSlice::advance_slices(&mut bufs, q.written);
    }
    let n = bufs.len().min(1024);
    sock.try_write_vectored(&bufs[..n])
}

/// The drain of a TLS wire: writes the records rustls still queues as the
/// socket becomes writable (replies the sending thread could not write at
/// once, and alerts or key update answers the reader queued), and releases
/// the permits of the queued replies once nothing is left.
async fn drain_tls(sink: &Sink, conn: &tls::SharedTls) -> io::Result<()> {
    let mut broken = sink.broken.subscribe();
    loop {
        // Wait for work (or the end).
        loop {
            {
                let st = sink.lock();
                if st.failed {
                    return Err(io::ErrorKind::BrokenPipe.into());
                }
                if st.draining {
                    break;
                }
                if st.closing {
                    return Ok(());
                }
            }
            tokio::select! {
                _ = sink.wake.notified() => {}
                _ = conn.flush_wanted() => {
                    let mut st = sink.lock();
                    if !st.draining {
                        st.draining = true;
                        st.progress = Some(Instant::now());
                    }
                }
            }
        }
        // Drain.
        loop {
            let r = tokio::select! {
                r = conn.writable() => r,
                _ = broken.wait_for(|b| *b) => Err(io::ErrorKind::BrokenPipe.into()),
            };
            let mut st = sink.lock();
            if st.failed {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            match r.and_then(|()| conn.try_flush()) {
                Ok((n, done)) => {
                    if n > 0 {
                        st.progress = Some(Instant::now());
                    }
                    if done {
                        st.held.clear();
                        st.queued = 0;
                        st.draining = false;
                        break;
                    }
                }
                Err(e) => {
                    sink.fail(&mut st, &e);
                    return Err(e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn be16(b: &[u8], at: usize) -> u16 {
        u16::from_be_bytes([b[at], b[at + 1]])
    }
    fn be32(b: &[u8], at: usize) -> u32 {
        u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
    }
    fn be64(b: &[u8], at: usize) -> u64 {
        u64::from_be_bytes(b[at..at + 8].try_into().unwrap())
    }
    /// Splits structured chunks: (flags, type, handle, payload).
    fn chunks(mut b: &[u8]) -> Vec<(u16, u16, u64, Vec<u8>)> {
        let mut v = Vec::new();
        while !b.is_empty() {
            assert_eq!(be32(b, 0), STRUCTURED_REPLY_MAGIC);
            let len = be32(b, 16) as usize;
            v.push((be16(b, 4), be16(b, 6), be64(b, 8), b[20..20 + len].to_vec()));
            b = &b[20 + len..];
        }
        v
    }
    fn read(mode: ReadMode, chunks: Vec<ReadChunk>) -> Reply {
        let len = chunks.iter().map(|c| c.len() as u32).sum();
        Reply::Read {
            handle: 7,
            offset: 1000,
            len,
            chunks,
            mode,
        }
    }

    /// A sink over a loopback connection whose client has a 16 KiB
    /// receive window, so the socket fills and the drain task writes; the
    /// client end, the server's read half (kept open), the sink, its drain.
    async fn small_window_sink() -> (
        tokio::net::TcpStream,
        tokio::net::tcp::OwnedReadHalf,
        Arc<Sink>,
        tokio::task::JoinHandle<io::Result<()>>,
    ) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.set_recv_buffer_size(16 * 1024).unwrap();
        let (client, server) = tokio::join!(sock.connect(addr), l.accept());
        let (rd, wr) = server.unwrap().0.into_split();
        let (sink, drain, _broken) = Sink::start(Wire::Tcp(wr), None);
        (client.unwrap(), rd, sink, drain)
    }

    /// A successful simple READ reply carrying `p`.
    fn shared_read(handle: u64, p: Vec<u8>) -> Reply {
        let len = p.len();
        Reply::Read {
            handle,
            offset: 0,
            len: len as u32,
            chunks: vec![ReadChunk::Shared(Arc::new(p), 0..len)],
            mode: ReadMode::Simple,
        }
    }

    /// Reads the next simple reply whole and checks its payload is
    /// `payload(handle)`; its handle.
    async fn next_reply(client: &mut tokio::net::TcpStream, payload: fn(u64) -> Vec<u8>) -> u64 {
        use tokio::io::AsyncReadExt;
        let mut hdr = [0u8; 16];
        tokio::time::timeout(Duration::from_secs(30), client.read_exact(&mut hdr))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(be32(&hdr, 0), SIMPLE_REPLY_MAGIC, "a reply was cut");
        let h = be64(&hdr, 8);
        let want = payload(h);
        let mut got = vec![0u8; want.len()];
        client.read_exact(&mut got).await.unwrap();
        assert!(got == want, "reply {h:#x} differs");
        h
    }

    /// Replies sent from several threads while the drain task writes the
    /// queued ones outside the sink's lock (decision 0070): every reply
    /// arrives whole, and each thread's replies in the order it sent them,
    /// through a small receive window that keeps the socket full.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replies_sent_while_the_drain_writes_arrive_whole_and_in_order() {
        const THREADS: u64 = 4;
        const EACH: u64 = 3000;
        fn payload(h: u64) -> Vec<u8> {
            let n = 1 + (h.wrapping_mul(7919) % 9000) as usize;
            (0..n)
                .map(|i| (i as u8).wrapping_mul(31) ^ h as u8)
                .collect()
        }
        let (mut client, _rd, sink, drain) = small_window_sink().await;
        let senders: Vec<_> = (0..THREADS)
            .map(|t| {
                let sink = sink.clone();
                tokio::task::spawn_blocking(move || {
                    for i in 0..EACH {
                        let h = t << 32 | i;
                        sink.send(shared_read(h, payload(h)), Permits::default());
                    }
                })
            })
            .collect();
        let mut next = [0u64; THREADS as usize];
        for _ in 0..THREADS * EACH {
            let h = next_reply(&mut client, payload).await;
            let t = (h >> 32) as usize;
            assert_eq!(h & 0xffff_ffff, next[t], "thread {t}: replies out of order");
            next[t] += 1;
        }
        for s in senders {
            s.await.unwrap();
        }
        sink.close();
        drain.await.unwrap().unwrap();
    }

    /// Replies queued for the drain (`Sink::queue`, decision 0074) mixed
    /// with replies sent at once arrive whole and in the order they were
    /// given, through a small receive window, and every reply's permits
    /// come back once it is on the wire.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_and_sent_replies_arrive_whole_in_order_and_release_permits() {
        const N: u64 = 3000;
        fn payload(h: u64) -> Vec<u8> {
            let n = 1 + (h.wrapping_mul(104_729) % 40_000) as usize;
            (0..n)
                .map(|i| (i as u8).wrapping_mul(13) ^ h as u8)
                .collect()
        }
        let (mut client, _rd, sink, drain) = small_window_sink().await;
        let slots = Arc::new(tokio::sync::Semaphore::new(N as usize));
        let sender = {
            let (sink, slots) = (sink.clone(), slots.clone());
            tokio::task::spawn_blocking(move || {
                for h in 0..N {
                    let reply = shared_read(h, payload(h));
                    let permits = Permits {
                        _slot: Some(slots.clone().try_acquire_owned().unwrap()),
                        ..Permits::default()
                    };
                    // Runs of queued replies, each ended by a sent one, as
                    // the reader does for a burst of pipelined READs.
                    if h % 5 == 4 {
                        sink.send(reply, permits);
                    } else {
                        sink.queue(reply, permits);
                    }
                }
            })
        };
        for want_h in 0..N {
            assert_eq!(
                next_reply(&mut client, payload).await,
                want_h,
                "replies out of order"
            );
        }
        sender.await.unwrap();
        let t = Instant::now();
        while slots.available_permits() < N as usize && t.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            slots.available_permits(),
            N as usize,
            "permits held after the replies"
        );
        sink.close();
        drain.await.unwrap().unwrap();
    }

    #[test]
    fn simple_read_expands_holes() {
        let b = encode_to_vec(&read(
            ReadMode::Simple,
            vec![ReadChunk::Data(vec![1; 3]), ReadChunk::Hole(100_000)],
        ));
        assert_eq!(be32(&b, 0), SIMPLE_REPLY_MAGIC);
        assert_eq!(be32(&b, 4), 0);
        assert_eq!(be64(&b, 8), 7);
        assert_eq!(&b[16..19], &[1, 1, 1]);
        assert_eq!(b.len(), 16 + 3 + 100_000);
        assert!(b[19..].iter().all(|&x| x == 0));
    }

    #[test]
    fn structured_read_chunks() {
        let r = read(
            ReadMode::Structured,
            vec![ReadChunk::Hole(24), ReadChunk::Data(vec![5; 8])],
        );
        let c = chunks(&encode_to_vec(&r));
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].0, c[0].1, c[0].2), (0, REPLY_TYPE_OFFSET_HOLE, 7));
        assert_eq!((be64(&c[0].3, 0), be32(&c[0].3, 8)), (1000, 24));
        assert_eq!((c[1].0, c[1].1), (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA));
        assert_eq!(be64(&c[1].3, 0), 1024);
        assert_eq!(&c[1].3[8..], &[5; 8]);
    }

    #[test]
    fn shared_chunks_are_one_data_chunk() {
        let buf = Arc::new((0u8..32).collect::<Vec<u8>>());
        let r = read(
            ReadMode::Structured,
            vec![
                ReadChunk::Shared(buf.clone(), 4..8),
                ReadChunk::Shared(buf.clone(), 0..2),
                ReadChunk::Data(vec![9; 3]),
                ReadChunk::Hole(5),
                ReadChunk::Shared(buf.clone(), 30..32),
            ],
        );
        let c = chunks(&encode_to_vec(&r));
        assert_eq!(c.len(), 3);
        assert_eq!((c[0].0, c[0].1), (0, REPLY_TYPE_OFFSET_DATA));
        assert_eq!(be64(&c[0].3, 0), 1000);
        assert_eq!(&c[0].3[8..], &[4, 5, 6, 7, 0, 1, 9, 9, 9]);
        assert_eq!((c[1].0, c[1].1), (0, REPLY_TYPE_OFFSET_HOLE));
        assert_eq!((be64(&c[1].3, 0), be32(&c[1].3, 8)), (1009, 5));
        assert_eq!((c[2].0, c[2].1), (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA));
        assert_eq!(be64(&c[2].3, 0), 1014);
        assert_eq!(&c[2].3[8..], &[30, 31]);
        // Simple replies carry the same bytes, the hole as zeros.
        let b = encode_to_vec(&read(
            ReadMode::Simple,
            vec![ReadChunk::Shared(buf, 1..3), ReadChunk::Hole(2)],
        ));
        assert_eq!(&b[16..], &[1, 2, 0, 0]);
    }

    #[test]
    fn dont_fragment() {
        let r = read(
            ReadMode::DontFragment,
            vec![ReadChunk::Data(vec![5; 2]), ReadChunk::Hole(3)],
        );
        let c = chunks(&encode_to_vec(&r));
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].0, c[0].1), (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA));
        assert_eq!(&c[0].3[8..], &[5, 5, 0, 0, 0]);
        // A read that is one hole stays one hole chunk.
        let c = chunks(&encode_to_vec(&read(
            ReadMode::DontFragment,
            vec![ReadChunk::Hole(9)],
        )));
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].0, c[0].1), (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_HOLE));
    }

    #[test]
    fn errors_and_block_status() {
        let e = Reply::Error {
            handle: 1,
            error: EIO,
            message: "bad".into(),
            offset: Some(42),
        };
        let c = chunks(&encode_to_vec(&e));
        assert_eq!((c[0].0, c[0].1), (REPLY_FLAG_DONE, REPLY_TYPE_ERROR_OFFSET));
        assert_eq!((be32(&c[0].3, 0), be16(&c[0].3, 4)), (EIO, 3));
        assert_eq!(&c[0].3[6..9], b"bad");
        assert_eq!(be64(&c[0].3, 9), 42);
        let e = Reply::Error {
            handle: 1,
            error: EINVAL,
            message: String::new(),
            offset: None,
        };
        let c = chunks(&encode_to_vec(&e));
        assert_eq!((c[0].1, c[0].3.len()), (REPLY_TYPE_ERROR, 6));
        let bs = Reply::BlockStatus {
            handle: 2,
            payloads: vec![vec![0; 12], vec![1; 20]],
        };
        let c = chunks(&encode_to_vec(&bs));
        assert_eq!(
            c.iter().map(|x| (x.0, x.1, x.3.len())).collect::<Vec<_>>(),
            vec![
                (0, REPLY_TYPE_BLOCK_STATUS, 12),
                (REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, 20)
            ]
        );
        let d = encode_to_vec(&Reply::Done { handle: 3 });
        assert_eq!(
            chunks(&d),
            vec![(REPLY_FLAG_DONE, REPLY_TYPE_NONE, 3, vec![])]
        );
    }
}

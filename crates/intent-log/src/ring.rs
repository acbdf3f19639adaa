//! Log writes submitted through io_uring (decision 0068): the thread that
//! starts a deferred commit places the batch and submits its writes without
//! blocking; a reaper takes the completions and answers the waiters. No
//! thread sleeps in the write, and no worker is woken to start it, while
//! several batches still overlap on the device.
//!
//! The reaper (decision 0075) is a task on the tokio runtime the log was
//! opened on, woken through an eventfd registered with the ring: the kernel
//! posts a completion from the submitting thread's task work (a runtime
//! thread), which then finds the eventfd ready in its own epoll and answers
//! the waiters itself, instead of waking a `log-ring` thread to do it. Off
//! a runtime (tests, tools) the `log-ring` thread waits in the ring as before.

use parking_lot::Mutex;
use pool::{DurableWrite, MirroredRegion};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use vdev::AlignedBuf;

use crate::IntentLog;

/// `user_data` of the no-op that tells the reaper to stop.
const STOP: u64 = u64::MAX;
/// Submission queue entries (completions get twice that): MAX_IN_FLIGHT
/// batches of at most two pieces (one where the region wraps) on up to
/// eight mirror copies.
const ENTRIES: u32 = 256;
/// RWF_DSYNC: this write is durable when it completes (the O_DIRECT
/// descriptor is not opened O_DSYNC).
const RWF_DSYNC: i32 = 0x2;
/// IORING_ENTER_GETEVENTS.
const GETEVENTS: u32 = 1;

/// How batches are written: the O_DSYNC descriptor (buffered; io_uring
/// hands the write to one of its kernel workers), or the O_DIRECT one with
/// RWF_DSYNC (submitted straight to the device when the batch is whole
/// pages; its cache flush runs in a kernel workqueue).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Dsync,
    Direct,
    /// Not the ring: the log writer thread (decision 0079).
    Thread,
}

impl Mode {
    /// `CISTERN_LOG_URING=off|dsync|direct|thread` (default `direct`;
    /// `thread`: the log writer thread of decision 0079, not the ring).
    pub(crate) fn from_env() -> Option<Mode> {
        match std::env::var("CISTERN_LOG_URING").as_deref() {
            Ok("off") | Ok("0") => None,
            Ok("dsync") => Some(Mode::Dsync),
            Ok("thread") => Some(Mode::Thread),
            _ => Some(Mode::Direct),
        }
    }
}

enum Buf {
    Plain(Vec<u8>),
    Aligned(AlignedBuf),
}

impl Buf {
    fn bytes(&self) -> &[u8] {
        match self {
            Buf::Plain(v) => v,
            Buf::Aligned(a) => a.as_slice(),
        }
    }
}

/// A batch whose writes are in the ring.
pub(crate) struct RingBatch {
    pub(crate) id: u64,
    pub(crate) records: usize,
    /// Region position and bytes of each piece (two where the region wraps).
    pieces: Vec<(u64, Buf)>,
    write: DurableWrite,
    region: MirroredRegion,
    /// Per piece, per target: the outcome.
    results: Vec<Vec<Option<io::Result<()>>>>,
    remaining: usize,
    submitted: std::time::Instant,
}

impl RingBatch {
    /// Pieces as (region position, bytes), for a blocking retry.
    pub(crate) fn pieces(&self) -> impl Iterator<Item = (u64, &[u8])> {
        self.pieces.iter().map(|(p, b)| (*p, b.bytes()))
    }

    pub(crate) fn region(&self) -> &MirroredRegion {
        &self.region
    }

    /// Whether every write of every piece succeeded.
    pub(crate) fn all_ok(&self) -> bool {
        self.results
            .iter()
            .flatten()
            .all(|r| matches!(r, Some(Ok(()))))
    }

    /// Releases the region's lock and accounts the writes; `Err` when a
    /// piece reached no device (the mirror's rules: a device that failed
    /// while another took the piece is FAULTED).
    pub(crate) fn finish(self) -> Result<(), pool::PoolError> {
        let pieces = self
            .pieces
            .iter()
            .zip(self.results)
            .map(|((_, buf), res)| {
                let res = res
                    .into_iter()
                    .map(|r| r.unwrap_or_else(|| Err(io::Error::other("log write not completed"))))
                    .collect();
                (buf.bytes().len(), res)
            })
            .collect();
        self.write.finish(pieces, self.submitted)
    }

    /// Whether a write through O_DIRECT was refused (EINVAL: the
    /// filesystem accepted O_DIRECT at open, not at write).
    pub(crate) fn direct_refused(&self) -> bool {
        self.pieces
            .iter()
            .zip(&self.results)
            .any(|((_, buf), res)| {
                matches!(buf, Buf::Aligned(_))
                    && res
                        .iter()
                        .flatten()
                        .any(|r| matches!(r, Err(e) if e.raw_os_error() == Some(libc::EINVAL)))
            })
    }
}

pub(crate) struct Ring {
    ring: io_uring::IoUring,
    mode: Mode,
    /// Set once an O_DIRECT write was refused: batches go through the
    /// O_DSYNC descriptor from then on.
    no_direct: std::sync::atomic::AtomicBool,
    /// Tests: the next batch's first write goes to a bad descriptor (fails).
    #[cfg(test)]
    pub(crate) fail_next: std::sync::atomic::AtomicBool,
    /// Submissions come from any thread: one at a time.
    sq: Mutex<()>,
    /// Completions too (the reaper, or a blocked commit taking them itself).
    cq: Mutex<()>,
    batches: Mutex<HashMap<u64, RingBatch>>,
    /// The STOP no-op was reaped: the reaper ends once no batch is left.
    stopping: AtomicBool,
    /// Whether the reaper is a runtime task (else the `log-ring` thread).
    pub(crate) on_runtime: AtomicBool,
}

/// Where the reaper runs: `CISTERN_LOG_REAPER=thread` keeps the `log-ring`
/// thread (for measuring); by default a task on the runtime, if any.
fn reaper_on_runtime() -> bool {
    !matches!(std::env::var("CISTERN_LOG_REAPER").as_deref(), Ok("thread"))
}

impl Ring {
    /// A ring and its reaper thread for `log`; `None` where io_uring is
    /// unavailable or turned off (the log then writes on the caller's thread).
    pub(crate) fn start(mode: Mode, log: Weak<IntentLog>) -> Option<Arc<Ring>> {
        let ring = match io_uring::IoUring::new(ENTRIES) {
            Ok(r) => r,
            Err(e) => {
                tracing::info!(error = %e, "io_uring unavailable: log writes block a thread");
                return None;
            }
        };
        let ring = Arc::new(Ring {
            ring,
            mode,
            no_direct: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            fail_next: std::sync::atomic::AtomicBool::new(false),
            sq: Mutex::new(()),
            cq: Mutex::new(()),
            batches: Mutex::new(HashMap::new()),
            stopping: AtomicBool::new(false),
            on_runtime: AtomicBool::new(false),
        });
        if reaper_on_runtime() && ring.reap_on_runtime(&log) {
            return Some(ring);
        }
        match ring.clone().reap_on_thread(log) {
            Ok(()) => Some(ring),
            Err(e) => {
                tracing::warn!(error = %e, "no log-ring thread: log writes block a thread");
                None
            }
        }
    }

    fn reap_on_thread(self: Arc<Ring>, log: Weak<IntentLog>) -> io::Result<()> {
        self.on_runtime.store(false, Ordering::Relaxed);
        std::thread::Builder::new()
            .name("log-ring".into())
            .spawn(move || self.reap(log))
            .map(|_| ())
    }

    /// Starts the reaper as a task of the current multi-thread runtime,
    /// woken by an eventfd the ring signals on each completion; false (and
    /// nothing registered) where there is no such runtime or no eventfd.
    /// A current-thread runtime is not used: its one thread may be the one
    /// blocked waiting for the log.
    fn reap_on_runtime(self: &Arc<Ring>, log: &Weak<IntentLog>) -> bool {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        if rt.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return false;
        }
        // SAFETY: plain syscall; the descriptor is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            tracing::info!(error = %io::Error::last_os_error(), "no eventfd: log completions on a thread");
            return false;
        }
        // SAFETY: `fd` is a new descriptor owned by nobody else.
        let efd = unsafe { OwnedFd::from_raw_fd(fd) };
        if let Err(e) = self.ring.submitter().register_eventfd(efd.as_raw_fd()) {
            tracing::info!(error = %e, "io_uring eventfd not registered: log completions on a thread");
            return false;
        }
        let afd = std::panic::catch_unwind(|| {
            let _in = rt.enter();
            // SAFETY: the AsyncFd owns the descriptor, which stays open
            // until it is dropped. Panics on a runtime without I/O.
            unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(efd, tokio::io::Interest::READABLE)
            }
            .map_err(|e| e.into_parts().1)
        })
        .unwrap_or_else(|_| Err(io::Error::other("runtime without I/O")));
        let afd = match afd {
            Ok(a) => a,
            Err(e) => {
                let _ = self.ring.submitter().unregister_eventfd();
                tracing::info!(error = %e, "eventfd not pollable: log completions on a thread");
                return false;
            }
        };
        self.on_runtime.store(true, Ordering::Relaxed);
        let guard = TaskGuard {
            ring: self.clone(),
            log: log.clone(),
            ended: false,
        };
        rt.spawn(guard.run(afd));
        true
    }

    /// Submits the writes of a placed batch. On `Err` nothing was submitted
    /// and the batch comes back for a blocking write.
    pub(crate) fn submit(
        &self,
        id: u64,
        records: usize,
        writes: Vec<(u64, Vec<u8>)>,
        write: DurableWrite,
        region: MirroredRegion,
    ) -> Result<(), Box<(io::Error, RingBatch)>> {
        let direct_ok = |pos: u64, len: usize| {
            self.mode == Mode::Direct
                && !self.no_direct.load(std::sync::atomic::Ordering::Relaxed)
                && direct_piece(pos, len)
                && direct_targets(&write)
        };
        let mut pieces = Vec::with_capacity(writes.len());
        let mut entries = Vec::new();
        for (p, (pos, bytes)) in writes.into_iter().enumerate() {
            let direct = direct_ok(pos, bytes.len());
            let buf = if direct {
                Buf::Aligned(AlignedBuf::copy_of(&bytes))
            } else {
                Buf::Plain(bytes)
            };
            let b = buf.bytes();
            for (t, target) in write.targets.iter().enumerate() {
                let (fd, flags) = match (direct, target.direct_fd) {
                    (true, Some(fd)) => (fd, RWF_DSYNC),
                    _ => (target.dsync_fd, 0),
                };
                #[cfg(test)]
                let fd = if self
                    .fail_next
                    .swap(false, std::sync::atomic::Ordering::Relaxed)
                {
                    -1
                } else {
                    fd
                };
                let e = io_uring::opcode::Write::new(
                    io_uring::types::Fd(fd),
                    b.as_ptr(),
                    b.len() as u32,
                )
                .offset(target.offset + pos)
                .rw_flags(flags)
                .build()
                .user_data(user_data(id, p, t));
                entries.push(e);
            }
            pieces.push((pos, buf));
        }
        let targets = write.targets.len();
        let batch = RingBatch {
            id,
            records,
            results: (0..pieces.len())
                .map(|_| (0..targets).map(|_| None).collect())
                .collect(),
            remaining: entries.len(),
            submitted: std::time::Instant::now(),
            pieces,
            write,
            region,
        };
        if entries.len() > 255 * 255 || targets > 255 {
            return Err(Box::new((
                io::Error::other("too many log writes for one batch"),
                batch,
            )));
        }
        // Registered before the kernel can complete it (the buffers live
        // in the map until then).
        self.batches.lock().insert(id, batch);
        let _sq = self.sq.lock();
        // SAFETY: submissions are serialized by `sq`; each entry points at a
        // buffer kept in `batches` until its completion is reaped.
        let pushed = unsafe {
            let mut sq = self.ring.submission_shared();
            let r = if sq.capacity() - sq.len() < entries.len() {
                Err(())
            } else {
                sq.push_multiple(&entries).map_err(|_| ())
            };
            sq.sync();
            r
        };
        if pushed.is_err() {
            let batch = self.batches.lock().remove(&id);
            return match batch {
                Some(b) => Err(Box::new((
                    io::Error::other("io_uring submission queue full"),
                    b,
                ))),
                None => Ok(()),
            };
        }
        // Pushed entries go in with this call or the next one (the reaper's
        // waits submit what is queued too).
        for _ in 0..100 {
            match self.ring.submit() {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "io_uring submit; retrying");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
        }
        Ok(())
    }

    /// O_DIRECT was refused: use the O_DSYNC descriptor from now on.
    pub(crate) fn refuse_direct(&self) {
        if !self
            .no_direct
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::info!("O_DIRECT log writes refused by the filesystem: using O_DSYNC");
        }
    }

    /// Whether a batch starting at `pos` goes through the ring. O_DSYNC
    /// batches only in `Dsync` mode: io_uring runs buffered writes to one
    /// file one after another on its kernel worker, so they would not
    /// overlap (measured: half the IOPS of driver threads). In `Direct`
    /// mode a batch that cannot be written O_DIRECT (a device without it,
    /// a start off a page) is left to a driver thread.
    pub(crate) fn accepts(&self, write: &DurableWrite, pos: u64) -> bool {
        match self.mode {
            Mode::Dsync => true,
            Mode::Direct | Mode::Thread => {
                !self.no_direct.load(std::sync::atomic::Ordering::Relaxed)
                    && pos % vdev::SECTOR == 0
                    && direct_targets(write)
            }
        }
    }

    /// Records one completion; the batch once its last write is in.
    fn complete(&self, ud: u64, res: i32) -> Option<RingBatch> {
        let (id, piece, target) = split(ud);
        let mut batches = self.batches.lock();
        let b = batches.get_mut(&id)?;
        let want = b.pieces.get(piece).map_or(0, |(_, buf)| buf.bytes().len());
        let r = if res < 0 {
            Err(io::Error::from_raw_os_error(-res))
        } else if res as usize != want {
            Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short log write: {res} of {want} bytes"),
            ))
        } else {
            Ok(())
        };
        if let Some(slot) = b.results.get_mut(piece).and_then(|p| p.get_mut(target)) {
            if slot.is_none() {
                b.remaining -= 1;
            }
            *slot = Some(r);
        }
        if b.remaining == 0 {
            return batches.remove(&id);
        }
        None
    }

    /// Takes every completion posted so far and finishes the batches they
    /// complete (answering their waiters from this thread).
    pub(crate) fn reap_ready(&self, log: &Weak<IntentLog>) {
        let done: Vec<(u64, i32)> = {
            let _cq = self.cq.lock();
            // SAFETY: consumers are serialized by `cq`.
            let cq = unsafe { self.ring.completion_shared() };
            cq.map(|c| (c.user_data(), c.result())).collect()
        };
        for (ud, res) in done {
            if ud == STOP {
                self.stopping.store(true, Ordering::Relaxed);
                continue;
            }
            if let Some(batch) = self.complete(ud, res) {
                match log.upgrade() {
                    Some(log) => log.ring_done(batch),
                    None => drop(batch),
                }
            }
        }
    }

    /// Whether the reaper may end: stopped, and no write left in the ring.
    fn ended(&self) -> bool {
        self.stopping.load(Ordering::Relaxed) && self.batches.lock().is_empty()
    }

    /// The `log-ring` thread: sleeps in the ring until a completion.
    fn reap(self: Arc<Ring>, log: Weak<IntentLog>) {
        loop {
            if self.ended() {
                return;
            }
            // SAFETY: plain wait for one completion; no argument.
            let r = unsafe {
                self.ring
                    .submitter()
                    .enter::<libc::sigset_t>(0, 1, GETEVENTS, None)
            };
            if let Err(e) = r {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "io_uring wait failed");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
            self.reap_ready(&log);
        }
    }

    /// Asks the reaper to end once the writes in flight are done.
    pub(crate) fn stop(&self) {
        let nop = io_uring::opcode::Nop::new().build().user_data(STOP);
        let _sq = self.sq.lock();
        // SAFETY: serialized by `sq`; a no-op points at no memory.
        let pushed = unsafe {
            let mut sq = self.ring.submission_shared();
            let r = sq.push(&nop).is_ok();
            sq.sync();
            r
        };
        if pushed {
            let _ = self.ring.submit();
        }
    }
}

/// The reaper task. If the runtime drops it while writes may still be in
/// the ring (runtime shut down), a `log-ring` thread takes over, so no
/// waiter is left unanswered.
struct TaskGuard {
    ring: Arc<Ring>,
    log: Weak<IntentLog>,
    ended: bool,
}

impl TaskGuard {
    async fn run(mut self, afd: tokio::io::unix::AsyncFd<OwnedFd>) {
        loop {
            if self.ring.ended() {
                break;
            }
            let mut ready = match afd.readable().await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "log eventfd wait failed: log completions on a thread");
                    return;
                }
            };
            // Reset the counter before taking the completions: one posted
            // after this read signals the eventfd again.
            let read = ready.try_io(|fd| {
                let mut n = [0u8; 8];
                // SAFETY: reads 8 bytes into `n`.
                let r = unsafe { libc::read(fd.as_raw_fd(), n.as_mut_ptr().cast(), n.len()) };
                if r < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(())
                }
            });
            if read.is_err() {
                // Would block: readiness cleared, wait again.
                continue;
            }
            self.ring.reap_ready(&self.log);
        }
        let _ = self.ring.ring.submitter().unregister_eventfd();
        self.ended = true;
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        if self.ended || self.ring.ended() {
            return;
        }
        let _ = self.ring.ring.submitter().unregister_eventfd();
        if let Err(e) = self.ring.clone().reap_on_thread(self.log.clone()) {
            tracing::error!(error = %e, "no log-ring thread after the runtime's reaper ended");
        }
    }
}

/// Every copy of the region has an O_DIRECT descriptor, at a sector
/// boundary (the ring's and the log writer's condition, decision 0079).
pub(crate) fn direct_targets(write: &DurableWrite) -> bool {
    write
        .targets
        .iter()
        .all(|t| t.direct_fd.is_some() && t.offset % vdev::SECTOR == 0)
}

/// A piece of a batch O_DIRECT can write: whole sectors at a sector boundary.
pub(crate) fn direct_piece(pos: u64, len: usize) -> bool {
    pos % vdev::SECTOR == 0 && len as u64 % vdev::SECTOR == 0
}

fn user_data(id: u64, piece: usize, target: usize) -> u64 {
    (id << 16) | ((piece as u64) << 8) | target as u64
}

fn split(ud: u64) -> (u64, usize, usize) {
    (ud >> 16, ((ud >> 8) & 0xff) as usize, (ud & 0xff) as usize)
}

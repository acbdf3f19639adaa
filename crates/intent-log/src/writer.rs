//! The log writer thread (decision 0079): deferred commits' batches are
//! written by one thread per log that waits for the device itself.
//!
//! A batch is one synchronous O_DIRECT write with RWF_DSYNC per piece and
//! copy (ranged: unlike `fdatasync`, it does not write back buffered dirty
//! pages of the device). The kernel then runs the write's cache flush in
//! this thread and the device's completions wake it directly: no
//! dio-completion kworker and no io_uring task work between the device and
//! the waiter (decision 0077 measured those hand-offs as two thirds of a
//! log write). Group commit: the FLUSHes that arrive while a batch is being
//! written are the next batch, taken right after without sleeping, so under
//! load the thread is not woken per batch.

use parking_lot::{Condvar, Mutex};
use pool::{DurableTarget, MirroredRegion};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;
use vdev::AlignedBuf;

use crate::ring::{direct_piece, direct_targets};
use crate::IntentLog;

/// `CISTERN_LOG_WRITERS` (1..=4, default 1): writer threads per log. With
/// two, one writes the next batch while the other waits for the device or
/// answers its waiters (each woken when the other is busy).
fn writers() -> usize {
    std::env::var("CISTERN_LOG_WRITERS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(1, |n| n.clamp(1, 4))
}

#[derive(Default)]
struct Flags {
    /// A deferred commit is waiting that no write covers.
    work: bool,
    /// Writers sleeping on `wake`.
    parked: usize,
    stop: bool,
}

/// What the log and its writer thread share (the thread holds the log
/// only weakly, so the log can be dropped while it sleeps).
pub(crate) struct Writer {
    flags: Mutex<Flags>,
    wake: Condvar,
    /// Set by [`Writer::kick`] without the lock while the writer is busy.
    work: AtomicBool,
    /// Set once an O_DIRECT write was refused: the blocking O_DSYNC way from then on.
    no_direct: AtomicBool,
    /// Tests: the next batch's first write goes to a bad descriptor (fails).
    #[cfg(test)]
    pub(crate) fail_next: AtomicBool,
}

impl Writer {
    /// The writer thread for `log`; `None` if no thread could be started
    /// (deferred commits then take the driver path).
    pub(crate) fn start(log: Weak<IntentLog>) -> Option<Arc<Writer>> {
        let w = Arc::new(Writer {
            flags: Mutex::new(Flags::default()),
            wake: Condvar::new(),
            work: AtomicBool::new(false),
            no_direct: AtomicBool::new(false),
            #[cfg(test)]
            fail_next: AtomicBool::new(false),
        });
        let mut started = 0;
        for _ in 0..writers() {
            let (theirs, log) = (w.clone(), log.clone());
            match std::thread::Builder::new()
                .name("log-writer".into())
                .spawn(move || theirs.run(log))
            {
                Ok(_) => started += 1,
                Err(e) => {
                    tracing::warn!(error = %e, "no log-writer thread");
                }
            }
        }
        // None started: deferred commits take the driver path.
        (started > 0).then_some(w)
    }

    /// A deferred commit no write covers is queued: the writer takes it
    /// with its next batch (woken only if it sleeps).
    pub(crate) fn kick(&self) {
        if self.work.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut f = self.flags.lock();
        f.work = true;
        if f.parked > 0 {
            self.wake.notify_one();
        }
    }

    /// The log is dropped: the thread ends.
    pub(crate) fn stop(&self) {
        let mut f = self.flags.lock();
        f.stop = true;
        self.wake.notify_all();
    }

    fn run(&self, log: Weak<IntentLog>) {
        loop {
            if !self.wait() {
                return;
            }
            let Some(log) = log.upgrade() else {
                return;
            };
            log.write_waiters();
        }
    }

    /// Until there is work (true) or the log is gone (false).
    fn wait(&self) -> bool {
        let mut f = self.flags.lock();
        loop {
            if f.stop {
                return false;
            }
            if f.work || self.work.load(Ordering::Acquire) {
                f.work = false;
                // Cleared before the log is looked at: a commit queued
                // after this sets it again and is found next round.
                self.work.store(false, Ordering::Release);
                return true;
            }
            f.parked += 1;
            self.wake.wait(&mut f);
            f.parked -= 1;
        }
    }

    /// Writes `writes` (region position, bytes) to every writable copy of
    /// `region`; true once every copy is on stable storage. False when the
    /// batch cannot go O_DIRECT or a write failed: the caller writes it
    /// (again) the blocking way, which counts and reports device errors and
    /// applies the mirror's rules.
    pub(crate) fn write(&self, region: &MirroredRegion, writes: &[(u64, Vec<u8>)]) -> bool {
        if self.no_direct.load(Ordering::Relaxed) {
            return false;
        }
        if !writes.iter().all(|(p, b)| direct_piece(*p, b.len())) {
            return false;
        }
        // The region's devices and its shared lock (held until `write` drops).
        let write = match region.start_durable(0, region.size() as usize) {
            Ok(Some(w)) => w,
            _ => return false,
        };
        if !direct_targets(&write) {
            return false;
        }
        let bufs: Vec<AlignedBuf> = writes.iter().map(|(_, b)| AlignedBuf::copy_of(b)).collect();
        let slices: Vec<&[u8]> = bufs.iter().map(|b| b.as_slice()).collect();
        let started = Instant::now();
        // Per target, per piece. A mirror's other copies are written at
        // the same time on threads of their own (a thread that cannot be
        // started: that copy here, after).
        let per_target: Vec<Vec<io::Result<()>>> = std::thread::scope(|s| {
            let (first, rest) = match write.targets.split_first() {
                Some(x) => x,
                None => return Vec::new(),
            };
            let others: Vec<_> = rest
                .iter()
                .map(|t| {
                    let slices = &slices;
                    std::thread::Builder::new()
                        .name("log-copy".into())
                        .spawn_scoped(s, move || self.write_target(t, writes, slices))
                        .map_err(|_| t)
                })
                .collect();
            let mut out = vec![self.write_target(first, writes, &slices)];
            for h in others {
                out.push(match h {
                    Ok(h) => h.join().unwrap_or_else(|_| {
                        writes
                            .iter()
                            .map(|_| Err(io::Error::other("log copy thread panicked")))
                            .collect()
                    }),
                    Err(t) => self.write_target(t, writes, &slices),
                });
            }
            out
        });
        let refused = per_target
            .iter()
            .flatten()
            .any(|r| matches!(r, Err(e) if e.raw_os_error() == Some(libc::EINVAL)));
        if let Some(e) = per_target.iter().flatten().find_map(|r| r.as_ref().err()) {
            if refused && !self.no_direct.swap(true, Ordering::Relaxed) {
                tracing::info!("O_DIRECT log writes refused by the filesystem: using O_DSYNC");
            } else {
                tracing::warn!(error = %e, "log write failed; writing it again the blocking way");
            }
            return false;
        }
        // Per piece, per target, as `DurableWrite::finish` takes them.
        let pieces = (0..writes.len())
            .map(|p| {
                let len = bufs[p].len();
                (len, write.targets.iter().map(|_| Ok(())).collect())
            })
            .collect();
        write.finish(pieces, started).is_ok()
    }

    /// One copy: every piece written, then durable.
    fn write_target(
        &self,
        t: &DurableTarget,
        writes: &[(u64, Vec<u8>)],
        bufs: &[&[u8]],
    ) -> Vec<io::Result<()>> {
        let Some(fd) = t.direct_fd else {
            return bufs
                .iter()
                .map(|_| Err(io::Error::other("no O_DIRECT descriptor")))
                .collect();
        };
        #[cfg(test)]
        let fd = if self.fail_next.swap(false, Ordering::Relaxed) {
            -1
        } else {
            fd
        };
        writes
            .iter()
            .zip(bufs)
            .map(|((pos, _), buf)| pwrite_dsync(fd, buf, t.offset + pos))
            .collect()
    }
}

/// Writes all of `buf` at `offset` (O_DIRECT: whole sectors) with
/// RWF_DSYNC: on stable storage when it returns.
fn pwrite_dsync(fd: i32, buf: &[u8], offset: u64) -> io::Result<()> {
    let mut done = 0usize;
    while done < buf.len() {
        let rest = &buf[done..];
        let iov = libc::iovec {
            iov_base: rest.as_ptr() as *mut libc::c_void,
            iov_len: rest.len(),
        };
        let at = i64::try_from(offset + done as u64).map_err(|_| io::Error::other("offset"))?;
        // SAFETY: one iovec over `rest`, which outlives the call.
        let n = unsafe { libc::pwritev2(fd, &iov, 1, at, libc::RWF_DSYNC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "device accepted no bytes",
            ));
        }
        done += n as usize;
    }
    Ok(())
}

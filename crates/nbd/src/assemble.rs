//! Large cached READ replies copied into one contiguous buffer by the
//! thread that writes them right after (decision 0076).
//!
//! A cached 1 MiB READ is 64 ARC blocks of 16 KiB. Written as 64 iovecs,
//! the kernel copies them from DRAM inside the one `writev` that also runs
//! the loopback receive and wakes the client: that serial call was the
//! bottleneck (one core busy, the other mostly idle). Here the reader task
//! hands a large cached reply to a runtime task, which copies its data into
//! a reused buffer (in parallel with the other replies being assembled on
//! the other workers) and sends it at once, from the cache it was just
//! written to — as nbdkit's threads `pread` and then `send`. Replies go out
//! whole, in the order they finish (NBD handles match them up).
//!
//! The bytes copied are the ones the export returned (verified ARC buffers,
//! held until the copy is done); nothing else is read. Memory: buffers are
//! counted daemon-wide ([`ASSEMBLY_BYTES_MAX`], whether being filled,
//! queued behind a full socket, a thread's spare or pooled); when the
//! budget is used up the reply is sent from the export's buffers as before.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::sink::Reply;
use crate::ReadChunk;

/// Smallest READ (in data bytes) whose reply is assembled. 256 KiB
/// replies gained too (decision 0076); smaller ones are left as they were
/// (a task hand-off per 4-64 KiB reply costs more than its copy).
pub(crate) const ASSEMBLE_MIN: u32 = 256 << 10;

/// Bytes of assembly buffers that may exist at once, daemon-wide.
pub(crate) const ASSEMBLY_BYTES_MAX: usize = 16 << 20;

static USED: AtomicUsize = AtomicUsize::new(0);

/// Bytes of assembly buffers in existence, and replies assembled (tests).
#[cfg(test)]
pub(crate) fn used() -> usize {
    USED.load(Ordering::Relaxed)
}
#[cfg(test)]
pub(crate) static ASSEMBLED: AtomicUsize = AtomicUsize::new(0);

/// A buffer counted in [`USED`] until dropped.
struct Owned {
    buf: Vec<u8>,
    reserved: usize,
}

impl Drop for Owned {
    fn drop(&mut self) {
        USED.fetch_sub(self.reserved, Ordering::Relaxed);
    }
}

thread_local! {
    /// The last buffer sent from this thread: reused by its next assembly,
    /// its lines likely still in this core's cache.
    static SPARE: Cell<Option<Owned>> = const { Cell::new(None) };
}

/// Buffers let go while their thread already had a spare (replies that
/// met a full socket are dropped together by the drain): reused before a
/// new one is mapped. Every buffer counts in [`USED`], so this is bounded.
static POOL: Mutex<Vec<Owned>> = Mutex::new(Vec::new());

fn pool() -> std::sync::MutexGuard<'static, Vec<Owned>> {
    POOL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Takes a buffer of at least `len` bytes: this thread's spare, else a
/// pooled one, else a new one within the budget.
fn take(len: usize) -> Option<Owned> {
    if let Ok(Some(o)) = SPARE.try_with(Cell::take) {
        if o.reserved >= len {
            return Some(o);
        }
    }
    {
        let mut p = pool();
        if let Some(i) = p.iter().rposition(|o| o.reserved >= len) {
            return Some(p.swap_remove(i));
        }
        // Smaller ones make room for this size.
        p.clear();
    }
    let mut cur = USED.load(Ordering::Relaxed);
    loop {
        if cur + len > ASSEMBLY_BYTES_MAX {
            return None;
        }
        match USED.compare_exchange_weak(cur, cur + len, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => break,
            Err(c) => cur = c,
        }
    }
    Some(Owned {
        buf: Vec::with_capacity(len),
        reserved: len,
    })
}

/// An assembled reply's data, shared with the reply until it is written.
struct Assembled(Option<Owned>);

impl AsRef<[u8]> for Assembled {
    fn as_ref(&self) -> &[u8] {
        self.0.as_ref().map(|o| &o.buf[..]).unwrap_or_default()
    }
}

impl Drop for Assembled {
    fn drop(&mut self) {
        // Becomes this thread's spare; the one it had goes to the pool.
        if let Some(o) = self.0.take() {
            let mut o = Some(o);
            let _ = SPARE.try_with(|s| o = s.replace(o.take()));
            if let Some(o) = o {
                pool().push(o);
            }
        }
    }
}

/// Whether a READ of `len` bytes is worth assembling.
pub(crate) fn wanted(len: u32) -> bool {
    len >= ASSEMBLE_MIN
}

/// `reply` with its data chunks copied into one buffer (holes stay holes);
/// the reply as it is if it is not a READ with enough data or the budget
/// is used up.
pub(crate) fn assemble(reply: Reply) -> Reply {
    let Reply::Read {
        handle,
        offset,
        len,
        chunks,
        mode,
    } = reply
    else {
        return reply;
    };
    let data: usize = chunks
        .iter()
        .filter_map(ReadChunk::data)
        .map(<[u8]>::len)
        .sum();
    let unchanged = |chunks| Reply::Read {
        handle,
        offset,
        len,
        chunks,
        mode,
    };
    if data < ASSEMBLE_MIN as usize {
        return unchanged(chunks);
    }
    let Some(mut o) = take(data) else {
        return unchanged(chunks);
    };
    o.buf.clear();
    // Where each chunk landed: a range of the buffer, or a hole's length.
    let mut layout: Vec<Result<std::ops::Range<usize>, u64>> = Vec::with_capacity(4);
    for c in &chunks {
        match c.data() {
            Some(d) => {
                let start = o.buf.len();
                o.buf.extend_from_slice(d);
                match layout.last_mut() {
                    Some(Ok(r)) if r.end == start => r.end = o.buf.len(),
                    _ => layout.push(Ok(start..o.buf.len())),
                }
            }
            None => layout.push(Err(c.len())),
        }
    }
    // The export's buffers are let go here, before the reply is sent.
    drop(chunks);
    let buf: crate::SharedBytes = Arc::new(Assembled(Some(o)));
    let chunks = layout
        .into_iter()
        .map(|l| match l {
            Ok(r) => ReadChunk::Shared(buf.clone(), r),
            Err(n) => ReadChunk::Hole(n),
        })
        .collect();
    #[cfg(test)]
    ASSEMBLED.fetch_add(1, Ordering::Relaxed);
    unchanged(chunks)
}

//! Page-aligned buffers for blocks that stay in memory (the ARC's): a device
//! read lands in them directly (O_DIRECT, one vectored read per run), with
//! no run buffer to copy out of (decision 0069).
//!
//! They are carved from anonymous mappings of `CHUNK` bytes populated at
//! once (`MAP_POPULATE`): a cold read after a restart used to pay one page
//! fault per 4 KiB of the ARC's first fill, a quarter of its CPU (decision
//! 0066). Every size has its own free list; a freed buffer is kept for the
//! next block of its size, populated while the free buffers of all sizes
//! stay under `WARM_MAX`, else after `MADV_DONTNEED` (its memory goes back
//! to the system at once and it reads as zeros until it is filled again).
//! Mappings are never unmapped: the address space used is the peak of live
//! buffers per size, the resident memory is the live buffers plus at most
//! `WARM_MAX` plus one partly carved chunk per size.
//!
//! Every byte of a buffer is initialized at all times (an anonymous mapping
//! reads as zeros, a reused buffer holds an earlier block), so handing out
//! `&mut [u8]` over it is sound.

use parking_lot::Mutex;
use std::ptr::NonNull;

/// Buffer sizes are whole pages (O_DIRECT alignment and length).
pub const PAGE: usize = 4096;
/// Largest buffer taken from the slab; larger blocks use the heap.
pub const MAX_LEN: usize = 1 << 20;
/// Bytes mapped at a time for one size.
const CHUNK: usize = 2 << 20;
/// Free buffers kept populated, over all sizes.
const WARM_MAX: usize = 16 << 20;

/// An owned, page-aligned buffer of whole pages from the slab.
pub struct BlockBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a BlockBuf owns its pages exclusively (no other handle to them
// exists until it is dropped and pushed back on a free list), like a Vec<u8>.
unsafe impl Send for BlockBuf {}
unsafe impl Sync for BlockBuf {}

struct Size {
    len: usize,
    /// Freed buffers still populated.
    warm: Vec<usize>,
    /// Freed buffers whose pages were given back (read as zeros).
    cold: Vec<usize>,
    /// The part of the newest chunk not handed out yet: (address, bytes).
    rest: (usize, usize),
}

struct Slab {
    sizes: Vec<Size>,
    warm_bytes: usize,
    mapped: usize,
}

static SLAB: Mutex<Slab> = Mutex::new(Slab {
    sizes: Vec::new(),
    warm_bytes: 0,
    mapped: 0,
});

impl Slab {
    fn size_index(&mut self, len: usize) -> usize {
        match self.sizes.iter().position(|s| s.len == len) {
            Some(i) => i,
            None => {
                self.sizes.push(Size {
                    len,
                    warm: Vec::new(),
                    cold: Vec::new(),
                    rest: (0, 0),
                });
                self.sizes.len() - 1
            }
        }
    }

    /// A free buffer of `len` bytes, or one carved from the newest chunk.
    fn take(&mut self, len: usize) -> Option<BlockBuf> {
        let i = self.size_index(len);
        if let Some(addr) = self.sizes[i].warm.pop() {
            self.warm_bytes -= len;
            return Some(BlockBuf::at(addr, len));
        }
        let size = &mut self.sizes[i];
        if let Some(addr) = size.cold.pop() {
            return Some(BlockBuf::at(addr, len));
        }
        let (addr, left) = size.rest;
        if left < len {
            return None;
        }
        size.rest = (addr + len, left - len);
        Some(BlockBuf::at(addr, len))
    }
}

/// Bytes mapped for block buffers (the address space, not all resident).
pub fn mapped_bytes() -> usize {
    SLAB.lock().mapped
}

/// Free buffers kept populated now, bytes.
pub fn warm_bytes() -> usize {
    SLAB.lock().warm_bytes
}

impl BlockBuf {
    /// A buffer of `len` bytes, or `None` when `len` is not a whole number
    /// of pages up to `MAX_LEN`, or the system refuses memory (callers then
    /// use a heap buffer). Its contents are unspecified (zeros or an
    /// earlier block), never uninitialized.
    pub fn new(len: usize) -> Option<BlockBuf> {
        if len == 0 || len % PAGE != 0 || len > MAX_LEN {
            return None;
        }
        if let Some(b) = SLAB.lock().take(len) {
            return Some(b);
        }
        // Map and populate a new chunk outside the lock: it takes a fraction
        // of a millisecond, which readers of other blocks need not wait for.
        let bytes = CHUNK.max(len) / len * len;
        // SAFETY: a fresh private anonymous mapping; no existing memory is
        // touched. The result is checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        let mut slab = SLAB.lock();
        slab.mapped += bytes;
        let i = slab.size_index(len);
        let size = &mut slab.sizes[i];
        if size.rest.1 < len {
            // The tail of the previous chunk (smaller than `len`) is left unused.
            size.rest = (p as usize, bytes);
        } else {
            // Another thread installed a chunk meanwhile: this one's
            // buffers go on the free list.
            size.cold
                .extend((0..bytes / len).map(|k| p as usize + k * len));
        }
        slab.take(len)
    }

    fn at(addr: usize, len: usize) -> BlockBuf {
        let ptr = NonNull::new(addr as *mut u8).expect("slab addresses are not null");
        BlockBuf { ptr, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::ops::Deref for BlockBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len lies in a live mapping owned by this buffer
        // alone, and every byte of it is initialized (see the module doc).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for BlockBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl AsRef<[u8]> for BlockBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::fmt::Debug for BlockBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlockBuf({} bytes)", self.len)
    }
}

impl Drop for BlockBuf {
    fn drop(&mut self) {
        let (addr, len) = (self.ptr.as_ptr() as usize, self.len);
        {
            let mut slab = SLAB.lock();
            if slab.warm_bytes + len <= WARM_MAX {
                if let Some(s) = slab.sizes.iter_mut().find(|s| s.len == len) {
                    s.warm.push(addr);
                    slab.warm_bytes += len;
                    return;
                }
            }
        }
        // SAFETY: the range is this buffer's own pages (nobody else can
        // reach them until it is on a free list, below); MADV_DONTNEED on
        // private anonymous memory only makes them read as zeros again.
        unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) };
        let mut slab = SLAB.lock();
        if let Some(s) = slab.sizes.iter_mut().find(|s| s.len == len) {
            s.cold.push(addr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_whole_pages_and_reused() {
        assert!(BlockBuf::new(0).is_none());
        assert!(BlockBuf::new(1000).is_none());
        assert!(BlockBuf::new(MAX_LEN + PAGE).is_none());
        // A size of its own, so tests running at once do not share its list.
        let len = 13 * PAGE;
        let mut a = BlockBuf::new(len).expect("memory");
        assert_eq!(a.len(), len);
        assert_eq!(a.as_ptr() as usize % PAGE, 0);
        a.fill(7);
        let at = a.as_ptr() as usize;
        drop(a);
        let b = BlockBuf::new(len).expect("memory");
        assert_eq!(b.as_ptr() as usize, at, "the freed buffer is reused");
        assert!(b.iter().all(|&x| x == 7 || x == 0), "initialized bytes");
    }

    #[test]
    fn buffers_past_the_warm_bound_give_their_memory_back() {
        let len = 29 * PAGE;
        let n = WARM_MAX / len + 8;
        let mut bufs: Vec<BlockBuf> = (0..n)
            .map(|_| BlockBuf::new(len).expect("memory"))
            .collect();
        for b in &mut bufs {
            b.fill(0xa5);
        }
        drop(bufs);
        assert!(warm_bytes() <= WARM_MAX);
        // Some of them were given back: they read as zeros when reused.
        let again: Vec<BlockBuf> = (0..n)
            .map(|_| BlockBuf::new(len).expect("memory"))
            .collect();
        assert!(again.iter().any(|b| b.iter().all(|&x| x == 0)));
        assert!(again.iter().all(|b| b.iter().all(|&x| x == 0 || x == 0xa5)));
    }
}

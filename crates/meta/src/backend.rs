//! A redb `StorageBackend` over the pool's mirrored metadata region, with a
//! checksum per 4 KiB page so a copy that reads back wrong is caught, read
//! from another device and rewritten (decision 0007).
//!
//! Region layout (format 2, docs/on-disk-format.md):
//! - two 4 KiB header slots: `"CISTMETA" | u64 generation | u64 database
//!   length | u32 format (2) | u32 zero | blake3 of those 32 bytes`; the
//!   valid slot with the highest generation wins, so a torn header write
//!   leaves the other slot in force;
//! - the checksum table: 4 KiB table pages of 127 entries (32 bytes: the
//!   page's current and previous checksum, 16 bytes each) and a 32-byte
//!   trailer, `blake3("CISTSUMS" | u64 table page index | entries)`; an
//!   all-zero table page is valid and empty;
//! - the database pages. A page's checksum is the first 16 bytes of
//!   `blake3(u64 page index | page)`; zero means "none recorded".
//!
//! A read accepts a copy matching the current or the previous checksum
//! (after a crash, a page rewritten in place may hold either). Page 0 is
//! redb's header, the one page redb rewrites in place and the one that
//! makes a commit visible: it is held in memory until `sync_data`, which
//! makes the database pages durable, then the checksum table (covering
//! every page written, the new header included), and only then writes the
//! header. So whatever instant a crash hits, the header on disk names a
//! commit whose pages all have durable checksums they match.
//! Format 1 (no checksums, database at 8 KiB) is refused by name.

use crate::MetaError;
use parking_lot::Mutex;
use pool::{MirroredRegion, PoolError, ScrubOutcome};
use redb::StorageBackend;
use std::collections::{BTreeSet, HashMap};
use std::io;
use std::sync::{Arc, Weak};

const PAGE: u64 = 4096;
const SLOT: u64 = 4096;
const TABLE_START: u64 = 2 * SLOT;
const MAGIC: &[u8; 8] = b"CISTMETA";
const SUMS_MAGIC: &[u8; 8] = b"CISTSUMS";
/// Version of the region layout written in the header slots.
pub const REGION_FORMAT: u32 = 2;
const ENTRY: usize = 32;
const PER_TABLE_PAGE: u64 = 127;
const TRAILER: usize = PER_TABLE_PAGE as usize * ENTRY;
/// Pages verified (and healed) per lock hold in `verify_all`.
const SCRUB_BATCH: u64 = 32;

type Sum = [u8; 16];

fn page_sum(index: u64, page: &[u8]) -> Sum {
    let mut h = blake3::Hasher::new();
    h.update(&index.to_le_bytes());
    h.update(page);
    let mut out = [0u8; 16];
    out.copy_from_slice(&h.finalize().as_bytes()[..16]);
    out
}

fn table_trailer(tp: u64, entries: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(SUMS_MAGIC);
    h.update(&tp.to_le_bytes());
    h.update(entries);
    *h.finalize().as_bytes()
}

fn table_page_ok(tp: u64, buf: &[u8]) -> bool {
    buf.iter().all(|&b| b == 0) || table_trailer(tp, &buf[..TRAILER]) == buf[TRAILER..]
}

fn header(generation: u64, len: u64) -> Vec<u8> {
    let mut buf = vec![0u8; SLOT as usize];
    buf[..8].copy_from_slice(MAGIC);
    buf[8..16].copy_from_slice(&generation.to_le_bytes());
    buf[16..24].copy_from_slice(&len.to_le_bytes());
    buf[24..28].copy_from_slice(&REGION_FORMAT.to_le_bytes());
    let sum = *blake3::hash(&buf[..32]).as_bytes();
    buf[32..64].copy_from_slice(&sum);
    buf
}

enum Slot {
    Valid(u64, u64),
    /// A format-1 header (no page checksums).
    Version1,
    Invalid,
}

fn parse(buf: &[u8]) -> Slot {
    if buf.len() < 64 || &buf[..8] != MAGIC {
        return Slot::Invalid;
    }
    let u64_at = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&buf[at..at + 8]);
        u64::from_le_bytes(b)
    };
    if blake3::hash(&buf[..32]).as_bytes() == &buf[32..64]
        && buf[24..28] == REGION_FORMAT.to_le_bytes()
    {
        return Slot::Valid(u64_at(8), u64_at(16));
    }
    if blake3::hash(&buf[..24]).as_bytes() == &buf[24..56] {
        return Slot::Version1;
    }
    Slot::Invalid
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Table and database page counts for a region of `size` bytes.
fn plan(size: u64) -> (u64, u64) {
    let pages = size.saturating_sub(TABLE_START) / PAGE;
    let mut db = pages * PER_TABLE_PAGE / (PER_TABLE_PAGE + 1);
    // At most a couple of steps: the estimate is off by at most one table page.
    for _ in 0..4 {
        if db + db.div_ceil(PER_TABLE_PAGE) <= pages {
            break;
        }
        db -= 1;
    }
    (db.div_ceil(PER_TABLE_PAGE), db)
}

/// Loaded table pages and the ones changed since the last sync.
#[derive(Default)]
struct Sums {
    pages: HashMap<u64, Box<[u8]>>,
    dirty: BTreeSet<u64>,
}

struct Inner {
    region: MirroredRegion,
    table_pages: u64,
    db_pages: u64,
    /// (generation, length) of the newest header.
    state: Mutex<(u64, u64)>,
    /// Held for every write (and while `verify_all` checks a batch).
    sums: Mutex<Sums>,
    /// redb's header page as last written, until `sync_data` writes it.
    pending_header: Mutex<Option<Box<[u8]>>>,
    /// While a database is opened: a bitmap of the pages read from the
    /// devices (see [`RepairWatch`]; one bit per page of the region).
    touched: Mutex<Option<Vec<u64>>>,
}

/// Live backends, so `verify_all` works on the same checksums as the open
/// database instead of stale ones from disk.
static LIVE: Mutex<Vec<(u64, u64, Weak<Inner>)>> = Mutex::new(Vec::new());

pub struct RegionBackend {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RegionBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RegionBackend({:?})", self.inner.region)
    }
}

impl Inner {
    fn data_start(&self) -> u64 {
        TABLE_START + self.table_pages * PAGE
    }

    fn capacity(&self) -> u64 {
        self.db_pages * PAGE
    }

    /// The table page `tp`, read (verified, healed) on first use.
    fn table_page<'a>(&self, sums: &'a mut Sums, tp: u64) -> io::Result<&'a mut [u8]> {
        use std::collections::hash_map::Entry;
        match sums.pages.entry(tp) {
            Entry::Occupied(e) => Ok(&mut e.into_mut()[..]),
            Entry::Vacant(v) => {
                let mut buf = vec![0u8; PAGE as usize];
                self.region
                    .read_verified(TABLE_START + tp * PAGE, &mut buf, |b| table_page_ok(tp, b))
                    .map_err(|e| io_err(format!("metadata checksum table page {tp}: {e}")))?;
                Ok(&mut v.insert(buf.into_boxed_slice())[..])
            }
        }
    }

    /// (current, previous) checksum of database page `page`.
    fn entry(&self, sums: &mut Sums, page: u64) -> io::Result<(Sum, Sum)> {
        let tp = page / PER_TABLE_PAGE;
        let at = (page % PER_TABLE_PAGE) as usize * ENTRY;
        let t = self.table_page(sums, tp)?;
        let mut cur = [0u8; 16];
        let mut prev = [0u8; 16];
        cur.copy_from_slice(&t[at..at + 16]);
        prev.copy_from_slice(&t[at + 16..at + 32]);
        Ok((cur, prev))
    }

    fn set_entry(&self, sums: &mut Sums, page: u64, sum: Sum) -> io::Result<()> {
        let tp = page / PER_TABLE_PAGE;
        let at = (page % PER_TABLE_PAGE) as usize * ENTRY;
        let t = self.table_page(sums, tp)?;
        if t[at..at + 16] != sum {
            let (cur, prev) = t[at..at + 32].split_at_mut(16);
            prev.copy_from_slice(cur);
            cur.copy_from_slice(&sum);
            sums.dirty.insert(tp);
        }
        Ok(())
    }

    /// Writes every changed table page (with its trailer); durable if asked.
    fn flush_table(&self, sums: &mut Sums, durable: bool) -> io::Result<()> {
        let dirty: Vec<u64> = std::mem::take(&mut sums.dirty).into_iter().collect();
        for tp in dirty {
            let Some(t) = sums.pages.get_mut(&tp) else {
                continue;
            };
            let trailer = table_trailer(tp, &t[..TRAILER]);
            t[TRAILER..].copy_from_slice(&trailer);
            let at = TABLE_START + tp * PAGE;
            let r = if durable {
                self.region.write_durable(at, t)
            } else {
                self.region.write(at, t)
            };
            r.map_err(io_err)?;
        }
        Ok(())
    }

    /// Reads whole pages `first..first + n` into `buf`, each verified; a
    /// header page not yet written comes from memory.
    fn read_pages(&self, first: u64, buf: &mut [u8]) -> io::Result<()> {
        if first == 0 {
            // Copied out: the lock is never held while `sums` is taken.
            let pending = self.pending_header.lock().clone();
            if let Some(h) = pending {
                buf[..PAGE as usize].copy_from_slice(&h);
                if buf.len() as u64 > PAGE {
                    self.read_disk_pages(1, &mut buf[PAGE as usize..])?;
                }
                return Ok(());
            }
        }
        self.read_disk_pages(first, buf)
    }

    fn read_disk_pages(&self, first: u64, buf: &mut [u8]) -> io::Result<()> {
        let n = buf.len() as u64 / PAGE;
        if let Some(t) = self.touched.lock().as_mut() {
            for p in first..first + n {
                if let Some(w) = t.get_mut((p / 64) as usize) {
                    *w |= 1 << (p % 64);
                }
            }
        }
        let entries: Vec<(Sum, Sum)> = {
            let mut sums = self.sums.lock();
            (first..first + n)
                .map(|p| self.entry(&mut sums, p))
                .collect::<io::Result<_>>()?
        };
        let ok = |i: u64, page: &[u8]| {
            let (cur, prev) = entries[i as usize];
            if cur == [0u8; 16] {
                return true;
            }
            let s = page_sum(first + i, page);
            s == cur || s == prev
        };
        let at = self.data_start() + first * PAGE;
        let whole = self.region.read_verified(at, buf, |b| {
            b.chunks(PAGE as usize)
                .enumerate()
                .all(|(i, p)| ok(i as u64, p))
        });
        if whole.is_ok() || n == 1 {
            return whole.map_err(io_err);
        }
        // No one device has every page right: page by page.
        for (i, chunk) in buf.chunks_mut(PAGE as usize).enumerate() {
            self.region
                .read_verified(at + i as u64 * PAGE, chunk, |p| ok(i as u64, p))
                .map_err(|e| io_err(format!("metadata page {}: {e}", first + i as u64)))?;
        }
        Ok(())
    }
}

impl RegionBackend {
    /// A fresh, empty database region: headers and checksum table zeroed.
    pub fn format(region: MirroredRegion) -> io::Result<Self> {
        let (table_pages, db_pages) = plan(region.size());
        if db_pages == 0 {
            return Err(io_err("metadata region too small"));
        }
        const CHUNK: u64 = 1 << 20;
        let zeros = vec![0u8; CHUNK as usize];
        let table_end = TABLE_START + table_pages * PAGE;
        let mut at = TABLE_START;
        while at < table_end {
            let n = CHUNK.min(table_end - at);
            region.write(at, &zeros[..n as usize]).map_err(io_err)?;
            at += n;
        }
        region
            .write(SLOT, &vec![0u8; SLOT as usize])
            .map_err(io_err)?;
        region.write(0, &header(2, 0)).map_err(io_err)?;
        region.sync().map_err(io_err)?;
        Ok(Self::new(region, table_pages, db_pages, (2, 0)))
    }

    fn new(region: MirroredRegion, table_pages: u64, db_pages: u64, state: (u64, u64)) -> Self {
        let key = (region.pool().guid, region.offset());
        let inner = Arc::new(Inner {
            region,
            table_pages,
            db_pages,
            state: Mutex::new(state),
            sums: Mutex::new(Sums::default()),
            pending_header: Mutex::new(None),
            touched: Mutex::new(None),
        });
        let mut live = LIVE.lock();
        live.retain(|(_, _, w)| w.strong_count() > 0);
        live.push((key.0, key.1, Arc::downgrade(&inner)));
        RegionBackend { inner }
    }

    /// Opens a formatted region, refusing format 1 by name.
    pub fn open(region: MirroredRegion) -> Result<Self, MetaError> {
        let mut best: Option<(u64, u64)> = None;
        let mut old = false;
        for slot in 0..2 {
            let mut buf = vec![0u8; SLOT as usize];
            // A slot that fails to verify on one device is read from another.
            let ok = region
                .read_verified(slot * SLOT, &mut buf, |b| {
                    matches!(parse(b), Slot::Valid(..) | Slot::Version1)
                })
                .is_ok();
            if !ok {
                continue;
            }
            match parse(&buf) {
                Slot::Valid(g, l) if best.is_none_or(|b| g > b.0) => best = Some((g, l)),
                Slot::Version1 => old = true,
                _ => {}
            }
        }
        let Some(state) = best else {
            return Err(if old {
                MetaError::Older {
                    found: 1,
                    what: "no page checksums",
                }
            } else {
                MetaError::Region("no valid metadata header on any device".into())
            });
        };
        let (table_pages, db_pages) = plan(region.size());
        Ok(Self::new(region, table_pages, db_pages, state))
    }
}

/// Pages a crash left behind. A commit that a kill -9 interrupted may have
/// written pages (free ones: redb is copy-on-write) whose checksums never
/// became durable; the last committed transaction does not reference them,
/// but they lie below the database length, so a strict verification would
/// call them damaged. After such a crash redb repairs at open: it walks
/// and checks every page the committed roots reference, with a cold cache,
/// so every one of them is read through this backend. The pages below the
/// length that this walk did not read are not referenced: their checksum
/// entries are cleared (no checksum: accepted until redb writes them
/// again, which records a new one), so a scrub checks exactly what the last
/// committed transaction references.
pub struct RepairWatch {
    inner: Arc<Inner>,
    repaired: Arc<std::sync::atomic::AtomicBool>,
}

impl RepairWatch {
    /// The repair callback for `redb::Builder::set_repair_callback`.
    pub fn callback(&self) -> impl Fn(&mut redb::RepairSession) + 'static {
        let inner = Arc::downgrade(&self.inner);
        let repaired = self.repaired.clone();
        move |session: &mut redb::RepairSession| {
            repaired.store(true, std::sync::atomic::Ordering::Release);
            // 0.3: the newest root failed its checks and is rolled back; the
            // walk starts again on the previous root with a cleared cache.
            if (0.25..0.35).contains(&session.progress()) {
                if let Some(i) = inner.upgrade() {
                    if let Some(t) = i.touched.lock().as_mut() {
                        t.fill(0);
                    }
                }
            }
        }
    }

    /// Ends the watch once the database is open: after a repair, clears the
    /// checksum entries of the pages nothing referenced (written to the
    /// table at the next sync). Returns how many were cleared.
    pub fn finish(self) -> io::Result<u64> {
        let inner = &self.inner;
        let touched = inner.touched.lock().take().unwrap_or_default();
        if !self.repaired.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(0);
        }
        let len = inner.state.lock().1;
        let pages = len.div_ceil(PAGE).min(inner.db_pages);
        let mut sums = inner.sums.lock();
        let mut cleared = 0;
        // Page 0 is redb's header, rewritten in place: always referenced.
        for page in 1..pages {
            let read = touched
                .get((page / 64) as usize)
                .is_some_and(|w| w & (1 << (page % 64)) != 0);
            if read || inner.entry(&mut sums, page)?.0 == [0u8; 16] {
                continue;
            }
            let tp = page / PER_TABLE_PAGE;
            let at = (page % PER_TABLE_PAGE) as usize * ENTRY;
            let t = inner.table_page(&mut sums, tp)?;
            t[at..at + ENTRY].fill(0);
            sums.dirty.insert(tp);
            cleared += 1;
        }
        Ok(cleared)
    }
}

impl RegionBackend {
    /// Starts recording the pages read, for [`RepairWatch::finish`].
    pub fn watch_repair(&self) -> RepairWatch {
        *self.inner.touched.lock() = Some(vec![0; self.inner.db_pages.div_ceil(64) as usize]);
        RepairWatch {
            inner: self.inner.clone(),
            repaired: Arc::default(),
        }
    }
}

impl StorageBackend for RegionBackend {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(self.inner.state.lock().1)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        if out.is_empty() {
            return Ok(());
        }
        let inner = &self.inner;
        let end = offset + out.len() as u64;
        if end > inner.capacity() {
            return Err(io_err(format!("metadata read beyond the region ({end})")));
        }
        let first = offset / PAGE;
        let last = end.div_ceil(PAGE);
        if offset % PAGE == 0 && end % PAGE == 0 {
            return inner.read_pages(first, out);
        }
        let mut buf = vec![0u8; ((last - first) * PAGE) as usize];
        inner.read_pages(first, &mut buf)?;
        let skip = (offset - first * PAGE) as usize;
        out.copy_from_slice(&buf[skip..skip + out.len()]);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let inner = &self.inner;
        if len > inner.capacity() {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "metadata region full: {len} bytes needed, {} available",
                    inner.capacity()
                ),
            ));
        }
        let mut state = inner.state.lock();
        let generation = state.0 + 1;
        // Alternate slots so the previous header stays valid until this one is synced.
        inner
            .region
            .write((generation % 2) * SLOT, &header(generation, len))
            .map_err(io_err)?;
        *state = (generation, len);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        let inner = &self.inner;
        let mut sums = inner.sums.lock();
        let header = inner.pending_header.lock().take();
        match header {
            None => inner.flush_table(&mut sums, false)?,
            Some(page) => {
                // Pages, then their checksums, then the header naming them.
                inner.region.sync().map_err(io_err)?;
                inner.set_entry(&mut sums, 0, page_sum(0, &page))?;
                inner.flush_table(&mut sums, true)?;
                inner
                    .region
                    .write(inner.data_start(), &page)
                    .map_err(io_err)?;
            }
        }
        drop(sums);
        inner.region.sync().map_err(io_err)
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let inner = &self.inner;
        let end = offset + data.len() as u64;
        if end > inner.capacity() {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "metadata region full",
            ));
        }
        if data.is_empty() {
            return Ok(());
        }
        let first = offset / PAGE;
        let last = end.div_ceil(PAGE);
        let mut sums = inner.sums.lock();
        let aligned = offset % PAGE == 0 && end % PAGE == 0;
        let owned;
        let pages: &[u8] = if aligned {
            data
        } else {
            // Partial pages: read what the rest of them holds.
            let mut buf = vec![0u8; ((last - first) * PAGE) as usize];
            drop(sums);
            inner.read_pages(first, &mut buf)?;
            sums = inner.sums.lock();
            let skip = (offset - first * PAGE) as usize;
            buf[skip..skip + data.len()].copy_from_slice(data);
            owned = buf;
            &owned
        };
        // The header waits for `sync_data` (see the module documentation).
        let (first, pages) = if first == 0 {
            *inner.pending_header.lock() = Some(pages[..PAGE as usize].into());
            (1, &pages[PAGE as usize..])
        } else {
            (first, pages)
        };
        if pages.is_empty() {
            return Ok(());
        }
        for (i, page) in pages.chunks(PAGE as usize).enumerate() {
            let index = first + i as u64;
            inner.set_entry(&mut sums, index, page_sum(index, page))?;
        }
        inner
            .region
            .write(inner.data_start() + first * PAGE, pages)
            .map_err(io_err)
    }
}

/// What [`verify_all`] examined and repaired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetaScrubReport {
    /// Bytes examined (per copy: every device's copy counts).
    pub examined_bytes: u64,
    /// Bytes rewritten on devices whose copy was wrong or unreadable.
    pub repaired_bytes: u64,
    /// Guids of devices that held a wrong or unreadable copy.
    pub bad_devices: Vec<u64>,
    /// Database pages with no good copy anywhere.
    pub unrecoverable_pages: Vec<u64>,
}

impl MetaScrubReport {
    fn add(&mut self, out: &ScrubOutcome) {
        self.repaired_bytes += out.repaired_bytes;
        for g in &out.bad_devices {
            if !self.bad_devices.contains(g) {
                self.bad_devices.push(*g);
            }
        }
    }
}

/// (bytes of the database, bytes the region holds at most) of the open
/// store on `region`: how full the metadata is.
pub fn usage(region: &MirroredRegion) -> Option<(u64, u64)> {
    let key = (region.pool().guid, region.offset());
    let live = LIVE
        .lock()
        .iter()
        .filter(|(g, o, _)| (*g, *o) == key)
        .find_map(|(_, _, w)| w.upgrade())?;
    let used = live.state.lock().1;
    Some((used, live.capacity()))
}

/// Verifies every copy of every metadata page on every device (header
/// slots, checksum table, database pages up to the database length) and
/// rewrites each wrong or unreadable copy from a good one, raising CKSUM on
/// the devices that held a wrong copy. Devices being resilvered are
/// rewritten too (without counting), so this is also the metadata part of
/// a resilver. Works alongside the open database (it takes the same locks
/// as its writes, a batch of pages at a time).
pub fn verify_all(region: &MirroredRegion) -> Result<MetaScrubReport, MetaError> {
    let key = (region.pool().guid, region.offset());
    let live = LIVE
        .lock()
        .iter()
        .filter(|(g, o, _)| (*g, *o) == key)
        .find_map(|(_, _, w)| w.upgrade());
    let inner = match live {
        Some(i) => i,
        None => RegionBackend::open(region.clone())?.inner,
    };
    let mut report = MetaScrubReport::default();
    let copies = region.pool().devices().len() as u64;
    // Header slots: a slot no copy of which is valid is simply unused.
    {
        let _state = inner.state.lock();
        for slot in 0..2 {
            report.examined_bytes += SLOT * copies;
            if let Ok((_, out)) = region.scrub(slot * SLOT, SLOT as usize, |b| {
                matches!(parse(b), Slot::Valid(..))
            }) {
                report.add(&out);
            }
        }
    }
    let len = inner.state.lock().1;
    let db_pages = len.div_ceil(PAGE).min(inner.db_pages);
    let used_tables = db_pages.div_ceil(PER_TABLE_PAGE);
    for tp in 0..used_tables {
        let mut sums = inner.sums.lock();
        if sums.dirty.contains(&tp) {
            continue; // rewritten at the next sync anyway
        }
        report.examined_bytes += PAGE * copies;
        let at = TABLE_START + tp * PAGE;
        let known = sums.pages.get(&tp).map(|b| b.to_vec());
        let result = region.scrub(at, PAGE as usize, |b| match &known {
            Some(k) => b == k.as_slice(),
            None => table_page_ok(tp, b),
        });
        match (result, known) {
            (Ok((good, out)), known) => {
                report.add(&out);
                if known.is_none() {
                    sums.pages.insert(tp, good.into_boxed_slice());
                }
            }
            // No copy matches what the open database knows: write it back.
            (Err(_), Some(k)) => {
                region.write(at, &k).map_err(region_err)?;
                report.repaired_bytes += PAGE * copies;
            }
            (Err(e), None) => {
                return Err(MetaError::Region(format!(
                    "checksum table page {tp} has no good copy: {e}"
                )))
            }
        }
    }
    let mut page = 0;
    while page < db_pages {
        let n = SCRUB_BATCH.min(db_pages - page);
        let sums_guard = &mut inner.sums.lock();
        let entries: Vec<(Sum, Sum)> = (page..page + n)
            .map(|p| inner.entry(sums_guard, p))
            .collect::<io::Result<_>>()
            .map_err(region_err)?;
        report.examined_bytes += n * PAGE * copies;
        let at = inner.data_start() + page * PAGE;
        // Strict: the current checksum only.
        let ok = |i: usize, b: &[u8]| {
            entries[i].0 == [0u8; 16] || page_sum(page + i as u64, b) == entries[i].0
        };
        let (_, out, lost) = region.scrub_pages(at, (n * PAGE) as usize, PAGE as usize, ok)?;
        report.add(&out);
        report
            .unrecoverable_pages
            .extend(lost.into_iter().map(|i| page + i as u64));
        page += n;
    }
    if !report.bad_devices.is_empty() || !report.unrecoverable_pages.is_empty() {
        tracing::warn!(?report, "metadata verified");
    }
    Ok(report)
}

fn region_err(e: impl std::fmt::Display) -> MetaError {
    MetaError::Region(e.to_string())
}

impl From<PoolError> for MetaError {
    fn from(e: PoolError) -> Self {
        region_err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema;
    use pool::{LayoutKind, Pool, Vdev};
    use redb::{ReadableDatabase, ReadableTable};
    use std::sync::atomic::Ordering;

    fn mirror(
        dir: &std::path::Path,
        n: usize,
        kind: LayoutKind,
    ) -> (Arc<Pool>, Vec<std::path::PathBuf>) {
        let paths: Vec<_> = (0..n).map(|i| dir.join(format!("d{i}"))).collect();
        let devs = paths
            .iter()
            .map(|p| Vdev::open_or_create(p, Some(128 << 20)).unwrap())
            .collect();
        (
            Arc::new(Pool::create("tank", vec![(kind, devs)]).unwrap()),
            paths,
        )
    }

    fn fill(db: &redb::Database, n: u64) {
        let tx = db.begin_write().unwrap();
        {
            let mut t = tx.open_table(schema::BLOCKS_V2).unwrap();
            for i in 0..n {
                t.insert((1, i, 3), vec![i as u8; 300].as_slice()).unwrap();
            }
        }
        tx.commit().unwrap();
    }

    fn check(db: &redb::Database, n: u64) {
        let tx = db.begin_read().unwrap();
        let t = tx.open_table(schema::BLOCKS_V2).unwrap();
        assert_eq!(t.iter().unwrap().count() as u64, n);
        for i in 0..n {
            assert_eq!(
                t.get((1, i, 3)).unwrap().unwrap().value(),
                vec![i as u8; 300]
            );
        }
    }

    /// Database pages with a recorded checksum (written by redb).
    fn written_pages(inner: &Inner) -> Vec<u64> {
        let len = inner.state.lock().1;
        let mut sums = inner.sums.lock();
        (0..len.div_ceil(PAGE))
            .filter(|&p| inner.entry(&mut sums, p).unwrap().0 != [0u8; 16])
            .collect()
    }

    fn cksum(pool: &Pool, i: usize) -> u64 {
        pool.devices()[i].errors.checksum.load(Ordering::Relaxed)
    }

    #[test]
    fn store_lives_on_the_devices_and_survives_losing_one_mirror_side() {
        let dir = tempfile::tempdir().unwrap();
        let (pool, paths) = mirror(dir.path(), 2, LayoutKind::Mirror);
        let db = crate::create(pool.meta_region(), 1 << 20).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(schema::BLOCKS_V2)
            .unwrap()
            .insert((1, 2, 3), b"bp".as_slice())
            .unwrap();
        tx.commit().unwrap();
        drop(db);
        drop(pool);
        // Reassemble with only the second device.
        let v = Vdev::open(&paths[1]).unwrap();
        let l = v.read_label().unwrap();
        let pool = Arc::new(Pool::open(vec![(v, l)]).unwrap());
        let db = crate::open(pool.meta_region(), 1 << 20).unwrap();
        let tx = db.begin_read().unwrap();
        let t = tx.open_table(schema::BLOCKS_V2).unwrap();
        assert_eq!(t.get((1, 2, 3)).unwrap().unwrap().value(), b"bp");
        assert_eq!(t.iter().unwrap().count(), 1);
    }

    #[test]
    fn a_newer_metadata_format_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let dev = Vdev::open_or_create(&dir.path().join("d0"), Some(96 << 20)).unwrap();
        let pool = Arc::new(Pool::create("tank", vec![(LayoutKind::Disk, vec![dev])]).unwrap());
        let db = crate::create(pool.meta_region(), 1 << 20).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(schema::POOL_RECORDS)
            .unwrap()
            .insert(schema::RECORD_FORMAT, crate::META_FORMAT_SEALED_NAMES + 1)
            .unwrap();
        tx.commit().unwrap();
        drop(db);
        let err = crate::open(pool.meta_region(), 1 << 20).unwrap_err();
        assert!(matches!(err, crate::MetaError::Newer { .. }), "{err}");
        assert!(err.to_string().contains("newer than this build"));
    }

    #[test]
    fn format_1_regions_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let dev = Vdev::open_or_create(&dir.path().join("d0"), Some(96 << 20)).unwrap();
        let pool = Arc::new(Pool::create("tank", vec![(LayoutKind::Disk, vec![dev])]).unwrap());
        // A format-1 header, as the previous build wrote it.
        let mut v1 = vec![0u8; SLOT as usize];
        v1[..8].copy_from_slice(MAGIC);
        v1[8..16].copy_from_slice(&5u64.to_le_bytes());
        v1[16..24].copy_from_slice(&(1u64 << 20).to_le_bytes());
        let sum = *blake3::hash(&v1[..24]).as_bytes();
        v1[24..56].copy_from_slice(&sum);
        pool.meta_region().write(0, &v1).unwrap();
        let err = crate::open(pool.meta_region(), 1 << 20).unwrap_err();
        assert!(
            matches!(err, crate::MetaError::Older { found: 1, .. }),
            "{err}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("version 1") && msg.contains("(2 and later)"),
            "{msg}"
        );
    }

    #[test]
    fn a_lying_copy_of_a_metadata_page_is_detected_and_healed() {
        let dir = tempfile::tempdir().unwrap();
        let (pool, _) = mirror(dir.path(), 3, LayoutKind::Raidz { parity: 1 });
        let db = crate::create(pool.meta_region(), 1 << 20).unwrap();
        fill(&db, 2000);
        drop(db);
        let region = pool.meta_region();
        let backend = RegionBackend::open(region.clone()).unwrap();
        let start = region.offset() + backend.inner.data_start();
        let len = backend.inner.state.lock().1;
        let written = written_pages(&backend.inner);
        assert!(written.len() > 10);
        drop(backend);
        // Device 0 lies about every database page (the header page too).
        let dev0 = pool.devices()[0].clone();
        let junk: Vec<u8> = (0..len as usize).map(|i| (i * 31 + 7) as u8).collect();
        dev0.write_at(start, &junk).unwrap();
        // Reads go to device 0 first: every page is caught and read elsewhere.
        let db = crate::open(pool.meta_region(), 0).unwrap();
        check(&db, 2000);
        assert!(cksum(&pool, 0) > 0, "the lying device is counted");
        assert_eq!(cksum(&pool, 1) + cksum(&pool, 2), 0);
        // A full verification heals what the reads did not touch...
        let report = verify_all(&region).unwrap();
        assert!(report.unrecoverable_pages.is_empty());
        assert!(report.examined_bytes >= 3 * len);
        // ...after which every copy is right and nothing more is found.
        let again = verify_all(&region).unwrap();
        assert_eq!(again.repaired_bytes, 0, "{again:?}");
        assert!(again.bad_devices.is_empty());
        for p in written {
            let mut a = vec![0u8; PAGE as usize];
            let mut b = vec![0u8; PAGE as usize];
            dev0.read_at(start + p * PAGE, &mut a).unwrap();
            pool.devices()[1].read_at(start + p * PAGE, &mut b).unwrap();
            assert!(a == b, "page {p} of device 0 healed");
        }
        // Writes still work and the database is consistent.
        fill(&db, 2100);
        check(&db, 2100);
    }

    #[test]
    fn verify_all_heals_a_page_no_read_looked_at() {
        let dir = tempfile::tempdir().unwrap();
        let (pool, _) = mirror(dir.path(), 2, LayoutKind::Mirror);
        let region = pool.meta_region();
        let db = crate::create(region.clone(), 1 << 20).unwrap();
        fill(&db, 500);
        let (start, written) = {
            let live = LIVE.lock();
            let inner = live
                .iter()
                .find_map(|(g, _, w)| (*g == pool.guid).then(|| w.upgrade()).flatten())
                .unwrap();
            (region.offset() + inner.data_start(), written_pages(&inner))
        };
        // The second device (never read while the first answers) lies on one page.
        let dev1 = pool.devices()[1].clone();
        let at = start + written[written.len() / 2] * PAGE + 100;
        dev1.write_at(at, b"lies").unwrap();
        let report = verify_all(&region).unwrap();
        assert_eq!(
            report.bad_devices,
            vec![pool.groups()[0].children()[1].guid]
        );
        assert_eq!(report.repaired_bytes, PAGE);
        assert_eq!(cksum(&pool, 1), 1);
        assert_eq!(verify_all(&region).unwrap().repaired_bytes, 0);
        check(&db, 500);
    }
}

#[cfg(test)]
mod crash_tests {
    use super::*;
    use pool::{LayoutKind, Pool, Vdev};

    /// A crash after redb wrote its header and some pages but before
    /// `sync_data`: the header on disk must still be the previous one (whose
    /// pages verify), never a new header naming pages without durable checksums.
    #[test]
    fn a_header_reaches_the_disk_only_after_the_checksums_it_needs() {
        let dir = tempfile::tempdir().unwrap();
        let devs = (0..2)
            .map(|i| {
                Vdev::open_or_create(&dir.path().join(format!("d{i}")), Some(128 << 20)).unwrap()
            })
            .collect();
        let pool = Arc::new(Pool::create("tank", vec![(LayoutKind::Mirror, devs)]).unwrap());
        let page = |b: u8| vec![b; PAGE as usize];
        let b = RegionBackend::format(pool.meta_region()).unwrap();
        b.set_len(8 * PAGE).unwrap();
        b.write(0, &page(1)).unwrap();
        b.write(PAGE, &page(2)).unwrap();
        b.sync_data().unwrap();
        // Commit 2: the header first (as redb's write buffer may order it), then a page; no sync.
        b.write(0, &page(3)).unwrap();
        b.write(2 * PAGE, &page(4)).unwrap();
        let mut got = page(0);
        b.read(0, &mut got).unwrap();
        assert_eq!(got, page(3), "the unsynced header reads back from memory");
        drop(b); // the crash: nothing more reaches the disk

        let b = RegionBackend::open(pool.meta_region()).unwrap();
        b.read(0, &mut got).unwrap();
        assert_eq!(got, page(1), "the previous header is the one on disk");
        b.read(PAGE, &mut got).unwrap();
        assert_eq!(got, page(2), "and the page it names verifies");
        // A synced commit: header and page both verify after a reopen.
        b.write(0, &page(5)).unwrap();
        b.write(2 * PAGE, &page(6)).unwrap();
        b.sync_data().unwrap();
        drop(b);
        let b = RegionBackend::open(pool.meta_region()).unwrap();
        b.read(0, &mut got).unwrap();
        assert_eq!(got, page(5));
        b.read(2 * PAGE, &mut got).unwrap();
        assert_eq!(got, page(6));
    }
}

//! Raidz: Reed-Solomon parity over the devices of a group (decision 0006,
//! docs/on-disk-format.md "Raidz mapping").
//!
//! A raidz group of `width` devices with `parity` parity columns has
//! `data = width - parity` data columns. Row `r` is sector `r` of every
//! device's data region. A group's logical space is its rows laid end to
//! end, `data` sectors per row: logical sector `L` is data column `L % data`
//! of row `L / data`. Parity is computed per row over that row's data
//! sectors. The allocator hands out whole rows only, so no two blocks share
//! a row: a block is written once, with its parity, and never updated in
//! place (no read-modify-write of parity, no write hole).
//!
//! The columns rotate every `ROTATE_ROWS` rows so parity does not sit on
//! the same devices: in row `r`, column `c` (0..data data, data.. parity) is
//! on device `(r / ROTATE_ROWS + c) % width`.
//!
//! Because parity is per row and the mapping depends only on the row, a run
//! of adjacent blocks maps exactly like one block spanning the same rows:
//! the txg writes a run with one write per device, and a run read needs one
//! read per device.

use crate::{on_each, read_buf, write_buf, Dva, Group, Pool, PoolError, DIRECT_MIN, SECTOR};
use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use vdev::AlignedBuf;
use vdev::Vdev;

/// Widest raidz group accepted: bounds the combinatorial reconstruction
/// (at most C(32, 3) = 4960 trials for a raidz3 block) and the allocation
/// unit (31 data sectors = 124 KiB per row).
pub const MAX_RAIDZ_WIDTH: usize = 32;
/// Rows per rotation step (1 MiB of every device).
pub const ROTATE_ROWS: u64 = 256;
const S: usize = SECTOR as usize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub width: usize,
    pub parity: usize,
}

/// A range of whole rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub row0: u64,
    pub rows: u64,
}

impl Span {
    /// Bytes of each device's buffer for this span.
    pub fn dev_bytes(&self) -> usize {
        self.rows as usize * S
    }
}

/// Rows `rel..rel + rows` of a span (relative) share rotation `rot`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Segment {
    pub rel: u64,
    pub rows: u64,
    pub rot: usize,
}

impl Geometry {
    pub fn new(width: usize, parity: usize) -> Geometry {
        assert!(
            (1..=3).contains(&parity) && width > parity && width <= MAX_RAIDZ_WIDTH,
            "raidz geometry {width}/{parity}"
        );
        Geometry { width, parity }
    }

    pub fn data(&self) -> usize {
        self.width - self.parity
    }

    /// Logical bytes per row: the allocation unit.
    pub fn unit(&self) -> u64 {
        self.data() as u64 * SECTOR
    }

    /// Logical (allocatable) bytes of a group with `data_size` bytes per device.
    pub fn capacity(&self, data_size: u64) -> u64 {
        data_size / SECTOR * self.unit()
    }

    fn rot(&self, row: u64) -> usize {
        ((row / ROTATE_ROWS) % self.width as u64) as usize
    }

    /// Device holding column `col` of row `row`.
    pub fn device(&self, row: u64, col: usize) -> usize {
        (self.rot(row) + col) % self.width
    }

    /// The rows covering logical bytes `offset..offset + len`.
    pub fn span(&self, offset: u64, len: u64) -> Span {
        let row0 = offset / self.unit();
        let end = (offset + len).div_ceil(self.unit());
        Span {
            row0,
            rows: end.saturating_sub(row0).max(1),
        }
    }

    pub fn segments(&self, span: Span) -> Vec<Segment> {
        let mut out = Vec::new();
        let mut rel = 0;
        while rel < span.rows {
            let row = span.row0 + rel;
            let to_boundary = ROTATE_ROWS - row % ROTATE_ROWS;
            let rows = to_boundary.min(span.rows - rel);
            out.push(Segment {
                rel,
                rows,
                rot: self.rot(row),
            });
            rel += rows;
        }
        out
    }

    /// Devices that hold data columns somewhere in `span`.
    pub fn data_devices(&self, span: Span) -> Vec<bool> {
        let mut v = vec![false; self.width];
        for seg in self.segments(span) {
            for c in 0..self.data() {
                v[(seg.rot + c) % self.width] = true;
            }
        }
        v
    }

    /// (device, byte offset in that device's span buffer) of logical sector
    /// `i` counted from the start of `span`.
    fn locate(&self, span: Span, i: u64) -> (usize, usize) {
        let d = self.data() as u64;
        let rel = i / d;
        let dev = self.device(span.row0 + rel, (i % d) as usize);
        (dev, rel as usize * S)
    }

    /// Copies the byte stream `bufs` into the data columns of `cols` (one
    /// buffer of `span.dev_bytes()` per device), starting `start` logical
    /// bytes into the span. Bytes not covered stay as they are.
    pub fn scatter(&self, span: Span, start: u64, bufs: &[&[u8]], cols: &mut [AlignedBuf]) {
        let mut pos = start;
        for b in bufs {
            let mut b: &[u8] = b;
            while !b.is_empty() {
                let within = (pos % SECTOR) as usize;
                let n = (S - within).min(b.len());
                let (dev, at) = self.locate(span, pos / SECTOR);
                cols[dev][at + within..at + within + n].copy_from_slice(&b[..n]);
                b = &b[n..];
                pos += n as u64;
            }
        }
    }

    /// Copies `out.len()` logical bytes starting `start` bytes into the
    /// span out of the data columns of `cols`.
    pub fn gather(&self, span: Span, start: u64, cols: &[&[u8]], out: &mut [u8]) {
        let mut pos = start;
        let mut done = 0;
        while done < out.len() {
            let within = (pos % SECTOR) as usize;
            let n = (S - within).min(out.len() - done);
            let (dev, at) = self.locate(span, pos / SECTOR);
            out[done..done + n].copy_from_slice(&cols[dev][at + within..at + within + n]);
            done += n;
            pos += n as u64;
        }
    }

    /// Computes the parity columns of `cols` from their data columns.
    pub fn encode(&self, span: Span, cols: &mut [AlignedBuf]) -> Result<(), PoolError> {
        self.each_parity(span, cols, |stored, computed| {
            stored.copy_from_slice(computed);
            true
        })
        .map(|_| ())
    }

    /// Whether the parity held in `cols` matches their data columns
    /// (nothing is written; `&mut` only to share [`Geometry::encode`]'s loop).
    pub fn parity_matches(&self, span: Span, cols: &mut [AlignedBuf]) -> Result<bool, PoolError> {
        self.each_parity(span, cols, |stored, computed| stored == computed)
    }

    /// Computes the parity of every rotation segment of `span` from the data
    /// columns of `cols` and hands each parity column's stored bytes and the
    /// computed ones to `visit`; stops (returning false) when `visit` does.
    fn each_parity(
        &self,
        span: Span,
        cols: &mut [AlignedBuf],
        mut visit: impl FnMut(&mut [u8], &[u8]) -> bool,
    ) -> Result<bool, PoolError> {
        assert_eq!(cols.len(), self.width);
        let (d, p) = (self.data(), self.parity);
        let mut enc: Option<ReedSolomonEncoder> = None;
        for seg in self.segments(span) {
            let range = seg.rel as usize * S..(seg.rel + seg.rows) as usize * S;
            let bytes = range.len();
            let e = match enc.as_mut() {
                Some(e) => {
                    e.reset(d, p, bytes).map_err(rs_err)?;
                    e
                }
                None => enc.insert(ReedSolomonEncoder::new(d, p, bytes).map_err(rs_err)?),
            };
            for c in 0..d {
                e.add_original_shard(&cols[(seg.rot + c) % self.width][range.clone()])
                    .map_err(rs_err)?;
            }
            let result = e.encode().map_err(rs_err)?;
            for k in 0..p {
                let rec = result
                    .recovery(k)
                    .ok_or_else(|| PoolError::Parity(format!("no recovery shard {k}")))?;
                if !visit(
                    &mut cols[(seg.rot + d + k) % self.width][range.clone()],
                    rec,
                ) {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Recomputes the whole content (data and parity columns) of the
    /// devices in `erased` from the other devices' buffers. At most
    /// `parity` devices may be erased.
    pub fn reconstruct(
        &self,
        span: Span,
        cols: &mut [AlignedBuf],
        erased: &[bool],
    ) -> Result<(), PoolError> {
        assert_eq!(cols.len(), self.width);
        let n_erased = erased.iter().filter(|&&e| e).count();
        if n_erased > self.parity {
            return Err(PoolError::Parity(format!(
                "{n_erased} columns lost, parity {}",
                self.parity
            )));
        }
        let (d, p, w) = (self.data(), self.parity, self.width);
        for seg in self.segments(span) {
            let range = seg.rel as usize * S..(seg.rel + seg.rows) as usize * S;
            let bytes = range.len();
            let dev = |c: usize| (seg.rot + c) % w;
            let lost_data: Vec<usize> = (0..d).filter(|&c| erased[dev(c)]).collect();
            let lost_parity: Vec<usize> = (0..p).filter(|&k| erased[dev(d + k)]).collect();
            if !lost_data.is_empty() {
                let mut dec = ReedSolomonDecoder::new(d, p, bytes).map_err(rs_err)?;
                for c in (0..d).filter(|&c| !erased[dev(c)]) {
                    dec.add_original_shard(c, &cols[dev(c)][range.clone()])
                        .map_err(rs_err)?;
                }
                for k in (0..p).filter(|&k| !erased[dev(d + k)]) {
                    dec.add_recovery_shard(k, &cols[dev(d + k)][range.clone()])
                        .map_err(rs_err)?;
                }
                let result = dec.decode().map_err(rs_err)?;
                for &c in &lost_data {
                    let shard = result
                        .restored_original(c)
                        .ok_or_else(|| PoolError::Parity(format!("column {c} not restored")))?;
                    cols[dev(c)][range.clone()].copy_from_slice(shard);
                }
            }
            if !lost_parity.is_empty() {
                let mut enc = ReedSolomonEncoder::new(d, p, bytes).map_err(rs_err)?;
                for c in 0..d {
                    enc.add_original_shard(&cols[dev(c)][range.clone()])
                        .map_err(rs_err)?;
                }
                let result = enc.encode().map_err(rs_err)?;
                for &k in &lost_parity {
                    let rec = result
                        .recovery(k)
                        .ok_or_else(|| PoolError::Parity(format!("no recovery shard {k}")))?;
                    cols[dev(d + k)][range.clone()].copy_from_slice(rec);
                }
            }
        }
        Ok(())
    }
}

fn rs_err(e: reed_solomon_simd::Error) -> PoolError {
    PoolError::Parity(e.to_string())
}

/// Every subset of `items` with exactly `k` members, in lexicographic
/// order, passed to `f` until it returns true. Returns whether one did.
pub(crate) fn for_each_combination(
    items: &[usize],
    k: usize,
    mut f: impl FnMut(&[usize]) -> bool,
) -> bool {
    if k > items.len() {
        return false;
    }
    let mut idx: Vec<usize> = (0..k).collect();
    let mut pick = Vec::with_capacity(k);
    // Bounded: C(n, k) <= C(MAX_RAIDZ_WIDTH, 3) iterations.
    loop {
        pick.clear();
        pick.extend(idx.iter().map(|&i| items[i]));
        if f(&pick) {
            return true;
        }
        // Advance: bump the rightmost index that can still grow.
        let n = items.len();
        let mut i = k;
        while i > 0 && idx[i - 1] == n - k + (i - 1) {
            i -= 1;
        }
        if i == 0 {
            return false;
        }
        idx[i - 1] += 1;
        for j in i..k {
            idx[j] = idx[j - 1] + 1;
        }
    }
}

// -------------------------------------------------------------------
// I/O on a raidz group

/// What [`repair`] is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Return verified data; heal what was found wrong on the way.
    Read,
    /// Read every column, parity included; heal and count every wrong one.
    Scrub,
    /// Rebuild the column of this child (being resilvered).
    Resilver(usize),
}

pub(crate) struct Repaired {
    pub data: Vec<u8>,
    pub repaired_bytes: u64,
    /// Guids of devices whose column was wrong or unreadable.
    pub bad: Vec<u64>,
    /// Bytes written to the resilver target.
    pub written: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Col {
    Unread,
    Ok,
    /// Read error (counted as READ by the device).
    Failed,
    /// No readable device (missing, offline, faulted, resilvering).
    Absent,
}

/// Reads the span of each device in `which` into `cols`, in parallel when
/// the reads are large.
fn read_cols(
    devs: &[Option<Arc<Vdev>>],
    which: &[usize],
    at: u64,
    cols: &mut [AlignedBuf],
    state: &mut [Col],
) {
    let mut jobs: Vec<(usize, &mut AlignedBuf, Arc<Vdev>)> = Vec::new();
    for (i, buf) in cols.iter_mut().enumerate() {
        if !which.contains(&i) || state[i] != Col::Unread {
            continue;
        }
        match &devs[i] {
            Some(d) => jobs.push((i, buf, d.clone())),
            None => state[i] = Col::Absent,
        }
    }
    let parallel = jobs.len() > 1 && jobs.first().is_some_and(|j| j.1.len() >= DIRECT_MIN);
    let results: Vec<(usize, bool)> = if parallel {
        std::thread::scope(|s| {
            let handles: Vec<_> = jobs
                .into_iter()
                .map(|(i, buf, d)| s.spawn(move || (i, read_buf(&d, at, buf).is_ok())))
                .collect();
            handles
                .into_iter()
                .map(|h| match h.join() {
                    Ok(r) => r,
                    Err(p) => std::panic::resume_unwind(p),
                })
                .collect()
        })
    } else {
        jobs.into_iter()
            .map(|(i, buf, d)| (i, read_buf(&d, at, buf).is_ok()))
            .collect()
    };
    for (i, ok) in results {
        state[i] = if ok { Col::Ok } else { Col::Failed };
    }
}

fn check_dva(group: &Group, geo: Geometry, dva: Dva) -> Result<Span, PoolError> {
    crate::check_extent(group, dva)?;
    Ok(geo.span(dva.offset, dva.asize as u64))
}

/// Writes a full stripe: data columns and parity, one write per device.
pub(crate) fn write(
    pool: &Pool,
    group: &Group,
    geo: Geometry,
    dva: Dva,
    bufs: &[&[u8]],
) -> Result<(), PoolError> {
    assert!(
        dva.offset % geo.unit() == 0 && dva.asize as u64 % geo.unit() == 0,
        "raidz write not in whole rows"
    );
    let span = geo.span(dva.offset, dva.asize as u64);
    let bytes = span.dev_bytes();
    let mut cols: Vec<AlignedBuf> = (0..geo.width).map(|_| AlignedBuf::zeroed(bytes)).collect();
    geo.scatter(span, 0, bufs, &mut cols);
    geo.encode(span, &mut cols)?;
    let at = pool.regions.data_offset + span.row0 * SECTOR;
    let jobs: Vec<(Arc<Vdev>, &AlignedBuf)> = group
        .children
        .iter()
        .zip(&cols)
        .filter_map(|(c, b)| c.writable().map(|d| (d, b)))
        .collect();
    let results = if bytes * jobs.len() >= 4 * DIRECT_MIN {
        on_each(&jobs, |(d, b)| write_buf(d, at, b, bytes))
    } else {
        jobs.iter()
            .map(|(d, b)| write_buf(d, at, b, bytes))
            .collect()
    };
    let written = results.iter().filter(|r| r.is_ok()).count();
    let survives = geo.width - written <= geo.parity;
    let mut last = None;
    for ((d, _), r) in jobs.iter().zip(results) {
        if let Err(e) = r {
            // Faulted only when the row is still whole without it (see settle_writes).
            if survives {
                crate::fault(d, &e);
            }
            last = Some(e);
        }
    }
    if !survives {
        return Err(match last {
            Some(e) => e.into(),
            None => PoolError::GroupUnavailable {
                pool: pool.name.clone(),
                group: group.index as usize,
            },
        });
    }
    Ok(())
}

/// Reads `len` logical bytes from `offset` without verifying,
/// reconstructing from parity when data columns are unavailable.
pub(crate) fn read_run(
    pool: &Pool,
    group: &Group,
    geo: Geometry,
    offset: u64,
    len: usize,
) -> Result<AlignedBuf, PoolError> {
    let end = offset.checked_add(len as u64);
    if len == 0 || end.is_none_or(|e| e > group.capacity()) {
        return Err(PoolError::Unrecoverable {
            group: group.index,
            offset,
            reason: format!("run of {len} bytes beyond the group's capacity"),
        });
    }
    let span = geo.span(offset, len as u64);
    let bytes = span.dev_bytes();
    let at = pool.regions.data_offset + span.row0 * SECTOR;
    let devs: Vec<Option<Arc<Vdev>>> = group.children.iter().map(|c| c.readable()).collect();
    let datadev = geo.data_devices(span);
    let mut cols: Vec<AlignedBuf> = (0..geo.width).map(|_| AlignedBuf::zeroed(bytes)).collect();
    let mut state = vec![Col::Unread; geo.width];
    let first: Vec<usize> = (0..geo.width).filter(|&i| datadev[i]).collect();
    read_cols(&devs, &first, at, &mut cols, &mut state);
    if first.iter().any(|&i| state[i] != Col::Ok) {
        let rest: Vec<usize> = (0..geo.width).collect();
        read_cols(&devs, &rest, at, &mut cols, &mut state);
        let erased: Vec<bool> = state.iter().map(|s| *s != Col::Ok).collect();
        if erased.iter().filter(|&&e| e).count() > geo.parity {
            return Err(PoolError::Unrecoverable {
                group: group.index,
                offset,
                reason: format!(
                    "{} of {} raidz{} columns unreadable",
                    erased.iter().filter(|&&e| e).count(),
                    geo.width,
                    geo.parity
                ),
            });
        }
        geo.reconstruct(span, &mut cols, &erased)?;
    }
    let mut out = AlignedBuf::zeroed(len);
    let refs: Vec<&[u8]> = cols.iter().map(|c| &c[..]).collect();
    geo.gather(
        span,
        offset - span.row0 * geo.unit(),
        &refs,
        &mut out[..len],
    );
    Ok(out)
}

/// The raidz read/scrub/resilver engine: see [`Mode`] and
/// `Pool::read_verified` for the reconstruction it does.
pub(crate) fn repair(
    pool: &Pool,
    group: &Group,
    geo: Geometry,
    dva: Dva,
    len: usize,
    verify: &dyn Fn(&[u8]) -> bool,
    mode: Mode,
) -> Result<Repaired, PoolError> {
    let span = check_dva(group, geo, dva)?;
    if len as u64 > dva.asize as u64 {
        return Err(PoolError::Unrecoverable {
            group: dva.group,
            offset: dva.offset,
            reason: format!("{len} bytes asked of a {}-byte allocation", dva.asize),
        });
    }
    let w = geo.width;
    let bytes = span.dev_bytes();
    let at = pool.regions.data_offset + span.row0 * SECTOR;
    let devs: Vec<Option<Arc<Vdev>>> = group
        .children
        .iter()
        .enumerate()
        .map(|(i, c)| c.readable().filter(|_| mode != Mode::Resilver(i)))
        .collect();
    let datadev = geo.data_devices(span);
    let mut cols: Vec<AlignedBuf> = (0..w).map(|_| AlignedBuf::zeroed(bytes)).collect();
    let mut state = vec![Col::Unread; w];
    let all: Vec<usize> = (0..w).collect();
    let first: Vec<usize> = match mode {
        Mode::Read | Mode::Resilver(_) => (0..w).filter(|&i| datadev[i]).collect(),
        Mode::Scrub => all.clone(),
    };
    read_cols(&devs, &first, at, &mut cols, &mut state);
    let mut data = vec![0u8; len];
    let direct_ok = first
        .iter()
        .filter(|&&i| datadev[i])
        .all(|&i| state[i] == Col::Ok)
        && {
            let refs: Vec<&[u8]> = cols.iter().map(|c| &c[..]).collect();
            geo.gather(span, 0, &refs, &mut data);
            verify(&data)
        };
    // A scrub that read every column well and whose data verifies only
    // needs the parity checked: the usual case, kept cheap.
    let mut clean_scrub = || {
        mode == Mode::Scrub
            && state.iter().all(|s| *s == Col::Ok)
            && geo.parity_matches(span, &mut cols).unwrap_or(false)
    };
    if direct_ok && (mode == Mode::Read || clean_scrub()) {
        return Ok(Repaired {
            data,
            repaired_bytes: 0,
            bad: Vec::new(),
            written: 0,
        });
    }
    if !direct_ok {
        read_cols(&devs, &all, at, &mut cols, &mut state);
        let known: Vec<usize> = (0..w).filter(|&i| state[i] != Col::Ok).collect();
        let fail = |reason: String| PoolError::Unrecoverable {
            group: dva.group,
            offset: dva.offset,
            reason,
        };
        if known.len() > geo.parity {
            return Err(fail(format!(
                "{} of {w} raidz{} columns unreadable",
                known.len(),
                geo.parity
            )));
        }
        let candidates: Vec<usize> = (0..w).filter(|&i| state[i] == Col::Ok).collect();
        let mut found = false;
        let mut err = None;
        for k in 0..=geo.parity - known.len() {
            found = for_each_combination(&candidates, k, |pick| {
                let mut erased = vec![false; w];
                for &i in known.iter().chain(pick) {
                    erased[i] = true;
                }
                if !(0..w).any(|i| erased[i] && datadev[i]) {
                    // The data columns as read: already refused.
                    return false;
                }
                // Trials work on a copy: `cols` keeps what the devices hold.
                let mut work: Vec<AlignedBuf> = cols
                    .iter()
                    .map(|c| {
                        let mut b = AlignedBuf::zeroed(bytes);
                        b.copy_from_slice(c);
                        b
                    })
                    .collect();
                match geo.reconstruct(span, &mut work, &erased) {
                    Ok(()) => {
                        let refs: Vec<&[u8]> = work.iter().map(|c| &c[..]).collect();
                        geo.gather(span, 0, &refs, &mut data);
                        verify(&data)
                    }
                    Err(e) => {
                        err = Some(e);
                        false
                    }
                }
            });
            if found {
                break;
            }
        }
        if !found {
            return Err(fail(format!(
                "no combination of up to {} columns reconstructs data that verifies{}",
                geo.parity,
                err.map(|e| format!(" ({e})")).unwrap_or_default()
            )));
        }
    }
    // `data` is right: rebuild every column from it and compare.
    let mut expect: Vec<AlignedBuf> = (0..w).map(|_| AlignedBuf::zeroed(bytes)).collect();
    geo.scatter(span, 0, &[&data], &mut expect);
    geo.encode(span, &mut expect)?;
    let mut out = Repaired {
        data: Vec::new(),
        repaired_bytes: 0,
        bad: Vec::new(),
        written: 0,
    };
    for (i, child) in group.children.iter().enumerate() {
        let wrong = match state[i] {
            Col::Ok if cols[i][..] != expect[i][..] => {
                if let Some(d) = &devs[i] {
                    d.errors.checksum.fetch_add(1, Ordering::Relaxed);
                }
                true
            }
            Col::Ok => false,
            Col::Failed => true,
            Col::Absent | Col::Unread => false,
        };
        if !wrong {
            continue;
        }
        out.bad.push(child.guid());
        if let Some(d) = child.writable() {
            crate::note_heal(&d, at, "healing raidz column");
            match write_buf(&d, at, &expect[i], bytes) {
                Ok(()) => out.repaired_bytes += bytes as u64,
                Err(e) => crate::fault(&d, &e),
            }
        }
    }
    if let Mode::Resilver(t) = mode {
        let target = group.children[t]
            .writable()
            .ok_or_else(|| PoolError::NoSuchDevice {
                pool: pool.name.clone(),
                guid: group.children[t].guid(),
            })?;
        write_buf(&target, at, &expect[t], bytes)?;
        out.written = bytes as u64;
    }
    out.data = data;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bufs(g: &Geometry, span: Span) -> Vec<AlignedBuf> {
        (0..g.width)
            .map(|_| AlignedBuf::zeroed(span.dev_bytes()))
            .collect()
    }

    #[test]
    fn combinations_are_complete() {
        let mut seen = Vec::new();
        for_each_combination(&[1, 2, 3, 4], 2, |c| {
            seen.push(c.to_vec());
            false
        });
        assert_eq!(seen.len(), 6);
        assert_eq!(seen[0], vec![1, 2]);
        assert_eq!(seen[5], vec![3, 4]);
        let mut n = 0;
        for_each_combination(&[7, 8], 0, |c| {
            assert!(c.is_empty());
            n += 1;
            false
        });
        assert_eq!(n, 1);
        assert!(!for_each_combination(&[1], 2, |_| true));
        let mut n = 0;
        for_each_combination(&(0..32).collect::<Vec<_>>(), 3, |_| {
            n += 1;
            false
        });
        assert_eq!(n, 4960);
    }

    #[test]
    fn parity_of_a_run_is_the_parity_of_its_rows() {
        // Encoding two rows at once equals encoding each row: the property
        // that lets a run of blocks be written as one span.
        for (w, p) in [(3, 1), (6, 2), (7, 3), (2, 1), (4, 3)] {
            let g = Geometry::new(w, p);
            let span = Span { row0: 254, rows: 4 };
            let data: Vec<u8> = (0..span.rows as usize * g.data() * S)
                .map(|i| (i * 7 + i / 4096) as u8)
                .collect();
            let mut all = bufs(&g, span);
            g.scatter(span, 0, &[&data], &mut all);
            g.encode(span, &mut all).unwrap();
            for r in 0..span.rows {
                let one = Span {
                    row0: span.row0 + r,
                    rows: 1,
                };
                let mut cols = bufs(&g, one);
                let row_bytes = g.data() * S;
                let part = &data[r as usize * row_bytes..(r as usize + 1) * row_bytes];
                g.scatter(one, 0, &[part], &mut cols);
                g.encode(one, &mut cols).unwrap();
                for dev in 0..w {
                    let at = r as usize * S;
                    assert_eq!(&all[dev][at..at + S], &cols[dev][..], "w{w} p{p} row {r}");
                }
            }
            // Any `p` lost devices come back.
            let mut out = vec![0u8; data.len()];
            for_each_combination(&(0..w).collect::<Vec<_>>(), p, |lost| {
                let mut cols = bufs(&g, span);
                for dev in 0..w {
                    if !lost.contains(&dev) {
                        cols[dev].copy_from_slice(&all[dev]);
                    }
                }
                let erased: Vec<bool> = (0..w).map(|d| lost.contains(&d)).collect();
                g.reconstruct(span, &mut cols, &erased).unwrap();
                for dev in 0..w {
                    assert_eq!(&cols[dev][..], &all[dev][..], "w{w} p{p} lost {lost:?}");
                }
                let refs: Vec<&[u8]> = cols.iter().map(|c| &c[..]).collect();
                g.gather(span, 0, &refs, &mut out);
                assert_eq!(out, data);
                false
            });
        }
    }
}

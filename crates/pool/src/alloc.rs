//! Data space allocation: per group, a map of free extents and a next-fit
//! cursor, so the blocks of one txg land one after another and are written
//! with few large I/Os. Groups take turns every ROTOR_BYTES (dynamic striping).
//! The map is rebuilt at import from the live block pointers; see
//! docs/decisions/0002-space-map-rebuilt-at-import.md.
//!
//! Each group has an allocation unit: SECTOR for disks and mirrors, one
//! raidz row (`data columns x SECTOR`) for raidz, so a raidz block always
//! owns whole rows (decision 0006). Groups can be added (`pool add`).

use crate::{Dva, SECTOR};
use std::collections::BTreeMap;

const ROTOR_BYTES: u64 = 1 << 20;

#[derive(Debug)]
struct GroupSpace {
    size: u64,
    /// Every offset and size handed out is a multiple of this.
    unit: u64,
    /// offset -> length of each free extent; extents never touch or overlap.
    free: BTreeMap<u64, u64>,
    free_bytes: u64,
    cursor: u64,
}

impl GroupSpace {
    fn new(size: u64, unit: u64) -> Self {
        assert!(unit > 0 && unit % SECTOR == 0, "allocation unit {unit}");
        let size = size / unit * unit;
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(0, size);
        }
        GroupSpace {
            size,
            unit,
            free,
            free_bytes: size,
            cursor: 0,
        }
    }

    fn take(&mut self, offset: u64, extent_start: u64, extent_len: u64, size: u64) {
        debug_assert!(offset >= extent_start && offset + size <= extent_start + extent_len);
        self.free.remove(&extent_start);
        if offset > extent_start {
            self.free.insert(extent_start, offset - extent_start);
        }
        let end = offset + size;
        let extent_end = extent_start + extent_len;
        if end < extent_end {
            self.free.insert(end, extent_end - end);
        }
        self.free_bytes -= size;
    }

    fn allocate(&mut self, size: u64) -> Option<u64> {
        let found = self
            .free
            .range(..=self.cursor)
            .next_back()
            .into_iter()
            .chain(self.free.range(self.cursor + 1..))
            .find(|(&off, &len)| {
                off + len > self.cursor && off.max(self.cursor) + size <= off + len
            })
            .map(|(&off, &len)| (off.max(self.cursor), off, len))
            .or_else(|| {
                self.free
                    .iter()
                    .find(|(_, &len)| len >= size)
                    .map(|(&off, &len)| (off, off, len))
            });
        let (at, start, len) = found?;
        self.take(at, start, len, size);
        self.cursor = at + size;
        Some(at)
    }

    /// Marks a range used; false if any of it was not free (a double allocation).
    fn claim(&mut self, offset: u64, size: u64) -> bool {
        let Some((&start, &len)) = self.free.range(..=offset).next_back() else {
            return false;
        };
        if offset + size > start + len {
            return false;
        }
        self.take(offset, start, len, size);
        true
    }

    /// Returns a range; false if any of it was already free (a double free).
    fn release(&mut self, offset: u64, size: u64) -> bool {
        if offset + size > self.size {
            return false;
        }
        let mut start = offset;
        let mut len = size;
        if let Some((&p, &plen)) = self.free.range(..=offset).next_back() {
            if p + plen > offset {
                return false;
            }
            if p + plen == offset {
                self.free.remove(&p);
                start = p;
                len += plen;
            }
        }
        if let Some((&n, &nlen)) = self.free.range(offset..).next() {
            if n < offset + size {
                return false;
            }
            if n == offset + size {
                self.free.remove(&n);
                len += nlen;
            }
        }
        self.free.insert(start, len);
        self.free_bytes += size;
        true
    }
}

#[derive(Debug)]
pub struct Allocator {
    groups: Vec<GroupSpace>,
    rotor: usize,
    rotor_used: u64,
}

impl Allocator {
    /// Groups of `size` bytes each, allocated in whole sectors.
    pub fn new(group_sizes: Vec<u64>) -> Self {
        Self::with_units(group_sizes.into_iter().map(|s| (s, SECTOR)).collect())
    }

    /// Groups of (size, allocation unit); the unit is a multiple of SECTOR.
    pub fn with_units(groups: Vec<(u64, u64)>) -> Self {
        Allocator {
            groups: groups
                .into_iter()
                .map(|(size, unit)| GroupSpace::new(size, unit))
                .collect(),
            rotor: 0,
            rotor_used: 0,
        }
    }

    /// Appends a group (`pool add`); its index is the number of groups before.
    pub fn add_group(&mut self, size: u64, unit: u64) {
        self.groups.push(GroupSpace::new(size, unit));
    }

    pub fn groups(&self) -> usize {
        self.groups.len()
    }

    /// Allocates `len` bytes rounded up to whole units of the chosen group.
    pub fn allocate(&mut self, len: u64) -> Option<Dva> {
        assert!(len > 0 && len <= u32::MAX as u64 / 2);
        let n = self.groups.len();
        for i in 0..n {
            let g = (self.rotor + i) % n;
            let unit = self.groups[g].unit;
            let size = len.div_ceil(unit) * unit;
            if size > u32::MAX as u64 {
                continue;
            }
            if let Some(offset) = self.groups[g].allocate(size) {
                if g != self.rotor {
                    self.rotor = g;
                    self.rotor_used = 0;
                }
                self.rotor_used += size;
                if self.rotor_used >= ROTOR_BYTES {
                    self.rotor = (self.rotor + 1) % n;
                    self.rotor_used = 0;
                }
                return Some(Dva {
                    group: g as u32,
                    offset,
                    asize: size as u32,
                });
            }
        }
        None
    }

    /// Marks a live block's space used while rebuilding at import.
    /// False also for a range not aligned to the group's unit.
    pub fn claim(&mut self, dva: Dva) -> bool {
        self.groups.get_mut(dva.group as usize).is_some_and(|g| {
            dva.asize > 0
                && dva.offset % g.unit == 0
                && dva.asize as u64 % g.unit == 0
                && g.claim(dva.offset, dva.asize as u64)
        })
    }

    /// Frees a block's space. Callers free only after the txg that stopped
    /// referencing it has committed, so a crash never exposes reused space.
    pub fn free(&mut self, dva: Dva) -> bool {
        self.groups.get_mut(dva.group as usize).is_some_and(|g| {
            dva.offset % g.unit == 0
                && dva.asize as u64 % g.unit == 0
                && g.release(dva.offset, dva.asize as u64)
        })
    }

    pub fn allocated(&self) -> u64 {
        self.groups.iter().map(|g| g.size - g.free_bytes).sum()
    }

    pub fn free_bytes(&self) -> u64 {
        self.groups.iter().map(|g| g.free_bytes).sum()
    }

    /// Bytes allocated in group `g` (0 for a group that does not exist).
    pub fn group_allocated(&self, g: usize) -> u64 {
        self.groups.get(g).map_or(0, |s| s.size - s.free_bytes)
    }

    /// Free-space fragmentation in percent, as ZFS computes it: each free
    /// extent weighs by its size class (16 MiB and more: 0%, 1 MiB: 20%,
    /// 64 KiB: 60%, 4 KiB and less: 95-100%), averaged over the free bytes.
    /// None when nothing is free.
    pub fn fragmentation(&self) -> Option<u32> {
        // ZFS's zfs_frag_table, from 512 B up to 16 MiB (index = log2 - 9).
        const TABLE: [u64; 16] = [
            100, 100, 98, 95, 90, 80, 70, 60, 50, 40, 30, 20, 15, 10, 5, 0,
        ];
        let (mut weighted, mut total) = (0u128, 0u128);
        for g in &self.groups {
            for &len in g.free.values() {
                let class = (63 - len.leading_zeros()).saturating_sub(9) as usize;
                weighted += len as u128 * TABLE[class.min(TABLE.len() - 1)] as u128;
                total += len as u128;
            }
        }
        (total > 0).then(|| (weighted / total) as u32)
    }

    /// Drops the last group (`pool remove`) if nothing is allocated in it;
    /// false (and no change) otherwise.
    pub fn remove_last_group(&mut self) -> bool {
        match self.groups.last() {
            Some(g) if self.groups.len() > 1 && g.free_bytes == g.size => {
                self.groups.pop();
                self.rotor %= self.groups.len();
                self.rotor_used = 0;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragmentation_and_group_removal() {
        let mut a = Allocator::new(vec![64 << 20, 1 << 20]);
        assert_eq!(a.fragmentation(), Some(0));
        // Every other 4 KiB of the first group taken: small holes left.
        let blocks: Vec<Dva> = (0..256).map(|_| a.allocate(4096).unwrap()).collect();
        for b in blocks.iter().step_by(2) {
            assert!(a.free(*b));
        }
        assert!(a.fragmentation().unwrap() > 0);
        assert!(a.group_allocated(0) > 0 || a.group_allocated(1) > 0);
        let used_last = a.group_allocated(1) > 0;
        assert_eq!(a.remove_last_group(), !used_last);
        let mut single = Allocator::new(vec![1 << 20]);
        assert!(!single.remove_last_group(), "the last group stays");
    }

    #[test]
    fn allocations_are_sequential_and_frees_coalesce() {
        let mut a = Allocator::new(vec![1 << 20]);
        let x = a.allocate(5000).unwrap();
        let y = a.allocate(4096).unwrap();
        assert_eq!((x.offset, x.asize), (0, 8192));
        assert_eq!(y.offset, 8192);
        assert!(a.free(x));
        assert!(!a.free(x), "double free detected");
        assert!(a.free(y));
        assert_eq!(a.allocated(), 0);
        assert!(a.claim(Dva {
            group: 0,
            offset: 4096,
            asize: 4096
        }));
        assert!(
            !a.claim(Dva {
                group: 0,
                offset: 4096,
                asize: 8192
            }),
            "double claim detected"
        );
    }

    #[test]
    fn fills_up_then_reports_no_space_and_stripes_across_groups() {
        let mut a = Allocator::new(vec![4 << 20, 4 << 20]);
        let mut seen = [0u64; 2];
        while let Some(d) = a.allocate(128 << 10) {
            seen[d.group as usize] += 1;
        }
        assert_eq!(seen, [32, 32]);
        assert_eq!(a.free_bytes(), 0);
    }

    #[test]
    fn raidz_groups_allocate_whole_rows_and_groups_can_be_added() {
        // A 5-wide raidz1 row holds 4 data sectors.
        let unit = 4 * SECTOR;
        let mut a = Allocator::with_units(vec![(100 * unit + 5, unit)]);
        let x = a.allocate(1).unwrap();
        assert_eq!((x.offset, x.asize as u64), (0, unit));
        let y = a.allocate(unit + 1).unwrap();
        assert_eq!((y.offset, y.asize as u64), (unit, 2 * unit));
        assert!(!a.claim(Dva {
            group: 0,
            offset: SECTOR,
            asize: unit as u32
        }));
        assert_eq!(a.free_bytes(), 97 * unit);
        a.add_group(1 << 20, SECTOR);
        assert_eq!(a.groups(), 2);
        assert_eq!(a.free_bytes(), 97 * unit + (1 << 20));
    }
}

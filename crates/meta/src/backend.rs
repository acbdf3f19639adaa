//! A redb `StorageBackend` over the pool's mirrored metadata region.
//!
//! Region layout: two 4 KiB header slots, then the database bytes. A header
//! is `"CISTMETA" | u64 generation | u64 database length | blake3 of the
//! first 24 bytes`; the valid slot with the highest generation wins, so a
//! torn header write leaves the other slot in force.

use parking_lot::Mutex;
use pool::MirroredRegion;
use redb::StorageBackend;
use std::io;

const SLOT: u64 = 4096;
const DATA_START: u64 = 2 * SLOT;
const MAGIC: &[u8; 8] = b"CISTMETA";

#[derive(Debug)]
pub struct RegionBackend {
    region: MirroredRegion,
    /// (generation, length) of the newest header.
    state: Mutex<(u64, u64)>,
}

fn header(generation: u64, len: u64) -> Vec<u8> {
    let mut buf = vec![0u8; SLOT as usize];
    buf[..8].copy_from_slice(MAGIC);
    buf[8..16].copy_from_slice(&generation.to_le_bytes());
    buf[16..24].copy_from_slice(&len.to_le_bytes());
    let sum = *blake3::hash(&buf[..24]).as_bytes();
    buf[24..56].copy_from_slice(&sum);
    buf
}

fn parse(buf: &[u8]) -> Option<(u64, u64)> {
    if &buf[..8] != MAGIC || blake3::hash(&buf[..24]).as_bytes() != &buf[24..56] {
        return None;
    }
    let g = u64::from_le_bytes(buf[8..16].try_into().ok()?);
    let l = u64::from_le_bytes(buf[16..24].try_into().ok()?);
    Some((g, l))
}

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

impl RegionBackend {
    /// A fresh, empty database region.
    pub fn format(region: MirroredRegion) -> io::Result<Self> {
        region.write(0, &header(1, 0)).map_err(io_err)?;
        region
            .write(SLOT, &vec![0u8; SLOT as usize])
            .map_err(io_err)?;
        region.sync().map_err(io_err)?;
        Ok(RegionBackend {
            region,
            state: Mutex::new((1, 0)),
        })
    }

    pub fn open(region: MirroredRegion) -> io::Result<Self> {
        let mut best: Option<(u64, u64)> = None;
        for slot in 0..2 {
            let mut buf = vec![0u8; SLOT as usize];
            // A slot that fails to verify on one device is read from another.
            let ok = region
                .read_verified(slot * SLOT, &mut buf, |b| parse(b).is_some())
                .is_ok();
            if ok {
                if let Some(h) = parse(&buf) {
                    if best.is_none_or(|b| h.0 > b.0) {
                        best = Some(h);
                    }
                }
            }
        }
        let state = best.ok_or_else(|| io_err("no valid metadata header on any device"))?;
        Ok(RegionBackend {
            region,
            state: Mutex::new(state),
        })
    }

    fn capacity(&self) -> u64 {
        self.region.size() - DATA_START
    }
}

impl StorageBackend for RegionBackend {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(self.state.lock().1)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.region.read(DATA_START + offset, out).map_err(io_err)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        if len > self.capacity() {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "metadata region full: {len} bytes needed, {} available",
                    self.capacity()
                ),
            ));
        }
        let mut state = self.state.lock();
        let generation = state.0 + 1;
        // Alternate slots so the previous header stays valid until this one is synced.
        self.region
            .write((generation % 2) * SLOT, &header(generation, len))
            .map_err(io_err)?;
        *state = (generation, len);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.region.sync().map_err(io_err)
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        if offset + data.len() as u64 > self.capacity() {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "metadata region full",
            ));
        }
        self.region.write(DATA_START + offset, data).map_err(io_err)
    }
}

#[cfg(test)]
mod tests {
    use crate::schema;
    use pool::{LayoutKind, Pool, Vdev};
    use redb::{ReadableDatabase, ReadableTable};
    use std::sync::Arc;

    #[test]
    fn store_lives_on_the_devices_and_survives_losing_one_mirror_side() {
        let dir = tempfile::tempdir().unwrap();
        let paths: Vec<_> = (0..2).map(|i| dir.path().join(format!("d{i}"))).collect();
        let devs = paths
            .iter()
            .map(|p| Vdev::open_or_create(p, Some(128 << 20)).unwrap())
            .collect();
        let pool = Arc::new(Pool::create("tank", vec![(LayoutKind::Mirror, devs)]).unwrap());
        let db = crate::create(pool.meta_region(), 1 << 20).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(schema::BLOCKS)
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
        let t = tx.open_table(schema::BLOCKS).unwrap();
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
            .insert(schema::RECORD_FORMAT, crate::META_FORMAT_VERSION + 1)
            .unwrap();
        tx.commit().unwrap();
        drop(db);
        let err = crate::open(pool.meta_region(), 1 << 20).unwrap_err();
        assert!(matches!(err, crate::MetaError::Newer { .. }), "{err}");
        assert!(err.to_string().contains("newer than this build"));
    }
}

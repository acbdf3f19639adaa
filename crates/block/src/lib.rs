//! The block pipeline. Write: compress -> checksum -> place. Read: fetch ->
//! verify -> heal -> decompress.

mod bp;
mod checksum;
mod compress;

pub use bp::{BlockPointer, BpDecodeError, BP_VERSION, MAX_DVAS};
pub use checksum::{Checksum, ChecksumAlgo};
pub use compress::{
    compress, decompress, Compression, CompressionAlgo, DecompressError, ParseCompressionError,
};

use pool::{Dva, Pool, PoolError};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error(transparent)]
    Pool(#[from] PoolError),
    #[error(transparent)]
    Decompress(#[from] DecompressError),
    #[error("out of space")]
    NoSpace,
    #[error("embedded block fails its checksum")]
    EmbeddedChecksum,
}

/// A block after compression and checksumming, not yet placed.
#[derive(Debug, Clone)]
pub struct EncodedBlock {
    /// The bytes to store (shared with the caller's buffer when stored raw).
    pub payload: Arc<Vec<u8>>,
    pub lsize: u32,
    pub compression: CompressionAlgo,
    pub checksum_algo: ChecksumAlgo,
    pub checksum: Checksum,
}

impl EncodedBlock {
    pub fn psize(&self) -> u32 {
        self.payload.len() as u32
    }

    /// The block pointer once placed at `dva` in txg `birth`.
    pub fn pointer(&self, dva: Dva, birth: u64) -> BlockPointer {
        BlockPointer {
            dvas: vec![dva],
            lsize: self.lsize,
            psize: self.psize(),
            compression: self.compression,
            checksum_algo: self.checksum_algo,
            checksum: self.checksum,
            birth,
            embedded: None,
        }
    }

    /// The pointer of a block kept in its metadata row (no DVA, no I/O).
    pub fn embedded(&self, birth: u64) -> BlockPointer {
        BlockPointer {
            dvas: Vec::new(),
            lsize: self.lsize,
            psize: self.psize(),
            compression: self.compression,
            checksum_algo: self.checksum_algo,
            checksum: self.checksum,
            birth,
            embedded: Some(self.payload.to_vec()),
        }
    }
}

/// Compress and checksum (CPU only; callers run many of these in parallel).
pub fn encode(data: &[u8], compression: Compression, checksum_algo: ChecksumAlgo) -> EncodedBlock {
    match compress(compression, data) {
        Some(c) => finish(Arc::new(c), data.len(), compression.algo(), checksum_algo),
        None => finish(
            Arc::new(data.to_vec()),
            data.len(),
            CompressionAlgo::Off,
            checksum_algo,
        ),
    }
}

/// As [`encode`], but a block stored raw shares `data` instead of copying it.
pub fn encode_shared(
    data: &Arc<Vec<u8>>,
    compression: Compression,
    checksum_algo: ChecksumAlgo,
) -> EncodedBlock {
    match compress(compression, data) {
        Some(c) => finish(Arc::new(c), data.len(), compression.algo(), checksum_algo),
        None => finish(
            data.clone(),
            data.len(),
            CompressionAlgo::Off,
            checksum_algo,
        ),
    }
}

fn finish(
    payload: Arc<Vec<u8>>,
    lsize: usize,
    compression: CompressionAlgo,
    checksum_algo: ChecksumAlgo,
) -> EncodedBlock {
    let checksum = checksum_algo.compute(&payload);
    EncodedBlock {
        payload,
        lsize: lsize as u32,
        compression,
        checksum_algo,
        checksum,
    }
}

/// Verifies stored bytes against the pointer and decompresses them; `None`
/// if they are not the block's bytes.
pub fn decode_verified(bp: &BlockPointer, stored: &[u8]) -> Option<Vec<u8>> {
    if stored.len() != bp.psize as usize || bp.checksum_algo.compute(stored) != bp.checksum {
        return None;
    }
    decompress(bp.compression, stored, bp.lsize as usize).ok()
}

/// Fetches a block, verifies its checksum (healing bad copies from good
/// ones), and decompresses it. Wrong data is never returned.
pub fn read_block(pool: &Pool, bp: &BlockPointer) -> Result<Vec<u8>, BlockError> {
    if let Some(stored) = &bp.embedded {
        // Its copies are the metadata store's (checksummed per page, mirrored).
        return decode_verified(bp, stored).ok_or(BlockError::EmbeddedChecksum);
    }
    let mut last = None;
    for dva in &bp.dvas {
        let verify = |b: &[u8]| bp.checksum_algo.compute(b) == bp.checksum;
        match pool.read_verified(*dva, bp.psize as usize, verify) {
            Ok(payload) => return Ok(decompress(bp.compression, &payload, bp.lsize as usize)?),
            Err(e) => last = Some(e),
        }
    }
    Err(last.map(BlockError::Pool).unwrap_or(BlockError::NoSpace))
}

/// Places one encoded block: allocates, writes every copy. The caller
/// records the pointer in the txg that `birth` names.
pub fn write_block(
    pool: &Pool,
    block: &EncodedBlock,
    birth: u64,
) -> Result<BlockPointer, BlockError> {
    let dva = pool
        .allocator()
        .allocate(block.psize() as u64)
        .ok_or(BlockError::NoSpace)?;
    pool.write(dva, &block.payload)?;
    Ok(block.pointer(dva, birth))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pool::{LayoutKind, Vdev};

    #[test]
    fn compression_names_round_trip_and_bad_ones_are_refused() {
        for c in Compression::all_settings() {
            assert_eq!(c.to_string().parse::<Compression>().unwrap(), c);
        }
        assert_eq!("zstd".parse::<Compression>().unwrap(), Compression::Zstd(3));
        assert_eq!("gzip".parse::<Compression>().unwrap(), Compression::Gzip(6));
        for bad in ["zstd-0", "zstd-20", "gzip-10", "lz5", "", "zstd-"] {
            assert!(bad.parse::<Compression>().is_err(), "{bad}");
        }
    }

    #[test]
    fn incompressible_blocks_are_stored_raw_and_text_shrinks() {
        let random: Vec<u8> = (0..16384u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let text = b"the quick brown fox jumps over the lazy dog. ".repeat(400)[..16384].to_vec();
        for c in Compression::all_settings() {
            let e = encode(&text, c, ChecksumAlgo::Blake3);
            if c == Compression::Off {
                assert_eq!(e.compression, CompressionAlgo::Off);
            } else {
                assert!(e.psize() <= 4096, "{c}: {}", e.psize());
            }
            assert_eq!(decompress(e.compression, &e.payload, 16384).unwrap(), text);
        }
        let e = encode(&random, Compression::Zstd(19), ChecksumAlgo::Blake3);
        assert!(e.compression == CompressionAlgo::Off || e.psize() < 16384 - 4096);
    }

    #[test]
    fn bp_encoding_round_trips_and_rejects_garbage() {
        let bp = BlockPointer {
            dvas: vec![Dva {
                group: 1,
                offset: 8192,
                asize: 4096,
            }],
            lsize: 16384,
            psize: 3000,
            compression: CompressionAlgo::Zstd,
            checksum_algo: ChecksumAlgo::Blake3,
            checksum: [9; 32],
            birth: 42,
            embedded: None,
        };
        let enc = bp.encode();
        assert_eq!(BlockPointer::decode(&enc).unwrap(), bp);
        assert_eq!(
            BlockPointer::decode(&enc[..10]),
            Err(BpDecodeError::Malformed("too short"))
        );
        let mut v2 = enc.clone();
        v2[0] = 2;
        assert_eq!(BlockPointer::decode(&v2), Err(BpDecodeError::Version(2)));
    }

    #[test]
    fn embedded_blocks_round_trip_and_verify() {
        let data = b"tiny object ".repeat(20);
        let enc = encode(&data, Compression::Lz4, ChecksumAlgo::Blake3);
        let bp = enc.embedded(7);
        assert_eq!(bp.asize(), 0);
        let bytes = bp.encode();
        let back = BlockPointer::decode(&bytes).unwrap();
        assert_eq!(back, bp);
        assert!(back.is_embedded());
        let dir = tempfile::tempdir().unwrap();
        let dev = Vdev::open_or_create(&dir.path().join("d0"), Some(128 << 20)).unwrap();
        let pool = Pool::create("tank", vec![(LayoutKind::Disk, vec![dev])]).unwrap();
        assert_eq!(read_block(&pool, &back).unwrap(), data);
        // A flipped stored byte fails the checksum: never returned as data.
        let mut bad = back.clone();
        if let Some(e) = bad.embedded.as_mut() {
            e[0] ^= 1;
        }
        assert!(matches!(
            read_block(&pool, &bad),
            Err(BlockError::EmbeddedChecksum)
        ));
        // Truncated embedded payloads are malformed.
        assert!(BlockPointer::decode(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn a_corrupted_stripe_block_is_reported_never_returned() {
        let dir = tempfile::tempdir().unwrap();
        let dev = Vdev::open_or_create(&dir.path().join("d0"), Some(128 << 20)).unwrap();
        let pool = Pool::create("tank", vec![(LayoutKind::Disk, vec![dev])]).unwrap();
        let data = b"hello world ".repeat(2000);
        let enc = encode(&data, Compression::Lz4, ChecksumAlgo::Blake3);
        let bp = write_block(&pool, &enc, 5).unwrap();
        assert_eq!(read_block(&pool, &bp).unwrap(), data);
        let at = pool.regions.data_offset + bp.dvas[0].offset;
        pool.groups()[0].devices()[0]
            .write_at(at + 3, b"XX")
            .unwrap();
        assert!(matches!(
            read_block(&pool, &bp),
            Err(BlockError::Pool(PoolError::Unrecoverable { .. }))
        ));
    }
}

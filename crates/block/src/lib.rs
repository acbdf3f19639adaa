//! The block pipeline. Write: compress -> (encrypt) -> checksum -> place.
//! Read: fetch -> verify -> heal -> (decrypt) -> decompress. The checksum is
//! over the stored bytes, ciphertext for an encrypted block (decision 0026).

mod bp;
mod checksum;
mod compress;
pub mod crypt;

pub use bp::{BlockPointer, BpDecodeError, Dvas, BP_VERSION, BP_VERSION_CRYPT, MAX_DVAS};
pub use checksum::{Checksum, ChecksumAlgo};
pub use compress::{
    compress, decompress, decompress_into, Compression, CompressionAlgo, DecompressError,
    ParseCompressionError,
};
pub use crypt::{BlockCrypt, BlockId, CryptError, MasterKey};

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
    /// An encrypted block read without its dataset's key.
    #[error("encrypted block and the key is not loaded")]
    KeyUnavailable,
    /// Stored bytes that pass their checksum but fail the AEAD: a checksum-class
    /// error (a pointer moved or forged), never returned as data.
    #[error("encrypted block fails authentication")]
    Authentication,
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
    pub crypt: Option<BlockCrypt>,
}

impl EncodedBlock {
    pub fn psize(&self) -> u32 {
        self.payload.len() as u32
    }

    /// The block pointer once placed at `dva` in txg `birth`.
    pub fn pointer(&self, dva: Dva, birth: u64) -> BlockPointer {
        BlockPointer {
            dvas: Dvas::from_buf_and_len([dva; MAX_DVAS], 1),
            lsize: self.lsize,
            psize: self.psize(),
            compression: self.compression,
            checksum_algo: self.checksum_algo,
            checksum: self.checksum,
            birth,
            embedded: None,
            crypt: self.crypt,
        }
    }

    /// The pointer of a block kept in its metadata row (no DVA, no I/O).
    pub fn embedded(&self, birth: u64) -> BlockPointer {
        BlockPointer {
            dvas: Dvas::new(),
            lsize: self.lsize,
            psize: self.psize(),
            compression: self.compression,
            checksum_algo: self.checksum_algo,
            checksum: self.checksum,
            birth,
            embedded: Some(self.payload.to_vec()),
            crypt: self.crypt,
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
        crypt: None,
    }
}

/// Where an encrypted block goes: its key and its place (the AEAD's associated data).
#[derive(Clone, Copy)]
pub struct Seal<'a> {
    pub key: &'a MasterKey,
    pub object: u64,
    pub block: u64,
    pub birth: u64,
}

/// [`encode`] then encrypt: compress, seal, checksum the ciphertext.
pub fn encode_sealed(
    data: &[u8],
    compression: Compression,
    checksum_algo: ChecksumAlgo,
    seal: Seal<'_>,
) -> EncodedBlock {
    let (mut payload, algo) = match compress(compression, data) {
        Some(c) => (c, compression.algo()),
        None => (data.to_vec(), CompressionAlgo::Off),
    };
    let id = BlockId {
        object: seal.object,
        block: seal.block,
        birth: seal.birth,
        lsize: data.len() as u32,
        psize: payload.len() as u32,
        compression: algo as u8,
    };
    let crypt = seal.key.seal_block(&id, &mut payload);
    let mut e = finish(Arc::new(payload), data.len(), algo, checksum_algo);
    e.crypt = Some(crypt);
    e
}

/// The key and place an encrypted block is opened with.
#[derive(Clone, Copy)]
pub struct Unseal<'a> {
    pub key: Option<&'a MasterKey>,
    pub object: u64,
    pub block: u64,
}

/// Decrypts (if encrypted) and decompresses stored bytes that passed their checksum.
fn open_verified(
    bp: &BlockPointer,
    mut stored: Vec<u8>,
    unseal: Option<Unseal<'_>>,
) -> Result<Vec<u8>, BlockError> {
    if let Some(c) = &bp.crypt {
        let u = unseal.ok_or(BlockError::KeyUnavailable)?;
        let key = u.key.ok_or(BlockError::KeyUnavailable)?;
        let id = BlockId {
            object: u.object,
            block: u.block,
            birth: bp.birth,
            lsize: bp.lsize,
            psize: bp.psize,
            compression: bp.compression as u8,
        };
        key.open_block(&id, c, &mut stored)
            .map_err(|_| BlockError::Authentication)?;
    }
    if bp.compression == CompressionAlgo::Off {
        return Ok(stored);
    }
    Ok(decompress(bp.compression, &stored, bp.lsize as usize)?)
}

/// Verifies stored bytes against the pointer and decompresses them; `None`
/// if they are not the block's bytes.
pub fn decode_verified(bp: &BlockPointer, stored: &[u8]) -> Option<Vec<u8>> {
    decode_verified_keyed(bp, stored, None).and_then(|r| r.ok())
}

/// [`decode_verified`] for a block that may be encrypted: `None` if the
/// bytes fail their checksum (try another copy), an error if they pass it
/// but cannot be opened (no key, authentication) or decompressed.
pub fn decode_verified_keyed(
    bp: &BlockPointer,
    stored: &[u8],
    unseal: Option<Unseal<'_>>,
) -> Option<Result<Vec<u8>, BlockError>> {
    if !is_stored(bp, stored) {
        return None;
    }
    // A compressed, unencrypted block decompresses straight from the bytes
    // it was read into (no copy of them first): an encrypted one is opened
    // in place, so it needs its own copy.
    if bp.crypt.is_none() && bp.compression != CompressionAlgo::Off {
        return Some(
            decompress(bp.compression, stored, bp.lsize as usize).map_err(BlockError::from),
        );
    }
    Some(open_verified(bp, stored.to_vec(), unseal))
}

/// [`decode_verified_keyed`] into `out` (exactly the block's logical size)
/// for a block that is not encrypted (one that is is refused: it is opened
/// in a copy of its own); `None` if `stored` are not the block's bytes.
pub fn decode_verified_into(
    bp: &BlockPointer,
    stored: &[u8],
    out: &mut [u8],
) -> Option<Result<(), BlockError>> {
    if !is_stored(bp, stored) {
        return None;
    }
    if bp.crypt.is_some() {
        return Some(Err(BlockError::KeyUnavailable));
    }
    Some(decompress_into(bp.compression, stored, out).map_err(BlockError::from))
}

/// Whether `stored` are the bytes `bp` names as stored (length and checksum).
pub fn is_stored(bp: &BlockPointer, stored: &[u8]) -> bool {
    stored.len() == bp.psize as usize && bp.checksum_algo.compute(stored) == bp.checksum
}

/// Whether a block's stored bytes are its data as they are (on the data
/// region, neither compressed nor encrypted): once [`is_stored`] holds for
/// them, they are the block, with no decoding (a read can land them in the
/// buffer they are kept in).
pub fn stored_as_is(bp: &BlockPointer) -> bool {
    bp.embedded.is_none()
        && bp.crypt.is_none()
        && bp.compression == CompressionAlgo::Off
        && bp.psize == bp.lsize
}

/// Fetches a block, verifies its checksum (healing bad copies from good
/// ones), and decompresses it. Wrong data is never returned.
pub fn read_block(pool: &Pool, bp: &BlockPointer) -> Result<Vec<u8>, BlockError> {
    read_block_keyed(pool, bp, None)
}

/// [`read_block`] for a block that may be encrypted (`unseal`: its key and place).
pub fn read_block_keyed(
    pool: &Pool,
    bp: &BlockPointer,
    unseal: Option<Unseal<'_>>,
) -> Result<Vec<u8>, BlockError> {
    if let Some(stored) = &bp.embedded {
        // Its copies are the metadata store's (checksummed per page, mirrored).
        return decode_verified_keyed(bp, stored, unseal).ok_or(BlockError::EmbeddedChecksum)?;
    }
    let mut last = None;
    for dva in &bp.dvas {
        let verify = |b: &[u8]| bp.checksum_algo.compute(b) == bp.checksum;
        match pool.read_verified(*dva, bp.psize as usize, verify) {
            Ok(payload) => return open_verified(bp, payload, unseal),
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
            dvas: smallvec::smallvec![Dva {
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
            crypt: None,
        };
        let enc = bp.encode();
        assert_eq!(BlockPointer::decode(&enc).unwrap(), bp);
        assert_eq!(
            BlockPointer::decode(&enc[..10]),
            Err(BpDecodeError::Malformed("too short"))
        );
        let mut v3 = enc.clone();
        v3[0] = 3;
        assert_eq!(BlockPointer::decode(&v3), Err(BpDecodeError::Version(3)));
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
        // The stored bytes apart from the pointer's encoding: the same pointer.
        let at = bytes.len() - bp.psize as usize;
        let (head, body) = bytes.split_at(at);
        assert_eq!(
            BlockPointer::decode_with_body(head, body.to_vec()).unwrap(),
            bp
        );
        assert!(BlockPointer::decode_with_body(head, body[1..].to_vec()).is_err());
        assert!(BlockPointer::decode_with_body(&bytes, body.to_vec()).is_err());
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

    #[test]
    fn encrypted_blocks_use_pointer_version_2_and_plain_ones_stay_version_1() {
        let dir = tempfile::tempdir().unwrap();
        let dev = Vdev::open_or_create(&dir.path().join("d0"), Some(128 << 20)).unwrap();
        let pool = Pool::create("tank", vec![(LayoutKind::Disk, vec![dev])]).unwrap();
        let key = MasterKey::generate().unwrap();
        let data = b"secret pattern 0123456789 ".repeat(600);
        let seal = Seal {
            key: &key,
            object: 1,
            block: 3,
            birth: 9,
        };
        let enc = encode_sealed(&data, Compression::Lz4, ChecksumAlgo::Blake3, seal);
        assert!(!enc.payload.windows(14).any(|w| w == b"secret pattern"));
        let bp = write_block(&pool, &enc, 9).unwrap();
        let bytes = bp.encode();
        assert_eq!(bytes[0], BP_VERSION_CRYPT);
        let back = BlockPointer::decode(&bytes).unwrap();
        assert_eq!(back, bp);
        let unseal = |key| {
            Some(Unseal {
                key,
                object: 1,
                block: 3,
            })
        };
        assert_eq!(
            read_block_keyed(&pool, &bp, unseal(Some(&key))).unwrap(),
            data
        );
        assert!(matches!(
            read_block_keyed(&pool, &bp, unseal(None)),
            Err(BlockError::KeyUnavailable)
        ));
        assert!(matches!(
            read_block(&pool, &bp),
            Err(BlockError::KeyUnavailable)
        ));
        // Another place (a swapped pointer) fails authentication.
        let elsewhere = Some(Unseal {
            key: Some(&key),
            object: 1,
            block: 4,
        });
        assert!(matches!(
            read_block_keyed(&pool, &bp, elsewhere),
            Err(BlockError::Authentication)
        ));
        // A flipped ciphertext byte fails the checksum: reported, never returned.
        let at = pool.regions.data_offset + bp.dvas[0].offset;
        pool.groups()[0].devices()[0]
            .write_at(at + 5, b"Z")
            .unwrap();
        assert!(matches!(
            read_block_keyed(&pool, &bp, unseal(Some(&key))),
            Err(BlockError::Pool(PoolError::Unrecoverable { .. }))
        ));
        // An unencrypted block keeps the old pointer version.
        let plain = write_block(
            &pool,
            &encode(&data, Compression::Lz4, ChecksumAlgo::Blake3),
            9,
        )
        .unwrap();
        assert_eq!(plain.encode()[0], BP_VERSION);
    }

    #[test]
    fn a_version_1_pointer_written_by_earlier_builds_decodes() {
        // Bytes as the pre-encryption encoder wrote them (one DVA, lz4).
        let mut old = vec![1u8, 1, 1, 1];
        old.extend_from_slice(&16384u32.to_le_bytes());
        old.extend_from_slice(&3000u32.to_le_bytes());
        old.extend_from_slice(&42u64.to_le_bytes());
        old.extend_from_slice(&1u32.to_le_bytes());
        old.extend_from_slice(&8192u64.to_le_bytes());
        old.extend_from_slice(&4096u32.to_le_bytes());
        old.extend_from_slice(&[9u8; 32]);
        let bp = BlockPointer::decode(&old).unwrap();
        assert_eq!(
            (bp.lsize, bp.psize, bp.birth, bp.crypt),
            (16384, 3000, 42, None)
        );
        assert_eq!(bp.encode(), old);
    }
}

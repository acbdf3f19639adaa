//! The block pointer and its byte encoding (docs/on-disk-format.md).
//!
//! ```text
//! u8 version (1) | u8 compression | u8 checksum algo | u8 number of DVAs (1..=3)
//! u32 lsize | u32 psize | u64 birth txg            (all little endian)
//! per DVA: u32 group | u64 offset | u32 asize
//! [u8; 32] checksum of the stored (physical) bytes
//! version 2 only (an encrypted block, decision 0026):
//!   u8 cipher (1 = aes-256-gcm) | [u8; 12] nonce | [u8; 16] tag
//! ```
//! An unencrypted block is still written as version 1, so pools without
//! encryption stay readable by builds that predate version 2.
//! An embedded pointer (decision 0017, as ZFS's BP_EMBEDDED) has no DVA
//! (count 0) and carries its `psize` stored bytes after the checksum: tiny
//! blocks and object attributes live in the metadata row, no data block.

use crate::checksum::{Checksum, ChecksumAlgo};
use crate::compress::CompressionAlgo;
use crate::crypt::{BlockCrypt, CryptAlgo, NONCE_LEN, TAG_LEN};
use pool::Dva;

/// The version of an unencrypted block's pointer.
pub const BP_VERSION: u8 = 1;
/// The version of an encrypted block's pointer (nonce and tag after the checksum).
pub const BP_VERSION_CRYPT: u8 = 2;
const CRYPT_LEN: usize = 1 + NONCE_LEN + TAG_LEN;
pub const MAX_DVAS: usize = 3;
/// A pointer's copies, held inline: every read decodes one pointer per
/// block, and a heap allocation each was a tenth of a cached read's CPU.
pub type Dvas = smallvec::SmallVec<[Dva; MAX_DVAS]>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockPointer {
    /// Copies (ditto blocks); each DVA is itself redundant per its group's layout.
    pub dvas: Dvas,
    /// Bytes before compression.
    pub lsize: u32,
    /// Bytes as stored.
    pub psize: u32,
    pub compression: CompressionAlgo,
    pub checksum_algo: ChecksumAlgo,
    pub checksum: Checksum,
    /// The txg in which this block was written; snapshots compare against it.
    pub birth: u64,
    /// The stored bytes of an embedded block (no DVAs): in the metadata, not on the data region.
    pub embedded: Option<Vec<u8>>,
    /// Encrypted blocks: the stored bytes are ciphertext (checksummed as stored).
    pub crypt: Option<BlockCrypt>,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum BpDecodeError {
    #[error("block pointer version {0} is not understood by this build")]
    Version(u8),
    #[error("block pointer is malformed: {0}")]
    Malformed(&'static str),
}

impl BlockPointer {
    /// Bytes allocated for all copies.
    pub fn asize(&self) -> u64 {
        self.dvas.iter().map(|d| d.asize as u64).sum()
    }

    pub fn is_embedded(&self) -> bool {
        self.embedded.is_some()
    }

    pub fn encode(&self) -> Vec<u8> {
        assert!(self.dvas.len() <= MAX_DVAS);
        assert_eq!(self.dvas.is_empty(), self.embedded.is_some());
        let mut out = Vec::with_capacity(20 + 16 * self.dvas.len() + 32 + CRYPT_LEN);
        out.extend_from_slice(&[
            if self.crypt.is_some() {
                BP_VERSION_CRYPT
            } else {
                BP_VERSION
            },
            self.compression as u8,
            self.checksum_algo as u8,
            self.dvas.len() as u8,
        ]);
        out.extend_from_slice(&self.lsize.to_le_bytes());
        out.extend_from_slice(&self.psize.to_le_bytes());
        out.extend_from_slice(&self.birth.to_le_bytes());
        for d in &self.dvas {
            out.extend_from_slice(&d.group.to_le_bytes());
            out.extend_from_slice(&d.offset.to_le_bytes());
            out.extend_from_slice(&d.asize.to_le_bytes());
        }
        out.extend_from_slice(&self.checksum);
        if let Some(c) = &self.crypt {
            out.push(c.algo as u8);
            out.extend_from_slice(&c.nonce);
            out.extend_from_slice(&c.tag);
        }
        if let Some(e) = &self.embedded {
            out.extend_from_slice(e);
        }
        out
    }

    pub fn decode(b: &[u8]) -> Result<BlockPointer, BpDecodeError> {
        Self::parse(b, None)
    }

    /// An embedded pointer whose stored bytes (`body`, psize of them) came
    /// apart from its encoding `head` (a receive reads them straight into
    /// their own buffer): the pointer takes `body` as it is, uncopied.
    pub fn decode_with_body(head: &[u8], body: Vec<u8>) -> Result<BlockPointer, BpDecodeError> {
        Self::parse(head, Some(body))
    }

    fn parse(b: &[u8], body: Option<Vec<u8>>) -> Result<BlockPointer, BpDecodeError> {
        let short = BpDecodeError::Malformed("too short");
        let header = b.get(..20).ok_or(short.clone())?;
        let encrypted = match header[0] {
            BP_VERSION => false,
            BP_VERSION_CRYPT => true,
            v => return Err(BpDecodeError::Version(v)),
        };
        let compression =
            CompressionAlgo::from_code(header[1]).ok_or(BpDecodeError::Malformed("compression"))?;
        let checksum_algo = ChecksumAlgo::from_code(header[2])
            .ok_or(BpDecodeError::Malformed("checksum algorithm"))?;
        let ndva = header[3] as usize;
        if ndva > MAX_DVAS {
            return Err(BpDecodeError::Malformed("DVA count"));
        }
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(a)
        };
        let psize = u32_at(8) as usize;
        let embedded = ndva == 0;
        let crypt_at = 20 + 16 * ndva + 32;
        let body_at = crypt_at + if encrypted { CRYPT_LEN } else { 0 };
        let expect = body_at + if embedded && body.is_none() { psize } else { 0 };
        if b.len() != expect {
            return Err(short);
        }
        if body.as_ref().is_some_and(|v| !embedded || v.len() != psize) {
            return Err(short);
        }
        let dvas = (0..ndva)
            .map(|i| {
                let o = 20 + 16 * i;
                Dva {
                    group: u32_at(o),
                    offset: u64_at(o + 4),
                    asize: u32_at(o + 12),
                }
            })
            .collect();
        let crypt = if encrypted {
            let algo =
                CryptAlgo::from_code(b[crypt_at]).ok_or(BpDecodeError::Malformed("cipher"))?;
            let mut nonce = [0u8; NONCE_LEN];
            nonce.copy_from_slice(&b[crypt_at + 1..crypt_at + 1 + NONCE_LEN]);
            let mut tag = [0u8; TAG_LEN];
            tag.copy_from_slice(&b[crypt_at + 1 + NONCE_LEN..body_at]);
            Some(BlockCrypt { algo, nonce, tag })
        } else {
            None
        };
        let mut checksum = [0u8; 32];
        checksum.copy_from_slice(&b[20 + 16 * ndva..20 + 16 * ndva + 32]);
        Ok(BlockPointer {
            dvas,
            lsize: u32_at(4),
            psize: u32_at(8),
            compression,
            checksum_algo,
            checksum,
            birth: u64_at(12),
            embedded: embedded.then(|| body.unwrap_or_else(|| b[body_at..].to_vec())),
            crypt,
        })
    }
}

//! One log record as stored in one object: a fixed header, the payload and
//! a blake3 checksum over both. A record names its sequence number and the
//! owner that wrote it, so a record copied to the wrong key or written by
//! someone else is recognised, never applied.

use crate::{LogError, OwnerId};
use bytes::{BufMut, Bytes, BytesMut};

const MAGIC: &[u8; 8] = b"CSTLOG\0\x01";
/// Version 1: the layout below. A reader refuses any other version by name.
pub const RECORD_VERSION: u16 = 1;
/// magic 8, version 2, kind 1, reserved 1, seq 8, epoch 8, node length 2,
/// payload length 4.
const FIXED: usize = 8 + 2 + 1 + 1 + 8 + 8 + 2 + 4;
const SUM: usize = 32;
/// Bounds what a corrupt header can make a reader allocate.
pub const MAX_PAYLOAD: usize = 256 << 20;
pub const MAX_NODE: usize = 255;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A new owner's first record: every record after it, until the next
    /// claim, is that owner's. Creating it is what fences the previous owner.
    Claim = 1,
    /// Entries appended by the owner (group commit: many entries, one object).
    Batch = 2,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub kind: Kind,
    pub owner: OwnerId,
    /// For `Batch`, the entries in append order; empty for `Claim`.
    pub entries: Vec<Bytes>,
}

pub fn encode(seq: u64, kind: Kind, owner: &OwnerId, entries: &[Bytes]) -> Bytes {
    let payload_len: usize = entries.iter().map(|e| 4 + e.len()).sum();
    let node = owner.node.as_bytes();
    assert!(node.len() <= MAX_NODE, "node name bounded at creation");
    assert!(
        payload_len <= MAX_PAYLOAD,
        "batches are bounded by the writer"
    );
    let mut b = BytesMut::with_capacity(FIXED + node.len() + payload_len + SUM);
    b.put_slice(MAGIC);
    b.put_u16(RECORD_VERSION);
    b.put_u8(kind as u8);
    b.put_u8(0);
    b.put_u64(seq);
    b.put_u64(owner.epoch);
    b.put_u16(node.len() as u16);
    b.put_u32(payload_len as u32);
    b.put_slice(node);
    for e in entries {
        b.put_u32(e.len() as u32);
        b.put_slice(e);
    }
    let sum = blake3::hash(&b);
    b.put_slice(sum.as_bytes());
    b.freeze()
}

fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

fn be_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_be_bytes(a)
}

/// Decodes the record stored at `seq`; anything that does not check out is
/// `Corrupt` with the reason, never a partial record.
pub fn decode(seq: u64, data: &[u8]) -> Result<Record, LogError> {
    let corrupt = |why: &str| LogError::Corrupt {
        seq,
        why: why.to_string(),
    };
    if data.len() < FIXED + SUM {
        return Err(corrupt("shorter than a record header"));
    }
    if &data[..8] != MAGIC {
        return Err(corrupt("bad magic"));
    }
    let (body, sum) = data.split_at(data.len() - SUM);
    if blake3::hash(body).as_bytes() != sum {
        return Err(corrupt("checksum mismatch"));
    }
    let version = u16::from_be_bytes([data[8], data[9]]);
    if version != RECORD_VERSION {
        return Err(LogError::Version { seq, version });
    }
    let kind = match data[10] {
        1 => Kind::Claim,
        2 => Kind::Batch,
        _ => return Err(corrupt("unknown record kind")),
    };
    let stored_seq = be_u64(&data[12..]);
    if stored_seq != seq {
        return Err(corrupt(&format!("record says sequence {stored_seq}")));
    }
    let epoch = be_u64(&data[20..]);
    let node_len = u16::from_be_bytes([data[28], data[29]]) as usize;
    let payload_len = be_u32(&data[30..]) as usize;
    if node_len > MAX_NODE
        || payload_len > MAX_PAYLOAD
        || FIXED + node_len + payload_len != body.len()
    {
        return Err(corrupt("lengths do not match the object"));
    }
    let node = std::str::from_utf8(&data[FIXED..FIXED + node_len])
        .map_err(|_| corrupt("node name is not UTF-8"))?
        .to_string();
    let mut entries = Vec::new();
    let mut rest = &data[FIXED + node_len..body.len()];
    while !rest.is_empty() {
        if rest.len() < 4 {
            return Err(corrupt("entry header cut short"));
        }
        let n = be_u32(rest) as usize;
        if rest.len() - 4 < n {
            return Err(corrupt("entry cut short"));
        }
        entries.push(Bytes::copy_from_slice(&rest[4..4 + n]));
        rest = &rest[4 + n..];
    }
    if kind == Kind::Claim && !entries.is_empty() {
        return Err(corrupt("claim with entries"));
    }
    Ok(Record {
        seq,
        kind,
        owner: OwnerId { node, epoch },
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> OwnerId {
        OwnerId {
            node: "host-a".into(),
            epoch: 7,
        }
    }

    #[test]
    fn round_trip_and_every_flipped_byte_is_refused() {
        let entries = vec![
            Bytes::from_static(b"one"),
            Bytes::new(),
            Bytes::from(vec![9u8; 300]),
        ];
        let enc = encode(42, Kind::Batch, &owner(), &entries);
        let rec = decode(42, &enc).expect("decodes");
        assert_eq!(rec.entries, entries);
        assert_eq!(rec.owner, owner());
        for i in 0..enc.len() {
            let mut bad = enc.to_vec();
            bad[i] ^= 0x40;
            assert!(decode(42, &bad).is_err(), "flip at {i} accepted");
        }
        for cut in 0..enc.len() {
            assert!(decode(42, &enc[..cut]).is_err(), "cut at {cut} accepted");
        }
        assert!(matches!(decode(43, &enc), Err(LogError::Corrupt { .. })));
    }
}

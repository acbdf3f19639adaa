//! The multihost (MMP) slot: the last 4 KiB of the front label area, outside
//! the label's JSON, where the daemon that owns the pool stamps a growing
//! sequence number every `multihost_interval` (decision 0010). An importer
//! watches these stamps: a sequence that moves means a live owner.
//!
//! Format: `"CISTMMP1"` | u32 LE version (1) | u32 LE json length | 32-byte
//! blake3 of the json | json ([`MmpStamp`]), zero-padded to [`MMP_SLOT_SIZE`].
//! All zeros: never stamped (pools created before this format, or wiped).

use crate::{AlignedBuf, Vdev, VdevError, LABEL_SIZE, SECTOR};
use serde::{Deserialize, Serialize};

/// Bytes of the slot.
pub const MMP_SLOT_SIZE: u64 = SECTOR;
/// Where the slot lies on every device: the tail of label 0's 256 KiB, which
/// label JSON never reaches (labels are at most `LABEL_SIZE - MMP_SLOT_SIZE`).
pub const MMP_SLOT_OFFSET: u64 = LABEL_SIZE - MMP_SLOT_SIZE;
/// Slot format version this build reads and writes.
pub const MMP_VERSION: u32 = 1;
const MAGIC: &[u8; 8] = b"CISTMMP1";
const HEADER: usize = 8 + 4 + 4 + 32;

/// Which daemon on which host holds (or last held) a pool. Written into the
/// labels and every MMP stamp.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub hostname: String,
    /// `/etc/machine-id` (first 64 bits) or the state directory's `hostid` file.
    pub hostid: u64,
    pub pid: u32,
    /// Random per daemon start: tells two daemons with a reused pid apart.
    pub instance: u64,
    /// Identifies the state directory (hash of its path): a daemon holding
    /// the same state directory's lock knows the previous holder is gone.
    pub state_dir: u64,
}

/// What the owner is doing with the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum PoolState {
    /// Imported by `owner` (the label and stamp say who).
    Active,
    /// Cleanly exported: anyone may import it.
    Exported,
}

/// What a stamp says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MmpKind {
    /// An importer asks for the pool; it owns it if the stamp is still there
    /// after the claim wait.
    Claim,
    /// The owner's heartbeat.
    Active,
    /// Written last by `pool export`.
    Exported,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmpStamp {
    pub pool_guid: u64,
    /// Grows with every stamp any daemon writes on this pool.
    pub seq: u64,
    pub kind: MmpKind,
    /// Unix milliseconds when written (for people; the protocol never compares clocks).
    pub time_ms: u64,
    pub owner: Owner,
}

pub(crate) fn encode(stamp: &MmpStamp) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(MMP_SLOT_SIZE as usize);
    // A stamp is a few hundred bytes; a hostname is at most 255 (serde_json never fails here).
    let json = serde_json::to_vec(stamp).unwrap_or_default();
    let len = json.len().min(MMP_SLOT_SIZE as usize - HEADER);
    let b = buf.as_mut_slice();
    b[..8].copy_from_slice(MAGIC);
    b[8..12].copy_from_slice(&MMP_VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&(len as u32).to_le_bytes());
    b[16..48].copy_from_slice(blake3::hash(&json[..len]).as_bytes());
    b[HEADER..HEADER + len].copy_from_slice(&json[..len]);
    buf
}

/// `None`: blank, damaged or of a newer version (a torn slot is as good as
/// none; the next stamp rewrites it).
pub(crate) fn decode(b: &[u8]) -> Option<MmpStamp> {
    if b.get(..HEADER)?[..8] != MAGIC[..]
        || u32::from_le_bytes([b[8], b[9], b[10], b[11]]) != MMP_VERSION
    {
        return None;
    }
    let len = u32::from_le_bytes([b[12], b[13], b[14], b[15]]) as usize;
    let json = b.get(HEADER..HEADER.checked_add(len)?)?;
    if blake3::hash(json).as_bytes() != &b[16..48] {
        return None;
    }
    serde_json::from_slice(json).ok()
}

impl Vdev {
    /// Reads the MMP slot past the page cache (another host's stamps reach a
    /// shared device without going through ours).
    pub fn read_mmp(&self) -> Result<Option<MmpStamp>, VdevError> {
        let mut buf = AlignedBuf::zeroed(MMP_SLOT_SIZE as usize);
        self.read_direct_at(MMP_SLOT_OFFSET, &mut buf)?;
        Ok(decode(buf.as_slice()))
    }

    /// Writes the MMP slot, durable on return (O_DSYNC).
    pub fn write_mmp(&self, stamp: &MmpStamp) -> Result<(), VdevError> {
        self.write_durable_at(MMP_SLOT_OFFSET, encode(stamp).as_slice())
    }

    /// Zeroes the MMP slot (the device leaves its pool).
    pub fn clear_mmp(&self) -> Result<(), VdevError> {
        self.write_durable_at(MMP_SLOT_OFFSET, &[0u8; MMP_SLOT_SIZE as usize])
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn owner() -> Owner {
        Owner {
            hostname: "host-a".into(),
            hostid: 0x1234,
            pid: 42,
            instance: 77,
            state_dir: 5,
        }
    }

    #[test]
    fn slot_round_trips_and_leaves_the_label_alone() {
        let dir = tempfile::tempdir().unwrap();
        let vdev = Vdev::open_or_create(&dir.path().join("d"), Some(4 << 20)).unwrap();
        assert_eq!(
            vdev.read_mmp().unwrap(),
            None,
            "a blank device has no stamp"
        );
        let mut stamp = MmpStamp {
            pool_guid: 9,
            seq: 1,
            kind: MmpKind::Claim,
            time_ms: 1000,
            owner: owner(),
        };
        vdev.write_mmp(&stamp).unwrap();
        assert_eq!(vdev.read_mmp().unwrap(), Some(stamp.clone()));
        stamp.seq = 2;
        stamp.kind = MmpKind::Active;
        vdev.write_mmp(&stamp).unwrap();
        assert_eq!(vdev.read_mmp().unwrap().map(|s| s.seq), Some(2));
        // A label write keeps the slot; a stamp keeps the label.
        let label = crate::label::tests::sample();
        vdev.write_label(&label).unwrap();
        assert_eq!(vdev.read_mmp().unwrap(), Some(stamp.clone()));
        vdev.write_mmp(&stamp).unwrap();
        assert_eq!(vdev.read_label().unwrap(), label);
        // A torn slot reads as none, never as a stamp.
        vdev.write_at(MMP_SLOT_OFFSET + 60, &[0xff; 8]).unwrap();
        assert_eq!(vdev.read_mmp().unwrap(), None);
        vdev.write_mmp(&stamp).unwrap();
        vdev.clear_mmp().unwrap();
        assert_eq!(vdev.read_mmp().unwrap(), None);
    }
}

//! The device label: written at the start and at the end of every device so
//! that one overwritten end does not lose the pool. Format (docs/on-disk-format.md):
//! `"CISTLABL"` | u32 LE version | u32 LE json length | 32-byte blake3 of the json | json,
//! zero-padded to LABEL_SIZE.
//!
//! Versions: 1 knows `disk` and `mirror` groups; 2 adds `raidz` groups (a
//! version-1 reader would misread them, so labels of pools with a raidz
//! group are written as version 2 and refused by name by older builds).
//! 3 adds `logs` (separate intent-log devices, a SLOG; decision 0030): an
//! older reader would replay the log from the main devices and miss the
//! records on the log device, so such labels are written as version 3.
//! All three are read by this build.

use crate::mmp::{Owner, PoolState, MMP_SLOT_SIZE};
use crate::{Vdev, VdevError};
use serde::{Deserialize, Serialize};

/// Bytes reserved for each of the two labels.
pub const LABEL_SIZE: u64 = 256 * 1024;
/// Newest label version this build reads and writes.
pub const LABEL_VERSION: u32 = 3;
/// Version written for pools with a raidz group (or a device being rebuilt) and no log device.
pub const LABEL_VERSION_RAIDZ: u32 = 2;
/// Version written for pools whose layout a version-1 reader understands.
pub const LABEL_VERSION_PLAIN: u32 = 1;
const MAGIC: &[u8; 8] = b"CISTLABL";
const HEADER: usize = 8 + 4 + 4 + 32;

#[derive(Debug, thiserror::Error)]
pub enum LabelError {
    #[error(transparent)]
    Io(#[from] VdevError),
    #[error("{0}: no Cistern label (not part of a pool)")]
    Missing(String),
    #[error("{path}: label format version {version} is newer than this build understands ({LABEL_VERSION})")]
    UnsupportedVersion { path: String, version: u32 },
    #[error("{0}: both labels are damaged")]
    Damaged(String),
    #[error("label too large to store")]
    TooLarge,
}

/// How the devices of one group hold data. Serialized as `"disk"`,
/// `"mirror"` or `{"raidz":{"parity":P}}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayoutKind {
    Disk,
    Mirror,
    /// Reed-Solomon parity over `width - parity` data columns; `parity` is 1..=3.
    Raidz {
        parity: u8,
    },
}

impl LayoutKind {
    /// Devices of the group that may be lost without losing data.
    pub fn redundancy(self, width: usize) -> usize {
        match self {
            LayoutKind::Disk => 0,
            LayoutKind::Mirror => width.saturating_sub(1),
            LayoutKind::Raidz { parity } => parity as usize,
        }
    }

    /// The label version needed to describe a group of this kind.
    pub fn label_version(self) -> u32 {
        match self {
            LayoutKind::Raidz { .. } => LABEL_VERSION_RAIDZ,
            _ => LABEL_VERSION_PLAIN,
        }
    }

    /// `disk`, `mirror`, `raidz1`..`raidz3` as `zpool` names them.
    pub fn name(self) -> String {
        match self {
            LayoutKind::Disk => "disk".into(),
            LayoutKind::Mirror => "mirror".into(),
            LayoutKind::Raidz { parity } => format!("raidz{parity}"),
        }
    }
}

/// One top-level group of the pool, naming its devices by guid in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupLayout {
    pub kind: LayoutKind,
    pub devices: Vec<u64>,
    /// Usable data bytes on each device of the group (the smallest device wins).
    pub data_size: u64,
    /// Guids of devices being rebuilt (replaced, not yet resilvered): their
    /// copies are written but not trusted for reads. Absent when empty, so
    /// the field does not change version-1 labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resilvering: Vec<u64>,
}

/// Where each region of a device lies, in bytes from its start. Identical on
/// every device of a pool so mirrored regions line up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Regions {
    /// The metadata store (redb file), mirrored on every device of the pool.
    pub meta_offset: u64,
    pub meta_size: u64,
    /// The intent log, mirrored on every device of the pool.
    pub log_offset: u64,
    pub log_size: u64,
    /// Block data; addresses in block pointers are relative to this offset.
    pub data_offset: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Label {
    pub version: u32,
    pub pool_name: String,
    pub pool_guid: u64,
    pub device_guid: u64,
    /// Index of this device's group in `groups`, and its position in the group.
    pub group: u32,
    pub child: u32,
    pub groups: Vec<GroupLayout>,
    pub regions: Regions,
    /// Set by `pool export`; an active pool is imported only by its own host's cache.
    /// Kept next to `state` for builds that do not know `state`.
    pub exported: bool,
    /// ACTIVE (imported by `owner`) or EXPORTED. Absent in labels written
    /// before decision 0010: then `exported` says which.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<PoolState>,
    /// The daemon that has (or last had) the pool imported. Absent in older labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
    /// Raised each time the layout changes (`pool add`, `replace`): at import
    /// the label with the highest generation describes the pool, and a
    /// device it does not list (a replaced one) is ignored. Absent = 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: u64,
    /// Separate intent-log groups (SLOG, `pool add POOL log DEV`): a disk or
    /// a mirror whose devices hold only the log, from LABEL_SIZE on. Absent
    /// when empty (labels before version 3 have none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logs: Vec<GroupLayout>,
    /// This device is a log device: `group` indexes `logs`, not `groups`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub log_device: bool,
}

fn is_false(v: &bool) -> bool {
    !*v
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl Label {
    /// ACTIVE or EXPORTED; older labels say it with `exported` alone.
    pub fn pool_state(&self) -> PoolState {
        match (self.state, self.exported) {
            (Some(s), _) => s,
            (None, true) => PoolState::Exported,
            (None, false) => PoolState::Active,
        }
    }
}

fn encode(label: &Label) -> Result<Vec<u8>, LabelError> {
    let json = serde_json::to_vec(label).map_err(|_| LabelError::TooLarge)?;
    // The tail of label 0's area is the MMP slot (mmp.rs).
    if HEADER + json.len() > (LABEL_SIZE - MMP_SLOT_SIZE) as usize {
        return Err(LabelError::TooLarge);
    }
    let mut buf = vec![0u8; LABEL_SIZE as usize];
    buf[..8].copy_from_slice(MAGIC);
    buf[8..12].copy_from_slice(&label.version.to_le_bytes());
    buf[12..16].copy_from_slice(&(json.len() as u32).to_le_bytes());
    buf[16..48].copy_from_slice(blake3::hash(&json).as_bytes());
    buf[HEADER..HEADER + json.len()].copy_from_slice(&json);
    Ok(buf)
}

enum Decoded {
    Label(Box<Label>),
    Blank,
    Damaged,
    Newer(u32),
}

fn decode(buf: &[u8]) -> Decoded {
    // Callers read LABEL_SIZE bytes; anything shorter is no label.
    let Some(head) = buf.get(..HEADER) else {
        return Decoded::Damaged;
    };
    if &head[..8] != MAGIC {
        return if head.iter().all(|&b| b == 0) {
            Decoded::Blank
        } else {
            Decoded::Damaged
        };
    }
    let version = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]);
    if version > LABEL_VERSION {
        return Decoded::Newer(version);
    }
    let len = u32::from_le_bytes([buf[12], buf[13], buf[14], buf[15]]) as usize;
    let Some(json) = HEADER.checked_add(len).and_then(|end| buf.get(HEADER..end)) else {
        return Decoded::Damaged;
    };
    if blake3::hash(json).as_bytes() != &buf[16..48] {
        return Decoded::Damaged;
    }
    match serde_json::from_slice::<Label>(json) {
        Ok(label) => Decoded::Label(Box::new(label)),
        Err(_) => Decoded::Damaged,
    }
}

/// Decodes one label area (the fuzzing entry, decision 0027): `Ok(None)`
/// blank, errors as [`read_label`] gives them for a device named `path`.
pub(crate) fn decode_area(path: &str, buf: &[u8]) -> Result<Option<Label>, LabelError> {
    match decode(buf) {
        Decoded::Label(label) => Ok(Some(*label)),
        Decoded::Blank => Ok(None),
        Decoded::Damaged => Err(LabelError::Damaged(path.to_owned())),
        Decoded::Newer(version) => Err(LabelError::UnsupportedVersion {
            path: path.to_owned(),
            version,
        }),
    }
}

/// The label area as written at both ends of a device (LABEL_SIZE bytes).
pub(crate) fn encode_area(label: &Label) -> Result<Vec<u8>, LabelError> {
    encode(label)
}

pub(crate) fn read_label(vdev: &Vdev) -> Result<Label, LabelError> {
    let path = vdev.path().display().to_string();
    if vdev.size() < 2 * LABEL_SIZE {
        return Err(LabelError::Missing(path));
    }
    let mut damaged = false;
    for offset in [0, vdev.size() - LABEL_SIZE] {
        let mut buf = vec![0u8; LABEL_SIZE as usize];
        vdev.read_at(offset, &mut buf)?;
        match decode(&buf) {
            Decoded::Label(label) => return Ok(*label),
            Decoded::Newer(version) => {
                return Err(LabelError::UnsupportedVersion { path, version })
            }
            Decoded::Damaged => damaged = true,
            Decoded::Blank => {}
        }
    }
    Err(if damaged {
        LabelError::Damaged(path)
    } else {
        LabelError::Missing(path)
    })
}

pub(crate) fn labels_match(vdev: &Vdev, label: &Label) -> Result<bool, LabelError> {
    let want = encode(label)?;
    if vdev.size() < 2 * LABEL_SIZE {
        return Ok(false);
    }
    // Label 0 ends where the MMP slot starts (the owner's stamps are not label bytes).
    let head = (LABEL_SIZE - MMP_SLOT_SIZE) as usize;
    for (offset, n) in [(0, head), (vdev.size() - LABEL_SIZE, LABEL_SIZE as usize)] {
        let mut buf = vec![0u8; n];
        vdev.read_at(offset, &mut buf)?;
        if buf[..] != want[..n] {
            return Ok(false);
        }
    }
    Ok(true)
}

pub(crate) fn write_label(vdev: &Vdev, label: &Label) -> Result<(), LabelError> {
    let buf = encode(label)?;
    // Label 0 stops short of the MMP slot: a relabel never erases the owner's stamp.
    vdev.write_at(0, &buf[..(LABEL_SIZE - MMP_SLOT_SIZE) as usize])?;
    vdev.write_at(vdev.size() - LABEL_SIZE, &buf)?;
    vdev.sync()?;
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample() -> Label {
        Label {
            version: LABEL_VERSION,
            pool_name: "tank".into(),
            pool_guid: 7,
            device_guid: 9,
            group: 0,
            child: 1,
            groups: vec![GroupLayout {
                kind: LayoutKind::Mirror,
                devices: vec![8, 9],
                data_size: 1 << 20,
                resilvering: vec![],
            }],
            regions: Regions {
                meta_offset: LABEL_SIZE,
                meta_size: 1 << 20,
                log_offset: 0,
                log_size: 0,
                data_offset: 0,
            },
            exported: false,
            state: Some(PoolState::Active),
            owner: Some(crate::mmp::tests::owner()),
            generation: 0,
            logs: vec![],
            log_device: false,
        }
    }

    #[test]
    fn version_1_labels_still_read_and_raidz_round_trips() {
        // A label as version 1 wrote it (no `resilvering`, kinds as strings).
        let v1 = r#"{"version":1,"pool_name":"old","pool_guid":3,"device_guid":5,"group":0,"child":0,"groups":[{"kind":"mirror","devices":[5,6],"data_size":4096}],"regions":{"meta_offset":262144,"meta_size":1048576,"log_offset":0,"log_size":0,"data_offset":0},"exported":true}"#;
        let mut buf = vec![0u8; LABEL_SIZE as usize];
        buf[..8].copy_from_slice(MAGIC);
        buf[8..12].copy_from_slice(&1u32.to_le_bytes());
        buf[12..16].copy_from_slice(&(v1.len() as u32).to_le_bytes());
        buf[16..48].copy_from_slice(blake3::hash(v1.as_bytes()).as_bytes());
        buf[HEADER..HEADER + v1.len()].copy_from_slice(v1.as_bytes());
        let Decoded::Label(l) = decode(&buf) else {
            panic!("version 1 label not read")
        };
        assert_eq!(l.groups[0].kind, LayoutKind::Mirror);
        assert!(l.groups[0].resilvering.is_empty());
        // No state or owner (written before decision 0010): `exported` decides.
        assert_eq!((l.state, l.owner.as_ref()), (None, None));
        assert_eq!(l.pool_state(), PoolState::Exported);
        let mut active = (*l).clone();
        active.exported = false;
        assert_eq!(active.pool_state(), PoolState::Active);
        // A plain layout still serializes exactly as version 1 did.
        let json = serde_json::to_string(&l.groups[0]).unwrap();
        assert_eq!(
            json,
            r#"{"kind":"mirror","devices":[5,6],"data_size":4096}"#
        );
        let mut rz = sample();
        rz.version = LayoutKind::Raidz { parity: 2 }.label_version();
        rz.groups[0].kind = LayoutKind::Raidz { parity: 2 };
        rz.groups[0].resilvering = vec![9];
        let Decoded::Label(back) = decode(&encode(&rz).unwrap()) else {
            panic!("raidz label not read back")
        };
        assert_eq!(*back, rz);
        assert_eq!(back.version, 2);
        // Version 3: a log device names its log group; older labels have none.
        assert!(l.logs.is_empty() && !l.log_device);
        let mut slog = sample();
        slog.logs = vec![GroupLayout {
            kind: LayoutKind::Disk,
            devices: vec![11],
            data_size: 1 << 20,
            resilvering: vec![],
        }];
        slog.log_device = true;
        let Decoded::Label(back) = decode(&encode(&slog).unwrap()) else {
            panic!("label with a log device not read back")
        };
        assert_eq!(*back, slog);
        // Without logs the json has neither field (version 1/2 readers parse it).
        let json = serde_json::to_string(&sample()).unwrap();
        assert!(!json.contains("logs") && !json.contains("log_device"));
    }

    #[test]
    fn label_survives_one_damaged_end_and_refuses_newer_versions() {
        let dir = tempfile::tempdir().unwrap();
        let vdev = Vdev::open_or_create(&dir.path().join("d"), Some(4 << 20)).unwrap();
        assert!(matches!(vdev.read_label(), Err(LabelError::Missing(_))));
        vdev.write_label(&sample()).unwrap();
        assert_eq!(vdev.read_label().unwrap(), sample());
        // Damage the front label: the back one is used.
        vdev.write_at(100, &[0xff; 64]).unwrap();
        assert_eq!(vdev.read_label().unwrap(), sample());
        // Damage both: reported as damaged, not as missing.
        vdev.write_at(vdev.size() - LABEL_SIZE + 100, &[0xff; 64])
            .unwrap();
        assert!(matches!(vdev.read_label(), Err(LabelError::Damaged(_))));
        // A label from a future format is refused by name.
        let mut newer = encode(&sample()).unwrap();
        newer[8..12].copy_from_slice(&(LABEL_VERSION + 1).to_le_bytes());
        vdev.write_at(0, &newer).unwrap();
        assert!(matches!(
            vdev.read_label(),
            Err(LabelError::UnsupportedVersion { .. })
        ));
    }
}

//! Block checksums. The block pointer names the algorithm so others can be
//! added without a format change; blake3 is the only one today.

use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ChecksumAlgo {
    Blake3 = 1,
}

pub type Checksum = [u8; 32];

impl ChecksumAlgo {
    pub fn from_code(code: u8) -> Option<Self> {
        (code == 1).then_some(ChecksumAlgo::Blake3)
    }

    /// Checksum of the bytes as stored (after compression), as in ZFS.
    pub fn compute(self, data: &[u8]) -> Checksum {
        match self {
            ChecksumAlgo::Blake3 => *blake3::hash(data).as_bytes(),
        }
    }
}

impl fmt::Display for ChecksumAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("blake3")
    }
}

impl FromStr for ChecksumAlgo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "blake3" | "on" => Ok(ChecksumAlgo::Blake3),
            _ => Err(format!("bad checksum '{s}': expected blake3")),
        }
    }
}

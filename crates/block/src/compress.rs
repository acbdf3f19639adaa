//! Block compression. A block is stored compressed only when that saves at
//! least one sector; otherwise it is stored as is (and read without decoding).

use pool::SECTOR;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::{Read, Write};
use std::str::FromStr;

/// The `compression` property of a dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Compression {
    Off,
    Lz4,
    /// Level 1..=19; `zstd` alone means level 3.
    Zstd(u8),
    /// Level 1..=9; `gzip` alone means level 6.
    Gzip(u8),
}

/// Algorithm recorded in a block pointer (levels do not matter for reading).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum CompressionAlgo {
    Off = 0,
    Lz4 = 1,
    Zstd = 2,
    Gzip = 3,
}

impl CompressionAlgo {
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => CompressionAlgo::Off,
            1 => CompressionAlgo::Lz4,
            2 => CompressionAlgo::Zstd,
            3 => CompressionAlgo::Gzip,
            _ => return None,
        })
    }
}

impl Compression {
    pub fn algo(self) -> CompressionAlgo {
        match self {
            Compression::Off => CompressionAlgo::Off,
            Compression::Lz4 => CompressionAlgo::Lz4,
            Compression::Zstd(_) => CompressionAlgo::Zstd,
            Compression::Gzip(_) => CompressionAlgo::Gzip,
        }
    }

    /// Every setting `cistern bench compress` tries, in order of cost.
    pub fn all_settings() -> Vec<Compression> {
        let mut v = vec![Compression::Off, Compression::Lz4];
        v.extend((1..=19).map(Compression::Zstd));
        v.extend((1..=9).map(Compression::Gzip));
        v
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Compression::Off => write!(f, "off"),
            Compression::Lz4 => write!(f, "lz4"),
            Compression::Zstd(3) => write!(f, "zstd"),
            Compression::Zstd(l) => write!(f, "zstd-{l}"),
            Compression::Gzip(6) => write!(f, "gzip"),
            Compression::Gzip(l) => write!(f, "gzip-{l}"),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "bad compression '{0}': expected off, on, lz4, zstd, zstd-1..zstd-19, gzip or gzip-1..gzip-9"
)]
pub struct ParseCompressionError(pub String);

impl FromStr for Compression {
    type Err = ParseCompressionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParseCompressionError(s.to_string());
        let level = |rest: &str, max: u8| -> Result<u8, ParseCompressionError> {
            let l: u8 = rest.parse().map_err(|_| bad())?;
            if (1..=max).contains(&l) {
                Ok(l)
            } else {
                Err(bad())
            }
        };
        Ok(match s {
            "off" => Compression::Off,
            "on" | "lz4" => Compression::Lz4,
            "zstd" => Compression::Zstd(3),
            "gzip" => Compression::Gzip(6),
            _ => {
                if let Some(rest) = s.strip_prefix("zstd-") {
                    Compression::Zstd(level(rest, 19)?)
                } else if let Some(rest) = s.strip_prefix("gzip-") {
                    Compression::Gzip(level(rest, 9)?)
                } else {
                    return Err(bad());
                }
            }
        })
    }
}

fn sectors(len: usize) -> u64 {
    (len as u64).div_ceil(SECTOR)
}

/// Compresses `data`; `None` when the result would not save a sector.
pub fn compress(setting: Compression, data: &[u8]) -> Option<Vec<u8>> {
    let out = match setting {
        Compression::Off => return None,
        Compression::Lz4 => lz4_flex::block::compress(data),
        Compression::Zstd(level) => zstd::bulk::compress(data, level as i32).ok()?,
        Compression::Gzip(level) => {
            let mut enc = flate2::write::DeflateEncoder::new(
                Vec::with_capacity(data.len() / 2),
                flate2::Compression::new(level as u32),
            );
            enc.write_all(data).ok()?;
            enc.finish().ok()?
        }
    };
    (sectors(out.len()) < sectors(data.len())).then_some(out)
}

#[derive(Debug, thiserror::Error)]
#[error("{algo:?} block does not decompress to {lsize} bytes: {reason}")]
pub struct DecompressError {
    pub algo: CompressionAlgo,
    pub lsize: usize,
    pub reason: String,
}

/// Decompresses a block whose logical size is `lsize`.
pub fn decompress(
    algo: CompressionAlgo,
    src: &[u8],
    lsize: usize,
) -> Result<Vec<u8>, DecompressError> {
    let err = |reason: String| DecompressError {
        algo,
        lsize,
        reason,
    };
    let out = match algo {
        CompressionAlgo::Off => src.to_vec(),
        CompressionAlgo::Lz4 => {
            lz4_flex::block::decompress(src, lsize).map_err(|e| err(e.to_string()))?
        }
        CompressionAlgo::Zstd => {
            zstd::bulk::decompress(src, lsize).map_err(|e| err(e.to_string()))?
        }
        CompressionAlgo::Gzip => {
            let mut out = Vec::with_capacity(lsize);
            flate2::read::DeflateDecoder::new(src)
                .take(lsize as u64 + 1)
                .read_to_end(&mut out)
                .map_err(|e| err(e.to_string()))?;
            out
        }
    };
    if out.len() != lsize {
        return Err(err(format!("got {} bytes", out.len())));
    }
    Ok(out)
}

/// [`decompress`] into `out`, which must be exactly the block's logical size
/// (a buffer of the caller's: the ARC's own, decision 0069).
pub fn decompress_into(
    algo: CompressionAlgo,
    src: &[u8],
    out: &mut [u8],
) -> Result<(), DecompressError> {
    let lsize = out.len();
    let err = |reason: String| DecompressError {
        algo,
        lsize,
        reason,
    };
    let got = match algo {
        CompressionAlgo::Off => {
            if src.len() == lsize {
                out.copy_from_slice(src);
            }
            src.len()
        }
        CompressionAlgo::Lz4 => {
            lz4_flex::block::decompress_into(src, out).map_err(|e| err(e.to_string()))?
        }
        CompressionAlgo::Zstd => {
            zstd::bulk::decompress_to_buffer(src, out).map_err(|e| err(e.to_string()))?
        }
        CompressionAlgo::Gzip => {
            let mut dec = flate2::read::DeflateDecoder::new(src);
            dec.read_exact(out).map_err(|e| err(e.to_string()))?;
            // Nothing may follow the block's bytes.
            let mut more = [0u8; 1];
            match dec.read(&mut more).map_err(|e| err(e.to_string()))? {
                0 => lsize,
                n => lsize + n,
            }
        }
    };
    if got != lsize {
        return Err(err(format!("got {got} bytes")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decompress_into_matches_decompress_and_refuses_wrong_sizes() {
        let data: Vec<u8> = (0..65536u32).map(|i| (i / 64 % 251) as u8).collect();
        for setting in [Compression::Lz4, Compression::Zstd(3), Compression::Gzip(6)] {
            let packed = compress(setting, &data).expect("compressible");
            let algo = setting.algo();
            let mut out = vec![0u8; data.len()];
            decompress_into(algo, &packed, &mut out).unwrap();
            assert!(out == data, "{algo:?}");
            assert!(out == decompress(algo, &packed, data.len()).unwrap());
            // A buffer shorter or longer than the block is an error, never a prefix.
            let mut short = vec![0u8; data.len() - 1];
            assert!(
                decompress_into(algo, &packed, &mut short).is_err(),
                "{algo:?} short"
            );
            let mut long = vec![0u8; data.len() + 1];
            assert!(
                decompress_into(algo, &packed, &mut long).is_err(),
                "{algo:?} long"
            );
        }
        let mut out = vec![0u8; 8];
        decompress_into(CompressionAlgo::Off, b"12345678", &mut out).unwrap();
        assert_eq!(&out, b"12345678");
        assert!(decompress_into(CompressionAlgo::Off, b"1234567", &mut out).is_err());
    }
}

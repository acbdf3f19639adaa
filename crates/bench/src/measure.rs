//! One drive measured for `cistern pool plan --measure`: random 4 KiB reads
//! (the `bench iops` machinery, W workers) and a 1 MiB sequential read
//! stream, each for a set time over the whole drive; with `write` also
//! random synchronous 4 KiB writes and a sequential write stream (synced
//! every 64 MiB and at the end), which overwrite what the drive holds.

use std::os::unix::fs::FileTypeExt;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::{RngCore, SeedableRng};
use serde::Serialize;

use crate::iops::{self, IopsConfig, Rw};
use crate::target::{AlignedBuf, OpenFlags, TargetSpec};
use crate::{interrupt, util};

/// Bytes per random operation.
pub const RANDOM_BLOCK: u64 = 4096;
/// Bytes per streaming operation.
pub const STREAM_CHUNK: u64 = 1 << 20;
/// Streaming writes are made durable at least this often.
pub const STREAM_SYNC_EVERY: u64 = 64 << 20;

#[derive(Debug, Clone)]
pub struct MeasureConfig {
    /// Time of each phase (at least 1 s).
    pub duration: Duration,
    /// Workers of the random phases.
    pub workers: usize,
    /// Also measure writes (overwrites the target).
    pub write: bool,
    /// O_DIRECT for files and devices.
    pub direct: bool,
    /// Phase messages and progress bars on stderr.
    pub progress: bool,
}

/// What one drive did.
#[derive(Debug, Clone, Serialize)]
pub struct DriveMeasurement {
    pub target: String,
    /// The whole target, bytes.
    pub size: u64,
    /// Bytes the phases spread over (the target, in whole MiB).
    pub region_bytes: u64,
    /// Time of each phase, seconds.
    pub duration_s: f64,
    pub workers: usize,
    pub direct: bool,
    /// Mean of the per-second counts.
    pub random_read_iops: f64,
    pub seq_read_mbps: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub random_write_iops: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq_write_mbps: Option<f64>,
    /// What may make the figures differ from the drive's.
    pub notes: Vec<String>,
}

/// Measures an existing file or block device (or NBD export). Never writes
/// unless `cfg.write`.
pub fn measure(spec: &TargetSpec, cfg: &MeasureConfig) -> anyhow::Result<DriveMeasurement> {
    if cfg.duration < Duration::from_secs(1) {
        bail!("--duration must be at least 1s");
    }
    let mut notes = Vec::new();
    if let TargetSpec::File(p) = spec {
        let md = std::fs::metadata(p).with_context(|| {
            format!(
                "{}: cannot measure it (give an existing drive or file)",
                p.display()
            )
        })?;
        let ft = md.file_type();
        if ft.is_file() {
            if md.len() < STREAM_CHUNK {
                bail!(
                    "{}: {} bytes is too small to measure (at least 1M)",
                    p.display(),
                    md.len()
                );
            }
            if !cfg.direct {
                notes.push(
                    "a regular file without --direct: the page cache may answer reads, \
                     so the figures can exceed the drive's"
                        .to_string(),
                );
            }
        } else if !ft.is_block_device() {
            bail!("{}: not a regular file or block device", p.display());
        }
    }
    // --force is what allows writing, so it also allows overwriting data.
    let prep = spec.prepare(None, cfg.write, true, cfg.write, STREAM_CHUNK)?;
    notes.extend(prep.notes.iter().cloned());
    let size = prep.target_size;
    let region = size / STREAM_CHUNK * STREAM_CHUNK;
    let result = phases(spec, cfg, region, &mut notes);
    prep.finish()?;
    let (rr, sr, rw, sw) = result?;
    Ok(DriveMeasurement {
        target: spec.describe(),
        size,
        region_bytes: region,
        duration_s: cfg.duration.as_secs() as f64,
        workers: cfg.workers,
        direct: cfg.direct,
        random_read_iops: rr,
        seq_read_mbps: sr,
        random_write_iops: rw,
        seq_write_mbps: sw,
        notes,
    })
}

type Figures = (f64, f64, Option<f64>, Option<f64>);

fn phases(
    spec: &TargetSpec,
    cfg: &MeasureConfig,
    region: u64,
    notes: &mut Vec<String>,
) -> anyhow::Result<Figures> {
    let name = spec.label();
    let random = |rw: Rw| -> anyhow::Result<f64> {
        if cfg.progress {
            eprintln!(
                "measuring {} {}: 4K, {} workers, {} s",
                spec.describe(),
                rw.as_str(),
                cfg.workers,
                cfg.duration.as_secs()
            );
        }
        let icfg = IopsConfig {
            workers: cfg.workers,
            duration: cfg.duration,
            rw,
            read_percent: if rw == Rw::Randread { 100 } else { 0 },
            block_size: RANDOM_BLOCK,
            region: Some(region),
            force: cfg.write,
            direct: cfg.direct,
            progress: cfg.progress,
        };
        Ok(iops::run(spec, &icfg, region, &name)?.iops.mean)
    };
    let rr = random(Rw::Randread)?;
    let sr = stream(spec, cfg, region, false, notes)?;
    if !cfg.write {
        return Ok((rr, sr, None, None));
    }
    let rw = random(Rw::Randwrite)?;
    let sw = stream(spec, cfg, region, true, notes)?;
    Ok((rr, sr, Some(rw), Some(sw)))
}

/// One thread reading (or writing) `STREAM_CHUNK`s in order from offset 0,
/// wrapping at the end of the region, for the configured time. MB/s.
fn stream(
    spec: &TargetSpec,
    cfg: &MeasureConfig,
    region: u64,
    write: bool,
    notes: &mut Vec<String>,
) -> anyhow::Result<f64> {
    let what = if write { "write" } else { "read" };
    if cfg.progress {
        eprintln!(
            "measuring {} sequential {what}: 1M, 1 stream, {} s",
            spec.describe(),
            cfg.duration.as_secs()
        );
    }
    let mut t = spec.open(OpenFlags { direct: cfg.direct }, write)?;
    let mut buf = AlignedBuf::new(STREAM_CHUNK as usize);
    if write {
        rand::rngs::SmallRng::seed_from_u64(util::unix_now()).fill_bytes(&mut buf);
    }
    let start = Instant::now();
    let (mut off, mut bytes, mut unsynced, mut passes) = (0u64, 0u64, 0u64, 0u32);
    while start.elapsed() < cfg.duration {
        if interrupt::requested() {
            bail!("interrupted");
        }
        if write {
            t.write_at(off, &buf)?;
            unsynced += STREAM_CHUNK;
            if unsynced >= STREAM_SYNC_EVERY {
                t.sync()?;
                unsynced = 0;
            }
        } else {
            t.read_at(off, &mut buf)?;
        }
        bytes += STREAM_CHUNK;
        off += STREAM_CHUNK;
        if off + STREAM_CHUNK > region {
            off = 0;
            passes += 1;
        }
    }
    if write {
        t.sync()?;
    }
    let secs = start.elapsed().as_secs_f64();
    t.close()?;
    if passes > 0 && !write {
        notes.push(format!(
            "the sequential read went over the whole target {} time(s) in {} s: later passes \
             may come from a cache",
            passes + 1,
            cfg.duration.as_secs()
        ));
    }
    Ok(bytes as f64 / secs / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(write: bool) -> MeasureConfig {
        MeasureConfig {
            duration: Duration::from_secs(1),
            workers: 2,
            write,
            direct: false,
            progress: false,
        }
    }

    #[test]
    fn reads_without_writing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("drive.img");
        let data: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8 + 1).collect();
        std::fs::write(&p, &data).unwrap();
        let m = measure(&TargetSpec::File(p.clone()), &cfg(false)).unwrap();
        assert!(m.random_read_iops > 0.0 && m.seq_read_mbps > 0.0, "{m:?}");
        assert_eq!((m.random_write_iops, m.seq_write_mbps), (None, None));
        assert_eq!((m.size, m.region_bytes), (4 << 20, 4 << 20));
        assert!(m.notes.iter().any(|n| n.contains("page cache")), "{m:?}");
        assert_eq!(std::fs::read(&p).unwrap(), data, "not written");
    }

    #[test]
    fn writes_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("drive.img");
        std::fs::write(&p, vec![7u8; 2 << 20]).unwrap();
        let m = measure(&TargetSpec::File(p.clone()), &cfg(true)).unwrap();
        assert!(m.random_write_iops.unwrap() > 0.0);
        assert!(m.seq_write_mbps.unwrap() > 0.0);
        assert_ne!(std::fs::read(&p).unwrap(), vec![7u8; 2 << 20]);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 2 << 20);
    }

    #[test]
    fn refuses_what_it_cannot_measure() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let e = measure(&TargetSpec::File(missing.clone()), &cfg(false)).unwrap_err();
        assert!(
            format!("{e:#}").contains("give an existing drive or file"),
            "{e:#}"
        );
        assert!(!missing.exists(), "nothing created");
        let small = dir.path().join("small");
        std::fs::write(&small, [1u8; 4096]).unwrap();
        let e = measure(&TargetSpec::File(small), &cfg(false)).unwrap_err();
        assert!(e.to_string().contains("too small"), "{e}");
        let e = measure(&TargetSpec::File(dir.path().to_path_buf()), &cfg(false)).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
}

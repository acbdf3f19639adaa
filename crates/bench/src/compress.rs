//! `cistern bench compress`: which compression setting is worth it on *my*
//! data. The corpus is split into records (128 KiB by default) and every
//! record goes through the block pipeline's CPU stage, [`block::encode`]
//! (compress, fall back to raw when no sector is saved, checksum): the same
//! code the write path runs. Each setting is timed with 1 and N parallel
//! writer threads, R times, and the 10%-trimmed mean is reported with the
//! compressratio and the efficiency (ratio / time).
//!
//! Not yet measured: placing the blocks on a scratch dataset (the
//! `dataset::Engine` is still being written); when it lands, `encode_all`
//! becomes "write the corpus into a scratch dataset with this property".

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use block::{ChecksumAlgo, Compression};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;

use crate::stats::trimmed_mean;
use crate::svg::{ScatterChart, ScatterPoint};

/// Allocation unit: physical sizes are rounded up to it.
pub const SECTOR: u64 = 4096;

/// The settings tried by default.
pub fn default_settings() -> Vec<Compression> {
    let mut v = vec![Compression::Off, Compression::Lz4];
    v.extend([1, 3, 9, 19].map(Compression::Zstd));
    v.extend((1..=9).map(Compression::Gzip));
    v
}

/// Always with the level (`zstd-3`, `gzip-6`), unlike the property's short forms.
pub fn label(c: Compression) -> String {
    match c {
        Compression::Zstd(l) => format!("zstd-{l}"),
        Compression::Gzip(l) => format!("gzip-{l}"),
        other => other.to_string(),
    }
}

/// Parses `off,lz4,zstd-3,gzip-1..9`-style lists (`gzip-1..9` and
/// `zstd-1..19` ranges allowed).
pub fn parse_settings(s: &str) -> anyhow::Result<Vec<Compression>> {
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
        if let Some((a, b)) = item.split_once("..") {
            let (algo, lo) = a
                .rsplit_once('-')
                .with_context(|| format!("range {item:?}: expected e.g. gzip-1..9"))?;
            let lo: u8 = lo.parse().with_context(|| format!("range {item:?}"))?;
            let hi: u8 = b.parse().with_context(|| format!("range {item:?}"))?;
            if lo > hi {
                bail!("range {item:?} is empty");
            }
            for l in lo..=hi {
                out.push(
                    format!("{algo}-{l}")
                        .parse::<Compression>()
                        .map_err(|e| anyhow::anyhow!("{e}"))?,
                );
            }
        } else {
            out.push(
                item.parse::<Compression>()
                    .map_err(|e| anyhow::anyhow!("{e}"))?,
            );
        }
    }
    if out.is_empty() {
        bail!("no compression settings given");
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|c| seen.insert(*c));
    Ok(out)
}

/// The data to compress, already cut into records.
#[derive(Debug, Clone)]
pub struct Corpus {
    pub records: Vec<Vec<u8>>,
    pub files: usize,
    pub bytes: u64,
    /// Bytes in the directory that were left out to stay under the cap.
    pub skipped_bytes: u64,
}

impl Corpus {
    /// Cuts each file into records of `record_size` (the last one shorter).
    pub fn from_files(files: &[Vec<u8>], record_size: usize) -> Self {
        let mut records = Vec::new();
        let mut bytes = 0;
        for f in files {
            bytes += f.len() as u64;
            records.extend(f.chunks(record_size.max(1)).map(<[u8]>::to_vec));
        }
        Self {
            records,
            files: files.len(),
            bytes,
            skipped_bytes: 0,
        }
    }

    /// Reads regular files under `dir` (recursively, symlinks not followed).
    /// Above `max_bytes`, a seeded random choice of whole files is taken so
    /// that the sample spreads over the tree.
    pub fn load(dir: &Path, record_size: usize, max_bytes: u64) -> anyhow::Result<Self> {
        let mut paths = Vec::new();
        walk(dir, &mut paths, 0)?;
        if paths.is_empty() {
            bail!("{}: no regular files to compress", dir.display());
        }
        paths.sort();
        let total: u64 = paths.iter().map(|(_, n)| n).sum();
        if total > max_bytes {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
            paths.shuffle(&mut rng);
        }
        let mut files = Vec::new();
        let mut taken = 0u64;
        for (p, len) in &paths {
            if taken >= max_bytes {
                break;
            }
            if *len == 0 {
                continue;
            }
            let mut data = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
            let room = (max_bytes - taken) as usize;
            if data.len() > room {
                // keep whole records
                let keep = (room / record_size.max(1)).max(1) * record_size.max(1);
                data.truncate(keep.min(data.len()));
            }
            taken += data.len() as u64;
            files.push(data);
        }
        let mut c = Self::from_files(&files, record_size);
        c.skipped_bytes = total.saturating_sub(c.bytes);
        Ok(c)
    }
}

fn walk(dir: &Path, out: &mut Vec<(PathBuf, u64)>, depth: usize) -> anyhow::Result<()> {
    if depth > 64 {
        bail!("{}: directory tree deeper than 64 levels", dir.display());
    }
    let rd = std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?;
    for e in rd {
        let e = e.with_context(|| format!("listing {}", dir.display()))?;
        let ft = e.file_type()?;
        if ft.is_dir() {
            walk(&e.path(), out, depth + 1)?;
        } else if ft.is_file() {
            out.push((e.path(), e.metadata()?.len()));
        }
    }
    Ok(())
}

/// Settings of a measurement.
#[derive(Debug, Clone)]
pub struct CompressConfig {
    pub settings: Vec<Compression>,
    pub writers: Vec<usize>,
    pub repeat: usize,
}

/// One setting with one writer count.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub setting: String,
    pub writers: usize,
    /// Wall time of every repetition, seconds.
    pub times_s: Vec<f64>,
    /// 10%-trimmed mean of `times_s`.
    pub time_s: f64,
    /// Logical bytes, each record rounded up to a sector (so `off` is 1.00x).
    pub logical: u64,
    /// Stored bytes: compressed size rounded up to a sector, raw when that saves nothing.
    pub physical: u64,
    pub records: usize,
    /// Records stored compressed.
    pub compressed_records: usize,
    pub ratio: f64,
    /// Logical MiB per second.
    pub mib_per_s: f64,
    /// ratio / time_s.
    pub efficiency: f64,
}

fn sectors(n: usize) -> u64 {
    (n as u64).div_ceil(SECTOR) * SECTOR
}

/// Encodes every record with `writers` threads; returns (wall time, physical
/// bytes, records stored compressed).
fn encode_all(records: &[Vec<u8>], setting: Compression, writers: usize) -> (Duration, u64, usize) {
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    let per: Vec<(u64, usize)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..writers.max(1))
            .map(|_| {
                s.spawn(|| {
                    let (mut phys, mut comp) = (0u64, 0usize);
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(r) = records.get(i) else { break };
                        let b = block::encode(r, setting, ChecksumAlgo::Blake3);
                        phys += sectors(b.payload.len());
                        if b.compression != block::CompressionAlgo::Off {
                            comp += 1;
                        }
                    }
                    (phys, comp)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or((0, 0))).collect()
    });
    let t = start.elapsed();
    let phys = per.iter().map(|p| p.0).sum();
    let comp = per.iter().map(|p| p.1).sum();
    (t, phys, comp)
}

/// Checks that every record decodes back to itself with this setting.
fn verify(records: &[Vec<u8>], setting: Compression) -> anyhow::Result<()> {
    for (i, r) in records.iter().enumerate() {
        let b = block::encode(r, setting, ChecksumAlgo::Blake3);
        let back = block::decompress(b.compression, &b.payload, r.len())
            .with_context(|| format!("{}: record {i} does not decompress", label(setting)))?;
        if &back != r {
            bail!(
                "{}: record {i} decompresses to different bytes",
                label(setting)
            );
        }
    }
    Ok(())
}

/// Measures every setting with every writer count, `repeat` times; the
/// repetitions are interleaved so that background noise spreads over all
/// settings. `progress(done, total)` is called after each timing.
pub fn measure(
    corpus: &Corpus,
    cfg: &CompressConfig,
    mut progress: impl FnMut(usize, usize),
) -> anyhow::Result<Vec<Row>> {
    if corpus.records.is_empty() {
        bail!("empty corpus");
    }
    if cfg.repeat == 0 || cfg.writers.is_empty() || cfg.writers.contains(&0) {
        bail!("--repeat and every --writers value must be at least 1");
    }
    let logical: u64 = corpus.records.iter().map(|r| sectors(r.len())).sum();
    let mut rows: Vec<Row> = Vec::new();
    for &s in &cfg.settings {
        verify(&corpus.records, s)?;
        for &w in &cfg.writers {
            rows.push(Row {
                setting: label(s),
                writers: w,
                times_s: Vec::new(),
                time_s: 0.0,
                logical,
                physical: 0,
                records: corpus.records.len(),
                compressed_records: 0,
                ratio: 0.0,
                mib_per_s: 0.0,
                efficiency: 0.0,
            });
        }
    }
    let total = cfg.repeat * rows.len();
    let mut done = 0;
    for _ in 0..cfg.repeat {
        let mut i = 0;
        for &s in &cfg.settings {
            for &w in &cfg.writers {
                let (t, phys, comp) = encode_all(&corpus.records, s, w);
                let row = &mut rows[i];
                row.times_s.push(t.as_secs_f64());
                row.physical = phys;
                row.compressed_records = comp;
                i += 1;
                done += 1;
                progress(done, total);
            }
        }
    }
    for r in &mut rows {
        r.time_s = trimmed_mean(&r.times_s, 0.10).max(1e-9);
        r.ratio = r.logical as f64 / r.physical.max(1) as f64;
        r.mib_per_s = corpus.bytes as f64 / (1 << 20) as f64 / r.time_s;
        r.efficiency = r.ratio / r.time_s;
    }
    Ok(rows)
}

/// What to pick, for one writer count.
#[derive(Debug, Clone, Serialize)]
pub struct Recommendation {
    pub writers: usize,
    pub best_efficiency: String,
    pub time_budget_s: f64,
    /// True when the budget was derived (3x the most efficient setting's time).
    pub budget_derived: bool,
    pub best_ratio_within_budget: Option<String>,
}

/// Below this ratio a setting is not worth its CPU: the data "does not compress".
pub const MIN_USEFUL_RATIO: f64 = 1.05;

/// Among the rows with `writers` writers: the most efficient (ratio / time)
/// setting that compresses at least [`MIN_USEFUL_RATIO`] (`off` costs
/// almost no time here, so ratio / time would always crown it; `off` is
/// recommended only when nothing compresses), and the best ratio whose time
/// fits the budget (default: three times the most efficient setting's time).
pub fn recommend(rows: &[Row], writers: usize, budget: Option<Duration>) -> Option<Recommendation> {
    let rs: Vec<&Row> = rows.iter().filter(|r| r.writers == writers).collect();
    let by_eff = |a: &&Row, b: &&Row| a.efficiency.total_cmp(&b.efficiency);
    let best = rs
        .iter()
        .copied()
        .filter(|r| r.setting != "off" && r.ratio >= MIN_USEFUL_RATIO)
        .max_by(by_eff)
        .or_else(|| rs.iter().copied().find(|r| r.setting == "off"))
        .or_else(|| rs.iter().copied().max_by(by_eff))?;
    let (budget_s, derived) = match budget {
        Some(b) => (b.as_secs_f64(), false),
        None => (best.time_s * 3.0, true),
    };
    let within = rs
        .iter()
        .copied()
        .filter(|r| r.time_s <= budget_s)
        .max_by(|a, b| {
            a.ratio
                .total_cmp(&b.ratio)
                .then(b.time_s.total_cmp(&a.time_s))
        });
    Some(Recommendation {
        writers,
        best_efficiency: best.setting.clone(),
        time_budget_s: budget_s,
        budget_derived: derived,
        best_ratio_within_budget: within.map(|r| r.setting.clone()),
    })
}

pub fn table(rows: &[Row]) -> String {
    let mut t = format!(
        "{:<9} {:>7} {:>10} {:>10} {:>7} {:>11} {:>11}\n",
        "setting", "writers", "time", "MiB/s", "ratio", "efficiency", "compressed"
    );
    for r in rows {
        t.push_str(&format!(
            "{:<9} {:>7} {:>9.3}s {:>10.1} {:>6.2}x {:>11.2} {:>10}%\n",
            r.setting,
            r.writers,
            r.time_s,
            r.mib_per_s,
            r.ratio,
            r.efficiency,
            format!(
                "{:.0}",
                100.0 * r.compressed_records as f64 / r.records.max(1) as f64
            )
        ));
    }
    t
}

pub fn chart(rows: &[Row], writers: &[usize]) -> String {
    let groups: Vec<String> = writers
        .iter()
        .map(|w| format!("{w} writer{}", if *w == 1 { "" } else { "s" }))
        .collect();
    let points = rows
        .iter()
        .map(|r| ScatterPoint {
            label: r.setting.clone(),
            x: r.time_s,
            y: r.ratio,
            group: writers.iter().position(|w| *w == r.writers).unwrap_or(0),
        })
        .collect();
    ScatterChart {
        title: "Compression: ratio against time (up and to the left is better)".into(),
        x_label: "time to encode the corpus, s (10%-trimmed mean, log scale)".into(),
        y_label: "compressratio (logical / physical, 4 KiB sectors)".into(),
        groups,
        points,
        x_log: true,
    }
    .render()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rand::{Rng, RngCore};

    const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    /// A mail-like corpus: headers, prose with quoted replies, and base64
    /// attachments of binary (incompressible) data.
    pub(crate) fn mail_corpus(messages: usize, seed: u64) -> Vec<Vec<u8>> {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let words = [
            "the", "backup", "server", "snapshot", "please", "find", "attached", "report",
            "meeting", "tomorrow", "thanks", "regards", "drive", "failed", "again", "we", "should",
            "replace", "it", "before", "friday", "invoice", "quarter", "numbers",
        ];
        let names = ["alice", "bob", "carol", "dave", "erin", "frank"];
        (0..messages)
            .map(|m| {
                let mut s = String::new();
                let from = names[rng.random_range(0..names.len())];
                let to = names[rng.random_range(0..names.len())];
                s += &format!(
                    "Return-Path: <{from}@example.org>\r\nReceived: from mx{}.example.org (mx.example.org [192.0.2.{}])\r\n\tby mail.example.com with ESMTPS id {:016x}\r\n\
                     Message-ID: <{:x}.{m}@example.org>\r\nDate: Tue, {} Nov 2026 10:{:02}:00 +0000\r\nFrom: {from} <{from}@example.org>\r\n\
                     To: {to} <{to}@example.com>\r\nSubject: Re: {} {}\r\nMIME-Version: 1.0\r\n\
                     Content-Type: multipart/mixed; boundary=\"b{m}\"\r\n\r\n--b{m}\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n",
                    rng.random_range(1..9),
                    rng.random_range(1..250),
                    rng.next_u64(),
                    rng.next_u64(),
                    rng.random_range(1..28),
                    rng.random_range(0..60),
                    words[rng.random_range(0..words.len())],
                    words[rng.random_range(0..words.len())],
                );
                let para = |prefix: &str, s: &mut String, rng: &mut rand::rngs::SmallRng| {
                    for _ in 0..rng.random_range(3..12) {
                        s.push_str(prefix);
                        for _ in 0..rng.random_range(6..14) {
                            s.push_str(words[rng.random_range(0..words.len())]);
                            s.push(' ');
                        }
                        s.push_str("\r\n");
                    }
                };
                para("", &mut s, &mut rng);
                s += &format!("\r\nOn Mon, {to} wrote:\r\n");
                para("> ", &mut s, &mut rng);
                para("> > ", &mut s, &mut rng);
                s += "\r\n-- \r\nSent from my backup box\r\n";
                let mut out = s.into_bytes();
                if rng.random_bool(0.3) {
                    out.extend_from_slice(
                        format!(
                            "--b{m}\r\nContent-Type: application/octet-stream; name=\"scan{m}.jpg\"\r\n\
                             Content-Transfer-Encoding: base64\r\n\r\n"
                        )
                        .as_bytes(),
                    );
                    let n = rng.random_range(2_000..30_000);
                    for i in 0..n {
                        out.push(B64[rng.random_range(0..64)]);
                        if i % 76 == 75 {
                            out.extend_from_slice(b"\r\n");
                        }
                    }
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(format!("--b{m}--\r\n").as_bytes());
                out
            })
            .collect()
    }

    #[test]
    fn incompressible_data_recommends_off() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(9);
        let mut f = vec![0u8; 600_000];
        rng.fill_bytes(&mut f);
        let corpus = Corpus::from_files(&[f], 128 << 10);
        let cfg = CompressConfig {
            settings: parse_settings("off,lz4,zstd-1").unwrap(),
            writers: vec![1],
            repeat: 3,
        };
        let rows = measure(&corpus, &cfg, |_, _| {}).unwrap();
        assert!(rows
            .iter()
            .all(|r| r.ratio == 1.0 && r.compressed_records == 0));
        assert_eq!(recommend(&rows, 1, None).unwrap().best_efficiency, "off");
    }

    #[test]
    fn settings_parse() {
        let s = parse_settings("off, lz4,zstd-3,gzip-1..3,zstd").unwrap();
        let l: Vec<String> = s.into_iter().map(label).collect();
        assert_eq!(l, ["off", "lz4", "zstd-3", "gzip-1", "gzip-2", "gzip-3"]);
        assert!(parse_settings("zstd-30").is_err());
        assert!(parse_settings("brotli").is_err());
        assert_eq!(default_settings().len(), 15);
    }

    #[test]
    fn advisor_ranks_mail_plausibly() {
        // A mbox per "mailbox", ~0.7 MiB in all.
        let msgs = mail_corpus(120, 3);
        let files: Vec<Vec<u8>> = msgs.chunks(20).map(|c| c.concat()).collect();
        let corpus = Corpus::from_files(&files, 128 << 10);
        assert!(corpus.bytes > 400_000, "{}", corpus.bytes);
        let cfg = CompressConfig {
            settings: default_settings(),
            writers: vec![1, 2],
            repeat: 1,
        };
        let rows = measure(&corpus, &cfg, |_, _| {}).unwrap();
        assert_eq!(rows.len(), 30);
        let ratio = |s: &str| {
            rows.iter()
                .find(|r| r.setting == s && r.writers == 1)
                .unwrap()
                .ratio
        };
        assert!((ratio("off") - 1.0).abs() < 1e-12);
        assert!(ratio("lz4") > 1.05, "lz4 {}", ratio("lz4"));
        for l in [3, 9, 19] {
            let (a, b) = (ratio("zstd-1"), ratio(&format!("zstd-{l}")));
            assert!(b >= a, "zstd-{l} {b} < zstd-1 {a}");
        }
        for l in 2..=9 {
            let (a, b) = (ratio("gzip-1"), ratio(&format!("gzip-{l}")));
            assert!(b >= a, "gzip-{l} {b} < gzip-1 {a}");
        }
        assert!(ratio("zstd-19") > ratio("lz4"));
        // the same setting gives the same ratio whatever the writer count
        for r in &rows {
            let other = rows
                .iter()
                .find(|o| o.setting == r.setting && o.writers != r.writers)
                .unwrap();
            assert_eq!(r.physical, other.physical);
        }
        let rec = recommend(&rows, 2, None).unwrap();
        assert_ne!(rec.best_efficiency, "off", "mail compresses");
        assert!(rec.best_ratio_within_budget.is_some());
        // With time no object, the pick has the best ratio of all (the faster on ties).
        let rec = recommend(&rows, 1, Some(Duration::from_secs(3600))).unwrap();
        let pick = rec.best_ratio_within_budget.unwrap();
        let max = rows.iter().map(|r| r.ratio).fold(0.0, f64::max);
        assert_eq!(ratio(&pick), max, "{pick}");
        let svg = chart(&rows, &cfg.writers);
        let tags = crate::svg::tests::check_well_formed(&svg).unwrap();
        assert_eq!(tags.iter().filter(|t| *t == "circle").count(), 30);
        assert!(table(&rows).contains("gzip-9"));
    }

    #[test]
    fn loads_directory_with_cap() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("a"), vec![1u8; 300_000]).unwrap();
        std::fs::write(dir.path().join("sub/b"), vec![2u8; 100]).unwrap();
        std::fs::write(dir.path().join("empty"), b"").unwrap();
        let c = Corpus::load(dir.path(), 128 << 10, 1 << 30).unwrap();
        assert_eq!(c.bytes, 300_100);
        assert_eq!(c.records.len(), 4); // 128K + 128K + 37856 + 100
        let c = Corpus::load(dir.path(), 128 << 10, 150_000).unwrap();
        assert!(c.bytes <= 150_000 && c.skipped_bytes > 0);
        assert!(Corpus::load(&dir.path().join("sub/b"), 4096, 1).is_err());
    }
}

//! `cistern bench compress`: which compression setting is worth it on *my*
//! data. The corpus (every regular file under a directory, concatenated and
//! cut into volblocksize records) is written through the real pipeline: for
//! every setting, writer count and repetition a fresh volume with that
//! `compression` property is created on a scratch pool, W writer threads
//! write their share of the records, and `Engine::sync_all` commits the txg
//! (compress, checksum, place, write, fsync, metadata). The time runs from
//! the first write to the end of that commit; the ratio is the engine's own
//! `compressratio` (`logicalused` / `used`). The volume is destroyed after
//! each run, the pool (a sparse file in a temporary directory) at the end.
//!
//! `--filesystem` measures the seed's way instead: the tree is copied file
//! by file into a fresh filesystem dataset (`recordsize` = the record size)
//! through the POSIX layer, with 1 and 2 writers taking files from opposite
//! ends of the list as the seed's two cpio runs did.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use block::Compression;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;

use crate::stats::trimmed_mean;
use crate::svg::{ScatterChart, ScatterPoint};

/// The scratch pool's name.
pub const POOL: &str = "benchpool";
/// Smallest scratch pool device (a sparse file).
pub const MIN_POOL_BYTES: u64 = 256 << 20;
/// Default volblocksize of the scratch volumes (the records of the corpus).
pub const DEFAULT_BLOCK_SIZE: u64 = 128 << 10;

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

/// Checks a volblocksize the way the engine will (a power of two, 4K..128K).
pub fn check_block_size(n: u64) -> anyhow::Result<u32> {
    dataset::props::validate_volblocksize(n).map_err(|e| anyhow::anyhow!("--record-size: {e}"))
}

/// The data to write: the files concatenated and cut into records of the
/// volblocksize; record `i` goes to byte offset `i * record_size`.
#[derive(Debug, Clone)]
pub struct Corpus {
    /// All `record_size` long but the last.
    pub records: Vec<Vec<u8>>,
    pub record_size: usize,
    pub files: usize,
    pub bytes: u64,
    /// Bytes in the directory that were left out to stay under the cap.
    pub skipped_bytes: u64,
}

impl Corpus {
    /// Concatenates the files and cuts the stream into records of `record_size`.
    pub fn from_files(files: &[Vec<u8>], record_size: usize) -> Self {
        let record_size = record_size.max(1);
        let mut records = Vec::new();
        let mut cur: Vec<u8> = Vec::with_capacity(record_size);
        let mut bytes = 0;
        for f in files {
            bytes += f.len() as u64;
            let mut rest = &f[..];
            while !rest.is_empty() {
                let take = (record_size - cur.len()).min(rest.len());
                cur.extend_from_slice(&rest[..take]);
                rest = &rest[take..];
                if cur.len() == record_size {
                    records.push(std::mem::replace(&mut cur, Vec::with_capacity(record_size)));
                }
            }
        }
        if !cur.is_empty() {
            records.push(cur);
        }
        Self {
            records,
            record_size,
            files: files.len(),
            bytes,
            skipped_bytes: 0,
        }
    }

    /// Reads regular files under `dir` (recursively, symlinks not followed).
    /// Above `max_bytes`, a seeded random choice of files is taken so that
    /// the sample spreads over the tree (the last one cut to fit).
    pub fn load(dir: &Path, record_size: usize, max_bytes: u64) -> anyhow::Result<Self> {
        let tree = FileTree::load(dir, max_bytes)?;
        let files: Vec<Vec<u8>> = tree.files.into_iter().map(|(_, d)| d).collect();
        let mut c = Self::from_files(&files, record_size);
        c.skipped_bytes = tree.skipped_bytes;
        Ok(c)
    }

    /// Bytes of the volume that holds the corpus (whole blocks).
    pub fn volume_bytes(&self) -> u64 {
        (self.records.len() as u64).max(1) * self.record_size as u64
    }

    /// Logical bytes the engine stores for this corpus with `setting`: every
    /// block, except that with compression on an all-zero block is a hole.
    pub fn expected_logical(&self, setting: Compression) -> u64 {
        let blocks = self
            .records
            .iter()
            .filter(|r| setting == Compression::Off || r.iter().any(|&b| b != 0))
            .count();
        blocks as u64 * self.record_size as u64
    }
}

/// Files of a directory tree with their paths (relative to it), for the
/// filesystem measurement and as the source of a [`Corpus`].
#[derive(Debug, Clone)]
pub struct FileTree {
    /// Sorted by path.
    pub files: Vec<(PathBuf, Vec<u8>)>,
    pub bytes: u64,
    /// Bytes in the directory that were left out to stay under the cap.
    pub skipped_bytes: u64,
}

impl FileTree {
    /// Reads regular files under `dir` (recursively, symlinks not followed).
    /// Above `max_bytes`, a seeded random choice of files is taken so that
    /// the sample spreads over the tree (the last one cut to fit).
    pub fn load(dir: &Path, max_bytes: u64) -> anyhow::Result<Self> {
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
            let room = usize::try_from(max_bytes - taken).unwrap_or(usize::MAX);
            data.truncate(room);
            taken += data.len() as u64;
            let rel = p.strip_prefix(dir).unwrap_or(p).to_path_buf();
            files.push((rel, data));
        }
        if taken == 0 {
            bail!(
                "{}: the files hold no data (or --max-bytes is 0)",
                dir.display()
            );
        }
        files.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Self {
            files,
            bytes: taken,
            skipped_bytes: total.saturating_sub(taken),
        })
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

/// Bytes free to an unprivileged user on the file system holding `path`.
fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs writes into a zeroed struct we own; c is NUL-terminated.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return None;
        }
        Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
    }
}

/// One timed run of the corpus through the engine.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// First write to the end of the txg commit.
    pub time: Duration,
    /// The volume's `logicalused` after the commit.
    pub logical: u64,
    /// The volume's `used` after the commit.
    pub physical: u64,
    /// The volume's `compressratio` (two decimals, rounded down).
    pub compressratio: f64,
}

/// A one-device pool in a temporary directory, for the whole bench: every
/// run gets a fresh volume on it. Dropping it destroys the pool and removes
/// the directory (also on error, panic or Ctrl-C, which the runs observe).
pub struct ScratchPool {
    engine: Arc<dataset::Engine>,
    /// Declared after `engine`: removed once the pool is gone.
    dir: tempfile::TempDir,
    block_size: u32,
    size: u64,
    next: AtomicU64,
}

impl ScratchPool {
    /// Creates the pool under `parent` (in a new hidden temporary directory),
    /// sized for a corpus of `corpus_bytes`: max(256 MiB, 4x the corpus).
    pub fn create(parent: &Path, corpus_bytes: u64, block_size: u32) -> anyhow::Result<Self> {
        check_block_size(block_size as u64)?;
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
        // The engine wants absolute device paths.
        let parent = &std::path::absolute(parent)
            .with_context(|| format!("resolving {}", parent.display()))?;
        let size = MIN_POOL_BYTES
            .max(corpus_bytes.saturating_mul(4))
            .div_ceil(1 << 20)
            << 20;
        if let Some(free) = free_bytes(parent) {
            if free < size {
                bail!(
                    "{}: {} free, the scratch pool may take up to {} (a sparse file): \
                     choose another --scratch directory or a smaller --max-bytes",
                    parent.display(),
                    crate::util::fmt_bytes(free),
                    crate::util::fmt_bytes(size)
                );
            }
        }
        let dir = tempfile::Builder::new()
            .prefix(".cistern-bench-compress-")
            .tempdir_in(parent)
            .with_context(|| format!("creating a scratch directory in {}", parent.display()))?;
        let engine = dataset::Engine::open(
            &dir.path().join("state"),
            dataset::EngineConfig {
                txg_timeout_secs: 3600.0,
                ..Default::default()
            },
        )
        .context("opening the scratch engine")?;
        engine
            .create_pool(dataset::PoolSpec {
                name: POOL.into(),
                groups: vec![dataset::GroupSpec {
                    kind: dataset::GroupKind::Disk,
                    devices: vec![dir.path().join("d0")],
                }],
                create_size: Some(size),
                force: false,
            })
            .context("creating the scratch pool")?;
        Ok(Self {
            engine,
            dir,
            block_size,
            size,
            next: AtomicU64::new(0),
        })
    }

    /// The temporary directory (device file and engine state).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Size of the pool's device file (sparse).
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Writes the corpus into a new volume with `compression=setting` using
    /// `writers` threads, commits, reads the space figures, optionally reads
    /// everything back and compares, and destroys the volume.
    pub fn run(
        &self,
        corpus: &Corpus,
        setting: Compression,
        writers: usize,
        verify: bool,
    ) -> anyhow::Result<Sample> {
        if corpus.record_size != self.block_size as usize {
            bail!(
                "corpus records of {} bytes, volblocksize {}",
                corpus.record_size,
                self.block_size
            );
        }
        let name = format!("{POOL}/c{}", self.next.fetch_add(1, Ordering::Relaxed));
        self.engine
            .create_volume(
                &name,
                corpus.volume_bytes(),
                &[
                    ("compression".into(), label(setting)),
                    ("volblocksize".into(), self.block_size.to_string()),
                    // Sparse: `used` must be what the blocks take, not the reservation.
                    ("refreservation".into(), "none".into()),
                ],
            )
            .with_context(|| format!("creating scratch volume {name}"))?;
        let result = self.write_and_commit(&name, corpus, setting, writers, verify);
        let destroyed = self
            .engine
            .destroy(&name, &dataset::DestroyOptions::default())
            .with_context(|| format!("destroying scratch volume {name}"));
        let sample =
            result.with_context(|| format!("{} with {writers} writer(s)", label(setting)))?;
        destroyed?;
        Ok(sample)
    }

    fn write_and_commit(
        &self,
        name: &str,
        corpus: &Corpus,
        setting: Compression,
        writers: usize,
        verify: bool,
    ) -> anyhow::Result<Sample> {
        let vol = self.engine.open_volume(name)?;
        let bs = self.block_size as u64;
        let next = AtomicUsize::new(0);
        let start = Instant::now();
        self.write_with(
            writers,
            |_| {
                let i = next.fetch_add(1, Ordering::Relaxed);
                (i < corpus.records.len()).then_some(i)
            },
            |i| {
                vol.write(i as u64 * bs, &corpus.records[i], false)
                    .with_context(|| format!("writing record {i}"))
            },
        )?;
        let time = start.elapsed();

        let sample = self.sample(name, time)?;
        // sync_all reports no commit error (the txg is kept and retried), so
        // check that every block made it.
        let expected = corpus.expected_logical(setting);
        if sample.logical != expected {
            bail!(
                "after the txg commit {name} holds {} logical bytes, expected {expected}: \
                 the commit did not store every block",
                sample.logical
            );
        }
        if verify {
            verify_volume(&vol, corpus)?;
        }
        Ok(sample)
    }

    /// Runs `writers` threads until `claim(writer)` has nothing left, each
    /// doing `work(item)`; the first error (or Ctrl-C) stops them all. Then
    /// commits the txg.
    fn write_with(
        &self,
        writers: usize,
        claim: impl Fn(usize) -> Option<usize> + Sync,
        work: impl Fn(usize) -> anyhow::Result<()> + Sync,
    ) -> anyhow::Result<()> {
        let failed = AtomicBool::new(false);
        let results: Vec<anyhow::Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..writers.max(1))
                .map(|w| {
                    let (claim, work, failed) = (&claim, &work, &failed);
                    s.spawn(move || -> anyhow::Result<()> {
                        while !failed.load(Ordering::Relaxed) && !crate::interrupt::requested() {
                            let Some(i) = claim(w) else {
                                break;
                            };
                            if let Err(e) = work(i) {
                                failed.store(true, Ordering::Relaxed);
                                return Err(e);
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a writer thread panicked")))
                })
                .collect()
        });
        for r in results {
            r?;
        }
        if crate::interrupt::requested() {
            bail!("interrupted");
        }
        self.engine.sync_all().context("committing the txg")?;
        Ok(())
    }

    /// The dataset's space figures after the commit that took `time`.
    fn sample(&self, name: &str, time: Duration) -> anyhow::Result<Sample> {
        let info = self.engine.dataset(name)?;
        let prop = |p: &str| -> anyhow::Result<String> {
            Ok(info
                .property(p)
                .with_context(|| format!("{name} has no property {p}"))?
                .parsable
                .clone())
        };
        Ok(Sample {
            time,
            logical: prop("logicalused")?.parse().context("logicalused")?,
            physical: prop("used")?.parse().context("used")?,
            compressratio: prop("compressratio")?.parse().context("compressratio")?,
        })
    }
}

impl ScratchPool {
    /// Copies the tree into a new filesystem dataset with
    /// `compression=setting` and `recordsize` = the pool's block size, file
    /// by file through the POSIX layer: writer `i` takes files from the
    /// front of the list if even, from the back if odd (the seed's cpio runs
    /// in opposite orders), until they meet. Then commits, reads the space
    /// figures, optionally reads every file back, and destroys the dataset.
    pub fn run_fs(
        &self,
        tree: &FileTree,
        setting: Compression,
        writers: usize,
        verify: bool,
    ) -> anyhow::Result<Sample> {
        let name = format!("{POOL}/f{}", self.next.fetch_add(1, Ordering::Relaxed));
        self.engine
            .create_dataset(
                &name,
                dataset::DatasetKind::Filesystem,
                &[
                    ("compression".into(), label(setting)),
                    ("recordsize".into(), self.block_size.to_string()),
                ],
            )
            .with_context(|| format!("creating scratch filesystem {name}"))?;
        let result = self.copy_tree(&name, tree, writers, verify);
        let destroyed = self
            .engine
            .destroy(&name, &dataset::DestroyOptions::default())
            .with_context(|| format!("destroying scratch filesystem {name}"));
        let sample =
            result.with_context(|| format!("{} with {writers} writer(s)", label(setting)))?;
        destroyed?;
        Ok(sample)
    }

    fn copy_tree(
        &self,
        name: &str,
        tree: &FileTree,
        writers: usize,
        verify: bool,
    ) -> anyhow::Result<Sample> {
        let fs = posix::Fs::new(self.engine.open_objects(name)?)
            .map_err(|e| anyhow::anyhow!("opening {name}: {e}"))?;
        let me = posix::Cred::root();
        let start = Instant::now();
        // Directories first (as cpio makes them before their files).
        let mut dirs: std::collections::BTreeMap<PathBuf, u64> = Default::default();
        dirs.insert(PathBuf::new(), posix::ROOT);
        for (path, _) in &tree.files {
            let mut at = PathBuf::new();
            for part in path.parent().into_iter().flat_map(|p| p.components()) {
                let parent = dirs[&at];
                at.push(part);
                if !dirs.contains_key(&at) {
                    let d = fs
                        .mkdir(parent, part.as_os_str().as_encoded_bytes(), 0o755, &me)
                        .map_err(|e| anyhow::anyhow!("mkdir {}: {e}", at.display()))?;
                    dirs.insert(at.clone(), d.ino);
                }
            }
        }
        // The unclaimed files are ends..[front, back): even writers take the front, odd the back.
        let ends = std::sync::Mutex::new((0usize, tree.files.len()));
        let inos: Vec<AtomicU64> = tree.files.iter().map(|_| AtomicU64::new(0)).collect();
        let copy = |i: usize| -> anyhow::Result<()> {
            let (path, data) = &tree.files[i];
            let dir = dirs[&path.parent().map(Path::to_path_buf).unwrap_or_default()];
            let leaf = path
                .file_name()
                .map(|n| n.as_encoded_bytes())
                .unwrap_or(b"?");
            let f = fs
                .create(dir, leaf, 0o644, &me)
                .map_err(|e| anyhow::anyhow!("create {}: {e}", path.display()))?;
            fs.write(f.ino, 0, data)
                .map_err(|e| anyhow::anyhow!("write {}: {e}", path.display()))?;
            inos[i].store(f.ino, Ordering::Relaxed);
            Ok(())
        };
        self.write_with(
            writers,
            |w| {
                let mut e = ends.lock().unwrap_or_else(|p| p.into_inner());
                if e.0 >= e.1 {
                    return None;
                }
                if w % 2 == 0 {
                    e.0 += 1;
                    Some(e.0 - 1)
                } else {
                    e.1 -= 1;
                    Some(e.1)
                }
            },
            copy,
        )?;
        let time = start.elapsed();
        let missing = inos
            .iter()
            .filter(|i| i.load(Ordering::Relaxed) == 0)
            .count();
        if missing > 0 {
            bail!("{missing} file(s) were not copied");
        }
        let sample = self.sample(name, time)?;
        if verify {
            for ((path, data), ino) in tree.files.iter().zip(&inos) {
                let got = fs
                    .read(ino.load(Ordering::Relaxed), 0, data.len() as u32 + 1)
                    .map_err(|e| anyhow::anyhow!("reading back {}: {e}", path.display()))?;
                if got != *data {
                    bail!(
                        "{}: read back differs from what was written",
                        path.display()
                    );
                }
            }
        }
        Ok(sample)
    }
}

impl Drop for ScratchPool {
    fn drop(&mut self) {
        // Closes the pool (its sync thread) before the directory goes.
        let _ = self.engine.destroy_pool(POOL);
    }
}

/// Reads the corpus back through the engine (fetch, verify, decompress) and
/// compares.
fn verify_volume(vol: &dataset::Volume, corpus: &Corpus) -> anyhow::Result<()> {
    const CHUNK: usize = 32;
    let bs = corpus.record_size as u64;
    for (c, recs) in corpus.records.chunks(CHUNK).enumerate() {
        let offset = (c * CHUNK) as u64 * bs;
        let want: Vec<u8> = recs.concat();
        let mut got = Vec::with_capacity(want.len());
        for seg in vol
            .read(offset, want.len() as u64)
            .with_context(|| format!("reading back at {offset}"))?
        {
            match seg {
                dataset::ReadSegment::Data(d) => got.extend_from_slice(&d),
                dataset::ReadSegment::Hole(n) => got.resize(got.len() + n as usize, 0),
            }
        }
        if got != want {
            let at = got
                .iter()
                .zip(&want)
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(want.len()));
            bail!(
                "read back differs from what was written at byte {} (read {} bytes, wrote {})",
                offset + at as u64,
                got.len(),
                want.len()
            );
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
    /// Wall time of every repetition, seconds: first write to the end of the txg commit.
    pub times_s: Vec<f64>,
    /// 10%-trimmed mean of `times_s`.
    pub time_s: f64,
    /// The volume's `logicalused`: bytes of the blocks stored, before compression.
    pub logical: u64,
    /// The volume's `used`: bytes allocated for them.
    pub physical: u64,
    /// The engine's `compressratio` property (two decimals, rounded down).
    pub compressratio: f64,
    /// logical / physical, unrounded (what the ranking uses).
    pub ratio: f64,
    /// Corpus MiB per second.
    pub mib_per_s: f64,
    /// ratio / time_s.
    pub efficiency: f64,
}

/// Measures every setting with every writer count, `repeat` times, each
/// run through `pool`; the repetitions are interleaved so that background
/// noise spreads over all settings. The first run of each setting also
/// reads the corpus back and compares. `progress(done, total)` is called
/// after each run.
pub fn measure(
    corpus: &Corpus,
    cfg: &CompressConfig,
    pool: &ScratchPool,
    progress: impl FnMut(usize, usize),
) -> anyhow::Result<Vec<Row>> {
    if corpus.records.is_empty() {
        bail!("empty corpus");
    }
    measure_with(
        corpus.bytes,
        cfg,
        |s, w, verify| pool.run(corpus, s, w, verify),
        progress,
    )
}

/// [`measure`] of a tree copied into filesystem datasets ([`ScratchPool::run_fs`]).
pub fn measure_fs(
    tree: &FileTree,
    cfg: &CompressConfig,
    pool: &ScratchPool,
    progress: impl FnMut(usize, usize),
) -> anyhow::Result<Vec<Row>> {
    if tree.files.is_empty() {
        bail!("empty corpus");
    }
    measure_with(
        tree.bytes,
        cfg,
        |s, w, verify| pool.run_fs(tree, s, w, verify),
        progress,
    )
}

fn measure_with(
    corpus_bytes: u64,
    cfg: &CompressConfig,
    mut run: impl FnMut(Compression, usize, bool) -> anyhow::Result<Sample>,
    mut progress: impl FnMut(usize, usize),
) -> anyhow::Result<Vec<Row>> {
    if cfg.repeat == 0 || cfg.writers.is_empty() || cfg.writers.contains(&0) {
        bail!("--repeat and every --writers value must be at least 1");
    }
    if cfg.settings.is_empty() {
        bail!("no compression settings given");
    }
    let mut rows: Vec<Row> = Vec::new();
    for &s in &cfg.settings {
        for &w in &cfg.writers {
            rows.push(Row {
                setting: label(s),
                writers: w,
                times_s: Vec::new(),
                time_s: 0.0,
                logical: 0,
                physical: 0,
                compressratio: 0.0,
                ratio: 0.0,
                mib_per_s: 0.0,
                efficiency: 0.0,
            });
        }
    }
    let total = cfg.repeat * rows.len();
    let mut done = 0;
    for rep in 0..cfg.repeat {
        let mut i = 0;
        for &s in &cfg.settings {
            for (wi, &w) in cfg.writers.iter().enumerate() {
                if crate::interrupt::requested() {
                    bail!("interrupted");
                }
                let sample = run(s, w, rep == 0 && wi == 0)?;
                let row = &mut rows[i];
                row.times_s.push(sample.time.as_secs_f64());
                row.logical = sample.logical;
                row.physical = sample.physical;
                row.compressratio = sample.compressratio;
                i += 1;
                done += 1;
                progress(done, total);
            }
        }
    }
    for r in &mut rows {
        r.time_s = trimmed_mean(&r.times_s, 0.10).max(1e-9);
        r.ratio = if r.physical == 0 {
            1.0
        } else {
            r.logical as f64 / r.physical as f64
        };
        r.mib_per_s = corpus_bytes as f64 / (1 << 20) as f64 / r.time_s;
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
/// setting that compresses at least [`MIN_USEFUL_RATIO`] (`off` spends no
/// CPU on compression and on fast storage ratio / time would crown it
/// whatever the data; it is recommended only when nothing compresses), and
/// the best ratio whose time fits the budget (default: three times the most
/// efficient setting's time).
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

/// The results as a text table.
pub fn table(rows: &[Row]) -> String {
    let mut t = format!(
        "{:<9} {:>7} {:>10} {:>10} {:>7} {:>11} {:>11} {:>11}\n",
        "setting", "writers", "time", "MiB/s", "ratio", "efficiency", "used", "logicalused"
    );
    for r in rows {
        t.push_str(&format!(
            "{:<9} {:>7} {:>9.3}s {:>10.1} {:>6.2}x {:>11.2} {:>11} {:>11}\n",
            r.setting,
            r.writers,
            r.time_s,
            r.mib_per_s,
            r.compressratio,
            r.efficiency,
            crate::util::fmt_bytes(r.physical),
            crate::util::fmt_bytes(r.logical),
        ));
    }
    t
}

/// Ratio against time, one colour per writer count.
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
        x_label: "time to write and commit the corpus, s (10%-trimmed mean, log scale)".into(),
        y_label: "compressratio (logicalused / used)".into(),
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

    fn scratch(corpus: &Corpus) -> (tempfile::TempDir, ScratchPool) {
        let parent = tempfile::tempdir().unwrap();
        let pool =
            ScratchPool::create(parent.path(), corpus.bytes, corpus.record_size as u32).unwrap();
        (parent, pool)
    }

    fn cfg(settings: &str, writers: &[usize], repeat: usize) -> CompressConfig {
        CompressConfig {
            settings: parse_settings(settings).unwrap(),
            writers: writers.to_vec(),
            repeat,
        }
    }

    #[test]
    fn incompressible_data_recommends_off() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(9);
        let mut f = vec![0u8; 5 << 17];
        rng.fill_bytes(&mut f);
        let corpus = Corpus::from_files(&[f], 128 << 10);
        let (_parent, pool) = scratch(&corpus);
        let rows = measure(&corpus, &cfg("off,lz4,zstd-1", &[1], 3), &pool, |_, _| {}).unwrap();
        for r in &rows {
            // 5 blocks of 128K, none compressible by a whole sector: stored raw.
            // (A short last record would be padded with zeros and compress.)
            assert_eq!(r.logical, 5 << 17, "{r:?}");
            assert_eq!(r.physical, r.logical, "{r:?}");
            assert_eq!((r.ratio, r.compressratio), (1.0, 1.0), "{r:?}");
            assert_eq!(r.times_s.len(), 3);
        }
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
        // A mbox per "mailbox", ~4 MiB in all, through the engine.
        let msgs = mail_corpus(700, 3);
        let files: Vec<Vec<u8>> = msgs.chunks(50).map(|c| c.concat()).collect();
        let mut corpus = Corpus::from_files(&files, 128 << 10);
        while corpus.bytes < 4 << 20 {
            let more = mail_corpus(100, corpus.bytes);
            let mut all = files.clone();
            all.extend(more.chunks(50).map(|c| c.concat()));
            corpus = Corpus::from_files(&all, 128 << 10);
        }
        let settings = "off,lz4,zstd-1,zstd-3,zstd-9,gzip-1,gzip-6,gzip-9";
        let cfg = cfg(settings, &[1, 2], 1);
        let (_parent, pool) = scratch(&corpus);
        let rows = measure(&corpus, &cfg, &pool, |_, _| {}).unwrap();
        assert_eq!(rows.len(), 16);
        let row = |s: &str| {
            rows.iter()
                .find(|r| r.setting == s && r.writers == 1)
                .unwrap()
        };
        let ratio = |s: &str| row(s).ratio;
        assert_eq!(ratio("off"), 1.0);
        assert_eq!(row("off").logical, corpus.volume_bytes());
        assert!(ratio("lz4") > 1.05, "lz4 {}", ratio("lz4"));
        for l in [3, 9] {
            let (a, b) = (ratio("zstd-1"), ratio(&format!("zstd-{l}")));
            assert!(b >= a, "zstd-{l} {b} < zstd-1 {a}");
        }
        for l in [6, 9] {
            let (a, b) = (ratio("gzip-1"), ratio(&format!("gzip-{l}")));
            assert!(b >= a, "gzip-{l} {b} < gzip-1 {a}");
        }
        assert!(ratio("zstd-9") > ratio("lz4"));
        for r in &rows {
            // the engine's property is the same ratio, rounded down to 1/100
            assert!(
                r.compressratio <= r.ratio + 1e-9 && r.ratio - r.compressratio < 0.01 + 1e-9,
                "{r:?}"
            );
            // the same setting stores the same bytes whatever the writer count
            let other = rows
                .iter()
                .find(|o| o.setting == r.setting && o.writers != r.writers)
                .unwrap();
            assert_eq!((r.logical, r.physical), (other.logical, other.physical));
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
        assert_eq!(tags.iter().filter(|t| *t == "circle").count(), 16);
        assert!(table(&rows).contains("gzip-9"));
    }

    #[test]
    fn zero_blocks_are_holes_when_compressing() {
        let bs = 4096;
        let mut f = vec![7u8; 3 * bs];
        f[bs..2 * bs].fill(0);
        f.extend_from_slice(b"tail");
        let corpus = Corpus::from_files(&[f], bs);
        assert_eq!(corpus.records.len(), 4);
        assert_eq!(corpus.expected_logical(Compression::Off), 4 * bs as u64);
        assert_eq!(corpus.expected_logical(Compression::Lz4), 3 * bs as u64);
        let (_parent, pool) = scratch(&corpus);
        for (setting, logical) in [(Compression::Off, 4 * bs), (Compression::Lz4, 3 * bs)] {
            // verify = true: read back through the engine and compared
            let s = pool.run(&corpus, setting, 2, true).unwrap();
            assert_eq!(s.logical, logical as u64, "{setting}");
        }
        // a corpus cut for another block size is refused
        let other = Corpus::from_files(&[vec![1u8; 10_000]], 8192);
        assert!(pool.run(&other, Compression::Off, 1, false).is_err());
    }

    #[test]
    fn filesystem_copies_measure_and_verify() {
        let src = tempfile::tempdir().unwrap();
        for (i, m) in mail_corpus(60, 3).into_iter().enumerate() {
            let d = src.path().join(format!("box{}", i % 4)).join("cur");
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(format!("{i}.eml")), m).unwrap();
        }
        let tree = FileTree::load(src.path(), 1 << 30).unwrap();
        assert_eq!(tree.files.len(), 60);
        let (_dir, pool) = {
            let dir = tempfile::tempdir().unwrap();
            let pool = ScratchPool::create(dir.path(), tree.bytes, 16 << 10).unwrap();
            (dir, pool)
        };
        let rows = measure_fs(&tree, &cfg("off,zstd-3", &[1, 2], 1), &pool, |_, _| {}).unwrap();
        assert_eq!(rows.len(), 4);
        let ratio = |s: &str| rows.iter().find(|r| r.setting == s).unwrap().ratio;
        assert!(ratio("zstd-3") > 1.15 * ratio("off"), "{rows:?}");
        // Every run verified its copy (the first of each setting) and left nothing behind.
        assert!(pool.run_fs(&tree, Compression::Lz4, 2, true).is_ok());
    }

    #[test]
    fn scratch_pool_is_removed_on_drop() {
        let parent = tempfile::tempdir().unwrap();
        let corpus = Corpus::from_files(&[vec![5u8; 300_000]], 128 << 10);
        let pool = ScratchPool::create(parent.path(), corpus.bytes, 128 << 10).unwrap();
        let dir = pool.path().to_path_buf();
        assert!(dir.starts_with(parent.path()) && dir.join("d0").exists());
        assert_eq!(pool.size(), MIN_POOL_BYTES);
        let s = pool.run(&corpus, Compression::Gzip(1), 1, true).unwrap();
        assert!(s.physical < s.logical && s.compressratio > 10.0, "{s:?}");
        drop(pool);
        assert!(!dir.exists());
        assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0);
        assert!(ScratchPool::create(parent.path(), 1, 1000).is_err());
        assert_eq!(std::fs::read_dir(parent.path()).unwrap().count(), 0);
    }

    fn row(setting: &str, time_s: f64, ratio: f64) -> Row {
        Row {
            setting: setting.into(),
            writers: 1,
            times_s: vec![time_s],
            time_s,
            logical: 0,
            physical: 0,
            compressratio: ratio,
            ratio,
            mib_per_s: 0.0,
            efficiency: ratio / time_s,
        }
    }

    #[test]
    fn recommendation_rules() {
        // off is the most efficient but is passed over while something compresses
        let rows = [
            row("off", 0.1, 1.0),
            row("lz4", 0.2, 1.5),
            row("zstd-3", 0.4, 2.2),
            row("gzip-9", 2.0, 2.4),
        ];
        let r = recommend(&rows, 1, None).unwrap();
        assert_eq!(r.best_efficiency, "lz4"); // 7.5/s; off's 10/s does not count
        assert!(r.budget_derived && (r.time_budget_s - 0.6).abs() < 1e-12);
        assert_eq!(r.best_ratio_within_budget.as_deref(), Some("zstd-3"));
        let r = recommend(&rows, 1, Some(Duration::from_secs(5))).unwrap();
        assert_eq!(r.best_ratio_within_budget.as_deref(), Some("gzip-9"));
        let r = recommend(&rows, 1, Some(Duration::from_millis(50))).unwrap();
        assert_eq!(r.best_ratio_within_budget, None);
        assert!(recommend(&rows, 2, None).is_none());
        // nothing compresses: off
        let rows = [row("off", 0.1, 1.0), row("lz4", 0.11, 1.01)];
        assert_eq!(recommend(&rows, 1, None).unwrap().best_efficiency, "off");
    }

    #[test]
    fn corpus_concatenates_files() {
        let c = Corpus::from_files(&[vec![1u8; 5000], vec![2u8; 5000], vec![3u8; 100]], 4096);
        assert_eq!(c.bytes, 10_100);
        let lens: Vec<usize> = c.records.iter().map(Vec::len).collect();
        assert_eq!(lens, [4096, 4096, 1908]);
        assert_eq!(&c.records[1][..904], &[1u8; 904][..]);
        assert_eq!(&c.records[1][904..], &[2u8; 3192][..]);
        assert_eq!(c.volume_bytes(), 3 * 4096);
        assert_eq!(c.files, 3);
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
        assert_eq!(c.files, 2);
        assert_eq!(c.records.len(), 3); // 128K + 128K + 37956, files concatenated
        let c = Corpus::load(dir.path(), 128 << 10, 150_000).unwrap();
        assert!(c.bytes <= 150_000 && c.skipped_bytes > 0);
        assert_eq!(c.bytes + c.skipped_bytes, 300_100);
        assert!(Corpus::load(&dir.path().join("sub/b"), 4096, 1).is_err());
        let empty = tempfile::tempdir().unwrap();
        std::fs::write(empty.path().join("e"), b"").unwrap();
        assert!(Corpus::load(empty.path(), 4096, 1 << 20).is_err());
    }
}

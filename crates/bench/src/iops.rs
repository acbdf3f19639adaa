//! `cistern bench iops`: W worker threads doing random synchronous I/O on a
//! target for a fixed time, recording the operations completed in every
//! second and every latency.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::stats::{x_or_better, Histogram, LatencySummary, SeriesSummary};
use crate::svg::{LineChart, Series};
use crate::target::{AlignedBuf, OpenFlags, Target, TargetSpec};
use crate::util;

/// The I/O pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Rw {
    /// Random synchronous writes (pwrite + fdatasync, or NBD WRITE with FUA).
    Randwrite,
    /// Random reads.
    Randread,
    /// A random mix (see --read-percent).
    Randrw,
}

impl Rw {
    pub fn as_str(self) -> &'static str {
        match self {
            Rw::Randwrite => "randwrite",
            Rw::Randread => "randread",
            Rw::Randrw => "randrw",
        }
    }
    pub fn writes(self) -> bool {
        self != Rw::Randread
    }
    pub fn reads(self) -> bool {
        self != Rw::Randwrite
    }
}

/// Settings of one run.
#[derive(Debug, Clone)]
pub struct IopsConfig {
    pub workers: usize,
    pub duration: Duration,
    pub rw: Rw,
    pub read_percent: u8,
    pub block_size: u64,
    /// Bytes of the target to use (None: min(target size, 1 GiB)).
    pub region: Option<u64>,
    pub force: bool,
    pub direct: bool,
    /// Draw a progress bar on stderr (hidden anyway when stderr is not a terminal).
    pub progress: bool,
}

/// Everything a run measured; the JSON samples file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    /// Always `cistern-bench-iops/1`.
    pub format: String,
    pub name: String,
    pub target: String,
    pub rw: Rw,
    pub read_percent: u8,
    pub workers: usize,
    pub block_size: u64,
    pub region_bytes: u64,
    pub direct: bool,
    pub duration_s: f64,
    pub started_at: String,
    pub total_ops: u64,
    /// Bytes moved per second over the run, in MB (10^6 bytes).
    #[serde(default)]
    pub mb_per_s: f64,
    /// Operations completed in each whole second of the run.
    pub per_second_iops: Vec<u64>,
    pub iops: SeriesSummary,
    /// Latency of every operation (both kinds for randrw).
    pub latency: LatencySummary,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_latency: Option<LatencySummary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_latency: Option<LatencySummary>,
}

pub const RUN_FORMAT: &str = "cistern-bench-iops/1";

struct WorkerResult {
    per_second: Vec<u64>,
    reads: Histogram,
    writes: Histogram,
}

#[allow(clippy::too_many_arguments)]
fn worker(
    mut t: Box<dyn Target>,
    cfg: &IopsConfig,
    region_blocks: u64,
    seconds: usize,
    start: Instant,
    stop: &AtomicBool,
    done: &AtomicU64,
    seed: u64,
) -> anyhow::Result<WorkerResult> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let bs = cfg.block_size as usize;
    let mut wbuf = AlignedBuf::new(bs);
    rng.fill_bytes(&mut wbuf);
    let mut rbuf = AlignedBuf::new(bs);
    let mut r = WorkerResult {
        per_second: vec![0; seconds],
        reads: Histogram::new(),
        writes: Histogram::new(),
    };
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let block = rng.random_range(0..region_blocks);
        let off = block * cfg.block_size;
        let read = match cfg.rw {
            Rw::Randread => true,
            Rw::Randwrite => false,
            Rw::Randrw => rng.random_range(0..100u8) < cfg.read_percent,
        };
        let t0 = Instant::now();
        if read {
            t.read_at(off, &mut rbuf)?;
        } else {
            n += 1;
            wbuf[..8].copy_from_slice(&n.to_le_bytes());
            t.write_sync(off, &wbuf)?;
        }
        let t1 = Instant::now();
        let sec = (t1 - start).as_secs() as usize;
        if t1 - start >= cfg.duration || sec >= seconds {
            break; // finished after the end: not counted
        }
        let ns = (t1 - t0).as_nanos().min(u128::from(u64::MAX)) as u64;
        if read {
            r.reads.record(ns);
        } else {
            r.writes.record(ns);
        }
        r.per_second[sec] += 1;
        done.fetch_add(1, Ordering::Relaxed);
    }
    t.close()?;
    Ok(r)
}

/// Runs the benchmark; the target must already be prepared (see
/// [`TargetSpec::prepare`]) with `region` bytes usable.
pub fn run(
    spec: &TargetSpec,
    cfg: &IopsConfig,
    region: u64,
    name: &str,
) -> anyhow::Result<RunRecord> {
    if cfg.workers == 0 || cfg.workers > 4096 {
        bail!("--workers must be between 1 and 4096");
    }
    if cfg.block_size == 0 || cfg.block_size % 512 != 0 || cfg.block_size > (16 << 20) {
        bail!("--block-size must be a multiple of 512 up to 16 MiB");
    }
    if cfg.duration < Duration::from_secs(1) {
        bail!("--duration must be at least 1s (IOPS are counted per second)");
    }
    if cfg.read_percent > 100 {
        bail!("--read-percent must be 0..=100");
    }
    let seconds = cfg.duration.as_secs() as usize;
    let region_blocks = region / cfg.block_size;
    if region_blocks == 0 {
        bail!("region smaller than one block");
    }
    // Open every handle first: connection set-up is not measured.
    let mut handles = Vec::with_capacity(cfg.workers);
    for _ in 0..cfg.workers {
        handles.push(spec.open(OpenFlags { direct: cfg.direct }, cfg.rw.writes())?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let started_at = util::rfc3339(util::unix_now());
    let base_seed = util::unix_now() ^ u64::from(std::process::id());
    let start = Instant::now();
    let mut joins = Vec::with_capacity(cfg.workers);
    for (i, t) in handles.into_iter().enumerate() {
        let (stop, done, cfg2) = (stop.clone(), done.clone(), cfg.clone());
        let seed = base_seed.wrapping_add(i as u64 * 0x9E37_79B9);
        let j = std::thread::Builder::new()
            .name(format!("bench-w{i}"))
            .spawn(move || {
                let r = worker(t, &cfg2, region_blocks, seconds, start, &stop, &done, seed);
                if r.is_err() {
                    stop.store(true, Ordering::Relaxed);
                }
                r
            })
            .context("spawning a worker thread")?;
        joins.push(j);
    }

    let bar = if cfg.progress {
        let b = indicatif::ProgressBar::with_draw_target(
            Some(seconds as u64),
            indicatif::ProgressDrawTarget::stderr(),
        );
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len}s {msg}",
        ) {
            b.set_style(style);
        }
        Some(b)
    } else {
        None
    };
    let mut last = (Instant::now(), 0u64);
    let mut interrupted = false;
    while !stop.load(Ordering::Relaxed) && start.elapsed() < cfg.duration {
        if crate::interrupt::requested() {
            interrupted = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        if let Some(b) = &bar {
            b.set_position(start.elapsed().as_secs().min(seconds as u64));
            let now = Instant::now();
            if now - last.0 >= Duration::from_secs(1) {
                let d = done.load(Ordering::Relaxed);
                let rate = (d - last.1) as f64 / (now - last.0).as_secs_f64();
                b.set_message(format!("{rate:.0} IOPS"));
                last = (now, d);
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let mut per_second = vec![0u64; seconds];
    let mut reads = Histogram::new();
    let mut writes = Histogram::new();
    let mut first_err = None;
    for j in joins {
        match j.join() {
            Ok(Ok(r)) => {
                for (a, b) in per_second.iter_mut().zip(&r.per_second) {
                    *a += b;
                }
                reads.merge(&r.reads);
                writes.merge(&r.writes);
            }
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(_) => {
                first_err.get_or_insert(anyhow::anyhow!("a worker thread panicked"));
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e.context("benchmark stopped"));
    }
    if interrupted {
        bail!("interrupted");
    }
    let mut all = reads.clone();
    all.merge(&writes);
    let samples: Vec<f64> = per_second.iter().map(|&v| v as f64).collect();
    let total_ops: u64 = per_second.iter().sum();
    Ok(RunRecord {
        format: RUN_FORMAT.into(),
        name: name.to_string(),
        target: spec.describe(),
        rw: cfg.rw,
        read_percent: if cfg.rw == Rw::Randrw {
            cfg.read_percent
        } else if cfg.rw == Rw::Randread {
            100
        } else {
            0
        },
        workers: cfg.workers,
        block_size: cfg.block_size,
        region_bytes: region,
        direct: cfg.direct,
        duration_s: seconds as f64,
        started_at,
        total_ops,
        mb_per_s: (total_ops * cfg.block_size) as f64 / seconds as f64 / 1e6,
        iops: SeriesSummary::of(&samples),
        per_second_iops: per_second,
        latency: all.summary(),
        read_latency: (cfg.rw == Rw::Randrw).then(|| reads.summary()),
        write_latency: (cfg.rw == Rw::Randrw).then(|| writes.summary()),
    })
}

/// `second,iops` lines with a header.
pub fn to_csv(r: &RunRecord) -> String {
    let mut s = String::from("second,iops\n");
    for (i, v) in r.per_second_iops.iter().enumerate() {
        s.push_str(&format!("{i},{v}\n"));
    }
    s
}

/// A named per-second IOPS series loaded from a samples file.
#[derive(Debug, Clone)]
pub struct Samples {
    pub name: String,
    pub per_second: Vec<f64>,
}

/// Loads per-second IOPS from a run's JSON ([`RunRecord`], or any object
/// with a `per_second_iops` array, or a bare array of numbers) or CSV
/// (`second,iops`; the last column is used).
pub fn load_samples(path: &Path) -> anyhow::Result<Samples> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "run".into());
    let trimmed = text.trim_start();
    let (name, per_second) = if trimmed.starts_with('{') || trimmed.starts_with('[') {
        let v: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let (name, arr) = match &v {
            serde_json::Value::Array(a) => (stem.clone(), a.clone()),
            serde_json::Value::Object(o) => {
                let arr = o
                    .get("per_second_iops")
                    .and_then(|a| a.as_array())
                    .cloned()
                    .with_context(|| format!("{}: no per_second_iops array", path.display()))?;
                let name = o
                    .get("name")
                    .and_then(|n| n.as_str())
                    .map(str::to_string)
                    .unwrap_or(stem.clone());
                (name, arr)
            }
            _ => bail!("{}: expected a JSON object or array", path.display()),
        };
        let vals = arr
            .iter()
            .map(|x| x.as_f64())
            .collect::<Option<Vec<f64>>>()
            .with_context(|| format!("{}: per_second_iops must be numbers", path.display()))?;
        (name, vals)
    } else {
        let mut vals = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let last = line.rsplit(',').next().unwrap_or("").trim();
            match last.parse::<f64>() {
                Ok(v) => vals.push(v),
                Err(_) if i == 0 => {} // header
                Err(_) => bail!("{}:{}: not a number: {last:?}", path.display(), i + 1),
            }
        }
        (stem, vals)
    };
    if per_second.is_empty() {
        bail!("{}: no samples", path.display());
    }
    if per_second.iter().any(|v| !v.is_finite() || *v < 0.0) {
        bail!("{}: samples must be non-negative numbers", path.display());
    }
    Ok(Samples { name, per_second })
}

/// The "X or better" chart of several runs: for each IOPS level, how many
/// seconds reached at least that level (a percentage when the runs differ
/// in length).
pub fn x_or_better_chart(runs: &[Samples], title: &str) -> String {
    let same_len = runs
        .windows(2)
        .all(|w| w[0].per_second.len() == w[1].per_second.len());
    let series = runs
        .iter()
        .map(|r| {
            let curve = x_or_better(&r.per_second);
            let total = r.per_second.len() as f64;
            let y = |c: usize| {
                if same_len {
                    c as f64
                } else {
                    100.0 * c as f64 / total
                }
            };
            let mut pts = Vec::with_capacity(curve.len() * 2 + 2);
            if let Some(&(_, c0)) = curve.first() {
                pts.push((0.0, y(c0)));
            }
            for (i, &(x, c)) in curve.iter().enumerate() {
                pts.push((x, y(c)));
                let next = curve.get(i + 1).map(|&(_, c)| c).unwrap_or(0);
                pts.push((x, y(next)));
            }
            Series {
                name: format!(
                    "{} (mean {:.0})",
                    r.name,
                    SeriesSummary::of(&r.per_second).mean
                ),
                points: pts,
            }
        })
        .collect();
    LineChart {
        title: title.to_string(),
        x_label: "IOPS (per second)".into(),
        y_label: if same_len {
            "seconds with at least this many IOPS".into()
        } else {
            "% of seconds with at least this many IOPS".into()
        },
        series,
    }
    .render()
}

/// Output format of the samples file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Csv,
    Json,
}

/// Writes the samples and the chart into `dir`; returns the paths written.
pub fn save(r: &RunRecord, dir: &Path, format: Format) -> anyhow::Result<Vec<PathBuf>> {
    let stem = format!(
        "{}-{}-{}",
        util::sanitize_label(&r.name),
        r.rw.as_str(),
        util::stamp(util::unix_now())
    );
    let mut out = Vec::new();
    let data = match format {
        Format::Json => {
            let p = util::unique_path(dir, &stem, "json");
            util::write_file(&p, serde_json::to_string_pretty(r)?.as_bytes())?;
            p
        }
        Format::Csv => {
            let p = util::unique_path(dir, &stem, "csv");
            util::write_file(&p, to_csv(r).as_bytes())?;
            p
        }
    };
    out.push(data);
    let chart = x_or_better_chart(
        &[Samples {
            name: r.name.clone(),
            per_second: r.per_second_iops.iter().map(|&v| v as f64).collect(),
        }],
        &format!(
            "{} {} x{} ({}): seconds at X IOPS or better",
            r.name,
            r.rw.as_str(),
            r.workers,
            util::fmt_bytes(r.block_size)
        ),
    );
    let p = util::unique_path(dir, &stem, "svg");
    util::write_file(&p, chart.as_bytes())?;
    out.push(p);
    Ok(out)
}

/// The human summary of a run.
pub fn summary_text(r: &RunRecord) -> String {
    let s = &r.iops;
    let l = &r.latency;
    let mut t = format!(
        "target     {} ({}, {} workers, {} blocks, region {}{})\n\
         duration   {} s, {} operations, {:.1} MB/s\n\
         IOPS       mean {:.0}  median {:.0}  p1 {:.0}  p5 {:.0}  p95 {:.0}  p99 {:.0}  min {:.0}  max {:.0}\n\
         steadiness stddev {:.0}  coefficient of variation {:.3}\n\
         latency    mean {}  p50 {}  p90 {}  p95 {}  p99 {}  p99.9 {}  max {}\n",
        r.target,
        r.rw.as_str(),
        r.workers,
        util::fmt_bytes(r.block_size),
        util::fmt_bytes(r.region_bytes),
        if r.direct { ", O_DIRECT" } else { "" },
        r.duration_s,
        r.total_ops,
        r.mb_per_s,
        s.mean,
        s.median,
        s.p1,
        s.p5,
        s.p95,
        s.p99,
        s.min,
        s.max,
        s.stddev,
        s.cv,
        util::fmt_ns(l.mean_ns),
        util::fmt_ns(l.p50_ns as f64),
        util::fmt_ns(l.p90_ns as f64),
        util::fmt_ns(l.p95_ns as f64),
        util::fmt_ns(l.p99_ns as f64),
        util::fmt_ns(l.p999_ns as f64),
        util::fmt_ns(l.max_ns as f64),
    );
    for (what, l) in [("read", &r.read_latency), ("write", &r.write_latency)] {
        if let Some(l) = l {
            t.push_str(&format!(
                "  {what:<8} {} ops  p50 {}  p99 {}  max {}\n",
                l.count,
                util::fmt_ns(l.p50_ns as f64),
                util::fmt_ns(l.p99_ns as f64),
                util::fmt_ns(l.max_ns as f64)
            ));
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(rw: Rw) -> IopsConfig {
        IopsConfig {
            workers: 2,
            duration: Duration::from_secs(1),
            rw,
            read_percent: 50,
            block_size: 4096,
            region: None,
            force: false,
            direct: false,
            progress: false,
        }
    }

    #[test]
    fn iops_against_mock_nbd_uses_fua() {
        let srv = crate::nbd_client::mock::MockServer::start("bench", 4 << 20).unwrap();
        let spec = TargetSpec::parse(&srv.uri()).unwrap();
        let prep = spec
            .prepare(Some(1 << 20), true, false, false, 4096)
            .unwrap();
        let r = run(&spec, &cfg(Rw::Randrw), prep.region, "mock").unwrap();
        assert_eq!(r.per_second_iops.len(), 1);
        assert!(r.total_ops > 0);
        assert_eq!(r.latency.count, r.total_ops);
        let rl = r.read_latency.as_ref().unwrap();
        let wl = r.write_latency.as_ref().unwrap();
        assert_eq!(rl.count + wl.count, r.total_ops);
        let log = srv.requests.lock().unwrap();
        assert!(
            log.iter().any(|&(cmd, fl)| cmd == 1 && fl & 1 == 1),
            "writes carry FUA"
        );
        assert!(srv.data.lock().unwrap()[..1 << 20].iter().any(|&b| b != 0));
        assert!(
            srv.data.lock().unwrap()[1 << 20..].iter().all(|&b| b == 0),
            "stays in region"
        );
    }

    #[test]
    fn loads_csv_and_json_samples() {
        let dir = tempfile::tempdir().unwrap();
        let c = dir.path().join("a.csv");
        std::fs::write(&c, "second,iops\n0,10\n1,20\n").unwrap();
        let s = load_samples(&c).unwrap();
        assert_eq!(
            (s.name.as_str(), s.per_second.clone()),
            ("a", vec![10.0, 20.0])
        );
        let j = dir.path().join("b.json");
        std::fs::write(&j, r#"{"name":"prov","per_second_iops":[1,2,3]}"#).unwrap();
        assert_eq!(load_samples(&j).unwrap().name, "prov");
        std::fs::write(&j, "[5, 6]").unwrap();
        assert_eq!(load_samples(&j).unwrap().per_second, vec![5.0, 6.0]);
        std::fs::write(&j, r#"{"x":1}"#).unwrap();
        assert!(load_samples(&j).is_err());
        std::fs::write(&c, "second,iops\n0,-1\n").unwrap();
        assert!(load_samples(&c).is_err());
    }
}

//! The `cistern bench` subcommands. The binary embeds them as
//! `Bench { #[command(subcommand)] cmd: bench::cli::BenchCommand }` and
//! calls [`run`].

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Subcommand;

use crate::compress::{self, CompressConfig, Corpus, ScratchPool};
use crate::iops::{self, Format, IopsConfig, Rw};
use crate::latency::{self, LatencyConfig};
use crate::list::{self, ListConfig};
use crate::provision::{self, Params};
use crate::s3_client::S3Options;
use crate::target::TargetSpec;
use crate::{interrupt, util};

/// Measure and size storage: IOPS, latency, nodes needed, compression.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Random synchronous I/O for a fixed time: IOPS in every second, every
    /// latency, and the "X or better" chart.
    Iops(IopsArgs),
    /// Draw several saved runs on one "X or better" chart.
    Chart(ChartArgs),
    /// How many nodes reach a target IOPS, from saved runs (one per provider).
    Provision(ProvisionArgs),
    /// Request-reply round trips on one connection: requests/s and latency.
    Latency(LatencyArgs),
    /// Full listings of an S3 bucket of N objects (put first if missing).
    List(ListArgs),
    /// Which compression setting is worth it on a directory of your data.
    Compress(CompressArgs),
}

#[derive(Debug, clap::Args)]
pub struct IopsArgs {
    /// A file (created and removed if missing), a block device,
    /// nbd://host[:port]/export, nbd+unix:///export?socket=PATH, or
    /// s3://bucket[/prefix] (a write PUTs a new object, a read GETs one of --objects).
    pub target: String,
    /// Worker threads, each with its own file descriptor or connection.
    #[arg(short, long, default_value_t = 8)]
    pub workers: usize,
    /// How long to run, e.g. 30s, 2m.
    #[arg(short, long, default_value = "30s", value_parser = util::parse_duration)]
    pub duration: Duration,
    /// I/O pattern.
    #[arg(long, value_enum, default_value_t = Rw::Randwrite)]
    pub rw: Rw,
    /// Share of reads for --rw randrw, in percent.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub read_percent: u8,
    /// Bytes per operation, e.g. 4K.
    #[arg(short, long, default_value = "4K", value_parser = util::parse_size)]
    pub block_size: u64,
    /// Bytes of the target to use from offset 0 [default: min(target size, 1G);
    /// the size of a file the bench creates].
    #[arg(long, value_parser = util::parse_size, conflicts_with = "objects")]
    pub size: Option<u64>,
    /// s3:// only: keys reads pick from [default: 1000] (read runs put the
    /// missing ones first); writes PUT new keys from 0 up.
    #[arg(long)]
    pub objects: Option<u64>,
    /// s3:// only: create the bucket if it does not exist.
    #[arg(long)]
    pub create_bucket: bool,
    #[command(flatten)]
    pub s3: S3Options,
    /// Directory for the samples and the chart [default: current directory].
    #[arg(short, long)]
    pub out: Option<PathBuf>,
    /// Label of this run (provider, machine type) [default: from the target].
    #[arg(long)]
    pub name: Option<String>,
    /// Write even though the target holds data (it will be overwritten).
    #[arg(long)]
    pub force: bool,
    /// Format of the samples file.
    #[arg(long, value_enum, default_value_t = Format::Json)]
    pub format: Format,
    /// Open files and devices with O_DIRECT (bypass the page cache).
    #[arg(long)]
    pub direct: bool,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

#[derive(Debug, clap::Args)]
pub struct ChartArgs {
    /// Saved runs (JSON or CSV from `bench iops`).
    #[arg(required = true)]
    pub runs: Vec<PathBuf>,
    /// The SVG file to write [default: ./iops-chart.svg, never overwriting].
    #[arg(short, long)]
    pub out: Option<PathBuf>,
    /// Chart title.
    #[arg(long, default_value = "Seconds at X IOPS or better")]
    pub title: String,
}

#[derive(Debug, clap::Args)]
pub struct ProvisionArgs {
    /// IOPS the cluster must deliver in a second.
    #[arg(long)]
    pub target_iops: f64,
    /// Probability that a second reaches the target.
    #[arg(long, default_value_t = 0.99)]
    pub confidence: f64,
    /// Seed of the Monte Carlo draws (same seed, same answer).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Monte Carlo sums per node count tried.
    #[arg(long, default_value_t = 100_000)]
    pub trials: u64,
    /// Buckets of the exact enumeration.
    #[arg(long, default_value_t = 200)]
    pub buckets: usize,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Saved runs (JSON or CSV from `bench iops`), one per provider or machine type.
    #[arg(required = true)]
    pub samples: Vec<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct LatencyArgs {
    /// A file or block device (read only), nbd://host[:port]/export, or
    /// s3://bucket[/prefix] (HEADs of a probe object, put and removed by the run).
    pub target: String,
    /// Measured requests.
    #[arg(short = 'n', long = "requests", default_value_t = 5000)]
    pub requests: u64,
    /// Requests sent first and not measured.
    #[arg(long, default_value_t = 100)]
    pub warmup: u64,
    /// Bytes read per request (s3://: the size of the probe object).
    #[arg(long, default_value = "512", value_parser = util::parse_size)]
    pub size: u64,
    /// Open files and devices with O_DIRECT.
    #[arg(long)]
    pub direct: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// s3:// only: create the bucket if it does not exist.
    #[arg(long)]
    pub create_bucket: bool,
    #[command(flatten)]
    pub s3: S3Options,
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// s3://bucket[/prefix]: the objects listed are PREFIX + 0000000000...
    pub target: String,
    /// Objects the bucket (prefix) holds; missing ones are put first.
    #[arg(short = 'n', long, default_value_t = 10_000)]
    pub objects: u64,
    /// Size of the objects put.
    #[arg(long, default_value = "0", value_parser = util::parse_size)]
    pub object_size: u64,
    /// Clients putting the missing objects in parallel.
    #[arg(short, long, default_value_t = 16)]
    pub workers: usize,
    /// Measured full listings (after one unmeasured).
    #[arg(short, long, default_value_t = 5)]
    pub repeat: u32,
    /// Keys per ListObjectsV2 page (max-keys).
    #[arg(long, default_value_t = 1000)]
    pub page_size: u32,
    /// Create the bucket if it does not exist.
    #[arg(long)]
    pub create_bucket: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub s3: S3Options,
}

#[derive(Debug, clap::Args)]
pub struct CompressArgs {
    /// Directory whose files make the corpus (read recursively, concatenated).
    pub dir: PathBuf,
    /// Settings to try, e.g. off,lz4,zstd-1,zstd-3,gzip-1..9
    /// [default: off, lz4, zstd-1,3,9,19, gzip-1..9].
    #[arg(long)]
    pub levels: Option<String>,
    /// Parallel writer counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub writers: Vec<usize>,
    /// Repetitions of every measurement (10%-trimmed mean).
    #[arg(short, long, default_value_t = 5)]
    pub repeat: usize,
    /// volblocksize of the scratch volumes, the records the corpus is cut
    /// into (a power of two from 4K to 128K).
    #[arg(long, alias = "volblocksize", default_value = "128K", value_parser = util::parse_size)]
    pub record_size: u64,
    /// Largest corpus; above it a seeded random choice of files is taken.
    #[arg(long, default_value = "16M", value_parser = util::parse_size)]
    pub max_bytes: u64,
    /// Time the corpus may take, for "best ratio within budget", e.g. 500ms
    /// [default: 3x the time of the most efficient setting].
    #[arg(long, value_parser = util::parse_duration)]
    pub time_budget: Option<Duration>,
    /// Directory for the results and the chart [default: current directory].
    #[arg(short, long)]
    pub out: Option<PathBuf>,
    /// Where the scratch pool (a sparse file of max(256M, 4x the corpus)) is
    /// created, in a temporary directory removed afterwards; its file system
    /// is the one measured [default: --out if given, else the system temp directory].
    #[arg(long)]
    pub scratch: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// Copy the tree file by file into scratch filesystem datasets
    /// (recordsize = --record-size) instead of one volume: the seed's cpio
    /// method, writers taking files from opposite ends of the list.
    #[arg(long)]
    pub filesystem: bool,
}

/// `cistern bench` as a struct, for embedding as `Bench(bench::cli::Args)`
/// (the other form is `Bench { #[command(subcommand)] cmd: BenchCommand }`).
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub cmd: BenchCommand,
}

impl From<Args> for BenchCommand {
    fn from(a: Args) -> Self {
        a.cmd
    }
}

/// Runs one `cistern bench` subcommand (a [`BenchCommand`] or an [`Args`]).
pub fn run(cmd: impl Into<BenchCommand>) -> anyhow::Result<()> {
    match cmd.into() {
        BenchCommand::Iops(a) => run_iops(a),
        BenchCommand::Chart(a) => run_chart(a),
        BenchCommand::Provision(a) => run_provision(a),
        BenchCommand::Latency(a) => run_latency(a),
        BenchCommand::List(a) => run_list(a),
        BenchCommand::Compress(a) => run_compress(a),
    }
}

fn print_paths(paths: &[PathBuf]) {
    for (i, p) in paths.iter().enumerate() {
        println!(
            "{} {}",
            if i == 0 { "wrote     " } else { "          " },
            p.display()
        );
    }
}

/// Creates an s3:// target's bucket when asked to.
fn create_bucket(spec: &TargetSpec, create: bool) -> anyhow::Result<()> {
    match spec {
        TargetSpec::S3(t) if create => Ok(t.client().create_bucket(&t.bucket)?),
        TargetSpec::S3(_) => Ok(()),
        _ if create => bail!("--create-bucket is for s3:// targets"),
        _ => Ok(()),
    }
}

fn run_iops(a: IopsArgs) -> anyhow::Result<()> {
    let spec = TargetSpec::parse_with(&a.target, &a.s3)?;
    create_bucket(&spec, a.create_bucket)?;
    let region = match (&spec, a.objects) {
        (TargetSpec::S3(_), Some(n)) => Some(n.saturating_mul(a.block_size)),
        (_, Some(_)) => bail!("--objects is for s3:// targets (use --size)"),
        _ => a.size,
    };
    let dir = util::out_dir(a.out.as_deref())?;
    let name = a.name.clone().unwrap_or_else(|| spec.label());
    let cfg = IopsConfig {
        workers: a.workers,
        duration: a.duration,
        rw: a.rw,
        read_percent: a.read_percent,
        block_size: a.block_size,
        region,
        force: a.force,
        direct: a.direct,
        progress: !a.no_progress,
    };
    let _sigint = interrupt::Guard::install();
    let prep = spec.prepare(
        cfg.region,
        cfg.rw.writes(),
        cfg.rw.reads(),
        cfg.force,
        cfg.block_size,
    )?;
    for n in &prep.notes {
        eprintln!("note: {n}");
    }
    let rec = iops::run(&spec, &cfg, prep.region, &name);
    prep.finish()?; // remove what was created, even if the run failed
    let rec = rec?;
    let paths = iops::save(&rec, &dir, a.format)?;
    print!("{}", iops::summary_text(&rec));
    print_paths(&paths);
    Ok(())
}

fn run_chart(a: ChartArgs) -> anyhow::Result<()> {
    let runs = a
        .runs
        .iter()
        .map(|p| iops::load_samples(p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let svg = iops::x_or_better_chart(&runs, &a.title);
    let path = match a.out {
        Some(p) => {
            if let Some(parent) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("creating {}", parent.display()))?;
            }
            p
        }
        None => util::unique_path(&util::out_dir(None)?, "iops-chart", "svg"),
    };
    util::write_file(&path, svg.as_bytes())?;
    print_paths(&[path]);
    Ok(())
}

fn pct(c: f64) -> String {
    let s = format!("{:.3}", c * 100.0);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}%")
}

/// The provision table (also used by the tests).
pub fn provision_table(ests: &[provision::Estimate], p: &Params) -> String {
    let c = pct(p.confidence);
    let headers = [
        "provider".to_string(),
        "seconds".into(),
        "best case".into(),
        format!("{c} (MC)"),
        format!("{c} (exact)"),
        "all-dip bound".into(),
        format!("ratio {c}/best"),
    ];
    let mut rows: Vec<[String; 7]> = Vec::new();
    for e in ests {
        let cell = |r: &Result<(u64, f64), String>| match r {
            Ok((n, _)) => n.to_string(),
            Err(_) => "n/a".into(),
        };
        rows.push([
            e.name.clone(),
            e.seconds.to_string(),
            e.best_case.to_string(),
            cell(&e.monte_carlo),
            cell(&e.exact),
            e.all_dip
                .map(|n| n.to_string())
                .unwrap_or_else(|| "none".into()),
            e.ratio()
                .map(|r| format!("{r:.2}"))
                .unwrap_or_else(|| "n/a".into()),
        ]);
    }
    let mut w = headers.clone().map(|h| h.chars().count());
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: &[String; 7]| -> String {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i == 0 {
                    format!("{c:<width$}", width = w[i])
                } else {
                    format!("{c:>width$}", width = w[i])
                }
            })
            .collect();
        parts.join(" | ")
    };
    let mut t = String::new();
    t += &format!(
        "Nodes for {:.0} IOPS in a second with {c} confidence\n\n",
        p.target
    );
    t += &line(&headers);
    t += "\n";
    t += &w
        .iter()
        .map(|n| "-".repeat(*n))
        .collect::<Vec<_>>()
        .join("-|-");
    t += "\n";
    for r in &rows {
        t += &line(r);
        t += "\n";
    }
    t += "\n";
    for e in ests {
        t += &format!(
            "{}: best second {:.0} IOPS; one node reaches {:.0} IOPS or more in {c} of seconds",
            e.name, e.max_iops, e.level_at_confidence
        );
        if let (Ok((m, pm)), Ok((x, px))) = (&e.monte_carlo, &e.exact) {
            t += &format!("; P(target) at the chosen n: {pm:.4} (MC), {px:.4} (exact)");
            if m.abs_diff(*x) > 1 {
                t += &format!("\n  WARNING: Monte Carlo ({m}) and exact ({x}) differ by more than one node: raise --trials or --buckets");
            }
        }
        let needed = (1.0 / (1.0 - p.confidence)).ceil() as usize;
        if e.seconds < needed {
            t += &format!(
                "\n  note: only {} seconds measured; at least {needed} are needed to see a {} tail (run longer)",
                e.seconds,
                pct(1.0 - p.confidence)
            );
        }
        for (what, r) in [("Monte Carlo", &e.monte_carlo), ("exact", &e.exact)] {
            if let Err(msg) = r {
                t += &format!("\n  {what}: {msg}");
            }
        }
        t += "\n";
    }
    t += &format!(
        "\nMethods: Monte Carlo runs {} trials per node count n, each the sum of n draws (with replacement) of the \
         per-second samples (seed {}); exact convolves the samples put into {} equal-width buckets, each counted at \
         its lower edge (conservative).\n\
         Assumption: nodes are independent, each second of each node an independent draw from its run's per-second \
         distribution. Slowness with a shared cause (network, neighbours, time of day) breaks it; then the answer lies \
         towards the all-dip bound, which assumes every node dips at once.\n",
        p.trials, p.seed, p.buckets
    );
    t
}

fn run_provision(a: ProvisionArgs) -> anyhow::Result<()> {
    if !(a.target_iops.is_finite() && a.target_iops > 0.0) {
        bail!("--target-iops must be positive");
    }
    if !(a.confidence > 0.0 && a.confidence < 1.0) {
        bail!("--confidence must be between 0 and 1 (exclusive), e.g. 0.99");
    }
    if a.trials == 0 || a.buckets == 0 {
        bail!("--trials and --buckets must be at least 1");
    }
    let p = Params {
        target: a.target_iops,
        confidence: a.confidence,
        seed: a.seed,
        trials: a.trials,
        buckets: a.buckets,
    };
    let mut ests = Vec::new();
    for path in &a.samples {
        let s = iops::load_samples(path)?;
        ests.push(
            provision::estimate(&s.name, &s.per_second, &p)
                .with_context(|| format!("{}", path.display()))?,
        );
    }
    if a.json {
        let v = serde_json::json!({
            "target_iops": p.target,
            "confidence": p.confidence,
            "seed": p.seed,
            "trials": p.trials,
            "buckets": p.buckets,
            "assumption": "nodes are independent: each node's IOPS in a second is an independent draw from its run's per-second distribution",
            "estimates": ests,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", provision_table(&ests, &p));
    }
    Ok(())
}

fn run_list(a: ListArgs) -> anyhow::Result<()> {
    let TargetSpec::S3(t) = TargetSpec::parse_with(&a.target, &a.s3)? else {
        bail!(
            "{}: bench list needs an s3://bucket[/prefix] target",
            a.target
        );
    };
    if a.create_bucket {
        t.client().create_bucket(&t.bucket)?;
    }
    let cfg = ListConfig {
        objects: a.objects,
        object_size: a.object_size,
        workers: a.workers.clamp(1, 1024),
        repeat: a.repeat,
        page_size: a.page_size,
    };
    let _sigint = interrupt::Guard::install();
    let r = list::run(&t, &cfg)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", list::summary_text(&r));
    }
    Ok(())
}

fn run_latency(a: LatencyArgs) -> anyhow::Result<()> {
    let spec = TargetSpec::parse_with(&a.target, &a.s3)?;
    create_bucket(&spec, a.create_bucket)?;
    let cfg = LatencyConfig {
        requests: a.requests,
        warmup: a.warmup,
        size: usize::try_from(a.size).context("--size")?,
        direct: a.direct,
    };
    let r = latency::run(&spec, &cfg)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", latency::summary_text(&r));
    }
    Ok(())
}

fn run_compress(a: CompressArgs) -> anyhow::Result<()> {
    let settings = match &a.levels {
        Some(l) => compress::parse_settings(l)?,
        None => compress::default_settings(),
    };
    let block_size = compress::check_block_size(a.record_size)?;
    let mut writers = a.writers.clone();
    writers.dedup();
    let dir = util::out_dir(a.out.as_deref())?;
    let tree = if a.filesystem {
        Some(compress::FileTree::load(&a.dir, a.max_bytes)?)
    } else {
        None
    };
    let corpus = match &tree {
        Some(t) => {
            let files: Vec<Vec<u8>> = t.files.iter().map(|(_, d)| d.clone()).collect();
            let mut c = Corpus::from_files(&files, block_size as usize);
            c.skipped_bytes = t.skipped_bytes;
            c
        }
        None => Corpus::load(&a.dir, block_size as usize, a.max_bytes)?,
    };
    eprintln!(
        "corpus: {} in {} files, {} records of {}{}",
        util::fmt_bytes(corpus.bytes),
        corpus.files,
        corpus.records.len(),
        util::fmt_bytes(block_size as u64),
        if corpus.skipped_bytes > 0 {
            format!(
                " ({} more left out: --max-bytes)",
                util::fmt_bytes(corpus.skipped_bytes)
            )
        } else {
            String::new()
        }
    );
    let cfg = CompressConfig {
        settings,
        writers: writers.clone(),
        repeat: a.repeat,
    };
    let _sigint = interrupt::Guard::install();
    let scratch_parent = match (&a.scratch, &a.out) {
        (Some(s), _) => s.clone(),
        (None, Some(_)) => dir.clone(),
        (None, None) => std::env::temp_dir(),
    };
    let pool = ScratchPool::create(&scratch_parent, corpus.bytes, block_size)?;
    eprintln!(
        "scratch pool: {} ({} sparse file; removed at the end)",
        pool.path().display(),
        util::fmt_bytes(pool.size())
    );
    let bar = if a.no_progress {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr())
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} (eta {eta})",
    ) {
        bar.set_style(style);
    }
    let progress = |done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    };
    let rows = match &tree {
        Some(t) => compress::measure_fs(t, &cfg, &pool, progress),
        None => compress::measure(&corpus, &cfg, &pool, progress),
    };
    bar.finish_and_clear();
    let pool_size = pool.size();
    drop(pool); // the scratch pool goes whether or not the runs succeeded
    let rows = rows?;
    let recs: Vec<_> = writers
        .iter()
        .filter_map(|w| compress::recommend(&rows, *w, a.time_budget))
        .collect();

    let stamp = util::stamp(util::unix_now());
    let json_path = util::unique_path(&dir, &format!("compress-{stamp}"), "json");
    let v = serde_json::json!({
        "format": "cistern-bench-compress/2",
        "dir": a.dir.display().to_string(),
        "corpus_bytes": corpus.bytes,
        "corpus_files": corpus.files,
        "records": corpus.records.len(),
        "volblocksize": block_size,
        "filesystem": a.filesystem,
        "repeat": a.repeat,
        "scratch_pool_bytes": pool_size,
        "measured": "the corpus written through dataset::Engine into a new scratch volume per run \
                     (Volume::write by each writer thread, then Engine::sync_all: compress, checksum, \
                     place, write, fsync, metadata commit); time from the first write to the end of the \
                     commit; logical/physical are the volume's logicalused/used, compressratio its property",
        "rows": rows,
        "recommendations": recs,
    });
    util::write_file(&json_path, serde_json::to_string_pretty(&v)?.as_bytes())?;
    let svg_path = util::unique_path(&dir, &format!("compress-{stamp}"), "svg");
    util::write_file(&svg_path, compress::chart(&rows, &writers).as_bytes())?;

    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", compress::table(&rows))?;
    for r in &recs {
        writeln!(
            out,
            "{} writer{}: most efficient (ratio/time, of those that compress) {}; best ratio within {:.3} s{}: {}",
            r.writers,
            if r.writers == 1 { "" } else { "s" },
            r.best_efficiency,
            r.time_budget_s,
            if r.budget_derived {
                " (3x the most efficient; set --time-budget)"
            } else {
                ""
            },
            r.best_ratio_within_budget.as_deref().unwrap_or("none fits")
        )?;
    }
    if a.filesystem {
        writeln!(
            out,
            "Measured: the tree copied file by file (create + write through the POSIX layer) into a \
             scratch filesystem (recordsize {}) and committed in a txg, per setting, writer count and \
             repetition; writers take files from opposite ends of the list; ratio = the engine's \
             compressratio (logicalused / used).",
            util::fmt_bytes(block_size as u64)
        )?;
    } else {
        writeln!(
        out,
        "Measured: the corpus written into a scratch volume (volblocksize {}) and committed in a txg \
         (compress, checksum, write, fsync, metadata), per setting, writer count and repetition; \
         ratio = the engine's compressratio (logicalused / used). The commit compresses with up to \
         min(cores, 8) threads whatever the writer count; writers parallelize the copy into the open txg.",
        util::fmt_bytes(block_size as u64)
    )?;
    }
    drop(out);
    print_paths(&[json_path, svg_path]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Top {
        #[command(subcommand)]
        cmd: BenchCommand,
    }

    #[test]
    fn cli_parses() {
        <Top as clap::CommandFactory>::command().debug_assert();
        let t = Top::try_parse_from([
            "bench",
            "iops",
            "/tmp/x",
            "--workers",
            "4",
            "--duration",
            "2s",
            "--rw",
            "randrw",
            "--block-size",
            "8K",
            "--size",
            "64M",
            "--format",
            "csv",
            "--force",
        ])
        .unwrap();
        match t.cmd {
            BenchCommand::Iops(a) => {
                assert_eq!(a.workers, 4);
                assert_eq!(a.duration, Duration::from_secs(2));
                assert_eq!(a.block_size, 8192);
                assert_eq!(a.size, Some(64 << 20));
                assert_eq!(a.format, Format::Csv);
            }
            other => panic!("{other:?}"),
        }
        let t = Top::try_parse_from([
            "bench",
            "provision",
            "--target-iops",
            "100000",
            "a.json",
            "b.csv",
        ])
        .unwrap();
        assert!(
            matches!(t.cmd, BenchCommand::Provision(ref p) if p.samples.len() == 2 && p.confidence == 0.99)
        );
        let t = Top::try_parse_from(["bench", "compress", "/d", "--writers", "1,4"]).unwrap();
        assert!(matches!(t.cmd, BenchCommand::Compress(ref c) if c.writers == vec![1, 4]));
        let t = Top::try_parse_from([
            "bench",
            "compress",
            "/d",
            "--volblocksize",
            "16K",
            "--scratch",
            "/s",
        ])
        .unwrap();
        assert!(
            matches!(t.cmd, BenchCommand::Compress(ref c) if c.record_size == 16384 && c.scratch.as_deref() == Some(std::path::Path::new("/s")))
        );
        let t = Top::try_parse_from(["bench", "latency", "nbd://h/x", "-n", "100"]).unwrap();
        assert!(
            matches!(t.cmd, BenchCommand::Latency(ref l) if l.requests == 100 && l.warmup == 100)
        );
        assert!(Top::try_parse_from(["bench", "chart"]).is_err());
    }

    /// Both ways the binary may embed the subcommands, next to a global flag.
    #[test]
    fn embeds_in_a_parent_cli() {
        #[derive(Debug, Parser)]
        struct Parent {
            #[arg(long, global = true)]
            api: Option<String>,
            #[command(subcommand)]
            command: ParentCommand,
        }
        #[derive(Debug, Subcommand)]
        enum ParentCommand {
            Bench(Args),
            Bench2 {
                #[command(subcommand)]
                cmd: BenchCommand,
            },
        }
        <Parent as clap::CommandFactory>::command().debug_assert();
        let p = Parent::try_parse_from(["cistern", "bench", "latency", "nbd://h/x", "--api", "u"])
            .unwrap();
        assert_eq!(p.api.as_deref(), Some("u"));
        match p.command {
            ParentCommand::Bench(a) => {
                assert!(matches!(BenchCommand::from(a), BenchCommand::Latency(_)))
            }
            other => panic!("{other:?}"),
        }
        let p = Parent::try_parse_from(["cistern", "bench2", "compress", "/d"]).unwrap();
        assert!(matches!(
            p.command,
            ParentCommand::Bench2 {
                cmd: BenchCommand::Compress(_)
            }
        ));
    }

    #[test]
    fn table_states_the_assumption() {
        let p = Params {
            target: 100_000.0,
            confidence: 0.99,
            seed: 1,
            trials: 2000,
            buckets: 50,
        };
        let e = provision::estimate("steady", &[12_000.0; 20], &p).unwrap();
        let t = provision_table(&[e], &p);
        assert!(t.contains("independent"), "{t}");
        assert!(t.contains("99% (MC)") && t.contains("all-dip bound"), "{t}");
        assert!(t.contains("steady"));
        let row = t.lines().find(|l| l.starts_with("steady")).unwrap();
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        assert_eq!(cells, ["steady", "20", "9", "9", "9", "9", "1.00"]);
    }
}

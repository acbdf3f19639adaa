//! `cistern pool plan`: which layout for N drives, before buying them. The
//! model is `bench::plan`; this is its command line and its table. It needs
//! no daemon.

use crate::cmd::{size_arg, split_list, OutputFlags};
use crate::format::{human_size, Table};
use crate::output::{json, out};
use anyhow::{bail, Context, Result};
use bench::measure::{DriveMeasurement, MeasureConfig};
use bench::plan::{self, Drive, Layout, Plan, Request, SortKey};
use clap::Args;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Drives to buy, spares included.
    #[arg(short = 'n', long = "drives", value_name = "N")]
    pub drives: u32,
    /// Size of one drive as sold: 8TB = 8x10^12 bytes; 8TiB or 8T = 8x2^40
    /// (as zfs reads T) [default with --measure: the size of DEV].
    #[arg(long, value_name = "SIZE", value_parser = drive_size_arg)]
    pub size: Option<u64>,
    /// Random small-block operations per second of one drive, reads and writes.
    #[arg(long, value_name = "N")]
    pub iops: Option<f64>,
    /// Random reads per second of one drive (instead of --iops or the measurement).
    #[arg(long, value_name = "N")]
    pub read_iops: Option<f64>,
    /// Random synchronous writes per second of one drive.
    #[arg(long, value_name = "N")]
    pub write_iops: Option<f64>,
    /// Streaming MB/s (10^6 bytes) of one drive, reads and writes.
    #[arg(long, value_name = "MB/S")]
    pub mbps: Option<f64>,
    /// Streaming read MB/s of one drive.
    #[arg(long, value_name = "MB/S")]
    pub read_mbps: Option<f64>,
    /// Streaming write MB/s of one drive.
    #[arg(long, value_name = "MB/S")]
    pub write_mbps: Option<f64>,
    /// Measure one drive (or file): random 4K reads and 1M sequential reads
    /// over all of it; with --force also random synchronous writes and
    /// sequential writes, which overwrite what it holds.
    #[arg(long, value_name = "DEV")]
    pub measure: Option<String>,
    /// With --measure: measure writes too, overwriting DEV.
    #[arg(long, requires = "measure")]
    pub force: bool,
    /// With --measure: time of each measurement, e.g. 10s [default: 5s].
    #[arg(long, requires = "measure", value_parser = bench::util::parse_duration)]
    pub duration: Option<Duration>,
    /// With --measure: threads doing random I/O [default: 8].
    #[arg(long, requires = "measure", value_name = "N")]
    pub workers: Option<usize>,
    /// With --measure: open DEV with O_DIRECT (bypass the page cache).
    #[arg(long, requires = "measure")]
    pub direct: bool,
    /// The volblocksize the capacity is computed for (raidz pads small blocks).
    #[arg(long, value_name = "SIZE", default_value = "16K", value_parser = size_arg)]
    pub block_size: u64,
    /// Drives to leave out of the layout (kept as spares).
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub spares: u32,
    /// Layouts to consider: stripe,mirror2,mirror3,raidz1,raidz2,raidz3
    /// (mirror = mirror2, raidz = raidz1) [default: all].
    #[arg(long, value_name = "LIST")]
    pub layouts: Option<String>,
    /// Narrowest raidz group to consider.
    #[arg(long, value_name = "W")]
    pub min_width: Option<u32>,
    /// Widest raidz group to consider.
    #[arg(long, value_name = "W")]
    pub max_width: Option<u32>,
    /// Sort by: usable, eff, lose, lose-max, riops, wiops, rmbps, wmbps,
    /// groups, width (largest first) or layout [default: usable].
    #[arg(long, value_name = "KEY")]
    pub sort: Option<String>,
    /// Columns, comma-separated: layout, groups, width, drives, spares,
    /// usable, avail, eff, lose, lose-max, riops, wiops, rmbps, wmbps, note.
    #[arg(short = 'o', value_name = "COLS")]
    pub columns: Option<String>,
    #[command(flatten)]
    pub format: OutputFlags,
}

/// Column key and header, in the order `-o` lists them.
const COLUMNS: &[(&str, &str)] = &[
    ("layout", "LAYOUT"),
    ("groups", "GROUPS"),
    ("width", "WIDTH"),
    ("drives", "DRIVES"),
    ("spares", "SPARES"),
    ("usable", "USABLE"),
    ("avail", "AVAIL"),
    ("eff", "EFF"),
    ("lose", "LOSE"),
    ("lose-max", "LOSE-MAX"),
    ("riops", "R-IOPS"),
    ("wiops", "W-IOPS"),
    ("rmbps", "R-MB/S"),
    ("wmbps", "W-MB/S"),
    ("note", "NOTE"),
];

const DEFAULT_COLUMNS: &[&str] = &[
    "layout", "usable", "eff", "lose", "lose-max", "riops", "wiops", "rmbps", "wmbps", "note",
];

/// Where each per-drive figure came from: `given`, `measured` or
/// `assumed = read`.
#[derive(Debug, Clone, serde::Serialize)]
struct Sources {
    size: &'static str,
    read_iops: &'static str,
    write_iops: &'static str,
    read_mbps: &'static str,
    write_mbps: &'static str,
}

pub fn run(a: PlanArgs) -> Result<()> {
    let columns: Vec<&'static str> = match &a.columns {
        None => DEFAULT_COLUMNS.to_vec(),
        Some(s) => split_list(s)
            .iter()
            .map(|c| {
                COLUMNS
                    .iter()
                    .map(|(k, _)| *k)
                    .find(|k| k.eq_ignore_ascii_case(c))
                    .with_context(|| {
                        let keys: Vec<&str> = COLUMNS.iter().map(|(k, _)| *k).collect();
                        format!("unknown column '{c}' (valid: {})", keys.join(", "))
                    })
            })
            .collect::<Result<_>>()?,
    };
    let sort = match &a.sort {
        None => SortKey::Usable,
        Some(s) => SortKey::parse(s)
            .with_context(|| format!("unknown sort key '{s}' (valid: {})", SortKey::NAMES))?,
    };
    let families = match &a.layouts {
        None => Vec::new(),
        Some(s) => plan::parse_families(s)?,
    };
    for (flag, v) in [
        ("--iops", a.iops),
        ("--read-iops", a.read_iops),
        ("--write-iops", a.write_iops),
        ("--mbps", a.mbps),
        ("--read-mbps", a.read_mbps),
        ("--write-mbps", a.write_mbps),
    ] {
        if let Some(v) = v {
            if !(v.is_finite() && v > 0.0) {
                bail!("{flag} must be a positive number (got {v})");
            }
        }
    }
    // Check what needs no measurement first: a bad request fails at once.
    if a.drives == 0 {
        return Err(plan::PlanError::NoDrives(0).into());
    }
    let measured = match &a.measure {
        Some(dev) => Some(measure(dev, &a)?),
        None => None,
    };
    let m = measured.as_ref();
    let pick = |given: [Option<f64>; 2], meas: Option<f64>| match (given, meas) {
        ([Some(v), _], _) | ([None, Some(v)], _) => Some((v, "given")),
        (_, Some(v)) => Some((v, "measured")),
        _ => None,
    };
    let Some((read_iops, ri_src)) = pick([a.read_iops, a.iops], m.map(|m| m.random_read_iops))
    else {
        bail!("give the random IOPS of one drive (--iops N, or --read-iops and --write-iops) or --measure DEV");
    };
    let Some((read_mbps, rm_src)) = pick([a.read_mbps, a.mbps], m.map(|m| m.seq_read_mbps)) else {
        bail!("give the streaming MB/s of one drive (--mbps N, or --read-mbps and --write-mbps) or --measure DEV");
    };
    let (write_iops, wi_src) = pick([a.write_iops, a.iops], m.and_then(|m| m.random_write_iops))
        .unwrap_or((read_iops, "assumed = read"));
    let (write_mbps, wm_src) = pick([a.write_mbps, a.mbps], m.and_then(|m| m.seq_write_mbps))
        .unwrap_or((read_mbps, "assumed = read"));
    let (size, size_src) = match (a.size, m) {
        (Some(s), _) => (s, "given"),
        (None, Some(m)) if m.size < plan::MIN_DEVICE_SIZE => bail!(
            "{} has {} bytes, below the smallest device a pool takes (64M): give the drive size with --size",
            m.target,
            m.size
        ),
        (None, Some(m)) => (m.size, "measured"),
        (None, None) => bail!("--size is needed: the size of one drive, e.g. --size 8T"),
    };
    let sources = Sources {
        size: size_src,
        read_iops: ri_src,
        write_iops: wi_src,
        read_mbps: rm_src,
        write_mbps: wm_src,
    };
    let req = Request {
        drives: a.drives,
        spares: a.spares,
        drive: Drive {
            size,
            read_iops,
            write_iops,
            read_mbps,
            write_mbps,
        },
        block_size: a.block_size,
        families,
        min_width: a.min_width,
        max_width: a.max_width,
    };
    let mut p = plan::plan(&req)?;
    plan::sort(&mut p.layouts, sort);
    if a.format.json {
        let mut v = serde_json::to_value(&p)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("sources".into(), serde_json::to_value(&sources)?);
            o.insert("measured".into(), serde_json::to_value(&measured)?);
            o.insert("model".into(), serde_json::to_value(model_lines(&p))?);
        }
        return json(&v);
    }
    let mut text = plan_table(&p.layouts, &columns, a.format.parsable).render(a.format.scripted);
    if !a.format.scripted {
        text.push('\n');
        text.push_str(&footer(&p, &sources, m));
    }
    out(&text);
    Ok(())
}

fn measure(dev: &str, a: &PlanArgs) -> Result<DriveMeasurement> {
    let spec = bench::target::TargetSpec::parse(dev)?;
    let cfg = MeasureConfig {
        duration: a.duration.unwrap_or(Duration::from_secs(5)),
        workers: a.workers.unwrap_or(8),
        write: a.force,
        direct: a.direct,
        progress: true,
    };
    if cfg.workers == 0 {
        bail!("--workers must be at least 1");
    }
    let _sigint = bench::interrupt::Guard::install();
    let m = bench::measure::measure(&spec, &cfg).with_context(|| format!("measuring {dev}"))?;
    let mut s = format!(
        "measured {}: random 4K reads {:.0}/s, sequential reads {:.0} MB/s",
        m.target, m.random_read_iops, m.seq_read_mbps
    );
    if let (Some(w), Some(sw)) = (m.random_write_iops, m.seq_write_mbps) {
        s.push_str(&format!(
            ", random 4K writes {w:.0}/s, sequential writes {sw:.0} MB/s"
        ));
    } else {
        s.push_str(" (writes not measured: --force would overwrite it)");
    }
    eprintln!("{s}");
    for n in &m.notes {
        eprintln!("note: {n}");
    }
    Ok(m)
}

/// A rate: rounded, or with -p up to two decimals.
fn rate(v: f64, parsable: bool) -> String {
    if parsable {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        format!("{v:.0}")
    }
}

/// A drive size: decimal units the way drives are sold (`KB`, `MB`, `GB`,
/// `TB`, `PB`: powers of 1000), otherwise as every other size (`T`, `TiB`:
/// powers of 1024, as zfs).
pub fn drive_size_arg(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let decimal = [
        ("kb", 1e3),
        ("mb", 1e6),
        ("gb", 1e9),
        ("tb", 1e12),
        ("pb", 1e15),
    ]
    .into_iter()
    .find(|(suffix, _)| lower.ends_with(suffix));
    let Some((suffix, mult)) = decimal else {
        return size_arg(s);
    };
    let num = t[..t.len() - suffix.len()].trim();
    let v: f64 = num
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| {
            format!(
                "invalid size '{s}': expected a number before {}",
                &t[t.len() - suffix.len()..]
            )
        })?;
    let bytes = v * mult;
    if bytes > u64::MAX as f64 {
        return Err(format!("invalid size '{s}': too large"));
    }
    Ok(bytes.round() as u64)
}

/// Bytes the way drives are sold: three significant digits of decimal
/// units (`8.00TB`, `64.0TB`, `960GB`).
pub fn sold_size(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KB", "MB", "GB", "TB", "PB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 999.5 && i + 1 < UNITS.len() {
        v /= 1000.0;
        i += 1;
    }
    if i == 0 {
        return format!("{n}B");
    }
    let decimals = if v < 9.995 {
        2
    } else if v < 99.95 {
        1
    } else {
        0
    };
    format!("{v:.decimals$}{}", UNITS[i])
}

fn cell(l: &Layout, col: &str, parsable: bool) -> String {
    let size = |n: u64| {
        if parsable {
            n.to_string()
        } else {
            sold_size(n)
        }
    };
    match col {
        "layout" => l.name.clone(),
        "groups" => l.groups.to_string(),
        "width" => l.width.to_string(),
        "drives" => l.drives.to_string(),
        "spares" => l.spares.to_string(),
        "usable" => size(l.usable_bytes),
        "avail" => size(l.available_bytes),
        "eff" => {
            if parsable {
                rate(l.efficiency_pct, true)
            } else {
                format!("{:.0}%", l.efficiency_pct)
            }
        }
        "lose" => l.lose_any.to_string(),
        "lose-max" => l.lose_max.to_string(),
        "riops" => rate(l.random_read_iops, parsable),
        "wiops" => rate(l.random_write_iops, parsable),
        "rmbps" => rate(l.seq_read_mbps, parsable),
        "wmbps" => rate(l.seq_write_mbps, parsable),
        "note" => l.note.clone().unwrap_or_else(|| "-".into()),
        _ => "-".into(),
    }
}

/// The `pool plan` table.
pub fn plan_table(layouts: &[Layout], columns: &[&str], parsable: bool) -> Table {
    let headers: Vec<&str> = columns
        .iter()
        .map(|c| {
            COLUMNS
                .iter()
                .find(|(k, _)| k == c)
                .map(|(_, h)| *h)
                .unwrap_or("?")
        })
        .collect();
    let mut t = Table::new(&headers);
    for (i, c) in columns.iter().enumerate() {
        if !matches!(*c, "layout" | "note") {
            t.align_right(i);
        }
    }
    for l in layouts {
        t.push(columns.iter().map(|c| cell(l, c, parsable)).collect());
    }
    t
}

/// How to read the table: what the columns count and the speed model.
fn model_lines(p: &Plan) -> Vec<String> {
    let r = &p.regions;
    vec![
        format!(
            "USABLE: volume data in {} blocks (--block-size), uncompressed, after each drive's labels ({}), \
             metadata ({}) and intent-log ({}) regions; a raidz block takes whole rows of its group \
             (parity and padding). AVAIL (-o avail): all but the 1/32 the engine keeps free.",
            human_size(p.block_size),
            human_size(r.labels),
            human_size(r.metadata),
            human_size(r.intent_log),
        ),
        "EFF: USABLE / all drives bought. LOSE: drives that may fail, whichever they are; \
         LOSE-MAX: if they are spread over the groups."
            .to_string(),
        "Speed: a stripe scales with drives; mirrors read from every drive and write per group; \
         raidz does random I/O per group and streams over its data drives."
            .to_string(),
    ]
}

fn footer(p: &Plan, s: &Sources, m: Option<&DriveMeasurement>) -> String {
    let d = &p.drive;
    let spares = match p.spares {
        0 => "no spares".to_string(),
        1 => "1 spare".to_string(),
        n => format!("{n} spares"),
    };
    let src = |what: &'static str| {
        if what == "given" {
            String::new()
        } else {
            format!(" ({what})")
        }
    };
    let mut o = format!(
        "{} drives of {} ({}){}, {spares}; one drive: {:.0} random reads/s{}, {:.0} writes/s{}, {:.0} MB/s read{}, {:.0} MB/s write{}\n",
        p.drives,
        sold_size(d.size),
        human_size(d.size).replace('K', "KiB").replace('M', "MiB").replace('G', "GiB").replace('T', "TiB").replace('P', "PiB"),
        src(s.size),
        d.read_iops,
        src(s.read_iops),
        d.write_iops,
        src(s.write_iops),
        d.read_mbps,
        src(s.read_mbps),
        d.write_mbps,
        src(s.write_mbps),
    );
    if let Some(m) = m {
        o.push_str(&format!(
            "measured on {} ({} s each, {} workers{})\n",
            m.target,
            m.duration_s,
            m.workers,
            if m.direct { ", O_DIRECT" } else { "" }
        ));
    }
    for line in model_lines(p) {
        o.push_str(&wrap(&line, 100, "  "));
    }
    for sk in &p.skipped {
        o.push_str(&format!("not shown: {sk}\n"));
    }
    o
}

/// Breaks text into lines of at most `width` characters at spaces; lines
/// after the first start with `indent`.
fn wrap(text: &str, width: usize, indent: &str) -> String {
    let mut o = String::new();
    let mut line = String::new();
    for w in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + w.len() > width {
            o.push_str(&line);
            o.push('\n');
            line = indent.to_string();
        } else if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(w);
    }
    if !line.trim().is_empty() {
        o.push_str(&line);
        o.push('\n');
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn twelve() -> Plan {
        plan::plan(&Request {
            drives: 12,
            spares: 0,
            drive: Drive {
                size: 8 << 40,
                read_iops: 180.0,
                write_iops: 180.0,
                read_mbps: 250.0,
                write_mbps: 250.0,
            },
            block_size: 16 << 10,
            families: plan::parse_families("mirror,raidz2").unwrap(),
            min_width: None,
            max_width: None,
        })
        .unwrap()
    }

    #[test]
    fn table_rows() {
        let p = twelve();
        let t = plan_table(&p.layouts, DEFAULT_COLUMNS, false).render(false);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "LAYOUT        USABLE  EFF  LOSE  LOSE-MAX  R-IOPS  W-IOPS  R-MB/S  W-MB/S  NOTE"
        );
        assert_eq!(
            lines[1],
            "2x raidz2-6   70.3TB  67%     2         4     360     360    2000    2000  -"
        );
        assert_eq!(
            lines[2],
            "6x mirror2    52.7TB  50%     1         6    2160    1080    3000    1500  -"
        );
        let t = plan_table(&p.layouts, &["layout", "usable", "eff", "riops"], true).render(true);
        let data = plan::device_regions(8 << 40).data;
        assert_eq!(
            t.lines().nth(1).unwrap(),
            format!(
                "6x mirror2\t{}\t{}\t2160",
                6 * data,
                rate(100.0 * (6 * data) as f64 / (96u64 << 40) as f64, true)
            )
        );
    }

    #[test]
    fn drive_sizes_as_sold_and_as_zfs() {
        assert_eq!(drive_size_arg("8TB").unwrap(), 8_000_000_000_000);
        assert_eq!(drive_size_arg("8 tb").unwrap(), 8_000_000_000_000);
        assert_eq!(drive_size_arg("1.92TB").unwrap(), 1_920_000_000_000);
        assert_eq!(drive_size_arg("960GB").unwrap(), 960_000_000_000);
        assert_eq!(drive_size_arg("8TiB").unwrap(), 8 << 40);
        assert_eq!(drive_size_arg("8T").unwrap(), 8 << 40);
        assert!(drive_size_arg("xTB").unwrap_err().contains("xTB"));
        assert!(drive_size_arg("8Q").is_err());
        assert_eq!(sold_size(8_000_000_000_000), "8.00TB");
        assert_eq!(sold_size(64_000_000_000_000), "64.0TB");
        assert_eq!(sold_size(960_000_000_000), "960GB");
        assert_eq!(sold_size(8 << 40), "8.80TB");
        assert_eq!(sold_size(512), "512B");
    }

    #[test]
    fn wraps_text() {
        assert_eq!(wrap("aa bb cc", 5, ""), "aa bb\ncc\n");
        assert_eq!(wrap("aa bb cc dd", 5, " "), "aa bb\n cc\n dd\n");
        assert_eq!(wrap("", 5, " "), "");
    }
}

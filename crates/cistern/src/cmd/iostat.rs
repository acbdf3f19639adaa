//! `cistern pool iostat [-v] [-l] [-w] [-H] [-p] [POOL] [INTERVAL [COUNT]]`,
//! as `zpool iostat`: operations and bandwidth per pool (and per group and
//! device with -v, log devices included), average disk wait with -l (and
//! on the pool's row the sync wait: how long commit requests waited for the
//! intent log), latency histograms with -w. The daemon keeps cumulative counters
//! (`GET /v1/pools/{pool}/iostat`); the first report covers the time since
//! import, each later one the INTERVAL before it.

use crate::format::{size_cell, Table};
use crate::output::out;
use anyhow::{bail, Result};
use clap::Args;
use dataset::{DeviceIostat, PoolIostat};
use std::time::Duration;

#[derive(Debug, Args)]
pub struct IostatArgs {
    /// Per group and device (log devices under "logs").
    #[arg(short = 'v')]
    pub verbose: bool,
    /// Average latencies: disk wait (time in the device's read or write
    /// call) and, for the pool, sync wait (a commit request's wait for the
    /// intent log: NBD FLUSH/FUA, fsync, NFS COMMIT, S3 PUT).
    #[arg(short = 'l')]
    pub latency: bool,
    /// Latency histograms (power-of-two buckets).
    #[arg(short = 'w')]
    pub histogram: bool,
    /// Scripted mode: no headers, fields separated by tabs.
    #[arg(short = 'H')]
    pub scripted: bool,
    /// Exact numbers (bytes, operations per second, nanoseconds).
    #[arg(short = 'p')]
    pub parsable: bool,
    /// `[POOL] [INTERVAL [COUNT]]`: a first word that is not a number names the pool.
    #[arg(value_name = "ARGS", num_args = 0..=3)]
    pub args: Vec<String>,
}

struct Plan {
    pool: Option<String>,
    interval: Option<f64>,
    count: Option<u64>,
}

fn plan(args: &[String]) -> Result<Plan> {
    let mut rest = args;
    let mut pool = None;
    if let Some(first) = rest.first() {
        if first.parse::<f64>().is_err() {
            pool = Some(first.clone());
            rest = &rest[1..];
        }
    }
    let num = |s: &String, what: &str| -> Result<f64> {
        match s.parse::<f64>() {
            Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
            _ => bail!("invalid {what} '{s}': a positive number"),
        }
    };
    let interval = rest.first().map(|s| num(s, "interval")).transpose()?;
    let count = rest
        .get(1)
        .map(|s| match s.parse::<u64>() {
            Ok(v) if v > 0 => Ok(v),
            _ => bail!("invalid count '{s}': a positive integer"),
        })
        .transpose()?;
    if rest.len() > 2 {
        bail!("too many arguments: [POOL] [INTERVAL [COUNT]]");
    }
    Ok(Plan {
        pool,
        interval,
        count,
    })
}

pub fn run(client: &api::Client, a: IostatArgs) -> Result<()> {
    let p = plan(&a.args)?;
    let pools: Vec<String> = match &p.pool {
        Some(name) => vec![name.clone()],
        None => {
            let mut names: Vec<String> = client.list_pools()?.into_iter().map(|s| s.name).collect();
            names.sort();
            names
        }
    };
    if pools.is_empty() {
        bail!("no pools available");
    }
    let read = || -> Result<Vec<PoolIostat>> {
        pools.iter().map(|n| Ok(client.pool_iostat(n)?)).collect()
    };
    let mut prev: Option<Vec<PoolIostat>> = None;
    // Without INTERVAL one report; with INTERVAL and no COUNT, until interrupted
    // (bounded here at a day of reports so the loop always ends).
    let reports = match (p.interval, p.count) {
        (None, _) => 1,
        (Some(_), Some(c)) => c,
        (Some(i), None) => (86_400.0 / i).ceil() as u64,
    };
    for n in 0..reports {
        if n > 0 {
            std::thread::sleep(Duration::from_secs_f64(p.interval.unwrap_or(1.0)));
        }
        let now = read()?;
        out(&render(&now, prev.as_deref(), &a));
        prev = Some(now);
    }
    Ok(())
}

/// Counters of `now` minus `before` (the same device by name), and the seconds between.
fn delta(now: &DeviceIostat, before: Option<&DeviceIostat>) -> DeviceIostat {
    let Some(b) = before else {
        return now.clone();
    };
    DeviceIostat {
        name: now.name.clone(),
        read_ops: now.read_ops.saturating_sub(b.read_ops),
        write_ops: now.write_ops.saturating_sub(b.write_ops),
        read_bytes: now.read_bytes.saturating_sub(b.read_bytes),
        write_bytes: now.write_bytes.saturating_sub(b.write_bytes),
        read_wait_ns: now.read_wait_ns.saturating_sub(b.read_wait_ns),
        write_wait_ns: now.write_wait_ns.saturating_sub(b.write_wait_ns),
        read_hist: hist_delta(&now.read_hist, &b.read_hist),
        write_hist: hist_delta(&now.write_hist, &b.write_hist),
    }
}

/// Counts per bucket of histogram `now` minus `before` (missing buckets are 0).
fn hist_delta(now: &[u64], before: &[u64]) -> Vec<u64> {
    now.iter()
        .enumerate()
        .map(|(i, v)| v.saturating_sub(before.get(i).copied().unwrap_or(0)))
        .collect()
}

fn sum<'a>(devs: impl Iterator<Item = &'a DeviceIostat>, name: &str) -> DeviceIostat {
    let mut t = DeviceIostat {
        name: name.to_string(),
        ..Default::default()
    };
    for d in devs {
        t.read_ops += d.read_ops;
        t.write_ops += d.write_ops;
        t.read_bytes += d.read_bytes;
        t.write_bytes += d.write_bytes;
        t.read_wait_ns += d.read_wait_ns;
        t.write_wait_ns += d.write_wait_ns;
        for (h, src) in [
            (&mut t.read_hist, &d.read_hist),
            (&mut t.write_hist, &d.write_hist),
        ] {
            if h.len() < src.len() {
                h.resize(src.len(), 0);
            }
            for (i, v) in src.iter().enumerate() {
                h[i] += v;
            }
        }
    }
    t
}

/// One row per line of the report: (indent, name, counters over the period, alloc/free).
type Row = (usize, String, DeviceIostat, Option<(u64, u64)>);

fn rows(now: &PoolIostat, before: Option<&PoolIostat>, verbose: bool) -> Vec<Row> {
    let find = |name: &str| -> Option<&DeviceIostat> {
        before.and_then(|b| {
            b.groups
                .iter()
                .chain(b.logs.iter())
                .flat_map(|g| &g.devices)
                .find(|d| d.name == name)
        })
    };
    let mut out = Vec::new();
    let mut group_rows = Vec::new();
    let mut log_rows = Vec::new();
    let mut all = Vec::new();
    for (is_log, g) in now
        .groups
        .iter()
        .map(|g| (false, g))
        .chain(now.logs.iter().map(|g| (true, g)))
    {
        let devs: Vec<DeviceIostat> = g.devices.iter().map(|d| delta(d, find(&d.name))).collect();
        all.extend(devs.clone());
        let rows = if is_log {
            &mut log_rows
        } else {
            &mut group_rows
        };
        let single = g.devices.len() == 1 && g.devices[0].name == g.name;
        rows.push((1, g.name.clone(), sum(devs.iter(), &g.name), None));
        if !single {
            for d in devs {
                rows.push((2, d.name.clone(), d, None));
            }
        }
    }
    out.push((
        0,
        now.pool.clone(),
        sum(all.iter(), &now.pool),
        Some((now.allocated, now.free)),
    ));
    if verbose {
        out.extend(group_rows);
        if !log_rows.is_empty() {
            out.push((0, "logs".into(), DeviceIostat::default(), None));
            out.extend(log_rows);
        }
    }
    out
}

fn latency(ns: u64, parsable: bool) -> String {
    if parsable {
        return ns.to_string();
    }
    match ns {
        0 => "-".into(),
        n if n < 1_000 => format!("{n}ns"),
        n if n < 1_000_000 => format!("{}us", n / 1_000),
        n if n < 1_000_000_000 => format!("{}ms", n / 1_000_000),
        n => format!("{}s", n / 1_000_000_000),
    }
}

fn bucket_name(i: usize) -> String {
    let ns = 1u64 << i;
    match ns {
        n if n < 1_000 => format!("{n}ns"),
        n if n < 1_000_000 => format!("{}us", n / 1_000),
        n if n < 1_000_000_000 => format!("{}ms", n / 1_000_000),
        n => format!("{}s", n / 1_000_000_000),
    }
}

pub fn render(now: &[PoolIostat], before: Option<&[PoolIostat]>, a: &IostatArgs) -> String {
    let mut o = String::new();
    for p in now {
        let b = before.and_then(|b| b.iter().find(|x| x.pool == p.pool));
        let secs = match b {
            Some(b) => (p.timestamp_ms.saturating_sub(b.timestamp_ms)) as f64 / 1e3,
            None => p.uptime_ms as f64 / 1e3,
        }
        .max(1e-3);
        let rows = rows(p, b, a.verbose);
        let sync = SyncWait::of(p, b);
        if a.histogram {
            o.push_str(&histograms(&rows, &sync, a));
        } else {
            o.push_str(&table(&rows, &sync, secs, a));
        }
    }
    o
}

/// The pool's commit requests (FLUSH, FUA, fsync, S3 PUT...) over the
/// period and how long they waited for the intent log: ZFS shows the sync
/// queue's wait as syncq_wait; ours is the whole wait a client sees.
struct SyncWait {
    requests: u64,
    wait_ns: u64,
    hist: Vec<u64>,
}

impl SyncWait {
    fn of(now: &PoolIostat, before: Option<&PoolIostat>) -> SyncWait {
        let (flushes, ns, hist) = before.map_or((0, 0, &[][..]), |b| {
            (b.log_flushes, b.log_wait_ns, &b.log_wait_hist[..])
        });
        SyncWait {
            requests: now.log_flushes.saturating_sub(flushes),
            wait_ns: now.log_wait_ns.saturating_sub(ns),
            hist: hist_delta(&now.log_wait_hist, hist),
        }
    }
}

fn table(rows: &[Row], sync: &SyncWait, secs: f64, a: &IostatArgs) -> String {
    let mut headers = vec!["pool", "alloc", "free", "read", "write", "read", "write"];
    if a.latency {
        headers.extend(["read", "write", "sync"]);
    }
    let mut t = Table::new(&headers);
    for i in 1..headers.len() {
        t.align_right(i);
    }
    let rate = |v: u64| -> String {
        let r = v as f64 / secs;
        if a.parsable {
            format!("{}", r.round() as u64)
        } else {
            crate::format::human_size(r.round() as u64)
                .trim_end_matches('B')
                .to_string()
        }
    };
    for (indent, name, d, space) in rows {
        let mut row = vec![format!("{}{name}", "  ".repeat(*indent))];
        let is_header = name == "logs" && *indent == 0 && space.is_none();
        if is_header {
            row.resize(headers.len(), String::new());
            t.push(row);
            continue;
        }
        match space {
            Some((alloc, free)) => {
                row.push(size_cell(*alloc, a.parsable));
                row.push(size_cell(*free, a.parsable));
            }
            None => row.extend(["-".to_string(), "-".to_string()]),
        }
        row.push(rate(d.read_ops));
        row.push(rate(d.write_ops));
        row.push(if a.parsable {
            rate(d.read_bytes)
        } else {
            size_cell((d.read_bytes as f64 / secs) as u64, false)
        });
        row.push(if a.parsable {
            rate(d.write_bytes)
        } else {
            size_cell((d.write_bytes as f64 / secs) as u64, false)
        });
        if a.latency {
            let avg = |ns: u64, ops: u64| ns.checked_div(ops).unwrap_or(0);
            row.push(latency(avg(d.read_wait_ns, d.read_ops), a.parsable));
            row.push(latency(avg(d.write_wait_ns, d.write_ops), a.parsable));
            // The intent log serves the pool: its wait is on the pool's row.
            row.push(match space {
                Some(_) => latency(avg(sync.wait_ns, sync.requests), a.parsable),
                None => "-".to_string(),
            });
        }
        t.push(row);
    }
    let mut o = String::new();
    if !a.scripted {
        o.push_str(if a.latency {
            "              capacity     operations     bandwidth    disk_wait  sync_wait\n"
        } else {
            "              capacity     operations     bandwidth\n"
        });
    }
    o.push_str(&t.render(a.scripted));
    o
}

/// `-w`: one table per row (pool, or each group and device with -v) of
/// I/O counts per latency bucket, as `zpool iostat -w`; the pool's table
/// also counts its commit requests by their wait for the intent log.
fn histograms(rows: &[Row], sync: &SyncWait, a: &IostatArgs) -> String {
    let mut o = String::new();
    for (_, name, d, space) in rows {
        if name == "logs" && d.read_hist.is_empty() {
            continue;
        }
        let pool_row = space.is_some();
        let none: &[u64] = &[];
        let sync_hist = if pool_row { &sync.hist[..] } else { none };
        let at = |h: &[u64], i: usize| h.get(i).copied().unwrap_or(0);
        let len = d
            .read_hist
            .len()
            .max(d.write_hist.len())
            .max(sync_hist.len());
        let used: Vec<usize> = (0..len)
            .filter(|&i| at(&d.read_hist, i) + at(&d.write_hist, i) + at(sync_hist, i) > 0)
            .collect();
        let mut headers = vec![name.as_str(), "read", "write"];
        if pool_row {
            headers.push("sync");
        }
        let mut t = Table::new(&headers);
        for i in 1..headers.len() {
            t.align_right(i);
        }
        if let (Some(&lo), Some(&hi)) = (used.first(), used.last()) {
            for i in lo..=hi {
                let c = |h: &[u64]| at(h, i);
                let cell = |v: u64| {
                    if a.parsable {
                        v.to_string()
                    } else {
                        crate::format::human_size(v)
                            .trim_end_matches('B')
                            .to_string()
                    }
                };
                let mut row = vec![
                    if a.parsable {
                        (1u64 << i).to_string()
                    } else {
                        bucket_name(i)
                    },
                    cell(c(&d.read_hist)),
                    cell(c(&d.write_hist)),
                ];
                if pool_row {
                    row.push(cell(c(sync_hist)));
                }
                t.push(row);
            }
        }
        if !a.scripted {
            o.push_str(&format!(
                "{name}  disk_wait{}\n",
                if pool_row { ", sync_wait" } else { "" }
            ));
        }
        o.push_str(&t.render(a.scripted));
        if !a.scripted {
            o.push('\n');
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_and_buckets() {
        let p = plan(&["tank".into(), "2".into(), "3".into()]).unwrap();
        assert_eq!(
            (p.pool.as_deref(), p.interval, p.count),
            (Some("tank"), Some(2.0), Some(3))
        );
        let p = plan(&["0.5".into()]).unwrap();
        assert_eq!((p.pool, p.interval, p.count), (None, Some(0.5), None));
        assert!(plan(&["tank".into(), "-1".into()]).is_err());
        assert!(plan(&["tank".into(), "1".into(), "0".into()]).is_err());
        assert_eq!(bucket_name(0), "1ns");
        assert_eq!(bucket_name(10), "1us");
        assert_eq!(latency(1500, false), "1us");
        assert_eq!(latency(1500, true), "1500");
    }

    /// The pool's row carries the commit requests' average wait for the
    /// intent log over the period (-l), and their histogram (-w).
    #[test]
    fn sync_wait_is_the_pools_over_the_period() {
        let dev = |ops: u64| DeviceIostat {
            name: "/d0".into(),
            write_ops: ops,
            write_wait_ns: ops * 1000,
            write_hist: vec![0; 38],
            read_hist: vec![0; 38],
            ..Default::default()
        };
        let at = |ts: u64, flushes: u64, wait_ns: u64, b12: u64| PoolIostat {
            pool: "tank".into(),
            timestamp_ms: ts,
            groups: vec![dataset::GroupIostat {
                name: "/d0".into(),
                devices: vec![dev(flushes)],
            }],
            log_flushes: flushes,
            log_wait_ns: wait_ns,
            log_wait_hist: (0..38).map(|i| if i == 12 { b12 } else { 0 }).collect(),
            ..Default::default()
        };
        let before = [at(1000, 10, 10_000, 10)];
        // 30 more requests that waited 600 µs in all: 20 µs each.
        let now = [at(2000, 40, 610_000, 40)];
        let args = |l: bool, w: bool| IostatArgs {
            verbose: true,
            latency: l,
            histogram: w,
            scripted: true,
            parsable: true,
            args: vec![],
        };
        let out = render(&now, Some(&before), &args(true, false));
        let pool_row: Vec<&str> = out.lines().next().unwrap().split('\t').collect();
        assert_eq!(pool_row.len(), 10, "{out}");
        assert_eq!(pool_row[9], "20000", "{out}");
        let dev_row: Vec<&str> = out.lines().nth(1).unwrap().split('\t').collect();
        assert_eq!(dev_row[9], "-", "{out}");
        let hist = render(&now, Some(&before), &args(false, true));
        let line = hist.lines().find(|l| l.starts_with("4096\t")).unwrap();
        assert_eq!(line.split('\t').nth(3), Some("30"), "{hist}");
    }
}

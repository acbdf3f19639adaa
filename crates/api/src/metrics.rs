//! Prometheus text exposition (format 0.0.4).

use dataset::{PolicyCounters, PoolIostat, PoolStats, PoolStatus, ScanFunction, ScanState};
use std::fmt::Write as _;

pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Builds one exposition document: `family` writes the HELP/TYPE header once,
/// `sample` writes one line.
#[derive(Default)]
pub struct MetricsWriter {
    out: String,
}

impl MetricsWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// `kind` is `counter` or `gauge`.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
        self
    }

    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) -> &mut Self {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", format_value(value));
        self
    }

    pub fn finish(self) -> String {
        self.out
    }
}

fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// The `cistern_pool_*` families, one sample per pool in each.
pub fn render_pool_stats(stats: &[PoolStats]) -> String {
    type Get = fn(&PoolStats) -> f64;
    let families: &[(&str, &str, &str, Get)] = &[
        (
            "cistern_pool_txg",
            "gauge",
            "Last committed transaction group.",
            |s| s.txg as f64,
        ),
        (
            "cistern_pool_txg_commits_total",
            "counter",
            "Transaction groups committed.",
            |s| s.txg_commits as f64,
        ),
        (
            "cistern_pool_txg_commit_seconds_total",
            "counter",
            "Time spent committing transaction groups.",
            |s| s.txg_commit_seconds_total,
        ),
        (
            "cistern_pool_log_commits_total",
            "counter",
            "Intent log group commits (one sync each).",
            |s| s.log_commits as f64,
        ),
        (
            "cistern_pool_log_records_total",
            "counter",
            "Records written to the intent log.",
            |s| s.log_records as f64,
        ),
        (
            "cistern_pool_log_syncs_total",
            "counter",
            "Durable (O_DSYNC) intent log writes.",
            |s| s.log_syncs as f64,
        ),
        (
            "cistern_pool_log_flushes_total",
            "counter",
            "Commit requests (FLUSH, FUA, fsync) answered durable by the intent log.",
            |s| s.log_flushes as f64,
        ),
        (
            "cistern_pool_log_overlapped_writes_total",
            "counter",
            "Intent log writes issued while another was in flight (decision 0041).",
            |s| s.log_overlapped as f64,
        ),
        (
            "cistern_pool_log_deferred_flushes_total",
            "counter",
            "Commit requests (NBD FLUSH) answered by the thread that made them durable, holding no thread while they waited (decision 0057).",
            |s| s.log_deferred as f64,
        ),
        (
            "cistern_pool_log_ring_writes_total",
            "counter",
            "Intent log batches submitted through io_uring, with no thread waiting for them (decision 0068).",
            |s| s.log_ring as f64,
        ),
        (
            "cistern_pool_log_thread_writes_total",
            "counter",
            "Intent log batches written O_DIRECT by the log writer thread (decision 0079).",
            |s| s.log_thread as f64,
        ),
        (
            "cistern_pool_log_wait_seconds_total",
            "counter",
            "Time commit requests (FLUSH, FUA, fsync) waited for the intent log, summed; per request: divide by cistern_pool_log_flushes_total.",
            |s| s.log_wait_seconds_total,
        ),
        (
            "cistern_pool_log_bytes_total",
            "counter",
            "Bytes written to the intent log.",
            |s| s.log_bytes as f64,
        ),
        (
            "cistern_pool_read_bytes_total",
            "counter",
            "Logical bytes read from volumes.",
            |s| s.read_bytes as f64,
        ),
        (
            "cistern_pool_write_bytes_total",
            "counter",
            "Logical bytes written to volumes.",
            |s| s.write_bytes as f64,
        ),
        (
            "cistern_pool_dirty_bytes",
            "gauge",
            "Data waiting for the next transaction group.",
            |s| s.dirty_bytes as f64,
        ),
        (
            "cistern_pool_cache_hits_total",
            "counter",
            "ARC hits (demand reads served from memory).",
            |s| s.cache_hits as f64,
        ),
        (
            "cistern_pool_cache_misses_total",
            "counter",
            "ARC misses (demand reads that went to the devices).",
            |s| s.cache_misses as f64,
        ),
        (
            "cistern_arc_prefetch_reads_total",
            "counter",
            "Blocks read ahead into the ARC by prefetch.",
            |s| s.arc.prefetch_reads as f64,
        ),
        (
            "cistern_arc_prefetch_cached_total",
            "counter",
            "Blocks prefetch found already in the ARC.",
            |s| s.arc.prefetch_cached as f64,
        ),
        (
            "cistern_arc_prefetch_dropped_total",
            "counter",
            "Prefetch blocks dropped at the in-flight bound.",
            |s| s.arc.prefetch_dropped as f64,
        ),
        (
            "cistern_arc_prefetch_streams_total",
            "counter",
            "Sequential read streams detected.",
            |s| s.arc.prefetch_streams as f64,
        ),
        (
            "cistern_l2arc_hits_total",
            "counter",
            "Reads served from L2ARC cache devices.",
            |s| s.arc.l2_hits as f64,
        ),
        (
            "cistern_l2arc_misses_total",
            "counter",
            "ARC misses the L2ARC did not hold either.",
            |s| s.arc.l2_misses as f64,
        ),
        (
            "cistern_l2arc_checksum_errors_total",
            "counter",
            "L2ARC records that failed their hash (served from the pool instead).",
            |s| s.arc.l2_checksum_errors as f64,
        ),
        (
            "cistern_l2arc_size_bytes",
            "gauge",
            "Bytes of records held on L2ARC cache devices.",
            |s| s.arc.l2_size as f64,
        ),
        (
            "cistern_l2arc_write_bytes_total",
            "counter",
            "Bytes written to L2ARC cache devices.",
            |s| s.arc.l2_write_bytes as f64,
        ),
        (
            "cistern_arc_evictions_total",
            "counter",
            "Blocks evicted from the ARC.",
            |s| s.arc.evictions as f64,
        ),
        (
            "cistern_arc_shrinks_total",
            "counter",
            "Times memory pressure lowered the ARC target.",
            |s| s.arc.shrinks as f64,
        ),
        (
            "cistern_arc_size_bytes",
            "gauge",
            "Bytes held by the ARC.",
            |s| s.arc.size as f64,
        ),
        (
            "cistern_arc_target_bytes",
            "gauge",
            "Current ARC bound (lower under memory pressure).",
            |s| s.arc.target as f64,
        ),
        (
            "cistern_arc_min_bytes",
            "gauge",
            "Least the ARC shrinks to (cache_min_bytes).",
            |s| s.arc.min as f64,
        ),
        (
            "cistern_arc_max_bytes",
            "gauge",
            "Most the ARC holds (cache_max_bytes).",
            |s| s.arc.max as f64,
        ),
        (
            "cistern_prefetch_in_flight_bytes",
            "gauge",
            "Read-ahead bytes in flight.",
            |s| s.prefetch_in_flight as f64,
        ),
        (
            "cistern_prefetch_max_bytes",
            "gauge",
            "Bound of read-ahead bytes in flight (prefetch_max_bytes).",
            |s| s.prefetch_max as f64,
        ),
        (
            "cistern_pool_checksum_errors_total",
            "counter",
            "Checksum mismatches found on the devices (repaired ones included; see cistern_pool_data_errors).",
            |s| s.checksum_errors as f64,
        ),
        (
            "cistern_pool_suspended",
            "gauge",
            "1 while the pool is SUSPENDED (its transaction groups cannot be written).",
            |s| s.suspended as f64,
        ),
        (
            "cistern_pool_allocated_bytes",
            "gauge",
            "Bytes allocated in the pool.",
            |s| s.allocated as f64,
        ),
        (
            "cistern_pool_size_bytes",
            "gauge",
            "Usable size of the pool.",
            |s| s.size as f64,
        ),
        (
            "cistern_pool_metadata_used_bytes",
            "gauge",
            "Bytes of the metadata store (block map, names, embedded blocks).",
            |s| s.metadata_used as f64,
        ),
        (
            "cistern_pool_metadata_size_bytes",
            "gauge",
            "Bytes the metadata region holds at most.",
            |s| s.metadata_size as f64,
        ),
        (
            "cistern_pool_bucket_physical_bytes",
            "gauge",
            "Bytes of a bucket pool's log and segment objects as last listed (0 for pools on local devices).",
            |s| s.bucket_physical_bytes as f64,
        ),
        (
            "cistern_pool_bucket_cache_held_bytes",
            "gauge",
            "Bytes resident in a bucket pool's bounded local cache ([bucket] cache_bytes).",
            |s| s.bucket_cache_held_bytes as f64,
        ),
        (
            "cistern_pool_bucket_cache_hits_total",
            "counter",
            "Reads a bucket pool's bounded local cache served from resident data.",
            |s| s.bucket_cache_hits as f64,
        ),
        (
            "cistern_pool_bucket_cache_misses_total",
            "counter",
            "Reads a bucket pool's bounded local cache had to fetch from the bucket.",
            |s| s.bucket_cache_misses as f64,
        ),
        (
            "cistern_pool_bucket_cache_fetched_bytes_total",
            "counter",
            "Bytes of segment objects a bucket pool's bounded local cache fetched.",
            |s| s.bucket_cache_fetched_bytes as f64,
        ),
    ];
    let mut w = MetricsWriter::new();
    w.family("cistern_pools", "gauge", "Imported pools.");
    w.sample("cistern_pools", &[], stats.len() as f64);
    for (name, kind, help, get) in families {
        w.family(name, kind, help);
        for s in stats {
            w.sample(name, &[("pool", &s.pool)], get(s));
        }
    }
    w.finish()
}

/// Per-device error counters and states, and scrub/resilver progress.
/// Per-device I/O counters (`pool iostat`): operations, bytes and disk
/// wait, labelled by pool, device and class (`data` or `log`).
pub fn render_iostat(pools: &[PoolIostat]) -> String {
    type Get = fn(&dataset::DeviceIostat) -> f64;
    let families: [(&str, &str, Get); 6] = [
        (
            "cistern_vdev_read_ops_total",
            "Reads issued to the device.",
            |d| d.read_ops as f64,
        ),
        (
            "cistern_vdev_write_ops_total",
            "Writes issued to the device.",
            |d| d.write_ops as f64,
        ),
        (
            "cistern_vdev_read_bytes_total",
            "Bytes read from the device.",
            |d| d.read_bytes as f64,
        ),
        (
            "cistern_vdev_write_bytes_total",
            "Bytes written to the device.",
            |d| d.write_bytes as f64,
        ),
        (
            "cistern_vdev_read_wait_seconds_total",
            "Time spent in device reads.",
            |d| d.read_wait_ns as f64 / 1e9,
        ),
        (
            "cistern_vdev_write_wait_seconds_total",
            "Time spent in device writes.",
            |d| d.write_wait_ns as f64 / 1e9,
        ),
    ];
    let mut w = MetricsWriter::new();
    for (name, help, get) in families {
        w.family(name, "counter", help);
        for p in pools {
            let all = p
                .groups
                .iter()
                .map(|g| (g, "data"))
                .chain(p.logs.iter().map(|g| (g, "log")));
            for (g, class) in all {
                for d in &g.devices {
                    w.sample(
                        name,
                        &[("pool", &p.pool), ("device", &d.name), ("class", class)],
                        get(d),
                    );
                }
            }
        }
    }
    w.finish()
}

pub fn render_pool_health(statuses: &[PoolStatus]) -> String {
    let mut w = MetricsWriter::new();
    let devices = || {
        statuses.iter().flat_map(|s| {
            s.groups
                .iter()
                .flat_map(move |g| g.devices.iter().map(move |d| (&s.summary.name, d)))
        })
    };
    w.family(
        "cistern_device_errors_total",
        "counter",
        "I/O errors per device and kind (read, write, checksum), as pool status counts them.",
    );
    for (pool, d) in devices() {
        let path = d.path.display().to_string();
        for (kind, n) in [
            ("read", d.read_errors),
            ("write", d.write_errors),
            ("checksum", d.checksum_errors),
        ] {
            w.sample(
                "cistern_device_errors_total",
                &[("pool", pool), ("device", &path), ("kind", kind)],
                n as f64,
            );
        }
    }
    w.family(
        "cistern_pool_health",
        "gauge",
        "1 for the health each pool is in (ONLINE, DEGRADED, UNAVAIL, SUSPENDED).",
    );
    for s in statuses {
        w.sample(
            "cistern_pool_health",
            &[("pool", &s.summary.name), ("health", &s.summary.health)],
            1.0,
        );
    }
    w.family(
        "cistern_pool_data_errors",
        "gauge",
        "Blocks that could not be read or repaired from redundancy (what `errors:` counts); healed blocks are not counted.",
    );
    for s in statuses {
        let n = s
            .scan
            .as_ref()
            .map_or(0, |sc| sc.errors)
            .max(s.data_errors.len() as u64);
        w.sample(
            "cistern_pool_data_errors",
            &[("pool", &s.summary.name)],
            n as f64,
        );
    }
    w.family(
        "cistern_device_state",
        "gauge",
        "1 for the state each device is in (ONLINE, DEGRADED, FAULTED, UNAVAIL, OFFLINE, REMOVED).",
    );
    for (pool, d) in devices() {
        let path = d.path.display().to_string();
        w.sample(
            "cistern_device_state",
            &[("pool", pool), ("device", &path), ("state", &d.state)],
            1.0,
        );
    }
    type Get = fn(&dataset::ScanStatus) -> f64;
    let scan: &[(&str, &str, Get)] = &[
        (
            "cistern_scan_running",
            "1 while a scrub or resilver is scanning.",
            |s| f64::from(u8::from(s.state == ScanState::Scanning)),
        ),
        (
            "cistern_scan_examined_bytes",
            "Bytes the last or current scan verified.",
            |s| s.examined as f64,
        ),
        (
            "cistern_scan_total_bytes",
            "Bytes the last or current scan has to verify.",
            |s| s.total as f64,
        ),
        (
            "cistern_scan_repaired_bytes",
            "Bytes the last or current scan rewrote.",
            |s| s.repaired as f64,
        ),
        (
            "cistern_scan_errors",
            "Blocks the last or current scan could not repair.",
            |s| s.errors as f64,
        ),
    ];
    for (name, help, get) in scan {
        w.family(name, "gauge", help);
        for st in statuses {
            if let Some(scan) = &st.scan {
                let function = match scan.function {
                    ScanFunction::Scrub => "scrub",
                    ScanFunction::Resilver => "resilver",
                };
                w.sample(
                    name,
                    &[("pool", &st.summary.name), ("function", function)],
                    get(scan),
                );
            }
        }
    }
    w.finish()
}

/// The `cistern_policy_*` families: what the snapshot policies did.
pub fn render_policy(c: &PolicyCounters) -> String {
    let mut w = MetricsWriter::new();
    for (name, help, v) in [
        (
            "cistern_policy_snapshots_total",
            "Snapshots taken by snapshot policies.",
            c.snapshots,
        ),
        (
            "cistern_policy_failures_total",
            "Policy runs with an error (failed hook, snapshot or pruning).",
            c.failures,
        ),
        (
            "cistern_policy_pruned_snapshots_total",
            "Automatic snapshots destroyed by retention rules.",
            c.pruned,
        ),
        (
            "cistern_policy_pruned_bytes_total",
            "Bytes freed by pruning automatic snapshots.",
            c.pruned_bytes,
        ),
        (
            "cistern_policy_event_snapshots_total",
            "Snapshots taken on events (a backup finished), included in cistern_policy_snapshots_total.",
            c.event_snapshots,
        ),
        (
            "cistern_policy_events_deferred_total",
            "Events deferred to the end of the policy's minimum interval.",
            c.events_deferred,
        ),
    ] {
        w.family(name, "counter", help).sample(name, &[], v as f64);
    }
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_pool_samples_with_labels() {
        let stats = vec![PoolStats {
            pool: "tank".into(),
            txg_commits: 7,
            txg_commit_seconds_total: 0.25,
            ..Default::default()
        }];
        let text = render_pool_stats(&stats);
        assert!(text.contains("# TYPE cistern_pool_txg_commits_total counter\n"));
        assert!(text.contains("cistern_pool_txg_commits_total{pool=\"tank\"} 7\n"));
        assert!(text.contains("cistern_pool_txg_commit_seconds_total{pool=\"tank\"} 0.25\n"));
        assert!(text.contains("cistern_pools 1\n"));
        for line in text.lines() {
            assert!(
                line.starts_with('#') || line.split(' ').count() == 2,
                "bad line {line:?}"
            );
        }
    }

    #[test]
    fn escapes_label_values() {
        let mut w = MetricsWriter::new();
        w.sample("m", &[("pool", "a\"b\\c\nd")], 1.0);
        assert_eq!(w.finish(), "m{pool=\"a\\\"b\\\\c\\nd\"} 1\n");
    }

    #[test]
    fn formats_values() {
        assert_eq!(format_value(3.0), "3");
        assert_eq!(format_value(0.5), "0.5");
        assert_eq!(format_value(f64::NAN), "NaN");
        assert_eq!(format_value(f64::INFINITY), "+Inf");
    }
}

//! `cistern bench latency`: request-reply round trips on one connection
//! (a small NBD READ, or a pread of a file), like the classic 5000
//! request-reply test: requests per second and latency percentiles.

use std::time::{Duration, Instant};

use anyhow::bail;
use serde::Serialize;

use crate::stats::{Histogram, LatencySummary};
use crate::target::{AlignedBuf, OpenFlags, TargetSpec};
use crate::util;

#[derive(Debug, Clone)]
pub struct LatencyConfig {
    /// Measured requests.
    pub requests: u64,
    /// Requests sent first and not measured.
    pub warmup: u64,
    /// Bytes read per request (512 by default).
    pub size: usize,
    pub direct: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct LatencyResult {
    pub target: String,
    pub requests: u64,
    pub request_bytes: usize,
    pub elapsed_s: f64,
    pub requests_per_s: f64,
    pub latency: LatencySummary,
}

pub fn run(spec: &TargetSpec, cfg: &LatencyConfig) -> anyhow::Result<LatencyResult> {
    if cfg.requests == 0 {
        bail!("-n must be at least 1");
    }
    if cfg.size == 0 || cfg.size > (1 << 20) {
        bail!("request size must be 1 byte .. 1 MiB");
    }
    if cfg.direct && cfg.size % 512 != 0 {
        bail!("--direct needs a request size that is a multiple of 512");
    }
    match spec {
        TargetSpec::File(p) if !p.exists() => {
            bail!(
                "{}: no such file (latency only reads; it creates nothing)",
                p.display()
            )
        }
        _ => {}
    }
    // S3: HEADs of a probe object of `size` bytes, put first if missing and
    // removed afterwards.
    let probe = match spec {
        TargetSpec::S3(s3) => Some((s3, s3.prepare_probe(cfg.size)?)),
        _ => None,
    };
    let r = measure(spec, cfg, probe.is_some());
    if let Some((s3, (key, true))) = &probe {
        s3.client().delete_object(&s3.bucket, key)?;
    }
    let (h, elapsed) = r?;
    Ok(LatencyResult {
        target: spec.describe(),
        requests: cfg.requests,
        request_bytes: cfg.size,
        elapsed_s: elapsed.as_secs_f64(),
        requests_per_s: cfg.requests as f64 / elapsed.as_secs_f64(),
        latency: h.summary(),
    })
}

fn measure(
    spec: &TargetSpec,
    cfg: &LatencyConfig,
    s3: bool,
) -> anyhow::Result<(Histogram, Duration)> {
    // Checks the target is reachable and big enough; reads only, so no --force.
    let prep = if s3 {
        None
    } else {
        let p = spec.prepare(None, false, false, false, cfg.size as u64)?;
        if p.target_size < cfg.size as u64 {
            bail!("target is smaller than one request");
        }
        Some(p)
    };
    let mut t = spec.open(OpenFlags { direct: cfg.direct }, false)?;
    let mut buf = AlignedBuf::new(cfg.size);
    for _ in 0..cfg.warmup {
        t.round_trip(&mut buf)?;
    }
    let mut h = Histogram::new();
    let start = Instant::now();
    for _ in 0..cfg.requests {
        let t0 = Instant::now();
        t.round_trip(&mut buf)?;
        h.record((t0.elapsed().as_nanos()).min(u128::from(u64::MAX)) as u64);
    }
    let elapsed = start.elapsed().max(Duration::from_nanos(1));
    t.close()?;
    if let Some(p) = prep {
        p.finish()?;
    }
    Ok((h, elapsed))
}

pub fn summary_text(r: &LatencyResult) -> String {
    let l = &r.latency;
    format!(
        "target     {} ({}, one connection)\n\
         requests   {} in {:.3} s: {:.0} requests/s\n\
         latency    min {}  mean {}  p50 {}  p90 {}  p99 {}  p99.9 {}  max {}\n",
        r.target,
        if r.target.starts_with("s3://") {
            format!("HEAD of a {}-byte object", r.request_bytes)
        } else {
            format!("{}-byte reads", r.request_bytes)
        },
        r.requests,
        r.elapsed_s,
        r.requests_per_s,
        util::fmt_ns(l.min_ns as f64),
        util::fmt_ns(l.mean_ns),
        util::fmt_ns(l.p50_ns as f64),
        util::fmt_ns(l.p90_ns as f64),
        util::fmt_ns(l.p99_ns as f64),
        util::fmt_ns(l.p999_ns as f64),
        util::fmt_ns(l.max_ns as f64),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_on_mock_nbd_and_file() {
        let srv = crate::nbd_client::mock::MockServer::start("lat", 1 << 20).unwrap();
        let spec = TargetSpec::parse(&srv.uri()).unwrap();
        let cfg = LatencyConfig {
            requests: 200,
            warmup: 10,
            size: 512,
            direct: false,
        };
        let r = run(&spec, &cfg).unwrap();
        assert_eq!(r.latency.count, 200);
        assert!(r.requests_per_s > 0.0);
        let reads = srv
            .requests
            .lock()
            .unwrap()
            .iter()
            .filter(|(c, _)| *c == 0)
            .count();
        assert!(reads >= 210, "{reads}");

        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        assert!(
            run(&TargetSpec::File(f.clone()), &cfg).is_err(),
            "missing file"
        );
        std::fs::write(&f, vec![1u8; 4096]).unwrap();
        let r = run(&TargetSpec::File(f), &cfg).unwrap();
        assert_eq!(r.latency.count, 200);
        assert!(summary_text(&r).contains("requests/s"));
    }
}

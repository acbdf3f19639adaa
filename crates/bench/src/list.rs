//! `cistern bench list s3://BUCKET[/prefix]`: how fast a bucket of N
//! objects is listed. Puts the objects that are missing first (W clients
//! in parallel), lists once unmeasured, then times R full ListObjectsV2
//! listings page by page, each checked to return every object.

use std::time::{Duration, Instant};

use anyhow::bail;
use serde::Serialize;

use crate::s3::S3Target;
use crate::stats::{Histogram, LatencySummary, SeriesSummary};
use crate::util;

#[derive(Debug, Clone)]
pub struct ListConfig {
    /// Objects the prefix must hold (keys PREFIX + 0000000000..).
    pub objects: u64,
    /// Size of the objects put when some are missing.
    pub object_size: u64,
    /// Clients putting the missing objects.
    pub workers: usize,
    /// Measured full listings.
    pub repeat: u32,
    /// Keys asked per page (max-keys).
    pub page_size: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct ListResult {
    pub target: String,
    /// Objects every listing returned.
    pub objects: u64,
    /// Objects put before measuring.
    pub populated: u64,
    pub populate_s: f64,
    pub page_size: u32,
    pub listings: u32,
    pub pages_per_listing: u64,
    /// Seconds of each full listing.
    pub listing_s: Vec<f64>,
    pub listing: SeriesSummary,
    /// Objects listed per second over all measured listings.
    pub objects_per_s: f64,
    /// Latency of each ListObjectsV2 page.
    pub page_latency: LatencySummary,
}

pub fn run(t: &S3Target, cfg: &ListConfig) -> anyhow::Result<ListResult> {
    if cfg.objects == 0 {
        bail!("--objects must be at least 1");
    }
    if cfg.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    if !(1..=1000).contains(&cfg.page_size) {
        bail!("--page-size must be 1..=1000 (S3's max-keys)");
    }
    let mut c = t.connect()?;
    let have = t.list_all(&mut c)?;
    let missing: Vec<String> = (0..cfg.objects)
        .map(|i| t.key(i))
        .filter(|k| !have.contains_key(k))
        .collect();
    let t0 = Instant::now();
    if !missing.is_empty() {
        eprintln!(
            "note: putting {} objects of {} under {} ({} clients)",
            missing.len(),
            util::fmt_bytes(cfg.object_size),
            t.url(),
            cfg.workers
        );
        t.populate(&missing, cfg.object_size as usize, cfg.workers)?;
    }
    let populate_s = t0.elapsed().as_secs_f64();
    let expected = (have.len() + missing.len()) as u64;

    let mut pages = Histogram::new();
    let mut listing_s = Vec::with_capacity(cfg.repeat as usize);
    let mut pages_per_listing = 0;
    // The first listing warms caches and is not measured.
    for round in 0..=cfg.repeat {
        let mut round_pages = Histogram::new();
        let mut token: Option<String> = None;
        let mut count = 0u64;
        let start = Instant::now();
        loop {
            if crate::interrupt::requested() {
                bail!("interrupted");
            }
            let p0 = Instant::now();
            let page = c.list_objects_v2(&t.bucket, &t.prefix, token.as_deref(), cfg.page_size)?;
            round_pages.record(p0.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64);
            count += page.objects.len() as u64;
            match page.next {
                Some(n) if token.as_deref() == Some(n.as_str()) => {
                    bail!("{}: the listing does not advance", t.url())
                }
                Some(n) => token = Some(n),
                None => break,
            }
        }
        let took = start.elapsed().max(Duration::from_nanos(1));
        if count != expected {
            bail!(
                "{}: a listing returned {count} objects, expected {expected}",
                t.url()
            );
        }
        if round > 0 {
            pages.merge(&round_pages);
            listing_s.push(took.as_secs_f64());
            pages_per_listing = round_pages.count();
        }
    }
    let total: f64 = listing_s.iter().sum();
    Ok(ListResult {
        target: format!("{} at {}", t.url(), t.config.endpoint),
        objects: expected,
        populated: missing.len() as u64,
        populate_s,
        page_size: cfg.page_size,
        listings: cfg.repeat,
        pages_per_listing,
        listing: SeriesSummary::of(&listing_s),
        objects_per_s: expected as f64 * f64::from(cfg.repeat) / total.max(1e-9),
        listing_s,
        page_latency: pages.summary(),
    })
}

pub fn summary_text(r: &ListResult) -> String {
    let l = &r.page_latency;
    let s = &r.listing;
    let mut t = format!(
        "target     {} ({} objects, {} keys a page, {} pages a listing)\n",
        r.target, r.objects, r.page_size, r.pages_per_listing
    );
    if r.populated > 0 {
        t += &format!(
            "populated  {} objects in {:.1} s ({:.0} PUT/s)\n",
            r.populated,
            r.populate_s,
            r.populated as f64 / r.populate_s.max(1e-9)
        );
    }
    t += &format!(
        "listing    {} full listings: mean {}  min {}  median {}  max {}\n\
         throughput {:.0} objects/s listed\n\
         pages      p50 {}  p90 {}  p99 {}  max {}\n",
        r.listings,
        util::fmt_ns(s.mean * 1e9),
        util::fmt_ns(s.min * 1e9),
        util::fmt_ns(s.median * 1e9),
        util::fmt_ns(s.max * 1e9),
        r.objects_per_s,
        util::fmt_ns(l.p50_ns as f64),
        util::fmt_ns(l.p90_ns as f64),
        util::fmt_ns(l.p99_ns as f64),
        util::fmt_ns(l.max_ns as f64),
    );
    t
}

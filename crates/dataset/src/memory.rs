//! How big the ARC may be, and the monitor that shrinks it under memory
//! pressure (as ZFS's arc_reap thread and arc_available_memory do).
//!
//! Sizing: by default `cache_max_bytes` is 1/4 and `cache_min_bytes` 1/32 of
//! the memory the daemon may use: the machine's RAM, or its cgroup v2's
//! `memory.max` when that is lower. Every `TICK` the monitor reads the
//! daemon's own cgroup (`memory.max`, `memory.stat` anon) and memory PSI
//! (`memory.pressure` of the cgroup, else `/proc/pressure/memory`) and
//! `MemAvailable`; under pressure it lowers every ARC's target (down to its
//! min), and raises it back step by step once the pressure is gone.

use crate::cache::BlockCache;
use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

const TICK: Duration = Duration::from_millis(250);
/// Time without pressure before the targets grow again.
const CALM: Duration = Duration::from_secs(5);
/// PSI "some avg10" (percent of time stalled on memory) that counts as pressure.
const PSI_SOME_AVG10: f64 = 10.0;
const FLOOR_MAX: u64 = 64 << 20;
const FLOOR_MIN: u64 = 16 << 20;

/// A snapshot of what the monitor reads.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MemoryState {
    pub total: u64,
    pub available: u64,
    /// The daemon's cgroup v2 memory.max (None: no limit or no cgroup v2).
    pub cgroup_max: Option<u64>,
    /// Anonymous memory of the cgroup (what the kernel cannot drop without swap).
    pub cgroup_anon: Option<u64>,
    pub psi_some_avg10: Option<f64>,
}

impl MemoryState {
    /// The memory the daemon may use.
    pub fn limit(&self) -> u64 {
        match self.cgroup_max {
            Some(m) if self.total == 0 => m,
            Some(m) => m.min(self.total),
            None => self.total,
        }
    }

    /// 0: calm; 1: pressure (shrink a little); 2: close to the limit (shrink hard).
    pub fn pressure(&self) -> u8 {
        if let (Some(max), Some(anon)) = (self.cgroup_max, self.cgroup_anon) {
            if anon > max / 20 * 19 {
                return 2;
            }
            if anon > max / 20 * 17 {
                return 1;
            }
        }
        if self.total > 0 && self.available < self.total / 64 {
            return 2;
        }
        if self.total > 0 && self.available < self.total / 32 {
            return 1;
        }
        if self.psi_some_avg10.is_some_and(|p| p > PSI_SOME_AVG10) {
            return 1;
        }
        0
    }
}

/// The daemon's own memory cgroup: v2 (`0::/path`), else the v1 memory
/// controller (`N:memory:/path`; hybrid hosts and older container runtimes).
enum Cgroup {
    V2(PathBuf),
    V1(PathBuf),
}

fn own_cgroup() -> Option<Cgroup> {
    let s = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let under = |root: &str, rel: &str| PathBuf::from(root).join(rel.trim_start_matches('/'));
    let v2 = s
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|rel| under("/sys/fs/cgroup", rel))
        .filter(|d| d.join("memory.max").exists());
    if let Some(d) = v2 {
        return Some(Cgroup::V2(d));
    }
    let rel = s.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctl, path) = (f.next()?, f.next()?, f.next()?);
        ctl.split(',').any(|c| c == "memory").then_some(path)
    })?;
    let d = under("/sys/fs/cgroup/memory", rel);
    d.join("memory.limit_in_bytes")
        .exists()
        .then_some(Cgroup::V1(d))
}

fn read_u64(path: PathBuf) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn stat_field(path: PathBuf, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

fn meminfo(field: &str, text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn psi_some_avg10(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    let v = line
        .split_whitespace()
        .find_map(|f| f.strip_prefix("avg10="))?;
    v.parse().ok()
}

/// Reads the machine's and the daemon's cgroup's memory state now.
pub fn read_state() -> MemoryState {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mut st = MemoryState {
        total: meminfo("MemTotal:", &info).unwrap_or(0),
        available: meminfo("MemAvailable:", &info).unwrap_or(0),
        ..Default::default()
    };
    let mut psi = None;
    match own_cgroup() {
        Some(Cgroup::V2(dir)) => {
            // "max" (no limit) does not parse: None.
            st.cgroup_max = read_u64(dir.join("memory.max"));
            st.cgroup_anon = stat_field(dir.join("memory.stat"), "anon");
            psi = std::fs::read_to_string(dir.join("memory.pressure")).ok();
        }
        Some(Cgroup::V1(dir)) => {
            // v1 writes "no limit" as a huge number.
            st.cgroup_max = read_u64(dir.join("memory.limit_in_bytes")).filter(|&m| m < 1 << 60);
            st.cgroup_anon = stat_field(dir.join("memory.stat"), "total_rss")
                .or_else(|| stat_field(dir.join("memory.stat"), "rss"));
        }
        None => {}
    }
    let psi = psi.or_else(|| std::fs::read_to_string("/proc/pressure/memory").ok());
    st.psi_some_avg10 = psi.as_deref().and_then(psi_some_avg10);
    st
}

/// The ARC's (min, max) from the config (max `CACHE_AUTO`, min 0: sized from memory).
pub fn arc_bounds(min: u64, max: u64) -> (u64, u64) {
    let limit = read_state().limit();
    let max = if max != crate::CACHE_AUTO {
        max
    } else {
        (limit / 4).max(FLOOR_MAX)
    };
    let min = if min > 0 {
        min
    } else {
        (limit / 32).max(FLOOR_MIN)
    };
    (min.min(max), max)
}

struct Monitor {
    caches: Mutex<Vec<Weak<BlockCache>>>,
}

static MONITOR: OnceLock<Arc<Monitor>> = OnceLock::new();

/// Puts a cache under the memory monitor (started on first use; it lives
/// as long as the process and holds only weak references).
pub fn register(cache: &Arc<BlockCache>) {
    let m = MONITOR.get_or_init(|| {
        let m = Arc::new(Monitor {
            caches: Mutex::new(Vec::new()),
        });
        let run = m.clone();
        let spawned = std::thread::Builder::new()
            .name("arc-monitor".into())
            .spawn(move || run.run());
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the ARC memory monitor");
        }
        m
    });
    let mut caches = m.caches.lock();
    caches.retain(|w| w.strong_count() > 0);
    caches.push(Arc::downgrade(cache));
}

impl Monitor {
    fn run(&self) {
        let mut calm_since = Instant::now();
        let mut evicted = 0u64;
        loop {
            std::thread::sleep(TICK);
            let caches: Vec<Arc<BlockCache>> = {
                let mut c = self.caches.lock();
                c.retain(|w| w.strong_count() > 0);
                c.iter().filter_map(|w| w.upgrade()).collect()
            };
            if caches.is_empty() {
                continue;
            }
            let st = read_state();
            // Never more than half of a cgroup limit, whatever the config says.
            let ceiling = st.cgroup_max.map(|m| m / 2).unwrap_or(u64::MAX);
            let per_cache = ceiling / caches.len() as u64;
            match st.pressure() {
                0 => {
                    for c in &caches {
                        let grown = if calm_since.elapsed() >= CALM {
                            c.target().saturating_add(c.bounds().1 / 16)
                        } else {
                            c.target()
                        };
                        c.set_target_within(grown, per_cache);
                    }
                }
                level => {
                    calm_since = Instant::now();
                    for c in &caches {
                        let now = c.size().min(c.target());
                        let to = if level >= 2 { now / 2 } else { now / 8 * 7 };
                        c.set_target_within(to, per_cache);
                    }
                    tracing::debug!(?st, level, "memory pressure: ARC shrunk");
                }
            }
            // Blocks left the ARC: give the freed heap pages back to the
            // system (glibc keeps them in its arenas otherwise, and RSS
            // drifts to twice the ARC under eviction churn).
            let now: u64 = caches.iter().map(|c| c.stats().evictions).sum();
            if now != evicted {
                evicted = now;
                trim_heap();
            }
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim_heap() {
    // SAFETY: malloc_trim only walks glibc's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_heap() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_psi_and_meminfo() {
        let psi = "some avg10=12.50 avg60=3.00 avg300=0.50 total=123\nfull avg10=1.00 avg60=0.00 avg300=0.00 total=4\n";
        assert_eq!(psi_some_avg10(psi), Some(12.5));
        let info = "MemTotal:       16384 kB\nMemAvailable:    8192 kB\n";
        assert_eq!(meminfo("MemTotal:", info), Some(16384 * 1024));
        assert_eq!(meminfo("MemAvailable:", info), Some(8192 * 1024));
    }

    #[test]
    fn pressure_levels() {
        let calm = MemoryState {
            total: 16 << 30,
            available: 8 << 30,
            cgroup_max: Some(1 << 30),
            cgroup_anon: Some(100 << 20),
            psi_some_avg10: Some(0.0),
        };
        assert_eq!(calm.pressure(), 0);
        assert_eq!(calm.limit(), 1 << 30);
        let near = MemoryState {
            cgroup_anon: Some(900 << 20),
            ..calm
        };
        assert_eq!(near.pressure(), 1);
        let over = MemoryState {
            cgroup_anon: Some(1000 << 20),
            ..calm
        };
        assert_eq!(over.pressure(), 2);
        let stalled = MemoryState {
            psi_some_avg10: Some(40.0),
            ..calm
        };
        assert_eq!(stalled.pressure(), 1);
    }

    #[test]
    fn default_bounds_follow_memory() {
        let (min, max) = arc_bounds(0, crate::CACHE_AUTO);
        assert!(max >= FLOOR_MAX && min >= FLOOR_MIN.min(max) && min <= max);
        assert_eq!(arc_bounds(1 << 20, 8 << 20), (1 << 20, 8 << 20));
        assert_eq!(arc_bounds(16 << 20, 8 << 20), (8 << 20, 8 << 20));
        assert_eq!(arc_bounds(0, 0), (0, 0), "0 caches nothing");
    }
}

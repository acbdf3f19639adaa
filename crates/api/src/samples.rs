//! The last hour of I/O rates per pool and of each device's state and
//! error counters, sampled from the counters the daemon already keeps
//! (`PoolStats` read/write bytes, the NBD server's request counters,
//! `pool status`, the per-device counters of `pool iostat`): what the web dashboard's live charts draw
//! (`GET /v1/samples`). Bounded: [`KEEP`] samples per pool and for NBD.

use dataset::Engine;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Time between samples.
pub const INTERVAL: Duration = Duration::from_secs(5);
/// Samples kept: one hour.
pub const KEEP: usize = 720;

/// One device at one instant.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeviceSample {
    pub path: String,
    pub state: String,
    pub read_errors: u64,
    pub write_errors: u64,
    pub checksum_errors: u64,
    /// Operations and bytes per second to this device over the interval (`pool iostat`).
    #[serde(default)]
    pub read_iops: f64,
    #[serde(default)]
    pub write_iops: f64,
    #[serde(default)]
    pub read_bps: f64,
    #[serde(default)]
    pub write_bps: f64,
}

/// One pool over one interval.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PoolSample {
    /// Unix seconds at the end of the interval.
    pub t: u64,
    /// Bytes per second the pool read from / wrote to its devices.
    pub read_bps: f64,
    pub write_bps: f64,
    pub allocated: u64,
    pub devices: Vec<DeviceSample>,
}

/// The NBD server (all exports) over one interval.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NbdSample {
    pub t: u64,
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_bps: f64,
    pub write_bps: f64,
}

/// `GET /v1/samples[?pool=P]`, oldest first.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct History {
    pub interval_secs: u64,
    pub nbd: Vec<NbdSample>,
    pub pools: BTreeMap<String, Vec<PoolSample>>,
}

/// The counters at one sample: when, per pool (read, write) bytes, NBD
/// counters, per (pool, device path) [read ops, write ops, read bytes, write bytes].
type Counters = (
    Instant,
    HashMap<String, (u64, u64)>,
    [u64; 4],
    HashMap<(String, String), [u64; 4]>,
);

#[derive(Default)]
struct Rings {
    last: Option<Counters>,
    nbd: VecDeque<NbdSample>,
    pools: BTreeMap<String, VecDeque<PoolSample>>,
}

/// The rings; one per daemon.
#[derive(Default)]
pub struct Samples {
    rings: Mutex<Rings>,
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn push<T>(ring: &mut VecDeque<T>, v: T) {
    if ring.len() == KEEP {
        ring.pop_front();
    }
    ring.push_back(v);
}

impl Samples {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Reads the counters now and appends one sample per pool (blocking:
    /// `pool status` of each pool).
    pub fn take(&self, engine: &Engine) {
        let now = Instant::now();
        let t = unix_now();
        let stats = engine.stats();
        let n = nbd::stats().snapshot();
        let nbd_now = [
            n.requests_read,
            n.requests_write,
            n.bytes_read,
            n.bytes_written,
        ];
        let mut counters = HashMap::new();
        let mut devices: HashMap<String, Vec<DeviceSample>> = HashMap::new();
        let mut device_io: HashMap<(String, String), [u64; 4]> = HashMap::new();
        for s in &stats {
            if let Ok(io) = engine.pool_iostat(&s.pool) {
                for d in io.groups.iter().chain(&io.logs).flat_map(|g| &g.devices) {
                    device_io.insert(
                        (s.pool.clone(), d.name.clone()),
                        [d.read_ops, d.write_ops, d.read_bytes, d.write_bytes],
                    );
                }
            }
            counters.insert(s.pool.clone(), (s.read_bytes, s.write_bytes));
            if let Ok(st) = engine.pool_status(&s.pool) {
                let devs = st
                    .groups
                    .iter()
                    .flat_map(|g| g.devices.iter())
                    .map(|d| DeviceSample {
                        path: d.path.display().to_string(),
                        state: d.state.clone(),
                        read_errors: d.read_errors,
                        write_errors: d.write_errors,
                        checksum_errors: d.checksum_errors,
                        read_iops: 0.0,
                        write_iops: 0.0,
                        read_bps: 0.0,
                        write_bps: 0.0,
                    })
                    .collect();
                devices.insert(s.pool.clone(), devs);
            }
        }
        let mut r = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((then, last_pools, last_nbd, last_io)) = &r.last {
            let secs = now.duration_since(*then).as_secs_f64().max(1e-3);
            let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
            let nbd = NbdSample {
                t,
                read_iops: rate(nbd_now[0], last_nbd[0]),
                write_iops: rate(nbd_now[1], last_nbd[1]),
                read_bps: rate(nbd_now[2], last_nbd[2]),
                write_bps: rate(nbd_now[3], last_nbd[3]),
            };
            let mut pools = Vec::new();
            for (pool, devs) in devices.iter_mut() {
                for d in devs {
                    let key = (pool.clone(), d.path.clone());
                    if let (Some(now_io), Some(then_io)) = (device_io.get(&key), last_io.get(&key))
                    {
                        d.read_iops = rate(now_io[0], then_io[0]);
                        d.write_iops = rate(now_io[1], then_io[1]);
                        d.read_bps = rate(now_io[2], then_io[2]);
                        d.write_bps = rate(now_io[3], then_io[3]);
                    }
                }
            }
            for s in &stats {
                let (lr, lw) = last_pools
                    .get(&s.pool)
                    .copied()
                    .unwrap_or((s.read_bytes, s.write_bytes));
                pools.push((
                    s.pool.clone(),
                    PoolSample {
                        t,
                        read_bps: rate(s.read_bytes, lr),
                        write_bps: rate(s.write_bytes, lw),
                        allocated: s.allocated,
                        devices: devices.remove(&s.pool).unwrap_or_default(),
                    },
                ));
            }
            push(&mut r.nbd, nbd);
            // Pools no longer imported lose their history.
            r.pools.retain(|name, _| counters.contains_key(name));
            for (name, sample) in pools {
                push(r.pools.entry(name).or_default(), sample);
            }
        }
        r.last = Some((now, counters, nbd_now, device_io));
    }

    /// Everything kept, or one pool's.
    pub fn history(&self, pool: Option<&str>) -> History {
        let r = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        History {
            interval_secs: INTERVAL.as_secs(),
            nbd: r.nbd.iter().cloned().collect(),
            pools: r
                .pools
                .iter()
                .filter(|(name, _)| pool.is_none_or(|p| p == name.as_str()))
                .map(|(name, ring)| (name.clone(), ring.iter().cloned().collect()))
                .collect(),
        }
    }
}

/// Samples every [`INTERVAL`] until the task is aborted.
pub fn spawn(engine: Arc<Engine>, samples: Arc<Samples>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let (e, s) = (engine.clone(), samples.clone());
            if tokio::task::spawn_blocking(move || s.take(&e))
                .await
                .is_err()
            {
                tracing::warn!("I/O sampling failed");
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_is_bounded() {
        let mut ring = VecDeque::new();
        for i in 0..(KEEP + 10) {
            push(&mut ring, i);
        }
        assert_eq!(ring.len(), KEEP);
        assert_eq!(ring.front(), Some(&10));
    }
}

//! `cistern serve --standby POOL LOCATION` (decision 0048): the daemon
//! tails a bucket pool's log without owning it, reports itself as standby
//! (status, API, metrics) and takes over on `pool takeover POOL` or, with
//! `[bucket] takeover_after_secs`, once the owner has been still that long.

use anyhow::{anyhow, Result};
use dataset::Engine;
use std::path::Path;
use std::sync::{Arc, OnceLock};

static STANDBY: OnceLock<(String, String)> = OnceLock::new();
/// Replays an automatic takeover tries after its claim (1, 2, 4, ... s apart).
const AUTO_REPLAYS: u32 = 8;

/// Remembers `--standby POOL LOCATION` for [`start`].
pub fn set(args: &[String]) -> Result<()> {
    match args {
        [] => Ok(()),
        [pool, location] => {
            let _ = STANDBY.set((pool.clone(), location.clone()));
            Ok(())
        }
        _ => Err(anyhow!("--standby takes a pool name and its location")),
    }
}

/// Starts the standby once the engine is open (blocking: it lists the log).
pub fn start(engine: &Arc<Engine>) -> Result<()> {
    let Some((pool, location)) = STANDBY.get() else {
        return Ok(());
    };
    if engine.list_pools().iter().any(|p| &p.name == pool) {
        // A restart after a takeover: this daemon owns the pool now.
        tracing::warn!(pool = %pool, "--standby: this daemon already owns the pool; not standing by");
        return Ok(());
    }
    let e = engine.clone();
    vdev::standby::on_auto_takeover(move |pool, location| {
        // A takeover that claimed the log but could not replay it holds the
        // claim (decision 0055): nobody may be watching, so replay again by
        // itself, a bounded number of times.
        for attempt in 0..AUTO_REPLAYS {
            match e.takeover_pool(&pool, Path::new(&location)) {
                Ok(_) => {
                    tracing::warn!(pool = %pool, "standby: took the pool over automatically");
                    return;
                }
                Err(err) => {
                    tracing::error!(pool = %pool, attempt, "standby: automatic takeover failed: {err}")
                }
            }
            if !vdev::standby::status(&pool).is_some_and(|s| s.claimed) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_secs(1 << attempt.min(5)));
        }
    });
    vdev::standby::start(pool, location).map_err(|e| anyhow!("--standby {pool} {location}: {e}"))
}

/// Prometheus lines for the pools this daemon stands by for.
pub fn render_metrics() -> String {
    let list = vdev::standby::list();
    if list.is_empty() {
        return String::new();
    }
    let mut out = String::new();
    out.push_str("# HELP cistern_bucket_standby A pool this daemon stands by for (tailing its log, not owning it).\n# TYPE cistern_bucket_standby gauge\n");
    for s in &list {
        out.push_str(&format!(
            "cistern_bucket_standby{{pool=\"{}\",location=\"{}\"}} 1\n",
            esc(&s.pool),
            esc(&s.location)
        ));
    }
    out.push_str("# HELP cistern_bucket_standby_next_record Every log record before this one is applied to the standby's cache.\n# TYPE cistern_bucket_standby_next_record gauge\n");
    for s in &list {
        out.push_str(&format!(
            "cistern_bucket_standby_next_record{{pool=\"{}\"}} {}\n",
            esc(&s.pool),
            s.next_seq
        ));
    }
    out.push_str("# HELP cistern_bucket_standby_owner_idle_seconds Seconds since the owner's log or heartbeat last changed.\n# TYPE cistern_bucket_standby_owner_idle_seconds gauge\n");
    for s in &list {
        out.push_str(&format!(
            "cistern_bucket_standby_owner_idle_seconds{{pool=\"{}\"}} {:.3}\n",
            esc(&s.pool),
            s.idle_secs
        ));
    }
    out
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

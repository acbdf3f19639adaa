//! The automatic takeover's idle clock (decisions 0048, 0071): an owner
//! that appends log records skips its heartbeat, so the records a standby
//! reads must keep it from taking over (applied, they count as liveness;
//! failing to apply, it does not take over by itself); an owner that stops
//! (device closed: no beat, no record) is taken over.
//! Its own binary: the daemon's settings are global, and these need
//! `takeover_after_secs`.

use objstore::OpenMode;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vdev::bucket::{self, BucketConfig};

#[allow(dead_code)] // each test binary uses a part of the shared helpers
mod common;
use common::wait_for;

#[test]
fn a_busy_owner_that_skips_its_beats_is_not_taken_over_and_a_stopped_one_is() {
    let dir = tempfile::tempdir().unwrap();
    bucket::configure(
        dir.path(),
        BucketConfig {
            takeover_after_secs: Some(1),
            // Beats every 200 ms while idle, none while it appends.
            heartbeat_ms: Some(200),
            ..Default::default()
        },
    );
    let fired: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let f = fired.clone();
    vdev::standby::on_auto_takeover(move |pool, _url| f.lock().push((pool, Instant::now())));

    let url = format!("file://{}/store", dir.path().display());
    let owner = common::open_url(
        &url,
        &dir.path().join("owner.cache"),
        Some(common::SIZE),
        "owner",
        OpenMode::Create,
    );
    owner.write_at(0, &[7u8; 8192]).unwrap();
    owner.sync().unwrap();
    vdev::standby::start("auto", &url).unwrap();
    wait_for("the standby to catch up", || {
        vdev::standby::status("auto").and_then(|s| s.size).is_some()
    });

    // The owner appends a record every 50 ms for two takeover delays: it
    // skips its beats, the records are its liveness.
    let append = |from: u64| {
        let busy = Instant::now() + Duration::from_secs(2);
        let mut n = from;
        while Instant::now() < busy {
            owner.write_at(4096 * (n % 64), &[n as u8; 4096]).unwrap();
            owner.sync().unwrap();
            n += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
        n
    };
    let n = append(0);
    let st = vdev::standby::status("auto").unwrap();
    assert_eq!(st.owner_heartbeat_ms, Some(200), "{st:?}");
    assert!(st.error.is_none(), "{st:?}");
    assert!(
        fired.lock().is_empty(),
        "a busy owner was taken over ({n} records)"
    );
    // Same with every apply failing (a standby that cannot follow does not
    // take over by itself at all: it only does once caught up).
    vdev::standby::fail_next_replays("auto", u64::MAX);
    let n = append(n);
    let st = vdev::standby::status("auto").unwrap();
    assert!(st.error.is_some(), "the applies did not fail: {st:?}");
    assert!(
        fired.lock().is_empty(),
        "a busy owner was taken over ({n} records)"
    );
    vdev::standby::fail_next_replays("auto", 0);

    // Closed: no record, no beat. The standby fires after the delay.
    let closed = Instant::now();
    drop(owner);
    wait_for("a stopped owner to be taken over", || {
        !fired.lock().is_empty()
    });
    let (pool, at) = fired.lock()[0].clone();
    assert_eq!(pool, "auto");
    assert!(at.duration_since(closed) >= Duration::from_millis(900));
}

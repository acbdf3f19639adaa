use super::*;
use pool::{LayoutKind, Pool, Vdev};

fn pool(dir: &std::path::Path, n: usize) -> Arc<Pool> {
    let devs = (0..n)
        .map(|i| Vdev::open_or_create(&dir.join(format!("d{i}")), Some(96 << 20)).unwrap())
        .collect();
    let kind = if n > 1 {
        LayoutKind::Mirror
    } else {
        LayoutKind::Disk
    };
    Arc::new(Pool::create("tank", vec![(kind, devs)]).unwrap())
}

fn start() -> Checkpoint {
    Checkpoint {
        applied_seq: 1,
        replay_pos: 0,
        expect_seq: 1,
        tag: 0,
    }
}

fn open(p: &Arc<Pool>, cp: Checkpoint) -> (Arc<IntentLog>, Vec<LogRecord>) {
    IntentLog::open(p.log_region(), p.guid, cp, 32 << 20, Box::new(|| {}))
}

/// A log whose deferred commits run on driver threads (no io_uring) or
/// through the ring in `mode`.
fn open_mode(
    p: &Arc<Pool>,
    cp: Checkpoint,
    mode: Option<ring::Mode>,
) -> (Arc<IntentLog>, Vec<LogRecord>) {
    IntentLog::open_with(p.log_region(), p.guid, cp, 32 << 20, Box::new(|| {}), mode)
}

/// The record checksum is blake3 of guid, header and payload as one
/// stream, whichever way it is fed (gathered for small records): records
/// written by earlier builds still verify.
#[test]
fn record_checksum_is_the_streamed_blake3_at_every_size() {
    let header: Vec<u8> = (0..48u8).collect();
    for len in [
        0,
        1,
        967,
        968,
        969,
        1024,
        4096,
        16384,
        GATHER_MAX,
        GATHER_MAX + 1,
        200_000,
    ] {
        let payload: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
        let mut h = blake3::Hasher::new();
        h.update(&0x1234_5678_9abc_def0u64.to_le_bytes());
        h.update(&header);
        h.update(&payload);
        assert_eq!(
            checksum(0x1234_5678_9abc_def0, &header, &payload),
            *h.finalize().as_bytes(),
            "payload of {len} bytes"
        );
    }
}

#[test]
fn committed_records_replay_and_uncommitted_ones_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool(dir.path(), 2);
    let (log, found) = open(&p, start());
    assert!(found.is_empty());
    let a = log.append(RecordKind::Write, 7, 4096, 3, b"abc");
    let b = log.append(RecordKind::Trim, 7, 0, 8192, &[]);
    log.commit(b).unwrap();
    log.append(RecordKind::Write, 7, 0, 3, b"lost"); // never committed
    drop(log);
    let (_, found) = open(&p, start());
    assert_eq!(found.len(), 2);
    assert_eq!(
        (found[0].seq, found[0].payload.as_slice(), found[0].offset),
        (a, b"abc".as_slice(), 4096)
    );
    assert_eq!((found[1].kind, found[1].length), (RecordKind::Trim, 8192));
}

#[test]
fn records_in_a_committed_txg_are_skipped_and_dropped_ones_are_jumped_over() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool(dir.path(), 1);
    let (log, _) = open(&p, start());
    let s1 = log.append(RecordKind::Write, 1, 0, 4, b"one!");
    log.commit(s1).unwrap();
    let _dropped = log.append(RecordKind::Write, 1, 0, 4, b"two!");
    let cp = log.checkpoint();
    log.applied(cp); // the txg holds records 1 and 2: record 2 is never written
    let s3 = log.append(RecordKind::Write, 1, 4, 4, b"thr!");
    log.commit(s3).unwrap();
    drop(log);
    let (_, found) = open(&p, cp);
    assert_eq!(
        found.iter().map(|r| r.payload.clone()).collect::<Vec<_>>(),
        vec![b"thr!".to_vec()]
    );
}

#[test]
fn the_log_wraps_many_times_without_losing_a_committed_record() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool(dir.path(), 1);
    let size = p.log_region().size();
    let (mut log, _) = open(&p, start());
    let mut cp = start();
    let payload = vec![0xabu8; 256 << 10];
    let laps = 3 * size / payload.len() as u64;
    let mut last = 0;
    for i in 0..laps {
        last = log.append(RecordKind::Write, 1, i, payload.len() as u64, &payload);
        log.commit(last).unwrap();
        if i % 8 == 7 {
            // A txg commits everything but the newest record.
            let c = log.checkpoint();
            let keep = log.append(RecordKind::Write, 1, i + 1000, 1, b"k");
            log.commit(keep).unwrap();
            log.applied(c);
            cp = c;
            last = keep;
        }
    }
    drop(log);
    let found;
    (log, found) = open(&p, cp);
    assert!(!found.is_empty());
    assert_eq!(found.last().unwrap().seq, last);
    assert!(found.windows(2).all(|w| w[1].seq == w[0].seq + 1));
    assert!(log.fill() < 1.0);
}

#[test]
fn concurrent_commits_share_syncs() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool(dir.path(), 1);
    let (log, _) = open(&p, start());
    std::thread::scope(|s| {
        for t in 0..8 {
            let log = log.clone();
            s.spawn(move || {
                for i in 0..50 {
                    let seq = log.append(
                        RecordKind::Write,
                        1,
                        (t * 100 + i) * 4096,
                        4096,
                        &[t as u8; 4096],
                    );
                    log.commit(seq).unwrap();
                }
            });
        }
    });
    let commits = log.stats().commits.load(Ordering::Relaxed);
    assert!(commits <= 400, "{commits}");
    drop(log);
    let (_, found) = open(&p, start());
    assert_eq!(found.len(), 400);
}

#[test]
fn a_corrupted_record_on_one_mirror_side_is_read_from_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool(dir.path(), 2);
    let (log, _) = open(&p, start());
    let s = log.append(RecordKind::Write, 1, 0, 5, b"hello");
    log.commit(s).unwrap();
    drop(log);
    let dev0 = p.groups()[0].devices()[0].clone();
    // The record follows the opening jump, on the next page (decision 0061).
    dev0.write_at(p.regions.log_offset + PAGE + 1, b"XX")
        .unwrap();
    let (_, found) = open(&p, start());
    assert_eq!(found[0].payload, b"hello");
    assert_eq!(dev0.errors.checksum.load(Ordering::Relaxed), 1);
}

#[test]
fn records_dropped_past_the_memory_bound_wait_for_their_txg() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool(dir.path(), 1);
    let (log, _) = IntentLog::open(p.log_region(), p.guid, start(), 64 << 10, Box::new(|| {}));
    let first = log.append(RecordKind::Write, 1, 0, 40000, &[1; 40000]);
    let dropped = log.append(RecordKind::Write, 1, 0, 40000, &[2; 40000]); // over the bound
    assert_eq!(log.pending_bytes(), 0, "nothing held twice");
    let later = log.append(RecordKind::Write, 1, 0, 10, &[3; 10]);
    let cp = log.checkpoint();
    let started = std::time::Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            log.applied(cp); // the txg holding them commits
        });
        // A FLUSH covers everything before it, dropped records included.
        log.commit(later).unwrap();
        assert!(
            started.elapsed() >= Duration::from_millis(150),
            "a flush after dropped records waits for their txg"
        );
        log.commit(first).unwrap();
        log.commit(dropped).unwrap();
    });
    // After that txg, records are logged normally again.
    let next = log.append(RecordKind::Write, 1, 0, 10, &[4; 10]);
    let t = std::time::Instant::now();
    log.commit(next).unwrap();
    assert!(t.elapsed() < Duration::from_millis(150));
    drop(log);
    let (_, found) = IntentLog::open(p.log_region(), p.guid, cp, 64 << 10, Box::new(|| {}));
    let seqs: Vec<u64> = found.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, vec![next], "replay jumps over what the txg holds");
}

#[test]
fn log_moves_to_a_log_device_at_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool(dir.path(), 1);
    let slog = Vdev::open_or_create(&dir.path().join("l0"), Some(32 << 20)).unwrap();
    let tag = p.add_log(LayoutKind::Disk, vec![slog]).unwrap();
    let (log, _) = open(&p, start());
    let a = log.append(RecordKind::Write, 7, 0, 3, b"old");
    log.commit(a).unwrap();
    log.switch_region(p.slog_region(tag).unwrap());
    assert!(log.switch_pending());
    // Appended before the move: carried by the txg that moves the log.
    let b = log.append(RecordKind::Write, 7, 0, 3, b"mid");
    let cp = log.checkpoint();
    assert_eq!(log.region_tag(), tag);
    assert_eq!(
        (cp.tag, cp.replay_pos, cp.expect_seq, cp.applied_seq),
        (tag, 0, b + 1, b + 1)
    );
    let c = log.append(RecordKind::Write, 7, 0, 3, b"new");
    // Nothing is acknowledged from the new region before that txg commits.
    let l2 = log.clone();
    let waiter = std::thread::spawn(move || l2.commit(c));
    std::thread::sleep(Duration::from_millis(200));
    assert!(!waiter.is_finished());
    log.applied(cp);
    waiter.join().unwrap().unwrap();
    drop(log);
    // Replay from the committed checkpoint reads the log device, from its start.
    let (_, found) = IntentLog::open(
        p.slog_region(tag).unwrap(),
        p.guid,
        cp,
        32 << 20,
        Box::new(|| {}),
    );
    let payloads: Vec<&[u8]> = found.iter().map(|r| r.payload.as_slice()).collect();
    assert_eq!(payloads, vec![b"new".as_slice()]);
    assert_eq!(found[0].seq, c);
}

#[test]
fn a_payload_made_on_demand_is_made_only_for_a_kept_record() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool(dir.path(), 1);
    let (log, _) = IntentLog::open(p.log_region(), p.guid, start(), 64 << 10, Box::new(|| {}));
    let mut made = 0;
    let kept = log.append_with(RecordKind::Write, 1, 0, 40000, 40000, |f| {
        made += 1;
        f(&[7; 40000])
    });
    // Over the bound: the txg carries it, its payload is never made.
    let dropped = log.append_with(RecordKind::Write, 1, 0, 40000, 40000, |_| {
        panic!("the payload of a dropped record was made")
    });
    assert_eq!((made, log.pending_bytes()), (1, 0));
    let cp = log.checkpoint();
    log.applied(cp);
    log.commit(dropped).unwrap();
    log.commit(kept).unwrap();
    let after = log.append_with(RecordKind::Write, 1, 4096, 3, 3, |f| f(b"abc"));
    log.commit(after).unwrap();
    drop(log);
    let (_, found) = IntentLog::open(p.log_region(), p.guid, cp, 64 << 10, Box::new(|| {}));
    assert_eq!(found.len(), 1);
    assert_eq!(
        (found[0].seq, found[0].offset, &found[0].payload[..]),
        (after, 4096, &b"abc"[..])
    );
}

/// Overlapping log writes (decision 0041): a crash can leave a later batch
/// written and an earlier one not. Replay stops at the hole, and the records
/// written after the restart never let the stale ones past it come back.
#[test]
fn records_past_a_hole_never_replay_even_after_the_hole_is_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool(dir.path(), 2);
    let region = p.log_region();
    let (log, _) = open(&p, start());
    let first = log.append(RecordKind::Write, 1, 0, 5, b"first");
    log.commit(first).unwrap();
    // Where the next batch goes, as the log placed it.
    let cp_now = log.checkpoint();
    drop(log);
    let hole_pos = cp_now.replay_pos;
    let hole_seq = cp_now.expect_seq;
    // Batch H (lost by the crash) would hold record hole_seq; batch B, placed
    // after it and written first, holds the next two.
    let mut h = Vec::new();
    encode(
        p.guid,
        RecordKind::Write,
        hole_seq,
        1,
        4096,
        4,
        b"lost",
        &mut h,
    );
    let mut b = Vec::new();
    for (i, payload) in [b"stale-1", b"stale-2"].iter().enumerate() {
        let seq = hole_seq + 1 + i as u64;
        encode(p.guid, RecordKind::Write, seq, 1, 8192, 7, *payload, &mut b);
    }
    region.write_durable(hole_pos + h.len() as u64, &b).unwrap();
    let payloads =
        |found: &[LogRecord]| -> Vec<Vec<u8>> { found.iter().map(|r| r.payload.clone()).collect() };
    // Replay stops at the hole: B is never applied.
    let (log, found) = open(&p, start());
    assert_eq!(payloads(&found), vec![b"first".to_vec()]);
    // The import commits a txg holding the replayed records.
    let cp = log.checkpoint();
    assert_eq!((cp.replay_pos, cp.expect_seq), (hole_pos, hole_seq));
    log.applied(cp);
    // The next run writes a record of H's size where H was: without the
    // sequence gap it would get H's number and B would follow it in replay.
    let n = log.append(RecordKind::Write, 1, 4096, 4, b"new!");
    assert!(
        n > hole_seq + 2,
        "sequence numbers restart past any stale record: {n}"
    );
    log.commit(n).unwrap();
    drop(log);
    for from in [cp, start()] {
        let (_, found) = open(&p, from);
        let want = if from == cp {
            vec![b"new!".to_vec()]
        } else {
            vec![b"first".to_vec(), b"new!".to_vec()]
        };
        assert_eq!(payloads(&found), want, "replay from {from:?}");
        assert!(
            found.iter().all(|r| r.offset != 8192),
            "a stale record replayed"
        );
    }
    // Once more across a second crash and reopen: still only the new record.
    let (log, found) = open(&p, cp);
    assert_eq!(payloads(&found), vec![b"new!".to_vec()]);
    let cp2 = log.checkpoint();
    log.applied(cp2);
    let m = log.append(RecordKind::Write, 1, 0, 4, b"more");
    log.commit(m).unwrap();
    drop(log);
    let (_, found) = open(&p, cp2);
    assert_eq!(payloads(&found), vec![b"more".to_vec()]);
}

/// Many committers at once: writes overlap, every acknowledged record
/// replays in order, and log space held by writes in flight is never reused
/// (the log wraps several times).
#[test]
fn overlapping_commits_replay_every_acknowledged_record_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool(dir.path(), 1);
    let size = p.log_region().size();
    let (log, _) = open(&p, start());
    let payload_len = 64 << 10;
    let per_thread = (2 * size / payload_len as u64 / 8) as usize;
    let cps = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let log = log.clone();
            let cps = &cps;
            s.spawn(move || {
                for i in 0..per_thread {
                    let seq = log.append(
                        RecordKind::Write,
                        1,
                        t,
                        i as u64,
                        &vec![t as u8; payload_len],
                    );
                    log.commit(seq).unwrap();
                    // A txg now and then frees log space, as the pool does.
                    if i % 16 == 15 && t == 0 {
                        let cp = log.checkpoint();
                        log.applied(cp);
                        cps.lock().push(cp);
                    }
                }
            });
        }
    });
    assert!(log.stats().overlapped.load(Ordering::Relaxed) > 0 || per_thread < 2);
    let last_cp = *cps.lock().last().unwrap();
    let total = log.last_seq();
    drop(log);
    let (_, found) = open(&p, last_cp);
    // Every record since the last checkpoint, each once, in sequence order.
    let seqs: Vec<u64> = found.iter().map(|r| r.seq).collect();
    let want: Vec<u64> = (last_cp.applied_seq..=total).collect();
    assert_eq!(seqs, want);
    for r in &found {
        assert_eq!(r.payload, vec![r.offset as u8; payload_len]);
    }
}

/// Deferred commits (decision 0057): every waiter is answered once, only
/// after its record (and every one before it) is on the device: the waiter
/// itself replays the region and finds them.
#[test]
fn deferred_commits_are_answered_once_and_only_when_on_disk() {
    deferred_commits_check(None, 1);
}

/// Decision 0068: the same through io_uring, O_DIRECT+RWF_DSYNC and
/// O_DSYNC, on one device and on a mirror (both copies per batch).
#[test]
fn deferred_commits_through_the_ring_are_answered_only_when_on_disk() {
    for (mode, n) in [
        (ring::Mode::Direct, 1),
        (ring::Mode::Direct, 2),
        (ring::Mode::Dsync, 2),
    ] {
        deferred_commits_check(Some(mode), n);
    }
}

/// Decision 0079: the same through the log writer thread (O_DIRECT writes
/// it waits for itself), on one device and on a mirror.
#[test]
fn deferred_commits_through_the_writer_thread_are_answered_only_when_on_disk() {
    for n in [1, 2] {
        deferred_commits_check(Some(ring::Mode::Thread), n);
    }
}

/// Decision 0075: the same with the ring's completions reaped by a task on
/// a multi-thread runtime (woken through the ring's eventfd), the answers
/// coming from that task: each 8th waiter replays the region from inside
/// its callback and must find its record.
#[test]
fn deferred_commits_reaped_on_the_runtime_are_answered_only_when_on_disk() {
    let rt = runtime(2);
    let _in = rt.enter();
    for (mode, n) in [(ring::Mode::Direct, 1), (ring::Mode::Direct, 2)] {
        deferred_commits_check(Some(mode), n);
    }
}

fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
}

/// A log on one device, opened inside a one-thread runtime, whose ring
/// completions that runtime reaps (decision 0075).
#[allow(clippy::type_complexity)]
fn ring_log_on_one_thread_runtime() -> (
    tempfile::TempDir,
    Arc<Pool>,
    tokio::runtime::Runtime,
    Arc<IntentLog>,
    Arc<ring::Ring>,
) {
    let dir = tempfile::tempdir().unwrap();
    let p = pool(dir.path(), 1);
    let rt = runtime(1);
    let (log, _) = {
        let _in = rt.enter();
        open_mode(&p, start(), Some(ring::Mode::Direct))
    };
    let ring = log.ring.clone().expect("io_uring is enabled");
    assert!(
        ring.on_runtime.load(Ordering::Relaxed),
        "reaper not on the runtime"
    );
    (dir, p, rt, log, ring)
}

/// Decision 0075: a runtime whose only thread is blocked in a commit
/// cannot run the reaper task; the commit takes the ring's completions
/// itself (and answers the deferred commit queued before it).
#[test]
fn a_commit_blocking_the_runtime_takes_the_ring_completions_itself() {
    if !io_uring_enabled() {
        return;
    }
    let (_dir, p, rt, log, _ring) = ring_log_on_one_thread_runtime();
    // A first batch puts the log on a page boundary (0061).
    let s0 = log.append(RecordKind::Write, 1, 0, 4, b"zero");
    log.commit(s0).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let l = log.clone();
    rt.spawn(async move {
        let seq = l.append(RecordKind::Write, 1, 8, 4, b"next");
        let (atx, arx) = std::sync::mpsc::channel();
        let waiter: Waiter = Box::new(move |durable| {
            let _ = atx.send(durable);
        });
        let queued = matches!(l.commit_deferred(seq, waiter), Deferred::Queued);
        // Blocks the runtime's only thread until the batch is on disk.
        let r = l.commit(seq);
        let _ = tx.send((queued, r.is_ok(), arx.recv_timeout(Duration::from_secs(5))));
    });
    let Ok((queued, committed, answer)) = rx.recv_timeout(Duration::from_secs(20)) else {
        // Its thread is stuck: do not wait for it.
        rt.shutdown_background();
        panic!("a commit blocking the runtime never returned");
    };
    assert!(queued, "the batch did not go to the ring");
    assert!(committed);
    assert_eq!(answer, Ok(true));
    assert_eq!(log.stats().ring.load(Ordering::Relaxed), 1);
    drop(log);
    let (_, found) = open_mode(&p, start(), None);
    assert_eq!(found.len(), 2);
}

/// Decision 0075: when the runtime that ran the reaper shuts down, a
/// `log-ring` thread takes over: deferred commits are still answered.
#[test]
fn a_shut_down_runtime_hands_the_ring_to_a_thread() {
    if !io_uring_enabled() {
        return;
    }
    let (_dir, _p, rt, log, ring) = ring_log_on_one_thread_runtime();
    drop(rt);
    assert!(
        !ring.on_runtime.load(Ordering::Relaxed),
        "no thread took over"
    );
    let s0 = log.append(RecordKind::Write, 1, 0, 4, b"zero");
    log.commit(s0).unwrap();
    let seq = log.append(RecordKind::Write, 1, 8, 4, b"next");
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter: Waiter = Box::new(move |durable| {
        let _ = tx.send(durable);
    });
    assert!(matches!(log.commit_deferred(seq, waiter), Deferred::Queued));
    assert_eq!(rx.recv_timeout(Duration::from_secs(20)), Ok(true));
    assert_eq!(log.stats().ring.load(Ordering::Relaxed), 1);
}

fn deferred_commits_check(mode: Option<ring::Mode>, devices: usize) {
    let dir = tempfile::tempdir().unwrap();
    let p = pool(dir.path(), devices);
    let region = p.log_region();
    let (log, _) = open_mode(&p, start(), mode);
    let ring_on = log.ring.is_some();
    let on_runtime = tokio::runtime::Handle::try_current().is_ok();
    assert_eq!(
        log.ring
            .as_ref()
            .is_some_and(|r| r.on_runtime.load(Ordering::Relaxed)),
        ring_on && on_runtime,
        "reaper on the runtime iff there is one"
    );
    let thread_on = log.writer.is_some();
    assert_eq!(thread_on, mode == Some(ring::Mode::Thread));
    assert!(mode.is_none() || ring_on || thread_on || !io_uring_enabled());
    let answered = Arc::new(Mutex::new(Vec::<(u64, bool)>::new()));
    let checked = Arc::new(AtomicU64::new(0));
    let (mut drives, mut queued, mut done) = (0, 0, 0);
    // Through the ring each commit finds a write slot free while there are
    // no more writers than MAX_IN_FLIGHT: twice that many share writes and
    // wait for a slot (`ring_more` submits their batches).
    let threads = if ring_on || thread_on {
        2 * MAX_IN_FLIGHT as u64
    } else {
        8
    };
    let per_thread = if ring_on || thread_on { 20u64 } else { 40 };
    std::thread::scope(|s| {
        let (drives, queued, done) = (&mut drives, &mut queued, &mut done);
        let (tx, rx) = std::sync::mpsc::channel::<(u8, bool)>();
        for t in 0..threads {
            let (log, answered, checked, region, tx) = (
                log.clone(),
                answered.clone(),
                checked.clone(),
                region.clone(),
                tx.clone(),
            );
            let guid = p.guid;
            s.spawn(move || {
                for i in 0..per_thread {
                    let seq = log.append(RecordKind::Write, 1, t, i, &[t as u8; 4096]);
                    let (ans_tx, ans_rx) = std::sync::mpsc::channel();
                    let (answered, checked, region) =
                        (answered.clone(), checked.clone(), region.clone());
                    let waiter: Waiter = Box::new(move |durable| {
                        if durable && i % 8 == 0 {
                            // What replay finds right now: every record up to seq.
                            let mut buf = vec![0u8; region.size().min(4 << 20) as usize];
                            region.read(0, &mut buf).unwrap();
                            let (found, _, _) = fuzzing::replay(&buf, guid, start());
                            assert!(
                                found.last().is_some_and(|r| r.seq >= seq),
                                "record {seq} answered durable before it was written"
                            );
                            checked.fetch_add(1, Ordering::SeqCst);
                        }
                        answered.lock().push((seq, durable));
                        let _ = ans_tx.send(());
                    });
                    match log.commit_deferred(seq, waiter) {
                        Deferred::Done(w) => {
                            let _ = tx.send((0, false));
                            w(true);
                        }
                        Deferred::Queued => {
                            let _ = tx.send((1, false));
                        }
                        Deferred::Drive => {
                            let _ = tx.send((2, false));
                            log.drive();
                        }
                        Deferred::Refused(_) => panic!("refused"),
                    }
                    ans_rx
                        .recv_timeout(Duration::from_secs(20))
                        .expect("a deferred commit was never answered");
                }
            });
        }
        drop(tx);
        for (kind, _) in rx {
            match kind {
                0 => *done += 1,
                1 => *queued += 1,
                _ => *drives += 1,
            }
        }
    });
    let answered = answered.lock();
    assert_eq!(answered.len() as u64, threads * per_thread);
    assert!(answered.iter().all(|(_, d)| *d));
    let mut seqs: Vec<u64> = answered.iter().map(|(s, _)| *s).collect();
    seqs.sort();
    seqs.dedup();
    assert_eq!(seqs.len() as u64, threads * per_thread, "answered twice");
    assert!(checked.load(Ordering::SeqCst) >= threads * per_thread / 8);
    let ring = log.stats().ring.load(Ordering::Relaxed);
    let by_thread = log.stats().thread.load(Ordering::Relaxed);
    if ring_on {
        assert!(ring > 0, "no batch went through the ring ({drives} drives)");
    } else if thread_on {
        assert_eq!((drives, ring), (0, 0), "deferred commits left the writer");
        assert!(by_thread > 0, "no batch written by the log writer");
    } else {
        assert!(drives > 0, "no driver ran");
        assert_eq!(ring, 0);
    }
    // Group commit: fewer log writes than commits.
    let syncs = log.stats().syncs.load(Ordering::Relaxed);
    assert!(
        syncs < threads * per_thread,
        "{syncs} syncs, {queued} queued, {done} done"
    );
    drop(log);
    // Every copy holds every record (a mirror's copies each get the batch).
    let (_, found) = open_mode(&p, start(), None);
    assert_eq!(found.len() as u64, threads * per_thread);
    for d in 0..devices {
        let mut buf = vec![0u8; region.size().min(4 << 20) as usize];
        let dev = Vdev::open(&dir.path().join(format!("d{d}"))).unwrap();
        dev.read_at(region.offset(), &mut buf).unwrap();
        let (found, _, _) = fuzzing::replay(&buf, p.guid, start());
        assert_eq!(found.len() as u64, threads * per_thread, "device {d}");
    }
}

/// Decisions 0068 and 0079: a ring or writer-thread write that fails (the
/// first copy of a mirrored batch goes to a bad descriptor) is written again
/// the blocking way before the waiter is answered: it must find its record
/// in the region.
fn a_failed_write_is_written_again_before_the_answer(mode: ring::Mode) {
    let dir = tempfile::tempdir().unwrap();
    let p = pool(dir.path(), 2);
    let region = p.log_region();
    let (log, _) = open_mode(&p, start(), Some(mode));
    let (ring, writer) = (log.ring.clone(), log.writer.clone());
    let fail_next = match (&ring, &writer) {
        (Some(r), None) => &r.fail_next,
        (None, Some(w)) => &w.fail_next,
        _ => panic!("{mode:?}: not exactly one of the ring and the writer"),
    };
    // A first batch puts the log on a page boundary (0061).
    let s0 = log.append(RecordKind::Write, 1, 0, 4, b"zero");
    log.commit(s0).unwrap();
    fail_next.store(true, Ordering::SeqCst);
    let seq = log.append(RecordKind::Write, 1, 8, 4, b"late");
    let (tx, rx) = std::sync::mpsc::channel();
    let guid = p.guid;
    let waiter: Waiter = Box::new(move |durable| {
        let mut buf = vec![0u8; region.size().min(4 << 20) as usize];
        region.read(0, &mut buf).unwrap();
        let (found, _, _) = fuzzing::replay(&buf, guid, start());
        let _ = tx.send((durable, found.last().map(|r| r.seq)));
    });
    assert!(matches!(log.commit_deferred(seq, waiter), Deferred::Queued));
    let (durable, last) = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    assert!(durable);
    assert_eq!(last, Some(seq), "answered before the record was on disk");
    assert!(
        !fail_next.load(Ordering::SeqCst),
        "the failure was not injected"
    );
    // The ring counts the batch it submitted; the writer's batch, written
    // again the blocking way, is not counted as the writer's.
    let stats = log.stats();
    let counted = (
        stats.ring.load(Ordering::Relaxed),
        stats.thread.load(Ordering::Relaxed),
    );
    assert_eq!(counted, if ring.is_some() { (1, 0) } else { (0, 0) });
    drop(log);
    let (_, found) = open_mode(&p, start(), None);
    assert_eq!(found.len(), 2);
}

#[test]
fn a_failed_ring_write_is_written_again_before_the_answer() {
    if io_uring_enabled() {
        a_failed_write_is_written_again_before_the_answer(ring::Mode::Direct);
    }
}

#[test]
fn a_failed_writer_write_is_written_again_before_the_answer() {
    a_failed_write_is_written_again_before_the_answer(ring::Mode::Thread);
}

/// Whether this process may make an io_uring (the sysctl and any seccomp
/// filter both allow it), as `Ring::start` will try.
fn io_uring_enabled() -> bool {
    io_uring::IoUring::new(2).is_ok()
}

/// A closed log answers queued deferred commits `false` (the caller's
/// blocking retry reports the error) and refuses new ones.
#[test]
fn a_closed_log_answers_deferred_commits_false() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool(dir.path(), 1);
    let (log, _) = open_mode(&p, start(), None);
    let seq = log.append(RecordKind::Write, 1, 0, 0, &[1; 512]);
    let got = Arc::new(Mutex::new(None));
    let g = got.clone();
    let d = log.commit_deferred(seq, Box::new(move |ok| *g.lock() = Some(ok)));
    assert!(matches!(d, Deferred::Drive));
    // The driver has not run yet: close answers the waiter.
    log.close();
    assert_eq!(*got.lock(), Some(false));
    log.drive();
    let seq = log.append(RecordKind::Write, 1, 0, 0, &[1; 512]);
    assert!(matches!(
        log.commit_deferred(seq, Box::new(|_| {})),
        Deferred::Refused(_)
    ));
}

/// Decision 0061: every batch ends with a jump to the next page, so each log
/// write after the first covers whole pages; everything replays in order.
#[test]
fn batches_are_written_as_whole_pages_and_replay_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool(dir.path(), 1);
    let (log, _) = open(&p, start());
    let sizes = [1usize, 4096, 10, 4016, 4017, 9000, 4095];
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let log = log.clone();
            s.spawn(move || {
                for (i, n) in sizes.iter().enumerate() {
                    let seq = log.append(
                        RecordKind::Write,
                        t,
                        i as u64,
                        *n as u64,
                        &vec![t as u8; *n],
                    );
                    log.commit(seq).unwrap();
                    assert_eq!(log.state.lock().write_pos % PAGE, 0);
                }
            });
        }
    });
    // The region starts at 0: every write started and ended on a page.
    assert_eq!(log.stats().bytes.load(Ordering::Relaxed) % PAGE, 0);
    drop(log);
    let (_, found) = open(&p, start());
    assert_eq!(found.len(), 4 * sizes.len());
    assert!(found.windows(2).all(|w| w[1].seq == w[0].seq + 1));
    for r in &found {
        assert_eq!(r.payload, vec![r.dataset as u8; sizes[r.offset as usize]]);
    }
}

/// A log laid out by earlier builds (records back to back, a jump to the
/// very next byte over dropped records) replays, and this build continues
/// it: its first batch starts where replay stopped, mid-page.
#[test]
fn a_log_written_by_an_earlier_build_replays_and_is_continued() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool(dir.path(), 2);
    let region = p.log_region();
    // Seq 1 and 2 back to back, a jump over 3 (left to a txg) to the next
    // byte, then 4 and 5: as builds before decision 0061 wrote them.
    let mut old = Vec::new();
    let rec = |seq: u64, n: usize, out: &mut Vec<u8>| {
        encode(
            p.guid,
            RecordKind::Write,
            seq,
            9,
            seq * 4096,
            n as u64,
            &vec![seq as u8; n],
            out,
        )
    };
    rec(1, 4096, &mut old);
    rec(2, 7, &mut old);
    let at = old.len() as u64;
    encode(
        p.guid,
        RecordKind::Jump,
        3,
        0,
        at + HEADER as u64,
        4,
        &[],
        &mut old,
    );
    rec(4, 4096, &mut old);
    rec(5, 100, &mut old);
    region.write_durable(0, &old).unwrap();
    let (log, found) = open(&p, start());
    let seqs: Vec<u64> = found.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, vec![1, 2, 4, 5]);
    for r in &found {
        assert_eq!(r.payload, vec![r.seq as u8; r.length as usize]);
    }
    assert_eq!(log.state.lock().write_pos, old.len() as u64);
    // This build appends after them, then pads to a page.
    let a = log.append(RecordKind::Write, 9, 0, 3, b"new");
    let b = log.append(RecordKind::Write, 9, 0, 4096, &[7; 4096]);
    log.commit(b).unwrap();
    assert_eq!(log.state.lock().write_pos % PAGE, 0);
    drop(log);
    let (_, found) = open(&p, start());
    let seqs: Vec<u64> = found.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, vec![1, 2, 4, 5, a, b]);
    assert_eq!(found[4].payload, b"new");
}

/// Batches placed near the region's end: a jump over dropped records whose
/// page has no room for the record, and an end-of-batch jump that would land
/// on the region's end, both go to position 0; every record replays.
#[test]
fn page_jumps_near_the_region_end_wrap_to_its_start() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool(dir.path(), 1);
    let size = p.log_region().size();
    let (log, _) = open(&p, start());
    for (back, n) in [
        (100u64, 10usize),
        (200, 10),
        (4096 + 50, 4000),
        (8192 + 3000, 4000),
        (5000, 4096),
    ] {
        // A record left to the txg below, so the batch starts with a jump.
        log.append(RecordKind::Write, 1, 0, 1, b"d");
        log.state.lock().write_pos = size - back;
        let cp = log.checkpoint();
        log.applied(cp);
        let mut want = Vec::new();
        for i in 0..3u8 {
            let seq = log.append(RecordKind::Write, 1, i as u64, n as u64, &vec![i; n]);
            want.push(seq);
        }
        log.commit(*want.last().unwrap()).unwrap();
        assert_eq!(log.state.lock().write_pos % PAGE, 0, "{back}");
        let (_, found) = IntentLog::open(p.log_region(), p.guid, cp, 32 << 20, Box::new(|| {}));
        let seqs: Vec<u64> = found.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, want, "{back}");
        assert!(found.iter().all(|r| r.payload == vec![r.offset as u8; n]));
    }
}

/// `pool iostat -l`'s sync_wait: each commit request answered durable,
/// blocking or deferred, counts its wait once, as `flushes` counts it.
#[test]
fn commit_waits_are_counted_once_per_answered_request() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool(dir.path(), 1);
    let (log, _) = open_mode(&p, start(), None);
    let seq = log.append(RecordKind::Write, 1, 0, 4096, &[1; 4096]);
    log.commit(seq).unwrap();
    let seq = log.append(RecordKind::Write, 1, 4096, 4096, &[2; 4096]);
    let (tx, rx) = std::sync::mpsc::channel();
    match log.commit_deferred(
        seq,
        Box::new(move |durable| {
            let _ = tx.send(durable);
        }),
    ) {
        Deferred::Drive => log.drive(),
        Deferred::Done(w) => w(true),
        Deferred::Queued => {}
        Deferred::Refused(_) => panic!("a deferred commit was refused"),
    }
    assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap());
    let s = log.stats();
    let counted: u64 = s.wait.hist.iter().map(|h| h.load(Ordering::Relaxed)).sum();
    assert_eq!(counted, 2);
    assert_eq!(counted, s.flushes.load(Ordering::Relaxed));
    assert!(s.wait.nanos.load(Ordering::Relaxed) > 0);
}

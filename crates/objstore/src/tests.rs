//! The log protocol against the `object_store` crate's in-memory and
//! local-file stores, with injected faults. Deterministic: single-threaded
//! runtimes, seeded choices.

use super::*;
use crate::faults::{FaultyStore, PutFault};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use rand::{Rng, SeedableRng};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
}

fn prefix() -> Path {
    Path::from("pools/tank")
}

fn owner(node: &str) -> OwnerId {
    OwnerId::new(node).expect("node")
}

fn entries_of(records: &[Record]) -> Vec<Bytes> {
    records
        .iter()
        .flat_map(|r| r.entries.iter().cloned())
        .collect()
}

/// An in-memory store behind the fault injector, and a log created on it.
async fn faulty_log() -> (Arc<FaultyStore>, Arc<dyn ObjectStore>, Log) {
    let faulty = Arc::new(FaultyStore::new(Arc::new(InMemory::new())));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let (log, _) = Log::open(store.clone(), prefix(), owner("a"), OpenMode::Create)
        .await
        .expect("create");
    (faulty, store, log)
}

fn e(s: &str) -> Bytes {
    Bytes::from(s.to_string())
}

#[test]
fn two_creators_on_an_empty_store_exactly_one_wins() {
    rt().block_on(async {
        for store in [
            Arc::new(InMemory::new()) as Arc<dyn ObjectStore>,
            local_store().0,
        ] {
            let a = Log::open(store.clone(), prefix(), owner("a"), OpenMode::Create);
            let b = Log::open(store.clone(), prefix(), owner("b"), OpenMode::Create);
            let (ra, rb) = tokio::join!(a, b);
            assert!(ra.is_ok() != rb.is_ok(), "exactly one creator wins");
            let err = ra.err().or(rb.err()).expect("one error");
            assert!(matches!(err, LogError::NotEmpty { .. }), "{err}");
            assert_eq!(
                read_all(store.as_ref(), &prefix())
                    .await
                    .expect("read")
                    .len(),
                1
            );
        }
    });
}

fn local_store() -> (Arc<dyn ObjectStore>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let fs = LocalFileSystem::new_with_prefix(dir.path()).expect("local store");
    // Leak the directory guard into the returned pair's lifetime.
    (Arc::new(fs), dir)
}

#[test]
fn resume_is_for_the_same_node_and_takeover_fences_the_old_owner() {
    rt().block_on(async {
        let (store, _dir) = local_store();
        let (mut a, _) = Log::open(store.clone(), prefix(), owner("a"), OpenMode::Create)
            .await
            .expect("create");
        a.append(&[e("a1")]).await.expect("a1");
        // A restart of node a resumes; node b may not.
        let err = Log::open(store.clone(), prefix(), owner("b"), OpenMode::Resume)
            .await
            .expect_err("refused");
        assert!(matches!(err, LogError::OwnedByOther { .. }), "{err}");
        let (mut b, replay) = Log::open(store.clone(), prefix(), owner("b"), OpenMode::Takeover)
            .await
            .expect("takeover");
        assert_eq!(entries_of(&replay), vec![e("a1")]);
        // The old owner's next append fails, and so does every one after it.
        for i in 0..3 {
            let err = a
                .append(&[e(&format!("stale{i}"))])
                .await
                .expect_err("fenced");
            assert!(matches!(err, LogError::Fenced { .. }), "{err}");
            assert!(a.is_fenced());
        }
        b.append(&[e("b1")]).await.expect("b1");
        let all = read_all(store.as_ref(), &prefix()).await.expect("read");
        assert_eq!(entries_of(&all), vec![e("a1"), e("b1")]);
        assert_eq!(last_owner(&all), Some(b.owner()));
        // Now a's node resuming is refused: b owns it.
        let err = Log::open(store.clone(), prefix(), owner("a"), OpenMode::Resume)
            .await
            .expect_err("refused");
        assert!(matches!(err, LogError::OwnedByOther { .. }), "{err}");
    });
}

#[test]
fn a_lost_answer_is_resolved_by_reading_back_and_acknowledged_once() {
    rt().block_on(async {
        let (faulty, store, mut log) = faulty_log().await;
        faulty.faults.push(PutFault::LoseAnswer);
        let seq = log.append(&[e("x")]).await.expect("resolved as ours");
        faulty.faults.push(PutFault::LoseAnswer);
        faulty.faults.push(PutFault::Fail);
        let seq2 = log.append(&[e("y")]).await.expect("resolved as ours");
        assert_eq!(seq2, seq + 1);
        let all = read_all(store.as_ref(), &prefix()).await.expect("read");
        assert_eq!(entries_of(&all), vec![e("x"), e("y")]);
    });
}

#[test]
fn a_put_that_keeps_failing_is_never_acknowledged_and_never_lands_later() {
    rt().block_on(async {
        let (faulty, store, mut log) = faulty_log().await;
        for _ in 0..PUT_ATTEMPTS {
            faulty.faults.push(PutFault::Fail);
        }
        let err = log
            .append(&[e("lost")])
            .await
            .expect_err("not acknowledged");
        assert!(matches!(err, LogError::Unknown { .. }), "{err}");
        // The next append settles the unknown number first (an empty batch
        // takes its place), then writes its own.
        log.append(&[e("next")]).await.expect("next");
        let all = read_all(store.as_ref(), &prefix()).await.expect("read");
        assert_eq!(entries_of(&all), vec![e("next")]);
        assert_eq!(all.len(), 3, "claim, the settled empty batch, next");
    });
}

#[test]
fn group_commit_shares_one_put_among_concurrent_appenders() {
    rt().block_on(async {
        let (faulty, store, log) = faulty_log().await;
        let before = faulty.faults.puts();
        faulty
            .faults
            .push(PutFault::Slow(Duration::from_millis(50)));
        let (gc, task) = GroupCommit::start(log, 256);
        let mut waits = Vec::new();
        for i in 0..100 {
            let gc = gc.clone();
            waits.push(tokio::spawn(
                async move { gc.append(e(&format!("w{i}"))).await },
            ));
        }
        for w in waits {
            w.await.expect("join").expect("acknowledged");
        }
        drop(gc);
        let log = task.await.expect("committer");
        let puts = faulty.faults.puts() - before;
        assert!(puts <= 4, "100 appends took {puts} PUTs");
        let all = read_all(store.as_ref(), &prefix()).await.expect("read");
        let mut got: Vec<Bytes> = entries_of(&all);
        got.sort();
        let mut want: Vec<Bytes> = (0..100).map(|i| e(&format!("w{i}"))).collect();
        want.sort();
        assert_eq!(got, want);
        assert!(!log.is_fenced());
    });
}

#[test]
fn group_commit_fails_every_waiter_of_a_fenced_batch() {
    rt().block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let (log, _) = Log::open(store.clone(), prefix(), owner("a"), OpenMode::Create)
            .await
            .expect("create");
        let (gc, _task) = GroupCommit::start(log, 16);
        gc.append(e("ok")).await.expect("ok");
        Log::open(store.clone(), prefix(), owner("b"), OpenMode::Takeover)
            .await
            .expect("takeover");
        for i in 0..5 {
            let err = gc.append(e(&format!("late{i}"))).await.expect_err("fenced");
            assert!(matches!(err, LogError::Fenced { .. }), "{err}");
        }
        assert_eq!(
            entries_of(&read_all(store.as_ref(), &prefix()).await.expect("read")),
            vec![e("ok")]
        );
    });
}

#[test]
fn a_standby_tail_sees_every_acknowledged_entry_in_order() {
    rt().block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let (mut log, _) = Log::open(store.clone(), prefix(), owner("a"), OpenMode::Create)
            .await
            .expect("create");
        let mut tail = Tail::new(store.clone(), prefix(), 1);
        let mut seen = Vec::new();
        for i in 0..20 {
            log.append(&[e(&format!("{i}"))]).await.expect("append");
            if i % 3 == 0 {
                seen.extend(entries_of(&tail.poll(4).await.expect("poll")));
            }
        }
        for _ in 0..10 {
            seen.extend(entries_of(&tail.poll(4).await.expect("poll")));
        }
        assert_eq!(
            seen,
            (0..20).map(|i| e(&format!("{i}"))).collect::<Vec<_>>()
        );
        assert_eq!(tail.next_seq(), log.next_seq());
    });
}

#[test]
fn a_corrupt_or_missing_record_stops_the_reader() {
    rt().block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let (mut log, _) = Log::open(store.clone(), prefix(), owner("a"), OpenMode::Create)
            .await
            .expect("create");
        let seq = log.append(&[e("x")]).await.expect("append");
        let key = log_key(&prefix(), seq);
        let mut raw = store
            .get(&key)
            .await
            .expect("get")
            .bytes()
            .await
            .expect("bytes")
            .to_vec();
        let mid = raw.len() / 2;
        raw[mid] ^= 1;
        store
            .put(&key, PutPayload::from(raw))
            .await
            .expect("overwrite");
        let err = read_all(store.as_ref(), &prefix())
            .await
            .expect_err("refused");
        assert!(matches!(err, LogError::Corrupt { .. }), "{err}");
        let err = Log::open(store.clone(), prefix(), owner("a"), OpenMode::Resume)
            .await
            .expect_err("refused");
        assert!(matches!(err, LogError::Corrupt { .. }), "{err}");
        // A hole in the sequence is corruption too, not the end of the log.
        store
            .put(&log_key(&prefix(), seq + 2), PutPayload::from_static(b"x"))
            .await
            .expect("put");
        store.delete(&key).await.expect("delete");
        let err = read_all(store.as_ref(), &prefix())
            .await
            .expect_err("refused");
        assert!(matches!(err, LogError::Corrupt { .. }), "{err}");
    });
}

/// Many rounds of an owner appending under random faults while standbys take
/// over at random points. Invariants: every acknowledged entry is in the log
/// exactly once and in acknowledgement order; after a takeover's claim, no
/// record of an older owner follows; a fenced owner acknowledges nothing.
#[test]
fn random_faults_and_takeovers_never_lose_or_reorder_an_acknowledged_entry() {
    let rounds = 40;
    for seed in 0..rounds {
        rt().block_on(async move {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
            let faulty = Arc::new(FaultyStore::new(Arc::new(InMemory::new())));
            let store: Arc<dyn ObjectStore> = faulty.clone();
            let (mut cur, _) = Log::open(store.clone(), prefix(), owner("n0"), OpenMode::Create)
                .await
                .expect("create");
            let mut stale: Vec<Log> = Vec::new();
            let mut acked: Vec<Bytes> = Vec::new();
            for step in 0..60u32 {
                match rng.random_range(0..10) {
                    0 => faulty.faults.push(PutFault::Fail),
                    1 => faulty.faults.push(PutFault::LoseAnswer),
                    _ => {}
                }
                if rng.random_range(0..12) == 0 {
                    let node = format!("n{}", step + 1);
                    match Log::open(store.clone(), prefix(), owner(&node), OpenMode::Takeover).await
                    {
                        Ok((next, replay)) => {
                            // The new owner's replay holds every acknowledged entry.
                            let seen = entries_of(&replay);
                            for a in &acked {
                                assert!(
                                    seen.contains(a),
                                    "seed {seed}: {a:?} missing from the takeover's replay"
                                );
                            }
                            stale.push(std::mem::replace(&mut cur, next));
                        }
                        Err(LogError::Unknown { .. }) | Err(LogError::Store(_)) => {}
                        Err(err) => panic!("seed {seed}: takeover failed: {err}"),
                    }
                }
                let entry = e(&format!("s{seed}-{step}"));
                if let Ok(_seq) = cur.append(std::slice::from_ref(&entry)).await {
                    acked.push(entry);
                }
                // Stale owners keep trying; none of them may succeed.
                for old in stale.iter_mut() {
                    let x = e(&format!("stale-{seed}-{step}"));
                    assert!(
                        old.append(&[x]).await.is_err(),
                        "seed {seed}: a fenced owner was acknowledged"
                    );
                }
            }
            let all = read_all(store.as_ref(), &prefix()).await.expect("read");
            let stored = entries_of(&all);
            let positions: Vec<usize> = acked
                .iter()
                .map(|a| {
                    let n = stored.iter().filter(|s| *s == a).count();
                    assert_eq!(n, 1, "seed {seed}: {a:?} stored {n} times");
                    stored.iter().position(|s| s == a).expect("present")
                })
                .collect();
            assert!(
                positions.windows(2).all(|w| w[0] < w[1]),
                "seed {seed}: order"
            );
            assert!(
                stored.iter().all(|s| !s.starts_with(b"stale")),
                "seed {seed}: a stale write landed"
            );
            // Records after each claim belong to that claim's owner.
            let mut who: Option<&OwnerId> = None;
            for r in &all {
                if r.kind == Kind::Claim {
                    who = Some(&r.owner);
                } else {
                    assert_eq!(
                        Some(&r.owner),
                        who,
                        "seed {seed}: record {} by a non-owner",
                        r.seq
                    );
                }
            }
        });
    }
}

#[test]
fn a_warm_takeover_reads_only_what_follows_and_of_two_takers_one_wins() {
    rt().block_on(async {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let (mut a, _) = Log::open(store.clone(), prefix(), owner("a"), OpenMode::Create)
            .await
            .expect("create");
        a.append(&[e("one")]).await.expect("one");
        a.append(&[e("two")]).await.expect("two");
        // A standby has applied records 1..=2 (claim, "one"); "two" follows.
        let (mut b, rest) = Log::take_over_from(store.clone(), prefix(), owner("b"), 3, Some("a"))
            .await
            .expect("take over");
        assert_eq!(entries_of(&rest), vec![e("two")]);
        assert_eq!(b.next_seq(), 5);
        // The old owner is fenced by b's claim.
        assert!(matches!(
            a.append(&[e("late")]).await,
            Err(LogError::Fenced { .. })
        ));
        b.append(&[e("b1")]).await.expect("b appends");
        // A second standby that still means to fence "a" finds b's claim: it
        // backs off instead of fencing the new owner.
        let r = Log::take_over_from(store.clone(), prefix(), owner("c"), 3, Some("a")).await;
        assert!(matches!(r, Err(LogError::OwnedByOther { .. })), "{r:?}");
        b.append(&[e("b2")]).await.expect("b still owns");
        // An empty log has nothing to take over.
        let empty: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let r = Log::take_over_from(empty, prefix(), owner("c"), 1, None).await;
        assert!(matches!(r, Err(LogError::Empty)), "{r:?}");
    });
}

#[test]
fn a_takeover_from_a_compacted_position_claims_nothing_and_says_behind() {
    rt().block_on(async {
        for store in [
            Arc::new(InMemory::new()) as Arc<dyn ObjectStore>,
            local_store().0,
        ] {
            let (mut a, _) = Log::open(store.clone(), prefix(), owner("a"), OpenMode::Create)
                .await
                .expect("create");
            for i in 0..4 {
                a.append(&[e(&format!("r{i}"))]).await.expect("append");
            }
            // Records 1..=5 exist. A standby applied 1..=2, then lagged while
            // compaction deleted 1..=4 (oldest first).
            for seq in 1..=4u64 {
                store
                    .delete(&log_key(&prefix(), seq))
                    .await
                    .expect("delete");
            }
            assert_eq!(
                record_after(store.as_ref(), &prefix(), 3).await.unwrap(),
                Some(5)
            );
            assert_eq!(
                record_after(store.as_ref(), &prefix(), 5).await.unwrap(),
                None
            );
            let r = Log::take_over_from(store.clone(), prefix(), owner("b"), 3, Some("a")).await;
            assert!(matches!(r, Err(LogError::Behind { next: 3 })), "{r:?}");
            // Nothing was claimed: record 3 is still a hole and the owner goes on.
            assert!(read_record(store.as_ref(), &prefix(), 3)
                .await
                .unwrap()
                .is_none());
            assert_eq!(a.append(&[e("r4")]).await.expect("owner not fenced"), 6);
            // From the end of the stored log the takeover claims as usual.
            let (_b, rest) = Log::take_over_from(store.clone(), prefix(), owner("b"), 5, Some("a"))
                .await
                .expect("take over");
            assert_eq!(entries_of(&rest), vec![e("r3"), e("r4")]);
            assert!(matches!(
                a.append(&[e("late")]).await,
                Err(LogError::Fenced { .. })
            ));
        }
    });
}

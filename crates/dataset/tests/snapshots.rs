//! Snapshots, clones, rollback and destroy against an in-memory model:
//! after every step every dataset and snapshot reads back equal to the
//! model, and the pool's allocated space and every space figure equal what
//! the model predicts (nothing leaked, nothing freed twice).

#[allow(dead_code)] // each test binary uses a part of the shared helpers
mod common;

use common::{config, create_pool, prop, History, Tokens};
use dataset::*;
use rand::{Rng, SeedableRng};
use std::collections::BTreeSet;
use std::sync::Arc;

const BS: u64 = 4096;
const BLOCKS: usize = 96;
const VOLSIZE: u64 = BS * BLOCKS as u64;

fn read_all(vol: &Volume) -> Vec<u8> {
    let mut out = Vec::new();
    for seg in vol.read(0, VOLSIZE).unwrap() {
        match seg {
            ReadSegment::Data(d) => out.extend_from_slice(&d),
            ReadSegment::Hole(n) => out.resize(out.len() + n as usize, 0),
        }
    }
    out
}

/// A block's content and the token of the write that made it (tokens are
/// what the pool allocates: one per block version that reached a txg).
type Block = Option<(u64, Vec<u8>)>;

#[derive(Clone)]
struct Image {
    blocks: Vec<Block>,
}

impl Image {
    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(VOLSIZE as usize);
        for b in &self.blocks {
            match b {
                Some((_, d)) => out.extend_from_slice(d),
                None => out.extend(std::iter::repeat_n(0u8, BS as usize)),
            }
        }
        out
    }
}

impl Tokens for Image {
    fn tokens(&self) -> BTreeSet<u64> {
        self.blocks.iter().flatten().map(|(t, _)| *t).collect()
    }
}

struct Harness {
    dir: tempfile::TempDir,
    engine: Arc<Engine>,
    model: History<Image>,
    rng: rand::rngs::StdRng,
}

impl Harness {
    fn state(&self) -> std::path::PathBuf {
        self.dir.path().join("state")
    }

    fn write(&mut self, ds: &str) {
        let first = self.rng.random_range(0..BLOCKS);
        let n = self.rng.random_range(1..=6).min(BLOCKS - first);
        // Whole blocks mostly; sometimes a partial write (read-modify-write).
        let (offset, len) = if self.rng.random_bool(0.7) {
            (first as u64 * BS, n as u64 * BS)
        } else {
            let start = first as u64 * BS + self.rng.random_range(1..BS);
            let end = ((first + n) as u64 * BS).min(VOLSIZE);
            (start, end - start)
        };
        let mut data = vec![0u8; len as usize];
        self.rng.fill(&mut data[..]);
        for b in data.iter_mut() {
            *b |= 1; // never all zeros
        }
        let vol = self.engine.open_volume(ds).unwrap();
        vol.write(offset, &data, self.rng.random_bool(0.3)).unwrap();
        for blk in (offset / BS)..=((offset + len - 1) / BS) {
            let start = blk * BS;
            let lo = offset.max(start);
            let hi = (offset + len).min(start + BS);
            let token = self.model.token(ds, BS);
            let img = self.model.heads.get_mut(ds).unwrap();
            let mut content = img.blocks[blk as usize]
                .as_ref()
                .map(|(_, d)| d.clone())
                .unwrap_or_else(|| vec![0u8; BS as usize]);
            content[(lo - start) as usize..(hi - start) as usize]
                .copy_from_slice(&data[(lo - offset) as usize..(hi - offset) as usize]);
            img.blocks[blk as usize] = Some((token, content));
        }
    }

    fn trim(&mut self, ds: &str) {
        let first = self.rng.random_range(0..BLOCKS);
        let n = self.rng.random_range(1..=8).min(BLOCKS - first);
        let vol = self.engine.open_volume(ds).unwrap();
        vol.trim(first as u64 * BS, n as u64 * BS, false).unwrap();
        let img = self.model.heads.get_mut(ds).unwrap();
        for b in first..first + n {
            img.blocks[b] = None;
        }
    }

    fn crash_and_reopen(&mut self) {
        for ds in self.model.heads.keys() {
            self.engine.open_volume(ds).unwrap().flush().unwrap();
        }
        let engine = std::mem::replace(
            &mut self.engine,
            Engine::open(&self.dir.path().join("unused"), config()).unwrap(),
        );
        // Abandoned: no txg commit, no shutdown; only the log has the latest writes.
        Engine::forget_as_if_killed(engine);
        self.engine = Engine::open(&self.state(), config()).unwrap();
    }

    fn check(&self, step: usize, what: &str) {
        let ctx = |name: &str| format!("step {step} ({what}): {name}");
        for (name, img) in &self.model.heads {
            let got = read_all(&self.engine.open_volume(name).unwrap());
            if got != img.bytes() {
                let want = img.bytes();
                let i = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                panic!(
                    "{}: contents differ at byte {i} (block {}): got {} want {}; origin {:?}",
                    ctx(name),
                    i as u64 / BS,
                    got[i],
                    want[i],
                    self.model.origin.get(name)
                );
            }
        }
        for (name, s) in &self.model.snaps {
            let vol = self.engine.open_volume(name).unwrap();
            assert!(vol.read_only());
            let got = read_all(&vol);
            assert!(got == s.image.bytes(), "{}: contents differ", ctx(name));
        }
        // Space, once everything is committed.
        self.engine.sync_all().unwrap();
        let m = &self.model;
        let allocated = self.engine.stats()[0].allocated;
        assert_eq!(
            allocated,
            m.asize(m.referenced()),
            "{}",
            ctx("pool allocated")
        );
        let mut reserved = 0;
        for (name, img) in &m.heads {
            let held = m.held(name);
            assert_eq!(
                prop(&self.engine, name, "usedbysnapshots"),
                held,
                "{}",
                ctx(&format!("{name} usedbysnapshots"))
            );
            // tank/v is not sparse: it reserves its size; clones reserve nothing (as zfs).
            let written = prop(&self.engine, name, "written");
            let refreservation = if name == "tank/v" { VOLSIZE } else { 0 };
            assert_eq!(
                prop(&self.engine, name, "refreservation"),
                refreservation,
                "{}",
                ctx(&format!("{name} refreservation"))
            );
            let unused = refreservation.saturating_sub(written);
            assert_eq!(
                prop(&self.engine, name, "usedbyrefreservation"),
                unused,
                "{}",
                ctx(&format!("{name} usedbyrefreservation"))
            );
            assert_eq!(
                prop(&self.engine, name, "used"),
                m.own_live(name) + held + unused,
                "{}",
                ctx(&format!("{name} used"))
            );
            reserved += unused;
            assert_eq!(
                prop(&self.engine, name, "referenced"),
                m.asize(img.tokens()),
                "{}",
                ctx(&format!("{name} referenced"))
            );
            assert_eq!(
                written,
                m.written(name, None),
                "{}",
                ctx(&format!("{name} written"))
            );
        }
        // What the pool can still promise: less slop, allocations and unused reservations.
        let size = self.engine.stats()[0].size;
        assert_eq!(
            prop(&self.engine, "tank", "available"),
            size - dataset::space::slop(size) - allocated - reserved,
            "{}",
            ctx("tank available")
        );
        assert_eq!(
            prop(&self.engine, "tank", "used"),
            allocated + reserved,
            "{}",
            ctx("tank used")
        );
        for (name, s) in &m.snaps {
            assert_eq!(
                prop(&self.engine, name, "referenced"),
                m.asize(s.image.tokens()),
                "{}",
                ctx(&format!("{name} referenced"))
            );
            if s.clones.is_empty() {
                assert_eq!(
                    prop(&self.engine, name, "used"),
                    m.unique_bytes(name),
                    "{}",
                    ctx(&format!("{name} used"))
                );
            }
        }
    }
}

fn run_model(seed: u64, steps: usize) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(&dir.path().join("state"), config()).unwrap();
    create_pool(&engine, dir.path());
    engine
        .create_volume(
            "tank/v",
            VOLSIZE,
            &[
                ("compression".into(), "off".into()),
                ("volblocksize".into(), "4K".into()),
            ],
        )
        .unwrap();
    let mut h = Harness {
        dir,
        engine,
        model: History::new(),
        rng: rand::rngs::StdRng::seed_from_u64(seed),
    };
    h.model.heads.insert(
        "tank/v".into(),
        Image {
            blocks: vec![None; BLOCKS],
        },
    );
    let mut names = 0;
    for step in 0..steps {
        let heads: Vec<String> = h.model.heads.keys().cloned().collect();
        let snaps: Vec<String> = h.model.snaps.keys().cloned().collect();
        let ds = heads[h.rng.random_range(0..heads.len())].clone();
        let roll = h.rng.random_range(0..100);
        let what = match roll {
            0..=44 => {
                h.write(&ds);
                "write"
            }
            45..=54 => {
                h.trim(&ds);
                "trim"
            }
            55..=67 if snaps.len() < 12 => {
                names += 1;
                h.model.snapshot(&h.engine, &ds, &format!("s{names}"));
                "snapshot"
            }
            68..=73 if !snaps.is_empty() && heads.len() < 5 => {
                names += 1;
                let s = snaps[h.rng.random_range(0..snaps.len())].clone();
                h.model.clone(&h.engine, &s, &format!("tank/c{names}"), &[]);
                "clone"
            }
            74..=80 if !snaps.is_empty() => {
                let s = snaps[h.rng.random_range(0..snaps.len())].clone();
                h.model.rollback(&h.engine, &s);
                "rollback"
            }
            81..=91 if !snaps.is_empty() => {
                let s = snaps[h.rng.random_range(0..snaps.len())].clone();
                h.model.destroy_snapshot(&h.engine, &s, true);
                "destroy snapshot"
            }
            92..=93 if h.model.origin.contains_key(&ds) => {
                h.model.destroy_clone(&h.engine, &ds);
                "destroy clone"
            }
            94..=95 if h.model.origin.contains_key(&ds) => {
                h.model.promote(&h.engine, &ds);
                "promote"
            }
            96..=99 => {
                h.crash_and_reopen();
                "crash and reopen"
            }
            _ => "nothing",
        };
        eprintln!("step {step}: {what} on {ds} (snapshots {snaps:?})");
        h.check(step, what);
    }
    h.engine.shutdown().unwrap();
}

#[test]
fn snapshots_clones_rollbacks_and_destroys_match_a_model() {
    let seeds: u64 = std::env::var("CISTERN_MODEL_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    for seed in 1..=seeds {
        run_model(seed, 120);
    }
}

#[test]
fn snapshot_is_instant_and_ordered_against_writes() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(&dir.path().join("state"), config()).unwrap();
    create_pool(&engine, dir.path());
    engine.create_volume("tank/v", 64 << 20, &[]).unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    vol.write(0, &[7u8; 65536], false).unwrap(); // acknowledged, not flushed, not committed
    engine.snapshot(&["tank/v@a".into()], false).unwrap();
    vol.write(0, &[9u8; 65536], false).unwrap();
    let snap = engine.open_volume("tank/v@a").unwrap();
    let got = snap.read(0, 65536).unwrap();
    assert_eq!(got, vec![ReadSegment::Data(vec![7u8; 65536])]);
    assert!(matches!(
        snap.write(0, &[1], false),
        Err(Error::ReadOnly(_))
    ));
    // Changed-since map: the first 64 KiB only.
    let runs = vol.changed_since("a", 0, 1 << 20).unwrap();
    assert_eq!(runs, vec![(65536, true), ((1 << 20) - 65536, false)]);
    assert_eq!(vol.older_snapshots(), vec!["a".to_string()]);
    let diff = engine.diff("tank/v@a", None).unwrap();
    assert_eq!(
        diff.ranges,
        vec![ChangedRange {
            offset: 0,
            length: 65536
        }]
    );
    // Holds block destroy; names are checked.
    engine
        .set_hold("keep", &["tank/v@a".into()], false, true)
        .unwrap();
    assert!(matches!(
        engine.destroy("tank/v@a", &DestroyOptions::default()),
        Err(Error::Busy(_))
    ));
    assert!(
        matches!(
            engine.destroy(
                "tank/v",
                &DestroyOptions {
                    recursive: true,
                    ..Default::default()
                }
            ),
            Err(Error::Busy(_))
        ),
        "destroy -r must not remove a held snapshot"
    );
    engine
        .set_hold("keep", &["tank/v@a".into()], false, false)
        .unwrap();
    // A space is valid in zfs names (`tank/v@a b`); these are not.
    for bad in ["tank/v@", "tank/v@a!b", "tank/v@a@b"] {
        assert!(
            engine.snapshot(&[bad.into()], false).is_err(),
            "{bad} accepted"
        );
    }
    assert!(matches!(
        engine.snapshot(&["tank/v@a".into()], false),
        Err(Error::AlreadyExists(_))
    ));
    assert!(matches!(
        engine.destroy("tank/v", &DestroyOptions::default()),
        Err(Error::Busy(_))
    ));
    engine
        .destroy("tank/v@a", &DestroyOptions::default())
        .unwrap();
    engine.shutdown().unwrap();
}

#[test]
fn a_trim_after_a_snapshot_is_a_change() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(&dir.path().join("state"), config()).unwrap();
    create_pool(&engine, dir.path());
    engine.create_volume("tank/v", 4 << 20, &[]).unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    let data: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 251) as u8).collect();
    vol.write(0, &data, false).unwrap();
    engine.snapshot(&["tank/v@a".into()], false).unwrap();
    vol.trim(16384, 2 << 20, false).unwrap();
    let open = vol.changed_since("a", 0, 4 << 20).unwrap();
    engine.sync_all().unwrap();
    let committed = vol.changed_since("a", 0, 4 << 20).unwrap();
    let want = vec![(16384, false), ((1 << 20) - 16384, true), (3 << 20, false)];
    assert_eq!(open, want, "before the commit");
    assert_eq!(committed, want, "after the commit");
    let snap = engine.open_volume("tank/v@a").unwrap();
    assert_eq!(
        snap.read(0, 1 << 20).unwrap(),
        vec![ReadSegment::Data(data)]
    );
}

#[test]
fn volumes_keep_serving_during_snapshot_commands() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(
        &dir.path().join("state"),
        EngineConfig {
            txg_timeout_secs: 0.05,
            multihost_interval_ms: 50,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    create_pool(&engine, dir.path());
    engine.create_volume("tank/v", 8 << 20, &[]).unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (vol, stop) = (vol.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let block = n % 512;
                vol.write(block * 16384, &[(n % 251) as u8 + 1; 16384], n % 7 == 0)
                    .unwrap();
                n += 1;
            }
            vol.flush().unwrap();
            n
        })
    };
    for i in 0..20 {
        engine.snapshot(&[format!("tank/v@s{i}")], false).unwrap();
        if i % 3 == 0 {
            engine
                .clone_snapshot(&format!("tank/v@s{i}"), &format!("tank/c{i}"), &[])
                .unwrap();
        }
        if i >= 2 && (i - 2) % 3 != 0 {
            engine
                .destroy(&format!("tank/v@s{}", i - 2), &DestroyOptions::default())
                .unwrap();
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let n = writer.join().unwrap();
    assert!(n > 100, "the writer made progress ({n} writes)");
    // The last write of each block is what the volume holds.
    let got = read_all_sized(&vol, 8 << 20);
    for block in 0..512u64 {
        let last = (0..n).rev().find(|k| k % 512 == block);
        let want = last.map_or(0, |k| (k % 251) as u8 + 1);
        let at = (block * 16384) as usize;
        assert!(
            got[at..at + 16384].iter().all(|&b| b == want),
            "block {block}"
        );
    }
    engine.shutdown().unwrap();
}

fn read_all_sized(vol: &Volume, len: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for seg in vol.read(0, len).unwrap() {
        match seg {
            ReadSegment::Data(d) => out.extend_from_slice(&d),
            ReadSegment::Hole(n) => out.resize(out.len() + n as usize, 0),
        }
    }
    out
}

#[test]
fn a_refused_rollback_keeps_the_writes_it_would_have_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(&dir.path().join("state"), config()).unwrap();
    create_pool(&engine, dir.path());
    engine.create_volume("tank/v", 1 << 20, &[]).unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    engine.snapshot(&["tank/v@a".into()], false).unwrap();
    engine.snapshot(&["tank/v@b".into()], false).unwrap();
    engine.clone_snapshot("tank/v@b", "tank/c", &[]).unwrap();
    // Acknowledged, not yet in a txg when the rollback's commit takes the open txg.
    vol.write(0, &[5u8; 4096], true).unwrap();
    // @b has a dependent clone: refused inside the commit.
    assert!(matches!(
        engine.rollback("tank/v@a", true),
        Err(Error::Busy(_))
    ));
    let want = vec![ReadSegment::Data(vec![5u8; 4096])];
    assert!(
        vol.read(0, 4096).unwrap() == want,
        "lost by the refused rollback"
    );
    engine.sync_all().unwrap();
    assert!(
        vol.read(0, 4096).unwrap() == want,
        "lost at the next commit"
    );
    engine.shutdown().unwrap();
}

#[test]
fn partial_writes_during_a_refused_rollback_land_on_the_writes_it_kept() {
    const N: u64 = 32;
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(&dir.path().join("state"), config()).unwrap();
    create_pool(&engine, dir.path());
    engine
        .create_volume("tank/v", N * BS, &[("volblocksize".into(), "4K".into())])
        .unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    engine.snapshot(&["tank/v@a".into()], false).unwrap();
    engine.snapshot(&["tank/v@b".into()], false).unwrap();
    engine.clone_snapshot("tank/v@b", "tank/c", &[]).unwrap();
    // A writer keeps rewriting the first 512 bytes of every block (partial
    // blocks: merged with what lies below only at the commit).
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (vol, stop) = (vol.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for b in 0..N {
                    vol.write(b * BS, &[1u8; 512], false).unwrap();
                }
            }
        })
    };
    let started = std::time::Instant::now();
    for round in 0..40u8 {
        // Whole blocks: 512 bytes as the writer's, then this round's byte.
        let mut block = vec![round + 2; BS as usize];
        block[..512].fill(1);
        for b in 0..N {
            vol.write(b * BS, &block, false).unwrap();
        }
        // Refused inside its commit (@b has a clone) while the writer writes.
        assert!(engine.rollback("tank/v@a", true).is_err());
        let got = read_all_sized(&vol, N * BS);
        for b in 0..N as usize {
            let at = b * BS as usize;
            assert!(
                got[at..at + BS as usize] == block[..],
                "round {round} block {b}: the whole-block write under the partial one was lost"
            );
        }
        if started.elapsed() > std::time::Duration::from_secs(10) {
            break;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    engine.shutdown().unwrap();
}

//! kill -9 under an fsync-heavy load (issue 12): threads write files of
//! random sizes (sparse ones too) with known contents, fsync them, and
//! replace final names atomically (write a temporary file, fsync, rename it
//! over the final name, fsync); one of them kills the engine at a random
//! moment, mid-operation for the others. After the reopen every file whose
//! fsync returned is there whole, and a final name holds the old or the new
//! file whole, never a mix, and never nothing once one was acknowledged.
//! Several rounds on one pool; at the end everything is deleted and the
//! space and the unlinked set are back to empty (no object leaked).
//!
//! `CISTERN_CRASH_ROUNDS=N` rounds (default 10), `CISTERN_CRASH_SEED=K` the
//! first seed (default 1).

use dataset::objects::UNLINKED_SET;
use dataset::*;
use posix::{Cred, FileType, Fs, RenameFlags, SetAttr, ROOT};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const THREADS: usize = 3;
/// Final names each thread replaces atomically.
const FINALS: u64 = 3;
/// The directory cross-directory renames go to.
const SHARED: &str = "shared";
/// Bounds of one round's load (the kill comes first, normally).
const MAX_OPS_PER_THREAD: usize = 400;
const MAX_ROUND_TIME: Duration = Duration::from_secs(6);
/// Acknowledged files kept from one round to the next, at most.
const MAX_FILES: usize = 300;

fn cred() -> Cred {
    Cred {
        uid: 1000,
        gid: 1000,
        groups: Vec::new(),
    }
}

fn config(txg_timeout_secs: f64) -> EngineConfig {
    EngineConfig {
        txg_timeout_secs,
        multihost_interval_ms: 50,
        // Each kill leaks an engine (as a killed process would leave its
        // memory): small caches keep a long soak within memory.
        block_cache_bytes: 8 << 20,
        meta_cache_bytes: 8 << 20,
        log_buffer_bytes: 4 << 20,
        ..EngineConfig::default()
    }
}

/// One version of a file: its inode and what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Version {
    ino: u64,
    key: u64,
    len: usize,
}

/// The known contents of version `key`: pseudo-random bytes; every third
/// key has a hole (zeros never written) in its middle.
fn content(key: u64, len: usize) -> Vec<u8> {
    let mut x = key.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        // splitmix64
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    if let Some((a, b)) = hole(key, len) {
        out[a..b].fill(0);
    }
    out
}

fn hole(key: u64, len: usize) -> Option<(usize, usize)> {
    (key % 3 == 0 && len > 16).then_some((len / 3, len / 2))
}

/// What the threads were told is durable, and what was under way.
#[derive(Default)]
struct Ledger {
    /// Path -> the version an fsync acknowledged (it must be there whole).
    acked: BTreeMap<String, Version>,
    /// Path -> the versions it may hold while a rename or unlink is under
    /// way (`None`: absent).
    inflight: BTreeMap<String, Vec<Option<Version>>>,
    /// Paths whose unlink was acknowledged.
    gone: BTreeSet<String>,
    /// Inodes unlinked while open (never closed): gone after the import.
    open_unlinked: BTreeSet<u64>,
    /// Names all threads rename over: the versions renamed onto each (in
    /// an order the test does not know), and whether one such rename was
    /// acknowledged (then the name is never empty).
    contested: BTreeMap<String, (Vec<Version>, bool)>,
}

struct Round {
    fs: Arc<Fs>,
    engine: Arc<Engine>,
    ledger: Mutex<Ledger>,
    killed: AtomicBool,
    fsyncs: AtomicU64,
    kill_at: u64,
    start: Instant,
    round: u64,
}

impl Round {
    /// Kills the engine once (the first caller), as kill -9 would.
    fn kill(&self, who: usize) {
        if !self.killed.swap(true, Ordering::SeqCst) {
            eprintln!(
                "round {}: thread {who} kills the engine after {} fsyncs",
                self.round,
                self.fsyncs.load(Ordering::SeqCst)
            );
            Engine::forget_as_if_killed(self.engine.clone());
        }
    }

    fn dead(&self) -> bool {
        self.killed.load(Ordering::SeqCst)
    }

    /// An fsync; the thread that makes the `kill_at`-th one kills the
    /// engine right after it (its own op was acknowledged).
    fn fsync(&self, who: usize, ino: u64) -> posix::Result<()> {
        self.fs.fsync(ino)?;
        let n = self.fsyncs.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.kill_at || self.start.elapsed() > MAX_ROUND_TIME {
            self.kill(who);
        }
        Ok(())
    }

    /// Creates `dir/name` and writes version `key` of `len` bytes in pieces
    /// of random sizes in random order (the hole left unwritten, the size
    /// set by a truncate if the end is a hole).
    fn write_file(
        &self,
        rng: &mut StdRng,
        dir: u64,
        name: &str,
        key: u64,
        len: usize,
    ) -> posix::Result<Version> {
        let a = self.fs.create(dir, name.as_bytes(), 0o644, &cred())?;
        let data = content(key, len);
        let mut pieces = Vec::new();
        let mut at = 0;
        while at < len {
            let n = rng.random_range(1..=(64 << 10)).min(len - at);
            pieces.push((at, n));
            at += n;
        }
        // Out of order: later pieces first, sometimes.
        for i in (1..pieces.len()).rev() {
            if rng.random_bool(0.3) {
                pieces.swap(i, rng.random_range(0..=i));
            }
        }
        let hole = hole(key, len);
        for (at, n) in pieces {
            let (mut lo, mut hi) = (at, at + n);
            if let Some((h0, h1)) = hole {
                // The part of the piece outside the hole (at most two parts).
                if lo >= h0 && hi <= h1 {
                    continue;
                }
                if lo < h0 && hi > h1 {
                    self.fs.write(a.ino, lo as u64, &data[lo..h0])?;
                    lo = h1;
                } else if lo >= h0 && lo < h1 {
                    lo = h1;
                } else if hi > h0 && hi <= h1 {
                    hi = h0;
                }
            }
            self.fs.write(a.ino, lo as u64, &data[lo..hi])?;
        }
        if self.fs.getattr(a.ino)?.size < len as u64 {
            self.fs.setattr(
                a.ino,
                &SetAttr {
                    size: Some(len as u64),
                    ..Default::default()
                },
            )?;
        }
        Ok(Version {
            ino: a.ino,
            key,
            len,
        })
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One thread's load: new files, atomic replaces, unlinks; each
    /// recorded as acknowledged only after its fsync returned.
    /// `shared`: the directory every thread's cross-directory renames land in.
    fn worker(&self, t: usize, dir: u64, shared: u64, seed: u64) -> posix::Result<()> {
        let mut rng = StdRng::seed_from_u64(seed);
        let prefix = format!("t{t}");
        for i in 0..MAX_OPS_PER_THREAD {
            if self.dead() {
                return Ok(());
            }
            let key = (self.round << 40) | ((t as u64) << 32) | i as u64;
            let len = match rng.random_range(0..4) {
                0 => rng.random_range(0..100),
                1 => rng.random_range(100..5000),
                _ => rng.random_range(5000..200_000),
            };
            let roll = rng.random_range(0..10);
            if roll < 4 {
                // A new file, fsynced.
                let name = format!("f{}-{i}", self.round);
                let v = self.write_file(&mut rng, dir, &name, key, len)?;
                self.fsync(t, v.ino)?;
                self.ledger().acked.insert(format!("{prefix}/{name}"), v);
            } else if roll < 8 {
                // Write a temporary, fsync, rename over a final name, fsync.
                let name = format!("tmp{}-{i}", self.round);
                let tmp = format!("{prefix}/{name}");
                // The final name is in this thread's directory or, half the
                // time, in the shared one (a rename across directories).
                // A quarter of them go to names every thread renames over.
                let k = rng.random_range(0..FINALS);
                let contested = rng.random_bool(0.25);
                let (fdir, fin) = if contested {
                    (shared, format!("{SHARED}/any{k}"))
                } else if rng.random_bool(0.5) {
                    (dir, format!("{prefix}/final{k}"))
                } else {
                    (shared, format!("{SHARED}/{prefix}-final{k}"))
                };
                let v = self.write_file(&mut rng, dir, &name, key, len)?;
                self.fsync(t, v.ino)?;
                {
                    let mut l = self.ledger();
                    l.inflight.insert(tmp.clone(), vec![Some(v), None]);
                    if contested {
                        l.contested.entry(fin.clone()).or_default().0.push(v);
                    } else {
                        // From now until the next fsync: old or new, each whole.
                        let old = l.acked.remove(&fin);
                        l.inflight.insert(fin.clone(), vec![old, Some(v)]);
                    }
                }
                let final_name = fin.rsplit('/').next().unwrap_or_default();
                self.fs.rename(
                    dir,
                    name.as_bytes(),
                    fdir,
                    final_name.as_bytes(),
                    RenameFlags::default(),
                )?;
                self.fsync(t, dir)?;
                let mut l = self.ledger();
                l.inflight.remove(&tmp);
                l.gone.insert(tmp);
                if contested {
                    l.contested.entry(fin).or_default().1 = true;
                } else {
                    l.inflight.remove(&fin);
                    l.acked.insert(fin, v);
                }
            } else if roll == 9 {
                // Open, unlink, write on, fsync, never close: the kill leaves
                // it in the unlinked set; import must free it.
                let name = format!("scratch{}-{i}", self.round);
                let v = self.write_file(&mut rng, dir, &name, key, len)?;
                self.fs.open(v.ino)?;
                self.fs.unlink(dir, name.as_bytes())?;
                self.fs.write(v.ino, len as u64, b"still open")?;
                self.fsync(t, v.ino)?;
                let mut l = self.ledger();
                l.gone.insert(format!("{prefix}/{name}"));
                l.open_unlinked.insert(v.ino);
            } else {
                // Unlink an acknowledged file of this thread.
                let victim = {
                    let l = self.ledger();
                    let mine: Vec<(String, Version)> = l
                        .acked
                        .iter()
                        .filter(|(p, _)| {
                            p.starts_with(&format!("{prefix}/f")) && !p.contains("/final")
                        })
                        .map(|(p, v)| (p.clone(), *v))
                        .collect();
                    (!mine.is_empty()).then(|| mine[rng.random_range(0..mine.len())].clone())
                };
                let Some((path, v)) = victim else { continue };
                {
                    let mut l = self.ledger();
                    l.acked.remove(&path);
                    l.inflight.insert(path.clone(), vec![Some(v), None]);
                }
                let name = path.rsplit('/').next().unwrap_or_default();
                self.fs.unlink(dir, name.as_bytes())?;
                self.fsync(t, dir)?;
                let mut l = self.ledger();
                l.inflight.remove(&path);
                l.gone.insert(path);
            }
        }
        Ok(())
    }
}

fn open_fs(engine: &Engine) -> Fs {
    Fs::new(engine.open_objects("tank/fs").unwrap()).unwrap()
}

fn prop(engine: &Engine, ds: &str, name: &str) -> u64 {
    engine
        .dataset(ds)
        .unwrap()
        .property(name)
        .unwrap()
        .parsable
        .parse()
        .unwrap()
}

/// `path` holds `v` whole (same inode, same bytes, same size).
fn holds(fs: &Fs, dirs: &BTreeMap<String, u64>, path: &str, v: Option<Version>) -> bool {
    let (d, name) = path.split_once('/').unwrap();
    let got = fs.lookup(dirs[d], name.as_bytes());
    match (got, v) {
        (Err(e), None) => e.errno == libc::ENOENT,
        (Ok(a), Some(v)) => {
            a.ino == v.ino
                && a.kind == FileType::Regular
                && a.size == v.len as u64
                && fs.read(a.ino, 0, v.len as u32 + 1).unwrap() == content(v.key, v.len)
        }
        _ => false,
    }
}

/// Checks the ledger against the reopened filesystem.
fn verify(fs: &Fs, dirs: &BTreeMap<String, u64>, ledger: &Ledger, round: u64) {
    for (path, v) in &ledger.acked {
        assert!(
            holds(fs, dirs, path, Some(*v)),
            "round {round}: acknowledged {path} ({v:?}) is not there whole: {:?}",
            fs.lookup(
                dirs[path.split('/').next().unwrap()],
                path.rsplit('/').next().unwrap().as_bytes()
            )
        );
    }
    for (path, may) in &ledger.inflight {
        assert!(
            may.iter().any(|v| holds(fs, dirs, path, *v)),
            "round {round}: {path} holds none of {may:?} whole (a torn rename or unlink)"
        );
    }
    for (path, (versions, acked)) in &ledger.contested {
        let whole = versions.iter().any(|v| holds(fs, dirs, path, Some(*v)));
        assert!(
            whole || (!acked && holds(fs, dirs, path, None)),
            "round {round}: {path} holds none of the {} versions renamed onto it whole \
             (acknowledged: {acked})",
            versions.len()
        );
    }
    for path in &ledger.gone {
        if ledger.acked.contains_key(path) || ledger.inflight.contains_key(path) {
            continue; // the name was used again
        }
        assert!(
            holds(fs, dirs, path, None),
            "round {round}: {path} was unlinked or renamed away (acknowledged) but is back"
        );
    }
    let unlinked = fs.objects().list(UNLINKED_SET, "", None, 100).unwrap();
    assert!(
        unlinked.is_empty(),
        "round {round}: import left the unlinked set with {unlinked:?}"
    );
    for ino in &ledger.open_unlinked {
        let r = fs.getattr(*ino);
        assert!(
            r.as_ref().is_err_and(|e| e.errno == libc::ENOENT),
            "round {round}: open-unlinked inode {ino} outlived the import: {r:?}"
        );
    }
}

fn run(dir: &Path, first_seed: u64, rounds: u64) {
    let state = dir.join("state");
    let engine = Engine::open(&state, config(3600.0)).unwrap();
    engine
        .create_pool(PoolSpec {
            name: "tank".into(),
            groups: vec![GroupSpec {
                kind: GroupKind::Mirror,
                devices: vec![dir.join("d0"), dir.join("d1")],
            }],
            create_size: Some(512 << 20),
            force: false,
        })
        .unwrap();
    engine
        .create_dataset("tank/fs", DatasetKind::Filesystem, &[])
        .unwrap();
    let fs = open_fs(&engine);
    let mut dirs = BTreeMap::new();
    for name in (0..THREADS)
        .map(|t| format!("t{t}"))
        .chain([SHARED.to_string()])
    {
        let d = fs.mkdir(ROOT, name.as_bytes(), 0o755, &cred()).unwrap();
        dirs.insert(name, d.ino);
    }
    fs.fsync(ROOT).unwrap();
    drop(fs);
    let mut engine = engine;
    let mut ledger = Ledger::default();
    for round in 0..rounds {
        let seed = first_seed + round;
        let mut rng = StdRng::seed_from_u64(seed);
        let r = Round {
            fs: Arc::new(open_fs(&engine)),
            engine: engine.clone(),
            ledger: Mutex::new(std::mem::take(&mut ledger)),
            killed: AtomicBool::new(false),
            fsyncs: AtomicU64::new(0),
            kill_at: rng.random_range(5..150),
            start: Instant::now(),
            round,
        };
        std::thread::scope(|s| {
            let r = &r;
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let dir = dirs[&format!("t{t}")];
                    let seed = seed * 1000 + t as u64;
                    let shared = dirs[SHARED];
                    s.spawn(move || {
                        let res = r.worker(t, dir, shared, seed);
                        if let Err(e) = &res {
                            // Failing is only fine once the engine is dead.
                            assert!(
                                r.dead(),
                                "round {round}: thread {t} failed before the kill: {e}"
                            );
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
        });
        // Every thread ran out of work before the kill came: kill now.
        r.kill(THREADS);
        ledger = r.ledger.into_inner().unwrap_or_else(|e| e.into_inner());
        eprintln!(
            "round {round} (seed {seed}): {} fsyncs, {} files acknowledged, {} under way",
            r.fsyncs.load(Ordering::SeqCst),
            ledger.acked.len(),
            ledger.inflight.len()
        );
        drop(r.fs);
        drop(r.engine);
        // Odd rounds also commit txgs in the background: replay starts
        // from a later txg then.
        let timeout = if round % 2 == 1 { 0.05 } else { 3600.0 };
        engine = Engine::open(&state, config(timeout)).unwrap();
        let fs = open_fs(&engine);
        verify(&fs, &dirs, &ledger, round);
        // What was under way is settled now: whatever the name holds.
        for (path, (versions, acked)) in ledger.contested.iter_mut() {
            let now = versions
                .iter()
                .copied()
                .find(|v| holds(&fs, &dirs, path, Some(*v)));
            *versions = now.into_iter().collect();
            *acked = now.is_some();
        }
        let inflight = std::mem::take(&mut ledger.inflight);
        for (path, may) in inflight {
            if let Some(v) = may
                .into_iter()
                .find(|v| holds(&fs, &dirs, &path, *v))
                .flatten()
            {
                ledger.acked.insert(path, v);
            }
        }
        // Bounded: beyond MAX_FILES acknowledged files, some go (unlinked
        // and fsynced: they must stay gone).
        let excess = ledger.acked.len().saturating_sub(MAX_FILES);
        let old: Vec<(String, Version)> = ledger
            .acked
            .iter()
            .map(|(p, v)| (p.clone(), *v))
            .filter(|(p, _)| !p.contains("final"))
            .take(excess)
            .collect();
        for (path, _) in old {
            let (d, name) = path.split_once('/').unwrap();
            fs.unlink(dirs[d], name.as_bytes()).unwrap();
            ledger.acked.remove(&path);
            ledger.gone.insert(path);
        }
        fs.fsync(ROOT).unwrap();
    }
    // Delete everything: space and the unlinked set come back to empty.
    let fs = open_fs(&engine);
    for (name, d) in &dirs {
        loop {
            let entries = fs.readdir(*d, 0, 1000).unwrap();
            let names: Vec<Vec<u8>> = entries
                .into_iter()
                .map(|e| e.name)
                .filter(|n| n != b"." && n != b"..")
                .collect();
            if names.is_empty() {
                break;
            }
            for n in names {
                fs.unlink(*d, &n).unwrap();
            }
        }
        fs.rmdir(ROOT, name.as_bytes()).unwrap();
    }
    engine.sync_all().unwrap();
    let check_empty = |engine: &Engine, fs: &Fs, when: &str| {
        for p in ["used", "referenced", "usedbysnapshots", "written"] {
            assert_eq!(prop(engine, "tank/fs", p), 0, "{when}: tank/fs {p}");
        }
        assert_eq!(engine.stats()[0].allocated, 0, "{when}: pool allocated");
        assert_eq!(
            fs.readdir(ROOT, 0, 10).unwrap().len(),
            2,
            "{when}: only . and .."
        );
        let unlinked = fs.objects().list(UNLINKED_SET, "", None, 100).unwrap();
        assert!(unlinked.is_empty(), "{when}: unlinked set {unlinked:?}");
    };
    check_empty(&engine, &fs, "everything deleted");
    drop(fs);
    engine.shutdown().unwrap();
    drop(engine);
    let engine = Engine::open(&state, config(3600.0)).unwrap();
    let fs = open_fs(&engine);
    check_empty(&engine, &fs, "everything deleted, after a restart");
    drop(fs);
    engine.shutdown().unwrap();
}

#[test]
fn fsynced_files_survive_kill_9_whole_and_renames_are_atomic() {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let rounds = env("CISTERN_CRASH_ROUNDS").unwrap_or(10);
    let seed = env("CISTERN_CRASH_SEED").unwrap_or(1);
    let dir = tempfile::tempdir().unwrap();
    eprintln!("crash test: seed {seed}, {rounds} rounds");
    run(dir.path(), seed, rounds);
}

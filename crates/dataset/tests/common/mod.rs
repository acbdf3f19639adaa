//! Helpers shared by the dataset crate's integration tests.

use dataset::*;
use std::path::Path;

/// Commits happen when the test (or an admin command) asks.
pub fn config() -> EngineConfig {
    EngineConfig {
        txg_timeout_secs: 3600.0,
        multihost_interval_ms: 50,
        ..EngineConfig::default()
    }
}

/// Pool `tank`: a mirror of two 256 MiB files in `dir`.
pub fn create_pool(engine: &Engine, dir: &Path) {
    engine
        .create_pool(PoolSpec {
            name: "tank".into(),
            groups: vec![GroupSpec {
                kind: GroupKind::Mirror,
                devices: vec![dir.join("d0"), dir.join("d1")],
            }],
            create_size: Some(256 << 20),
            force: false,
        })
        .unwrap();
}

/// An engine in `dir` with pool `pool` on one 256 MiB file (the two
/// daemons' pools of the send tests).
pub fn single_disk_engine(dir: &Path, pool: &str) -> std::sync::Arc<Engine> {
    single_disk_engine_with(dir, pool, config())
}

/// [`single_disk_engine`] with engine configuration `cfg`.
pub fn single_disk_engine_with(
    dir: &Path,
    pool: &str,
    cfg: EngineConfig,
) -> std::sync::Arc<Engine> {
    let e = Engine::open(&dir.join(format!("state-{pool}")), cfg).unwrap();
    e.create_pool(PoolSpec {
        name: pool.into(),
        groups: vec![GroupSpec {
            kind: GroupKind::Disk,
            devices: vec![dir.join(format!("{pool}-d0"))],
        }],
        create_size: Some(256 << 20),
        force: false,
    })
    .unwrap();
    e
}

/// A numeric property of a dataset or snapshot, parsed from its `-p` form.
pub fn prop(engine: &Engine, ds: &str, name: &str) -> u64 {
    engine
        .dataset(ds)
        .unwrap()
        .property(name)
        .unwrap_or_else(|| panic!("{ds} has no {name}"))
        .parsable
        .parse()
        .unwrap()
}

// ------------------------------------------------------------ lineage model

use std::collections::{BTreeMap, BTreeSet};

/// What a model's dataset or snapshot holds, as far as space goes: the
/// block versions (tokens) it references.
pub trait Tokens: Clone {
    fn tokens(&self) -> BTreeSet<u64>;
}

pub struct Snap<I> {
    pub dataset: String,
    pub image: I,
    pub clones: BTreeSet<String>,
    /// Token counter when it was taken (for `written`).
    pub seq: u64,
    /// Creation order (several snapshots can share a `seq`).
    pub order: u64,
}

/// The part of a model that snapshots, clones, rollback, destroy and
/// promote change, the same for every kind of dataset: heads and snapshots
/// (each an image `I`), origins, and which dataset's write made each block
/// version (token) and what it allocates.
pub struct History<I> {
    pub next: u64,
    /// Token -> (the dataset whose write made it, allocated bytes).
    pub versions: BTreeMap<u64, (String, u64)>,
    pub heads: BTreeMap<String, I>,
    pub snaps: BTreeMap<String, Snap<I>>,
    /// Clone -> its origin snapshot.
    pub origin: BTreeMap<String, String>,
    /// Clone -> token counter when it was made (for `written`).
    pub born: BTreeMap<String, u64>,
    next_order: u64,
}

impl<I: Tokens> History<I> {
    pub fn new() -> Self {
        History {
            next: 0,
            versions: BTreeMap::new(),
            heads: BTreeMap::new(),
            snaps: BTreeMap::new(),
            origin: BTreeMap::new(),
            born: BTreeMap::new(),
            next_order: 0,
        }
    }

    /// A new block version written by `ds` that allocates `asize` bytes.
    pub fn token(&mut self, ds: &str, asize: u64) -> u64 {
        self.next += 1;
        self.versions.insert(self.next, (ds.to_string(), asize));
        self.next
    }

    pub fn asize(&self, tokens: impl IntoIterator<Item = u64>) -> u64 {
        tokens.into_iter().map(|t| self.versions[&t].1).sum()
    }

    fn owned_by(&self, t: u64, ds: &str) -> bool {
        self.versions[&t].0 == ds
    }

    /// Snapshots of `ds`, oldest first.
    pub fn snaps_of(&self, ds: &str) -> Vec<String> {
        let mut v: Vec<(u64, &String)> = self
            .snaps
            .iter()
            .filter(|(_, s)| s.dataset == ds)
            .map(|(n, s)| (s.order, n))
            .collect();
        v.sort();
        v.into_iter().map(|(_, n)| n.clone()).collect()
    }

    /// Every token some head or snapshot references (what the pool allocates).
    pub fn referenced(&self) -> BTreeSet<u64> {
        let mut all = BTreeSet::new();
        for i in self.heads.values() {
            all.extend(i.tokens());
        }
        for s in self.snaps.values() {
            all.extend(s.image.tokens());
        }
        all
    }

    /// Bytes only snapshot `snap` references (what destroying it frees).
    pub fn unique_bytes(&self, snap: &str) -> u64 {
        let mut others = BTreeSet::new();
        for i in self.heads.values() {
            others.extend(i.tokens());
        }
        for (n, s) in &self.snaps {
            if n != snap {
                others.extend(s.image.tokens());
            }
        }
        let mine = self.snaps[snap].image.tokens();
        self.asize(mine.difference(&others).copied())
    }

    /// `usedbydataset` of head `ds`: its own live versions.
    pub fn own_live(&self, ds: &str) -> u64 {
        let live = self.heads[ds].tokens();
        self.asize(live.into_iter().filter(|t| self.owned_by(*t, ds)))
    }

    /// `usedbysnapshots` of head `ds`: its own versions only its snapshots hold.
    pub fn held(&self, ds: &str) -> u64 {
        let live = self.heads[ds].tokens();
        let mut held = BTreeSet::new();
        for s in self.snaps_of(ds) {
            held.extend(
                self.snaps[&s]
                    .image
                    .tokens()
                    .into_iter()
                    .filter(|t| self.owned_by(*t, ds) && !live.contains(t)),
            );
        }
        self.asize(held)
    }

    /// `written` of head `ds` (`snap` None) or of its snapshot `snap`: its
    /// own versions born after the snapshot before (or the clone's birth).
    pub fn written(&self, ds: &str, snap: Option<&str>) -> u64 {
        let order = self.snaps_of(ds);
        let before: Vec<&String> = match snap {
            Some(s) => order.iter().take_while(|n| n.as_str() != s).collect(),
            None => order.iter().collect(),
        };
        let since = before
            .last()
            .map(|s| self.snaps[*s].seq)
            .or_else(|| self.born.get(ds).copied())
            .unwrap_or(0);
        let image = match snap {
            Some(s) => &self.snaps[s].image,
            None => &self.heads[ds],
        };
        self.asize(
            image
                .tokens()
                .into_iter()
                .filter(|t| *t > since && self.owned_by(*t, ds)),
        )
    }

    // -------------------------------------------------- engine and model together

    pub fn snapshot(&mut self, engine: &Engine, ds: &str, name: &str) {
        let full = format!("{ds}@{name}");
        let created = engine.snapshot(std::slice::from_ref(&full), false).unwrap();
        assert_eq!(created, vec![full.clone()]);
        self.next_order += 1;
        let image = self.heads[ds].clone();
        self.snaps.insert(
            full,
            Snap {
                dataset: ds.to_string(),
                image,
                clones: BTreeSet::new(),
                seq: self.next,
                order: self.next_order,
            },
        );
    }

    pub fn clone(&mut self, engine: &Engine, snap: &str, name: &str, props: &[(String, String)]) {
        engine.clone_snapshot(snap, name, props).unwrap();
        let image = self.snaps[snap].image.clone();
        self.heads.insert(name.to_string(), image);
        self.origin.insert(name.to_string(), snap.to_string());
        self.born.insert(name.to_string(), self.next);
        self.snaps
            .get_mut(snap)
            .unwrap()
            .clones
            .insert(name.to_string());
    }

    /// `rollback -r`: refused while a later snapshot has clones.
    pub fn rollback(&mut self, engine: &Engine, snap: &str) {
        let ds = self.snaps[snap].dataset.clone();
        let order = self.snaps_of(&ds);
        let pos = order.iter().position(|n| n == snap).unwrap();
        let later: Vec<String> = order[pos + 1..].to_vec();
        let blocked = later.iter().any(|l| !self.snaps[l].clones.is_empty());
        let result = engine.rollback(snap, true);
        if blocked {
            assert!(
                matches!(result, Err(Error::Busy(_))),
                "rollback past a snapshot with clones: {result:?}"
            );
            return;
        }
        assert_eq!(result.unwrap(), later);
        for l in later {
            self.snaps.remove(&l);
        }
        let image = self.snaps[snap].image.clone();
        self.heads.insert(ds, image);
    }

    /// Destroys `snap` (refused if it has clones); frees exactly its
    /// unique bytes. `dry_run`: a `-n` first must say so too (exact only
    /// when nothing is waiting in the open txg: it reads the dead lists).
    pub fn destroy_snapshot(&mut self, engine: &Engine, snap: &str, dry_run: bool) {
        let opts = DestroyOptions::default();
        if !self.snaps[snap].clones.is_empty() {
            let r = engine.destroy(snap, &opts);
            assert!(matches!(r, Err(Error::Busy(_))), "{r:?}");
            return;
        }
        let predicted = self.unique_bytes(snap);
        if dry_run {
            let dry = DestroyOptions {
                dry_run: true,
                ..opts.clone()
            };
            let estimate = engine.destroy(snap, &dry).unwrap();
            assert_eq!(estimate.freed, predicted, "dry run of destroying {snap}");
        }
        let report = engine.destroy(snap, &opts).unwrap();
        assert_eq!(report.freed, predicted, "destroying {snap}");
        self.snaps.remove(snap);
    }

    /// `destroy -r` of a clone (refused while its snapshots have clones);
    /// whether it went.
    pub fn destroy_clone(&mut self, engine: &Engine, ds: &str) -> bool {
        let snaps = self.snaps_of(ds);
        let blocked = snaps.iter().any(|s| !self.snaps[s].clones.is_empty());
        let result = engine.destroy(
            ds,
            &DestroyOptions {
                recursive: true,
                ..Default::default()
            },
        );
        if blocked {
            assert!(matches!(result, Err(Error::Busy(_))), "{result:?}");
            return false;
        }
        result.unwrap();
        for s in snaps {
            self.snaps.remove(&s);
        }
        self.heads.remove(ds);
        if let Some(origin) = self.origin.remove(ds) {
            if let Some(s) = self.snaps.get_mut(&origin) {
                s.clones.remove(ds);
            }
        }
        true
    }

    /// `promote c`: c takes over its origin's snapshots up to the origin
    /// snapshot (renamed c@...) and the versions they hold.
    pub fn promote(&mut self, engine: &Engine, c: &str) {
        engine.promote(c).unwrap();
        let s_name = self.origin[c].clone();
        let o = self.snaps[&s_name].dataset.clone();
        let s_seq = self.snaps[&s_name].seq;
        let s_order = self.snaps[&s_name].order;
        let moving: Vec<String> = self
            .snaps
            .iter()
            .filter(|(_, s)| s.dataset == o && s.order <= s_order)
            .map(|(n, _)| n.clone())
            .collect();
        let mut renamed = BTreeMap::new();
        for n in moving {
            let mut snap = self.snaps.remove(&n).unwrap();
            snap.dataset = c.to_string();
            let new = format!("{c}@{}", n.split_once('@').unwrap().1);
            renamed.insert(n, new.clone());
            self.snaps.insert(new, snap);
        }
        for (t, (owner, _)) in self.versions.iter_mut() {
            if *owner == o && *t <= s_seq {
                *owner = c.to_string();
            }
        }
        let new_s = renamed[&s_name].clone();
        self.origin.remove(c);
        match self.origin.remove(&o) {
            // o was a clone: c's history (and `written`) now starts where o's did.
            Some(x) => {
                self.origin.insert(c.to_string(), x);
                if let Some(b) = self.born.get(&o).copied() {
                    self.born.insert(c.to_string(), b);
                }
            }
            None => {
                self.born.remove(c);
            }
        }
        self.origin.insert(o.clone(), new_s);
        self.born.insert(o, s_seq);
        for v in self.origin.values_mut() {
            if let Some(n) = renamed.get(v) {
                *v = n.clone();
            }
        }
        // Clone sets follow the origins.
        for s in self.snaps.values_mut() {
            s.clones.clear();
        }
        let pairs: Vec<(String, String)> = self
            .origin
            .iter()
            .map(|(d, s)| (d.clone(), s.clone()))
            .collect();
        for (d, s) in pairs {
            if let Some(snap) = self.snaps.get_mut(&s) {
                snap.clones.insert(d);
            }
        }
    }
}

/// `len` bytes of a volume from `offset`, holes as zeros; the volume must
/// return exactly that many.
pub fn read_range(vol: &Volume, offset: u64, len: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for seg in vol.read(offset, len).unwrap() {
        match seg {
            ReadSegment::Data(d) => out.extend_from_slice(&d),
            ReadSegment::Hole(n) => out.resize(out.len() + n as usize, 0),
        }
    }
    assert_eq!(out.len() as u64, len);
    out
}

/// Checkpoints every 2 MiB of received rows (half of dirty_max_bytes).
pub fn small_txgs() -> EngineConfig {
    EngineConfig {
        dirty_max_bytes: 4 << 20,
        ..config()
    }
}

/// A reader that hands out `limit` bytes of `data`, says so, then blocks
/// until the test ends (the receiving engine is "killed" meanwhile).
pub struct Stall {
    pub data: Vec<u8>,
    pub at: usize,
    pub limit: usize,
    pub reached: Option<std::sync::mpsc::Sender<()>>,
}

impl std::io::Read for Stall {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.at >= self.limit {
            if let Some(tx) = self.reached.take() {
                let _ = tx.send(());
            }
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
        let n = out.len().min(self.limit - self.at);
        out[..n].copy_from_slice(&self.data[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Fills bytes [0, end) of `v` with random MiBs from `rng`.
pub fn fill_random(v: &Volume, rng: &mut rand::rngs::StdRng, end: u64) {
    use rand::Rng;
    for off in (0..end).step_by(1 << 20) {
        let mut data = vec![0u8; 1 << 20];
        rng.fill(&mut data[..]);
        v.write(off, &data, false).unwrap();
    }
}

/// `send -t TOKEN` into `target` with -s.
pub fn resume(
    src: &Engine,
    dst: &Engine,
    token: String,
    target: &str,
) -> (Vec<u8>, ReceiveSummary) {
    let mut rest = Vec::new();
    src.send(
        &SendOptions {
            resume_token: Some(token),
            ..Default::default()
        },
        &mut rest,
    )
    .unwrap();
    let mut inp = rest.as_slice();
    let got = dst
        .receive(
            &ReceiveOptions {
                target: target.into(),
                resumable: true,
                ..Default::default()
            },
            &mut inp,
        )
        .unwrap();
    (rest, got)
}

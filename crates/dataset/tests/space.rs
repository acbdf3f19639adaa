//! Space accounting on real files (decision 0011): reservations, quotas,
//! writes refused with ENOSPC before they are accepted, and a full pool that
//! can always be freed.

use dataset::*;
use rand::{Rng, SeedableRng};
use std::path::Path;

const M: u64 = 1 << 20;

fn engine(dir: &Path) -> std::sync::Arc<Engine> {
    let config = EngineConfig {
        txg_timeout_secs: 3600.0,
        ..EngineConfig::default()
    };
    let engine = Engine::open(&dir.join("state"), config).unwrap();
    engine
        .create_pool(PoolSpec {
            name: "tank".into(),
            groups: vec![GroupSpec {
                kind: GroupKind::Disk,
                devices: vec![dir.join("d0")],
            }],
            create_size: Some(256 * M),
            force: false,
        })
        .unwrap();
    engine
}

fn prop(engine: &Engine, ds: &str, name: &str) -> u64 {
    let info = engine.dataset(ds).unwrap();
    info.property(name).unwrap().parsable.parse().unwrap()
}

fn sparse() -> Vec<(String, String)> {
    vec![
        ("refreservation".into(), "none".into()),
        ("compression".into(), "off".into()),
    ]
}

fn random(len: u64, seed: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random()).collect()
}

/// Writes 1 MiB chunks from `from` until the engine refuses one; returns
/// the offset reached. Each accepted chunk is kept in `written`.
fn fill(vol: &Volume, from: u64, end: u64, seed: u64) -> (u64, Result<()>) {
    let mut at = from;
    while at < end {
        let chunk = random(M, seed + at / M);
        if let Err(e) = vol.write(at, &chunk, false) {
            return (at, Err(e));
        }
        at += M;
    }
    (at, Ok(()))
}

#[test]
fn volumes_reserve_their_size_unless_sparse() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let avail = prop(&e, "tank", "available");
    assert!(avail > 200 * M && avail < 256 * M, "{avail}");
    // Larger than the pool: refused with zfs's words, nothing created.
    let err = e.create_volume("tank/big", 1 << 40, &[]).unwrap_err();
    assert!(matches!(err, Error::NoSpace(_)), "{err}");
    assert!(
        err.to_string()
            .starts_with("cannot create 'tank/big': out of space"),
        "{err}"
    );
    assert!(e.dataset("tank/big").is_err());
    e.create_volume("tank/big", 1 << 40, &sparse()).unwrap();
    assert_eq!(prop(&e, "tank/big", "refreservation"), 0);
    // A thick volume takes its size from everyone else's available at once.
    e.create_volume("tank/thick", 64 * M, &[]).unwrap();
    assert_eq!(prop(&e, "tank/thick", "refreservation"), 64 * M);
    assert_eq!(prop(&e, "tank/thick", "usedbyrefreservation"), 64 * M);
    assert_eq!(prop(&e, "tank/thick", "used"), 64 * M);
    assert_eq!(prop(&e, "tank", "available"), avail - 64 * M);
    assert_eq!(prop(&e, "tank/big", "available"), avail - 64 * M);
    assert_eq!(prop(&e, "tank/thick", "available"), avail);
    // Growing it grows the reservation, if the pool has the room.
    let err = e.set_property("tank/thick", "volsize", "1T").unwrap_err();
    assert!(
        err.to_string()
            .contains("size is greater than available space"),
        "{err}"
    );
    assert_eq!(prop(&e, "tank/thick", "volsize"), 64 * M);
    e.set_property("tank/thick", "volsize", "96M").unwrap();
    assert_eq!(prop(&e, "tank/thick", "refreservation"), 96 * M);
    assert_eq!(prop(&e, "tank", "available"), avail - 96 * M);
    // Written data consumes the reservation, not the pool.
    let vol = e.open_volume("tank/thick").unwrap();
    vol.write(0, &random(8 * M, 1), false).unwrap();
    e.sync_all().unwrap();
    assert_eq!(prop(&e, "tank/thick", "usedbyrefreservation"), 88 * M);
    assert_eq!(prop(&e, "tank/thick", "used"), 96 * M);
    assert_eq!(prop(&e, "tank", "available"), avail - 96 * M);
    // Limits are checked like zfs's.
    let err = e.set_property("tank/thick", "refquota", "4M").unwrap_err();
    assert!(err.to_string().contains("less than current used"), "{err}");
    let err = e.set_property("tank/big", "reservation", "1T").unwrap_err();
    assert!(err.to_string().contains("greater than available"), "{err}");
    e.set_property("tank/thick", "refreservation", "none")
        .unwrap();
    assert_eq!(prop(&e, "tank", "available"), avail - 8 * M);
    e.set_property("tank/thick", "refreservation", "auto")
        .unwrap();
    assert_eq!(prop(&e, "tank/thick", "refreservation"), 96 * M);
    // Clones are sparse unless asked; a reserved clone must fit.
    e.snapshot(&["tank/thick@s".into()], false).unwrap();
    e.clone_snapshot("tank/thick@s", "tank/c1", &[]).unwrap();
    assert_eq!(prop(&e, "tank/c1", "refreservation"), 0);
    let auto = [("refreservation".to_string(), "auto".to_string())];
    e.clone_snapshot("tank/thick@s", "tank/c2", &auto).unwrap();
    assert_eq!(prop(&e, "tank/c2", "refreservation"), 96 * M);
    let err = e
        .clone_snapshot("tank/thick@s", "tank/c3", &auto)
        .unwrap_err();
    assert!(err.to_string().contains("out of space"), "{err}");
}

#[test]
fn a_full_pool_refuses_writes_before_accepting_them_and_can_always_be_freed() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    e.create_volume(
        "tank/thick",
        32 * M,
        &[("compression".into(), "off".into())],
    )
    .unwrap();
    e.create_volume("tank/thin", 1 << 30, &sparse()).unwrap();
    let thin = e.open_volume("tank/thin").unwrap();
    let (reached, r) = fill(&thin, 0, 1 << 30, 10);
    let err = r.unwrap_err();
    assert!(
        matches!(&err, Error::NoSpace(m) if m.contains("out of space")),
        "{err}"
    );
    let size = e.stats()[0].size;
    let slop = dataset::space::slop(size);
    // Everything but the thick volume's reservation and the slop went to the thin one.
    assert!(prop(&e, "tank/thin", "available") < M);
    assert!(
        reached + 32 * M + slop + 2 * M >= size,
        "{reached} of {size}"
    );
    e.sync_all().unwrap();
    let free = size - e.stats()[0].allocated;
    assert!(
        free >= slop,
        "ordinary writes ate into the slop: {free} < {slop}"
    );
    // The thick volume still gets all it was promised, and can rewrite it.
    let thick = e.open_volume("tank/thick").unwrap();
    for round in 0..3 {
        // Committed between rounds: overwriting a volume that holds all its
        // reservation needs the room for the copy until the old one is freed.
        for at in (0..32 * M).step_by(4 << 20) {
            thick
                .write(at, &random(4 * M, round * 100 + at), false)
                .unwrap();
        }
        e.sync_all().unwrap();
    }
    // Trim, zeroing, snapshot destroy, rollback, destroy all succeed while full.
    e.snapshot(&["tank/thin@full".into()], false).unwrap();
    thin.trim(0, 8 * M, false).unwrap();
    thin.write_zeroes(8 * M, 8 * M, false, false).unwrap();
    thin.write_zeroes(16 * M + 512, 4096, true, true).unwrap(); // a partial block
    e.sync_all().unwrap();
    assert!(matches!(
        thin.write(0, &random(M, 99), false),
        Err(Error::NoSpace(_))
    ));
    e.rollback("tank/thin@full", false).unwrap();
    e.destroy("tank/thin@full", &DestroyOptions::default())
        .unwrap();
    thin.trim(0, 64 * M, false).unwrap();
    e.sync_all().unwrap();
    // Writes resume where space was freed; nothing accepted was lost.
    thin.write(0, &random(M, 5), false).unwrap();
    e.sync_all().unwrap();
    assert_eq!(
        thin.read(0, M).unwrap(),
        vec![ReadSegment::Data(random(M, 5))]
    );
    let keep = reached - M;
    assert_eq!(
        thin.read(keep, M).unwrap(),
        vec![ReadSegment::Data(random(M, 10 + keep / M))]
    );
    e.destroy("tank/thin", &DestroyOptions::default()).unwrap();
    assert_eq!(prop(&e, "tank", "used"), 32 * M);
}

#[test]
fn quotas_refuse_writes_with_edquot() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    e.create_volume("tank/q", 64 * M, &sparse()).unwrap();
    e.set_property("tank/q", "refquota", "8M").unwrap();
    let vol = e.open_volume("tank/q").unwrap();
    let (reached, r) = fill(&vol, 0, 64 * M, 0);
    let err = r.unwrap_err();
    assert!(err.to_string().contains("quota"), "{err}");
    assert_eq!(reached, 8 * M, "a refquota admits exactly its size");
    assert_eq!(prop(&e, "tank/q", "available"), 0);
    // A snapshot keeps the data: refquota counts only referenced data, quota all of it.
    e.snapshot(&["tank/q@a".into()], false).unwrap();
    vol.trim(0, 4 * M, false).unwrap();
    e.sync_all().unwrap();
    vol.write(0, &random(4 * M, 1), false).unwrap();
    e.set_property("tank/q", "refquota", "none").unwrap();
    e.sync_all().unwrap();
    e.set_property("tank/q", "quota", "16M").unwrap();
    let (reached, r) = fill(&vol, 8 * M, 64 * M, 0);
    assert!(r.unwrap_err().to_string().contains("quota of 'tank/q'"));
    assert_eq!(
        reached,
        12 * M,
        "8M referenced + 4M held by the snapshot + 4M more"
    );
    // TRIM is never refused by a quota.
    vol.trim(0, 64 * M, false).unwrap();
}

#[test]
fn concurrent_writers_cannot_spend_the_same_space() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let size = e.stats()[0].size;
    let slop = dataset::space::slop(size);
    let names: Vec<String> = (0..4).map(|i| format!("tank/w{i}")).collect();
    for n in &names {
        e.create_volume(n, 1 << 30, &sparse()).unwrap();
    }
    // Four writers race for the last of the pool; each stops at its first ENOSPC.
    let accepted: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let vol = e.open_volume(n).unwrap();
                s.spawn(move || fill(&vol, 0, 1 << 30, 1000 * i as u64).0)
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    e.sync_all().unwrap();
    let allocated = e.stats()[0].allocated;
    assert_eq!(allocated, accepted, "every accepted byte was placed");
    assert!(
        size - allocated >= slop,
        "writers together ate into the slop"
    );
    assert!(
        size - allocated < slop + 4 * M,
        "{} left beyond the slop",
        size - allocated - slop
    );
}

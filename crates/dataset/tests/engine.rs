//! End-to-end tests of the engine on real files: pools, volumes, the txg
//! commit, intent-log replay, space accounting.

use dataset::*;
#[allow(dead_code)] // each test binary uses a part of the shared helpers
mod common;
use common::{create_pool, read_range};
use rand::{Rng, SeedableRng};
use std::sync::Arc;

fn config(txg_secs: f64) -> EngineConfig {
    EngineConfig {
        txg_timeout_secs: txg_secs,
        // Each import waits one interval for its claim (decision 0010).
        multihost_interval_ms: 50,
        ..EngineConfig::default()
    }
}

/// Compares without printing megabytes: names the first differing byte.
#[track_caller]
fn same(got: &[u8], want: &[u8], ctx: &str) {
    assert_eq!(got.len(), want.len(), "{ctx}: lengths");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{ctx}: first difference at byte {i}: got {} want {}",
            got[i], want[i]
        );
    }
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

#[test]
fn volume_io_survives_restart_and_matches_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut model = vec![0u8; 8 << 20];
    {
        let engine = Engine::open(&state, config(0.2)).unwrap();
        create_pool(&engine, dir.path());
        engine
            .create_volume(
                "tank/vol",
                8 << 20,
                &[("compression".into(), "zstd".into())],
            )
            .unwrap();
        let vol = engine.open_volume("tank/vol").unwrap();
        assert_eq!(vol.size(), 8 << 20);
        same(&read_range(&vol, 0, 8 << 20), &model, "whole volume");
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for i in 0..300 {
            let off = rng.random_range(0..(8u64 << 20) - 70000);
            let len = rng.random_range(1..70000u64);
            match i % 5 {
                0 => {
                    vol.trim(off, len, false).unwrap();
                    model[off as usize..(off + len) as usize].fill(0);
                }
                1 => {
                    vol.write_zeroes(off, len, true, false).unwrap();
                    model[off as usize..(off + len) as usize].fill(0);
                }
                _ => {
                    let data: Vec<u8> = (0..len)
                        .map(|j| ((j / 7) as u8).wrapping_add(i as u8))
                        .collect();
                    vol.write(off, &data, i % 7 == 0).unwrap();
                    model[off as usize..(off + len) as usize].copy_from_slice(&data);
                }
            }
            if i % 50 == 0 {
                std::thread::sleep(std::time::Duration::from_millis(250));
            }
            let check = rng.random_range(0..(8u64 << 20) - 100000);
            same(
                &read_range(&vol, check, 100000),
                &model[check as usize..check as usize + 100000],
                &format!("step {i} at {check}"),
            );
        }
        same(&read_range(&vol, 0, 8 << 20), &model, "whole volume");
        engine.shutdown().unwrap();
    }
    let engine = Engine::open(&state, config(0.2)).unwrap();
    let vol = engine.open_volume("tank/vol").unwrap();
    same(&read_range(&vol, 0, 8 << 20), &model, "whole volume");
    assert!(prop(&engine, "tank/vol", "used") > 0);
}

#[test]
fn flushed_writes_are_replayed_from_the_log_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    // A txg timeout far beyond the test: only the intent log holds the writes.
    let engine = Engine::open(&state, config(3600.0)).unwrap();
    create_pool(&engine, dir.path());
    engine.create_volume("tank/vol", 4 << 20, &[]).unwrap();
    let vol = engine.open_volume("tank/vol").unwrap();
    vol.write(4096, &[0xaa; 10000], false).unwrap();
    vol.write(1 << 20, &[0xbb; 4096], true).unwrap(); // FUA
    vol.write_zeroes(4096, 100, false, false).unwrap();
    vol.flush().unwrap();
    vol.write(2 << 20, &[0xcc; 4096], false).unwrap(); // never flushed: may be lost
                                                       // Crash: the engine is abandoned without a txg commit or shutdown.
    std::mem::forget(vol);
    Engine::forget_as_if_killed(engine);

    let engine = Engine::open(&state, config(3600.0)).unwrap();
    let vol = engine.open_volume("tank/vol").unwrap();
    let mut want = vec![0u8; 4 << 20];
    want[4096..14096].fill(0xaa);
    want[4096..4196].fill(0);
    want[1 << 20..(1 << 20) + 4096].fill(0xbb);
    let got = read_range(&vol, 0, 4 << 20);
    let tail_ok = got[2 << 20..(2 << 20) + 4096].iter().all(|&b| b == 0)
        || got[2 << 20..(2 << 20) + 4096].iter().all(|&b| b == 0xcc);
    assert!(tail_ok, "an unflushed write is either absent or whole");
    want[2 << 20..(2 << 20) + 4096].copy_from_slice(&got[2 << 20..(2 << 20) + 4096]);
    same(&got, &want, "after replay");
}

#[test]
fn compression_shrinks_text_and_reports_the_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(&dir.path().join("state"), config(3600.0)).unwrap();
    create_pool(&engine, dir.path());
    for comp in ["off", "lz4", "gzip-9"] {
        let name = format!("tank/{}", comp.replace('-', ""));
        engine
            .create_volume(&name, 8 << 20, &[("compression".into(), comp.into())])
            .unwrap();
        let vol = engine.open_volume(&name).unwrap();
        let text: Vec<u8> = (0..(4 << 20))
            .map(|i: u32| b"storage that never lies "[(i % 24) as usize] ^ ((i / 4096) as u8 & 1))
            .collect();
        vol.write(0, &text, false).unwrap();
        engine.sync_all().unwrap();
        let used = prop(&engine, &name, "usedbydataset");
        let logical = prop(&engine, &name, "logicalused");
        assert_eq!(logical, 4 << 20);
        let ratio: f64 = engine
            .dataset(&name)
            .unwrap()
            .property("compressratio")
            .unwrap()
            .parsable
            .parse()
            .unwrap();
        if comp == "off" {
            // Two copies are allocated on a mirror but usedbydataset counts the block once per DVA.
            assert_eq!(used, 4 << 20);
            assert_eq!(ratio, 1.0);
        } else {
            assert!(used * 4 <= logical, "{comp}: used {used}");
            assert!(ratio >= 4.0, "{comp}: {ratio}");
        }
    }
    // Random data does not shrink: stored raw, ratio 1.00.
    engine
        .create_volume(
            "tank/rnd",
            4 << 20,
            &[("compression".into(), "zstd-19".into())],
        )
        .unwrap();
    let vol = engine.open_volume("tank/rnd").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let data: Vec<u8> = (0..(2 << 20)).map(|_| rng.random()).collect();
    vol.write(0, &data, false).unwrap();
    engine.sync_all().unwrap();
    assert_eq!(prop(&engine, "tank/rnd", "usedbydataset"), 2 << 20);
    same(&read_range(&vol, 0, 2 << 20), &data, "random");
}

/// Decision 0081: while sync writers use the intent log on the pool's own
/// devices, a txg writes adjacent blocks in requests of at most 256 KiB
/// (the log's writes must not queue behind megabytes); with no log write
/// since the last txg they go out as one large write.
#[test]
fn txg_writes_stay_small_while_the_log_is_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(&dir.path().join("state"), config(3600.0)).unwrap();
    create_pool(&engine, dir.path());
    engine
        .create_volume("tank/v", 32 << 20, &[("compression".into(), "off".into())])
        .unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    let data: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 251) as u8).collect();
    // Write requests of the txg that writes `at`, after `before` ran.
    let txg_writes = |at: u64, before: &dyn Fn()| {
        engine.sync_all().unwrap();
        before();
        vol.write(at, &data, false).unwrap();
        let ops = || -> u64 {
            let s = engine.pool_iostat("tank").unwrap();
            s.groups[0].devices.iter().map(|d| d.write_ops).sum()
        };
        let start = ops();
        engine.sync_all().unwrap();
        ops() - start
    };
    let quiet = txg_writes(0, &|| {});
    let syncing = txg_writes(8 << 20, &|| {
        vol.write(24 << 20, &[7; 4096], false).unwrap();
        vol.flush().unwrap();
    });
    // Two mirror copies: 4 MiB is 16 requests of 256 KiB per device.
    assert!(
        syncing >= quiet + 2 * 15,
        "quiet txg {quiet} writes, syncing {syncing}"
    );
}

/// While sync writes go on, the txg sync thread runs off the CPUs that
/// take the pool's disk interrupts when the disk has one queue and other
/// CPUs are allowed (decision 0083; this machine's virtio disk sends every
/// completion to one CPU); after a txg with no log write, or with
/// `txg_avoid_irq_cpus = false`, or on a disk with a queue per CPU, it has
/// every CPU it was started with.
#[test]
fn txg_sync_keeps_off_the_cpus_that_take_the_disks_interrupts() {
    use vdev::irq;
    let allowed = irq::thread_cpus().unwrap();
    // The CPUs of the thread named `name` in this process (a pool's
    // thread name is `txg-sync-POOL`, at most 15 bytes).
    let cpus_of = |name: &str| -> Option<irq::CpuSet> {
        std::fs::read_dir("/proc/self/task").ok()?.find_map(|t| {
            let t = t.ok()?.path();
            (std::fs::read_to_string(t.join("comm")).ok()?.trim() == name).then_some(())?;
            let status = std::fs::read_to_string(t.join("status")).ok()?;
            let list = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
            irq::parse_cpu_list(list)
        })
    };
    for (pool, avoid) in [("irqpin", true), ("irqany", false)] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = EngineConfig {
            txg_avoid_irq_cpus: avoid,
            ..config(3600.0)
        };
        let engine = common::single_disk_engine_with(dir.path(), pool, cfg);
        engine
            .create_volume(&format!("{pool}/v"), 1 << 20, &[])
            .unwrap();
        let vol = engine.open_volume(&format!("{pool}/v")).unwrap();
        let on_disk = irq::completion_cpus(&dir.path().join(format!("{pool}-d0")));
        let away = match (&on_disk, avoid) {
            (Some(i), true) => irq::away_from(&allowed, i).unwrap_or_else(|| allowed.clone()),
            _ => allowed.clone(),
        };
        let thread = format!("txg-sync-{pool}");
        let ctx = format!("{thread}: allowed {allowed:?}, the disk's completions on {on_disk:?}");
        // A txg after a log write, then one after none.
        vol.write(0, &[7; 4096], false).unwrap();
        vol.flush().unwrap();
        engine.sync_all().unwrap();
        assert_eq!(cpus_of(&thread), Some(away), "after a log write: {ctx}");
        vol.write(4096, &[8; 4096], false).unwrap();
        engine.sync_all().unwrap();
        assert_eq!(cpus_of(&thread), Some(allowed.clone()), "after none: {ctx}");
    }
}

#[test]
fn overwrites_and_trims_free_space_and_destroy_frees_everything() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(&dir.path().join("state"), config(3600.0)).unwrap();
    create_pool(&engine, dir.path());
    let base = engine.list_pools()[0].allocated;
    engine
        .create_volume("tank/v", 16 << 20, &[("compression".into(), "off".into())])
        .unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    for _ in 0..3 {
        vol.write(0, &vec![1u8; 8 << 20], false).unwrap();
        engine.sync_all().unwrap();
    }
    assert_eq!(engine.list_pools()[0].allocated - base, 8 << 20);
    vol.trim(0, 4 << 20, false).unwrap();
    engine.sync_all().unwrap();
    assert_eq!(engine.list_pools()[0].allocated - base, 4 << 20);
    assert_eq!(prop(&engine, "tank/v", "usedbydataset"), 4 << 20);
    let ext = vol.allocation(0, 16 << 20).unwrap();
    assert_eq!(
        ext[0],
        Extent {
            len: 4 << 20,
            hole: true,
            zero: true
        }
    );
    assert_eq!(
        ext[1],
        Extent {
            len: 4 << 20,
            hole: false,
            zero: false
        }
    );
    engine
        .destroy("tank/v", &DestroyOptions::default())
        .unwrap();
    assert_eq!(engine.list_pools()[0].allocated, base);
    assert!(matches!(vol.read(0, 10), Err(Error::NotFound(_))));
}

#[test]
fn bad_requests_are_refused_without_changing_anything() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(&dir.path().join("state"), config(3600.0)).unwrap();
    create_pool(&engine, dir.path());
    engine.create_volume("tank/v", 1 << 20, &[]).unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    assert!(matches!(
        vol.write((1 << 20) - 10, &[1; 11], false),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        vol.read(u64::MAX - 5, 10),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        engine.create_volume("tank/v", 1 << 20, &[]),
        Err(Error::AlreadyExists(_))
    ));
    assert!(matches!(
        engine.create_volume("tank/w", 1000, &[]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        engine.create_volume("nope/w", 1 << 20, &[]),
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        engine.create_volume("tank/w", 1 << 20, &[("compression".into(), "zip".into())]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        engine.set_property("tank/v", "volsize", "512K"),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        engine.set_property("tank/v", "used", "5"),
        Err(Error::InvalidArgument(_))
    ));
    engine.set_property("tank/v", "volsize", "2M").unwrap();
    assert_eq!(vol.size(), 2 << 20);
    engine.set_property("tank/v", "readonly", "on").unwrap();
    assert!(matches!(vol.write(0, &[1], false), Err(Error::ReadOnly(_))));
    assert_eq!(read_range(&vol, 0, 1 << 20), vec![0u8; 1 << 20]);
    // A device that is already in a pool is refused by name.
    let spec = PoolSpec {
        name: "other".into(),
        groups: vec![GroupSpec {
            kind: GroupKind::Disk,
            devices: vec![dir.path().join("d0")],
        }],
        create_size: None,
        force: false,
    };
    let err = engine.create_pool(spec.clone()).unwrap_err().to_string();
    assert!(err.contains("is part of active pool 'tank'"), "{err}");
    // -f does not take a device from a pool that is imported here...
    let forced = PoolSpec {
        force: true,
        ..spec.clone()
    };
    assert!(engine.create_pool(forced.clone()).is_err());
    // ...but does reuse one of a pool that is gone (exported, say).
    engine.export_pool("tank").unwrap();
    let err = engine.create_pool(spec).unwrap_err().to_string();
    assert!(
        err.contains("part of exported pool 'tank'") && err.contains("use -f"),
        "{err}"
    );
    engine.create_pool(forced).unwrap();
}

#[test]
fn export_and_import_move_a_pool_by_its_devices() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(&dir.path().join("state"), config(3600.0)).unwrap();
    create_pool(&engine, dir.path());
    engine.create_volume("tank/v", 1 << 20, &[]).unwrap();
    engine
        .open_volume("tank/v")
        .unwrap()
        .write(0, b"persist", false)
        .unwrap();
    engine.export_pool("tank").unwrap();
    assert!(engine.list_pools().is_empty());
    // Another host (state dir) finds it by scanning the directory.
    let other = Engine::open(&dir.path().join("state2"), config(3600.0)).unwrap();
    let found = other.importable_pools(&[dir.path().to_path_buf()]).unwrap();
    assert_eq!(found.len(), 1);
    assert!(found[0].complete);
    other
        .import_pool("tank", &[dir.path().to_path_buf()], false)
        .unwrap();
    let vol = other.open_volume("tank/v").unwrap();
    assert_eq!(&read_range(&vol, 0, 7), b"persist");
    other.destroy_pool("tank").unwrap();
    assert!(other
        .importable_pools(&[dir.path().to_path_buf()])
        .unwrap()
        .is_empty());
}

#[test]
fn concurrent_writers_with_flushes_all_land() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let engine = Engine::open(&state, config(0.5)).unwrap();
    create_pool(&engine, dir.path());
    engine
        .create_volume("tank/v", 32 << 20, &[("volblocksize".into(), "4K".into())])
        .unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let vol: Arc<Volume> = vol.clone();
            s.spawn(move || {
                for i in 0..200u64 {
                    let off = ((i * 8 + t) * 4096) % (32 << 20);
                    vol.write(off, &[(t + 1) as u8; 4096], false).unwrap();
                    vol.flush().unwrap();
                }
            });
        }
    });
    std::mem::forget(vol);
    Engine::forget_as_if_killed(engine);
    let engine = Engine::open(&state, config(3600.0)).unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    for t in 0..8u64 {
        for i in 0..200u64 {
            let off = ((i * 8 + t) * 4096) % (32 << 20);
            assert_eq!(read_range(&vol, off, 4096), vec![(t + 1) as u8; 4096]);
        }
    }
}

#[test]
fn a_lying_mirror_side_is_healed_and_a_lying_single_disk_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(&dir.path().join("state"), config(3600.0)).unwrap();
    create_pool(&engine, dir.path());
    engine
        .create_volume("tank/v", 4 << 20, &[("compression".into(), "off".into())])
        .unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    let data: Vec<u8> = (0..(2 << 20)).map(|i: u32| (i % 251) as u8).collect();
    vol.write(0, &data, false).unwrap();
    engine.sync_all().unwrap();
    // Flip bytes all over the first device's data region, behind the engine's back.
    let label = pool::Vdev::open(&dir.path().join("d0"))
        .unwrap()
        .read_label()
        .unwrap();
    let d0 = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("d0"))
        .unwrap();
    use std::os::unix::fs::FileExt;
    for k in 0..64u64 {
        d0.write_all_at(&[0x5a; 7], label.regions.data_offset + k * 32768 + 100)
            .unwrap();
    }
    // A fresh engine, so nothing comes from the cache.
    engine.shutdown().unwrap();
    drop(vol);
    drop(engine);
    let engine = Engine::open(&dir.path().join("state"), config(3600.0)).unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    same(
        &read_range(&vol, 0, 2 << 20),
        &data,
        "mirror read after corruption",
    );
    let status = engine.pool_status("tank").unwrap();
    let cksum: u64 = status.groups[0]
        .devices
        .iter()
        .map(|d| d.checksum_errors)
        .sum();
    assert!(cksum >= 32, "checksum errors counted: {cksum}");
    // Healed in place: both sides agree again.
    let (a, b) = (
        std::fs::read(dir.path().join("d0")).unwrap(),
        std::fs::read(dir.path().join("d1")).unwrap(),
    );
    let start = label.regions.data_offset as usize;
    same(
        &a[start..start + (2 << 20)],
        &b[start..start + (2 << 20)],
        "healed copy",
    );

    // A single disk has nothing to heal from: the read fails, no wrong data.
    let spec = PoolSpec {
        name: "solo".into(),
        groups: vec![GroupSpec {
            kind: GroupKind::Disk,
            devices: vec![dir.path().join("s0")],
        }],
        create_size: Some(128 << 20),
        force: false,
    };
    engine.create_pool(spec).unwrap();
    engine.create_volume("solo/v", 1 << 20, &[]).unwrap();
    let v = engine.open_volume("solo/v").unwrap();
    v.write(0, &data[..1 << 20], false).unwrap();
    engine.shutdown().unwrap();
    drop(v);
    drop(engine);
    let label = pool::Vdev::open(&dir.path().join("s0"))
        .unwrap()
        .read_label()
        .unwrap();
    let s0 = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("s0"))
        .unwrap();
    s0.write_all_at(&[0xff; 3], label.regions.data_offset + 10)
        .unwrap();
    let engine = Engine::open(&dir.path().join("state"), config(3600.0)).unwrap();
    let v = engine.open_volume("solo/v").unwrap();
    assert!(matches!(v.read(0, 4096), Err(Error::Corrupt(_))));
    same(
        &read_range(&v, 65536, 65536),
        &data[65536..131072],
        "undamaged blocks still read",
    );
}

#[test]
fn trims_and_zeroes_of_every_shape_over_committed_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(&dir.path().join("state"), config(3600.0)).unwrap();
    create_pool(&engine, dir.path());
    engine.create_volume("tank/v", 16 << 20, &[]).unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    const K: u64 = 1024;
    let shapes = [
        (16 * K, 16 * K),
        (12 * K, 20 * K),
        (16 * K, 20 * K),
        (12 * K, 24 * K),
        (4 * K, 8 * K),
        (1, 40 * K),
        (0, 64 * K),
    ];
    let data: Vec<u8> = (0..64 * K).map(|i| (i % 253) as u8 + 1).collect();
    for allocate in [false, true] {
        for (i, _) in shapes.iter().enumerate() {
            vol.write((i as u64) << 20, &data, false).unwrap();
        }
        engine.sync_all().unwrap(); // committed, not dirty
        for (i, &(off, len)) in shapes.iter().enumerate() {
            vol.write_zeroes(((i as u64) << 20) + off, len, allocate, false)
                .unwrap();
        }
        for (i, &(off, len)) in shapes.iter().enumerate() {
            let mut want = data.clone();
            want[off as usize..(off + len) as usize].fill(0);
            same(
                &read_range(&vol, (i as u64) << 20, 64 * K),
                &want,
                &format!("allocate={allocate} shape {off}+{len}"),
            );
        }
    }
}

#[test]
fn a_mirror_missing_a_device_imports_degraded_and_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let data: Vec<u8> = (0..(1 << 20)).map(|i: u32| (i % 241) as u8).collect();
    {
        let engine = Engine::open(&state, config(3600.0)).unwrap();
        create_pool(&engine, dir.path());
        engine.create_volume("tank/v", 4 << 20, &[]).unwrap();
        engine
            .open_volume("tank/v")
            .unwrap()
            .write(0, &data, true)
            .unwrap();
        engine.shutdown().unwrap();
    }
    std::fs::remove_file(dir.path().join("d0")).unwrap();
    let engine = Engine::open(&state, config(3600.0)).unwrap();
    let status = engine.pool_status("tank").unwrap();
    assert_eq!(status.summary.health, "DEGRADED");
    assert_eq!(status.groups[0].state, "DEGRADED");
    assert!(
        status.groups[0]
            .devices
            .iter()
            .any(|d| d.state == "UNAVAIL"),
        "{:?}",
        status.groups[0].devices
    );
    let vol = engine.open_volume("tank/v").unwrap();
    same(&read_range(&vol, 0, 1 << 20), &data, "degraded read");
    vol.write(2 << 20, b"still writable", true).unwrap();
    assert_eq!(&read_range(&vol, 2 << 20, 14), b"still writable");
}

#[test]
fn a_scan_larger_than_the_cache_does_not_evict_the_working_set() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let small = || EngineConfig {
        block_cache_bytes: 1 << 20,
        cache_min_bytes: 1 << 20,
        prefetch_max_bytes: 0,
        ..config(3600.0)
    };
    {
        let engine = Engine::open(&state, small()).unwrap();
        create_pool(&engine, dir.path());
        engine
            .create_volume("tank/v", 4 << 20, &[("compression".into(), "off".into())])
            .unwrap();
        engine
            .open_volume("tank/v")
            .unwrap()
            .write(0, &vec![7u8; 4 << 20], false)
            .unwrap();
        engine.shutdown().unwrap();
    }
    let engine = Engine::open(&state, small()).unwrap(); // empty cache
    let vol = engine.open_volume("tank/v").unwrap();
    let hits = || engine.stats()[0].cache_hits;
    for _ in 0..3 {
        read_range(&vol, 16384, 16384);
    }
    assert_eq!(hits(), 2, "a small read is cached");
    read_range(&vol, 1 << 20, 3 << 20); // a scan of 3x the cache
    let st = engine.stats()[0].arc;
    assert!(st.size <= st.max, "{st:?}");
    let before = hits();
    read_range(&vol, 16384, 16384);
    assert_eq!(hits(), before + 1, "the hot block survived the scan");
}

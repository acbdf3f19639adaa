use super::*;
use rand::{Rng, SeedableRng};

fn devs(dir: &std::path::Path, n: usize) -> Vec<Vdev> {
    devs_named(dir, "d", n)
}

fn devs_named(dir: &std::path::Path, prefix: &str, n: usize) -> Vec<Vdev> {
    (0..n)
        .map(|i| Vdev::open_or_create(&dir.join(format!("{prefix}{i}")), Some(128 << 20)).unwrap())
        .collect()
}

fn reopen(paths: &[PathBuf]) -> Vec<(Vdev, Label)> {
    paths
        .iter()
        .map(|p| {
            let v = Vdev::open(p).unwrap();
            let l = v.read_label().unwrap();
            (v, l)
        })
        .collect()
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random()).collect()
}

/// Allocates one block per entry of `datas`, checks they lie side by side,
/// and writes them as one vectored write (as the txg does), each padded to
/// its allocated size; their DVAs.
fn write_adjacent_run(pool: &Pool, datas: &[Vec<u8>]) -> Vec<Dva> {
    let dvas: Vec<Dva> = datas
        .iter()
        .map(|d| pool.allocator().allocate(d.len() as u64).unwrap())
        .collect();
    for w in dvas.windows(2) {
        assert_eq!(w[0].offset + w[0].asize as u64, w[1].offset);
    }
    let pads: Vec<Vec<u8>> = dvas
        .iter()
        .zip(datas)
        .map(|(d, x)| vec![0u8; d.asize as usize - x.len()])
        .collect();
    let mut parts: Vec<&[u8]> = Vec::new();
    for (x, p) in datas.iter().zip(&pads) {
        parts.push(x);
        parts.push(p);
    }
    let total: u32 = dvas.iter().map(|d| d.asize).sum();
    pool.write_vectored(
        Dva {
            asize: total,
            ..dvas[0]
        },
        &parts,
    )
    .unwrap();
    dvas
}

fn raidz(parity: u8) -> LayoutKind {
    LayoutKind::Raidz { parity }
}

/// Overwrites `n` random bytes of device `dev`'s part of the block's rows.
fn corrupt_column(pool: &Pool, dva: Dva, dev: usize, seed: u64) {
    let g = pool.group(dva.group).unwrap();
    let geo = g.geometry().unwrap();
    let span = geo.span(dva.offset, dva.asize as u64);
    let d = g.devices()[dev].clone();
    let at = pool.regions.data_offset + span.row0 * SECTOR;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    // Whole sectors of garbage: every row of the column is wrong.
    for r in 0..span.rows {
        let junk: Vec<u8> = (0..SECTOR as usize).map(|_| rng.random()).collect();
        d.write_at(at + r * SECTOR, &junk).unwrap();
    }
}

fn column_bytes(pool: &Pool, dva: Dva, dev: usize) -> Vec<u8> {
    let g = pool.group(dva.group).unwrap();
    let geo = g.geometry().unwrap();
    let span = geo.span(dva.offset, dva.asize as u64);
    let mut buf = vec![0u8; span.dev_bytes()];
    g.devices()[dev]
        .read_at(pool.regions.data_offset + span.row0 * SECTOR, &mut buf)
        .unwrap();
    buf
}

fn cksum(d: &Vdev) -> u64 {
    d.errors.checksum.load(Ordering::Relaxed)
}

#[test]
fn mirror_read_heals_a_corrupted_copy() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create("tank", vec![(LayoutKind::Mirror, devs(dir.path(), 2))]).unwrap();
    let dva = pool.allocator().allocate(8192).unwrap();
    let data = vec![7u8; 8192];
    pool.write(dva, &data).unwrap();
    let dev0 = pool.groups()[0].devices()[0].clone();
    dev0.write_at(pool.regions.data_offset + dva.offset + 10, &[1, 2, 3])
        .unwrap();
    let got = pool
        .read_verified(dva, 8192, |b| b == data.as_slice())
        .unwrap();
    assert_eq!(got, data);
    assert_eq!(cksum(&dev0), 1);
    // Healed: the first copy is right again.
    let mut buf = vec![0u8; 8192];
    dev0.read_at(pool.regions.data_offset + dva.offset, &mut buf)
        .unwrap();
    assert_eq!(buf, data);
}

#[test]
fn reassembles_from_labels_and_refuses_missing_stripe_member() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(
        "tank",
        vec![
            (LayoutKind::Disk, devs(dir.path(), 1)),
            (LayoutKind::Disk, devs(&dir.path().join(""), 0)),
        ],
    )
    .err();
    assert!(pool.is_some(), "a disk group without a device is refused");
    let ds = devs(dir.path(), 2);
    let groups = ds
        .into_iter()
        .map(|d| (LayoutKind::Disk, vec![d]))
        .collect();
    let pool = Pool::create("tank", groups).unwrap();
    let paths = pool.device_paths();
    drop(pool);
    let pool = Pool::open(reopen(&paths)).unwrap();
    assert_eq!(pool.groups().len(), 2);
    assert!(matches!(
        Pool::open(reopen(&paths[..1])),
        Err(PoolError::MissingDevice { .. })
    ));
}

#[test]
fn raidz_layouts_are_checked_at_create() {
    let dir = tempfile::tempdir().unwrap();
    let err = Pool::create("t", vec![(raidz(2), devs(dir.path(), 2))])
        .err()
        .unwrap();
    assert!(err.to_string().contains("raidz2 needs at least 3"), "{err}");
    let err = Pool::create("t", vec![(raidz(4), devs(dir.path(), 6))])
        .err()
        .unwrap();
    assert!(err.to_string().contains("parity is 1, 2 or 3"), "{err}");
    let pool = Pool::create("t", vec![(raidz(1), devs(dir.path(), 2))]).unwrap();
    // 2-wide raidz1: one data column.
    assert_eq!(pool.groups()[0].unit(), SECTOR);
}

#[test]
fn raidz_round_trips_many_block_sizes_and_runs() {
    for (parity, width) in [(1u8, 3usize), (1, 5), (2, 6), (3, 7), (3, 4)] {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::create("t", vec![(raidz(parity), devs(dir.path(), width))]).unwrap();
        let unit = pool.groups()[0].unit();
        assert_eq!(unit, (width - parity as usize) as u64 * SECTOR);
        assert_eq!(
            pool.size(),
            pool.groups()[0].data_size / SECTOR * unit,
            "capacity counts data columns only"
        );
        let sizes = [
            1usize,
            100,
            4096,
            4097,
            12288,
            65536,
            131072,
            131072 + 3,
            1 << 20,
        ];
        let mut blocks = Vec::new();
        for (i, &len) in sizes.iter().enumerate() {
            let dva = pool.allocator().allocate(len as u64).unwrap();
            assert_eq!(dva.offset % unit, 0);
            assert_eq!(dva.asize as u64 % unit, 0);
            let data = pattern(i as u64, len);
            pool.write(dva, &data).unwrap();
            blocks.push((dva, data));
        }
        for (dva, data) in &blocks {
            let got = pool
                .read_verified(*dva, data.len(), |b| b == data.as_slice())
                .unwrap();
            assert_eq!(&got, data);
        }
        // A run of adjacent blocks, written as one vectored write (as the
        // txg does), reads back block by block and as one run.
        let lens = [5000usize, 70000, 4096, 300000];
        let datas: Vec<Vec<u8>> = lens.iter().map(|&l| pattern(l as u64, l)).collect();
        let dvas = write_adjacent_run(&pool, &datas);
        let total: u32 = dvas.iter().map(|d| d.asize).sum();
        let run = pool.read_run(0, dvas[0].offset, total as usize).unwrap();
        for (dva, data) in dvas.iter().zip(&datas) {
            let got = pool
                .read_verified(*dva, data.len(), |b| b == data.as_slice())
                .unwrap();
            assert_eq!(&got, data);
            let at = (dva.offset - dvas[0].offset) as usize;
            assert_eq!(&run[at..at + data.len()], data.as_slice());
        }
        for d in pool.devices() {
            assert_eq!(cksum(&d), 0);
        }
    }
}

#[test]
fn raidz_heals_as_many_bad_columns_as_parity_and_refuses_more() {
    for (parity, width) in [(1u8, 4usize), (2, 6), (3, 8)] {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::create("t", vec![(raidz(parity), devs(dir.path(), width))]).unwrap();
        let len = 200_000;
        let data = pattern(parity as u64, len);
        let dva = pool.allocator().allocate(len as u64).unwrap();
        pool.write(dva, &data).unwrap();
        let verify = |b: &[u8]| b == data.as_slice();
        let before: Vec<Vec<u8>> = (0..width).map(|i| column_bytes(&pool, dva, i)).collect();
        // `parity` columns damaged, on random devices.
        let mut rng = rand::rngs::SmallRng::seed_from_u64(99 + parity as u64);
        let mut bad: Vec<usize> = Vec::new();
        while bad.len() < parity as usize {
            let i = rng.random_range(0..width);
            if !bad.contains(&i) {
                bad.push(i);
            }
        }
        for &i in &bad {
            corrupt_column(&pool, dva, i, i as u64);
        }
        let got = pool.read_verified(dva, len, verify).unwrap();
        assert_eq!(got, data);
        let g = pool.group(0).unwrap();
        let geo = g.geometry().unwrap();
        let span = geo.span(dva.offset, dva.asize as u64);
        let holds_data = geo.data_devices(span);
        let devices = g.devices();
        let bad_data: Vec<usize> = bad.iter().copied().filter(|&i| holds_data[i]).collect();
        if !bad_data.is_empty() {
            // The read reconstructed and healed every bad column it saw
            // (all of them, as it had to read the parity).
            for i in 0..width {
                let expected = u64::from(bad.contains(&i));
                assert_eq!(cksum(&devices[i]), expected, "raidz{parity} device {i}");
                assert_eq!(column_bytes(&pool, dva, i), before[i], "device {i} healed");
            }
        }
        // A scrub leaves every column right and counted once.
        pool.scrub_block(dva, len, verify).unwrap();
        for i in 0..width {
            let expected = u64::from(bad.contains(&i));
            assert_eq!(cksum(&devices[i]), expected, "raidz{parity} device {i}");
            assert_eq!(column_bytes(&pool, dva, i), before[i], "device {i} healed");
        }
        // Healed: a scrub finds nothing more.
        let out = pool.scrub_block(dva, len, verify).unwrap();
        assert_eq!(out, ScrubOutcome::default());

        // One more bad column than parity: refused, never wrong data.
        for i in 0..=parity as usize {
            corrupt_column(&pool, dva, i, 1000 + i as u64);
        }
        match pool.read_verified(dva, len, verify) {
            Err(PoolError::Unrecoverable { .. }) => {}
            other => panic!("raidz{parity}: {:?}", other.map(|_| ())),
        }
        assert!(matches!(
            pool.scrub_block(dva, len, verify),
            Err(PoolError::Unrecoverable { .. })
        ));
    }
}

#[test]
fn raidz_scrub_repairs_parity_that_reads_never_look_at() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create("t", vec![(raidz(2), devs(dir.path(), 5))]).unwrap();
    let len = 3 * 4096 * 4;
    let data = pattern(5, len);
    let dva = pool.allocator().allocate(len as u64).unwrap();
    pool.write(dva, &data).unwrap();
    let verify = |b: &[u8]| b == data.as_slice();
    let g = pool.group(0).unwrap();
    let geo = g.geometry().unwrap();
    let span = geo.span(dva.offset, dva.asize as u64);
    // The devices holding parity for this block (one rotation segment).
    assert_eq!(geo.segments(span).len(), 1);
    let p0 = geo.device(span.row0, geo.data());
    let good = column_bytes(&pool, dva, p0);
    corrupt_column(&pool, dva, p0, 7);
    // A read does not notice: data columns verify.
    pool.read_verified(dva, len, verify).unwrap();
    assert_eq!(cksum(&g.devices()[p0]), 0);
    let out = pool.scrub_block(dva, len, verify).unwrap();
    assert_eq!(out.bad_devices, vec![g.children()[p0].guid]);
    assert_eq!(out.repaired_bytes, span.dev_bytes() as u64);
    assert_eq!(cksum(&g.devices()[p0]), 1);
    assert_eq!(column_bytes(&pool, dva, p0), good);
}

#[test]
fn mirror_scrub_repairs_every_bad_copy() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create("t", vec![(LayoutKind::Mirror, devs(dir.path(), 3))]).unwrap();
    let data = pattern(1, 20000);
    let dva = pool.allocator().allocate(20000).unwrap();
    pool.write(dva, &data).unwrap();
    let devices = pool.groups()[0].devices();
    let at = pool.regions.data_offset + dva.offset;
    // The first copy is good, so a read would never look at the others.
    devices[1].write_at(at + 5, b"bad").unwrap();
    devices[2].write_at(at + 500, b"bad").unwrap();
    let verify = |b: &[u8]| b == data.as_slice();
    let out = pool.scrub_block(dva, data.len(), verify).unwrap();
    assert_eq!(out.repaired_bytes, 2 * data.len() as u64);
    assert_eq!(out.bad_devices.len(), 2);
    assert_eq!(
        devices.iter().map(|d| cksum(d)).collect::<Vec<_>>(),
        vec![0, 1, 1]
    );
    assert_eq!(
        pool.scrub_block(dva, data.len(), verify).unwrap(),
        ScrubOutcome::default()
    );
    for d in &devices {
        let mut buf = vec![0u8; data.len()];
        d.read_at(at, &mut buf).unwrap();
        assert_eq!(buf, data);
    }
}

#[test]
fn raidz_imports_degraded_up_to_parity_and_refuses_beyond() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create(
        "t",
        vec![
            (raidz(2), devs_named(dir.path(), "a", 5)),
            (raidz(1), devs_named(dir.path(), "b", 3)),
        ],
    )
    .unwrap();
    let mut blocks = Vec::new();
    for i in 0..40u64 {
        let len = 10_000 + i as usize * 3000;
        let dva = pool.allocator().allocate(len as u64).unwrap();
        let data = pattern(i, len);
        pool.write(dva, &data).unwrap();
        blocks.push((dva, data));
    }
    assert!(blocks.iter().any(|(d, _)| d.group == 1), "both groups used");
    let paths = pool.device_paths();
    drop(pool);
    // Two of group 0 and one of group 1 missing: DEGRADED, every block reads.
    let keep: Vec<PathBuf> = paths
        .iter()
        .enumerate()
        .filter(|(i, _)| ![1, 3, 6].contains(i))
        .map(|(_, p)| p.clone())
        .collect();
    let pool = Pool::open(reopen(&keep)).unwrap();
    let groups = pool.groups();
    assert_eq!(groups[0].state(), DeviceState::Degraded);
    assert_eq!(groups[1].state(), DeviceState::Degraded);
    assert_eq!(groups[0].missing().len(), 2);
    for (dva, data) in &blocks {
        let got = pool
            .read_verified(*dva, data.len(), |b| b == data.as_slice())
            .unwrap();
        assert_eq!(&got, data);
        // The fast path reconstructs too.
        let run = pool
            .read_run(dva.group, dva.offset, dva.asize as usize)
            .unwrap();
        assert_eq!(&run[..data.len()], data.as_slice());
    }
    // Writes to a degraded raidz land on the remaining columns.
    let dva = Dva {
        group: 0,
        ..pool.allocator().allocate(50_000).unwrap()
    };
    let _ = dva;
    let mut fresh = Vec::new();
    for i in 0..6u64 {
        let data = pattern(500 + i, 50_000);
        let dva = pool.allocator().allocate(50_000).unwrap();
        pool.write(dva, &data).unwrap();
        fresh.push((dva, data));
    }
    for (dva, data) in &fresh {
        let got = pool
            .read_verified(*dva, data.len(), |b| b == data.as_slice())
            .unwrap();
        assert_eq!(&got, data);
    }
    for d in pool.devices() {
        assert_eq!(cksum(&d), 0, "degraded reads are not checksum errors");
    }
    drop(pool);
    // A third device of the raidz2 gone: refused, naming the group and guids.
    let keep: Vec<PathBuf> = paths
        .iter()
        .enumerate()
        .filter(|(i, _)| ![0, 1, 3].contains(i))
        .map(|(_, p)| p.clone())
        .collect();
    match Pool::open(reopen(&keep)) {
        Err(e @ PoolError::TooManyMissing { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("raidz2 group 0"), "{msg}");
            assert!(msg.contains("3 of its devices are missing"), "{msg}");
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
}

#[test]
fn replace_and_resilver_rebuild_the_new_device() {
    for kind in [raidz(1), raidz(2), LayoutKind::Mirror] {
        let dir = tempfile::tempdir().unwrap();
        let n = if kind == LayoutKind::Mirror { 2 } else { 4 };
        let pool = Arc::new(Pool::create("t", vec![(kind, devs(dir.path(), n))]).unwrap());
        let mut blocks = Vec::new();
        for i in 0..20u64 {
            let len = 4096 + i as usize * 7919;
            let dva = pool.allocator().allocate(len as u64).unwrap();
            let data = pattern(i, len);
            pool.write(dva, &data).unwrap();
            blocks.push((dva, data));
        }
        let region = pool.meta_region();
        region.write(0, b"metadata header").unwrap();
        let old = pool.groups()[0].children()[1].clone();
        let new = Vdev::open_or_create(&dir.path().join("new"), Some(128 << 20)).unwrap();
        let small = Vdev::open_or_create(&dir.path().join("small"), Some(64 << 20)).unwrap();
        assert!(matches!(
            pool.replace_device(old.guid, small),
            Err(PoolError::DeviceTooSmall { .. })
        ));
        let new_guid = pool.replace_device(old.guid, new).unwrap();
        let child = pool.groups()[0].children()[1].clone();
        assert_eq!(child.guid, new_guid);
        assert_ne!(child.guid, old.guid);
        assert!(child.resilvering && pool.is_resilvering(child.guid));
        assert_eq!(pool.groups()[0].state(), DeviceState::Degraded);
        // Reads still work (the new device is not trusted), writes reach it.
        for (dva, data) in &blocks {
            let got = pool
                .read_verified(*dva, data.len(), |b| b == data.as_slice())
                .unwrap();
            assert_eq!(&got, data);
        }
        let late = pattern(77, 30000);
        let late_dva = pool.allocator().allocate(30000).unwrap();
        pool.write(late_dva, &late).unwrap();
        blocks.push((late_dva, late));
        // Resilver.
        assert!(pool.resilver_regions(child.guid).unwrap() > 0);
        for (dva, data) in &blocks {
            let n = pool
                .resilver_block(*dva, data.len(), |b| b == data.as_slice(), child.guid)
                .unwrap();
            assert!(n > 0);
        }
        pool.finish_resilver(child.guid).unwrap();
        assert_eq!(pool.groups()[0].state(), DeviceState::Online);
        // Now lose another device: everything is still readable, so the
        // new one holds correct data.
        let other = pool.groups()[0].devices()[0].clone();
        other.set_state(DeviceState::Offline);
        for (dva, data) in &blocks {
            let got = pool
                .read_verified(*dva, data.len(), |b| b == data.as_slice())
                .unwrap();
            assert_eq!(&got, data);
        }
        let mut buf = [0u8; 15];
        region.read(0, &mut buf).unwrap();
        assert_eq!(&buf, b"metadata header");
        other.set_state(DeviceState::Online);
        for d in pool.devices() {
            assert_eq!(cksum(&d), 0);
        }
        // A later import sees the new device, not the old one (whose label
        // was wiped; a stale label would lose to the newer generation).
        let paths: Vec<PathBuf> = pool.device_paths();
        assert!(paths.contains(&dir.path().join("new")));
        drop(region);
        drop(pool);
        assert!(Vdev::open(&dir.path().join("d1"))
            .unwrap()
            .read_label()
            .is_err());
        let pool = Pool::open(reopen(&paths)).unwrap();
        assert_eq!(pool.groups()[0].state(), DeviceState::Online);
        assert_eq!(pool.groups()[0].children()[1].guid, child.guid);
        for (dva, data) in &blocks {
            let got = pool
                .read_verified(*dva, data.len(), |b| b == data.as_slice())
                .unwrap();
            assert_eq!(&got, data);
        }
    }
}

#[test]
fn resilvering_state_survives_reimport_and_stale_labels_lose() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create("t", vec![(raidz(1), devs(dir.path(), 3))]).unwrap();
    let old = pool.groups()[0].children()[2].guid;
    let old_label = pool.groups()[0].devices()[2].read_label().unwrap();
    let new = Vdev::open_or_create(&dir.path().join("new"), Some(128 << 20)).unwrap();
    pool.replace_device(old, new).unwrap();
    let new_guid = pool.groups()[0].children()[2].guid;
    let paths = pool.device_paths();
    drop(pool);
    // Put the old label back on the old device, as if it could not be wiped.
    let d2 = Vdev::open(&dir.path().join("d2")).unwrap();
    d2.write_label(&old_label).unwrap();
    let mut all = vec![(d2, old_label)];
    all.extend(reopen(&paths));
    let pool = Pool::open(all).unwrap();
    let children = pool.groups()[0].children();
    assert_eq!(children[2].guid, new_guid);
    assert!(children[2].resilvering);
    assert_eq!(
        children[2].device.as_ref().unwrap().path(),
        dir.path().join("new")
    );
    assert!(!pool.device_paths().contains(&dir.path().join("d2")));
}

#[test]
fn add_group_grows_the_pool_and_labels_name_it() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Arc::new(
        Pool::create(
            "t",
            vec![(LayoutKind::Mirror, devs_named(dir.path(), "m", 2))],
        )
        .unwrap(),
    );
    let region = pool.meta_region();
    region.write(4096, b"meta bytes").unwrap();
    let size = pool.size();
    let tiny = Vdev::open_or_create(&dir.path().join("tiny"), Some(32 << 20)).unwrap();
    assert!(matches!(
        pool.add_group(LayoutKind::Disk, vec![tiny]),
        Err(PoolError::DeviceTooSmall { .. })
    ));
    assert!(pool
        .add_group(raidz(2), devs_named(dir.path(), "r", 2))
        .is_err());
    pool.add_group(raidz(2), devs_named(dir.path(), "r", 4))
        .unwrap();
    assert_eq!(pool.groups().len(), 2);
    assert!(pool.size() > size);
    assert_eq!(pool.groups()[1].state(), DeviceState::Online);
    // The regions were copied: read from a new device alone.
    let mut blocks = Vec::new();
    for i in 0..64u64 {
        let dva = pool.allocator().allocate(100_000).unwrap();
        let data = pattern(i, 100_000);
        pool.write(dva, &data).unwrap();
        blocks.push((dva, data));
    }
    assert!(blocks.iter().any(|(d, _)| d.group == 1));
    let paths = pool.device_paths();
    drop(region);
    drop(pool);
    let labels: Vec<Label> = reopen(&paths).into_iter().map(|(_, l)| l).collect();
    for l in &labels {
        assert_eq!(l.groups.len(), 2);
        assert_eq!(l.groups[1].kind, raidz(2));
        assert_eq!(l.version, vdev::LABEL_VERSION_RAIDZ);
    }
    // Import from the new group's devices plus one mirror side.
    let keep: Vec<PathBuf> = paths
        .iter()
        .filter(|p| !p.ends_with("m0"))
        .cloned()
        .collect();
    let pool = Arc::new(Pool::open(reopen(&keep)).unwrap());
    for (dva, data) in &blocks {
        let got = pool
            .read_verified(*dva, data.len(), |b| b == data.as_slice())
            .unwrap();
        assert_eq!(&got, data);
    }
    // The regions were copied onto the new devices: read them alone.
    for d in pool.groups()[0].devices() {
        d.set_state(DeviceState::Offline);
    }
    let mut buf = [0u8; 10];
    pool.meta_region().read(4096, &mut buf).unwrap();
    assert_eq!(&buf, b"meta bytes");
}

#[test]
fn region_scrub_reads_every_copy() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Arc::new(Pool::create("t", vec![(raidz(1), devs(dir.path(), 3))]).unwrap());
    let region = pool.meta_region();
    region.write(8192, &[5u8; 4096]).unwrap();
    let devices = pool.devices();
    devices[2]
        .write_at(pool.regions.meta_offset + 8192 + 9, b"x")
        .unwrap();
    let verify = |b: &[u8]| b.iter().all(|&x| x == 5);
    let (good, out) = region.scrub(8192, 4096, verify).unwrap();
    assert!(verify(&good));
    assert_eq!(out.bad_devices.len(), 1);
    assert_eq!(cksum(&devices[2]), 1);
    let (_, out) = region.scrub(8192, 4096, verify).unwrap();
    assert_eq!(out, ScrubOutcome::default());
}

#[test]
fn device_admin_primitives() {
    let dir = tempfile::tempdir().unwrap();
    let pool = Pool::create("t", vec![(raidz(1), devs(dir.path(), 3))]).unwrap();
    let c = pool.groups()[0].children();
    let d = pool.device_by_guid(c[0].guid).unwrap();
    assert_eq!(pool.guid_of(&d), Some(c[0].guid));
    pool.set_device_state(c[0].guid, DeviceState::Offline)
        .unwrap();
    assert_eq!(pool.groups()[0].state(), DeviceState::Degraded);
    d.errors.checksum.store(5, Ordering::Relaxed);
    d.set_state(DeviceState::Faulted);
    pool.clear_errors(Some(c[0].guid)).unwrap();
    assert_eq!(cksum(&d), 0);
    assert_eq!(d.state(), DeviceState::Online);
    assert!(matches!(
        pool.set_device_state(12345, DeviceState::Offline),
        Err(PoolError::NoSuchDevice { .. })
    ));
    pool.begin_resilver(c[1].guid).unwrap();
    assert!(pool.is_resilvering(c[1].guid));
    pool.finish_resilver(c[1].guid).unwrap();
    assert!(!pool.is_resilvering(c[1].guid));
}

/// Throughput of 8 MiB raidz runs (as the txg writes them) and of run
/// reads, healthy and degraded: `cargo test -p pool --release -- --ignored`.
#[test]
#[ignore]
fn raidz_run_throughput() {
    let dir = tempfile::tempdir().unwrap();
    let devices = (0..6)
        .map(|i| Vdev::open_or_create(&dir.path().join(format!("t{i}")), Some(512 << 20)).unwrap())
        .collect();
    let pool = Pool::create("t", vec![(raidz(2), devices)]).unwrap();
    let run = 8 << 20;
    let data = pattern(1, run);
    let n = 32;
    let t = std::time::Instant::now();
    let mut dvas = Vec::new();
    for _ in 0..n {
        let dva = pool.allocator().allocate(run as u64).unwrap();
        pool.write(dva, &data).unwrap();
        dvas.push(dva);
    }
    pool.sync_all().unwrap();
    let mb = (n * run) as f64 / (1 << 20) as f64;
    eprintln!("write {:.0} MiB/s", mb / t.elapsed().as_secs_f64());
    for degraded in [false, true] {
        if degraded {
            pool.groups()[0].devices()[0].set_state(DeviceState::Offline);
        }
        let t = std::time::Instant::now();
        for dva in &dvas {
            let r = pool.read_run(0, dva.offset, run).unwrap();
            assert!(r[..run] == data[..]);
        }
        eprintln!(
            "read {} {:.0} MiB/s",
            if degraded { "degraded" } else { "healthy" },
            mb / t.elapsed().as_secs_f64()
        );
    }
}

#[test]
fn log_group_is_labelled_reopened_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let pool =
        Arc::new(Pool::create("tank", vec![(LayoutKind::Disk, devs(dir.path(), 1))]).unwrap());
    let data_paths = pool.device_paths();
    // A pool without a log device keeps writing the labels older builds read.
    assert_eq!(reopen(&data_paths)[0].1.version, vdev::LABEL_VERSION_PLAIN);
    let logs = devs_named(dir.path(), "l", 2);
    assert!(pool
        .add_log(LayoutKind::Disk, devs_named(dir.path(), "x", 2))
        .is_err());
    let tag = pool.add_log(LayoutKind::Mirror, logs).unwrap();
    assert!(pool
        .add_log(LayoutKind::Disk, devs_named(dir.path(), "y", 1))
        .is_err());
    let region = pool.slog_region(tag).unwrap();
    assert_eq!(region.log_tag(), tag);
    region.write_durable(4096, b"on the log device").unwrap();
    let paths = pool.device_paths();
    assert_eq!(paths.len(), 3);
    drop(region);
    drop(pool);
    let labels = reopen(&paths);
    for (_, l) in &labels {
        assert_eq!(l.version, vdev::LABEL_VERSION);
        assert_eq!(l.logs.len(), 1);
        assert_eq!(l.logs[0].kind, LayoutKind::Mirror);
    }
    assert_eq!(labels.iter().filter(|(_, l)| l.log_device).count(), 2);
    // Reopened with one log device missing: the region reads from the other.
    let pool = Arc::new(Pool::open(reopen(&paths[..2])).unwrap());
    let region = pool.slog_region(tag).unwrap();
    assert!(region.available());
    let mut buf = [0u8; 17];
    region.read(4096, &mut buf).unwrap();
    assert_eq!(&buf, b"on the log device");
    assert_eq!(pool.logs()[0].missing().len(), 1);
    drop(region);
    drop(pool);
    // Without any log device the pool still assembles (the dataset layer decides).
    let pool = Arc::new(Pool::open(reopen(&data_paths)).unwrap());
    assert!(!pool.slog_region(tag).unwrap().available());
    drop(pool);
    let pool = Arc::new(Pool::open(reopen(&paths)).unwrap());
    let removed = pool.remove_log(tag).unwrap();
    assert_eq!(removed.len(), 2);
    assert!(pool.logs().is_empty());
    assert_eq!(reopen(&data_paths)[0].1.version, vdev::LABEL_VERSION_PLAIN);
    assert!(reopen(&data_paths)[0].1.logs.is_empty());
    assert!(Vdev::open(&removed[0]).unwrap().read_label().is_err());
}

#[test]
fn a_run_reads_into_block_buffers_as_it_reads_whole() {
    for layout in [LayoutKind::Mirror, raidz(1), raidz(2)] {
        let dir = tempfile::tempdir().unwrap();
        let width = if layout == LayoutKind::Mirror { 2 } else { 5 };
        let pool = Pool::create("t", vec![(layout, devs(dir.path(), width))]).unwrap();
        let unit = pool.groups()[0].unit() as usize;
        // Eight adjacent blocks of whole pages and whole units, one write.
        let len = unit
            .max(16384)
            .next_multiple_of(4096)
            .next_multiple_of(unit);
        let datas: Vec<Vec<u8>> = (0..8).map(|i| pattern(900 + i, len)).collect();
        let dvas = write_adjacent_run(&pool, &datas);
        assert!(
            dvas.iter().all(|d| d.asize as usize == len),
            "whole units: no padding"
        );
        let mut bufs: Vec<vdev::BlockBuf> = (0..8)
            .map(|_| vdev::BlockBuf::new(len).expect("memory"))
            .collect();
        let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
        pool.read_run_into(0, dvas[0].offset, &mut slices).unwrap();
        for (b, d) in bufs.iter().zip(&datas) {
            assert!(
                b[..] == d[..],
                "{layout:?}: a block read into its own buffer"
            );
        }
        // With a side (a column) gone, the run is read from what is left.
        pool.groups()[0].devices()[0].set_state(DeviceState::Offline);
        let mut again: Vec<vdev::BlockBuf> = (0..8)
            .map(|_| vdev::BlockBuf::new(len).expect("memory"))
            .collect();
        let mut slices: Vec<&mut [u8]> = again.iter_mut().map(|b| &mut b[..]).collect();
        pool.read_run_into(0, dvas[0].offset, &mut slices).unwrap();
        for (b, d) in again.iter().zip(&datas) {
            assert!(b[..] == d[..], "{layout:?}: degraded");
        }
        // Past the group's end: refused, not read.
        let mut one = vdev::BlockBuf::new(len).expect("memory");
        let end = pool.groups()[0].capacity();
        assert!(pool.read_run_into(0, end, &mut [&mut one[..]]).is_err());
    }
}

//! The ARC and prefetch: never a stale or unverified block (rewrite,
//! rollback, heal, destroy and recreate), and sequential reads read ahead.

use dataset::*;
#[allow(dead_code)] // each test binary uses a part of the shared helpers
mod common;
use common::{create_pool, read_range};

fn config() -> EngineConfig {
    EngineConfig {
        txg_timeout_secs: 3600.0,
        multihost_interval_ms: 50,
        block_cache_bytes: 64 << 20,
        cache_min_bytes: 16 << 20,
        ..EngineConfig::default()
    }
}

#[track_caller]
fn all(got: &[u8], byte: u8, ctx: &str) {
    if let Some(i) = got.iter().position(|b| *b != byte) {
        panic!("{ctx}: byte {i} is {} not {byte}", got[i]);
    }
}

fn hits(engine: &Engine) -> u64 {
    engine.stats()[0].arc.hits
}

#[test]
fn rewrite_and_rollback_are_never_served_stale() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(&dir.path().join("state"), config()).unwrap();
    create_pool(&engine, dir.path());
    engine
        .create_volume("tank/v", 4 << 20, &[("compression".into(), "lz4".into())])
        .unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    vol.write(0, &vec![1u8; 1 << 20], false).unwrap();
    engine.sync_all().unwrap();
    all(&read_range(&vol, 0, 1 << 20), 1, "first version");
    engine.snapshot(&["tank/v@a".into()], false).unwrap();
    vol.write(0, &vec![2u8; 1 << 20], false).unwrap();
    engine.sync_all().unwrap();
    let before = hits(&engine);
    all(&read_range(&vol, 0, 1 << 20), 2, "rewritten");
    assert!(hits(&engine) > before, "the rewrite is served from the ARC");
    // The snapshot still reads its own version (both are cached now).
    let snap = engine.open_volume("tank/v@a").unwrap();
    all(&read_range(&snap, 0, 1 << 20), 1, "the snapshot");
    all(&read_range(&snap, 0, 1 << 20), 1, "the snapshot, cached");
    engine.rollback("tank/v@a", false).unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    all(&read_range(&vol, 0, 1 << 20), 1, "rolled back");
    // Written again after the rollback: a new version, never the discarded one.
    vol.write(0, &vec![3u8; 1 << 20], false).unwrap();
    all(
        &read_range(&vol, 0, 1 << 20),
        3,
        "rewritten after rollback (open txg)",
    );
    engine.sync_all().unwrap();
    all(&read_range(&vol, 0, 1 << 20), 3, "rewritten after rollback");
    engine.rollback("tank/v@a", false).unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    all(&read_range(&vol, 0, 1 << 20), 1, "rolled back twice");
    // Same again after an export and import (a fresh ARC, txgs go on).
    drop(vol);
    engine.export_pool("tank").unwrap();
    engine
        .import_pool("tank", &[dir.path().to_path_buf()], false)
        .unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    vol.write(0, &vec![4u8; 1 << 20], false).unwrap();
    engine.sync_all().unwrap();
    all(&read_range(&vol, 0, 1 << 20), 4, "after import");
    engine.rollback("tank/v@a", false).unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    all(&read_range(&vol, 0, 1 << 20), 1, "rolled back after import");
}

#[test]
fn destroy_and_recreate_is_never_served_stale() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(&dir.path().join("state"), config()).unwrap();
    create_pool(&engine, dir.path());
    for round in 1..=3u8 {
        engine
            .create_volume("tank/v", 1 << 20, &[("compression".into(), "off".into())])
            .unwrap();
        let vol = engine.open_volume("tank/v").unwrap();
        all(&read_range(&vol, 0, 1 << 20), 0, "a new volume reads zeros");
        vol.write(0, &vec![round; 1 << 20], false).unwrap();
        engine.sync_all().unwrap();
        all(&read_range(&vol, 0, 1 << 20), round, "written");
        all(&read_range(&vol, 0, 1 << 20), round, "cached");
        drop(vol);
        engine
            .destroy("tank/v", &DestroyOptions::default())
            .unwrap();
    }
}

/// The bytes of a cached-only read (decision 0062), or `None` if it would
/// need I/O.
fn try_read(vol: &Volume, offset: u64, len: u64) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    for p in vol.try_read_pieces(offset, len)? {
        match p {
            ReadPiece::Data(..) => out.extend_from_slice(p.data()),
            ReadPiece::Hole(n) => out.resize(out.len() + n as usize, 0),
        }
    }
    assert_eq!(out.len() as u64, len);
    Some(out)
}

/// A read that must not wait (the NBD reader's, decision 0062) is served
/// only when every block is cached (or dirty, or a hole): a miss leaves the
/// ARC's counters alone; what it serves is never stale across a rewrite,
/// an overwrite in the open txg or a rollback.
#[test]
fn a_read_that_must_not_wait_is_served_only_from_cache_and_never_stale() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(&dir.path().join("state"), config()).unwrap();
    create_pool(&engine, dir.path());
    engine
        .create_volume("tank/v", 4 << 20, &[("compression".into(), "off".into())])
        .unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    // Holes need no I/O.
    all(&try_read(&vol, 0, 1 << 20).expect("holes"), 0, "holes");
    vol.write(0, &vec![1u8; 1 << 20], false).unwrap();
    all(
        &try_read(&vol, 0, 1 << 20).expect("open txg"),
        1,
        "open txg",
    );
    engine.sync_all().unwrap();
    engine.snapshot(&["tank/v@a".into()], false).unwrap();
    // A fresh ARC: nothing is cached, so nothing is served or counted.
    drop(vol);
    engine.export_pool("tank").unwrap();
    engine
        .import_pool("tank", &[dir.path().to_path_buf()], false)
        .unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    let arc = |e: &Engine| {
        let a = e.stats()[0].arc;
        (a.hits, a.misses)
    };
    let before = arc(&engine);
    assert!(try_read(&vol, 0, 1 << 20).is_none(), "a cold read waits");
    assert_eq!(arc(&engine), before, "a refused read counts nothing");
    // Half of it cached: still refused, and nothing counted.
    all(&read_range(&vol, 0, 512 << 10), 1, "demand read");
    let before = arc(&engine);
    assert!(try_read(&vol, 0, 1 << 20).is_none(), "half cached");
    assert_eq!(arc(&engine), before);
    all(
        &try_read(&vol, 0, 512 << 10).expect("cached"),
        1,
        "cached half",
    );
    let after = arc(&engine);
    assert_eq!((after.0 - before.0, after.1), (32, before.1), "32 hits");
    all(&read_range(&vol, 0, 1 << 20), 1, "demand read");
    // Overwritten in the open txg, then committed: the new bytes.
    vol.write(4096, &vec![2u8; 8192], false).unwrap();
    let got = try_read(&vol, 0, 1 << 20).expect("cached or dirty");
    all(&got[4096..12288], 2, "open txg over the cache");
    all(&got[12288..], 1, "the rest");
    engine.sync_all().unwrap();
    let got = try_read(&vol, 0, 1 << 20).expect("written blocks are cached");
    all(&got[4096..12288], 2, "committed over the cache");
    all(&got[..4096], 1, "the block's head");
    // Rolled back: the snapshot's bytes, or nothing; never the rewrite.
    engine.rollback("tank/v@a", false).unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    if let Some(got) = try_read(&vol, 0, 1 << 20) {
        all(&got, 1, "rolled back");
    }
    all(&read_range(&vol, 0, 1 << 20), 1, "rolled back, demand read");
    all(
        &try_read(&vol, 0, 1 << 20).expect("cached"),
        1,
        "rolled back, cached",
    );
}

#[test]
fn a_healed_block_is_cached_as_its_verified_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    {
        let engine = Engine::open(&state, config()).unwrap();
        create_pool(&engine, dir.path());
        engine
            .create_volume("tank/v", 1 << 20, &[("compression".into(), "off".into())])
            .unwrap();
        let vol = engine.open_volume("tank/v").unwrap();
        vol.write(0, &data, false).unwrap();
        engine.shutdown().unwrap();
    }
    // Corrupt one side of the mirror behind the engine's back.
    let label = pool::Vdev::open(&dir.path().join("d0"))
        .unwrap()
        .read_label()
        .unwrap();
    let d0 = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("d0"))
        .unwrap();
    use std::os::unix::fs::FileExt;
    for k in 0..16u64 {
        d0.write_all_at(&[0x5a; 64], label.regions.data_offset + k * 65536 + 100)
            .unwrap();
    }
    let engine = Engine::open(&state, config()).unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    assert!(read_range(&vol, 0, 1 << 20) == data, "healed read");
    let before = hits(&engine);
    assert!(
        read_range(&vol, 0, 1 << 20) == data,
        "cached after the heal"
    );
    assert!(hits(&engine) > before, "the second read came from the ARC");
    let st = engine.pool_status("tank").unwrap();
    let cksum: u64 = st.groups[0].devices.iter().map(|d| d.checksum_errors).sum();
    assert!(cksum > 0, "the corruption was seen");
}

/// Blocks are read straight into the buffers the ARC keeps (decision 0069:
/// uncompressed ones by the device read, compressed ones by decompression):
/// a copy damaged on the side that run read is healed from the other side,
/// a block damaged on both is reported, and neither the damaged bytes nor
/// an unverified buffer is ever served or cached.
#[test]
fn damaged_blocks_read_into_the_arcs_own_buffers_are_healed_or_reported() {
    damaged_blocks_are_healed_or_reported("off");
}

#[test]
fn damaged_compressed_blocks_decoded_into_the_arcs_own_buffers_are_healed_or_reported() {
    damaged_blocks_are_healed_or_reported("lz4");
}

fn damaged_blocks_are_healed_or_reported(compression: &str) {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let bs = 16384usize;
    let n = 128usize; // 2 MiB: both mirror sides take runs (by 1 MiB of offset)
                      // A marker (found on the devices, also in an lz4 block's first literals),
                      // 8 KiB of noise and zeros: lz4 stores it in 12 KiB of 16.
    let block = |k: usize| -> Vec<u8> {
        let mut b = vec![0u8; bs];
        b[..8].copy_from_slice(b"COLDBUF!");
        b[8] = k as u8; // no run lz4 could turn into a match
        let mut x = k as u64 * 0x9e37_79b9_7f4a_7c15 + 1;
        for v in &mut b[9..8192] {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *v = x as u8;
        }
        b
    };
    let data: Vec<u8> = (0..n).flat_map(block).collect();
    {
        let engine = Engine::open(&state, config()).unwrap();
        create_pool(&engine, dir.path());
        engine
            .create_volume(
                "tank/v",
                (n * bs) as u64,
                &[
                    ("compression".into(), compression.into()),
                    ("volblocksize".into(), "16K".into()),
                ],
            )
            .unwrap();
        let vol = engine.open_volume("tank/v").unwrap();
        vol.write(0, &data, false).unwrap();
        engine.shutdown().unwrap();
    }
    // Where each block lies on each side (found by its marker).
    use std::os::unix::fs::FileExt;
    let place = |dev: &str| -> Vec<u64> {
        let bytes = std::fs::read(dir.path().join(dev)).unwrap();
        let mut at = vec![u64::MAX; n];
        for off in (0..bytes.len().saturating_sub(128)).step_by(4096) {
            let head = &bytes[off..off + 128];
            if let Some(m) = head.windows(8).position(|w| w == b"COLDBUF!") {
                let k = head[m + 8] as usize;
                if k < n {
                    at[k] = off as u64;
                }
            }
        }
        assert!(
            at.iter().all(|&a| a != u64::MAX),
            "every block found on {dev}"
        );
        at
    };
    let damage = |dev: &str, blocks: &[usize]| {
        let at = place(dev);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join(dev))
            .unwrap();
        for &k in blocks {
            f.write_all_at(&[0x5a; 64], at[k] + 1000).unwrap();
        }
    };
    // One side's copy damaged in both halves (whichever side a run is read
    // from meets some), and block 100 damaged on both sides.
    damage("d0", &[3, 40, 70, 100, 120]);
    damage("d1", &[10, 50, 77, 100, 127]);
    let engine = Engine::open(&state, config()).unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    let lost = 100 * bs as u64;
    for pass in 0..2 {
        for mib in 0..2u64 {
            let (off, len) = (mib << 20, 1u64 << 20);
            let got = vol.read(off, len);
            if (off..off + len).contains(&lost) {
                let e = got.expect_err("a block damaged on both sides is reported");
                assert!(
                    matches!(e, Error::Corrupt(_)),
                    "{compression} pass {pass}: {e}"
                );
                // The rest of that MiB, block by block: healed and right.
                for k in (off as usize / bs)..((off + len) as usize / bs) {
                    if k != 100 {
                        let at = (k * bs) as u64;
                        assert!(
                            read_range(&vol, at, bs as u64)[..] == data[k * bs..(k + 1) * bs],
                            "{compression} pass {pass}: block {k}"
                        );
                    }
                }
            } else {
                assert!(
                    read_range(&vol, off, len)[..] == data[off as usize..(off + len) as usize],
                    "{compression} pass {pass}: MiB {mib} healed"
                );
            }
        }
    }
    assert!(
        vdev::blockbuf::mapped_bytes() > 0,
        "runs were read into block buffers"
    );
    let st = engine.pool_status("tank").unwrap();
    let cksum: u64 = st.groups[0].devices.iter().map(|d| d.checksum_errors).sum();
    assert!(cksum >= 2, "the damage was seen: {cksum}");
    // The healed blocks are cached as their verified bytes; the lost one never is.
    let before = hits(&engine);
    for k in [3usize, 10, 40, 50, 70, 77, 120, 127] {
        let at = (k * bs) as u64;
        assert!(try_read(&vol, at, bs as u64).expect("cached")[..] == data[k * bs..(k + 1) * bs]);
    }
    assert!(hits(&engine) > before);
    assert!(try_read(&vol, lost, bs as u64).is_none(), "never cached");
}

#[test]
fn sequential_reads_are_prefetched() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let data: Vec<u8> = (0..(16u32 << 20)).map(|i| (i / 4096 % 253) as u8).collect();
    {
        let engine = Engine::open(&state, config()).unwrap();
        create_pool(&engine, dir.path());
        engine
            .create_volume("tank/v", 16 << 20, &[("compression".into(), "lz4".into())])
            .unwrap();
        engine
            .open_volume("tank/v")
            .unwrap()
            .write(0, &data, false)
            .unwrap();
        engine.shutdown().unwrap();
    }
    let engine = Engine::open(&state, config()).unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    let chunk = 128u64 << 10;
    for i in 0..(16u64 << 20) / chunk {
        let got = read_range(&vol, i * chunk, chunk);
        assert!(
            got[..] == data[(i * chunk) as usize..((i + 1) * chunk) as usize],
            "chunk {i}"
        );
        // Give the read-ahead threads a moment now and then (bounded).
        if i % 16 == 0 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    let st = engine.stats()[0].clone();
    assert!(st.arc.prefetch_streams >= 1, "{:?}", st.arc);
    assert!(st.arc.prefetch_reads > 0, "{:?}", st.arc);
    assert!(
        st.arc.hits > st.arc.misses,
        "most blocks were read ahead: {:?}",
        st.arc
    );
    assert!(st.prefetch_in_flight <= st.prefetch_max);
}

#[test]
fn prefetch_never_serves_data_past_a_rewrite() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let size = 16u64 << 20;
    {
        let engine = Engine::open(&state, config()).unwrap();
        create_pool(&engine, dir.path());
        engine
            .create_volume("tank/v", size, &[("compression".into(), "off".into())])
            .unwrap();
        let vol = engine.open_volume("tank/v").unwrap();
        vol.write(0, &vec![1u8; size as usize], false).unwrap();
        engine.shutdown().unwrap();
    }
    let engine = Engine::open(&state, config()).unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    // A sequential reader of the first 2 MiB: prefetch reads ahead of it.
    let chunk = 128u64 << 10;
    for i in 0..16 {
        all(&read_range(&vol, i * chunk, chunk), 1, "first pass");
    }
    wait_for("read-ahead", || {
        let st = engine.stats()[0].clone();
        st.arc.prefetch_reads > 0 && st.prefetch_in_flight == 0
    });
    // Rewrite what was read ahead: open txg, then committed.
    vol.write(2 << 20, &vec![2u8; 4 << 20], false).unwrap();
    for i in 16..48 {
        all(
            &read_range(&vol, i * chunk, chunk),
            2,
            "rewritten (open txg)",
        );
    }
    engine.sync_all().unwrap();
    all(
        &read_range(&vol, 2 << 20, 4 << 20),
        2,
        "rewritten (committed)",
    );
    all(&read_range(&vol, 6 << 20, 2 << 20), 1, "beyond the rewrite");
    // A rewrite while the stream goes on and reads ahead concurrently.
    for round in 3..6u8 {
        let at = (round as u64 - 3) * (4 << 20);
        vol.write(at, &vec![round; 4 << 20], false).unwrap();
        engine.sync_all().unwrap();
        for i in 0..32 {
            all(
                &read_range(&vol, at + i * chunk, chunk),
                round,
                &format!("round {round} chunk {i}"),
            );
        }
    }
}

#[test]
fn concurrent_readers_of_cold_blocks_read_each_once() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let size = 8u64 << 20;
    let data: Vec<u8> = (0..size as u32).map(|i| (i / 4096 % 241) as u8).collect();
    {
        let engine = Engine::open(&state, config()).unwrap();
        create_pool(&engine, dir.path());
        engine
            .create_volume("tank/v", size, &[("compression".into(), "off".into())])
            .unwrap();
        let vol = engine.open_volume("tank/v").unwrap();
        vol.write(0, &data, false).unwrap();
        engine.shutdown().unwrap();
    }
    let engine = Engine::open(&state, config()).unwrap();
    let vol = std::sync::Arc::new(engine.open_volume("tank/v").unwrap());
    let before = engine.stats()[0].read_bytes;
    let readers: Vec<_> = (0..4)
        .map(|t| {
            let vol = vol.clone();
            let data = data.clone();
            std::thread::spawn(move || {
                // Each reader walks the volume in 1 MiB steps from its own start.
                for k in 0..8u64 {
                    let at = ((k + t * 2) % 8) << 20;
                    let got = read_range(&vol, at, 1 << 20);
                    assert!(
                        got[..] == data[at as usize..(at + (1 << 20)) as usize],
                        "reader {t} at {at}"
                    );
                }
            })
        })
        .collect();
    for r in readers {
        r.join().unwrap();
    }
    wait_for("read-ahead to settle", || {
        engine.stats()[0].prefetch_in_flight == 0
    });
    let read = engine.stats()[0].read_bytes - before;
    // Every block once (the ARC holds them all); duplicate device reads
    // only for a claim that timed out, which should not happen here.
    assert!(
        read <= size + (size / 8),
        "{read} bytes read from the devices for an {size}-byte volume"
    );
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("timed out waiting for {what}");
}

#[test]
fn l2arc_serves_evicted_blocks_survives_restarts_and_never_lies() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let small = || EngineConfig {
        block_cache_bytes: 1 << 20,
        cache_min_bytes: 1 << 20,
        prefetch_max_bytes: 0,
        l2arc_write_max_bytes: 1 << 30,
        ..config()
    };
    let data: Vec<u8> = (0..(8u32 << 20)).map(|i| (i / 16384 % 241) as u8).collect();
    let l2 = dir.path().join("l2");
    std::fs::File::create(&l2)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let l2_stats = |e: &Engine| e.pool_status("tank").unwrap().cache;
    {
        let engine = Engine::open(&state, small()).unwrap();
        create_pool(&engine, dir.path());
        engine
            .create_volume("tank/v", 8 << 20, &[("compression".into(), "off".into())])
            .unwrap();
        let vol = engine.open_volume("tank/v").unwrap();
        vol.write(0, &data, false).unwrap();
        engine.sync_all().unwrap();
        // Not a cache device of this pool: a pool member.
        let member = engine.add_cache_devices(
            "tank",
            CacheAddSpec {
                devices: vec![dir.path().join("d0")],
                force: false,
            },
        );
        assert!(member.is_err());
        let st = engine
            .add_cache_devices(
                "tank",
                CacheAddSpec {
                    devices: vec![l2.clone()],
                    force: false,
                },
            )
            .unwrap();
        assert_eq!(st.cache.len(), 1);
        assert_eq!(st.cache[0].state, "ONLINE");
        // Twice through a 1 MiB ARC: blocks leave it for the cache device.
        for _ in 0..2 {
            assert!(read_range(&vol, 0, 8 << 20) == data);
        }
        wait_for("the L2ARC feed", || l2_stats(&engine)[0].entries >= 256);
        assert!(
            read_range(&vol, 0, 8 << 20) == data,
            "read through the L2ARC"
        );
        assert!(
            engine.stats()[0].arc.l2_hits > 0,
            "{:?}",
            engine.stats()[0].arc
        );
        // A rewrite is never served from the L2ARC's old copy.
        vol.write(0, &vec![0xee; 1 << 20], false).unwrap();
        engine.sync_all().unwrap();
        all(&read_range(&vol, 0, 1 << 20), 0xee, "rewritten");
        engine.shutdown().unwrap();
    }
    // A restart: the device's index is read back.
    let engine = Engine::open(&state, small()).unwrap();
    wait_for("the cache device to open", || {
        l2_stats(&engine)
            .first()
            .is_some_and(|d| d.state == "ONLINE" && d.entries > 0)
    });
    let vol = engine.open_volume("tank/v").unwrap();
    all(
        &read_range(&vol, 0, 1 << 20),
        0xee,
        "rewritten, after restart",
    );
    assert!(
        read_range(&vol, 1 << 20, 7 << 20) == data[1 << 20..],
        "after restart"
    );
    let hits = engine.stats()[0].arc.l2_hits;
    assert!(hits > 0, "L2ARC hits after a restart");
    // A lying device: flip bytes in every record slot; reads stay right.
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&l2).unwrap();
        for k in 0..(60u64 << 20) / 4096 {
            f.write_all_at(&[0x42; 16], 4096 + k * 4096 + 1000).unwrap();
        }
    }
    drop(vol);
    engine.shutdown().unwrap();
    drop(engine);
    let engine = Engine::open(&state, small()).unwrap();
    wait_for("the cache device to open", || {
        l2_stats(&engine)
            .first()
            .is_some_and(|d| d.state == "ONLINE")
    });
    let vol = engine.open_volume("tank/v").unwrap();
    assert!(
        read_range(&vol, 1 << 20, 7 << 20) == data[1 << 20..],
        "over a corrupted L2ARC"
    );
    let arc = engine.stats()[0].arc;
    assert!(arc.l2_checksum_errors > 0, "{arc:?}");
    // Removing the cache device loses nothing.
    let st = engine.remove_device("tank", l2.to_str().unwrap()).unwrap();
    assert!(st.cache.is_empty());
    assert!(
        read_range(&vol, 1 << 20, 7 << 20) == data[1 << 20..],
        "after remove"
    );
    // A missing cache device never stops an import.
    engine
        .add_cache_devices(
            "tank",
            CacheAddSpec {
                devices: vec![l2.clone()],
                force: false,
            },
        )
        .unwrap();
    drop(vol);
    engine.shutdown().unwrap();
    drop(engine);
    std::fs::remove_file(&l2).unwrap();
    let engine = Engine::open(&state, small()).unwrap();
    wait_for("the missing cache device to be reported", || {
        l2_stats(&engine)
            .first()
            .is_some_and(|d| d.state == "UNAVAIL")
    });
    let vol = engine.open_volume("tank/v").unwrap();
    assert!(
        read_range(&vol, 1 << 20, 7 << 20) == data[1 << 20..],
        "without the cache device"
    );
}

/// Decision 0073: a partial write's commit merges into the ARC's buffer of
/// the version it replaces, but only when nothing else holds that version:
/// a reader's bytes, a snapshot's version and a hole stay as they were.
#[test]
fn partial_writes_merge_in_place_only_into_versions_nobody_holds() {
    let dir = tempfile::tempdir().unwrap();
    // No read-ahead: one in flight when a commit takes a version out of the
    // ARC may put that version back (a key of its own birth, never served
    // for the new pointer), which would make the entry count below race.
    let cfg = EngineConfig {
        prefetch_max_bytes: 0,
        ..config()
    };
    let engine = Engine::open(&dir.path().join("state"), cfg).unwrap();
    create_pool(&engine, dir.path());
    engine
        .create_volume(
            "tank/v",
            1 << 20,
            &[
                ("compression".into(), "off".into()),
                ("volblocksize".into(), "16K".into()),
            ],
        )
        .unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    vol.write(0, &vec![1u8; 64 << 10], false).unwrap();
    engine.sync_all().unwrap();
    let entries = |e: &Engine| e.stats()[0].arc.entries;
    let cached = entries(&engine);
    // Block 0: a reader holds its bytes across the commit of a partial write.
    let held = vol.read_pieces(0, 16 << 10).unwrap();
    vol.write(0, &[2u8; 4096], false).unwrap();
    engine.sync_all().unwrap();
    let got: Vec<u8> = held.iter().flat_map(|p| p.data().to_vec()).collect();
    all(&got, 1, "bytes a reader held while the block was rewritten");
    drop(held);
    let now = read_range(&vol, 0, 16 << 10);
    all(&now[..4096], 2, "block 0, new bytes");
    all(&now[4096..], 1, "block 0, old bytes");
    // Block 1: nobody holds it: the new version takes the old one's place.
    vol.write((16 << 10) + 8192, &[3u8; 4096], false).unwrap();
    engine.sync_all().unwrap();
    assert_eq!(entries(&engine), cached, "old versions left the ARC");
    let now = read_range(&vol, 16 << 10, 16 << 10);
    all(&now[..8192], 1, "block 1 before the write");
    all(&now[8192..12288], 3, "block 1, new bytes");
    all(&now[12288..], 1, "block 1 after the write");
    // Block 2 after a snapshot: the snapshot's version stays cached and intact.
    engine.snapshot(&["tank/v@s".into()], false).unwrap();
    vol.write(32 << 10, &[4u8; 4096], false).unwrap();
    engine.sync_all().unwrap();
    assert_eq!(
        entries(&engine),
        cached + 1,
        "the snapshot's version is kept"
    );
    let snap = engine.open_volume("tank/v@s").unwrap();
    let before = hits(&engine);
    all(&read_range(&snap, 32 << 10, 16 << 10), 1, "the snapshot");
    assert!(
        hits(&engine) > before,
        "the snapshot's version served from the ARC"
    );
    let now = read_range(&vol, 32 << 10, 16 << 10);
    all(&now[..4096], 4, "block 2, new bytes");
    all(&now[4096..], 1, "block 2, old bytes");
    // A hole: the partial block's own bytes, zeros around the write.
    vol.write((256 << 10) + 4096, &[5u8; 4096], false).unwrap();
    engine.sync_all().unwrap();
    let now = read_range(&vol, 256 << 10, 16 << 10);
    all(&now[..4096], 0, "hole before the write");
    all(&now[4096..8192], 5, "hole, new bytes");
    all(&now[8192..], 0, "hole after the write");
    // Everything as written after a restart (verified from disk).
    drop((vol, snap));
    engine.export_pool("tank").unwrap();
    engine
        .import_pool("tank", &[dir.path().to_path_buf()], false)
        .unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    let now = read_range(&vol, 0, 48 << 10);
    all(&now[..4096], 2, "block 0 after import");
    all(&now[4096..16384 + 8192], 1, "blocks 0-1 after import");
    all(&now[16384 + 8192..16384 + 12288], 3, "block 1 after import");
    all(&now[32768..32768 + 4096], 4, "block 2 after import");
    all(&now[32768 + 4096..], 1, "block 2 after import");
}

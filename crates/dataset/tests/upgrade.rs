//! Pools made by earlier builds stay readable: a pool written in metadata
//! format 2 (before the object layer, `fixtures/format2-pool.tar.gz`) is
//! refused by name with the command that converts it, and `pool upgrade`
//! converts it with its data and snapshots whole.

use dataset::*;
#[allow(dead_code)] // each test binary uses a part of the shared helpers
mod common;
use common::read_range;
use std::path::Path;

fn config() -> EngineConfig {
    EngineConfig {
        multihost_interval_ms: 50,
        ..EngineConfig::default()
    }
}

fn unpack(dir: &Path) {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format2-pool.tar.gz");
    let ok = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(&fixture)
        .arg("-C")
        .arg(dir)
        .status()
        .unwrap()
        .success();
    assert!(ok, "cannot unpack {}", fixture.display());
}

#[test]
fn a_format_2_pool_is_refused_by_name_then_upgraded_whole() {
    let dir = tempfile::tempdir().unwrap();
    unpack(dir.path());
    let state = dir.path().join("state");
    let engine = Engine::open(&state, config()).unwrap();
    let err = engine
        .import_pool("old", &[dir.path().to_path_buf()], false)
        .unwrap_err();
    assert!(matches!(err, Error::NeedsUpgrade(_)), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("metadata format 2") && msg.contains("cistern pool upgrade old"),
        "{msg}"
    );
    assert!(
        engine.list_pools().is_empty(),
        "nothing imported, nothing written"
    );

    let v = engine.upgrade_pool("old", true).unwrap();
    assert_eq!(v.meta_format, 3);
    assert!(
        v.upgraded.iter().any(|s| s.contains("2 -> 3")),
        "{:?}",
        v.upgraded
    );
    let pattern: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
    let vol = engine.open_volume("old/vol").unwrap();
    let head = read_range(&vol, 0, 1 << 20);
    assert!(head[..65536].iter().all(|&b| b == 0xab));
    assert_eq!(&head[65536..], &pattern[65536..]);
    let snap = engine.open_volume("old/vol@before").unwrap();
    assert_eq!(read_range(&snap, 0, 1 << 20), pattern);
    // The converted block map keeps the snapshot's space exact.
    let used = |name: &str| {
        engine
            .dataset(name)
            .unwrap()
            .property("used")
            .unwrap()
            .parsable
            .parse::<u64>()
            .unwrap()
    };
    assert!(
        used("old/vol@before") >= 65536,
        "the overwritten 64K is the snapshot's"
    );
    // A scrub walks the converted map and finds nothing wrong.
    engine.scrub_pool("old", ScrubAction::Start).unwrap();
    for _ in 0..200 {
        let s = engine.pool_status("old").unwrap().scan.unwrap();
        if s.state != ScanState::Scanning {
            assert_eq!((s.state, s.errors), (ScanState::Finished, 0), "{s:?}");
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop((vol, snap));
    engine.shutdown().unwrap();
    drop(engine);
    // Converted for good: the next start imports it from the cache file.
    let engine = Engine::open(&state, config()).unwrap();
    let vol = engine.open_volume("old/vol").unwrap();
    assert_eq!(&read_range(&vol, 65536, 65536)[..], &pattern[65536..131072]);
    drop(vol);
    engine.shutdown().unwrap();
}

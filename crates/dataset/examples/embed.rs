//! Measures what embedding tiny objects in their metadata row buys, to
//! choose `[engine] embed_max_bytes` (decision 0017): for each object size
//! and threshold, PUT-like writes (create, write, link, commit every 16)
//! and cold reads (after a restart) of N objects, with the data and
//! metadata bytes they took.
//!
//! `cargo run --release -p dataset --example embed -- DIR [N]` (DIR on the
//! disk to measure; it is emptied).

use dataset::objects::{ObjectKind, ROOT_DIR};
use dataset::*;
use std::path::Path;
use std::time::Instant;

fn engine(dir: &Path, embed: u64) -> std::sync::Arc<Engine> {
    let config = EngineConfig {
        embed_max_bytes: embed,
        multihost_interval_ms: 50,
        ..EngineConfig::default()
    };
    Engine::open(&dir.join("state"), config).expect("engine")
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().expect("usage: embed DIR [N]"));
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(5000);
    println!("objects\tsize\tembed_max\tput/s\tcold get/s\tdata bytes/object\tmeta bytes/object");
    for size in [1024usize, 2048, 4096] {
        for embed in [0u64, 2048, 4096] {
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("dir");
            let e = engine(&dir, embed);
            e.create_pool(PoolSpec {
                name: "m".into(),
                groups: vec![GroupSpec {
                    kind: GroupKind::Disk,
                    devices: vec![dir.join("d0")],
                }],
                create_size: Some(4 << 30),
                force: false,
            })
            .expect("pool");
            e.create_dataset(
                "m/b",
                DatasetKind::Bucket,
                &[("compression".into(), "off".into())],
            )
            .expect("bucket");
            let set = e.open_objects("m/b").expect("open");
            let meta0 = meta_used(&e);
            let data0 = e.stats()[0].allocated;
            let body: Vec<u8> = (0..size).map(|i| (i * 131 % 251) as u8 ^ 0x5a).collect();
            let t = Instant::now();
            for i in 0..n {
                let obj = set.create(ObjectKind::File, b"").expect("create");
                set.write(obj, 0, &body).expect("write");
                set.link(ROOT_DIR, &format!("k{i:08}"), obj).expect("link");
                if i % 16 == 15 {
                    set.commit().expect("commit");
                }
            }
            set.commit().expect("commit");
            let put = n as f64 / t.elapsed().as_secs_f64();
            e.sync_all().expect("sync");
            let data = e.stats()[0].allocated - data0;
            let meta = meta_used(&e).saturating_sub(meta0);
            drop(set);
            e.shutdown().expect("shutdown");
            drop(e);
            // Cold: a new daemon, empty caches (the OS page cache aside).
            let e = engine(&dir, embed);
            let set = e.open_objects("m/b").expect("open");
            let t = Instant::now();
            for i in (0..n).step_by(7).chain((1..n).step_by(7)) {
                let obj = set
                    .lookup(ROOT_DIR, &format!("k{i:08}"))
                    .expect("lookup")
                    .expect("name");
                assert_eq!(set.read(obj, 0, size as u64).expect("read").len(), size);
            }
            let reads = (0..n).step_by(7).count() + (1..n).step_by(7).count();
            let get = reads as f64 / t.elapsed().as_secs_f64();
            println!(
                "{n}\t{size}\t{embed}\t{put:.0}\t{get:.0}\t{}\t{}",
                data / n as u64,
                meta / n as u64
            );
            drop(set);
            e.shutdown().expect("shutdown");
        }
    }
}

fn meta_used(e: &Engine) -> u64 {
    e.stats()[0].metadata_used
}

//! Listing and looking up names of a plain bucket against an encrypted one
//! with sealed names (decision 0035), committed and read warm: a full
//! listing in pages of 1000 (S3 ListObjectsV2), a prefix page, a
//! delimiter-style walk (one name per call, skipping each common prefix),
//! and a lookup of every name. Prints both and the ratio.
//!
//! `cargo run --release -p dataset --example names -- DIR [N]` (DIR is emptied).

use dataset::objects::{ObjectKind, ObjectSet, ROOT_DIR};
use dataset::*;
use std::time::Instant;

fn timed(f: impl FnOnce() -> usize) -> (f64, usize) {
    let t = Instant::now();
    let n = f();
    (t.elapsed().as_secs_f64(), n)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().expect("usage: names DIR [N]"));
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let config = EngineConfig {
        multihost_interval_ms: 50,
        ..EngineConfig::default()
    };
    let e = Engine::open(&dir.join("state"), config).expect("engine");
    e.create_pool(PoolSpec {
        name: "m".into(),
        groups: vec![GroupSpec {
            kind: GroupKind::Disk,
            devices: vec![dir.join("d0")],
        }],
        create_size: Some(2 << 30),
        force: false,
    })
    .expect("pool");
    e.create_dataset("m/plain", DatasetKind::Bucket, &[])
        .expect("plain");
    let props: Vec<(String, String)> = [("encryption", "on"), ("keyformat", "hex")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    e.create_dataset_keyed(
        "m/sealed",
        DatasetKind::Bucket,
        &props,
        Some(&KeyMaterial::from_bytes("7e".repeat(32).as_bytes())),
    )
    .expect("sealed");
    // 100 "directories" of n/100 keys: a delimiter listing has 100 common prefixes.
    let keys: Vec<String> = (0..n)
        .map(|i| format!("photos/{:03}/img-{i:06}.jpg", i % 100))
        .collect();
    let fill = |set: &ObjectSet| {
        for (i, k) in keys.iter().enumerate() {
            let obj = set.create(ObjectKind::File, b"").expect("create");
            set.link(ROOT_DIR, k, obj).expect("link");
            if i % 1000 == 999 {
                set.commit().expect("commit");
            }
        }
    };
    let plain = e.open_objects("m/plain").expect("open");
    let sealed = e.open_objects("m/sealed").expect("open");
    let (put_plain, _) = timed(|| {
        fill(&plain);
        0
    });
    let (put_sealed, _) = timed(|| {
        fill(&sealed);
        0
    });
    e.sync_all().expect("sync");
    let full = |set: &ObjectSet| {
        let mut after: Option<String> = None;
        let mut seen = 0;
        loop {
            let page = set
                .list(ROOT_DIR, "", after.as_deref(), 1000)
                .expect("list");
            let Some(last) = page.last() else { break };
            after = Some(last.0.clone());
            seen += page.len();
        }
        seen
    };
    let prefix = |set: &ObjectSet| {
        set.list(ROOT_DIR, "photos/042/", None, 1000)
            .expect("list")
            .len()
    };
    // As S3's delimiter listing walks: the next name, then past its common prefix.
    let delimiter = |set: &ObjectSet| {
        let mut after = String::from("photos/");
        let mut prefixes = 0;
        loop {
            let page = set
                .list(ROOT_DIR, "photos/", Some(&after), 1)
                .expect("list");
            let Some((name, _)) = page.first() else { break };
            let cut = name["photos/".len()..]
                .find('/')
                .map_or(name.len(), |i| i + 8);
            after = format!("{}\u{10ffff}", &name[..cut]);
            prefixes += 1;
        }
        prefixes
    };
    let lookups = |set: &ObjectSet| {
        keys.iter()
            .filter(|k| set.lookup(ROOT_DIR, k).expect("lookup").is_some())
            .count()
    };
    println!("{n} names, warm, one-device pool; seconds (plain / sealed = ratio)");
    println!(
        "link {n} (create+link, commit every 1000)\t{put_plain:.3}\t{put_sealed:.3}\t{:.2}x",
        put_sealed / put_plain
    );
    type Case<'a> = (&'a str, &'a dyn Fn(&ObjectSet) -> usize);
    let cases: [Case; 4] = [
        ("full listing, pages of 1000", &full),
        ("one prefix page (100 names)", &prefix),
        ("delimiter walk (100 prefixes)", &delimiter),
        ("lookup of every name", &lookups),
    ];
    for (what, f) in cases {
        let (a, na) = timed(|| f(&plain));
        let (b, nb) = timed(|| f(&sealed));
        assert_eq!(na, nb, "{what}: both datasets answer the same");
        println!("{what} [{na}]\t{a:.3}\t{b:.3}\t{:.2}x", b / a);
    }
    if let Ok(s) = std::fs::read_to_string("/proc/self/status") {
        if let Some(l) = s.lines().find(|l| l.starts_with("VmHWM")) {
            println!(
                "peak RSS of this process: {}",
                l.trim_start_matches("VmHWM:").trim()
            );
        }
    }
}

//! Replays the fuzz corpus on stable Rust in the normal suite (decision
//! 0027): every file of `fuzz/corpus/<target>/` and `fuzz/regressions/<target>/`,
//! and the seeds, goes through the entry function its fuzz target calls.
//! A panic (what the fuzzer reports as a crash) fails the test and names
//! the file.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::Instant;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

#[test]
fn corpus_and_regressions_replay_without_panics() {
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut total = 0;
    for (target, entry) in fuzzing::TARGETS {
        let corpus = files(&fuzz_dir().join("corpus").join(target));
        assert!(
            !corpus.is_empty(),
            "fuzz/corpus/{target}/ is empty: run `cargo run -p fuzzing --example write_seeds`"
        );
        let regressions = files(&fuzz_dir().join("regressions").join(target));
        let mut inputs: Vec<(String, Vec<u8>)> = fuzzing::seeds::seeds(target)
            .into_iter()
            .map(|(n, b)| (format!("seeds::{n}"), b))
            .collect();
        for p in corpus.iter().chain(&regressions) {
            let bytes = std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            inputs.push((p.display().to_string(), bytes));
        }
        for (name, bytes) in inputs {
            total += 1;
            if catch_unwind(AssertUnwindSafe(|| entry(&bytes))).is_err() {
                failures.push(format!("{target}: {name}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "inputs that panic:\n{}",
        failures.join("\n")
    );
    assert!(total > 0);
    eprintln!("{total} inputs replayed in {:?}", started.elapsed());
}

#[test]
fn every_target_has_a_fuzz_target_file() {
    for (target, _) in fuzzing::TARGETS {
        let p = fuzz_dir().join("fuzz_targets").join(format!("{target}.rs"));
        let src = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(
            src.contains(&format!("fuzzing::{target}(")),
            "{} does not call fuzzing::{target}",
            p.display()
        );
    }
}

fn seed(target: &str, name: &str) -> Vec<u8> {
    fuzzing::seeds::seeds(target)
        .into_iter()
        .find(|(n, _)| n == &format!("seed-{name}"))
        .unwrap_or_else(|| panic!("no seed {target}/{name}"))
        .1
}

/// The seeds reach the deep end of each decoder (so the fuzzer starts from
/// there), not just its first error.
#[test]
fn seeds_reach_what_they_encode() {
    use nbd::fuzzing::HandshakeEnd;
    let (end, _) = nbd::fuzzing::handshake(&seed("nbd_handshake", "go-structured-meta"));
    assert_eq!(
        end,
        HandshakeEnd::Transmission {
            export: "vol0".into(),
            structured: true,
            contexts: 2
        }
    );
    let (end, out) = nbd::fuzzing::handshake(&seed("nbd_handshake", "export-name-zeroes"));
    assert!(matches!(end, HandshakeEnd::Transmission { ref export, .. } if export == "vol0"));
    assert_eq!(
        out.len(),
        18 + 134,
        "greeting, then size, flags and 124 zeroes"
    );

    // Ten requests, the last NBD_CMD_DISC: nine replies; without structured
    // replies BLOCK_STATUS (3) and READ with DF (8) are refused, and the read
    // past the end (9).
    let replies = nbd::fuzzing::transmission(&seed("nbd_transmission", "simple"));
    assert_eq!(replies.len(), 9);
    for r in &replies {
        let refused = r[4..8] != [0, 0, 0, 0];
        let handle = u64::from_be_bytes(r[8..16].try_into().expect("8 bytes"));
        assert_eq!(refused, [3, 8, 9].contains(&handle), "{r:?}");
    }
    let ro = nbd::fuzzing::transmission(&seed("nbd_transmission", "read-only"));
    assert_eq!(ro.len(), 9);

    let area = &seed("vdev_label", "label-area")[1..];
    let label = vdev::fuzzing::decode_label(area)
        .expect("decodes")
        .expect("a label");
    assert_eq!(label.pool_name, "tank");
    assert!(vdev::fuzzing::decode_mmp(&seed("vdev_label", "mmp-slot")[1..]).is_some());

    let bp = block::BlockPointer::decode(&seed("block_bp", "embedded-zstd")[1..]).expect("decodes");
    let data = block::decode_verified(&bp, bp.embedded.as_ref().expect("embedded"));
    assert_eq!(data.expect("verifies").len(), bp.lsize as usize);

    let cp = intent_log::Checkpoint {
        applied_seq: 1,
        replay_pos: 0,
        expect_seq: 1,
        tag: 0,
    };
    let (records, _, next) =
        intent_log::fuzzing::replay(&seed("intent_log", "region")[1..], fuzzing::LOG_GUID, cp);
    assert_eq!(
        records.iter().map(|r| r.seq).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    assert_eq!(next, 6);

    let (records, err) = nfs::fuzzing::records(&seed("nfs_rpc", "nfs-procedures"), 64);
    assert!(err.is_none());
    assert_eq!(records.len(), 16);
    for r in &records {
        let d = nfs::fuzzing::call(r).expect("a call");
        assert!(matches!(d.args, Some(Ok(_))), "{d:?}");
        assert!(
            !d.handles.is_empty() && d.handles.iter().all(|h| h.is_ok()),
            "{d:?}"
        );
    }
    let (records, _) = nfs::fuzzing::records(&seed("nfs_rpc", "fragments"), 64);
    assert_eq!(records.len(), 1, "two fragments make one record");
    let (records, _) = nfs::fuzzing::records(&seed("nfs_rpc", "garbage-args"), 64);
    let d = nfs::fuzzing::call(&records[0]).expect("a call");
    assert!(matches!(d.args, Some(Err(_))), "{d:?}");

    let text = String::from_utf8(seed("config", "full")).expect("utf-8");
    let cfg = cistern::config::Config::parse(&text).expect("the full seed parses");
    assert!(cfg.s3.is_some() && cfg.nfs.is_some() && cfg.policy.contains_key("vm"));
}

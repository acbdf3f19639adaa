//! The entry functions of the fuzz targets (decision 0027). Each fuzz target
//! in `fuzz/fuzz_targets/` is one line calling the function of its name, and
//! `tests/corpus.rs` feeds every file of `fuzz/corpus/<target>/` and
//! `fuzz/regressions/<target>/` through the same function on stable Rust,
//! so a crash the fuzzer found stays fixed.
//!
//! Every entry asserts that the decoders it drives never panic (a panic is
//! what the fuzzer reports) and, where the product has an encoder, that
//! decoding an encoding gives back what was encoded. Inputs whose first byte
//! is a mode select between raw bytes (what a disk or a peer could hand the
//! decoder) and structure-aware inputs built with `arbitrary`, which get
//! past checksums that random bytes never match.

use arbitrary::{Arbitrary, Unstructured};

pub mod seeds;

/// An entry function: panics on a bug, returns otherwise.
pub type Entry = fn(&[u8]);

/// Every target: name (as in `fuzz/fuzz_targets/<name>.rs`) and entry.
pub const TARGETS: &[(&str, Entry)] = &[
    ("nbd_handshake", nbd_handshake),
    ("nbd_transmission", nbd_transmission),
    ("vdev_label", vdev_label),
    ("block_bp", block_bp),
    ("intent_log", intent_log),
    ("config", config),
    ("nfs_rpc", nfs_rpc),
    ("s3_parsers", s3_parsers),
    ("send_stream", send_stream),
    ("objstore_record", objstore_record),
    ("bucket_entry", bucket_entry),
];

// ------------------------------------------------------------------ NBD

/// The server side of the fixed newstyle handshake (option haggling) with
/// `data` as everything the client sends.
pub fn nbd_handshake(data: &[u8]) {
    let _ = nbd::fuzzing::handshake(data);
}

/// Transmission requests (headers, flags, WRITE payloads) decoded and run
/// on an in-memory export; see [`nbd::fuzzing::transmission`].
pub fn nbd_transmission(data: &[u8]) {
    let _ = nbd::fuzzing::transmission(data);
}

// ------------------------------------------------------------------ labels

/// Mode byte, then: 0 a raw label area; 1 label JSON under a valid header
/// (past the blake3 check); 2 an arbitrary label, encoded and decoded;
/// 3 a raw MMP slot; 4 MMP stamp JSON under a valid header.
pub fn vdev_label(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 5 {
        0 => check_label(rest),
        1 => check_label(&with_header(
            b"CISTLABL",
            1 + u32::from(mode & 0x80 != 0),
            rest,
        )),
        2 => {
            let Ok(label) = arbitrary_label(&mut Unstructured::new(rest)) else {
                return;
            };
            if let Ok(area) = vdev::fuzzing::encode_label(&label) {
                let back = vdev::fuzzing::decode_label(&area).expect("an encoded label decodes");
                assert_eq!(back, Some(label), "decode(encode(label)) != label");
            }
        }
        3 => check_mmp(rest),
        _ => check_mmp(&with_header(b"CISTMMP1", vdev::MMP_VERSION, rest)),
    }
}

/// `magic | u32 version | u32 len | blake3(json) | json`, as labels and
/// MMP stamps are laid out (docs/on-disk-format.md).
fn with_header(magic: &[u8; 8], version: u32, json: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(48 + json.len());
    b.extend_from_slice(magic);
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&(json.len() as u32).to_le_bytes());
    b.extend_from_slice(blake3_hash(json).as_slice());
    b.extend_from_slice(json);
    b
}

fn blake3_hash(b: &[u8]) -> [u8; 32] {
    *blake3::hash(b).as_bytes()
}

fn check_label(area: &[u8]) {
    if let Ok(Some(label)) = vdev::fuzzing::decode_label(area) {
        if let Ok(again) = vdev::fuzzing::encode_label(&label) {
            let back = vdev::fuzzing::decode_label(&again).expect("a re-encoded label decodes");
            assert_eq!(back, Some(label), "decode(encode(label)) != label");
        }
    }
}

fn check_mmp(slot: &[u8]) {
    if let Some(stamp) = vdev::fuzzing::decode_mmp(slot) {
        let again = vdev::fuzzing::encode_mmp(&stamp);
        // A stamp whose JSON grew past the slot is cut on write (and then
        // reads as none): only compare what fits.
        if let Some(back) = vdev::fuzzing::decode_mmp(&again) {
            assert_eq!(back, stamp, "decode(encode(stamp)) != stamp");
        }
    }
}

fn arbitrary_label(u: &mut Unstructured<'_>) -> arbitrary::Result<vdev::Label> {
    let kind = |u: &mut Unstructured<'_>| -> arbitrary::Result<vdev::LayoutKind> {
        Ok(match u.int_in_range(0..=2)? {
            0 => vdev::LayoutKind::Disk,
            1 => vdev::LayoutKind::Mirror,
            _ => vdev::LayoutKind::Raidz {
                parity: u.arbitrary()?,
            },
        })
    };
    let mut groups = Vec::new();
    for _ in 0..u.int_in_range(0..=4)? {
        groups.push(vdev::GroupLayout {
            kind: kind(u)?,
            devices: u.arbitrary()?,
            data_size: u.arbitrary()?,
            resilvering: u.arbitrary()?,
        });
    }
    let owner = if u.arbitrary()? {
        Some(vdev::Owner {
            hostname: u.arbitrary()?,
            hostid: u.arbitrary()?,
            pid: u.arbitrary()?,
            instance: u.arbitrary()?,
            state_dir: u.arbitrary()?,
        })
    } else {
        None
    };
    let state = match u.int_in_range(0..=2)? {
        0 => None,
        1 => Some(vdev::PoolState::Active),
        _ => Some(vdev::PoolState::Exported),
    };
    Ok(vdev::Label {
        version: u.int_in_range(0..=vdev::LABEL_VERSION)?,
        pool_name: u.arbitrary()?,
        pool_guid: u.arbitrary()?,
        device_guid: u.arbitrary()?,
        group: u.arbitrary()?,
        child: u.arbitrary()?,
        groups,
        regions: vdev::Regions {
            meta_offset: u.arbitrary()?,
            meta_size: u.arbitrary()?,
            log_offset: u.arbitrary()?,
            log_size: u.arbitrary()?,
            data_offset: u.arbitrary()?,
        },
        exported: u.arbitrary()?,
        state,
        owner,
        generation: u.arbitrary()?,
        logs: Vec::new(),
        log_device: u.arbitrary()?,
    })
}

// ------------------------------------------------------------------ block pointers

/// Largest logical size the entry decompresses to (the product's blocks
/// are at most 16 MiB; a fuzzed pointer may claim 4 GiB).
const MAX_LSIZE: u32 = 1 << 20;

/// Mode byte, then: 0 raw block pointer bytes (re-encoding a decoded
/// pointer gives the same bytes; an embedded block's payload is verified
/// and decompressed as a read does); 1 an arbitrary pointer, encoded and
/// decoded; 2 `algo | u16 lsize | stored bytes` through decompress;
/// 3 bytes compressed with each setting and decompressed back.
pub fn block_bp(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 4 {
        0 => {
            if let Ok(bp) = block::BlockPointer::decode(rest) {
                assert_eq!(bp.encode(), rest, "encode(decode(bytes)) != bytes");
                if let Some(stored) = &bp.embedded {
                    if bp.lsize <= MAX_LSIZE {
                        let _ = block::decode_verified(&bp, stored);
                        let _ = block::decompress(bp.compression, stored, bp.lsize as usize);
                    }
                }
            }
        }
        1 => {
            let Ok(bp) = arbitrary_bp(&mut Unstructured::new(rest)) else {
                return;
            };
            let back =
                block::BlockPointer::decode(&bp.encode()).expect("an encoded pointer decodes");
            assert_eq!(back, bp, "decode(encode(bp)) != bp");
        }
        2 => {
            let [algo, a, b, stored @ ..] = rest else {
                return;
            };
            let Some(algo) = block::CompressionAlgo::from_code(algo % 4) else {
                return;
            };
            let lsize = usize::from(u16::from_le_bytes([*a, *b]));
            if let Ok(out) = block::decompress(algo, stored, lsize) {
                assert_eq!(out.len(), lsize);
            }
        }
        _ => {
            for setting in block::Compression::all_settings() {
                if matches!(setting, block::Compression::Zstd(l) if l > 3)
                    || matches!(setting, block::Compression::Gzip(l) if l > 1)
                {
                    continue; // the slow levels add no decoder coverage
                }
                if let Some(c) = block::compress(setting, rest) {
                    let back = block::decompress(setting.algo(), &c, rest.len())
                        .expect("a compressed block decompresses");
                    assert_eq!(back, rest, "decompress(compress(x)) != x");
                }
            }
        }
    }
}

fn arbitrary_bp(u: &mut Unstructured<'_>) -> arbitrary::Result<block::BlockPointer> {
    let ndva = u.int_in_range(0..=block::MAX_DVAS)?;
    let mut dvas = block::Dvas::new();
    for _ in 0..ndva {
        dvas.push(pool::Dva {
            group: u.arbitrary()?,
            offset: u.arbitrary()?,
            asize: u.arbitrary()?,
        });
    }
    let embedded: Option<Vec<u8>> = if ndva == 0 {
        Some(u.arbitrary()?)
    } else {
        None
    };
    let psize = match &embedded {
        Some(e) => e.len() as u32,
        None => u.arbitrary()?,
    };
    let compression = block::CompressionAlgo::from_code(u.int_in_range(0..=3)?)
        .ok_or(arbitrary::Error::IncorrectFormat)?;
    Ok(block::BlockPointer {
        dvas,
        lsize: u.arbitrary()?,
        psize,
        compression,
        checksum_algo: block::ChecksumAlgo::Blake3,
        checksum: u.arbitrary()?,
        birth: u.arbitrary()?,
        embedded,
        // Version 2 pointers (encrypted blocks) carry a nonce and a tag.
        crypt: if u.arbitrary()? {
            Some(block::BlockCrypt {
                algo: block::crypt::CryptAlgo::Aes256Gcm,
                nonce: u.arbitrary()?,
                tag: u.arbitrary()?,
            })
        } else {
            None
        },
    })
}

// ------------------------------------------------------------------ intent log

/// The pool guid the intent-log target's records are written for.
pub const LOG_GUID: u64 = 0x5eed_0fc1_57e2;

/// Mode byte, then: 0 a raw log region replayed from position 0; 1 an
/// arbitrary run of records (with jumps, bad kinds, gaps in sequence
/// numbers and byte flips) written as the log writes them and replayed
/// from an arbitrary checkpoint. Replay never panics, returns records in
/// sequence order from the checkpoint on, and an undamaged run of records
/// comes back exactly as written.
pub fn intent_log(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        let cp = intent_log::Checkpoint {
            applied_seq: 1,
            replay_pos: 0,
            expect_seq: 1,
            tag: 0,
        };
        check_replay(rest, cp);
        return;
    }
    let _ = structured_log(&mut Unstructured::new(rest));
}

fn check_replay(region: &[u8], cp: intent_log::Checkpoint) -> Vec<intent_log::LogRecord> {
    let (records, pos, seq) = intent_log::fuzzing::replay(region, LOG_GUID, cp);
    assert!(
        records.windows(2).all(|w| w[0].seq < w[1].seq),
        "records out of order"
    );
    assert!(
        records.iter().all(|r| r.seq >= cp.applied_seq),
        "record before the checkpoint"
    );
    assert!(seq >= cp.expect_seq, "replay went back in sequence");
    assert!(
        pos <= region.len() as u64 || pos == cp.replay_pos,
        "next record past the region"
    );
    records
}

#[derive(Debug, Arbitrary)]
struct Rec {
    kind: u8,
    /// Replaces the next sequence number when set (a gap or a stale record).
    seq: Option<u64>,
    dataset: u64,
    offset: u64,
    length: u64,
    payload: Vec<u8>,
}

fn structured_log(u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
    let size = u.int_in_range(80..=16384usize)?;
    let start_seq: u64 = u.arbitrary()?;
    let recs: Vec<Rec> = u.arbitrary()?;
    let mut region = Vec::with_capacity(size);
    let mut written = Vec::new();
    let mut seq = start_seq;
    let mut clean = true;
    for r in recs {
        let kind = intent_log::fuzzing::record_kind(r.kind);
        let s = r.seq.unwrap_or(seq);
        clean &= r.seq.is_none() && kind.is_some_and(|k| k != intent_log::RecordKind::Jump);
        let k = kind.unwrap_or(intent_log::RecordKind::Write);
        let before = region.len();
        intent_log::fuzzing::encode_record(
            LOG_GUID,
            k,
            s,
            r.dataset,
            r.offset,
            r.length,
            &r.payload,
            &mut region,
        );
        if kind.is_none() {
            region[before + 4] = r.kind; // an unknown kind: replay stops there
        }
        if region.len() > size {
            region.truncate(before);
            break;
        }
        written.push(intent_log::LogRecord {
            seq: s,
            kind: k,
            dataset: r.dataset,
            offset: r.offset,
            length: r.length,
            payload: r.payload,
        });
        seq = s.wrapping_add(1);
    }
    region.resize(size, 0);
    let flips: Vec<(u16, u8)> = u.arbitrary()?;
    for (at, x) in &flips {
        let at = usize::from(*at) % size;
        region[at] ^= x;
    }
    clean &= flips.iter().all(|(_, x)| *x == 0);
    let cp = if u.arbitrary()? {
        intent_log::Checkpoint {
            applied_seq: u.arbitrary()?,
            replay_pos: u.arbitrary()?,
            expect_seq: u.arbitrary()?,
            tag: 0,
        }
    } else {
        intent_log::Checkpoint {
            applied_seq: start_seq,
            replay_pos: 0,
            expect_seq: start_seq,
            tag: 0,
        }
    };
    let replayed = check_replay(&region, cp);
    let from_start =
        cp.replay_pos == 0 && cp.expect_seq == start_seq && cp.applied_seq == start_seq;
    // A record with the largest sequence number ends replay (none can follow).
    if clean && from_start && written.iter().all(|r| r.seq < u64::MAX) {
        assert_eq!(replayed, written, "replay(encode(records)) != records");
    }
    Ok(())
}

// ------------------------------------------------------------------ config

/// The daemon's TOML config: parsed; the sections checked as `serve` checks
/// them (resolved entirely when every address is a literal, so nothing is
/// looked up in DNS); a parsed config written back out parses to the same.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cfg) = cistern::config::Config::parse(text) else {
        return;
    };
    let _ = cfg.nbd.server_config();
    if let Some(nfs) = &cfg.nfs {
        let _ = nfs.server_config();
    }
    let literal = |a: &Option<String>| {
        a.as_deref()
            .is_none_or(|a| a.parse::<std::net::SocketAddr>().is_ok())
    };
    let addrs_literal = literal(&cfg.server.nbd)
        && literal(&cfg.server.api)
        && cfg.s3.as_ref().is_none_or(|s| literal(&s.service.listen))
        && cfg.nfs.as_ref().is_none_or(|n| literal(&n.listen));
    if let Ok(again) = toml::to_string(&cfg) {
        let back = cistern::config::Config::parse(&again).expect("a written config parses");
        assert_eq!(
            toml::to_string(&back).ok().as_deref(),
            Some(again.as_str()),
            "parse(write(config)) != config"
        );
    }
    if addrs_literal {
        let _ = cistern::config::resolve(
            cfg,
            cistern::config::Overrides::default(),
            Some(std::path::Path::new("/nonexistent/cistern-fuzz")),
        );
    }
}

// ------------------------------------------------------------------ NFS

/// A TCP byte stream as an NFS client sends it: split into RPC records,
/// each decoded as a call with the arguments of its procedure (re-encoded
/// arguments decode to the same bytes) and its file handles.
pub fn nfs_rpc(data: &[u8]) {
    let (records, _) = nfs::fuzzing::records(data, 64);
    for r in records {
        let _ = nfs::fuzzing::call(&r);
    }
}

// ------------------------------------------------------------------ S3

/// What the S3 front end parses itself (s3s parses the HTTP and XML).
/// Mode byte, then text for: 0 object record and 1 bucket settings (JSON
/// in the metadata store; decode(encode(x)) == x), 2 `x-amz-tagging`,
/// 3 copy-source ranges, 4 continuation tokens (and their round trip),
/// 5 object keys with version and upload names (and their round trips),
/// 6 the anonymous setting, grants and bucket names, 7 Content-MD5.
pub fn s3_parsers(data: &[u8]) {
    use s3::record::*;
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let text = text.as_ref();
    match mode % 8 {
        0 => {
            if let Some(r) = ObjectRecord::decode(rest) {
                assert_eq!(ObjectRecord::decode(&r.encode()), Some(r), "object record");
            }
        }
        1 => {
            let s = BucketSettings::decode(rest);
            assert_eq!(BucketSettings::decode(&s.encode()), s, "bucket settings");
        }
        2 => {
            let _ = s3::fuzzing::tagging_header(text);
        }
        3 => {
            let size = rest.len() as u64 * 1_000_003;
            if let Ok((a, b)) = s3::fuzzing::copy_range(text, size) {
                assert!(a < b && b <= size, "copy range {a}..{b} of {size}");
            }
        }
        4 => {
            let _ = s3::fuzzing::decode_token(text);
            let back = s3::fuzzing::decode_token(&s3::fuzzing::encode_token(text));
            assert_eq!(back.as_deref(), Ok(text), "continuation token");
        }
        5 => {
            if s3::fuzzing::key(text).is_ok() {
                let seq = rest.len() as u64 * 0x9e37_79b9_7f4a_7c15;
                assert_eq!(
                    parse_version_name(&version_name(text, seq)),
                    Some((text, seq)),
                    "version name"
                );
                assert_eq!(parse_version_id(&version_id(seq)), Some(seq), "version id");
                assert_eq!(
                    parse_upload_name(&upload_name(text, "u1")),
                    Some((text, "u1")),
                    "upload name"
                );
            }
            let _ = parse_version_name(text);
            let _ = parse_version_id(text);
            let _ = parse_upload_name(text);
        }
        6 => {
            let _ = s3::access::parse_anonymous(text);
            let _ = s3::access::check_bucket_name(text);
            if let Ok(g) = text.parse::<s3::access::Grant>() {
                assert_eq!(
                    g.to_string().parse::<s3::access::Grant>().ok(),
                    Some(g),
                    "grant"
                );
            }
        }
        _ => {
            let _ = s3::fuzzing::content_md5(text, &[0; 16]);
        }
    }
}

// ------------------------------------------------------------------ send streams

/// Mode byte, then: even, a raw send stream (what `receive` reads from a
/// peer); odd, arbitrary records written by the real encoder (past the
/// record and stream checksums). Every record is decoded as `receive`
/// does; rows that decode must re-encode to the same record.
pub fn send_stream(data: &[u8]) {
    use dataset::send::stream::{Kind, Reader, Writer};
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let bytes = if mode % 2 == 0 {
        rest.to_vec()
    } else {
        let mut u = Unstructured::new(rest);
        let recs: Vec<(u8, Vec<u8>)> = Arbitrary::arbitrary(&mut u).unwrap_or_default();
        let mut out = Vec::new();
        if let Ok(mut w) = Writer::new(&mut out, 0) {
            for (k, p) in recs.iter().take(64) {
                match Kind::from_u8(k % 8) {
                    Some(Kind::SnapEnd | Kind::End) => {
                        let _ = w.checkpoint(Kind::SnapEnd);
                    }
                    Some(kind) => {
                        let _ = w.record(kind, &[p]);
                    }
                    None => {}
                }
            }
            let _ = w.checkpoint(Kind::End);
        }
        out
    };
    let mut inp = &bytes[..];
    let Ok(mut r) = Reader::new(&mut inp) else {
        return;
    };
    for _ in 0..100_000 {
        let Ok(Some(rec)) = r.read_record() else {
            return;
        };
        match rec.kind {
            Kind::Begin => {
                let _ = serde_json::from_slice::<dataset::send::Begin>(&rec.payload);
            }
            Kind::Data | Kind::Free | Kind::Name => {
                if let Ok(row) = dataset::send::Row::decode(rec.kind, &rec.payload) {
                    let (kind, payload) = row.encode();
                    assert_eq!(kind, rec.kind);
                    assert_eq!(payload, rec.payload, "row {row:?} re-encodes differently");
                }
            }
            _ => {}
        }
    }
}

// ------------------------------------------------------------------ object-store log

/// Mode byte, then: even, 8 bytes of sequence number and a raw object (what
/// a bucket, or whoever else can write to it, hands the pool); odd, a record
/// built by the real encoder from arbitrary fields, which must decode to
/// what was encoded and be refused once any byte of it is flipped.
pub fn objstore_record(data: &[u8]) {
    use objstore::record::{decode, encode, Kind};
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        if rest.len() >= 8 {
            let (seq, obj) = rest.split_at(8);
            let seq = u64::from_be_bytes(seq.try_into().unwrap_or_default());
            if let Ok(rec) = decode(seq, obj) {
                assert_eq!(rec.seq, seq);
            }
        }
        return;
    }
    let mut u = Unstructured::new(rest);
    let Ok((seq, claim, epoch, node, entries, flip)) =
        <(u64, bool, u64, String, Vec<Vec<u8>>, u16)>::arbitrary(&mut u)
    else {
        return;
    };
    if node.len() > objstore::record::MAX_NODE {
        return;
    }
    let owner = objstore::OwnerId { node, epoch };
    let (kind, entries): (Kind, Vec<bytes::Bytes>) = if claim {
        (Kind::Claim, Vec::new())
    } else {
        (
            Kind::Batch,
            entries.into_iter().take(64).map(Into::into).collect(),
        )
    };
    let enc = encode(seq, kind, &owner, &entries);
    let rec = decode(seq, &enc).expect("an encoded record decodes");
    assert_eq!(
        (rec.kind, &rec.owner, &rec.entries),
        (kind, &owner, &entries)
    );
    let mut bad = enc.to_vec();
    let at = flip as usize % bad.len();
    bad[at] ^= 1;
    assert!(
        decode(seq, &bad).is_err(),
        "a flipped byte at {at} was accepted"
    );
}

// ------------------------------------------------------------------ bucket log entries

/// A bucket pool's log entry as a bucket hands it back (decision 0039) or a
/// checkpoint (entry version 2, decision 0049): never a panic, and whatever
/// decodes encodes back to bytes that decode to the same thing.
pub fn bucket_entry(data: &[u8]) {
    use vdev::bucket::Entry;
    use vdev::compact::{is_checkpoint, Checkpoint};
    let raw = bytes::Bytes::copy_from_slice(data);
    if is_checkpoint(&raw) {
        if let Ok(c) = Checkpoint::decode(&raw) {
            let again = Checkpoint::decode(&c.encode()).expect("an encoded checkpoint decodes");
            assert_eq!(again, c);
        }
    } else if let Ok(e) = Entry::decode(&raw) {
        let again = Entry::decode(&e.encode()).expect("an encoded entry decodes");
        assert_eq!(again, e);
    }
}

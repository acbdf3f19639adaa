//! Seed inputs for each target, made by the product's own encoders (or, for
//! what only a client encodes, by the wire format written out here). The
//! corpus in `fuzz/corpus/` starts from these:
//! `cargo run -p fuzzing --example write_seeds` writes them there, and the
//! replay test runs them even when the files are missing.

/// `(file name, input)` seeds of `target` (empty for an unknown target).
pub fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let v: Vec<(&str, Vec<u8>)> = match target {
        "nbd_handshake" => nbd_handshake(),
        "nbd_transmission" => nbd_transmission(),
        "vdev_label" => vdev_label(),
        "block_bp" => block_bp(),
        "intent_log" => intent_log(),
        "config" => config(),
        "nfs_rpc" => nfs_rpc(),
        "s3_parsers" => s3_parsers(),
        "send_stream" => send_stream(),
        "objstore_record" => objstore_record(),
        "bucket_entry" => bucket_entry(),
        _ => Vec::new(),
    };
    v.into_iter()
        .map(|(n, b)| (format!("seed-{n}"), b))
        .collect()
}

fn with_mode(mode: u8, b: &[u8]) -> Vec<u8> {
    let mut v = vec![mode];
    v.extend_from_slice(b);
    v
}

// ------------------------------------------------------------------ NBD

fn be32(v: u32) -> [u8; 4] {
    v.to_be_bytes()
}

/// `NBD_OPT_INFO`/`NBD_OPT_GO` data: name, then the info requests.
fn info_req(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut b = be32(name.len() as u32).to_vec();
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        b.extend_from_slice(&i.to_be_bytes());
    }
    b
}

/// `NBD_OPT_{LIST,SET}_META_CONTEXT` data: export name, then the queries.
fn meta_req(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut b = be32(name.len() as u32).to_vec();
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(&be32(queries.len() as u32));
    for q in queries {
        b.extend_from_slice(&be32(q.len() as u32));
        b.extend_from_slice(q.as_bytes());
    }
    b
}

fn nbd_handshake() -> Vec<(&'static str, Vec<u8>)> {
    use nbd::fuzzing::option;
    use nbd::proto::*;
    let flags = be32(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_vec();
    let cat = |parts: &[Vec<u8>]| parts.concat();
    vec![
        (
            "go-structured-meta",
            cat(&[
                flags.clone(),
                option(OPT_STRUCTURED_REPLY, &[]),
                option(OPT_LIST, &[]),
                option(
                    OPT_INFO,
                    &info_req("vol0", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]),
                ),
                option(
                    OPT_LIST_META_CONTEXT,
                    &meta_req("vol0", &["base:", "cistern:"]),
                ),
                option(
                    OPT_SET_META_CONTEXT,
                    &meta_req("vol0", &[BASE_ALLOCATION, nbd::fuzzing::CHANGED_CONTEXT]),
                ),
                option(OPT_GO, &info_req("vol0", &[INFO_BLOCK_SIZE])),
            ]),
        ),
        (
            "export-name",
            cat(&[flags.clone(), option(OPT_EXPORT_NAME, b"ro")]),
        ),
        (
            "export-name-zeroes",
            cat(&[
                be32(FLAG_C_FIXED_NEWSTYLE).to_vec(),
                option(OPT_EXPORT_NAME, b""),
            ]),
        ),
        (
            "refused-then-default",
            cat(&[
                flags.clone(),
                option(OPT_STARTTLS, &[]),
                option(99, b"unknown"),
                option(OPT_GO, &info_req("nope", &[])),
                option(OPT_GO, &info_req("", &[])),
            ]),
        ),
        ("abort", cat(&[flags, option(OPT_ABORT, &[])])),
    ]
}

fn nbd_transmission() -> Vec<(&'static str, Vec<u8>)> {
    use nbd::fuzzing::request;
    use nbd::proto::*;
    let mut write = request(CMD_WRITE, CMD_FLAG_FUA, 1, 4096, 4096);
    write.extend(std::iter::repeat_n(0xa5, 4096));
    let session = [
        write.clone(),
        request(CMD_READ, 0, 2, 0, 16384),
        request(CMD_BLOCK_STATUS, 0, 3, 0, 65536),
        request(CMD_TRIM, 0, 4, 4096, 4096),
        request(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 5, 8192, 4096),
        request(CMD_FLUSH, 0, 6, 0, 0),
        request(CMD_CACHE, 0, 7, 0, 4096),
        request(CMD_READ, CMD_FLAG_DF, 8, 0, 8192),
        request(CMD_READ, 0, 9, 65536 - 512, 1024),
        request(CMD_DISC, 0, 10, 0, 0),
    ]
    .concat();
    vec![
        ("simple", with_mode(0, &session)),
        ("structured", with_mode(1, &session)),
        ("structured-contexts", with_mode(5, &session)),
        ("read-only", with_mode(3, &session)),
        (
            "errors",
            with_mode(
                1,
                &[
                    request(99, 0, 1, 0, 0),
                    request(CMD_READ, 0xff, 2, 0, 512),
                    request(CMD_READ, 0, 3, 0, u32::MAX),
                    request(CMD_WRITE, 0, 4, u64::MAX, 1),
                    vec![0],
                    request(CMD_WRITE, 0, 5, 0, u32::MAX),
                ]
                .concat(),
            ),
        ),
    ]
}

// ------------------------------------------------------------------ labels

fn sample_label() -> vdev::Label {
    vdev::Label {
        logs: Vec::new(),
        log_device: false,
        version: vdev::LABEL_VERSION,
        pool_name: "tank".into(),
        pool_guid: 0x1234_5678_9abc_def0,
        device_guid: 42,
        group: 0,
        child: 1,
        groups: vec![
            vdev::GroupLayout {
                kind: vdev::LayoutKind::Mirror,
                devices: vec![41, 42],
                data_size: 1 << 30,
                resilvering: vec![42],
            },
            vdev::GroupLayout {
                kind: vdev::LayoutKind::Raidz { parity: 1 },
                devices: vec![43, 44, 45],
                data_size: 1 << 30,
                resilvering: Vec::new(),
            },
        ],
        regions: vdev::Regions {
            meta_offset: 1 << 20,
            meta_size: 64 << 20,
            log_offset: 65 << 20,
            log_size: 64 << 20,
            data_offset: 129 << 20,
        },
        exported: false,
        state: Some(vdev::PoolState::Active),
        owner: Some(sample_owner()),
        generation: 3,
    }
}

fn sample_owner() -> vdev::Owner {
    vdev::Owner {
        hostname: "host1".into(),
        hostid: 7,
        pid: 4242,
        instance: 99,
        state_dir: 5,
    }
}

/// An encoded area without its zero padding (the decoder does not need it).
fn trim_zeros(mut b: Vec<u8>) -> Vec<u8> {
    while b.last() == Some(&0) {
        b.pop();
    }
    b
}

fn vdev_label() -> Vec<(&'static str, Vec<u8>)> {
    let label = sample_label();
    let area = trim_zeros(vdev::fuzzing::encode_label(&label).expect("the sample label encodes"));
    let json = serde_json::to_vec(&label).expect("a label serializes");
    let stamp = vdev::MmpStamp {
        pool_guid: label.pool_guid,
        seq: 17,
        kind: vdev::MmpKind::Active,
        time_ms: 1_764_000_000_000,
        owner: sample_owner(),
    };
    let slot = trim_zeros(vdev::fuzzing::encode_mmp(&stamp));
    let stamp_json = serde_json::to_vec(&stamp).expect("a stamp serializes");
    let mut plain = sample_label();
    plain.version = vdev::LABEL_VERSION_PLAIN;
    plain.groups.truncate(1);
    plain.state = None;
    plain.owner = None;
    plain.generation = 0;
    let plain_json = serde_json::to_vec(&plain).expect("a label serializes");
    vec![
        ("label-area", with_mode(0, &area)),
        ("label-json", with_mode(0x81, &json)),
        ("label-json-v1", with_mode(1, &plain_json)),
        ("label-arbitrary", with_mode(2, &json)),
        ("mmp-slot", with_mode(3, &slot)),
        ("mmp-json", with_mode(4, &stamp_json)),
    ]
}

// ------------------------------------------------------------------ block pointers

fn block_bp() -> Vec<(&'static str, Vec<u8>)> {
    use block::{ChecksumAlgo, Compression};
    let text = b"the quick brown fox jumps over the lazy dog; ".repeat(40);
    let dva = |group, offset| pool::Dva {
        group,
        offset,
        asize: 4096,
    };
    let lz4 = block::encode(&text, Compression::Lz4, ChecksumAlgo::Blake3);
    let zstd = block::encode(&text, Compression::Zstd(3), ChecksumAlgo::Blake3);
    let gzip = block::encode(&text, Compression::Gzip(6), ChecksumAlgo::Blake3);
    let raw = block::encode(&text[..300], Compression::Off, ChecksumAlgo::Blake3);
    let mut three = lz4.pointer(dva(0, 8192), 11);
    three.dvas.push(dva(1, 0));
    three.dvas.push(dva(2, 1 << 40));
    let mut decompress = vec![1u8]; // lz4
    decompress.extend_from_slice(&(text.len() as u16).to_le_bytes());
    decompress.extend_from_slice(&lz4.payload);
    vec![
        (
            "one-dva",
            with_mode(0, &lz4.pointer(dva(0, 4096), 7).encode()),
        ),
        ("three-dvas", with_mode(0, &three.encode())),
        ("embedded-lz4", with_mode(0, &lz4.embedded(9).encode())),
        ("embedded-zstd", with_mode(0, &zstd.embedded(9).encode())),
        ("embedded-gzip", with_mode(0, &gzip.embedded(9).encode())),
        ("embedded-raw", with_mode(0, &raw.embedded(9).encode())),
        ("arbitrary", with_mode(1, &three.encode())),
        ("decompress-lz4", with_mode(2, &decompress)),
        ("compress", with_mode(3, &text)),
    ]
}

// ------------------------------------------------------------------ intent log

fn intent_log() -> Vec<(&'static str, Vec<u8>)> {
    use intent_log::fuzzing::encode_record;
    use intent_log::RecordKind;
    const GUID: u64 = crate::LOG_GUID;
    let mut region = Vec::new();
    encode_record(
        GUID,
        RecordKind::Write,
        1,
        5,
        4096,
        0,
        b"hello, log",
        &mut region,
    );
    encode_record(GUID, RecordKind::Trim, 2, 5, 0, 8192, &[], &mut region);
    encode_record(
        GUID,
        RecordKind::ZeroAllocated,
        3,
        6,
        512,
        512,
        &[],
        &mut region,
    );
    let jump_to = 1024u64;
    encode_record(GUID, RecordKind::Jump, 4, 0, jump_to, 4, &[], &mut region);
    region.resize(jump_to as usize, 0);
    encode_record(
        GUID,
        RecordKind::ObjectOp,
        4,
        9,
        0,
        0,
        &[1, 2, 3, 4],
        &mut region,
    );
    encode_record(
        GUID,
        RecordKind::Write,
        5,
        5,
        0,
        0,
        &[0xee; 100],
        &mut region,
    );
    let mut arbitrary = vec![0u8; 8];
    arbitrary.extend_from_slice(&region[..200]);
    vec![
        ("region", with_mode(0, &region)),
        ("arbitrary", with_mode(1, &arbitrary)),
    ]
}

// ------------------------------------------------------------------ config

fn config() -> Vec<(&'static str, Vec<u8>)> {
    let full = r#"
[server]
nbd = "127.0.0.1:10809"
api = "127.0.0.1:10810"
state_dir = "/var/lib/cistern"
log = "info,dataset=debug"

[engine]
txg_timeout_secs = 5.0
multihost_interval_ms = 1000

[nbd]
max_connections = 1024
max_in_flight_bytes_total = 268435456
shutdown_grace_secs = 30

[policy.vm]
schedule = "hourly"
keep = "hourly=24 daily=7"

[fuse]
threads = 4
allow_other = false

[s3]
listen = "127.0.0.1:10811"
parent = "tank"
anonymous = "public=ro,drop=rw"

[smb]
listen = "127.0.0.1:10445"
guest = false

[nfs]
listen = "127.0.0.1:10812"
max_connections = 256
max_in_flight = 16
"#;
    vec![
        (
            "packaging",
            include_bytes!("../../../packaging/cistern.toml").to_vec(),
        ),
        ("full", full.as_bytes().to_vec()),
        ("empty", Vec::new()),
        (
            "hostname",
            b"[server]\nnbd = \"localhost:10809\"\n".to_vec(),
        ),
    ]
}

// ------------------------------------------------------------------ NFS

/// XDR as the client writes it.
#[derive(Default)]
struct Xdr(Vec<u8>);

impl Xdr {
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn opaque(mut self, b: &[u8]) -> Self {
        self = self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        self.0.resize(self.0.len().div_ceil(4) * 4, 0);
        self
    }
    fn fh(self) -> Self {
        let h = nfs::fuzzing::handle(0x1234, 2, 1, 0);
        self.opaque(&h.data)
    }
    /// sattr3 with only the mode set.
    fn sattr_mode(self, mode: u32) -> Self {
        self.u32(1).u32(mode).u32(0).u32(0).u32(0).u32(0).u32(0)
    }
}

/// One call in one record: header with AUTH_UNIX (uid 1000, groups 1000
/// and 27), then `args`.
fn rpc_call(xid: u32, prog: u32, vers: u32, proc_: u32, args: Xdr) -> Vec<u8> {
    let cred = Xdr::default()
        .u32(0)
        .opaque(b"client")
        .u32(1000)
        .u32(1000)
        .u32(2)
        .u32(1000)
        .u32(27);
    let body = Xdr::default()
        .u32(xid)
        .u32(0)
        .u32(2)
        .u32(prog)
        .u32(vers)
        .u32(proc_)
        .u32(1)
        .opaque(&cred.0)
        .u32(0)
        .opaque(&[]);
    let mut rec = body.0;
    rec.extend_from_slice(&args.0);
    let mut out = (0x8000_0000u32 | rec.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&rec);
    out
}

fn nfs_rpc() -> Vec<(&'static str, Vec<u8>)> {
    const NFS: u32 = 100_003;
    const MOUNT: u32 = 100_005;
    const PORTMAP: u32 = 100_000;
    let x = Xdr::default;
    let mount = [
        rpc_call(1, PORTMAP, 2, 3, x().u32(NFS).u32(3).u32(6).u32(0)),
        rpc_call(2, MOUNT, 3, 0, x()),
        rpc_call(3, MOUNT, 3, 1, x().opaque(b"/tank/fs")),
        rpc_call(4, MOUNT, 3, 5, x()),
    ]
    .concat();
    let nfs = [
        rpc_call(10, NFS, 3, 1, x().fh()),
        rpc_call(11, NFS, 3, 2, x().fh().sattr_mode(0o644).u32(0)),
        rpc_call(12, NFS, 3, 3, x().fh().opaque(b"file.txt")),
        rpc_call(13, NFS, 3, 4, x().fh().u32(0x3f)),
        rpc_call(14, NFS, 3, 6, x().fh().u64(0).u32(4096)),
        rpc_call(
            15,
            NFS,
            3,
            7,
            x().fh().u64(0).u32(5).u32(2).opaque(b"hello"),
        ),
        rpc_call(
            16,
            NFS,
            3,
            8,
            x().fh().opaque(b"new").u32(0).sattr_mode(0o600),
        ),
        rpc_call(17, NFS, 3, 9, x().fh().opaque(b"dir").sattr_mode(0o755)),
        rpc_call(
            18,
            NFS,
            3,
            10,
            x().fh().opaque(b"ln").sattr_mode(0o777).opaque(b"target"),
        ),
        rpc_call(19, NFS, 3, 14, x().fh().opaque(b"a").fh().opaque(b"b")),
        rpc_call(20, NFS, 3, 15, x().fh().fh().opaque(b"hard")),
        rpc_call(21, NFS, 3, 16, x().fh().u64(0).u64(0).u32(4096)),
        rpc_call(22, NFS, 3, 17, x().fh().u64(0).u64(0).u32(4096).u32(65536)),
        rpc_call(23, NFS, 3, 18, x().fh()),
        rpc_call(24, NFS, 3, 21, x().fh().u64(0).u32(0)),
        rpc_call(25, NFS, 3, 12, x().fh().opaque(b"file.txt")),
    ]
    .concat();
    let mut fragmented = rpc_call(30, NFS, 3, 0, x());
    // The same call in two fragments: the first without the last-fragment bit.
    let body = fragmented.split_off(4);
    let (a, b) = body.split_at(8);
    let mut two = (a.len() as u32).to_be_bytes().to_vec();
    two.extend_from_slice(a);
    two.extend_from_slice(&(0x8000_0000u32 | b.len() as u32).to_be_bytes());
    two.extend_from_slice(b);
    vec![
        ("mount", mount),
        ("nfs-procedures", nfs),
        ("fragments", two),
        ("bad-version", rpc_call(40, NFS, 4, 1, x().fh())),
        ("garbage-args", rpc_call(41, NFS, 3, 1, x().u32(1 << 30))),
    ]
}

// ------------------------------------------------------------------ S3

fn s3_parsers() -> Vec<(&'static str, Vec<u8>)> {
    use s3::record::*;
    let mut rec = ObjectRecord {
        v: RECORD_VERSION,
        key: "photos/2024/a.jpg".into(),
        seq: 1_764_000_000_123_456_789,
        version_id: Some(version_id(42)),
        etag: "9e107d9d372bb6826bd81d3542a419d6".into(),
        size: 12345,
        mtime_ns: 1_764_000_000_000_000_000,
        ..Default::default()
    };
    rec.meta.insert("owner".into(), "alice".into());
    rec.tags.push(("color".into(), "blue".into()));
    let settings = BucketSettings {
        v: 1,
        versioning: Some("Enabled".into()),
        tags: vec![("team".into(), "storage".into())],
        lifecycle: vec![LifecycleRule {
            id: Some("abort".into()),
            prefix: "tmp/".into(),
            enabled: true,
            abort_incomplete_days: Some(7),
            expiration_days: None,
        }],
    };
    vec![
        ("object-record", with_mode(0, &rec.encode())),
        ("bucket-settings", with_mode(1, &settings.encode())),
        ("tagging", with_mode(2, b"k1=v1&k2=v%20two&empty=")),
        ("copy-range", with_mode(3, b"bytes=0-99")),
        (
            "token",
            with_mode(4, s3::fuzzing::encode_token("photos/2024/b.jpg").as_bytes()),
        ),
        ("key", with_mode(5, b"photos/2024/a.jpg")),
        ("anonymous", with_mode(6, b"public=ro,drop=rw")),
        ("content-md5", with_mode(7, b"1B2M2Y8AsgTpgAmY7PhCfg==")),
    ]
}

// ------------------------------------------------------------------ send streams

/// Streams written by the real encoder: a full volume snapshot, an
/// incremental bucket one with names, attributes and tombstones, and a cut one.
fn send_stream() -> Vec<(&'static str, Vec<u8>)> {
    use dataset::send::stream::{Kind, Writer};
    use dataset::send::{Begin, Row};
    let stream = |begin: Begin, rows: Vec<Row>| {
        let mut out = Vec::new();
        let mut w = Writer::new(&mut out, 0).expect("in memory");
        let json = serde_json::to_vec(&begin).expect("json");
        w.record(Kind::Begin, &[&json]).expect("in memory");
        for r in rows {
            let (k, p) = r.encode();
            w.record(k, &[&p]).expect("in memory");
        }
        w.checkpoint(Kind::SnapEnd).expect("in memory");
        w.checkpoint(Kind::End).expect("in memory");
        out
    };
    let vol = stream(
        Begin {
            snapshot: "tank/vm@a".into(),
            kind: dataset::DatasetKind::Volume,
            volsize: 1 << 20,
            volblocksize: 4096,
            to_txg: 7,
            ..Default::default()
        },
        vec![
            Row::Data {
                obj: 1,
                blk: 0,
                bytes: vec![0x5a; 4096],
            },
            Row::Data {
                obj: 1,
                blk: 9,
                bytes: (0..4096u32).map(|i| i as u8).collect(),
            },
        ],
    );
    let bucket = stream(
        Begin {
            snapshot: "tank/b@2".into(),
            from: Some("1".into()),
            from_txg: 5,
            to_txg: 9,
            kind: dataset::DatasetKind::Bucket,
            next_object: 66,
            ..Default::default()
        },
        vec![
            Row::Data {
                obj: 64,
                blk: 0,
                bytes: b"hello".to_vec(),
            },
            Row::Data {
                obj: 64,
                blk: u64::MAX,
                bytes: vec![1, 0, 0, 0, 5],
            },
            Row::Free {
                addr: dataset::send::block_address(65, 0),
            },
            Row::Name {
                dir: 2,
                name: "photos/a.jpg".into(),
                target: 64,
            },
            Row::Free {
                addr: dataset::send::name_address(2, "old"),
            },
        ],
    );
    let cut = bucket[..bucket.len() / 2].to_vec();
    vec![
        ("volume-full", with_mode(0, &vol)),
        ("bucket-incremental", with_mode(0, &bucket)),
        ("cut", with_mode(0, &cut)),
        ("arbitrary", with_mode(1, &[3, 2, 4, 1, 2, 3, 4, 5, 6])),
    ]
}

// ------------------------------------------------------------------ object-store log

/// A claim and a batch as the log writes them, raw (mode 0: sequence number
/// then the object) and one cut short.
fn objstore_record() -> Vec<(&'static str, Vec<u8>)> {
    use objstore::record::{encode, Kind};
    let owner = objstore::OwnerId {
        node: "host-a".into(),
        epoch: 0x1234_5678,
    };
    let raw = |seq: u64, obj: &[u8]| {
        let mut v = vec![0u8];
        v.extend_from_slice(&seq.to_be_bytes());
        v.extend_from_slice(obj);
        v
    };
    let claim = encode(1, Kind::Claim, &owner, &[]);
    let batch = encode(
        2,
        Kind::Batch,
        &owner,
        &[
            bytes::Bytes::from_static(b"first entry"),
            bytes::Bytes::from(vec![0xa5; 600]),
        ],
    );
    vec![
        ("claim", raw(1, &claim)),
        ("batch", raw(2, &batch)),
        ("batch-cut", raw(2, &batch[..batch.len() / 2])),
    ]
}

// ------------------------------------------------------------------ bucket log entries

/// An entry with each kind of change, a checkpoint, and one cut short.
fn bucket_entry() -> Vec<(&'static str, Vec<u8>)> {
    use vdev::bucket::{Entry, Op, SegmentRef};
    use vdev::compact::Checkpoint;
    let seg = SegmentRef {
        name: "seg/0000000012345678-1".into(),
        len: 1 << 20,
        sum: [7; 32],
        chunks: Vec::new(),
    };
    let entry = Entry {
        size: 64 << 20,
        segments: vec![seg.clone()],
        ops: vec![
            Op::Data {
                offset: 4096,
                data: bytes::Bytes::from_static(b"inline change"),
            },
            Op::Zero {
                offset: 1 << 20,
                len: 8192,
            },
            Op::Seg {
                offset: 2 << 20,
                len: 1 << 20,
                seg: 0,
                seg_offset: 0,
            },
        ],
    }
    .encode();
    let checkpoint = Checkpoint {
        replay_from: 42,
        dead_epochs: vec![0x1234],
        image: Entry {
            size: 64 << 20,
            segments: vec![seg],
            ops: vec![Op::Seg {
                offset: 0,
                len: 1 << 20,
                seg: 0,
                seg_offset: 0,
            }],
        },
    }
    .encode();
    vec![
        ("entry", entry.to_vec()),
        ("checkpoint", checkpoint.to_vec()),
        ("entry-cut", entry[..entry.len() / 2].to_vec()),
    ]
}

//! Tables of the metadata store. Keys are fixed-width integers so redb
//! orders them numerically.

use redb::TableDefinition;

/// Pool-wide records: format version, last committed txg, log replay point...
pub const POOL_RECORDS: TableDefinition<&str, u64> = TableDefinition::new("pool_records");
pub const RECORD_FORMAT: &str = "format";
pub const RECORD_TXG: &str = "txg";
pub const RECORD_NEXT_DATASET: &str = "next_dataset";
/// Intent-log sequence number up to which records are contained in the txg.
pub const RECORD_LOG_APPLIED_SEQ: &str = "log_applied_seq";
/// Byte position in the log region where replay starts...
pub const RECORD_LOG_REPLAY_POS: &str = "log_replay_pos";
/// ...and the sequence number replay expects there.
pub const RECORD_LOG_EXPECT_SEQ: &str = "log_expect_seq";
/// ...in the region this tag names: absent or 0 the main devices' log
/// region, else a log group (SLOG) by the guid of its first device
/// (decision 0030; absent in stores written before it).
pub const RECORD_LOG_TAG: &str = "log_tag";
/// `policy_last_run.<dataset id>`: Unix seconds the snapshot policy last ran
/// on that dataset (`dataset::autosnap`); absent = never.
pub const RECORD_POLICY_LAST_RUN_PREFIX: &str = "policy_last_run.";

// The scan (scrub or resilver) in progress or last finished, as ZFS's
// dsl_scan_phys: one scan at a time; absent records mean "never scanned".
// Written by `dataset::scrub` in small transactions of their own.
/// 1 scrub, 2 resilver.
pub const RECORD_SCAN_FUNC: &str = "scan_func";
/// 1 scanning, 2 paused, 3 finished, 4 canceled.
pub const RECORD_SCAN_STATE: &str = "scan_state";
/// Unix seconds the scan started / ended (0 while running).
pub const RECORD_SCAN_START: &str = "scan_start";
pub const RECORD_SCAN_END: &str = "scan_end";
/// Whether the metadata pass (every page on every device) is done.
pub const RECORD_SCAN_META_DONE: &str = "scan_meta_done";
/// Whether `RECORD_SCAN_POS_*` holds a position (0: start from the first key).
pub const RECORD_SCAN_POS_VALID: &str = "scan_pos_valid";
/// The last block-map key (dataset, object, block, birth) fully verified:
/// resume after it. (Format 2 had no object: the upgrade sets it to 1.)
pub const RECORD_SCAN_POS_DATASET: &str = "scan_pos_dataset";
pub const RECORD_SCAN_POS_OBJECT: &str = "scan_pos_object";
pub const RECORD_SCAN_POS_BLOCK: &str = "scan_pos_block";
pub const RECORD_SCAN_POS_BIRTH: &str = "scan_pos_birth";
/// Bytes examined so far / to examine (allocated bytes at the start).
pub const RECORD_SCAN_EXAMINED: &str = "scan_examined";
pub const RECORD_SCAN_TOTAL: &str = "scan_total";
/// Bytes rewritten from redundancy, and blocks that could not be repaired.
pub const RECORD_SCAN_REPAIRED: &str = "scan_repaired";
pub const RECORD_SCAN_ERRORS: &str = "scan_errors";
/// Resilver: guid of the device being rebuilt, and of the one it replaces
/// (equal when an offlined device is brought back).
pub const RECORD_SCAN_TARGET_GUID: &str = "scan_target_guid";
pub const RECORD_SCAN_OLD_GUID: &str = "scan_old_guid";
/// Prefix of the records listing blocks a scan could not repair:
/// `scan_error/<dataset id>/<object>/<block index>` -> birth txg (a bounded
/// list; format 2 had no `<object>/`).
pub const RECORD_SCAN_ERROR_PREFIX: &str = "scan_error/";

/// `offline.<device guid>`: the device was taken offline (`pool offline`)
/// and stays so at import until `pool online`.
pub const RECORD_OFFLINE_PREFIX: &str = "offline.";

/// Dataset id -> JSON-encoded dataset record (name, kind, properties, space).
pub const DATASETS: TableDefinition<u64, &[u8]> = TableDefinition::new("datasets");

/// The block map (format 3, decision 0017): every versioned row of every
/// dataset, `(dataset id, address, birth txg) -> value`. An address is a
/// block of an object (`0x00 | object u64 BE | block u64 BE`; the value an
/// encoded block pointer, embedded or not) or a name in a directory object
/// (`0x01 | directory u64 BE | name bytes`; the value the object id, u64
/// LE). An empty value is a tombstone. The birth in the key keeps older
/// versions addressable for snapshots: the live version of a row is the one
/// with the greatest birth.
pub const BLOCK_MAP: TableDefinition<(u64, &[u8], u64), &[u8]> = TableDefinition::new("block_map");

/// Dead lists of all snapshots of a dataset, in one ordered table:
/// (dataset id, death txg, address, birth txg) -> allocated bytes. A row
/// names a version of a row of BLOCK_MAP (dataset, address, birth) that the
/// dataset's head stopped referencing at `death` while a snapshot taken
/// before still does. The rows with death in (S, N] are the dead list of
/// the snapshot or head N that follows snapshot S, so destroying a
/// snapshot needs no merge: removing S joins two ranges.
pub const DEAD_LIST: TableDefinition<(u64, u64, &[u8], u64), u64> =
    TableDefinition::new("dead_list");

/// Format 2's block map and dead lists (volumes only: the block index was
/// the volume's), read once by `pool upgrade` and then removed.
pub const BLOCKS_V2: TableDefinition<(u64, u64, u64), &[u8]> = TableDefinition::new("blocks");
pub const DEADLIST_V2: TableDefinition<(u64, u64, u64, u64), u64> =
    TableDefinition::new("deadlist");

/// `pool history`: sequence number -> JSON record (time, command line,
/// user, host, internal event with its txg). A ring bounded in bytes
/// (dataset::history): the oldest records go first, except the first one
/// (the pool's creation), which ZFS keeps too. Absent in pools made before
/// it existed: their history starts empty.
pub const HISTORY: TableDefinition<u64, &[u8]> = TableDefinition::new("history");
/// Next history sequence number, and the bytes of records kept.
pub const RECORD_HISTORY_NEXT: &str = "history_next";
pub const RECORD_HISTORY_BYTES: &str = "history_bytes";

/// Device guid -> the path it was last opened at, so `pool status` names a
/// missing device `was /path` and `pool replace` finds it by that path.
pub const VDEV_PATHS: TableDefinition<u64, &str> = TableDefinition::new("vdev_paths");
/// Pool properties set with `cistern pool set` (`failmode`, `autoreplace`,
/// `comment`): name -> value. Absent means the default. Created at the
/// first import by a build that knows it (older pools have no such table).
pub const POOL_PROPS: TableDefinition<&str, &str> = TableDefinition::new("pool_props");
/// L2ARC cache devices of the pool: device guid -> path (decision 0029).
/// Created by the first `pool add POOL cache DEV`; older builds ignore it.
pub const CACHE_DEVICES: TableDefinition<u64, &str> = TableDefinition::new("cache_devices");

/// `cistern policy history`: sequence number -> JSON record of one snapshot
/// policy run on a dataset of this pool (`dataset::autosnap`), the newest
/// [`POLICY_HISTORY_LEN`] kept. Created at the first run that records one;
/// pools made before it have none and start with an empty history (0021).
pub const POLICY_HISTORY: TableDefinition<u64, &[u8]> = TableDefinition::new("policy_history");
/// Next sequence number of `POLICY_HISTORY`.
pub const RECORD_POLICY_HISTORY_NEXT: &str = "policy_history_next";
/// Runs kept per pool.
pub const POLICY_HISTORY_LEN: u64 = 1000;

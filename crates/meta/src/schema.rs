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

/// Dataset id -> JSON-encoded dataset record (name, kind, properties, space).
pub const DATASETS: TableDefinition<u64, &[u8]> = TableDefinition::new("datasets");

/// (dataset id, block index, birth txg) -> encoded block pointer. The birth
/// in the key keeps older versions addressable for snapshots: the live
/// version of a block is the entry with the greatest birth.
pub const BLOCKS: TableDefinition<(u64, u64, u64), &[u8]> = TableDefinition::new("blocks");

/// Dead lists of all snapshots of a dataset, in one ordered table:
/// (dataset id, death txg, block index, birth txg) -> allocated bytes. A
/// row names a version of a block (its BLOCKS key is (dataset, block,
/// birth)) that the dataset's head stopped referencing at `death` while a
/// snapshot taken before still does. The rows with death in (S, N] are
/// the dead list of the snapshot or head N that follows snapshot S, so
/// destroying a snapshot needs no merge: removing S joins two ranges.
pub const DEADLIST: TableDefinition<(u64, u64, u64, u64), u64> = TableDefinition::new("deadlist");

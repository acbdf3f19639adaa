//! Cistern's management HTTP API: an axum [`server`] over a [`dataset::Engine`]
//! and the blocking [`client`] the `cistern` CLI uses.
//!
//! Bodies are JSON; the engine's own types (`PoolSpec`, `PoolStatus`,
//! `DatasetInfo`, ...) travel unchanged. Dataset names contain `/`, so routes
//! that address one dataset take it as the query parameter `?name=`.
//!
//! | method | path | body in | body out |
//! |---|---|---|---|
//! | POST, DELETE | /v1/session | [`auth::Login`] | 204 + the UI's session cookie (login, logout) |
//! | GET | /v1/health | | [`Health`] |
//! | GET | /v1/pools | | `[PoolSummary]` |
//! | POST | /v1/pools | `PoolSpec` | `PoolStatus` (201) |
//! | GET | /v1/pools/{pool} | | `PoolStatus` |
//! | DELETE | /v1/pools/{pool} | | 204 |
//! | POST | /v1/pools/{pool}/export | | 204 |
//! | GET | /v1/import?dir=A&dir=B | | `[ImportablePool]` |
//! | POST | /v1/import | [`ImportRequest`] | `PoolStatus` |
//! | GET | /v1/datasets[?root=R] | | `[DatasetInfo]` |
//! | POST | /v1/datasets | [`CreateVolume`] | `DatasetInfo` (201) |
//! | GET | /v1/dataset?name=N | | `DatasetInfo` |
//! | PATCH | /v1/dataset?name=N | [`SetProperty`] | `DatasetInfo` |
//! | DELETE | /v1/dataset?name=N | | 204 |
//! | GET | /v1/datasets?root=R&type=T,..&offset=N&limit=M | | one page of `[DatasetInfo]`, total in `x-total-count` |
//! | POST | /v1/rollback | [`RollbackRequest`] | `[String]` destroyed, or with `dry_run` a `RollbackPreview` |
//! | GET | /v1/samples | | [`samples::History`]: the last hour of I/O rates and device counters |
//! | POST | /v1/rename | [`RenameRequest`] | `[String]` new names |
//! | POST | /v1/inherit | [`InheritRequest`] | 204 |
//! | POST | /v1/pools/{pool}/scrub | [`ScrubRequest`] | `PoolStatus` |
//! | POST | /v1/pools/{pool}/offline | [`DeviceRequest`] | `PoolStatus` |
//! | POST | /v1/pools/{pool}/online | [`DeviceRequest`] | `PoolStatus` |
//! | POST | /v1/pools/{pool}/clear | [`ClearRequest`] | `PoolStatus` |
//! | POST | /v1/pools/{pool}/replace | [`ReplaceRequest`] | `PoolStatus` |
//! | POST | /v1/pools/{pool}/attach | [`AttachRequest`] | `PoolStatus` |
//! | POST | /v1/pools/{pool}/detach | [`DeviceRequest`] | `PoolStatus` |
//! | POST | /v1/pools/{pool}/remove | [`DeviceRequest`] | `PoolStatus` |
//! | GET, POST | /v1/pools/{pool}/upgrade | | `PoolVersions` (POST: upgrades) |
//! | GET | /v1/pools/{pool}/history | | `[HistoryRecord]` |
//! | GET | /v1/events?after=N&wait_ms=M&pool=P | | `[Event]` (waits up to M ms for one) |
//! | DELETE | /v1/events?pool=P | | `{"cleared": N}` |
//! | POST | /v1/labelclear | [`LabelclearRequest`] | 204 |
//! | GET | /v1/users | | `[UserInfo]` (never secrets) |
//! | POST | /v1/users | [`AddUser`] | `NewUser` (201; the only answer with the secret) |
//! | DELETE | /v1/users/{user} | | 204 |
//! | POST | /v1/users/{user}/grants | [`GrantRequest`] | `UserInfo` |
//! | DELETE | /v1/users/{user}/grants?bucket=B | | `UserInfo` |
//! | GET | /v1/shares | | [`ShareList`] |
//! | POST | /v1/shares | [`ShareRequest`] | [`ShareList`] (`cistern share`) |
//! | DELETE | /v1/shares | [`ShareRequest`] | [`ShareList`] removed (`cistern unshare`) |
//! | GET | /v1/mounts | | `[fuse::MountInfo]` |
//! | POST | /v1/mounts | [`MountRequest`] | `[fuse::MountInfo]` mounted (201) |
//! | POST | /v1/unmount | [`UnmountRequest`] | `[fuse::MountInfo]` unmounted |
//! | GET | /v1/send/local | | [`send_local::LocalInfo`]: the socket local `send`/`receive` hand their stream to (404: none) |
//! | GET | /metrics | | Prometheus text |
//!
//! Every request that changes a pool is recorded in its history (`pool
//! history`) after it succeeded, with the headers [`HEADER_COMMAND`],
//! [`HEADER_USER`] and [`HEADER_HOST`] the CLI sends (percent-encoded
//! UTF-8, see [`encode_header`]); without them the method and path are recorded.
//!
//! After every successful request that may change datasets or properties,
//! the daemon's [`shares::ChangeHook`]s run before the answer is sent
//! (`cistern set sharesmb=on` is live when it returns).
//!
//! Errors are `{"error": "...", "kind": "NotFound"}` ([`ErrorBody`]) with a
//! status mapped from [`dataset::Error`] (see [`status_for`]).

pub mod auth;
pub mod client;
pub mod history;
pub mod metrics;
pub mod samples;
pub mod send;
pub mod send_local;
pub mod server;
pub mod shares;

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

pub use client::{Client, ClientError};
pub use server::{router, status_for, ApiState};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_encoding_round_trips() {
        for s in [
            "cistern pool create tank /d/a",
            "snap@20131124_1344 %x",
            "caf\u{e9} \n",
            "100%",
        ] {
            let e = encode_header(s);
            assert!(e.bytes().all(|b| (0x20..0x7f).contains(&b)));
            assert_eq!(decode_header(&e), s);
        }
    }
}

/// Default address of the management API.
pub const DEFAULT_API_ADDR: &str = "127.0.0.1:10810";
/// Default URL the CLI talks to.
pub const DEFAULT_API_URL: &str = "http://127.0.0.1:10810";

/// `GET /v1/health`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Health {
    pub status: String,
    pub version: String,
}

/// `POST /v1/import`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportRequest {
    /// Pool name or numeric guid.
    pub pool: String,
    pub dirs: Vec<PathBuf>,
    /// `-f`: import a pool another daemon seems to hold, once its MMP stamps
    /// stay still (never while they move).
    #[serde(default)]
    pub force: bool,
    /// `-m`: import even though the log device (SLOG) is missing, losing the
    /// sync writes only it held (zpool import -m).
    #[serde(default)]
    pub missing_log: bool,
}

/// `POST /v1/datasets`: `cistern create -V SIZE -o k=v NAME`, or
/// `cistern create -t bucket NAME` (`kind` bucket, `volsize` 0).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    pub name: String,
    pub volsize: u64,
    #[serde(default)]
    pub properties: Vec<(String, String)>,
    /// Absent: a volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<dataset::DatasetKind>,
    /// The key of a new encryption root with keylocation=prompt (never logged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<dataset::KeyMaterial>,
}

/// `POST /v1/keys/load`: `cistern load-key [-a] [-n] [-L LOCATION] [DS]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadKeyRequest {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub all: bool,
    #[serde(default)]
    pub noop: bool,
    #[serde(default)]
    pub location: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<dataset::KeyMaterial>,
}

/// `POST /v1/keys/unload`: `cistern unload-key [-a] [DS]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnloadKeyRequest {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub all: bool,
}

/// `POST /v1/keys/change`: `cistern change-key [-o keyformat=..] [-o keylocation=..] DS`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChangeKeyRequest {
    pub name: String,
    #[serde(default)]
    pub properties: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<dataset::KeyMaterial>,
    /// `change-key -i`: inherit the parent's key (no properties, no key).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inherit: bool,
}

/// What `load-key`/`unload-key` did: the encryption roots changed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct KeyResult {
    pub done: Vec<String>,
    /// `-a`: roots that failed, with why.
    #[serde(default)]
    pub failed: Vec<(String, String)>,
}

/// `POST /v1/users`: `cistern user add NAME [--grant BUCKET=ro|rw]...`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddUser {
    pub name: String,
    #[serde(default)]
    pub grants: Vec<s3::access::Grant>,
}

/// `POST /v1/users/{user}/grants`: `cistern user grant NAME BUCKET ro|rw`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantRequest {
    /// A bucket name or `*`.
    pub bucket: String,
    pub access: s3::access::Access,
}

/// `POST /v1/snapshots`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    pub names: Vec<String>,
    #[serde(default)]
    pub recursive: bool,
}

/// `POST /v1/rollback`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollbackRequest {
    pub snapshot: String,
    #[serde(default)]
    pub recursive: bool,
    /// Disconnect the dataset's clients instead of refusing (`-f`).
    #[serde(default)]
    pub force: bool,
    /// Change nothing; answer a `dataset::RollbackPreview` (`rollback -n`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

/// `POST /v1/clone`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloneRequest {
    pub snapshot: String,
    pub name: String,
    #[serde(default)]
    pub properties: Vec<(String, String)>,
}

/// `POST /v1/rename`: answers the new names (the dataset, what is below it, its snapshots).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenameRequest {
    pub from: String,
    /// `POOL/NEW`, `DS@NEW`, or `@NEW` for a snapshot.
    pub to: String,
    /// Snapshots only: the same snapshot of every dataset below too.
    #[serde(default)]
    pub recursive: bool,
}

/// `POST /v1/inherit`: the property is no longer set locally on `name`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InheritRequest {
    pub name: String,
    pub property: String,
    #[serde(default)]
    pub recursive: bool,
}

/// `POST /v1/policy/run`: take a snapshot now and prune (`dry_run`: only say what).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyRunRequest {
    pub dataset: String,
    #[serde(default)]
    pub dry_run: bool,
}

/// `POST` (hold) / `DELETE` (release) `/v1/holds`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HoldRequest {
    pub tag: String,
    pub snapshots: Vec<String>,
    #[serde(default)]
    pub recursive: bool,
}

/// `POST /v1/mounts`: `cistern mount DATASET [DIR]`, or `-a` (`all`).
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct MountRequest {
    #[serde(default)]
    pub dataset: Option<String>,
    /// Absent: where the dataset's `mountpoint` says.
    #[serde(default)]
    pub dir: Option<PathBuf>,
    /// Every filesystem with a mountpoint that is not mounted.
    #[serde(default)]
    pub all: bool,
}

/// `POST /v1/unmount`: `cistern unmount [-f] DATASET|DIR`, or `-a`.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct UnmountRequest {
    #[serde(default)]
    pub target: Option<String>,
    /// Detach it even with files open there.
    #[serde(default)]
    pub force: bool,
    #[serde(default)]
    pub all: bool,
}

/// `PATCH /v1/dataset?name=`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetProperty {
    pub property: String,
    pub value: String,
}

/// `POST /v1/pools/{pool}/scrub`: start (or resume), pause, or stop.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScrubRequest {
    pub action: dataset::ScrubAction,
}

/// `POST /v1/pools/{pool}/offline` and `/online`: a device by path, file name or guid.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceRequest {
    pub device: String,
}

/// `POST /v1/pools/{pool}/clear`: one device's counters, or all.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClearRequest {
    #[serde(default)]
    pub device: Option<String>,
}

/// `POST /v1/pools/{pool}/replace`: `new` (an absolute path that exists)
/// takes `old`'s place and is resilvered.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplaceRequest {
    pub old: String,
    pub new: PathBuf,
    /// Use `new` even if it carries the label of a pool not imported here.
    #[serde(default)]
    pub force: bool,
}

/// `POST /v1/pools/{pool}/attach`: `new` becomes a mirror copy of `device`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachRequest {
    pub device: String,
    pub new: PathBuf,
    #[serde(default)]
    pub force: bool,
}

/// `POST /v1/labelclear`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelclearRequest {
    pub device: PathBuf,
    #[serde(default)]
    pub force: bool,
}

/// The command line as the client ran it, e.g. `cistern pool create tank d0`.
pub const HEADER_COMMAND: &str = "x-cistern-command";
/// The user who ran it, and on which host.
pub const HEADER_USER: &str = "x-cistern-user";
pub const HEADER_HOST: &str = "x-cistern-host";

/// Header-safe form of any UTF-8 text: bytes outside printable ASCII and
/// `%` become `%XX`.
pub fn encode_header(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A query-string component: bytes other than unreserved ones as `%XX`.
pub fn encode_query(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Inverse of [`encode_header`] (invalid escapes are kept as they are).
pub fn decode_header(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
            if let Some(v) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Body of every error response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorBody {
    pub error: String,
    /// `NotFound`, `AlreadyExists`, `InvalidArgument`, `Busy`, `NoSpace`,
    /// `ReadOnly`, `Corrupt`, `Io`, or `BadRequest` for a malformed request.
    pub kind: String,
}

/// `POST /v1/shares` (`cistern share`) and `DELETE /v1/shares` (`cistern unshare`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShareRequest {
    /// None: every dataset (`-a`).
    #[serde(default)]
    pub dataset: Option<String>,
    /// `smb` or `nfs`; None: every protocol.
    #[serde(default)]
    pub protocol: Option<String>,
}

/// One dataset shared over one protocol.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareInfo {
    pub protocol: String,
    pub dataset: String,
    /// The share (SMB) or export (NFS) name.
    pub name: String,
    pub path: PathBuf,
}

/// A dataset whose properties ask for a share it does not get, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareProblem {
    pub protocol: String,
    pub dataset: String,
    pub why: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareList {
    pub shares: Vec<ShareInfo>,
    #[serde(default)]
    pub problems: Vec<ShareProblem>,
}

//! Cistern's management HTTP API: an axum [`server`] over a [`dataset::Engine`]
//! and the blocking [`client`] the `cistern` CLI uses.
//!
//! Bodies are JSON; the engine's own types (`PoolSpec`, `PoolStatus`,
//! `DatasetInfo`, ...) travel unchanged. Dataset names contain `/`, so routes
//! that address one dataset take it as the query parameter `?name=`.
//!
//! | method | path | body in | body out |
//! |---|---|---|---|
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
//! | POST | /v1/pools/{pool}/scrub | [`ScrubRequest`] | `PoolStatus` |
//! | POST | /v1/pools/{pool}/offline | [`DeviceRequest`] | `PoolStatus` |
//! | POST | /v1/pools/{pool}/online | [`DeviceRequest`] | `PoolStatus` |
//! | POST | /v1/pools/{pool}/clear | [`ClearRequest`] | `PoolStatus` |
//! | POST | /v1/pools/{pool}/replace | [`ReplaceRequest`] | `PoolStatus` |
//! | GET | /metrics | | Prometheus text |
//!
//! Errors are `{"error": "...", "kind": "NotFound"}` ([`ErrorBody`]) with a
//! status mapped from [`dataset::Error`] (see [`status_for`]).

pub mod client;
pub mod metrics;
pub mod server;

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

pub use client::{Client, ClientError};
pub use server::{router, status_for, ApiState};

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
}

/// `POST /v1/datasets`: `cistern create -V SIZE -o k=v NAME`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    pub name: String,
    pub volsize: u64,
    #[serde(default)]
    pub properties: Vec<(String, String)>,
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

/// `POST` (hold) / `DELETE` (release) `/v1/holds`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HoldRequest {
    pub tag: String,
    pub snapshots: Vec<String>,
    #[serde(default)]
    pub recursive: bool,
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

/// Body of every error response.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorBody {
    pub error: String,
    /// `NotFound`, `AlreadyExists`, `InvalidArgument`, `Busy`, `NoSpace`,
    /// `ReadOnly`, `Corrupt`, `Io`, or `BadRequest` for a malformed request.
    pub kind: String,
}

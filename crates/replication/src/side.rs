//! One end of a job: the dataset on this daemon ([`Local`], the engine) or
//! on the other one ([`RemoteSide`], its HTTPS API with its token). The job
//! logic in `run.rs` sees both through [`Side`], so push and pull are the
//! same code with the ends swapped.

use crate::{Error, Result};
use dataset::{DatasetInfo, DestroyOptions, Engine};
use std::io::{Read, Write};
use std::sync::Arc;

/// A snapshot as the job sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snap {
    /// Short name (after `@`).
    pub name: String,
    pub created: i64,
    pub txg: u64,
    pub holds: u64,
    /// The snapshot's guid when the engine reports one (same on both ends
    /// of a stream); None: compared by name.
    pub guid: Option<String>,
}

/// How long a run waits for a receive into its target to end (a cut one
/// unwinding) before it reads the target's resume token.
pub const RECEIVE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The dataset itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DsState {
    pub kind: dataset::DatasetKind,
    /// Bytes written since its newest snapshot.
    pub written: u64,
    pub readonly: bool,
    /// Set while a resumable receive is unfinished.
    pub resume_token: Option<String>,
}

/// What to stream (the send engine's options, as the job uses them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamSpec {
    /// Full snapshot name `pool/ds@snap` on the sending side.
    pub snapshot: String,
    /// Incremental from this snapshot (full name), with the snapshots between (`-I`).
    pub from: Option<String>,
    /// Continue an interrupted stream (`send -t`).
    pub resume_token: Option<String>,
    /// The receiving dataset.
    pub target: String,
    /// `receive -F`: roll the target back / replace it.
    pub force: bool,
}

pub trait Side: Send + Sync {
    /// `tank/vm` or `https://backup:10810/tank2/vm`, for messages.
    fn describe(&self) -> String;
    fn dataset(&self) -> &str;
    /// None: the dataset does not exist.
    fn state(&self) -> Result<Option<DsState>>;
    /// Waits (bounded: [`RECEIVE_WAIT`]) until no receive into the dataset
    /// runs on its daemon: one whose stream was just cut still applies what
    /// it had buffered, and its resume token moves until it ends.
    fn receive_wait(&self) -> Result<()> {
        Ok(())
    }
    /// The dataset's snapshots, oldest first (by creation txg).
    fn snapshots(&self) -> Result<Vec<Snap>>;
    fn hold(&self, snap: &str, tag: &str) -> Result<()>;
    fn release(&self, snap: &str, tag: &str) -> Result<()>;
    /// Destroys short-named snapshots in one batch; returns bytes freed.
    fn destroy_snapshots(&self, names: &[String]) -> Result<u64>;
    fn set_readonly(&self) -> Result<()>;
    /// Rolls back to `snap` (short name), destroying later snapshots.
    fn rollback(&self, snap: &str) -> Result<()>;
    /// Discards an unfinished resumable receive (`receive -A`).
    fn receive_abort(&self) -> Result<()>;
    /// Bytes and names (bucket keys) changed since the snapshot `snap`,
    /// uncommitted writes included (`cistern diff`).
    fn changed_since(&self, snap: &str) -> Result<(u64, usize)>;
    /// Destroys the dataset and its snapshots (`--force` replacing a target
    /// that shares no snapshot with the source).
    fn destroy_all(&self) -> Result<()>;
    /// Estimated stream size, if the sender can tell.
    fn estimate(&self, spec: &StreamSpec) -> Option<u64>;
    /// Writes the stream into `out` (this side sends).
    fn send(&self, spec: &StreamSpec, out: &mut dyn Write) -> Result<()>;
    /// Reads a stream from `input` into this side (this side receives).
    fn receive(&self, spec: &StreamSpec, input: Box<dyn Read + Send>) -> Result<()>;
}

fn prop<'a>(i: &'a DatasetInfo, name: &str) -> Option<&'a str> {
    i.property(name).map(|p| p.parsable.as_str())
}

fn num(i: &DatasetInfo, name: &str) -> u64 {
    prop(i, name).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The snapshots of exactly `ds` in a listing of its subtree, oldest first.
pub fn snaps_of(ds: &str, list: &[DatasetInfo]) -> Vec<Snap> {
    let prefix = format!("{ds}@");
    let mut out: Vec<Snap> = list
        .iter()
        .filter_map(|i| {
            let short = i.name.strip_prefix(&prefix)?;
            Some(Snap {
                name: short.to_string(),
                created: num(i, "creation") as i64,
                txg: num(i, "createtxg"),
                holds: num(i, "userrefs"),
                guid: prop(i, "guid")
                    .filter(|g| !g.is_empty() && *g != "-")
                    .map(str::to_string),
            })
        })
        .collect();
    out.sort_by(|a, b| (a.txg, a.created, &a.name).cmp(&(b.txg, b.created, &b.name)));
    out
}

fn state_of(i: &DatasetInfo) -> DsState {
    DsState {
        kind: i.kind,
        written: num(i, "written"),
        readonly: prop(i, "readonly") == Some("on"),
        resume_token: prop(i, "receive_resume_token")
            .filter(|t| !t.is_empty() && *t != "-")
            .map(str::to_string),
    }
}

/// The dataset on this daemon.
pub struct Local {
    pub engine: Arc<Engine>,
    pub dataset: String,
}

fn engine_err(e: dataset::Error) -> Error {
    Error::Engine(e)
}

impl Side for Local {
    fn receive_wait(&self) -> Result<()> {
        match self.engine.receive_wait(&self.dataset, RECEIVE_WAIT) {
            Err(dataset::Error::NotFound(_)) => Ok(()),
            r => r.map_err(engine_err),
        }
    }

    fn describe(&self) -> String {
        self.dataset.clone()
    }

    fn dataset(&self) -> &str {
        &self.dataset
    }

    fn state(&self) -> Result<Option<DsState>> {
        match self.engine.dataset(&self.dataset) {
            Ok(i) => Ok(Some(state_of(&i))),
            Err(dataset::Error::NotFound(_)) => Ok(None),
            Err(e) => Err(engine_err(e)),
        }
    }

    fn snapshots(&self) -> Result<Vec<Snap>> {
        match self.engine.list_datasets(Some(&self.dataset)) {
            Ok(l) => Ok(snaps_of(&self.dataset, &l)),
            Err(dataset::Error::NotFound(_)) => Ok(Vec::new()),
            Err(e) => Err(engine_err(e)),
        }
    }

    fn hold(&self, snap: &str, tag: &str) -> Result<()> {
        let full = vec![format!("{}@{snap}", self.dataset)];
        match self.engine.set_hold(tag, &full, false, true) {
            Ok(()) | Err(dataset::Error::AlreadyExists(_)) => Ok(()),
            Err(e) => Err(engine_err(e)),
        }
    }

    fn release(&self, snap: &str, tag: &str) -> Result<()> {
        let full = vec![format!("{}@{snap}", self.dataset)];
        match self.engine.set_hold(tag, &full, false, false) {
            Ok(()) | Err(dataset::Error::NotFound(_)) => Ok(()),
            Err(e) => Err(engine_err(e)),
        }
    }

    fn destroy_snapshots(&self, names: &[String]) -> Result<u64> {
        if names.is_empty() {
            return Ok(0);
        }
        let spec = format!("{}@{}", self.dataset, names.join(","));
        self.engine
            .destroy(&spec, &DestroyOptions::default())
            .map(|r| r.freed)
            .map_err(engine_err)
    }

    fn set_readonly(&self) -> Result<()> {
        self.engine
            .set_property(&self.dataset, "readonly", "on")
            .map_err(engine_err)
    }

    fn rollback(&self, snap: &str) -> Result<()> {
        self.engine
            .rollback_with(&format!("{}@{snap}", self.dataset), true, true)
            .map(|_| ())
            .map_err(engine_err)
    }

    fn receive_abort(&self) -> Result<()> {
        self.engine.receive_abort(&self.dataset).map_err(engine_err)
    }

    fn changed_since(&self, snap: &str) -> Result<(u64, usize)> {
        self.engine
            .diff(&format!("{}@{snap}", self.dataset), None)
            .map(|d| (d.changed_bytes, d.names.len()))
            .map_err(engine_err)
    }

    fn destroy_all(&self) -> Result<()> {
        let opts = DestroyOptions {
            recursive: true,
            ..Default::default()
        };
        self.engine
            .destroy(&self.dataset, &opts)
            .map(|_| ())
            .map_err(engine_err)
    }

    fn estimate(&self, spec: &StreamSpec) -> Option<u64> {
        crate::engine_io::estimate(&self.engine, spec)
    }

    fn send(&self, spec: &StreamSpec, out: &mut dyn Write) -> Result<()> {
        crate::engine_io::send(&self.engine, spec, out)
    }

    fn receive(&self, spec: &StreamSpec, mut input: Box<dyn Read + Send>) -> Result<()> {
        crate::engine_io::receive(&self.engine, spec, &mut input)
    }
}

/// The dataset on the other daemon, through its API.
pub struct RemoteSide {
    pub client: api::Client,
    pub base: String,
    pub dataset: String,
}

impl RemoteSide {
    /// A client for `base` with the job's CA and token file.
    pub fn connect(
        base: &str,
        dataset: &str,
        ca: Option<&std::path::Path>,
        token_file: Option<&std::path::Path>,
    ) -> Result<Self> {
        let mut client = api::Client::with_timeout(base, std::time::Duration::from_secs(120));
        if let Some(ca) = ca {
            client = client.with_ca(ca).map_err(Error::Remote)?;
        }
        if let Some(f) = token_file {
            let t = std::fs::read_to_string(f).map_err(|e| {
                Error::Invalid(format!("cannot read the token file {}: {e}", f.display()))
            })?;
            let t = t.trim();
            if t.is_empty() {
                return Err(Error::Invalid(format!(
                    "the token file {} is empty",
                    f.display()
                )));
            }
            client = client.with_token(t.to_string());
        }
        Ok(RemoteSide {
            client,
            base: base.to_string(),
            dataset: dataset.to_string(),
        })
    }

    fn err(&self, e: api::ClientError) -> Error {
        Error::Remote(e)
    }
}

fn not_found(e: &api::ClientError) -> bool {
    e.kind() == Some("NotFound")
}

impl Side for RemoteSide {
    fn receive_wait(&self) -> Result<()> {
        match self.client.receive_wait(&self.dataset, RECEIVE_WAIT) {
            // NotFound: no such pool; 405: a daemon from before the wait.
            Err(api::ClientError::Api {
                status: 404 | 405, ..
            }) => Ok(()),
            r => r.map_err(|e| self.err(e)),
        }
    }

    fn describe(&self) -> String {
        format!("{}/{}", self.base, self.dataset)
    }

    fn dataset(&self) -> &str {
        &self.dataset
    }

    fn state(&self) -> Result<Option<DsState>> {
        match self.client.dataset(&self.dataset) {
            Ok(i) => Ok(Some(state_of(&i))),
            Err(e) if not_found(&e) => Ok(None),
            Err(e) => Err(self.err(e)),
        }
    }

    fn snapshots(&self) -> Result<Vec<Snap>> {
        match self.client.list_datasets(Some(&self.dataset)) {
            Ok(l) => Ok(snaps_of(&self.dataset, &l)),
            Err(e) if not_found(&e) => Ok(Vec::new()),
            Err(e) => Err(self.err(e)),
        }
    }

    fn hold(&self, snap: &str, tag: &str) -> Result<()> {
        let full = vec![format!("{}@{snap}", self.dataset)];
        match self.client.set_hold(tag, &full, false, true) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == Some("AlreadyExists") => Ok(()),
            Err(e) => Err(self.err(e)),
        }
    }

    fn release(&self, snap: &str, tag: &str) -> Result<()> {
        let full = vec![format!("{}@{snap}", self.dataset)];
        match self.client.set_hold(tag, &full, false, false) {
            Ok(()) => Ok(()),
            Err(e) if not_found(&e) => Ok(()),
            Err(e) => Err(self.err(e)),
        }
    }

    fn destroy_snapshots(&self, names: &[String]) -> Result<u64> {
        if names.is_empty() {
            return Ok(0);
        }
        let spec = format!("{}@{}", self.dataset, names.join(","));
        self.client
            .destroy(&spec, &DestroyOptions::default())
            .map(|r| r.freed)
            .map_err(|e| self.err(e))
    }

    fn set_readonly(&self) -> Result<()> {
        self.client
            .set_property(&self.dataset, "readonly", "on")
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    fn rollback(&self, snap: &str) -> Result<()> {
        self.client
            .rollback_with(&format!("{}@{snap}", self.dataset), true, true)
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    fn receive_abort(&self) -> Result<()> {
        self.client
            .receive_abort(&self.dataset)
            .map_err(|e| self.err(e))
    }

    fn changed_since(&self, snap: &str) -> Result<(u64, usize)> {
        self.client
            .diff(&format!("{}@{snap}", self.dataset), None)
            .map(|d| (d.changed_bytes, d.names.len()))
            .map_err(|e| self.err(e))
    }

    fn destroy_all(&self) -> Result<()> {
        let opts = DestroyOptions {
            recursive: true,
            ..Default::default()
        };
        self.client
            .destroy(&self.dataset, &opts)
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    fn estimate(&self, spec: &StreamSpec) -> Option<u64> {
        crate::engine_io::remote_estimate(&self.client, spec)
    }

    fn send(&self, spec: &StreamSpec, out: &mut dyn Write) -> Result<()> {
        crate::engine_io::remote_send(&self.client, spec, out)
    }

    fn receive(&self, spec: &StreamSpec, input: Box<dyn Read + Send>) -> Result<()> {
        crate::engine_io::remote_receive(&self.client, spec, input)
    }
}

//! The data path: this daemon's send/receive engine and the other daemon's
//! `POST /v1/send` / `POST /v1/receive`, in the job's terms ([`StreamSpec`]).

use crate::side::StreamSpec;
use crate::{Error, Result};
use dataset::Engine;
use std::io::{Read, Write};
use std::time::Duration;

/// A peer that makes no progress for this long is given up on (the run
/// fails and is retried; a resumable receive keeps what arrived): 60 s, or
/// `CISTERN_STREAM_STALL_SECS` (the daemon's own send/receive use the same).
fn stall() -> Duration {
    api::send::stream_stall()
}

/// The send engine's options for `spec` (also the JSON of `POST /v1/send`).
fn send_options(spec: &StreamSpec) -> dataset::SendOptions {
    dataset::SendOptions {
        snapshot: spec.snapshot.clone(),
        from: spec.from.clone(),
        intermediates: spec.from.is_some(),
        recursive: false,
        raw: false,
        resume_token: spec.resume_token.clone(),
    }
}

fn receive_options(spec: &StreamSpec) -> dataset::ReceiveOptions {
    dataset::ReceiveOptions {
        target: spec.target.clone(),
        force: spec.force,
        resumable: true,
    }
}

pub fn estimate(engine: &Engine, spec: &StreamSpec) -> Option<u64> {
    engine.send_estimate(&send_options(spec)).ok()
}

pub fn send(engine: &Engine, spec: &StreamSpec, out: &mut dyn Write) -> Result<()> {
    engine
        .send(&send_options(spec), out)
        .map(|_| ())
        .map_err(Error::Engine)
}

pub fn receive(engine: &Engine, spec: &StreamSpec, input: &mut dyn Read) -> Result<()> {
    engine
        .receive(&receive_options(spec), input)
        .map(|_| ())
        .map_err(Error::Engine)
}

pub fn remote_estimate(client: &api::Client, spec: &StreamSpec) -> Option<u64> {
    let v: serde_json::Value = client
        .post_json("/v1/send", &[("dry_run", "1")], &send_options(spec))
        .ok()?;
    ["bytes", "size", "estimate", "total"]
        .iter()
        .find_map(|k| v.get(*k).and_then(|b| b.as_u64()))
}

pub fn remote_send(client: &api::Client, spec: &StreamSpec, out: &mut dyn Write) -> Result<()> {
    let mut r = client
        .post_for_stream("/v1/send", &[], &send_options(spec), stall())
        .map_err(Error::Remote)?;
    api::client::copy_stream(&mut r, out)
        .map_err(|e| Error::Stream(format!("receiving the stream: {e}")))?;
    Ok(())
}

pub fn remote_receive(
    client: &api::Client,
    spec: &StreamSpec,
    input: Box<dyn Read + Send>,
) -> Result<()> {
    let mut q = vec![("target", spec.target.as_str()), ("resumable", "1")];
    if spec.force {
        q.push(("force", "1"));
    }
    let _: serde_json::Value = client
        .post_stream("/v1/receive", &q, input, stall())
        .map_err(Error::Remote)?;
    Ok(())
}

//! The data path: this daemon's send/receive engine and the other daemon's
//! `POST /v1/send` / `POST /v1/receive`, in the job's terms ([`StreamSpec`]).

use crate::side::StreamSpec;
use crate::{Error, Result};
use dataset::Engine;
use serde::Serialize;
use std::io::{Read, Write};
use std::time::Duration;

/// A peer that makes no progress for this long is given up on (the run
/// fails and is retried; a resumable receive keeps what arrived).
pub const STALL: Duration = Duration::from_secs(60);

/// The JSON of `POST /v1/send` (the send engine's options).
#[derive(Debug, Serialize)]
struct SendBody<'a> {
    snapshot: &'a str,
    from: Option<&'a str>,
    intermediates: bool,
    recursive: bool,
    raw: bool,
    resume_token: Option<&'a str>,
}

fn send_body(spec: &StreamSpec) -> SendBody<'_> {
    SendBody {
        snapshot: &spec.snapshot,
        from: spec.from.as_deref(),
        intermediates: spec.from.is_some(),
        recursive: false,
        raw: true,
        resume_token: spec.resume_token.as_deref(),
    }
}

pub fn estimate(_engine: &Engine, _spec: &StreamSpec) -> Option<u64> {
    None
}

pub fn send(_engine: &Engine, _spec: &StreamSpec, _out: &mut dyn Write) -> Result<()> {
    Err(Error::Unsupported("this build has no send engine".into()))
}

pub fn receive(_engine: &Engine, _spec: &StreamSpec, _input: &mut dyn Read) -> Result<()> {
    Err(Error::Unsupported(
        "this build has no receive engine".into(),
    ))
}

pub fn remote_estimate(client: &api::Client, spec: &StreamSpec) -> Option<u64> {
    let v: serde_json::Value = client
        .post_json("/v1/send", &[("dry_run", "1")], &send_body(spec))
        .ok()?;
    ["bytes", "size", "estimate", "total"]
        .iter()
        .find_map(|k| v.get(*k).and_then(|b| b.as_u64()))
}

pub fn remote_send(client: &api::Client, spec: &StreamSpec, out: &mut dyn Write) -> Result<()> {
    let mut r = client
        .post_for_stream("/v1/send", &[], &send_body(spec), STALL)
        .map_err(Error::Remote)?;
    std::io::copy(&mut r, out).map_err(|e| Error::Stream(format!("receiving the stream: {e}")))?;
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
        .post_stream("/v1/receive", &q, input, STALL)
        .map_err(Error::Remote)?;
    Ok(())
}

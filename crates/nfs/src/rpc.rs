//! ONC RPC over TCP (RFC 5531): record marking, call headers, replies.
//!
//! Fork of nfs3_server 0.11.1 `src/rpcwire.rs` and `src/rpcwire/messages.rs`
//! (BSD-3-Clause, Copyright (c) 2023, XetData; see LICENSE-nfs3_server).
//! Changed: records are bounded ([`MAX_RECORD`]) and read straight from
//! the socket; AUTH_UNIX credentials are decoded here with bounds (16
//! groups, 255-byte machine name) instead of by nfs3_types, whose decoder
//! reserves whatever length the peer declares; no panics on bad input
//! (every failure is an error the caller logs); the retransmission tracker
//! is gone (TCP does not retransmit within a connection).

use nfs3_types::rpc::{
    accept_stat_data, accepted_reply, auth_stat, fragment_header, msg_body, opaque_auth,
    rejected_reply, reply_body, rpc_msg, RPC_VERSION_2,
};
use nfs3_types::xdr_codec::{Pack, Unpack, Void};
use std::io::Cursor;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The largest RPC record accepted: a 1 MiB WRITE plus its headers.
pub const MAX_RECORD: usize = (1 << 20) + (64 << 10);

#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error("connection closed")]
    Closed,
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("RPC record of {0} bytes is over the {MAX_RECORD}-byte limit")]
    TooLarge(usize),
    #[error("bad RPC message: {0}")]
    Garbage(String),
}

/// Reads one record (all its fragments). `Closed` at a clean end of stream.
pub async fn read_record(
    input: &mut (impl AsyncRead + Unpin),
    buf: &mut Vec<u8>,
) -> Result<(), RpcError> {
    buf.clear();
    loop {
        let mut header = [0u8; 4];
        match input.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && buf.is_empty() => {
                return Err(RpcError::Closed)
            }
            Err(e) => return Err(e.into()),
        }
        let header: fragment_header = header.into();
        let len = header.fragment_length() as usize;
        let total = buf.len() + len;
        if total > MAX_RECORD {
            return Err(RpcError::TooLarge(total));
        }
        let start = buf.len();
        buf.resize(total, 0);
        input.read_exact(&mut buf[start..]).await?;
        if header.eof() {
            return Ok(());
        }
    }
}

/// Frames a reply as one record.
pub fn frame(reply: Vec<u8>) -> Vec<u8> {
    let len = u32::try_from(reply.len()).unwrap_or(u32::MAX) & fragment_header::MASK;
    let mut out = Vec::with_capacity(4 + reply.len());
    out.extend_from_slice(&fragment_header::new(len, true).into_xdr_buf());
    out.extend_from_slice(&reply);
    out
}

/// AUTH_UNIX's fields that matter here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unix {
    pub uid: u32,
    pub gid: u32,
    pub gids: Vec<u32>,
}

/// One call: its header and where its arguments start.
pub struct Call {
    pub xid: u32,
    pub prog: u32,
    pub vers: u32,
    pub proc_: u32,
    pub rpcvers: u32,
    /// `None`: AUTH_NULL. `Err`: another flavor or a bad credential.
    pub unix: Result<Option<Unix>, auth_stat>,
    pub args: Cursor<Vec<u8>>,
}

fn be_u32(b: &[u8], at: &mut usize) -> Option<u32> {
    let v = b.get(*at..*at + 4)?;
    *at += 4;
    Some(u32::from_be_bytes([v[0], v[1], v[2], v[3]]))
}

/// Decodes an AUTH_UNIX body (RFC 5531 appendix A) with its limits.
fn decode_unix(body: &[u8]) -> Option<Unix> {
    let mut at = 0;
    let _stamp = be_u32(body, &mut at)?;
    let name_len = be_u32(body, &mut at)? as usize;
    if name_len > 255 {
        return None;
    }
    at += name_len.div_ceil(4) * 4;
    let uid = be_u32(body, &mut at)?;
    let gid = be_u32(body, &mut at)?;
    let n = be_u32(body, &mut at)? as usize;
    if n > 16 {
        return None;
    }
    let mut gids = Vec::with_capacity(n);
    for _ in 0..n {
        gids.push(be_u32(body, &mut at)?);
    }
    Some(Unix { uid, gid, gids })
}

impl Call {
    pub fn parse(record: Vec<u8>) -> Result<Call, RpcError> {
        // By hand, not with nfs3_types: its decoder reserves whatever
        // length a credential declares before reading it.
        let bad = |what: &str| RpcError::Garbage(what.to_string());
        let mut at = 0;
        let mut next = |what: &str| be_u32(&record, &mut at).ok_or_else(|| bad(what));
        let xid = next("no xid")?;
        if next("no message type")? != 0 {
            return Err(RpcError::Garbage(format!("xid {xid}: not a call")));
        }
        let rpcvers = next("short call header")?;
        let prog = next("short call header")?;
        let vers = next("short call header")?;
        let proc_ = next("short call header")?;
        let flavor = next("short call header")?;
        let opaque = |at: &mut usize| -> Result<std::ops::Range<usize>, RpcError> {
            let len = be_u32(&record, at).ok_or_else(|| bad("short credential"))? as usize;
            if len > 400 {
                return Err(RpcError::Garbage(format!(
                    "xid {xid}: credential of {len} bytes (400 at most)"
                )));
            }
            let start = *at;
            *at += len.div_ceil(4) * 4;
            if *at > record.len() {
                return Err(bad("short credential"));
            }
            Ok(start..start + len)
        };
        let cred = opaque(&mut at)?;
        let _verf_flavor = be_u32(&record, &mut at).ok_or_else(|| bad("no verifier"))?;
        opaque(&mut at)?;
        let unix = match flavor {
            0 => Ok(None),
            1 => match decode_unix(&record[cred]) {
                Some(u) => Ok(Some(u)),
                None => Err(auth_stat::AUTH_BADCRED),
            },
            _ => Err(auth_stat::AUTH_REJECTEDCRED),
        };
        let mut args = Cursor::new(record);
        args.set_position(at as u64);
        Ok(Call {
            xid,
            prog,
            vers,
            proc_,
            rpcvers,
            unix,
            args,
        })
    }

    /// Decodes the arguments; all of the record must be used.
    pub fn args<T: Unpack>(&mut self) -> Result<T, String> {
        let (v, _) = T::unpack(&mut self.args).map_err(|e| e.to_string())?;
        if self.args.position() != self.args.get_ref().len() as u64 {
            return Err("bytes left after the arguments".into());
        }
        Ok(v)
    }
}

fn pack_reply(xid: u32, body: reply_body<'_>, result: Option<&dyn PackDyn>) -> Vec<u8> {
    let msg = rpc_msg {
        xid,
        body: msg_body::REPLY(body),
    };
    let mut out = Cursor::new(Vec::with_capacity(
        msg.packed_size() + result.map_or(0, |r| r.size()),
    ));
    // Writing into a Vec cannot fail; a reply that could not be packed is
    // caught by the caller as an empty record.
    if msg.pack(&mut out).is_err() {
        return Vec::new();
    }
    if let Some(r) = result {
        if !r.pack_into(&mut out) {
            return Vec::new();
        }
    }
    out.into_inner()
}

/// `Pack` made object-safe for the reply builder.
pub trait PackDyn {
    fn size(&self) -> usize;
    /// False if it could not be packed.
    fn pack_into(&self, out: &mut Cursor<Vec<u8>>) -> bool;
}

impl<T: Pack> PackDyn for T {
    fn size(&self) -> usize {
        self.packed_size()
    }
    fn pack_into(&self, out: &mut Cursor<Vec<u8>>) -> bool {
        self.pack(out).is_ok()
    }
}

/// A successful call's reply carrying `result`.
pub fn success(xid: u32, result: &dyn PackDyn) -> Vec<u8> {
    pack_reply(
        xid,
        reply_body::MSG_ACCEPTED(accepted_reply {
            verf: opaque_auth::default(),
            reply_data: accept_stat_data::SUCCESS,
        }),
        Some(result),
    )
}

/// An accepted call that failed at the RPC level (GARBAGE_ARGS, PROC_UNAVAIL...).
pub fn accept_error(xid: u32, stat: accept_stat_data) -> Vec<u8> {
    pack_reply(
        xid,
        reply_body::MSG_ACCEPTED(accepted_reply {
            verf: opaque_auth::default(),
            reply_data: stat,
        }),
        Some(&Void),
    )
}

pub fn auth_error(xid: u32, stat: auth_stat) -> Vec<u8> {
    pack_reply(
        xid,
        reply_body::MSG_DENIED(rejected_reply::auth_error(stat)),
        None,
    )
}

pub fn rpc_mismatch(xid: u32) -> Vec<u8> {
    pack_reply(
        xid,
        reply_body::MSG_DENIED(rejected_reply::rpc_mismatch(RPC_VERSION_2, RPC_VERSION_2)),
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_unix_is_decoded_with_limits() {
        let mut b = Vec::new();
        for v in [7u32, 3] {
            b.extend_from_slice(&v.to_be_bytes());
        }
        b.extend_from_slice(b"abc\0");
        for v in [1000u32, 100, 2, 4, 5] {
            b.extend_from_slice(&v.to_be_bytes());
        }
        assert_eq!(
            decode_unix(&b),
            Some(Unix {
                uid: 1000,
                gid: 100,
                gids: vec![4, 5]
            })
        );
        // 17 groups, or a lying length: refused, nothing reserved.
        let mut many = b.clone();
        many[20..24].copy_from_slice(&17u32.to_be_bytes());
        assert_eq!(decode_unix(&many), None);
        let mut long = b;
        long[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(decode_unix(&long), None);
    }
}

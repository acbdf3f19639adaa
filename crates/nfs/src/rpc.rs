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
        let start = (self.args.position() as usize).min(self.args.get_ref().len());
        check_opaque_lengths(
            (self.prog, self.vers, self.proc_),
            &self.args.get_ref()[start..],
        )?;
        let (v, _) = T::unpack(&mut self.args).map_err(|e| e.to_string())?;
        if self.args.position() != self.args.get_ref().len() as u64 {
            return Err("bytes left after the arguments".into());
        }
        Ok(v)
    }
}

/// One field of a procedure's arguments, as far as lengths go.
#[derive(Clone, Copy)]
enum F {
    /// Fixed size, in bytes.
    Fixed(usize),
    /// A variable-length opaque or string (file handle, name, path, data).
    Opaque,
    /// sattr3: optional mode, uid, gid, size, then atime and mtime.
    Sattr,
    /// sattrguard3: optional ctime.
    Guard,
    /// createhow3: UNCHECKED/GUARDED sattr3, or EXCLUSIVE verifier.
    CreateHow,
    /// mknoddata3: device attributes and numbers, sattr3, or nothing.
    MknodData,
}

/// The argument layout of each procedure the server answers (RFC 1813,
/// MOUNT v3, portmap v2): only to find the opaque lengths.
fn layout(call: (u32, u32, u32)) -> &'static [F] {
    use nfs3_types::{mount, nfs3, portmap};
    use F::*;
    match call {
        (portmap::PROGRAM, portmap::VERSION, 3) => &[Fixed(16)],
        (mount::PROGRAM, mount::VERSION, 1 | 2) => &[Opaque],
        (nfs3::PROGRAM, nfs3::VERSION, p) => match p {
            1 | 5 | 18..=20 => &[Opaque],
            2 => &[Opaque, Sattr, Guard],
            3 | 12 | 13 => &[Opaque, Opaque],
            4 => &[Opaque, Fixed(4)],
            6 | 21 => &[Opaque, Fixed(12)],
            7 => &[Opaque, Fixed(16), Opaque],
            8 => &[Opaque, Opaque, CreateHow],
            9 => &[Opaque, Opaque, Sattr],
            10 => &[Opaque, Opaque, Sattr, Opaque],
            11 => &[Opaque, Opaque, MknodData],
            14 => &[Opaque, Opaque, Opaque, Opaque],
            15 => &[Opaque, Opaque, Opaque],
            16 => &[Opaque, Fixed(20)],
            17 => &[Opaque, Fixed(24)],
            _ => &[],
        },
        _ => &[],
    }
}

/// Refuses arguments that declare an opaque longer than what is left of
/// the record, before nfs3_types decodes them: its decoder allocates the
/// declared length first (up to 4 GiB per field, which can abort the
/// daemon on a small host). Anything else malformed (a short record, a bad
/// discriminant) is left to the decoder, which stops at the same place.
fn check_opaque_lengths(call: (u32, u32, u32), args: &[u8]) -> Result<(), String> {
    let mut w = Walker { args, at: 0 };
    match layout(call).iter().try_for_each(|f| w.field(*f)) {
        Err(Stop::TooLong(msg)) => Err(msg),
        Ok(()) | Err(Stop::Short) => Ok(()),
    }
}

enum Stop {
    /// The record ends (or a discriminant is bad) before the layout does.
    Short,
    TooLong(String),
}

struct Walker<'a> {
    args: &'a [u8],
    at: usize,
}

impl Walker<'_> {
    fn u32(&mut self) -> Result<u32, Stop> {
        be_u32(self.args, &mut self.at).ok_or(Stop::Short)
    }

    fn skip(&mut self, n: usize) -> Result<(), Stop> {
        self.at = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.args.len())
            .ok_or(Stop::Short)?;
        Ok(())
    }

    fn sattr(&mut self) -> Result<(), Stop> {
        for size in [4, 4, 4, 8] {
            if self.u32()? != 0 {
                self.skip(size)?;
            }
        }
        for _ in 0..2 {
            if self.u32()? == 2 {
                self.skip(8)?;
            }
        }
        Ok(())
    }

    fn field(&mut self, f: F) -> Result<(), Stop> {
        match f {
            F::Fixed(n) => self.skip(n),
            F::Opaque => {
                let len = self.u32()? as usize;
                let left = self.args.len() - self.at;
                if len > left {
                    return Err(Stop::TooLong(format!(
                        "an opaque of {len} bytes where {left} are left in the record"
                    )));
                }
                self.skip(len.div_ceil(4) * 4)
            }
            F::Sattr => self.sattr(),
            F::Guard => match self.u32()? {
                0 => Ok(()),
                _ => self.skip(8),
            },
            F::CreateHow => match self.u32()? {
                0 | 1 => self.sattr(),
                _ => self.skip(8),
            },
            F::MknodData => match self.u32()? {
                3 | 4 => {
                    self.sattr()?;
                    self.skip(8)
                }
                6 | 7 => self.sattr(),
                _ => Err(Stop::Short),
            },
        }
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

    fn call(proc_: u32, args: &[u32], tail: &[u8]) -> Call {
        let mut r = Vec::new();
        // xid, CALL, rpcvers 2, NFS 3, proc, AUTH_NULL, empty, AUTH_NULL verifier, empty
        for v in [1u32, 0, 2, 100_003, 3, proc_, 0, 0, 0, 0] {
            r.extend_from_slice(&v.to_be_bytes());
        }
        for v in args {
            r.extend_from_slice(&v.to_be_bytes());
        }
        r.extend_from_slice(tail);
        Call::parse(r).expect("a call")
    }

    #[test]
    fn opaque_lengths_past_the_record_are_refused_before_decoding() {
        use nfs3_types::nfs3::{GETATTR3args, WRITE3args};
        // GETATTR with a handle that claims 4 GiB - 16: refused by length.
        let e = call(1, &[u32::MAX - 15], &[0; 8])
            .args::<GETATTR3args>()
            .unwrap_err();
        assert!(e.contains("opaque of 4294967280 bytes"), "{e}");
        // WRITE whose data claims more than the record holds.
        let fh = [0u8; 36];
        let mut w = call(7, &[36], &fh);
        w.args.get_mut().extend_from_slice(&[0; 8]); // offset
        for v in [5u32, 0, 1 << 30] {
            w.args.get_mut().extend_from_slice(&v.to_be_bytes());
        }
        let e = w.args::<WRITE3args<'static>>().unwrap_err();
        assert!(e.contains("opaque of 1073741824 bytes"), "{e}");
        // The same WRITE with its 5 bytes (padded to 8) decodes.
        let mut w = call(7, &[36], &fh);
        w.args.get_mut().extend_from_slice(&[0; 8]);
        for v in [5u32, 0, 5] {
            w.args.get_mut().extend_from_slice(&v.to_be_bytes());
        }
        w.args.get_mut().extend_from_slice(b"hello\0\0\0");
        let a = w.args::<WRITE3args<'static>>().expect("decodes");
        assert_eq!(&a.data[..], b"hello");
        // A short record is left to the decoder, which says so.
        assert!(call(1, &[36], &[0; 4]).args::<GETATTR3args>().is_err());
    }
}

//! Wire format of the NBD protocol (fixed newstyle, simple and structured
//! replies; no extended headers): constants, limits, the request header
//! parser, option-data parsers and reply-header encoders.
//!
//! Everything here is pure (no I/O) so it can be unit-tested byte by byte.
//! Source: NetworkBlockDevice/nbd `doc/proto.md`.

use crate::ExportError;

// ---------------------------------------------------------------- magics

/// `NBDMAGIC`, first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: second server magic, and the magic of every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply.
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of every transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// ------------------------------------------------------- handshake flags

pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// ---------------------------------------------------- transmission flags

pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_RESIZE: u16 = 1 << 9;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// ---------------------------------------------------------------- options

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const OPT_EXTENDED_HEADERS: u32 = 11;

// ---------------------------------------------------------- option replies

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
const REP_ERR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERR | 1;
pub const REP_ERR_POLICY: u32 = REP_ERR | 2;
pub const REP_ERR_INVALID: u32 = REP_ERR | 3;
pub const REP_ERR_PLATFORM: u32 = REP_ERR | 4;
pub const REP_ERR_TLS_REQD: u32 = REP_ERR | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_ERR | 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_ERR | 7;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_ERR | 8;
pub const REP_ERR_TOO_BIG: u32 = REP_ERR | 9;

// ------------------------------------------------------------ info types

pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// -------------------------------------------------------------- commands

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// ------------------------------------------------------ structured replies

pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) | 2;

// ------------------------------------------------------------ error values

pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

// ---------------------------------------------------- base:allocation

pub const BASE_ALLOCATION: &str = "base:allocation";
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

// ------------------------------------------------------------------ limits

/// Largest option payload we read; larger ones get `NBD_REP_ERR_TOO_BIG`.
pub const MAX_OPTION_LEN: u32 = 64 * 1024;
/// Oversized option data up to this size is read and discarded (so the
/// session can go on); beyond it the server replies and disconnects.
pub const MAX_OPTION_DISCARD: u32 = 1024 * 1024;
/// Maximum length of a protocol string (export names, queries, messages).
pub const MAX_STRING_LEN: usize = 4096;
/// Maximum READ/WRITE payload (advertised maximum payload size).
pub const MAX_PAYLOAD: u32 = 32 * 1024 * 1024;
/// Advertised minimum block size.
pub const MIN_BLOCK_SIZE: u32 = 1;
/// Maximum descriptors in one `NBD_REPLY_TYPE_BLOCK_STATUS` chunk (spec: SHOULD NOT exceed 2^20).
pub const MAX_EXTENTS: usize = 1 << 20;
/// Largest single descriptor length we emit: `u32` on the wire, kept 4 KiB aligned.
pub const MAX_EXTENT_LEN: u64 = 0xFFFF_F000;
/// Trailing zeroes after `NBD_OPT_EXPORT_NAME` reply unless `NO_ZEROES`.
pub const EXPORT_NAME_ZEROES: usize = 124;

/// The transmission flags we send for an export.
pub fn transmission_flags(read_only: bool, structured: bool) -> u16 {
    let mut f =
        FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_CAN_MULTI_CONN | FLAG_SEND_CACHE;
    if read_only {
        f |= FLAG_READ_ONLY;
    } else {
        f |= FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO;
    }
    if structured {
        f |= FLAG_SEND_DF;
    }
    f
}

/// The preferred block size we advertise: a power of two in
/// `512..=MAX_PAYLOAD`, as the spec requires, derived from the export's wish.
pub fn sanitize_preferred_block_size(wanted: u32) -> u32 {
    let v = wanted.clamp(512, MAX_PAYLOAD);
    if v.is_power_of_two() {
        v
    } else {
        // Round down to a power of two (never below 512).
        (1u32 << (31 - v.leading_zeros())).max(512)
    }
}

/// NBD error value for an export error.
pub fn errno_of(e: &ExportError) -> u32 {
    match e {
        ExportError::Io(_) => EIO,
        ExportError::Perm(_) => EPERM,
        ExportError::NoSpace(_) => ENOSPC,
        ExportError::Invalid(_) => EINVAL,
        ExportError::NotSupported(_) => ENOTSUP,
        ExportError::Shutdown(_) => ESHUTDOWN,
    }
}

// ------------------------------------------------------------- commands

/// A transmission command type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Read,
    Write,
    Disc,
    Flush,
    Trim,
    Cache,
    WriteZeroes,
    BlockStatus,
    Unknown(u16),
}

impl Command {
    pub fn from_wire(t: u16) -> Command {
        match t {
            CMD_READ => Command::Read,
            CMD_WRITE => Command::Write,
            CMD_DISC => Command::Disc,
            CMD_FLUSH => Command::Flush,
            CMD_TRIM => Command::Trim,
            CMD_CACHE => Command::Cache,
            CMD_WRITE_ZEROES => Command::WriteZeroes,
            CMD_BLOCK_STATUS => Command::BlockStatus,
            other => Command::Unknown(other),
        }
    }

    /// Command flags valid for this command in a session (`FUA` is valid on
    /// every command because we always advertise `SEND_FUA`; `DF` only once
    /// structured replies were negotiated).
    pub fn allowed_flags(self, structured: bool) -> u16 {
        match self {
            Command::Read if structured => CMD_FLAG_FUA | CMD_FLAG_DF,
            Command::WriteZeroes => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
            Command::BlockStatus => CMD_FLAG_FUA | CMD_FLAG_REQ_ONE,
            _ => CMD_FLAG_FUA,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Command::Read => "READ",
            Command::Write => "WRITE",
            Command::Disc => "DISC",
            Command::Flush => "FLUSH",
            Command::Trim => "TRIM",
            Command::Cache => "CACHE",
            Command::WriteZeroes => "WRITE_ZEROES",
            Command::BlockStatus => "BLOCK_STATUS",
            Command::Unknown(_) => "UNKNOWN",
        }
    }
}

/// A parsed transmission request header (28 bytes on the wire). This is
/// where an NBD command is parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub command: Command,
    pub handle: u64,
    pub offset: u64,
    pub len: u32,
}

impl Request {
    pub const SIZE: usize = 28;

    /// Parses a request header; `Err(magic)` if the magic is wrong.
    pub fn parse(b: &[u8; Self::SIZE]) -> Result<Request, u32> {
        let magic = be_u32(b, 0);
        if magic != REQUEST_MAGIC {
            return Err(magic);
        }
        Ok(Request {
            flags: be_u16(b, 4),
            command: Command::from_wire(be_u16(b, 6)),
            handle: be_u64(b, 8),
            offset: be_u64(b, 16),
            len: be_u32(b, 24),
        })
    }
}

/// Header of a client option (16 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub magic: u64,
    pub option: u32,
    pub len: u32,
}

impl OptionHeader {
    pub const SIZE: usize = 16;

    pub fn parse(b: &[u8; Self::SIZE]) -> OptionHeader {
        OptionHeader {
            magic: be_u64(b, 0),
            option: be_u32(b, 8),
            len: be_u32(b, 12),
        }
    }
}

fn be_u16(b: &[u8], at: usize) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[at..at + 2]);
    u16::from_be_bytes(a)
}
fn be_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(a)
}
fn be_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

// --------------------------------------------------------- option data

/// Why option data could not be parsed (answered with `NBD_REP_ERR_INVALID`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptParseError(pub String);

/// Bounds-checked big-endian reader over option data.
pub struct WireReader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> WireReader<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        WireReader { data, pos: 0 }
    }
    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }
    pub fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8], OptParseError> {
        if n > self.remaining() {
            return Err(OptParseError(format!(
                "{what}: needs {n} bytes, {} left",
                self.remaining()
            )));
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    pub fn u16(&mut self, what: &str) -> Result<u16, OptParseError> {
        Ok(be_u16(self.bytes(2, what)?, 0))
    }
    pub fn u32(&mut self, what: &str) -> Result<u32, OptParseError> {
        Ok(be_u32(self.bytes(4, what)?, 0))
    }
    /// A length-prefixed (u32) protocol string.
    pub fn string(&mut self, what: &str) -> Result<String, OptParseError> {
        let n = self.u32(what)? as usize;
        if n > MAX_STRING_LEN {
            return Err(OptParseError(format!(
                "{what}: {n} bytes is longer than {MAX_STRING_LEN}"
            )));
        }
        let b = self.bytes(n, what)?;
        parse_string(b, what)
    }
}

/// A protocol string: UTF-8, no NUL, at most 4096 bytes.
pub fn parse_string(b: &[u8], what: &str) -> Result<String, OptParseError> {
    if b.len() > MAX_STRING_LEN {
        return Err(OptParseError(format!(
            "{what}: longer than {MAX_STRING_LEN} bytes"
        )));
    }
    let s = std::str::from_utf8(b).map_err(|_| OptParseError(format!("{what}: not UTF-8")))?;
    if s.contains('\0') {
        return Err(OptParseError(format!("{what}: contains NUL")));
    }
    Ok(s.to_owned())
}

/// Data of `NBD_OPT_INFO` / `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub requests: Vec<u16>,
}

pub fn parse_info_request(data: &[u8]) -> Result<InfoRequest, OptParseError> {
    let mut r = WireReader::new(data);
    let name = r.string("export name")?;
    let n = r.u16("number of information requests")? as usize;
    let mut requests = Vec::with_capacity(n.min(16));
    for _ in 0..n {
        requests.push(r.u16("information request")?);
    }
    if r.remaining() != 0 {
        return Err(OptParseError(format!("{} trailing bytes", r.remaining())));
    }
    Ok(InfoRequest { name, requests })
}

/// Data of `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest {
    pub export: String,
    pub queries: Vec<String>,
}

pub fn parse_meta_context_request(data: &[u8]) -> Result<MetaContextRequest, OptParseError> {
    let mut r = WireReader::new(data);
    let export = r.string("export name")?;
    let n = r.u32("number of queries")? as usize;
    // Each query takes at least 4 bytes: reject absurd counts before allocating.
    if n > r.remaining() / 4 {
        return Err(OptParseError(format!(
            "{n} queries do not fit in the option data"
        )));
    }
    let mut queries = Vec::with_capacity(n);
    for _ in 0..n {
        queries.push(r.string("query")?);
    }
    if r.remaining() != 0 {
        return Err(OptParseError(format!("{} trailing bytes", r.remaining())));
    }
    Ok(MetaContextRequest { export, queries })
}

// -------------------------------------------------------------- encoders

/// Header of an option reply; `len` bytes of data follow.
pub fn opt_reply_header(option: u32, reply_type: u32, len: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..8].copy_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    b[8..12].copy_from_slice(&option.to_be_bytes());
    b[12..16].copy_from_slice(&reply_type.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
    b
}

/// Simple reply header; for a successful simple READ the data follows.
pub fn simple_reply_header(error: u32, handle: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    b
}

/// Structured reply chunk header; `len` bytes of payload follow.
pub fn structured_header(flags: u16, reply_type: u16, handle: u64, len: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&reply_type.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
    b
}

/// Payload of `NBD_INFO_EXPORT` (type, size, transmission flags).
pub fn info_export(size: u64, flags: u16) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[0..2].copy_from_slice(&INFO_EXPORT.to_be_bytes());
    b[2..10].copy_from_slice(&size.to_be_bytes());
    b[10..12].copy_from_slice(&flags.to_be_bytes());
    b
}

/// Payload of `NBD_INFO_BLOCK_SIZE` (type, minimum, preferred, maximum).
pub fn info_block_size(min: u32, preferred: u32, max: u32) -> [u8; 14] {
    let mut b = [0u8; 14];
    b[0..2].copy_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    b[2..6].copy_from_slice(&min.to_be_bytes());
    b[6..10].copy_from_slice(&preferred.to_be_bytes());
    b[10..14].copy_from_slice(&max.to_be_bytes());
    b
}

/// Payload of `NBD_INFO_NAME` / `NBD_INFO_DESCRIPTION`.
pub fn info_string(info_type: u16, s: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(2 + s.len());
    b.extend_from_slice(&info_type.to_be_bytes());
    b.extend_from_slice(s.as_bytes());
    b
}

/// Payload of `NBD_REP_SERVER`: name length, name, description.
pub fn rep_server(name: &str, description: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + name.len() + description.len());
    b.extend_from_slice(&(name.len() as u32).to_be_bytes());
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(description.as_bytes());
    b
}

/// Payload of `NBD_REP_META_CONTEXT`: context id, name.
pub fn rep_meta_context(id: u32, name: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + name.len());
    b.extend_from_slice(&id.to_be_bytes());
    b.extend_from_slice(name.as_bytes());
    b
}

/// Cuts a message to at most `max` bytes on a char boundary.
pub fn truncate_str(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Payload of an error chunk (`NBD_REPLY_TYPE_ERROR`, or `_ERROR_OFFSET`
/// when `offset` is given).
pub fn error_payload(error: u32, message: &str, offset: Option<u64>) -> Vec<u8> {
    let msg = truncate_str(message, MAX_STRING_LEN);
    let mut b = Vec::with_capacity(6 + msg.len() + 8);
    b.extend_from_slice(&error.to_be_bytes());
    b.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    b.extend_from_slice(msg.as_bytes());
    if let Some(o) = offset {
        b.extend_from_slice(&o.to_be_bytes());
    }
    b
}

// ----------------------------------------------------------- meta contexts

/// Namespace of a context name or query (`"base:allocation"` -> `"base"`);
/// `None` without a colon or with an empty namespace.
pub fn namespace_of(s: &str) -> Option<&str> {
    match s.split_once(':') {
        Some((ns, _)) if !ns.is_empty() => Some(ns),
        _ => None,
    }
}

/// Contexts selected by `queries` among `available` (which is in
/// preference order, no duplicates). `list` = `NBD_OPT_LIST_META_CONTEXT`
/// semantics: no query means every context, and a query ending in `:`
/// (e.g. a bare namespace `"base:"`) is a prefix wildcard. For `NBD_OPT_SET_META_CONTEXT` only
/// exact names select, and no query selects nothing. Unknown names are
/// ignored. `Err` when a query lacks a namespace.
pub fn match_meta_contexts(
    available: &[String],
    queries: &[String],
    list: bool,
) -> Result<Vec<String>, OptParseError> {
    if queries.is_empty() {
        return Ok(if list { available.to_vec() } else { Vec::new() });
    }
    let mut out: Vec<String> = Vec::new();
    for q in queries {
        if namespace_of(q).is_none() {
            return Err(OptParseError(format!(
                "query {q:?} does not start with a namespace and a colon"
            )));
        }
        if list && q.ends_with(':') {
            for a in available {
                if a.starts_with(q.as_str()) && !out.contains(a) {
                    out.push(a.clone());
                }
            }
        } else if let Some(a) = available.iter().find(|a| *a == q) {
            if !out.contains(a) {
                out.push(a.clone());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_roundtrip() {
        let mut b = [0u8; 28];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&CMD_FLAG_FUA.to_be_bytes());
        b[6..8].copy_from_slice(&CMD_WRITE.to_be_bytes());
        b[8..16].copy_from_slice(&0xdead_beef_u64.to_be_bytes());
        b[16..24].copy_from_slice(&4096u64.to_be_bytes());
        b[24..28].copy_from_slice(&512u32.to_be_bytes());
        let r = Request::parse(&b).unwrap();
        assert_eq!(
            r,
            Request {
                flags: CMD_FLAG_FUA,
                command: Command::Write,
                handle: 0xdead_beef,
                offset: 4096,
                len: 512
            }
        );
        b[0] = 0;
        assert!(Request::parse(&b).is_err());
    }

    #[test]
    fn info_request_parse() {
        let mut d = Vec::new();
        d.extend_from_slice(&3u32.to_be_bytes());
        d.extend_from_slice(b"vol");
        d.extend_from_slice(&2u16.to_be_bytes());
        d.extend_from_slice(&INFO_NAME.to_be_bytes());
        d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        let r = parse_info_request(&d).unwrap();
        assert_eq!(r.name, "vol");
        assert_eq!(r.requests, vec![INFO_NAME, INFO_BLOCK_SIZE]);
        // Truncated, trailing garbage, name longer than data.
        assert!(parse_info_request(&d[..d.len() - 1]).is_err());
        let mut t = d.clone();
        t.push(0);
        assert!(parse_info_request(&t).is_err());
        let mut big = d.clone();
        big[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_info_request(&big).is_err());
        assert!(parse_info_request(&[]).is_err());
    }

    #[test]
    fn meta_request_parse() {
        let mut d = Vec::new();
        d.extend_from_slice(&0u32.to_be_bytes());
        d.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_meta_context_request(&d).is_err());
        let mut d = Vec::new();
        d.extend_from_slice(&1u32.to_be_bytes());
        d.extend_from_slice(b"x");
        d.extend_from_slice(&1u32.to_be_bytes());
        d.extend_from_slice(&5u32.to_be_bytes());
        d.extend_from_slice(b"base:");
        let r = parse_meta_context_request(&d).unwrap();
        assert_eq!(
            r,
            MetaContextRequest {
                export: "x".into(),
                queries: vec!["base:".into()]
            }
        );
    }

    #[test]
    fn meta_matching() {
        let avail = vec![
            BASE_ALLOCATION.to_string(),
            "cistern:changed:s1".to_string(),
        ];
        let q = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(match_meta_contexts(&avail, &[], true).unwrap(), avail);
        assert!(match_meta_contexts(&avail, &[], false).unwrap().is_empty());
        assert_eq!(
            match_meta_contexts(&avail, &q(&["base:"]), true).unwrap(),
            q(&[BASE_ALLOCATION])
        );
        assert!(match_meta_contexts(&avail, &q(&["base:"]), false)
            .unwrap()
            .is_empty());
        assert_eq!(
            match_meta_contexts(&avail, &q(&["cistern:"]), true).unwrap(),
            q(&["cistern:changed:s1"])
        );
        assert_eq!(
            match_meta_contexts(
                &avail,
                &q(&["base:allocation", "base:allocation", "qemu:dirty-bitmap:x"]),
                false
            )
            .unwrap(),
            q(&[BASE_ALLOCATION])
        );
        assert!(match_meta_contexts(&avail, &q(&["nocolon"]), true).is_err());
    }

    #[test]
    fn block_size_sanitized() {
        assert_eq!(sanitize_preferred_block_size(0), 512);
        assert_eq!(sanitize_preferred_block_size(4096), 4096);
        assert_eq!(sanitize_preferred_block_size(6000), 4096);
        assert_eq!(sanitize_preferred_block_size(u32::MAX), MAX_PAYLOAD);
        assert_eq!(sanitize_preferred_block_size(128 * 1024), 128 * 1024);
    }

    #[test]
    fn flags() {
        let rw = transmission_flags(false, true);
        assert_ne!(rw & FLAG_SEND_DF, 0);
        assert_eq!(rw & FLAG_READ_ONLY, 0);
        let ro = transmission_flags(true, false);
        assert_ne!(ro & FLAG_READ_ONLY, 0);
        assert_eq!(
            ro & (FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO | FLAG_SEND_DF),
            0
        );
    }

    #[test]
    fn error_payload_truncates() {
        let long = "é".repeat(5000);
        let p = error_payload(EIO, &long, Some(7));
        let mlen = u16::from_be_bytes([p[4], p[5]]) as usize;
        assert!(mlen <= MAX_STRING_LEN);
        assert_eq!(p.len(), 6 + mlen + 8);
    }
}

//! A small blocking NBD client: fixed newstyle handshake, `NBD_OPT_GO`
//! (falling back to `NBD_OPT_EXPORT_NAME` for servers without it), simple
//! replies only (structured replies are never requested), and the
//! `READ`, `WRITE` (with `FUA`), `FLUSH` and `DISC` commands. One request in
//! flight at a time; one client per connection (per worker).
//!
//! Reference: NetworkBlockDevice/nbd `doc/proto.md`.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
const FLAG_NO_ZEROES: u16 = 1 << 1;
const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
const FLAG_C_NO_ZEROES: u32 = 1 << 1;

const OPT_EXPORT_NAME: u32 = 1;
const OPT_GO: u32 = 7;

const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const REP_FLAG_ERROR: u32 = 1 << 31;
const REP_ERR_UNSUP: u32 = REP_FLAG_ERROR | 1;

const INFO_EXPORT: u16 = 0;
const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flags from the server.
pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;

const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
const CMD_FLUSH: u16 = 3;
const CMD_FLAG_FUA: u16 = 1 << 0;

/// Largest option reply payload we accept (guards against a bad server).
const MAX_OPTION_REPLY: u32 = 1 << 20;
/// Largest single request we send.
pub const MAX_REQUEST: usize = 32 << 20;

/// What went wrong talking to an NBD server.
#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    #[error("NBD I/O: {0}")]
    Io(io::Error),
    #[error(
        "NBD: no answer within the timeout (does the server accept this many connections? \
         qemu-nbd needs --shared=N for N workers)"
    )]
    Timeout,
    #[error("NBD protocol: {0}")]
    Protocol(String),
    #[error("NBD server refused option: {0}")]
    Refused(String),
    #[error("NBD server error {errno} ({name}) on {cmd} at offset {offset}")]
    Command {
        cmd: &'static str,
        offset: u64,
        errno: u32,
        name: &'static str,
    },
    #[error("NBD: {0}")]
    Usage(String),
}

impl From<io::Error> for NbdError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => NbdError::Timeout,
            _ => NbdError::Io(e),
        }
    }
}

fn errno_name(e: u32) -> &'static str {
    match e {
        1 => "EPERM",
        5 => "EIO",
        12 => "ENOMEM",
        22 => "EINVAL",
        28 => "ENOSPC",
        75 => "EOVERFLOW",
        95 => "ENOTSUP",
        108 => "ESHUTDOWN",
        _ => "unknown",
    }
}

fn option_error_name(t: u32) -> &'static str {
    match t {
        x if x == REP_ERR_UNSUP => "unsupported option",
        x if x == REP_FLAG_ERROR | 2 => "policy",
        x if x == REP_FLAG_ERROR | 3 => "invalid",
        x if x == REP_FLAG_ERROR | 4 => "platform",
        x if x == REP_FLAG_ERROR | 5 => "TLS required",
        x if x == REP_FLAG_ERROR | 6 => "unknown export",
        x if x == REP_FLAG_ERROR | 7 => "shutting down",
        x if x == REP_FLAG_ERROR | 8 => "block size required",
        x if x == REP_FLAG_ERROR | 9 => "too big",
        _ => "error",
    }
}

/// Where an NBD export is: `nbd://host[:port][/export]` or
/// `nbd+unix:///export?socket=/path/to.sock`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdUri {
    pub addr: NbdAddr,
    pub export: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NbdAddr {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

fn percent_decode(s: &str) -> Result<String, NbdError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| NbdError::Usage(format!("bad %-escape in {s:?}")))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| NbdError::Usage(format!("{s:?} is not UTF-8")))
}

impl NbdUri {
    pub fn parse(s: &str) -> Result<Self, NbdError> {
        if let Some(rest) = s.strip_prefix("nbd+unix://") {
            let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
            let export = percent_decode(path.trim_start_matches('/'))?;
            let socket = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("socket="))
                .ok_or_else(|| NbdError::Usage(format!("{s}: nbd+unix needs ?socket=PATH")))?;
            return Ok(Self {
                addr: NbdAddr::Unix(PathBuf::from(percent_decode(socket)?)),
                export,
            });
        }
        let rest = s
            .strip_prefix("nbd://")
            .ok_or_else(|| NbdError::Usage(format!("{s}: expected nbd://host[:port]/export")))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let (host, port) = if let Some(r) = authority.strip_prefix('[') {
            let (h, after) = r
                .split_once(']')
                .ok_or_else(|| NbdError::Usage(format!("{s}: unclosed '['")))?;
            let port = match after.strip_prefix(':') {
                Some(p) => Some(p),
                None if after.is_empty() => None,
                None => return Err(NbdError::Usage(format!("{s}: bad authority"))),
            };
            (h.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (authority.to_string(), None),
            }
        };
        if host.is_empty() {
            return Err(NbdError::Usage(format!("{s}: missing host")));
        }
        let port = match port {
            Some(p) => p
                .parse()
                .map_err(|_| NbdError::Usage(format!("{s}: bad port {p:?}")))?,
            None => 10809,
        };
        Ok(Self {
            addr: NbdAddr::Tcp { host, port },
            export: percent_decode(path.split('?').next().unwrap_or(""))?,
        })
    }
}

impl std::fmt::Display for NbdUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.addr {
            NbdAddr::Tcp { host, port } if host.contains(':') => {
                write!(f, "nbd://[{host}]:{port}/{}", self.export)
            }
            NbdAddr::Tcp { host, port } => write!(f, "nbd://{host}:{port}/{}", self.export),
            NbdAddr::Unix(p) => write!(f, "nbd+unix:///{}?socket={}", self.export, p.display()),
        }
    }
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
        }
    }
}

fn read_u16(r: &mut impl Read) -> io::Result<u16> {
    let mut b = [0; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}
fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}
fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

/// One connection to one export, in the transmission phase.
pub struct NbdClient {
    stream: Stream,
    size: u64,
    flags: u16,
    /// Minimum and preferred block size, if the server said.
    pub block_size: Option<(u32, u32)>,
    next_cookie: u64,
    disconnected: bool,
    /// A request failed mid-way: the stream is out of step, refuse further use.
    poisoned: bool,
}

impl std::fmt::Debug for NbdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdClient")
            .field("size", &self.size)
            .field("flags", &self.flags)
            .finish()
    }
}

impl NbdClient {
    /// Connects and negotiates; `timeout` bounds every socket read and write.
    pub fn connect(uri: &NbdUri, timeout: Duration) -> Result<Self, NbdError> {
        let stream = match &uri.addr {
            NbdAddr::Tcp { host, port } => {
                use std::net::ToSocketAddrs;
                let mut last = None;
                let mut ok = None;
                for a in (host.as_str(), *port).to_socket_addrs()? {
                    match TcpStream::connect_timeout(&a, timeout) {
                        Ok(s) => {
                            ok = Some(s);
                            break;
                        }
                        Err(e) => last = Some(e),
                    }
                }
                let s = match (ok, last) {
                    (Some(s), _) => s,
                    (None, Some(e)) => return Err(e.into()),
                    (None, None) => {
                        return Err(NbdError::Usage(format!("{host}: no address")));
                    }
                };
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))?;
                Stream::Tcp(s)
            }
            NbdAddr::Unix(p) => {
                let s = UnixStream::connect(p)?;
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))?;
                Stream::Unix(s)
            }
        };
        Self::handshake(stream, &uri.export)
    }

    fn handshake(mut s: Stream, export: &str) -> Result<Self, NbdError> {
        if read_u64(&mut s)? != NBDMAGIC {
            return Err(NbdError::Protocol("bad server magic".into()));
        }
        let m = read_u64(&mut s)?;
        if m != IHAVEOPT {
            return Err(NbdError::Protocol(format!(
                "not a newstyle server (magic {m:#x}); oldstyle is not supported"
            )));
        }
        let hs = read_u16(&mut s)?;
        if hs & FLAG_FIXED_NEWSTYLE == 0 {
            return Err(NbdError::Protocol("server is not fixed newstyle".into()));
        }
        let no_zeroes = hs & FLAG_NO_ZEROES != 0;
        let mut cflags = FLAG_C_FIXED_NEWSTYLE;
        if no_zeroes {
            cflags |= FLAG_C_NO_ZEROES;
        }
        s.write_all(&cflags.to_be_bytes())?;
        if export.len() > 4096 {
            return Err(NbdError::Usage("export name longer than 4096 bytes".into()));
        }

        // NBD_OPT_GO: name, and ask for NBD_INFO_BLOCK_SIZE.
        let mut data = Vec::new();
        data.extend_from_slice(&(export.len() as u32).to_be_bytes());
        data.extend_from_slice(export.as_bytes());
        data.extend_from_slice(&1u16.to_be_bytes());
        data.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        send_option(&mut s, OPT_GO, &data)?;
        let mut size_flags: Option<(u64, u16)> = None;
        let mut block_size = None;
        loop {
            let (opt, typ, payload) = read_option_reply(&mut s)?;
            if opt != OPT_GO {
                return Err(NbdError::Protocol(format!(
                    "reply to option {opt}, expected GO"
                )));
            }
            match typ {
                REP_ACK => break,
                REP_INFO => {
                    if payload.len() < 2 {
                        return Err(NbdError::Protocol("short NBD_REP_INFO".into()));
                    }
                    let it = u16::from_be_bytes([payload[0], payload[1]]);
                    match it {
                        INFO_EXPORT if payload.len() >= 12 => {
                            let size =
                                u64::from_be_bytes(payload[2..10].try_into().unwrap_or([0; 8]));
                            let fl = u16::from_be_bytes([payload[10], payload[11]]);
                            size_flags = Some((size, fl));
                        }
                        INFO_BLOCK_SIZE if payload.len() >= 14 => {
                            let min =
                                u32::from_be_bytes(payload[2..6].try_into().unwrap_or([0; 4]));
                            let pref =
                                u32::from_be_bytes(payload[6..10].try_into().unwrap_or([0; 4]));
                            block_size = Some((min, pref));
                        }
                        INFO_EXPORT | INFO_BLOCK_SIZE => {
                            return Err(NbdError::Protocol(format!("short info {it}")));
                        }
                        _ => {} // other infos: ignore
                    }
                }
                REP_ERR_UNSUP => {
                    // Old server: NBD_OPT_EXPORT_NAME ends the haggling.
                    send_option(&mut s, OPT_EXPORT_NAME, export.as_bytes())?;
                    let size = read_u64(&mut s)?;
                    let fl = read_u16(&mut s)?;
                    if !no_zeroes {
                        let mut z = [0u8; 124];
                        s.read_exact(&mut z)?;
                    }
                    size_flags = Some((size, fl));
                    break;
                }
                t if t & REP_FLAG_ERROR != 0 => {
                    let msg = String::from_utf8_lossy(&payload).into_owned();
                    return Err(NbdError::Refused(format!(
                        "export {export:?}: {}{}{}",
                        option_error_name(t),
                        if msg.is_empty() { "" } else { ": " },
                        msg
                    )));
                }
                t => {
                    return Err(NbdError::Protocol(format!(
                        "unexpected option reply type {t}"
                    )));
                }
            }
        }
        let (size, flags) = size_flags.ok_or_else(|| {
            NbdError::Protocol("server sent no NBD_INFO_EXPORT before ACK".into())
        })?;
        Ok(Self {
            stream: s,
            size,
            flags,
            block_size,
            next_cookie: 1,
            disconnected: false,
            poisoned: false,
        })
    }

    pub fn size(&self) -> u64 {
        self.size
    }
    pub fn flags(&self) -> u16 {
        self.flags
    }
    pub fn read_only(&self) -> bool {
        self.flags & TFLAG_READ_ONLY != 0
    }
    pub fn can_flush(&self) -> bool {
        self.flags & TFLAG_SEND_FLUSH != 0
    }
    pub fn can_fua(&self) -> bool {
        self.flags & TFLAG_SEND_FUA != 0
    }

    fn check_range(&self, what: &str, offset: u64, len: usize) -> Result<(), NbdError> {
        if self.disconnected || self.poisoned {
            return Err(NbdError::Usage("connection no longer usable".into()));
        }
        if len > MAX_REQUEST {
            return Err(NbdError::Usage(format!(
                "{what} of {len} bytes is too large"
            )));
        }
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(NbdError::Usage(format!(
                "{what} at {offset}+{len} is past the end of the export ({} bytes)",
                self.size
            ))),
        }
    }

    fn send(
        &mut self,
        cmd: u16,
        flags: u16,
        offset: u64,
        len: u32,
        data: &[u8],
    ) -> Result<u64, NbdError> {
        let cookie = self.next_cookie;
        self.next_cookie = self.next_cookie.wrapping_add(1);
        let mut req = Vec::with_capacity(28 + data.len());
        req.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        req.extend_from_slice(&flags.to_be_bytes());
        req.extend_from_slice(&cmd.to_be_bytes());
        req.extend_from_slice(&cookie.to_be_bytes());
        req.extend_from_slice(&offset.to_be_bytes());
        req.extend_from_slice(&len.to_be_bytes());
        req.extend_from_slice(data);
        self.poisoned = true;
        self.stream.write_all(&req)?;
        Ok(cookie)
    }

    /// Reads a simple reply header; returns the server's error value.
    fn reply(&mut self, cookie: u64) -> Result<u32, NbdError> {
        let magic = read_u32(&mut self.stream)?;
        if magic == STRUCTURED_REPLY_MAGIC {
            return Err(NbdError::Protocol(
                "structured reply although none was negotiated".into(),
            ));
        }
        if magic != SIMPLE_REPLY_MAGIC {
            return Err(NbdError::Protocol(format!("bad reply magic {magic:#x}")));
        }
        let err = read_u32(&mut self.stream)?;
        let c = read_u64(&mut self.stream)?;
        if c != cookie {
            return Err(NbdError::Protocol(format!(
                "reply cookie {c}, expected {cookie}"
            )));
        }
        Ok(err)
    }

    fn cmd_error(cmd: &'static str, offset: u64, errno: u32) -> NbdError {
        NbdError::Command {
            cmd,
            offset,
            errno,
            name: errno_name(errno),
        }
    }

    /// Reads `buf.len()` bytes at `offset`.
    pub fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), NbdError> {
        self.check_range("read", offset, buf.len())?;
        let cookie = self.send(CMD_READ, 0, offset, buf.len() as u32, &[])?;
        let err = self.reply(cookie)?;
        if err != 0 {
            // Simple replies carry no data on error.
            self.poisoned = false;
            return Err(Self::cmd_error("read", offset, err));
        }
        self.stream.read_exact(buf)?;
        self.poisoned = false;
        Ok(())
    }

    /// Writes `data` at `offset`; with `fua` the server makes it durable before replying.
    pub fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<(), NbdError> {
        self.check_range("write", offset, data.len())?;
        if self.read_only() {
            return Err(NbdError::Usage("export is read-only".into()));
        }
        if fua && !self.can_fua() {
            return Err(NbdError::Usage("server does not support FUA".into()));
        }
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        let cookie = self.send(CMD_WRITE, flags, offset, data.len() as u32, data)?;
        let err = self.reply(cookie)?;
        self.poisoned = false;
        if err != 0 {
            return Err(Self::cmd_error("write", offset, err));
        }
        Ok(())
    }

    /// Makes every completed write durable.
    pub fn flush(&mut self) -> Result<(), NbdError> {
        if self.disconnected || self.poisoned {
            return Err(NbdError::Usage("connection no longer usable".into()));
        }
        if !self.can_flush() {
            return Err(NbdError::Usage("server does not support FLUSH".into()));
        }
        let cookie = self.send(CMD_FLUSH, 0, 0, 0, &[])?;
        let err = self.reply(cookie)?;
        self.poisoned = false;
        if err != 0 {
            return Err(Self::cmd_error("flush", 0, err));
        }
        Ok(())
    }

    /// Sends NBD_CMD_DISC (no reply) and closes the connection.
    pub fn disconnect(mut self) -> Result<(), NbdError> {
        self.disc()
    }

    fn disc(&mut self) -> Result<(), NbdError> {
        if self.disconnected {
            return Ok(());
        }
        self.disconnected = true;
        if self.poisoned {
            return Ok(());
        }
        self.send(CMD_DISC, 0, 0, 0, &[])?;
        self.stream.flush()?;
        Ok(())
    }
}

impl Drop for NbdClient {
    fn drop(&mut self) {
        let _ = self.disc();
    }
}

fn send_option(s: &mut Stream, opt: u32, data: &[u8]) -> Result<(), NbdError> {
    let mut m = Vec::with_capacity(16 + data.len());
    m.extend_from_slice(&IHAVEOPT.to_be_bytes());
    m.extend_from_slice(&opt.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    s.write_all(&m)?;
    Ok(())
}

fn read_option_reply(s: &mut Stream) -> Result<(u32, u32, Vec<u8>), NbdError> {
    let magic = read_u64(s)?;
    if magic != OPT_REPLY_MAGIC {
        return Err(NbdError::Protocol(format!(
            "bad option reply magic {magic:#x}"
        )));
    }
    let opt = read_u32(s)?;
    let typ = read_u32(s)?;
    let len = read_u32(s)?;
    if len > MAX_OPTION_REPLY {
        return Err(NbdError::Protocol(format!("option reply of {len} bytes")));
    }
    let mut payload = vec![0; len as usize];
    s.read_exact(&mut payload)?;
    Ok((opt, typ, payload))
}

/// A minimal in-memory NBD server for tests (simple replies only, OPT_GO
/// only, FLUSH and FUA advertised). Not part of the product.
#[cfg(test)]
pub(crate) mod mock {
    use super::*;
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};
    use std::thread;

    pub struct MockServer {
        pub port: u16,
        pub data: Arc<Mutex<Vec<u8>>>,
        pub export: String,
        pub requests: Arc<Mutex<Vec<(u16, u16)>>>,
    }

    impl MockServer {
        /// Serves one export of `size` bytes on 127.0.0.1, one thread per
        /// connection, until the process exits.
        pub fn start(export: &str, size: usize) -> io::Result<Self> {
            Self::start_with(export, size, true)
        }

        /// `go`: false makes the server answer NBD_OPT_GO with ERR_UNSUP
        /// (an old server that only knows NBD_OPT_EXPORT_NAME).
        pub fn start_with(export: &str, size: usize, go: bool) -> io::Result<Self> {
            let l = TcpListener::bind("127.0.0.1:0")?;
            let port = l.local_addr()?.port();
            let data = Arc::new(Mutex::new(vec![0u8; size]));
            let requests = Arc::new(Mutex::new(Vec::new()));
            let (d, r, name) = (data.clone(), requests.clone(), export.to_string());
            thread::spawn(move || {
                for conn in l.incoming().flatten() {
                    let (d, r, name) = (d.clone(), r.clone(), name.clone());
                    thread::spawn(move || {
                        let _ = serve(conn, &d, &r, &name, go);
                    });
                }
            });
            Ok(Self {
                port,
                data,
                export: export.to_string(),
                requests,
            })
        }
        pub fn uri(&self) -> String {
            format!("nbd://127.0.0.1:{}/{}", self.port, self.export)
        }
    }

    fn opt_reply(s: &mut TcpStream, opt: u32, typ: u32, data: &[u8]) -> io::Result<()> {
        let mut m = Vec::new();
        m.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
        m.extend_from_slice(&opt.to_be_bytes());
        m.extend_from_slice(&typ.to_be_bytes());
        m.extend_from_slice(&(data.len() as u32).to_be_bytes());
        m.extend_from_slice(data);
        s.write_all(&m)
    }

    fn serve(
        mut s: TcpStream,
        data: &Mutex<Vec<u8>>,
        log: &Mutex<Vec<(u16, u16)>>,
        name: &str,
        go: bool,
    ) -> io::Result<()> {
        s.set_nodelay(true)?;
        s.write_all(&NBDMAGIC.to_be_bytes())?;
        s.write_all(&IHAVEOPT.to_be_bytes())?;
        s.write_all(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes())?;
        let _cflags = read_u32(&mut s)?;
        loop {
            if read_u64(&mut s)? != IHAVEOPT {
                return Ok(());
            }
            let opt = read_u32(&mut s)?;
            let len = read_u32(&mut s)?;
            let mut p = vec![0; len as usize];
            s.read_exact(&mut p)?;
            let size = data.lock().map(|d| d.len()).unwrap_or(0) as u64;
            let fl = TFLAG_HAS_FLAGS | TFLAG_SEND_FLUSH | TFLAG_SEND_FUA;
            if opt == OPT_EXPORT_NAME {
                if p != name.as_bytes() {
                    return Ok(()); // the protocol's only answer: hang up
                }
                s.write_all(&size.to_be_bytes())?;
                s.write_all(&fl.to_be_bytes())?; // NO_ZEROES was negotiated
                break;
            }
            if opt != OPT_GO || !go {
                opt_reply(&mut s, opt, REP_ERR_UNSUP, &[])?;
                continue;
            }
            let nlen = u32::from_be_bytes(p[0..4].try_into().unwrap_or([0; 4])) as usize;
            let req = String::from_utf8_lossy(&p[4..4 + nlen]).into_owned();
            if req != name {
                opt_reply(&mut s, opt, REP_FLAG_ERROR | 6, b"no such export")?;
                continue;
            }
            let mut info = Vec::new();
            info.extend_from_slice(&INFO_EXPORT.to_be_bytes());
            info.extend_from_slice(&size.to_be_bytes());
            info.extend_from_slice(&fl.to_be_bytes());
            opt_reply(&mut s, opt, REP_INFO, &info)?;
            opt_reply(&mut s, opt, REP_ACK, &[])?;
            break;
        }
        loop {
            if read_u32(&mut s)? != REQUEST_MAGIC {
                return Ok(());
            }
            let flags = read_u16(&mut s)?;
            let cmd = read_u16(&mut s)?;
            let cookie = read_u64(&mut s)?;
            let off = read_u64(&mut s)? as usize;
            let len = read_u32(&mut s)? as usize;
            if let Ok(mut l) = log.lock() {
                l.push((cmd, flags));
            }
            let mut hdr = Vec::new();
            hdr.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
            match cmd {
                CMD_READ => {
                    let d = data.lock().map_err(|_| io::Error::other("poisoned"))?;
                    hdr.extend_from_slice(&0u32.to_be_bytes());
                    hdr.extend_from_slice(&cookie.to_be_bytes());
                    hdr.extend_from_slice(&d[off..off + len]);
                }
                CMD_WRITE => {
                    let mut buf = vec![0; len];
                    s.read_exact(&mut buf)?;
                    let mut d = data.lock().map_err(|_| io::Error::other("poisoned"))?;
                    d[off..off + len].copy_from_slice(&buf);
                    hdr.extend_from_slice(&0u32.to_be_bytes());
                    hdr.extend_from_slice(&cookie.to_be_bytes());
                }
                CMD_FLUSH => {
                    hdr.extend_from_slice(&0u32.to_be_bytes());
                    hdr.extend_from_slice(&cookie.to_be_bytes());
                }
                CMD_DISC => return Ok(()),
                _ => {
                    hdr.extend_from_slice(&22u32.to_be_bytes());
                    hdr.extend_from_slice(&cookie.to_be_bytes());
                }
            }
            s.write_all(&hdr)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_uris() {
        let u = NbdUri::parse("nbd://localhost:10810/vol1").unwrap();
        assert_eq!(
            u.addr,
            NbdAddr::Tcp {
                host: "localhost".into(),
                port: 10810
            }
        );
        assert_eq!(u.export, "vol1");
        let u = NbdUri::parse("nbd://[::1]/a%2Fb").unwrap();
        assert_eq!(
            u.addr,
            NbdAddr::Tcp {
                host: "::1".into(),
                port: 10809
            }
        );
        assert_eq!(u.export, "a/b");
        assert_eq!(u.to_string(), "nbd://[::1]:10809/a/b");
        let u = NbdUri::parse("nbd+unix:///v?socket=/tmp/s.sock").unwrap();
        assert_eq!(u.addr, NbdAddr::Unix("/tmp/s.sock".into()));
        assert_eq!(NbdUri::parse("nbd://h").unwrap().export, "");
        assert!(NbdUri::parse("nbd://:1/x").is_err());
        assert!(NbdUri::parse("nbd://h:port/x").is_err());
        assert!(NbdUri::parse("http://h/x").is_err());
    }

    #[test]
    fn talks_to_mock_server() {
        let srv = mock::MockServer::start("vol", 1 << 20).unwrap();
        let uri = NbdUri::parse(&srv.uri()).unwrap();
        let mut c = NbdClient::connect(&uri, Duration::from_secs(5)).unwrap();
        assert_eq!(c.size(), 1 << 20);
        assert!(c.can_fua() && c.can_flush() && !c.read_only());
        let data: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        c.write(8192, &data, true).unwrap();
        let mut back = vec![0; 4096];
        c.read(8192, &mut back).unwrap();
        assert_eq!(back, data);
        c.flush().unwrap();
        assert!(c.read((1 << 20) - 10, &mut back).is_err(), "past the end");
        c.disconnect().unwrap();
        let log = srv.requests.lock().unwrap().clone();
        assert!(log.contains(&(CMD_WRITE, CMD_FLAG_FUA)));
        assert!(log.contains(&(CMD_FLUSH, 0)));

        let bad = NbdUri::parse(&format!("nbd://127.0.0.1:{}/nope", srv.port)).unwrap();
        let e = NbdClient::connect(&bad, Duration::from_secs(5)).unwrap_err();
        assert!(e.to_string().contains("unknown export"), "{e}");
    }

    #[test]
    fn falls_back_to_export_name() {
        let srv = mock::MockServer::start_with("old", 64 << 10, false).unwrap();
        let uri = NbdUri::parse(&srv.uri()).unwrap();
        let mut c = NbdClient::connect(&uri, Duration::from_secs(5)).unwrap();
        assert_eq!(c.size(), 64 << 10);
        c.write(0, &[5u8; 512], true).unwrap();
        let mut b = [0u8; 512];
        c.read(0, &mut b).unwrap();
        assert_eq!(b, [5u8; 512]);
    }

    #[test]
    fn silent_server_times_out_with_a_hint() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let uri = NbdUri::parse(&format!(
            "nbd://127.0.0.1:{}/x",
            l.local_addr().unwrap().port()
        ))
        .unwrap();
        let e = NbdClient::connect(&uri, Duration::from_millis(200)).unwrap_err();
        assert!(matches!(e, NbdError::Timeout), "{e}");
        assert!(e.to_string().contains("--shared"));
        drop(l);
    }
}

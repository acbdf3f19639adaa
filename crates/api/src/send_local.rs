//! Send and receive through a daemon on the same host without relaying the
//! stream (issue 14). `zfs send` writes its stream into its standard output
//! from the kernel; a Cistern CLI instead read the daemon's HTTP body and
//! copied it to standard output (and `receive` copied standard input into
//! an HTTP body): four copies and two busy processes more per stream.
//!
//! Here the CLI hands its standard output (send) or input (receive) to the
//! daemon over a Unix socket (`SCM_RIGHTS`) and waits for the answer; the
//! daemon's engine writes into / reads from that pipe or file itself.
//!
//! The socket is `STATE_DIR/run/stream.sock` (the directory 0700, the
//! socket 0600) and takes the API token like HTTP does. The CLI only tries
//! it for a daemon at a loopback URL that names the socket at
//! `GET /v1/send/local`, and checks the daemon's instance id the socket
//! greets it with before it sends its token; anything else (a remote
//! daemon, an older one, another user's) goes over HTTP as before, which
//! stays the path of replication and of remote CLIs.
//!
//! Wire (one JSON line each): daemon `{"id"}`; CLI [`LocalRequest`] with the
//! descriptor attached; daemon [`LocalReply`]. The CLI sends nothing more:
//! the socket becoming readable (its end closed: the CLI was killed) ends
//! the transfer as a dropped HTTP connection does, and a peer that moves
//! no bytes for `CISTERN_STREAM_STALL_SECS` fails it the same way.

use crate::client::{Client, ClientError, Result};
use crate::server::ApiState;
use dataset::{Caller, ReceiveOptions, ReceiveSummary, SendOptions};
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::{Deserialize, Serialize};
use std::io::{self, BufRead, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// `GET /v1/send/local`: where this daemon takes local transfers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LocalInfo {
    pub socket: PathBuf,
    /// Random per daemon start: the socket greets with it, so a CLI never
    /// hands its token or stream to another daemon's socket.
    pub id: String,
}

/// What the CLI asks for (one of `send`, `receive`).
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LocalRequest {
    pub token: Option<String>,
    pub caller: Option<Caller>,
    pub send: Option<SendOptions>,
    pub receive: Option<ReceiveOptions>,
}

/// The daemon's answer: `bytes` sent, or what was received, or an error as
/// HTTP would have answered it.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LocalReply {
    pub bytes: Option<u64>,
    pub received: Option<ReceiveSummary>,
    pub error: Option<LocalError>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct LocalError {
    pub status: u16,
    pub kind: String,
    pub error: String,
}

static LOCAL: OnceLock<LocalInfo> = OnceLock::new();

/// Where this daemon listens for local transfers (None: it does not).
pub fn info() -> Option<&'static LocalInfo> {
    LOCAL.get()
}

/// Local transfers at once; more are refused (the CLI then says so).
const MAX_TRANSFERS: usize = 16;
/// A request line is a few hundred bytes.
const MAX_LINE: usize = 64 << 10;
/// Reads of a local stream (as the CLI's relay did).
const READ_BUF: usize = 1 << 20;

/// The socket's path: under the state directory, or when that is longer
/// than a Unix socket address holds, in the runtime directory.
fn socket_path(state_dir: &Path) -> Option<PathBuf> {
    let p = state_dir.join("run").join("stream.sock");
    if p.as_os_str().len() < 100 {
        return Some(p);
    }
    let tag = blake3::hash(state_dir.as_os_str().as_encoded_bytes()).to_hex();
    let p = crate::auth::runtime_dir()?.join(format!("stream-{}.sock", &tag[..16]));
    (p.as_os_str().len() < 100).then_some(p)
}

/// Starts taking local transfers for `state` (the daemon calls this once,
/// inside its runtime). A failure only leaves the CLIs on HTTP.
pub fn listen(state_dir: &Path, state: ApiState) -> io::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let path =
        socket_path(state_dir).ok_or_else(|| io::Error::other("no socket path short enough"))?;
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    // A socket left by a killed daemon (the state directory is this
    // daemon's alone: the pool lock keeps a second one out).
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = tokio::net::UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let seed = format!(
        "{}:{:?}:{}",
        std::process::id(),
        std::time::SystemTime::now(),
        state_dir.display()
    );
    let id = blake3::hash(seed.as_bytes()).to_hex()[..32].to_string();
    let _ = LOCAL.set(LocalInfo {
        socket: path.clone(),
        id: id.clone(),
    });
    let running = std::sync::Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        loop {
            let conn = match listener.accept().await {
                Ok((c, _)) => c,
                Err(e) => {
                    tracing::warn!("local stream socket: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let conn = match conn.into_std().and_then(|c| {
                c.set_nonblocking(false)?;
                Ok(c)
            }) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("local stream socket: {e}");
                    continue;
                }
            };
            let (st, id, running) = (state.clone(), id.clone(), running.clone());
            tokio::task::spawn_blocking(move || {
                let n = running.fetch_add(1, Ordering::SeqCst);
                serve_one(&st, conn, &id, n < MAX_TRANSFERS);
                running.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    Ok(path)
}

fn error_reply(status: u16, kind: &str, error: impl Into<String>) -> LocalReply {
    LocalReply {
        error: Some(LocalError {
            status,
            kind: kind.into(),
            error: error.into(),
        }),
        ..Default::default()
    }
}

fn engine_error(e: &dataset::Error) -> LocalReply {
    error_reply(
        crate::server::status_for(e).as_u16(),
        crate::server::kind_for(e),
        e.to_string(),
    )
}

/// `v` as one JSON line, as both sides of the socket speak.
fn json_line<T: Serialize>(v: &T) -> io::Result<Vec<u8>> {
    let mut line = serde_json::to_vec(v).map_err(io::Error::other)?;
    line.push(b'\n');
    Ok(line)
}

fn write_line<T: Serialize>(mut conn: &UnixStream, v: &T) -> io::Result<()> {
    conn.write_all(&json_line(v)?)
}

/// The request line and the descriptors that came with it.
fn read_request(conn: &UnixStream) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut line = Vec::new();
    let mut fds = Vec::new();
    let mut buf = vec![0u8; 4096];
    while !line.contains(&b'\n') {
        if line.len() > MAX_LINE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request too long",
            ));
        }
        let mut space = nix::cmsg_space!([std::os::fd::RawFd; 2]);
        let mut iov = [io::IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(
            conn.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(io::Error::from)?;
        for c in msg.cmsgs().map_err(io::Error::from)? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                for fd in raw {
                    // SAFETY: the kernel just installed this descriptor for us.
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        let n = msg.bytes;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "no request"));
        }
        line.extend_from_slice(&buf[..n]);
    }
    Ok((line, fds))
}

fn serve_one(st: &ApiState, conn: UnixStream, id: &str, admitted: bool) {
    // The greeting and the request are small: a CLI that sends no request
    // within this is not waited for.
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(10)));
    if write_line(&conn, &serde_json::json!({ "id": id })).is_err() {
        return;
    }
    let reply = match read_request(&conn) {
        Err(e) => {
            tracing::debug!("local stream request: {e}");
            return;
        }
        Ok(_) if !admitted => error_reply(
            503,
            "Busy",
            format!("{MAX_TRANSFERS} local transfers are running already"),
        ),
        Ok((line, fds)) => {
            let _ = conn.set_read_timeout(None);
            run(st, &conn, &line, fds)
        }
    };
    if let Err(e) = write_line(&conn, &reply) {
        tracing::debug!("local stream reply: {e}");
    }
}

fn run(st: &ApiState, conn: &UnixStream, line: &[u8], mut fds: Vec<OwnedFd>) -> LocalReply {
    let req: LocalRequest = match serde_json::from_slice(line.trim_ascii_end()) {
        Ok(r) => r,
        Err(e) => return error_reply(400, "BadRequest", format!("bad request: {e}")),
    };
    if let Some(auth) = &st.auth {
        if !req
            .token
            .as_deref()
            .is_some_and(|t| auth.check_token(t.trim()))
        {
            return error_reply(401, "Unauthorized", "the API token was refused");
        }
    }
    if fds.len() != 1 {
        return error_reply(400, "BadRequest", "pass exactly one descriptor");
    }
    let fd = fds.remove(0);
    let ctl = conn.as_fd();
    match (req.send, req.receive) {
        (Some(opts), None) => {
            tracing::info!(snapshot = %opts.snapshot, from = ?opts.from, "send (local)");
            let mut sink = FdSink {
                io: match FdStream::new(fd, ctl) {
                    Ok(io) => io,
                    Err(e) => return error_reply(400, "BadRequest", e.to_string()),
                },
                bytes: 0,
            };
            match st.engine.send_chunks(&opts, &mut sink) {
                Ok(_) => LocalReply {
                    bytes: Some(sink.bytes),
                    ..Default::default()
                },
                Err(e) => {
                    tracing::warn!(snapshot = %opts.snapshot, "send failed: {e}");
                    engine_error(&e)
                }
            }
        }
        (None, Some(opts)) => {
            tracing::info!(target = %opts.target, force = opts.force, resumable = opts.resumable, "receive (local)");
            let io = match FdStream::new(fd, ctl) {
                Ok(io) => io,
                Err(e) => return error_reply(400, "BadRequest", e.to_string()),
            };
            let mut r = io::BufReader::with_capacity(READ_BUF, io);
            let done = st.engine.receive(&opts, &mut r);
            // The stream is given back before the history and hooks run.
            drop(r);
            match done {
                Ok(sum) => {
                    let pool = opts.target.split(['/', '@']).next().unwrap_or("");
                    let caller = req.caller.unwrap_or_else(|| Caller {
                        command: "receive (local)".into(),
                        ..Default::default()
                    });
                    if let Err(e) = st.engine.log_history(pool, &caller) {
                        tracing::debug!(error = %e, "not recorded in a pool history");
                    }
                    for h in &st.change_hooks {
                        h();
                    }
                    LocalReply {
                        received: Some(sum),
                        ..Default::default()
                    }
                }
                Err(e) => engine_error(&e),
            }
        }
        _ => error_reply(400, "BadRequest", "ask for one of send, receive"),
    }
}

/// The CLI's stream descriptor, non-blocking (a pipe or socket) so that
/// every wait also watches the CLI's socket and the stall bound; the
/// flags it came with are put back when done.
struct FdStream<'a> {
    file: std::fs::File,
    ctl: BorrowedFd<'a>,
    flags: Option<OFlag>,
    stall: Duration,
}

impl<'a> FdStream<'a> {
    fn new(fd: OwnedFd, ctl: BorrowedFd<'a>) -> io::Result<Self> {
        let file = std::fs::File::from(fd);
        let meta = file.metadata()?;
        let mut flags = None;
        // A regular file or device never waits on a peer: left blocking.
        if !meta.file_type().is_file() {
            let old = OFlag::from_bits_truncate(fcntl(&file, FcntlArg::F_GETFL)?);
            fcntl(&file, FcntlArg::F_SETFL(old | OFlag::O_NONBLOCK))?;
            flags = Some(old);
        }
        Ok(Self {
            file,
            ctl,
            flags,
            stall: crate::send::stream_stall(),
        })
    }

    /// Whether the CLI went away (its socket is readable: closed).
    fn cli_gone(&self, timeout: PollTimeout) -> io::Result<bool> {
        let mut fds = [PollFd::new(self.ctl, PollFlags::POLLIN)];
        Ok(poll(&mut fds, timeout)? > 0)
    }

    /// Waits until the stream can move (`events`); Err when the CLI went
    /// away or nothing moved for the stall bound.
    fn wait(&self, events: PollFlags, gone: io::ErrorKind, stalled: &str) -> io::Result<()> {
        let ms = self.stall.as_millis().min(i32::MAX as u128) as i32;
        let mut fds = [
            PollFd::new(self.file.as_fd(), events),
            PollFd::new(self.ctl, PollFlags::POLLIN),
        ];
        let n = loop {
            match poll(
                &mut fds,
                PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
            ) {
                Err(nix::errno::Errno::EINTR) => continue,
                r => break r?,
            }
        };
        if fds[1].any().unwrap_or(false) {
            return Err(io::Error::new(gone, "the CLI went away"));
        }
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::TimedOut, stalled.to_string()));
        }
        Ok(())
    }
}

impl Drop for FdStream<'_> {
    fn drop(&mut self) {
        if let Some(old) = self.flags {
            let _ = fcntl(&self.file, FcntlArg::F_SETFL(old));
        }
    }
}

impl Read for FdStream<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            match (&self.file).read(out) {
                Ok(n) => {
                    // A regular file never waits: look for a killed CLI here.
                    if self.flags.is_none() && self.cli_gone(PollTimeout::ZERO)? {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "connection lost: the CLI went away",
                        ));
                    }
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.wait(
                    PollFlags::POLLIN,
                    io::ErrorKind::UnexpectedEof,
                    &format!(
                        "connection stalled: no stream bytes for {} s",
                        self.stall.as_secs_f64()
                    ),
                )?,
                Err(e) => return Err(e),
            }
        }
    }
}

/// The send engine's chunks written straight into the CLI's descriptor.
struct FdSink<'a> {
    io: FdStream<'a>,
    bytes: u64,
}

impl dataset::send::stream::ChunkSink for FdSink<'_> {
    fn put(&mut self, mut buf: Vec<u8>) -> io::Result<Vec<u8>> {
        let s = &self.io;
        if s.flags.is_none() && s.cli_gone(PollTimeout::ZERO)? {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the CLI went away",
            ));
        }
        let mut rest = &buf[..];
        while !rest.is_empty() {
            match (&s.file).write(rest) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => s.wait(
                    PollFlags::POLLOUT,
                    io::ErrorKind::BrokenPipe,
                    &format!("the client read nothing for {} s", s.stall.as_secs_f64()),
                )?,
                Err(e) => return Err(e),
            }
        }
        self.bytes += buf.len() as u64;
        buf.clear();
        Ok(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

// ---- the CLI's side ----

/// Whether `base` names this host (only such a daemon can take our descriptors).
fn is_loopback(base: &str) -> bool {
    let rest = base
        .strip_prefix("http://")
        .or_else(|| base.strip_prefix("https://"))
        .unwrap_or(base);
    let host = rest.split('/').next().unwrap_or("");
    let host = match host.strip_prefix('[') {
        Some(h) => h.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The socket of the daemon behind `client`, greeted and checked; None
/// when there is none to use (then HTTP).
fn connect(client: &Client) -> Option<UnixStream> {
    if std::env::var("CISTERN_SEND_LOCAL").is_ok_and(|v| v == "0" || v == "off")
        || !is_loopback(client.base_url())
    {
        return None;
    }
    let info: LocalInfo = client.get_json("/v1/send/local", &[]).ok()?;
    let conn = UnixStream::connect(&info.socket).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut hello = String::new();
    io::BufReader::new(&conn).read_line(&mut hello).ok()?;
    let hello: serde_json::Value = serde_json::from_str(&hello).ok()?;
    if hello.get("id").and_then(|v| v.as_str()) != Some(info.id.as_str()) {
        return None;
    }
    Some(conn)
}

/// Sends the request with `fd`; None when it could not be sent (nothing
/// was consumed: the caller goes over HTTP).
fn request(conn: &UnixStream, req: &LocalRequest, fd: BorrowedFd) -> Option<()> {
    let line = json_line(req).ok()?;
    let fds = [fd.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let n = sendmsg::<()>(
        conn.as_raw_fd(),
        &[io::IoSlice::new(&line)],
        &cmsg,
        MsgFlags::empty(),
        None,
    )
    .ok()?;
    if n < line.len() {
        (&*conn).write_all(&line[n..]).ok()?;
    }
    Some(())
}

/// Waits for the daemon's answer (as long as the transfer takes).
fn reply(client: &Client, conn: &UnixStream) -> Result<LocalReply> {
    let gone = |why: String| ClientError::Protocol {
        url: client.base_url().to_string(),
        reason: why,
    };
    conn.set_read_timeout(None)
        .map_err(|e| gone(format!("local stream socket: {e}")))?;
    let mut line = String::new();
    io::BufReader::new(conn)
        .read_line(&mut line)
        .map_err(|e| gone(format!("local stream socket: {e}")))?;
    if line.is_empty() {
        return Err(gone("the daemon went away during the transfer".into()));
    }
    let r: LocalReply =
        serde_json::from_str(&line).map_err(|e| gone(format!("local stream answer: {e}")))?;
    match r.error {
        Some(e) => Err(ClientError::Api {
            status: e.status,
            kind: e.kind,
            message: e.error,
        }),
        None => Ok(r),
    }
}

fn ask(client: &Client, fd: BorrowedFd, mut req: LocalRequest) -> Option<Result<LocalReply>> {
    let conn = connect(client)?;
    let (token, caller) = client.credentials();
    req.token = token.map(str::to_string);
    req.caller = caller.cloned();
    request(&conn, &req, fd)?;
    Some(reply(client, &conn))
}

/// `cistern send` through a daemon on this host: it writes the stream into
/// `out` itself. None: no local daemon to ask (use HTTP).
pub fn send(client: &Client, opts: &SendOptions, out: BorrowedFd) -> Option<Result<u64>> {
    let req = LocalRequest {
        send: Some(opts.clone()),
        ..Default::default()
    };
    Some(ask(client, out, req)?.map(|r| r.bytes.unwrap_or(0)))
}

/// `cistern receive` through a daemon on this host: it reads the stream
/// from `inp` itself. None: no local daemon to ask (use HTTP).
pub fn receive(
    client: &Client,
    opts: &ReceiveOptions,
    inp: BorrowedFd,
) -> Option<Result<ReceiveSummary>> {
    let req = LocalRequest {
        receive: Some(opts.clone()),
        ..Default::default()
    };
    Some(ask(client, inp, req)?.map(|r| r.received.unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_daemons_are_local() {
        for b in [
            "http://127.0.0.1:10810",
            "https://localhost:1",
            "http://[::1]:5",
            "127.0.0.2:80",
        ] {
            assert!(is_loopback(b), "{b}");
        }
        for b in [
            "http://10.0.0.1:10810",
            "https://backup:1",
            "http://[fe80::1]:5",
        ] {
            assert!(!is_loopback(b), "{b}");
        }
    }
}

//! Protocol tests over a real TCP socket with handcrafted bytes, against an
//! in-memory [`BlockExport`] test double (protocol layer only; the real
//! storage is tested elsewhere).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::proto::*;
use crate::*;

const T: Duration = Duration::from_secs(10);

// ------------------------------------------------------------ test double

// The sparse in-memory export and its provider are the fuzz targets' (one
// test double for both).
use crate::fuzzing::{RamExport, RamProvider};

// ------------------------------------------------------------------ server

struct Server {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<std::io::Result<()>>,
    mem: Arc<RamExport>,
    ro: Arc<RamExport>,
}

/// Binds in the 10890-10899 experiment range when a port is free there,
/// else on any loopback port.
async fn bind() -> TcpListener {
    for p in 10890..=10899 {
        if let Ok(l) = TcpListener::bind(("127.0.0.1", p)).await {
            return l;
        }
    }
    TcpListener::bind("127.0.0.1:0").await.unwrap()
}

async fn start_with(config: ServerConfig) -> Server {
    let mem = RamExport::with_contexts(1 << 20, false, vec!["cistern:changed:snap1".into()]);
    let ro = RamExport::new(64 * 1024, true);
    ro.fill(0, &[7u8; 4096]);
    let provider = Arc::new(RamProvider(vec![
        (
            ExportInfo {
                name: "mem".into(),
                description: "test volume".into(),
            },
            mem.clone(),
        ),
        (
            ExportInfo {
                name: "ro".into(),
                description: String::new(),
            },
            ro.clone(),
        ),
    ]));
    let (addr, stop, task) = serve_provider(provider, config).await;
    Server {
        addr,
        stop,
        task,
        mem,
        ro,
    }
}

async fn serve_provider(
    provider: Arc<dyn ExportProvider>,
    config: ServerConfig,
) -> (
    SocketAddr,
    watch::Sender<bool>,
    JoinHandle<std::io::Result<()>>,
) {
    let l = bind().await;
    let addr = l.local_addr().unwrap();
    let (stop, rx) = watch::channel(false);
    (
        addr,
        stop,
        tokio::spawn(serve_with_config(l, provider, rx, config)),
    )
}

async fn start() -> Server {
    start_with(ServerConfig::default()).await
}

impl Server {
    async fn stop(self) {
        self.stop.send(true).unwrap();
        tokio::time::timeout(T, self.task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}

// ------------------------------------------------------------------ client

/// A test client's socket: plain TCP, or TLS after STARTTLS.
enum Io {
    Tcp(TcpStream),
    Tls(Box<tls::ClientTlsStream<TcpStream>>),
}

impl Io {
    fn tcp(self) -> TcpStream {
        match self {
            Io::Tcp(s) => s,
            Io::Tls(_) => panic!("not a plain TCP client"),
        }
    }
}

impl tokio::io::AsyncRead for Io {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => std::pin::Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for Io {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Tcp(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => std::pin::Pin::new(s).poll_write(cx, buf),
        }
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => std::pin::Pin::new(s).poll_flush(cx),
            Io::Tls(s) => std::pin::Pin::new(s).poll_flush(cx),
        }
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Tcp(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => std::pin::Pin::new(s).poll_shutdown(cx),
        }
    }
}

struct C {
    s: Io,
}

impl C {
    /// Connects and reads the greeting, without answering it.
    async fn raw(addr: SocketAddr) -> C {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut g = [0u8; 18];
        tokio::time::timeout(T, s.read_exact(&mut g))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&g[0..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(
            u16::from_be_bytes([g[16], g[17]]),
            FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES
        );
        C { s: Io::Tcp(s) }
    }
    /// Connects and sends client flags FIXED_NEWSTYLE | NO_ZEROES.
    async fn new(addr: SocketAddr) -> C {
        let mut c = C::raw(addr).await;
        c.put(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
            .await;
        c
    }
    async fn put(&mut self, b: &[u8]) {
        self.s.write_all(b).await.unwrap();
        self.s.flush().await.unwrap();
    }
    async fn get(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        tokio::time::timeout(T, self.s.read_exact(&mut b))
            .await
            .expect("server hung")
            .expect("read");
        b
    }
    async fn u16(&mut self) -> u16 {
        let b = self.get(2).await;
        u16::from_be_bytes([b[0], b[1]])
    }
    async fn u32(&mut self) -> u32 {
        let b = self.get(4).await;
        u32::from_be_bytes(b.try_into().unwrap())
    }
    async fn u64(&mut self) -> u64 {
        let b = self.get(8).await;
        u64::from_be_bytes(b.try_into().unwrap())
    }
    /// The server closed the connection (EOF or reset) without sending more.
    async fn closed(&mut self) {
        let mut b = [0u8; 1];
        match tokio::time::timeout(T, self.s.read(&mut b))
            .await
            .expect("server did not close")
        {
            Ok(0) | Err(_) => {}
            Ok(_) => panic!("unexpected data instead of close: {:#x}", b[0]),
        }
    }

    async fn opt(&mut self, opt: u32, data: &[u8]) {
        let mut b = Vec::new();
        b.extend_from_slice(&IHAVEOPT.to_be_bytes());
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.put(&b).await;
    }
    /// One option reply: (type, data); checks magic and option echo.
    async fn rep(&mut self, opt: u32) -> (u32, Vec<u8>) {
        assert_eq!(self.u64().await, OPT_REPLY_MAGIC);
        assert_eq!(self.u32().await, opt);
        let ty = self.u32().await;
        let len = self.u32().await as usize;
        (ty, self.get(len).await)
    }
    /// Replies up to the final one (ACK or error): (infos/servers/contexts, final type).
    async fn reps(&mut self, opt: u32) -> (Vec<(u32, Vec<u8>)>, u32) {
        let mut v = Vec::new();
        loop {
            let (ty, d) = self.rep(opt).await;
            if ty == REP_ACK || ty & (1 << 31) != 0 {
                return (v, ty);
            }
            v.push((ty, d));
        }
    }
    async fn structured(&mut self) {
        self.opt(OPT_STRUCTURED_REPLY, &[]).await;
        assert_eq!(self.rep(OPT_STRUCTURED_REPLY).await.0, REP_ACK);
    }
    /// SET_META_CONTEXT; returns (id, name) pairs.
    async fn set_meta(&mut self, export: &str, queries: &[&str]) -> Vec<(u32, String)> {
        let (v, fin) = self.meta(OPT_SET_META_CONTEXT, export, queries).await;
        assert_eq!(fin, REP_ACK);
        v
    }
    async fn meta(
        &mut self,
        opt: u32,
        export: &str,
        queries: &[&str],
    ) -> (Vec<(u32, String)>, u32) {
        let mut d = Vec::new();
        d.extend_from_slice(&(export.len() as u32).to_be_bytes());
        d.extend_from_slice(export.as_bytes());
        d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for q in queries {
            d.extend_from_slice(&(q.len() as u32).to_be_bytes());
            d.extend_from_slice(q.as_bytes());
        }
        self.opt(opt, &d).await;
        let (v, fin) = self.reps(opt).await;
        let v = v
            .into_iter()
            .map(|(ty, d)| {
                assert_eq!(ty, REP_META_CONTEXT);
                (
                    u32::from_be_bytes(d[0..4].try_into().unwrap()),
                    String::from_utf8(d[4..].to_vec()).unwrap(),
                )
            })
            .collect();
        (v, fin)
    }
    fn info_data(name: &str, reqs: &[u16]) -> Vec<u8> {
        let mut d = Vec::new();
        d.extend_from_slice(&(name.len() as u32).to_be_bytes());
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(reqs.len() as u16).to_be_bytes());
        for r in reqs {
            d.extend_from_slice(&r.to_be_bytes());
        }
        d
    }
    /// NBD_OPT_GO; returns (size, transmission flags).
    async fn go(&mut self, name: &str) -> (u64, u16) {
        self.opt(OPT_GO, &Self::info_data(name, &[INFO_BLOCK_SIZE]))
            .await;
        let (infos, fin) = self.reps(OPT_GO).await;
        assert_eq!(fin, REP_ACK, "GO {name:?} failed");
        let e = infos
            .iter()
            .find(|(_, d)| u16::from_be_bytes([d[0], d[1]]) == INFO_EXPORT)
            .expect("NBD_INFO_EXPORT");
        (
            u64::from_be_bytes(e.1[2..10].try_into().unwrap()),
            u16::from_be_bytes([e.1[10], e.1[11]]),
        )
    }
    /// Full handshake to transmission.
    async fn session(addr: SocketAddr, name: &str, structured: bool) -> C {
        let mut c = C::new(addr).await;
        if structured {
            c.structured().await;
            c.set_meta(name, &["base:allocation"]).await;
        }
        c.go(name).await;
        c
    }

    async fn req(&mut self, flags: u16, cmd: u16, handle: u64, off: u64, len: u32, payload: &[u8]) {
        let mut b = Vec::with_capacity(28 + payload.len());
        b.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&cmd.to_be_bytes());
        b.extend_from_slice(&handle.to_be_bytes());
        b.extend_from_slice(&off.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(payload);
        self.put(&b).await;
    }
    /// A simple reply header: (error, handle).
    async fn simple(&mut self) -> (u32, u64) {
        assert_eq!(self.u32().await, SIMPLE_REPLY_MAGIC);
        (self.u32().await, self.u64().await)
    }
    /// Any reply message: Simple(error) or a structured chunk.
    async fn msg(&mut self) -> Msg {
        match self.u32().await {
            SIMPLE_REPLY_MAGIC => {
                let e = self.u32().await;
                Msg::Simple {
                    error: e,
                    _handle: self.u64().await,
                }
            }
            STRUCTURED_REPLY_MAGIC => {
                let flags = self.u16().await;
                let ty = self.u16().await;
                let handle = self.u64().await;
                let len = self.u32().await as usize;
                Msg::Chunk {
                    flags,
                    ty,
                    handle,
                    data: self.get(len).await,
                }
            }
            m => panic!("bad reply magic {m:#x}"),
        }
    }
    /// All chunks of one structured reply (up to DONE).
    async fn chunks(&mut self) -> Vec<(u16, u64, Vec<u8>)> {
        let mut v = Vec::new();
        loop {
            match self.msg().await {
                Msg::Chunk {
                    flags,
                    ty,
                    handle,
                    data,
                } => {
                    v.push((ty, handle, data));
                    if flags & REPLY_FLAG_DONE != 0 {
                        return v;
                    }
                }
                Msg::Simple { .. } => panic!("simple reply inside a structured reply"),
            }
        }
    }
    /// Error value of a structured error chunk or simple reply.
    async fn error(&mut self) -> u32 {
        match self.msg().await {
            Msg::Simple { error, .. } => error,
            Msg::Chunk {
                flags, ty, data, ..
            } => {
                assert_ne!(flags & REPLY_FLAG_DONE, 0);
                assert!(
                    ty == REPLY_TYPE_ERROR || ty == REPLY_TYPE_ERROR_OFFSET,
                    "type {ty}"
                );
                let mlen = u16::from_be_bytes([data[4], data[5]]) as usize;
                assert!(std::str::from_utf8(&data[6..6 + mlen]).is_ok());
                u32::from_be_bytes(data[0..4].try_into().unwrap())
            }
        }
    }
}

#[derive(Debug)]
enum Msg {
    Simple {
        error: u32,
        _handle: u64,
    },
    Chunk {
        flags: u16,
        ty: u16,
        handle: u64,
        data: Vec<u8>,
    },
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

// ------------------------------------------------------------------- tests

#[tokio::test]
async fn bad_client_flags_close() {
    let srv = start().await;
    let mut c = C::raw(srv.addr).await;
    c.put(&0x8000_0000u32.to_be_bytes()).await;
    c.closed().await;
    srv.stop().await;
}

#[tokio::test]
async fn malformed_option_magic_closes() {
    let srv = start().await;
    let mut c = C::new(srv.addr).await;
    let mut b = Vec::new();
    b.extend_from_slice(b"IHAVEOPX");
    b.extend_from_slice(&OPT_LIST.to_be_bytes());
    b.extend_from_slice(&0u32.to_be_bytes());
    c.put(&b).await;
    c.closed().await;
    srv.stop().await;
}

#[tokio::test]
async fn unknown_option_and_starttls_are_refused_then_go_works() {
    let srv = start().await;
    let mut c = C::new(srv.addr).await;
    c.opt(0x1234, b"junk").await;
    assert_eq!(c.rep(0x1234).await.0, REP_ERR_UNSUP);
    c.opt(OPT_EXTENDED_HEADERS, &[]).await;
    assert_eq!(c.rep(OPT_EXTENDED_HEADERS).await.0, REP_ERR_UNSUP);
    c.opt(OPT_STARTTLS, &[]).await;
    assert_eq!(c.rep(OPT_STARTTLS).await.0, REP_ERR_POLICY);
    let (size, flags) = c.go("mem").await;
    assert_eq!(size, 1 << 20);
    assert_ne!(flags & FLAG_HAS_FLAGS, 0);
    assert_eq!(flags & FLAG_READ_ONLY, 0);
    for f in [
        FLAG_SEND_FLUSH,
        FLAG_SEND_FUA,
        FLAG_SEND_TRIM,
        FLAG_SEND_WRITE_ZEROES,
        FLAG_CAN_MULTI_CONN,
    ] {
        assert_ne!(flags & f, 0);
    }
    assert_eq!(flags & FLAG_SEND_DF, 0, "DF without structured replies");
    c.req(0, CMD_DISC, 1, 0, 0, &[]).await;
    c.closed().await;
    srv.stop().await;
}

#[tokio::test]
async fn oversize_options() {
    let srv = start().await;
    let mut c = C::new(srv.addr).await;
    // Over the limit but small enough to skip: refused, session goes on.
    c.opt(OPT_GO, &vec![0u8; 100 * 1024]).await;
    assert_eq!(c.rep(OPT_GO).await.0, REP_ERR_TOO_BIG);
    c.go("mem").await;
    drop(c);
    // Too large to skip: refused and dropped.
    let mut c = C::new(srv.addr).await;
    let mut b = Vec::new();
    b.extend_from_slice(&IHAVEOPT.to_be_bytes());
    b.extend_from_slice(&OPT_INFO.to_be_bytes());
    b.extend_from_slice(&u32::MAX.to_be_bytes());
    c.put(&b).await;
    assert_eq!(c.rep(OPT_INFO).await.0, REP_ERR_TOO_BIG);
    c.closed().await;
    // A huge export name cannot be answered: dropped.
    let mut c = C::new(srv.addr).await;
    let mut b = Vec::new();
    b.extend_from_slice(&IHAVEOPT.to_be_bytes());
    b.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
    b.extend_from_slice(&(1u32 << 20).to_be_bytes());
    c.put(&b).await;
    c.closed().await;
    srv.stop().await;
}

#[tokio::test]
async fn truncated_option_closes() {
    let srv = start().await;
    let mut c = C::new(srv.addr).await;
    let mut b = Vec::new();
    b.extend_from_slice(&IHAVEOPT.to_be_bytes());
    b.extend_from_slice(&OPT_GO.to_be_bytes());
    b.extend_from_slice(&100u32.to_be_bytes());
    b.extend_from_slice(&[0u8; 10]);
    c.put(&b).await;
    c.s.shutdown().await.unwrap();
    c.closed().await;
    srv.stop().await;
}

#[tokio::test]
async fn list_info_and_default_export() {
    let srv = start().await;
    let mut c = C::new(srv.addr).await;
    c.opt(OPT_LIST, &[]).await;
    let (servers, fin) = c.reps(OPT_LIST).await;
    assert_eq!(fin, REP_ACK);
    let names: Vec<(String, String)> = servers
        .iter()
        .map(|(ty, d)| {
            assert_eq!(*ty, REP_SERVER);
            let n = u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize;
            (
                String::from_utf8(d[4..4 + n].to_vec()).unwrap(),
                String::from_utf8(d[4 + n..].to_vec()).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        names,
        vec![
            ("mem".into(), "test volume".into()),
            ("ro".into(), String::new())
        ]
    );
    c.opt(OPT_LIST, b"x").await;
    assert_eq!(c.rep(OPT_LIST).await.0, REP_ERR_INVALID);

    // Unknown export.
    c.opt(OPT_INFO, &C::info_data("nope", &[])).await;
    let (infos, fin) = c.reps(OPT_INFO).await;
    assert!(infos.is_empty());
    assert_eq!(fin, REP_ERR_UNKNOWN);
    // Malformed INFO (name length beyond the data).
    let mut bad = C::info_data("mem", &[]);
    bad[3] = 200;
    c.opt(OPT_INFO, &bad).await;
    assert_eq!(c.rep(OPT_INFO).await.0, REP_ERR_INVALID);

    // Default export "" is the first listed, with its canonical name.
    c.opt(
        OPT_INFO,
        &C::info_data("", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]),
    )
    .await;
    let (infos, fin) = c.reps(OPT_INFO).await;
    assert_eq!(fin, REP_ACK);
    let get = |t: u16| {
        infos
            .iter()
            .find(|(_, d)| u16::from_be_bytes([d[0], d[1]]) == t)
            .map(|(_, d)| d[2..].to_vec())
    };
    assert_eq!(get(INFO_NAME).unwrap(), b"mem");
    assert_eq!(get(INFO_DESCRIPTION).unwrap(), b"test volume");
    let bs = get(INFO_BLOCK_SIZE).unwrap();
    let w = |i: usize| u32::from_be_bytes(bs[i..i + 4].try_into().unwrap());
    assert_eq!((w(0), w(4), w(8)), (1, 4096, 32 << 20));
    assert_eq!(
        u64::from_be_bytes(get(INFO_EXPORT).unwrap()[0..8].try_into().unwrap()),
        1 << 20
    );

    // Read-only export flags.
    let (_, flags) = c.go("ro").await;
    assert_ne!(flags & FLAG_READ_ONLY, 0);
    srv.stop().await;
}

#[tokio::test]
async fn export_name_and_no_zeroes() {
    let srv = start().await;
    for no_zeroes in [true, false] {
        let mut c = C::raw(srv.addr).await;
        let f = FLAG_C_FIXED_NEWSTYLE | if no_zeroes { FLAG_C_NO_ZEROES } else { 0 };
        c.put(&f.to_be_bytes()).await;
        c.opt(OPT_EXPORT_NAME, b"mem").await;
        assert_eq!(c.u64().await, 1 << 20);
        let _flags = c.u16().await;
        if !no_zeroes {
            assert_eq!(c.get(124).await, vec![0u8; 124]);
        }
        // Transmission works right after.
        c.req(0, CMD_FLUSH, 9, 0, 0, &[]).await;
        assert_eq!(c.simple().await, (0, 9));
    }
    // Unknown export via EXPORT_NAME: no way to say no but to hang up.
    let mut c = C::new(srv.addr).await;
    c.opt(OPT_EXPORT_NAME, b"nope").await;
    c.closed().await;
    srv.stop().await;
}

#[tokio::test]
async fn abort_is_acked() {
    let srv = start().await;
    let mut c = C::new(srv.addr).await;
    c.opt(OPT_ABORT, &[]).await;
    assert_eq!(c.rep(OPT_ABORT).await.0, REP_ACK);
    c.closed().await;
    srv.stop().await;
}

#[tokio::test]
async fn out_of_range_read() {
    let srv = start().await;
    // Simple replies: EINVAL, no payload, connection still usable.
    let mut c = C::session(srv.addr, "mem", false).await;
    c.req(0, CMD_READ, 1, (1 << 20) - 512, 1024, &[]).await;
    assert_eq!(c.simple().await, (EINVAL, 1));
    c.req(0, CMD_READ, 2, u64::MAX - 10, 512, &[]).await;
    assert_eq!(c.simple().await, (EINVAL, 2));
    c.req(0, CMD_READ, 3, 0, 512, &[]).await;
    assert_eq!(c.simple().await, (0, 3));
    assert_eq!(c.get(512).await, vec![0u8; 512]);
    // Structured: an error chunk.
    let mut c = C::session(srv.addr, "mem", true).await;
    c.req(0, CMD_READ, 4, 1 << 20, 1, &[]).await;
    assert_eq!(c.error().await, EINVAL);
    srv.stop().await;
}

#[tokio::test]
async fn writes_on_read_only_export() {
    let srv = start().await;
    let mut c = C::session(srv.addr, "ro", false).await;
    c.req(0, CMD_WRITE, 1, 0, 4, b"abcd").await;
    assert_eq!(c.simple().await, (EPERM, 1));
    c.req(0, CMD_TRIM, 2, 0, 4096, &[]).await;
    assert_eq!(c.simple().await, (EPERM, 2));
    c.req(0, CMD_WRITE_ZEROES, 3, 0, 4096, &[]).await;
    assert_eq!(c.simple().await, (EPERM, 3));
    // Reads still work and the data is untouched.
    c.req(0, CMD_READ, 4, 0, 8, &[]).await;
    assert_eq!(c.simple().await, (0, 4));
    assert_eq!(c.get(8).await, vec![7u8; 8]);
    assert_eq!(
        srv.ro.read(0, 4).unwrap(),
        vec![ReadChunk::Data(vec![7; 4])]
    );
    srv.stop().await;
}

#[tokio::test]
async fn unknown_command_and_flags() {
    let srv = start().await;
    let before = stats().snapshot();
    let mut c = C::session(srv.addr, "mem", false).await;
    c.req(0, 42, 1, 0, 0, &[]).await;
    assert_eq!(c.simple().await, (EINVAL, 1));
    // Unknown flag on a WRITE: the payload is still consumed, nothing written.
    c.req(1 << 9, CMD_WRITE, 2, 0, 4, b"abcd").await;
    assert_eq!(c.simple().await, (EINVAL, 2));
    // DF without structured replies is not valid.
    c.req(CMD_FLAG_DF, CMD_READ, 3, 0, 4, &[]).await;
    assert_eq!(c.simple().await, (EINVAL, 3));
    // REQ_ONE is only for BLOCK_STATUS.
    c.req(CMD_FLAG_REQ_ONE, CMD_FLUSH, 4, 0, 0, &[]).await;
    assert_eq!(c.simple().await, (EINVAL, 4));
    // BLOCK_STATUS without negotiated contexts.
    c.req(0, CMD_BLOCK_STATUS, 5, 0, 4096, &[]).await;
    assert_eq!(c.simple().await, (EINVAL, 5));
    // FUA is fine everywhere.
    c.req(CMD_FLAG_FUA, CMD_WRITE, 6, 0, 4, b"wxyz").await;
    assert_eq!(c.simple().await, (0, 6));
    assert_eq!(
        srv.mem.read(0, 4).unwrap(),
        vec![ReadChunk::Data(b"wxyz".to_vec())]
    );
    let after = stats().snapshot();
    assert!(after.requests_unknown > before.requests_unknown);
    assert!(after.errors >= before.errors + 5);
    srv.stop().await;
}

#[tokio::test]
async fn truncated_request_closes() {
    let srv = start().await;
    // Half a header, then EOF.
    let mut c = C::session(srv.addr, "mem", false).await;
    c.put(&REQUEST_MAGIC.to_be_bytes()).await;
    c.put(&[0u8; 6]).await;
    c.s.shutdown().await.unwrap();
    c.closed().await;
    // A WRITE header promising more payload than arrives.
    let mut c = C::session(srv.addr, "mem", false).await;
    c.req(0, CMD_WRITE, 1, 0, 4096, &[1u8; 100]).await;
    c.s.shutdown().await.unwrap();
    c.closed().await;
    assert_eq!(
        srv.mem.read(0, 100).unwrap(),
        vec![ReadChunk::Hole(100)],
        "partial write applied"
    );
    srv.stop().await;
}

#[tokio::test]
async fn bad_request_magic_closes() {
    let srv = start().await;
    let mut c = C::session(srv.addr, "mem", false).await;
    let mut b = [0u8; 28];
    b[0..4].copy_from_slice(&0x1234_5678u32.to_be_bytes());
    c.put(&b).await;
    c.closed().await;
    srv.stop().await;
}

#[tokio::test]
async fn oversize_requests() {
    let srv = start().await;
    // READ over 32 MiB: EOVERFLOW with structured replies, EINVAL without.
    let mut c = C::session(srv.addr, "mem", true).await;
    c.req(0, CMD_READ, 1, 0, MAX_PAYLOAD + 1, &[]).await;
    assert_eq!(c.error().await, EOVERFLOW);
    let mut c = C::session(srv.addr, "mem", false).await;
    c.req(0, CMD_READ, 2, 0, MAX_PAYLOAD + 1, &[]).await;
    assert_eq!(c.simple().await, (EINVAL, 2));
    // WRITE over 32 MiB: error, then hard disconnect (payload can't be skipped).
    c.req(0, CMD_WRITE, 3, 0, u32::MAX, &[0u8; 64]).await;
    assert_eq!(c.simple().await, (EINVAL, 3));
    c.closed().await;
    // TRIM larger than the maximum payload is fine (no payload) if in range.
    let mut c = C::session(srv.addr, "mem", false).await;
    c.req(0, CMD_TRIM, 4, 0, 1 << 20, &[]).await;
    assert_eq!(c.simple().await, (0, 4));
    srv.stop().await;
}

#[tokio::test]
async fn structured_reads_holes_and_df() {
    let srv = start().await;
    let data = pattern(4096, 3);
    srv.mem.fill(8192, &data);
    let mut c = C::session(srv.addr, "mem", true).await;
    // [0,8192) hole, [8192,12288) data, [12288,16384) hole.
    c.req(0, CMD_READ, 1, 0, 16384, &[]).await;
    let ch = c.chunks().await;
    assert_eq!(ch.len(), 3);
    assert!(ch.iter().all(|(_, h, _)| *h == 1));
    let off = |d: &[u8]| u64::from_be_bytes(d[0..8].try_into().unwrap());
    assert_eq!(ch[0].0, REPLY_TYPE_OFFSET_HOLE);
    assert_eq!(
        (
            off(&ch[0].2),
            u32::from_be_bytes(ch[0].2[8..12].try_into().unwrap())
        ),
        (0, 8192)
    );
    assert_eq!(ch[1].0, REPLY_TYPE_OFFSET_DATA);
    assert_eq!(off(&ch[1].2), 8192);
    assert_eq!(&ch[1].2[8..], &data[..]);
    assert_eq!(ch[2].0, REPLY_TYPE_OFFSET_HOLE);
    assert_eq!(off(&ch[2].2), 12288);
    // DF: one data chunk with the holes as zeros.
    c.req(CMD_FLAG_DF, CMD_READ, 2, 4096, 12288, &[]).await;
    let ch = c.chunks().await;
    assert_eq!(ch.len(), 1);
    assert_eq!(ch[0].0, REPLY_TYPE_OFFSET_DATA);
    assert_eq!(off(&ch[0].2), 4096);
    let mut want = vec![0u8; 4096];
    want.extend_from_slice(&data);
    want.extend_from_slice(&[0u8; 4096]);
    assert_eq!(&ch[0].2[8..], &want[..]);
    // Simple replies expand holes.
    let mut s = C::session(srv.addr, "mem", false).await;
    s.req(0, CMD_READ, 3, 4096, 12288, &[]).await;
    assert_eq!(s.simple().await, (0, 3));
    assert_eq!(s.get(12288).await, want);
    // Zero-length read: a lone NONE chunk.
    c.req(0, CMD_READ, 4, 0, 0, &[]).await;
    let ch = c.chunks().await;
    assert_eq!((ch.len(), ch[0].0), (1, REPLY_TYPE_NONE));
    srv.stop().await;
}

#[tokio::test]
async fn export_errors_are_reported() {
    let srv = start().await;
    let mut c = C::session(srv.addr, "mem", true).await;
    c.req(0, CMD_WRITE, 1, 4096, 4, b"EIO!").await;
    match c.msg().await {
        Msg::Chunk {
            ty, data, flags, ..
        } => {
            assert_eq!(ty, REPLY_TYPE_ERROR_OFFSET);
            assert_ne!(flags & REPLY_FLAG_DONE, 0);
            assert_eq!(u32::from_be_bytes(data[0..4].try_into().unwrap()), EIO);
            let mlen = u16::from_be_bytes([data[4], data[5]]) as usize;
            assert!(String::from_utf8_lossy(&data[6..6 + mlen]).contains("injected"));
            assert_eq!(
                u64::from_be_bytes(data[6 + mlen..].try_into().unwrap()),
                4096
            );
        }
        m => panic!("{m:?}"),
    }
    // Writes beyond the end: ENOSPC.
    c.req(0, CMD_WRITE, 2, 1 << 20, 4, b"abcd").await;
    assert_eq!(c.error().await, ENOSPC);
    srv.stop().await;
}

#[tokio::test]
async fn meta_contexts_and_block_status() {
    let srv = start().await;
    srv.mem.fill(0, &[1u8; 8192]);
    let mut c = C::new(srv.addr).await;
    // SET before structured replies: invalid.
    c.opt(OPT_SET_META_CONTEXT, &[0u8; 8]).await;
    assert_eq!(c.rep(OPT_SET_META_CONTEXT).await.0, REP_ERR_INVALID);
    c.structured().await;
    let names = |v: Vec<(u32, String)>| v.into_iter().map(|x| x.1).collect::<Vec<_>>();
    // LIST: no query = all; "base:" = base namespace; unknown ignored.
    let (v, fin) = c.meta(OPT_LIST_META_CONTEXT, "mem", &[]).await;
    assert_eq!(fin, REP_ACK);
    assert_eq!(
        names(v),
        vec![BASE_ALLOCATION.to_string(), "cistern:changed:snap1".into()]
    );
    let (v, _) = c.meta(OPT_LIST_META_CONTEXT, "mem", &["base:"]).await;
    assert_eq!(names(v), vec![BASE_ALLOCATION.to_string()]);
    let (v, fin) = c
        .meta(OPT_LIST_META_CONTEXT, "mem", &["qemu:dirty-bitmap:x"])
        .await;
    assert!(v.is_empty() && fin == REP_ACK);
    let (_, fin) = c.meta(OPT_LIST_META_CONTEXT, "nope", &[]).await;
    assert_eq!(fin, REP_ERR_UNKNOWN);
    let (_, fin) = c.meta(OPT_LIST_META_CONTEXT, "mem", &["nocolon"]).await;
    assert_eq!(fin, REP_ERR_INVALID);
    // SET: "base:" alone selects nothing, exact names select.
    assert!(c.set_meta("mem", &["base:"]).await.is_empty());
    assert!(c.set_meta("mem", &[]).await.is_empty());
    let sel = c
        .set_meta(
            "mem",
            &["base:allocation", "cistern:changed:snap1", "x-foo:bar"],
        )
        .await;
    assert_eq!(sel.len(), 2);
    let ids: Vec<u32> = sel.iter().map(|x| x.0).collect();
    assert_ne!(ids[0], ids[1]);
    let (_, flags) = c.go("mem").await;
    assert_ne!(flags & FLAG_SEND_DF, 0);

    c.req(0, CMD_BLOCK_STATUS, 7, 0, 16384, &[]).await;
    let ch = c.chunks().await;
    assert_eq!(ch.len(), 2);
    let mut by_id = std::collections::HashMap::new();
    for (ty, h, d) in ch {
        assert_eq!((ty, h), (REPLY_TYPE_BLOCK_STATUS, 7));
        let id = u32::from_be_bytes(d[0..4].try_into().unwrap());
        let ext: Vec<(u32, u32)> = d[4..]
            .chunks(8)
            .map(|e| {
                (
                    u32::from_be_bytes(e[0..4].try_into().unwrap()),
                    u32::from_be_bytes(e[4..8].try_into().unwrap()),
                )
            })
            .collect();
        by_id.insert(id, ext);
    }
    let base_id = sel.iter().find(|x| x.1 == BASE_ALLOCATION).unwrap().0;
    let other_id = sel.iter().find(|x| x.1 != BASE_ALLOCATION).unwrap().0;
    assert_eq!(
        by_id[&base_id],
        vec![(8192, 0), (8192, STATE_HOLE | STATE_ZERO)]
    );
    assert_eq!(by_id[&other_id], vec![(16384, 1)]);
    // REQ_ONE: one extent per context.
    c.req(CMD_FLAG_REQ_ONE, CMD_BLOCK_STATUS, 8, 0, 16384, &[])
        .await;
    for (_, _, d) in c.chunks().await {
        assert_eq!(d.len(), 12);
    }
    // Out of range and zero length: EINVAL.
    c.req(0, CMD_BLOCK_STATUS, 9, (1 << 20) - 512, 1024, &[])
        .await;
    assert_eq!(c.error().await, EINVAL);
    c.req(0, CMD_BLOCK_STATUS, 10, 0, 0, &[]).await;
    assert_eq!(c.error().await, EINVAL);
    srv.stop().await;
}

#[tokio::test]
async fn contexts_for_another_export_are_dropped() {
    let srv = start().await;
    let mut c = C::new(srv.addr).await;
    c.structured().await;
    assert_eq!(c.set_meta("ro", &["base:allocation"]).await.len(), 1);
    c.go("mem").await;
    c.req(0, CMD_BLOCK_STATUS, 1, 0, 4096, &[]).await;
    assert_eq!(c.error().await, EINVAL);
    srv.stop().await;
}

#[tokio::test]
async fn trim_zero_cache_flush() {
    let srv = start().await;
    srv.mem.fill(0, &[9u8; 16384]);
    let mut c = C::session(srv.addr, "mem", false).await;
    c.req(CMD_FLAG_FUA, CMD_TRIM, 1, 4096, 4096, &[]).await;
    assert_eq!(c.simple().await, (0, 1));
    c.req(
        CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_WRITE_ZEROES,
        2,
        8192,
        100,
        &[],
    )
    .await;
    assert_eq!(c.simple().await, (0, 2));
    c.req(0, CMD_CACHE, 3, 0, 16384, &[]).await;
    assert_eq!(c.simple().await, (0, 3));
    c.req(0, CMD_CACHE, 4, 0, (1 << 20) + 1, &[]).await;
    assert_eq!(c.simple().await, (EINVAL, 4));
    let flushes = srv.mem.flushes();
    c.req(0, CMD_FLUSH, 5, 0, 0, &[]).await;
    assert_eq!(c.simple().await, (0, 5));
    assert_eq!(srv.mem.flushes(), flushes + 1);
    // Zero-length commands succeed.
    for (i, cmd) in [CMD_WRITE, CMD_TRIM, CMD_WRITE_ZEROES, CMD_READ]
        .into_iter()
        .enumerate()
    {
        c.req(0, cmd, 10 + i as u64, 0, 0, &[]).await;
        assert_eq!(c.simple().await, (0, 10 + i as u64));
    }
    c.req(0, CMD_READ, 20, 0, 16384, &[]).await;
    assert_eq!(c.simple().await, (0, 20));
    let got = c.get(16384).await;
    assert_eq!(&got[..4096], &[9u8; 4096][..]);
    assert_eq!(&got[4096..8192], &[0u8; 4096][..]);
    assert_eq!(&got[8192..8292], &[0u8; 100][..]);
    assert_eq!(&got[8292..], &[9u8; 16384 - 8292][..]);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_and_graceful_disc() {
    let cfg = ServerConfig {
        max_in_flight: 8,
        ..ServerConfig::default()
    };
    let srv = start_with(cfg).await;
    let mut c = C::session(srv.addr, "mem", true).await;
    let n = 200u64;
    // All writes sent back to back (more than the in-flight limit), and DISC
    // right after: every one must still be answered.
    let mut buf = Vec::new();
    for i in 0..n {
        let mut b = Vec::new();
        b.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b.extend_from_slice(&0u16.to_be_bytes());
        b.extend_from_slice(&CMD_WRITE.to_be_bytes());
        b.extend_from_slice(&i.to_be_bytes());
        b.extend_from_slice(&(i * 4096).to_be_bytes());
        b.extend_from_slice(&4096u32.to_be_bytes());
        b.extend_from_slice(&pattern(4096, i as u8));
        buf.extend_from_slice(&b);
    }
    let (mut rd, mut wr) = c.s.tcp().into_split();
    let writer = tokio::spawn(async move {
        wr.write_all(&buf).await.unwrap();
        wr
    });
    let mut seen = vec![false; n as usize];
    for _ in 0..n {
        let mut h = [0u8; 16];
        tokio::time::timeout(T, rd.read_exact(&mut h))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            u32::from_be_bytes(h[0..4].try_into().unwrap()),
            SIMPLE_REPLY_MAGIC
        );
        assert_eq!(u32::from_be_bytes(h[4..8].try_into().unwrap()), 0);
        let handle = u64::from_be_bytes(h[8..16].try_into().unwrap());
        assert!(!seen[handle as usize]);
        seen[handle as usize] = true;
    }
    let wr = writer.await.unwrap();
    c = C {
        s: Io::Tcp(rd.reunite(wr).unwrap()),
    };
    // Reads of everything, pipelined, then DISC.
    for i in 0..n {
        c.req(0, CMD_READ, 1000 + i, i * 4096, 4096, &[]).await;
    }
    c.req(0, CMD_DISC, 9999, 0, 0, &[]).await;
    for _ in 0..n {
        let ch = c.chunks().await;
        assert_eq!(ch.len(), 1);
        let i = ch[0].1 - 1000;
        assert_eq!(&ch[0].2[8..], &pattern(4096, i as u8)[..]);
    }
    c.closed().await;
    srv.stop().await;
}

#[tokio::test]
async fn shutdown_closes_idle_sessions_and_returns() {
    let srv = start().await;
    let mut a = C::session(srv.addr, "mem", false).await;
    let mut b = C::new(srv.addr).await; // still in the handshake
    let addr = srv.addr;
    srv.stop().await;
    a.closed().await;
    b.closed().await;
    // No longer accepting.
    assert!(TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn connection_limit() {
    let srv = start_with(ServerConfig {
        max_connections: 1,
        ..ServerConfig::default()
    })
    .await;
    let _a = C::session(srv.addr, "mem", false).await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    let mut b = [0u8; 1];
    match tokio::time::timeout(T, s.read(&mut b)).await.unwrap() {
        Ok(0) | Err(_) => {}
        Ok(_) => panic!("second connection was served"),
    }
    srv.stop().await;
}

#[tokio::test]
async fn handshake_timeout() {
    let cfg = ServerConfig {
        handshake_timeout: Duration::from_millis(200),
        ..ServerConfig::default()
    };
    let srv = start_with(cfg).await;
    let mut c = C::new(srv.addr).await;
    c.closed().await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_that_stops_reading_is_dropped() {
    let cfg = ServerConfig {
        shutdown_grace: Duration::from_millis(300),
        ..ServerConfig::default()
    };
    let srv = start_with(cfg).await;
    srv.mem.fill(0, &pattern(1 << 20, 1));
    let mut c = C::session(srv.addr, "mem", false).await;
    // 32 MiB of replies, far more than the socket buffers hold; never read.
    for i in 0..32 {
        c.req(0, CMD_READ, i, 0, 1 << 20, &[]).await;
    }
    c.req(0, CMD_DISC, 99, 0, 0, &[]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // The server gave up delivering after the grace period: the stream ends early.
    let mut total = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match tokio::time::timeout(T, c.s.read(&mut buf))
            .await
            .expect("server kept the connection")
        {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n as u64,
        }
    }
    assert!(
        total < 32 * ((1 << 20) + 16),
        "all {total} bytes were delivered"
    );
    srv.stop().await;
}

/// An export whose READ and FLUSH take a while (a disk, not memory).
struct SlowExport(Arc<RamExport>);

impl BlockExport for SlowExport {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read_only(&self) -> bool {
        false
    }
    fn preferred_block_size(&self) -> u32 {
        4096
    }
    /// Reads of the first 32 KiB take 200 ms, the others are instant.
    fn read(&self, offset: u64, len: u64) -> Result<Vec<ReadChunk>, ExportError> {
        if offset < 32 * 1024 {
            std::thread::sleep(Duration::from_millis(200));
        }
        self.0.read(offset, len)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        self.0.write(offset, data, fua)
    }
    fn flush(&self) -> Result<(), ExportError> {
        std::thread::sleep(Duration::from_millis(500));
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), ExportError> {
        self.0.trim(offset, len, fua)
    }
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        allocate: bool,
        fua: bool,
    ) -> Result<(), ExportError> {
        self.0.write_zeroes(offset, len, allocate, fua)
    }
    fn block_status(
        &self,
        context: &str,
        offset: u64,
        len: u64,
    ) -> Result<Vec<StatusExtent>, ExportError> {
        self.0.block_status(context, offset, len)
    }
}

struct SlowProvider(Arc<SlowExport>);

impl ExportProvider for SlowProvider {
    fn list(&self) -> Vec<ExportInfo> {
        vec![ExportInfo {
            name: "slow".into(),
            description: String::new(),
        }]
    }
    fn open(&self, name: &str) -> Option<Arc<dyn BlockExport>> {
        (name == "slow").then(|| self.0.clone() as Arc<dyn BlockExport>)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_requests_run_in_parallel() {
    let slow = Arc::new(SlowExport(RamExport::new(1 << 20, false)));
    let (addr, stop, task) =
        serve_provider(Arc::new(SlowProvider(slow)), ServerConfig::default()).await;
    let mut c = C::session(addr, "slow", false).await;
    // 8 reads of 200 ms each: together well under 8 x 200 ms.
    let t0 = std::time::Instant::now();
    for i in 0..8 {
        c.req(0, CMD_READ, i, i * 4096, 4096, &[]).await;
    }
    for _ in 0..8 {
        assert_eq!(c.simple().await.0, 0);
        c.get(4096).await;
    }
    let took = t0.elapsed();
    assert!(
        took < Duration::from_millis(1000),
        "reads were serialized: {took:?}"
    );
    // Teach the server that writes are fast, let the workers go idle, then:
    // a fast write is not stuck behind a slow flush.
    for i in 0..20 {
        c.req(0, CMD_WRITE, 200 + i, 0, 4, b"abcd").await;
        assert_eq!(c.simple().await, (0, 200 + i));
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    c.req(0, CMD_FLUSH, 100, 0, 0, &[]).await;
    c.req(0, CMD_WRITE, 101, 0, 4, b"abcd").await;
    assert_eq!(c.simple().await, (0, 101));
    assert_eq!(c.simple().await, (0, 100));
    // Same with a read that is slow although reads were fast so far: the
    // queued fast read gets its own worker after a short wait.
    for i in 0..150 {
        c.req(0, CMD_READ, 1000 + i, 64 * 1024, 512, &[]).await;
        assert_eq!(c.simple().await, (0, 1000 + i));
        c.get(512).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t0 = std::time::Instant::now();
    c.req(0, CMD_READ, 400, 0, 512, &[]).await;
    c.req(0, CMD_READ, 401, 64 * 1024, 512, &[]).await;
    assert_eq!(c.simple().await, (0, 401));
    assert!(
        t0.elapsed() < Duration::from_millis(150),
        "fast read waited {:?}",
        t0.elapsed()
    );
    c.get(512).await;
    assert_eq!(c.simple().await, (0, 400));
    c.get(512).await;
    stop.send(true).unwrap();
    tokio::time::timeout(T, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

// ------------------------------------------------- revocation and daemon-wide bounds

/// A [`RamExport`] its provider can revoke (as `destroy -f` does), counting
/// the calls that reach it and whether the server closed it.
struct Revocable {
    mem: Arc<RamExport>,
    revoked: watch::Sender<bool>,
    calls: AtomicU64,
    closed: AtomicU64,
}

impl BlockExport for Revocable {
    fn size(&self) -> u64 {
        self.mem.size()
    }
    fn read_only(&self) -> bool {
        false
    }
    fn preferred_block_size(&self) -> u32 {
        4096
    }
    fn read(&self, offset: u64, len: u64) -> Result<Vec<ReadChunk>, ExportError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.mem.read(offset, len)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.mem.write(offset, data, fua)
    }
    fn flush(&self) -> Result<(), ExportError> {
        Ok(())
    }
    fn trim(&self, _: u64, _: u64, _: bool) -> Result<(), ExportError> {
        Ok(())
    }
    fn write_zeroes(&self, _: u64, _: u64, _: bool, _: bool) -> Result<(), ExportError> {
        Ok(())
    }
    fn block_status(&self, c: &str, o: u64, l: u64) -> Result<Vec<StatusExtent>, ExportError> {
        self.mem.block_status(c, o, l)
    }
    fn revoked(&self) -> Option<watch::Receiver<bool>> {
        Some(self.revoked.subscribe())
    }
    fn close(&self) {
        self.closed.fetch_add(1, Ordering::SeqCst);
    }
}

struct OneExport(Arc<Revocable>);

impl ExportProvider for OneExport {
    fn list(&self) -> Vec<ExportInfo> {
        vec![ExportInfo {
            name: "rev".into(),
            description: String::new(),
        }]
    }
    fn open(&self, name: &str) -> Option<Arc<dyn BlockExport>> {
        (name == "rev").then(|| self.0.clone() as Arc<dyn BlockExport>)
    }
}

#[tokio::test]
async fn revoked_export_answers_eshutdown_then_closes() {
    let rev = Arc::new(Revocable {
        mem: RamExport::new(1 << 20, false),
        revoked: watch::channel(false).0,
        calls: AtomicU64::new(0),
        closed: AtomicU64::new(0),
    });
    let cfg = ServerConfig {
        revoke_grace: Duration::from_millis(500),
        ..ServerConfig::default()
    };
    let (addr, stop, task) = serve_provider(Arc::new(OneExport(rev.clone())), cfg).await;
    for structured in [false, true] {
        let _ = rev.revoked.send_replace(false);
        let mut c = C::session(addr, "rev", structured).await;
        c.req(0, CMD_WRITE, 1, 0, 4096, &pattern(4096, 1)).await;
        assert_eq!(c.error().await, 0);
        let before = rev.calls.load(Ordering::SeqCst);
        rev.revoked.send_replace(true);
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Reads and writes alike get ESHUTDOWN; a WRITE's payload is skipped, so
        // the request after it is still read correctly.
        c.req(0, CMD_READ, 2, 0, 4096, &[]).await;
        assert_eq!(c.error().await, ESHUTDOWN);
        c.req(0, CMD_WRITE, 3, 0, 4096, &pattern(4096, 2)).await;
        assert_eq!(c.error().await, ESHUTDOWN);
        c.req(0, CMD_FLUSH, 4, 0, 0, &[]).await;
        assert_eq!(c.error().await, ESHUTDOWN);
        assert_eq!(
            rev.calls.load(Ordering::SeqCst),
            before,
            "the export was called after the revoke"
        );
        // Then the server closes the connection, and lets go of the export first.
        c.closed().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(rev.closed.load(Ordering::SeqCst), 2);
    stop.send(true).unwrap();
    tokio::time::timeout(T, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn idle_sockets_beyond_max_handshakes_do_not_lock_out() {
    let srv = start_with(ServerConfig {
        max_handshakes: 4,
        ..ServerConfig::default()
    })
    .await;
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(C::raw(srv.addr).await);
    }
    // A real client gets in at once, and works.
    let mut c = tokio::time::timeout(Duration::from_secs(3), C::session(srv.addr, "mem", false))
        .await
        .expect("new client locked out by idle sockets");
    c.req(0, CMD_WRITE, 1, 0, 4096, &pattern(4096, 3)).await;
    assert_eq!(c.error().await, 0);
    // The oldest idle sockets made room: closed.
    idle[0].closed().await;
    assert!(stats().snapshot().handshakes_evicted >= 36);
    drop(idle);
    srv.stop().await;
}

/// A client in transmission with a small receive buffer that never reads
/// its replies.
async fn stalled_session(addr: SocketAddr) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(16 * 1024).unwrap();
    let s = sock.connect(addr).await.unwrap();
    let mut c = C { s: Io::Tcp(s) };
    let mut g = [0u8; 18];
    c.s.read_exact(&mut g).await.unwrap();
    c.put(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
        .await;
    c.go("mem").await;
    for h in 0..48u64 {
        c.req(0, CMD_READ, h, 0, 1 << 20, &[]).await;
    }
    c.s.tcp()
}

#[tokio::test]
async fn stalled_clients_cannot_hold_the_daemon_wide_budget() {
    let srv = start_with(ServerConfig {
        max_in_flight_bytes: 32 << 20,
        max_in_flight_bytes_total: 32 << 20,
        ..ServerConfig::default()
    })
    .await;
    srv.mem.fill(0, &pattern(1 << 20, 9));
    let mut stalled = Vec::new();
    for _ in 0..4 {
        stalled.push(stalled_session(srv.addr).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The budget is held by clients that do not read: a new client's READ waits
    // about a second, then they are evicted and it is served.
    let mut c = C::session(srv.addr, "mem", false).await;
    c.req(0, CMD_READ, 7, 0, 1 << 20, &[]).await;
    let (err, handle) = tokio::time::timeout(Duration::from_secs(8), c.simple())
        .await
        .expect("new client starved by stalled ones");
    assert_eq!((err, handle), (0, 7));
    assert_eq!(c.get(1 << 20).await, pattern(1 << 20, 9));
    assert!(stats().snapshot().stalled_evicted >= 1);
    drop(stalled);
    srv.stop().await;
}

/// Replies that meet a full socket are queued (by reference) and written
/// later from where the socket stopped: every byte arrives, in order, whole.
#[tokio::test]
async fn replies_queued_behind_a_full_socket_arrive_whole() {
    let srv = start().await;
    srv.mem.fill(0, &pattern(1 << 20, 5));
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(16 * 1024).unwrap();
    let s = sock.connect(srv.addr).await.unwrap();
    let mut c = C { s: Io::Tcp(s) };
    let mut g = [0u8; 18];
    c.s.read_exact(&mut g).await.unwrap();
    c.put(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
        .await;
    c.go("mem").await;
    // Odd offsets and lengths: replies split anywhere, headers included.
    let reqs: Vec<(u64, u32)> = (0..12u64)
        .map(|h| (h * 4099 % 65536, (1 << 19) + h as u32 * 777))
        .collect();
    for (h, &(off, len)) in reqs.iter().enumerate() {
        c.req(0, CMD_READ, h as u64, off, len, &[]).await;
    }
    // Let the socket fill and the rest queue.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let want = pattern(1 << 20, 5);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..reqs.len() {
        let (err, h) = tokio::time::timeout(T, c.simple()).await.unwrap();
        assert_eq!(err, 0);
        let (off, len) = reqs[h as usize];
        let got = c.get(len as usize).await;
        assert!(
            got == want[off as usize..(off + len as u64) as usize],
            "reply {h} differs"
        );
        assert!(seen.insert(h));
    }
    srv.stop().await;
}

#[test]
fn bad_client_log_is_rate_limited() {
    let log = crate::limits::BadClients::new(Duration::from_millis(200));
    for i in 0..100 {
        log.report("protocol error", None, &i);
    }
    assert_eq!(log.suppressed(), 99);
    log.flush(); // interval not over: nothing yet
    assert_eq!(log.suppressed(), 99);
    std::thread::sleep(Duration::from_millis(250));
    log.flush();
    assert_eq!(log.suppressed(), 0);
}

mod tls_tests;

/// An export that takes WRITEs on the reader task (`try_write`, decision
/// 0053) unless told to refuse, and counts which path each one took.
struct InlineExport {
    mem: Arc<RamExport>,
    refuse: std::sync::atomic::AtomicBool,
    tried: AtomicU64,
    inline: AtomicU64,
    blocking: AtomicU64,
    /// What `flush_start` answers: 0 Done, 1 Queued, 2 Drive, else Blocking.
    flush_mode: AtomicU64,
    /// Callbacks of queued FLUSHes, called by the test (or the driver).
    parked: Arc<std::sync::Mutex<Vec<FlushDone>>>,
    /// `flush` calls (the blocking path).
    flushes: AtomicU64,
    /// READs: `try_read` calls, those it answered, and `read` calls.
    read_tried: AtomicU64,
    read_inline: AtomicU64,
    read_blocking: AtomicU64,
}

impl InlineExport {
    fn new() -> Self {
        InlineExport {
            mem: RamExport::new(1 << 20, false),
            refuse: false.into(),
            tried: 0.into(),
            inline: 0.into(),
            blocking: 0.into(),
            flush_mode: 3.into(),
            parked: Default::default(),
            flushes: 0.into(),
            read_tried: 0.into(),
            read_inline: 0.into(),
            read_blocking: 0.into(),
        }
    }
    fn answer_parked(&self, durable: bool) -> usize {
        answer_all(&self.parked, durable)
    }
}

fn answer_all(parked: &std::sync::Mutex<Vec<FlushDone>>, durable: bool) -> usize {
    let parked = std::mem::take(&mut *parked.lock().unwrap());
    let n = parked.len();
    for done in parked {
        done(durable);
    }
    n
}

impl BlockExport for InlineExport {
    fn size(&self) -> u64 {
        self.mem.size()
    }
    fn read_only(&self) -> bool {
        false
    }
    fn preferred_block_size(&self) -> u32 {
        4096
    }
    fn read(&self, offset: u64, len: u64) -> Result<Vec<ReadChunk>, ExportError> {
        self.read_blocking.fetch_add(1, Ordering::SeqCst);
        self.mem.read(offset, len)
    }
    fn try_read(&self, offset: u64, len: u64) -> Option<Vec<ReadChunk>> {
        self.read_tried.fetch_add(1, Ordering::SeqCst);
        if self.refuse.load(Ordering::SeqCst) {
            return None;
        }
        self.read_inline.fetch_add(1, Ordering::SeqCst);
        self.mem.read(offset, len).ok()
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        self.blocking.fetch_add(1, Ordering::SeqCst);
        self.mem.write(offset, data, fua)
    }
    fn try_write(&self, offset: u64, data: &[u8]) -> Option<Result<(), ExportError>> {
        self.tried.fetch_add(1, Ordering::SeqCst);
        if self.refuse.load(Ordering::SeqCst) {
            return None;
        }
        if data.first() == Some(&0xee) {
            return Some(Err(ExportError::NoSpace("full".into())));
        }
        self.inline.fetch_add(1, Ordering::SeqCst);
        Some(self.mem.write(offset, data, false))
    }
    fn flush(&self) -> Result<(), ExportError> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        self.mem.flush()
    }
    fn flush_start(&self, done: FlushDone) -> FlushStart {
        match self.flush_mode.load(Ordering::SeqCst) {
            0 => FlushStart::Done(done),
            1 => {
                self.parked.lock().unwrap().push(done);
                FlushStart::Queued
            }
            2 => {
                self.parked.lock().unwrap().push(done);
                let parked = self.parked.clone();
                FlushStart::Drive(Box::new(move || {
                    answer_all(&parked, true);
                }))
            }
            _ => FlushStart::Blocking(done),
        }
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), ExportError> {
        self.mem.trim(offset, len, fua)
    }
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        allocate: bool,
        fua: bool,
    ) -> Result<(), ExportError> {
        self.mem.write_zeroes(offset, len, allocate, fua)
    }
    fn block_status(
        &self,
        context: &str,
        offset: u64,
        len: u64,
    ) -> Result<Vec<StatusExtent>, ExportError> {
        self.mem.block_status(context, offset, len)
    }
}

struct InlineProvider(Arc<InlineExport>);

impl ExportProvider for InlineProvider {
    fn list(&self) -> Vec<ExportInfo> {
        vec![ExportInfo {
            name: "inline".into(),
            description: String::new(),
        }]
    }
    fn open(&self, name: &str) -> Option<Arc<dyn BlockExport>> {
        (name == "inline").then(|| self.0.clone() as Arc<dyn BlockExport>)
    }
}

/// A server of one [`InlineExport`] and a client session on it.
async fn inline_session() -> (
    Arc<InlineExport>,
    C,
    watch::Sender<bool>,
    JoinHandle<std::io::Result<()>>,
) {
    let exp = Arc::new(InlineExport::new());
    let (addr, stop, task) = serve_provider(
        Arc::new(InlineProvider(exp.clone())),
        ServerConfig::default(),
    )
    .await;
    let c = C::session(addr, "inline", false).await;
    (exp, c, stop, task)
}

/// Small WRITEs without FUA go through `try_write` on the reader; FUA,
/// large, out-of-range and refused ones take the worker path, and the data
/// lands exactly once either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_writes_run_inline_unless_refused() {
    let (exp, mut c, stop, task) = inline_session().await;
    let counts = |e: &InlineExport| {
        (
            e.tried.load(Ordering::SeqCst),
            e.inline.load(Ordering::SeqCst),
            e.blocking.load(Ordering::SeqCst),
        )
    };
    c.req(0, CMD_WRITE, 1, 4096, 4, b"abcd").await;
    assert_eq!(c.simple().await, (0, 1));
    assert_eq!(counts(&exp), (1, 1, 0));
    // FUA: written inline too, then made durable through `flush_start`
    // (here the blocking way: a worker runs `flush`, not `write`).
    c.req(CMD_FLAG_FUA, CMD_WRITE, 2, 8192, 4, b"efgh").await;
    assert_eq!(c.simple().await, (0, 2));
    assert_eq!(counts(&exp), (2, 2, 0));
    assert_eq!(exp.flushes.load(Ordering::SeqCst), 1);
    // Larger than the inline bound.
    let big = vec![3u8; 128 * 1024];
    c.req(0, CMD_WRITE, 3, 256 * 1024, big.len() as u32, &big)
        .await;
    assert_eq!(c.simple().await, (0, 3));
    assert_eq!(counts(&exp), (2, 2, 1));
    // Beyond the export: the worker path reports it, try_write is not asked.
    c.req(0, CMD_WRITE, 4, (1 << 20) - 2, 4, b"ijkl").await;
    assert_eq!(c.simple().await, (ENOSPC, 4));
    assert_eq!(counts(&exp), (2, 2, 1));
    // An error from try_write is the reply (with FUA too: nothing to flush).
    c.req(CMD_FLAG_FUA, CMD_WRITE, 5, 0, 2, &[0xee, 0]).await;
    assert_eq!(c.simple().await, (ENOSPC, 5));
    assert_eq!(counts(&exp), (3, 2, 1));
    assert_eq!(exp.flushes.load(Ordering::SeqCst), 1);
    // Refused (it would block): the worker writes it, once.
    exp.refuse.store(true, Ordering::SeqCst);
    c.req(0, CMD_WRITE, 6, 4100, 4, b"mnop").await;
    assert_eq!(c.simple().await, (0, 6));
    assert_eq!(counts(&exp), (4, 2, 2));
    c.req(0, CMD_READ, 7, 4096, 8, &[]).await;
    assert_eq!(c.simple().await, (0, 7));
    assert_eq!(c.get(8).await, b"abcdmnop");
    c.req(0, CMD_READ, 8, 8192, 4, &[]).await;
    assert_eq!(c.simple().await, (0, 8));
    assert_eq!(c.get(4).await, b"efgh");
    stop.send(true).unwrap();
    let _ = tokio::time::timeout(T, task).await;
}

/// A small FUA WRITE runs inline and is answered like a FLUSH that holds no
/// thread (decision 0061): only once its `flush_start` callback fires, and
/// by the blocking `flush` on a worker (under the write's handle) when
/// that answers `false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fua_writes_reply_once_their_flush_callback_fires() {
    let (exp, mut c, stop, task) = inline_session().await;
    exp.flush_mode.store(1, Ordering::SeqCst);
    c.req(CMD_FLAG_FUA, CMD_WRITE, 1, 0, 4, b"fua1").await;
    let mut b = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), c.s.read(&mut b))
            .await
            .is_err(),
        "a FUA write was answered before it was durable"
    );
    let e = exp.clone();
    std::thread::spawn(move || assert_eq!(e.answer_parked(true), 1))
        .join()
        .unwrap();
    assert_eq!(c.simple().await, (0, 1));
    // Answered false: the worker's blocking flush replies for the write.
    c.req(CMD_FLAG_FUA, CMD_WRITE, 2, 4, 4, b"fua2").await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(exp.answer_parked(false), 1);
    assert_eq!(c.simple().await, (0, 2));
    assert_eq!(exp.flushes.load(Ordering::SeqCst), 1);
    // Durable at once: answered by the reader.
    exp.flush_mode.store(0, Ordering::SeqCst);
    c.req(CMD_FLAG_FUA, CMD_WRITE, 3, 8, 4, b"fua3").await;
    assert_eq!(c.simple().await, (0, 3));
    assert_eq!(exp.flushes.load(Ordering::SeqCst), 1);
    assert_eq!(exp.blocking.load(Ordering::SeqCst), 0);
    c.req(0, CMD_READ, 4, 0, 12, &[]).await;
    assert_eq!(c.simple().await, (0, 4));
    assert_eq!(c.get(12).await, b"fua1fua2fua3");
    stop.send(true).unwrap();
    let _ = tokio::time::timeout(T, task).await;
}

/// READs go through `try_read` on the reader (decision 0062) and are
/// answered from there; refused ones (data not cached), and those beyond
/// the export, take the worker path; the bytes are the same either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_cached_data_run_inline_unless_refused() {
    let (exp, mut c, stop, task) = inline_session().await;
    let counts = |e: &InlineExport| {
        (
            e.read_tried.load(Ordering::SeqCst),
            e.read_inline.load(Ordering::SeqCst),
            e.read_blocking.load(Ordering::SeqCst),
        )
    };
    c.req(0, CMD_WRITE, 1, 4096, 8, b"abcdefgh").await;
    assert_eq!(c.simple().await, (0, 1));
    c.req(0, CMD_READ, 2, 4098, 4, &[]).await;
    assert_eq!(c.simple().await, (0, 2));
    assert_eq!(c.get(4).await, b"cdef");
    assert_eq!(counts(&exp), (1, 1, 0));
    // A zero-length READ is answered without the export.
    c.req(0, CMD_READ, 3, 0, 0, &[]).await;
    assert_eq!(c.simple().await, (0, 3));
    assert_eq!(counts(&exp), (1, 1, 0));
    // Beyond the export: the worker path reports it, try_read is not asked.
    c.req(0, CMD_READ, 4, (1 << 20) - 2, 4, &[]).await;
    assert_eq!(c.simple().await.0, EINVAL);
    assert_eq!(counts(&exp), (1, 1, 0));
    // Refused (it would need I/O): a worker reads it, once.
    exp.refuse.store(true, Ordering::SeqCst);
    c.req(0, CMD_READ, 5, 4096, 8, &[]).await;
    assert_eq!(c.simple().await, (0, 5));
    assert_eq!(c.get(8).await, b"abcdefgh");
    assert_eq!(counts(&exp), (2, 1, 1));
    // Pipelined READs, some inline and some not, each answered once.
    exp.refuse.store(false, Ordering::SeqCst);
    for h in 10..18u64 {
        c.req(0, CMD_READ, h, 4096 + (h - 10), 1, &[]).await;
    }
    let mut seen = Vec::new();
    for _ in 10..18 {
        let (err, h) = c.simple().await;
        assert_eq!(err, 0);
        seen.push((h, c.get(1).await[0]));
    }
    seen.sort();
    let want: Vec<(u64, u8)> = (10..18u64)
        .map(|h| (h, b"abcdefgh"[(h - 10) as usize]))
        .collect();
    assert_eq!(seen, want);
    assert_eq!(counts(&exp), (10, 9, 1));
    stop.send(true).unwrap();
    let _ = tokio::time::timeout(T, task).await;
}

/// FLUSH through `flush_start` (decision 0057): answered at once when
/// durable, only when its callback fires when queued (from any thread, or
/// the driver run on a worker), and by the blocking `flush` when refused or
/// answered `false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_replies_wait_for_their_callback() {
    let (exp, mut c, stop, task) = inline_session().await;
    // Durable already: answered by the reader, `flush` not called.
    exp.flush_mode.store(0, Ordering::SeqCst);
    c.req(0, CMD_FLUSH, 1, 0, 0, &[]).await;
    assert_eq!(c.simple().await, (0, 1));
    assert_eq!(exp.flushes.load(Ordering::SeqCst), 0);
    // Queued: no reply until the callback fires (here from a plain thread).
    exp.flush_mode.store(1, Ordering::SeqCst);
    c.req(0, CMD_FLUSH, 2, 0, 0, &[]).await;
    let mut b = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), c.s.read(&mut b))
            .await
            .is_err(),
        "a queued FLUSH was answered before it was durable"
    );
    let e = exp.clone();
    std::thread::spawn(move || assert_eq!(e.answer_parked(true), 1))
        .join()
        .unwrap();
    assert_eq!(c.simple().await, (0, 2));
    // Queued, then answered false: the worker runs the blocking flush.
    c.req(0, CMD_FLUSH, 3, 0, 0, &[]).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(exp.answer_parked(false), 1);
    assert_eq!(c.simple().await, (0, 3));
    assert_eq!(exp.flushes.load(Ordering::SeqCst), 1);
    // A driver: run on a worker, it answers the FLUSH.
    exp.flush_mode.store(2, Ordering::SeqCst);
    c.req(0, CMD_FLUSH, 4, 0, 0, &[]).await;
    assert_eq!(c.simple().await, (0, 4));
    // Refused: the blocking flush.
    exp.flush_mode.store(3, Ordering::SeqCst);
    c.req(0, CMD_FLUSH, 5, 0, 0, &[]).await;
    assert_eq!(c.simple().await, (0, 5));
    assert_eq!(exp.flushes.load(Ordering::SeqCst), 2);
    stop.send(true).unwrap();
    let _ = tokio::time::timeout(T, task).await;
}

/// An export like a volume in the ARC: 256 blocks of 16 KiB, each its own
/// shared buffer (one chunk per block, partial ones as ranges), every
/// 4-byte word holding its own offset; every 11th block is a hole.
struct BlocksExport {
    blocks: Vec<Option<Arc<Vec<u8>>>>,
}

const BLK: u64 = 16 << 10;
const NBLK: u64 = 256;

fn block_is_hole(b: u64) -> bool {
    b % 11 == 5
}

/// The byte at `o` of [`BlocksExport`].
fn block_byte(o: u64) -> u8 {
    if block_is_hole(o / BLK) {
        return 0;
    }
    ((o / 4) as u32 ^ 0xa5a5_a5a5).to_le_bytes()[(o % 4) as usize]
}

impl BlocksExport {
    fn new() -> Self {
        let blocks = (0..NBLK)
            .map(|b| {
                (!block_is_hole(b))
                    .then(|| Arc::new((b * BLK..(b + 1) * BLK).map(block_byte).collect()))
            })
            .collect();
        BlocksExport { blocks }
    }
    fn chunks(&self, offset: u64, len: u64) -> Vec<ReadChunk> {
        let mut v = Vec::new();
        let mut o = offset;
        while o < offset + len {
            let b = o / BLK;
            let start = (o % BLK) as usize;
            let end = ((offset + len).min((b + 1) * BLK) - b * BLK) as usize;
            v.push(match &self.blocks[b as usize] {
                Some(buf) => ReadChunk::Shared(buf.clone(), start..end),
                None => ReadChunk::Hole((end - start) as u64),
            });
            o = b * BLK + end as u64;
        }
        v
    }
}

impl BlockExport for BlocksExport {
    fn size(&self) -> u64 {
        NBLK * BLK
    }
    fn read_only(&self) -> bool {
        true
    }
    fn preferred_block_size(&self) -> u32 {
        BLK as u32
    }
    fn read(&self, offset: u64, len: u64) -> Result<Vec<ReadChunk>, ExportError> {
        Ok(self.chunks(offset, len))
    }
    fn try_read(&self, offset: u64, len: u64) -> Option<Vec<ReadChunk>> {
        Some(self.chunks(offset, len))
    }
    fn write(&self, _: u64, _: &[u8], _: bool) -> Result<(), ExportError> {
        Err(ExportError::Perm("read-only".into()))
    }
    fn flush(&self) -> Result<(), ExportError> {
        Ok(())
    }
    fn trim(&self, _: u64, _: u64, _: bool) -> Result<(), ExportError> {
        Ok(())
    }
    fn write_zeroes(&self, _: u64, _: u64, _: bool, _: bool) -> Result<(), ExportError> {
        Err(ExportError::Perm("read-only".into()))
    }
    fn block_status(&self, _: &str, _: u64, len: u64) -> Result<Vec<StatusExtent>, ExportError> {
        Ok(vec![StatusExtent { len, flags: 0 }])
    }
}

struct BlocksProvider(Arc<BlocksExport>);

impl ExportProvider for BlocksProvider {
    fn list(&self) -> Vec<ExportInfo> {
        vec![ExportInfo {
            name: "blocks".into(),
            description: String::new(),
        }]
    }
    fn open(&self, name: &str) -> Option<Arc<dyn BlockExport>> {
        (name == "blocks").then(|| self.0.clone() as Arc<dyn BlockExport>)
    }
}

/// Many large cached READs at once on several connections (answered on
/// their reader tasks, queued and written together by the drain, decisions
/// 0062/0074; 0076 tried assembling them in parallel): every reply arrives
/// whole (its chunks together, one handle), once, and holds exactly the
/// bytes of the blocks it asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_large_cached_reads_arrive_whole_with_their_own_bytes() {
    let exp = Arc::new(BlocksExport::new());
    let (addr, stop, task) =
        serve_provider(Arc::new(BlocksProvider(exp)), ServerConfig::default()).await;
    let mut clients = Vec::new();
    for conn in 0..4u64 {
        clients.push(tokio::spawn(async move {
            let structured = conn % 2 == 0;
            let mut c = C::session(addr, "blocks", structured).await;
            let size = NBLK * BLK;
            let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ conn;
            for round in 0..6u64 {
                // 24 READs in flight: 256 KiB to 2 MiB, aligned or not.
                let mut want = std::collections::HashMap::new();
                for i in 0..24u64 {
                    seed = seed
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    let len = [
                        256 << 10,
                        1 << 20,
                        (1 << 20) - 5000,
                        (700 << 10) + 123,
                        2 << 20,
                    ][(seed >> 33) as usize % 5] as u64;
                    let off = if i % 3 == 0 {
                        (seed >> 7) % (size - len)
                    } else {
                        ((seed >> 7) % ((size - len) / BLK)) * BLK
                    };
                    let h = round << 32 | i;
                    want.insert(h, (off, len));
                    c.req(0, CMD_READ, h, off, len as u32, &[]).await;
                }
                while !want.is_empty() {
                    let (h, got) = if structured {
                        let chunks = c.chunks().await;
                        let h = chunks[0].1;
                        let (off, len) = *want.get(&h).expect("unknown or repeated handle");
                        let mut got = vec![0xffu8; len as usize];
                        let mut covered = 0;
                        for (ty, ch, data) in chunks {
                            assert_eq!(ch, h, "chunks of two replies interleaved");
                            let at = u64::from_be_bytes(data[..8].try_into().unwrap()) - off;
                            match ty {
                                REPLY_TYPE_OFFSET_DATA => {
                                    got[at as usize..at as usize + data.len() - 8]
                                        .copy_from_slice(&data[8..]);
                                    covered += data.len() - 8;
                                }
                                REPLY_TYPE_OFFSET_HOLE => {
                                    let n = u32::from_be_bytes(data[8..12].try_into().unwrap());
                                    got[at as usize..at as usize + n as usize].fill(0);
                                    covered += n as usize;
                                }
                                t => panic!("chunk type {t}"),
                            }
                        }
                        assert_eq!(covered as u64, len, "reply does not cover its request");
                        (h, got)
                    } else {
                        let (err, h) = c.simple().await;
                        assert_eq!(err, 0);
                        let (_, len) = *want.get(&h).expect("unknown or repeated handle");
                        (h, c.get(len as usize).await)
                    };
                    let (off, len) = want.remove(&h).unwrap();
                    let wrong = (0..len).find(|&i| got[i as usize] != block_byte(off + i));
                    assert_eq!(wrong, None, "READ {off}+{len}: wrong byte in the reply");
                }
            }
            c.req(0, CMD_DISC, 0, 0, 0, &[]).await;
        }));
    }
    for c in clients {
        tokio::time::timeout(T * 6, c).await.unwrap().unwrap();
    }
    stop.send(true).unwrap();
    let _ = tokio::time::timeout(T, task).await;
}

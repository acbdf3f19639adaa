//! Accept loop and per-connection driver.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tracing::{debug, info, warn, Instrument};

use crate::handshake::{self, Ctx, HandshakeError, Outcome};
use crate::limits::{HandshakeSlot, Shared};
use crate::sink::Wire;
use crate::stats::{stats, ServerStats};
use crate::transmission;
use crate::{Client, ExportProvider};

/// Buffers of a connection in the handshake: its messages are small (an
/// option's data is read into its own buffer), and a socket that never
/// completes it must cost little.
const HANDSHAKE_BUFFER: usize = 4 * 1024;
/// Read buffer of a connection in transmission: many request headers per
/// `read`; WRITE payloads larger than it bypass it.
const IO_BUFFER: usize = 64 * 1024;

/// Tunables of [`crate::serve_with_config`]; [`crate::serve`] uses the defaults.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Connections served at once; more are accepted and closed at once.
    pub max_connections: usize,
    /// Connections in the handshake at once; a new connection beyond it
    /// closes the oldest one still in the handshake (idle sockets cannot
    /// lock real clients out).
    pub max_handshakes: usize,
    /// Requests in flight per connection (the reader stops reading while
    /// this many are being worked on or waiting to be sent).
    pub max_in_flight: usize,
    /// Requests of one connection executing at once (blocking-pool tasks);
    /// capped by `max_in_flight`. Further requests wait in the connection's queue.
    pub max_workers: usize,
    /// READ/WRITE payload bytes in flight per connection (raised to at least
    /// the 32 MiB maximum payload).
    pub max_in_flight_bytes: usize,
    /// READ/WRITE payload bytes in flight over all connections (raised to
    /// at least 32 MiB): past it every connection stops reading requests
    /// until replies are sent; clients that do not read their replies are
    /// disconnected when others wait for the budget they hold.
    pub max_in_flight_bytes_total: usize,
    /// Time a client has from connecting to entering transmission.
    pub handshake_timeout: Duration,
    /// After shutdown, how long open connections get to finish their
    /// in-flight requests before they are dropped.
    pub shutdown_grace: Duration,
    /// After an export is revoked ([`crate::BlockExport::revoked`]), how
    /// long its connections keep answering requests with `NBD_ESHUTDOWN`
    /// before they are closed.
    pub revoke_grace: Duration,
    /// Misbehaving clients are logged once per interval, the others counted
    /// in one summary line.
    pub bad_client_log_interval: Duration,
    /// NBD_OPT_STARTTLS with this config; None: TLS off.
    pub tls: Option<Tls>,
}

/// TLS for NBD (`[nbd] tls = "on"|"require"`).
#[derive(Debug, Clone)]
pub struct Tls {
    /// Certificate, key and (when client certificates are required) the CA.
    pub config: Arc<tls::rustls::ServerConfig>,
    /// FORCEDTLS: nothing but STARTTLS before the upgrade; otherwise
    /// (SELECTIVETLS) plaintext clients may use exports that do not need TLS.
    pub require: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_connections: 1024,
            max_handshakes: 64,
            max_in_flight: 64,
            max_workers: 16,
            max_in_flight_bytes: 64 * 1024 * 1024,
            max_in_flight_bytes_total: 256 * 1024 * 1024,
            handshake_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(30),
            revoke_grace: Duration::from_secs(2),
            bad_client_log_interval: Duration::from_secs(60),
            tls: None,
        }
    }
}

/// Resolves once `*rx` is `true`; never if every sender is dropped first.
pub(crate) async fn shutdown_requested(rx: &mut watch::Receiver<bool>) {
    if rx.wait_for(|v| *v).await.is_err() {
        std::future::pending::<()>().await;
    }
}

pub(crate) async fn serve_with_config(
    listener: TcpListener,
    provider: Arc<dyn ExportProvider>,
    mut shutdown: watch::Receiver<bool>,
    config: ServerConfig,
) -> io::Result<()> {
    let config = Arc::new(config);
    let shared = Shared::new(&config);
    let limit = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let mut conns = JoinSet::new();
    let mut log_tick = tokio::time::interval(shared.log.interval().max(Duration::from_millis(100)));
    log_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "NBD server listening");
    }
    loop {
        tokio::select! {
            _ = shutdown_requested(&mut shutdown) => break,
            Some(res) = conns.join_next(), if !conns.is_empty() => {
                if let Err(e) = res {
                    warn!("connection task failed: {e}");
                }
            }
            _ = log_tick.tick() => shared.log.flush(),
            res = listener.accept() => match res {
                Ok((sock, peer)) => {
                    ServerStats::add(&stats().connections_total, 1);
                    let Ok(permit) = limit.clone().try_acquire_owned() else {
                        ServerStats::add(&stats().connections_rejected, 1);
                        shared.log.report("connection refused at max_connections", Some(peer),
                            &config.max_connections);
                        drop(sock);
                        continue;
                    };
                    let slot = shared.admit_handshake();
                    let provider = provider.clone();
                    let shutdown = shutdown.clone();
                    let config = config.clone();
                    let shared = shared.clone();
                    let span = tracing::info_span!("nbd", %peer);
                    conns.spawn(async move {
                        connection(sock, peer, provider, shutdown, &config, &shared, slot).await;
                        drop(permit);
                    }.instrument(span));
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
    drop(listener);
    info!(
        connections = conns.len(),
        "NBD server stopped accepting; draining connections"
    );
    let drain = async { while conns.join_next().await.is_some() {} };
    if tokio::time::timeout(config.shutdown_grace, drain)
        .await
        .is_err()
    {
        warn!(
            connections = conns.len(),
            "connections still open after the grace period; dropping them"
        );
        conns.shutdown().await;
    }
    shared.log.flush();
    Ok(())
}

/// Decrements the active-connection gauge when the connection ends.
struct ActiveGuard;
impl ActiveGuard {
    fn new() -> Self {
        stats().connections_active.fetch_add(1, Ordering::Relaxed);
        ActiveGuard
    }
}
impl Drop for ActiveGuard {
    fn drop(&mut self) {
        stats().connections_active.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn connection(
    sock: TcpStream,
    peer: SocketAddr,
    provider: Arc<dyn ExportProvider>,
    mut shutdown: watch::Receiver<bool>,
    config: &ServerConfig,
    shared: &Arc<Shared>,
    slot: HandshakeSlot,
) {
    let _active = ActiveGuard::new();
    // Per-connection lines are debug until the client has an export: a
    // flood of connections that never get there must not flood the log.
    debug!(%peer, "connection opened");
    tls::tcp::accepted(&sock, peer);
    let hs = tokio::select! {
        r = tokio::time::timeout(
            config.handshake_timeout,
            handshake(sock, peer, &provider, &mut shutdown, config),
        ) => Some(r),
        _ = slot.evicted() => None,
    };
    drop(slot);
    let failed = || ServerStats::add(&stats().handshakes_failed, 1);
    let log = &shared.log;
    let (conn, neg) = match hs {
        Some(Ok(Ok((conn, Outcome::Transmission(n))))) => (conn, n),
        Some(Ok(Ok((_, Outcome::Closed | Outcome::StartTls)))) => {
            debug!(%peer, "connection closed during handshake");
            return;
        }
        Some(Ok(Err(HandshakeError::Protocol(m)))) => {
            failed();
            ServerStats::add(&stats().protocol_errors, 1);
            log.report("handshake protocol error", Some(peer), &m);
            return;
        }
        Some(Ok(Err(HandshakeError::Refused(m)))) => {
            failed();
            log.report("handshake refused", Some(peer), &m);
            return;
        }
        Some(Ok(Err(HandshakeError::Io(e)))) => {
            failed();
            if e.kind() == io::ErrorKind::UnexpectedEof {
                debug!(%peer, "client closed the connection during handshake");
            } else {
                log.report("handshake i/o error", Some(peer), &e);
            }
            return;
        }
        Some(Err(_)) => {
            failed();
            log.report(
                "handshake timed out",
                Some(peer),
                &format_args!("{:?}", config.handshake_timeout),
            );
            return;
        }
        None => {
            failed();
            log.report(
                "handshake abandoned for a newer connection",
                Some(peer),
                &format_args!(
                    "max_handshakes ({}) connections were in the handshake",
                    config.max_handshakes
                ),
            );
            return;
        }
    };
    match conn {
        Conn::Plain(rd, wr) => {
            let wire = |r, w| (r, Wire::Tcp(w));
            transmit(rd, wr, wire, peer, neg, shutdown, config, shared).await
        }
        Conn::Tls(rd, wr) => {
            // Worker threads seal their replies themselves (decision 0043).
            let wire = |r: TlsRead, w| {
                let (r, conn) = tls::share(r.unsplit(w));
                (r, Wire::Tls(conn))
            };
            transmit(rd, wr, wire, peer, neg, shutdown, config, shared).await
        }
    }
}

type TlsRead = tokio::io::ReadHalf<tls::TlsStream<TcpStream>>;
type TlsWrite = tokio::io::WriteHalf<tls::TlsStream<TcpStream>>;

/// A connection at the end of its handshake, with the handshake's buffers.
enum Conn {
    Plain(BufReader<OwnedReadHalf>, BufWriter<OwnedWriteHalf>),
    Tls(BufReader<TlsRead>, BufWriter<TlsWrite>),
}

/// Greeting, options, and (on STARTTLS) the TLS handshake and options again.
async fn handshake(
    sock: TcpStream,
    peer: SocketAddr,
    provider: &Arc<dyn ExportProvider>,
    shutdown: &mut watch::Receiver<bool>,
    config: &ServerConfig,
) -> Result<(Conn, Outcome), HandshakeError> {
    let (rd, wr) = sock.into_split();
    let mut rd = BufReader::with_capacity(HANDSHAKE_BUFFER, rd);
    let mut wr = BufWriter::with_capacity(HANDSHAKE_BUFFER, wr);
    let no_zeroes = handshake::greet(&mut rd, &mut wr).await?;
    let mut ctx = Ctx {
        provider,
        client: Client {
            peer,
            tls: false,
            common_name: None,
        },
        tls_available: config.tls.is_some(),
        require: config.tls.as_ref().is_some_and(|t| t.require),
        no_zeroes,
    };
    let mut options_left = handshake::MAX_OPTIONS;
    let out = handshake::negotiate(&mut rd, &mut wr, &ctx, shutdown, &mut options_left).await?;
    let (Outcome::StartTls, Some(t)) = (&out, &config.tls) else {
        return Ok((Conn::Plain(rd, wr), out));
    };
    // The client waits for our ACK before its ClientHello: bytes already
    // buffered would be lost in the switch.
    if !rd.buffer().is_empty() {
        return Err(HandshakeError::Protocol(
            "data sent after NBD_OPT_STARTTLS before its reply".into(),
        ));
    }
    let sock = rd
        .into_inner()
        .reunite(wr.into_inner())
        .map_err(|e| io::Error::other(e.to_string()))?;
    let acceptor = tls::TlsAcceptor::from(t.config.clone());
    let mut stream = match tls::accept(&acceptor, sock, config.handshake_timeout).await {
        Ok(s) => s,
        Err(tls::Error::Handshake(e)) => {
            ServerStats::add(&stats().tls_failed, 1);
            return Err(HandshakeError::Refused(format!(
                "TLS handshake failed: {e}"
            )));
        }
        Err(e) => return Err(HandshakeError::Refused(e.to_string())),
    };
    ServerStats::add(&stats().tls_handshakes, 1);
    tls::bulk_buffers(stream.get_mut().1);
    ctx.client.tls = true;
    ctx.client.common_name = tls::peer_common_name(stream.get_ref().1);
    debug!(%peer, client = ?ctx.client.common_name,
        suite = ?tls::negotiated_suite(stream.get_ref().1), "TLS on");
    let (rd, wr) = tokio::io::split(stream);
    let mut rd = BufReader::with_capacity(HANDSHAKE_BUFFER, rd);
    let mut wr = BufWriter::with_capacity(HANDSHAKE_BUFFER, wr);
    let out = handshake::negotiate(&mut rd, &mut wr, &ctx, shutdown, &mut options_left).await?;
    if let Outcome::Transmission(n) = &out {
        info!(%peer, export = %n.name, client = ?ctx.client.common_name, "TLS client");
    }
    Ok((Conn::Tls(rd, wr), out))
}

/// The transmission phase over the handshake's reader and writer.
#[allow(clippy::too_many_arguments)]
async fn transmit<R, W, R2>(
    rd: BufReader<R>,
    mut wr: BufWriter<W>,
    wire: impl FnOnce(R, W) -> (R2, Wire),
    peer: SocketAddr,
    neg: handshake::Negotiated,
    shutdown: watch::Receiver<bool>,
    config: &ServerConfig,
    shared: &Arc<Shared>,
) where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
    R2: tokio::io::AsyncRead + Unpin,
{
    let log = &shared.log;
    // The handshake flushed its last reply; replies now bypass the buffer.
    if let Err(e) = wr.flush().await {
        info!(%peer, "connection lost after the handshake: {e}");
        return;
    }
    // The small handshake buffer gives way to the transmission one; bytes
    // the client already sent stay first in line.
    let early = rd.buffer().to_vec();
    let (rd, wr) = wire(rd.into_inner(), wr.into_inner());
    let rd = BufReader::with_capacity(IO_BUFFER, std::io::Cursor::new(early).chain(rd));
    let export = neg.name.clone();
    info!(%peer, export = %export, "client connected");
    let end = transmission::run(rd, wr, Some(peer), neg, shutdown, config, shared).await;
    transmission::log_end(peer, &export, &end, log);
    info!(%peer, export = %export, "connection closed: {end}");
}

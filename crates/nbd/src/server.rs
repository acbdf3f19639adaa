//! Accept loop and per-connection driver.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tracing::{debug, info, warn, Instrument};

use crate::handshake::{self, HandshakeError, Outcome};
use crate::stats::{stats, ServerStats};
use crate::transmission;
use crate::ExportProvider;

/// Socket buffer sizes of the per-connection reader and writer.
const IO_BUFFER: usize = 256 * 1024;

/// Tunables of [`crate::serve_with_config`]; [`crate::serve`] uses the defaults.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Connections served at once; more are accepted and closed at once.
    pub max_connections: usize,
    /// Requests in flight per connection (the reader stops reading while
    /// this many are being worked on or waiting to be sent).
    pub max_in_flight: usize,
    /// Requests of one connection executing at once (blocking-pool tasks);
    /// capped by `max_in_flight`. Further requests wait in the connection's queue.
    pub max_workers: usize,
    /// READ/WRITE payload bytes in flight per connection (raised to at least
    /// the 32 MiB maximum payload).
    pub max_in_flight_bytes: usize,
    /// Time a client has from connecting to entering transmission.
    pub handshake_timeout: Duration,
    /// After shutdown, how long open connections get to finish their
    /// in-flight requests before they are dropped.
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_connections: 1024,
            max_in_flight: 64,
            max_workers: 16,
            max_in_flight_bytes: 64 * 1024 * 1024,
            handshake_timeout: Duration::from_secs(120),
            shutdown_grace: Duration::from_secs(30),
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
    let limit = Arc::new(Semaphore::new(config.max_connections.max(1)));
    let mut conns = JoinSet::new();
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
            res = listener.accept() => match res {
                Ok((sock, peer)) => {
                    ServerStats::add(&stats().connections_total, 1);
                    let Ok(permit) = limit.clone().try_acquire_owned() else {
                        ServerStats::add(&stats().connections_rejected, 1);
                        warn!(%peer, "too many connections, refusing");
                        drop(sock);
                        continue;
                    };
                    let provider = provider.clone();
                    let shutdown = shutdown.clone();
                    let config = config.clone();
                    let span = tracing::info_span!("nbd", %peer);
                    conns.spawn(async move {
                        connection(sock, peer, provider, shutdown, &config).await;
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
) {
    let _active = ActiveGuard::new();
    info!(%peer, "connection opened");
    if let Err(e) = sock.set_nodelay(true) {
        debug!(%peer, "TCP_NODELAY: {e}");
    }
    let (rd, wr) = sock.into_split();
    let mut rd = BufReader::with_capacity(IO_BUFFER, rd);
    let mut wr = BufWriter::with_capacity(IO_BUFFER, wr);

    let hs = tokio::time::timeout(
        config.handshake_timeout,
        handshake::negotiate(&mut rd, &mut wr, &provider, &mut shutdown),
    )
    .await;
    let failed = || ServerStats::add(&stats().handshakes_failed, 1);
    let neg = match hs {
        Ok(Ok(Outcome::Transmission(n))) => n,
        Ok(Ok(Outcome::Closed)) => {
            info!(%peer, "connection closed during handshake");
            return;
        }
        Ok(Err(HandshakeError::Protocol(m))) => {
            failed();
            ServerStats::add(&stats().protocol_errors, 1);
            warn!(%peer, "handshake protocol error, closing connection: {m}");
            return;
        }
        Ok(Err(HandshakeError::Refused(m))) => {
            failed();
            warn!(%peer, "handshake refused: {m}");
            return;
        }
        Ok(Err(HandshakeError::Io(e))) => {
            failed();
            if e.kind() == io::ErrorKind::UnexpectedEof {
                info!(%peer, "client closed the connection during handshake");
            } else {
                warn!(%peer, "handshake i/o error: {e}");
            }
            return;
        }
        Err(_) => {
            failed();
            warn!(%peer, timeout = ?config.handshake_timeout, "handshake timed out, closing connection");
            return;
        }
    };
    // The handshake flushed its last reply; replies now bypass the buffer.
    if let Err(e) = wr.flush().await {
        info!(%peer, "connection lost after the handshake: {e}");
        return;
    }
    let wr = wr.into_inner();
    let export = neg.name.clone();
    let end = transmission::run(rd, wr, neg, shutdown, config).await;
    transmission::log_end(peer, &export, &end);
    info!(%peer, export = %export, "connection closed: {end}");
}

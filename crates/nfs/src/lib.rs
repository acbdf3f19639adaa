//! NFSv3 inside the daemon: NFS, MOUNT and a portmapper answering GETPORT,
//! all on one TCP port, serving every filesystem dataset whose `sharenfs`
//! is not `off` (see `README.md`).
//!
//! - Exports: `/POOL/DS` (any depth), its snapshots read-only at
//!   `/POOL/DS/.zfs/snapshot/NAME` (the ZFS path; `/POOL/DS@NAME` works too),
//!   and subdirectories of either.
//! - File handles are (pool guid, dataset id, inode, generation): they
//!   survive restarts and renames, and are STALE once the file is gone (a
//!   rollback that removed it, an unlink, a destroyed dataset).
//! - The write verifier is random per [`Server`] (per daemon start): after
//!   a restart clients resend the UNSTABLE writes they have not seen
//!   COMMITted. COMMIT is `Fs::fsync`, the intent log.
//! - Shares are read per request from the dataset's `sharenfs` (inherited
//!   as zfs), so `cistern set sharenfs=...` applies to the next request.
//! - Bounds: `max_connections`, `max_in_flight` per connection and
//!   `max_in_flight_total`; a record over 1 MiB + 64 KiB closes the
//!   connection; a call that does not decode gets GARBAGE_ARGS and a log line.
//!
//! The RPC and procedure code is a fork of nfs3_server 0.11.1 (BSD-3-Clause,
//! LICENSE-nfs3_server): see the notes at the top of `rpc.rs` and `proc.rs`.

pub mod exports;
#[doc(hidden)]
pub mod fuzzing;
mod proc;
pub mod rpc;

use dataset::Engine;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};

pub use exports::{Access, ShareOptions};

/// Limits of the NFS server (`[nfs]` in the daemon's config).
#[derive(Debug, Clone)]
pub struct NfsConfig {
    /// Connections served at once; more are closed at accept with a log line.
    pub max_connections: usize,
    /// Requests of one connection handled at once; further ones wait in the socket.
    pub max_in_flight: usize,
    /// Requests handled at once across connections (each holds up to ~1 MiB).
    pub max_in_flight_total: usize,
    /// A connection with no request for this long is closed.
    pub idle_timeout: Duration,
}

impl Default for NfsConfig {
    fn default() -> Self {
        NfsConfig {
            max_connections: 256,
            max_in_flight: 16,
            max_in_flight_total: 128,
            idle_timeout: Duration::from_secs(3600),
        }
    }
}

/// One exported dataset (or snapshot), opened once and shared by all clients.
pub(crate) struct Export {
    pub fs: std::sync::Arc<posix::Fs>,
    pub guid: u64,
    /// The head's name if this is a snapshot (read-only).
    pub snapshot: bool,
}

impl Export {
    pub fn dataset_id(&self) -> u64 {
        self.fs.objects().dataset_id()
    }
    /// What `stat -f` calls the filesystem id: pool and dataset mixed.
    pub fn fsid(&self) -> u64 {
        self.guid.rotate_left(17) ^ self.dataset_id()
    }
}

/// The NFS server over an engine's filesystems.
pub struct Server {
    pub(crate) engine: Arc<Engine>,
    pub(crate) verifier: [u8; 8],
    pub(crate) port: AtomicU64,
    /// (pool guid, dataset id) -> the open dataset.
    pub(crate) open: Mutex<HashMap<(u64, u64), Arc<Export>>>,
    /// Handles' (pool guid, dataset id) found nowhere, and when.
    pub(crate) missed: Mutex<HashMap<(u64, u64), std::time::Instant>>,
    /// Bad `sharenfs` values already logged (logged once each).
    pub(crate) bad_shares: Mutex<HashMap<String, ()>>,
    config: NfsConfig,
}

impl Server {
    pub fn new(engine: Arc<Engine>, config: NfsConfig) -> Arc<Server> {
        Arc::new(Server {
            engine,
            verifier: rand::random::<u64>().to_be_bytes(),
            port: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
            missed: Mutex::new(HashMap::new()),
            bad_shares: Mutex::new(HashMap::new()),
            config,
        })
    }

    /// The write verifier of this server's life (changes at every start).
    pub fn verifier(&self) -> [u8; 8] {
        self.verifier
    }

    /// Serves `listener` until `stop` turns true.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        mut stop: watch::Receiver<bool>,
    ) -> std::io::Result<()> {
        let port = listener.local_addr()?.port();
        self.port.store(u64::from(port), Ordering::Relaxed);
        let conns = Arc::new(Semaphore::new(self.config.max_connections.max(1)));
        let total = Arc::new(Semaphore::new(self.config.max_in_flight_total.max(1)));
        let mut tasks = tokio::task::JoinSet::new();
        loop {
            let (sock, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        // EMFILE and friends: pause rather than spin.
                        tracing::warn!(error = %e, "NFS accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = async { let _ = stop.wait_for(|s| *s).await; } => break,
            };
            while tasks.try_join_next().is_some() {}
            let Ok(permit) = conns.clone().try_acquire_owned() else {
                tracing::warn!(%peer, max = self.config.max_connections,
                    "NFS connection refused at max_connections");
                continue;
            };
            let me = self.clone();
            let total = total.clone();
            tasks.spawn(async move {
                let _permit = permit;
                tls::tcp::accepted(&sock, peer);
                if let Err(e) = me.connection(sock, peer, total).await {
                    tracing::info!(%peer, error = %e, "NFS connection closed");
                }
            });
        }
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        Ok(())
    }

    async fn connection(
        self: Arc<Self>,
        sock: TcpStream,
        peer: SocketAddr,
        total: Arc<Semaphore>,
    ) -> Result<(), rpc::RpcError> {
        let (mut rd, mut wr) = sock.into_split();
        let per_conn = self.config.max_in_flight.max(1);
        let mine = Arc::new(Semaphore::new(per_conn));
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(per_conn);
        let writer = tokio::spawn(async move {
            while let Some(reply) = rx.recv().await {
                if wr.write_all(&reply).await.is_err() {
                    break;
                }
            }
        });
        // Bad calls logged per connection (then counted quietly).
        let garbage = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let result = loop {
            // Taken before reading: a client at its limit is not read from.
            let Ok(slot) = mine.clone().acquire_owned().await else {
                break Ok(());
            };
            let mut record = Vec::new();
            match tokio::time::timeout(
                self.config.idle_timeout,
                rpc::read_record(&mut rd, &mut record),
            )
            .await
            {
                Err(_) => break Ok(()),
                Ok(Err(rpc::RpcError::Closed)) => break Ok(()),
                // A reset or a half-sent record: the client went away.
                Ok(Err(rpc::RpcError::Io(e))) => {
                    tracing::debug!(%peer, error = %e, "NFS connection ended");
                    break Ok(());
                }
                Ok(Err(e)) => {
                    tracing::warn!(%peer, error = %e, "NFS client sent a bad record");
                    break Err(e);
                }
                Ok(Ok(())) => {}
            }
            let Ok(global) = total.clone().acquire_owned().await else {
                break Ok(());
            };
            let call = match rpc::Call::parse(record) {
                Ok(c) => c,
                Err(e) => {
                    // No xid to answer: the stream is not RPC.
                    tracing::warn!(%peer, error = %e, "NFS client sent a bad RPC header");
                    break Err(e);
                }
            };
            let me = self.clone();
            let tx = tx.clone();
            let garbage = garbage.clone();
            tokio::task::spawn_blocking(move || {
                let reply = proc::dispatch(&me, peer, call, &garbage);
                drop(global);
                if !reply.is_empty() {
                    let _ = tx.blocking_send(rpc::frame(reply));
                }
                drop(slot);
            });
        };
        drop(tx);
        let _ = writer.await;
        result
    }
}

//! Process-wide server counters, read by the daemon's Prometheus exporter.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::proto::Command;

/// Counters of every NBD server in this process (all [`crate::serve`]
/// calls share them). All are monotonic counters except
/// `connections_active`, which is a gauge. Reach them with [`stats()`];
/// [`ServerStats::snapshot`] reads them all at once.
#[derive(Debug, Default)]
pub struct ServerStats {
    /// TCP connections accepted.
    pub connections_total: AtomicU64,
    /// Connections open now (gauge).
    pub connections_active: AtomicU64,
    /// Connections refused because `max_connections` was reached.
    pub connections_rejected: AtomicU64,
    /// Connections that ended during the handshake without entering transmission.
    pub handshakes_failed: AtomicU64,
    /// Connections closed by the server because the client broke the protocol
    /// (bad magic, truncated message, oversize write, bad flags at handshake).
    pub protocol_errors: AtomicU64,
    pub requests_read: AtomicU64,
    pub requests_write: AtomicU64,
    pub requests_flush: AtomicU64,
    pub requests_trim: AtomicU64,
    pub requests_write_zeroes: AtomicU64,
    pub requests_block_status: AtomicU64,
    pub requests_cache: AtomicU64,
    pub requests_disc: AtomicU64,
    /// Requests with an unknown command type.
    pub requests_unknown: AtomicU64,
    /// Payload bytes returned by successful READs.
    pub bytes_read: AtomicU64,
    /// Payload bytes accepted by successful WRITEs.
    pub bytes_written: AtomicU64,
    /// Requests answered with an error (any errno).
    pub errors: AtomicU64,
    /// Connections closed in the handshake to make room for a newer one
    /// (`max_handshakes`).
    pub handshakes_evicted: AtomicU64,
    /// Connections closed because they did not read their replies while
    /// others waited for the daemon-wide byte budget.
    pub stalled_evicted: AtomicU64,
    /// STARTTLS upgrades that completed.
    pub tls_handshakes: AtomicU64,
    /// STARTTLS upgrades whose TLS handshake failed (e.g. no or a wrong
    /// client certificate).
    pub tls_failed: AtomicU64,
}

/// A plain copy of [`ServerStats`] at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub connections_total: u64,
    pub connections_active: u64,
    pub connections_rejected: u64,
    pub handshakes_failed: u64,
    pub protocol_errors: u64,
    pub requests_read: u64,
    pub requests_write: u64,
    pub requests_flush: u64,
    pub requests_trim: u64,
    pub requests_write_zeroes: u64,
    pub requests_block_status: u64,
    pub requests_cache: u64,
    pub requests_disc: u64,
    pub requests_unknown: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub errors: u64,
    pub handshakes_evicted: u64,
    pub stalled_evicted: u64,
    pub tls_handshakes: u64,
    pub tls_failed: u64,
}

static STATS: ServerStats = ServerStats::new();

/// The process-wide counters of the NBD server.
pub fn stats() -> &'static ServerStats {
    &STATS
}

impl ServerStats {
    pub const fn new() -> Self {
        ServerStats {
            connections_total: AtomicU64::new(0),
            connections_active: AtomicU64::new(0),
            connections_rejected: AtomicU64::new(0),
            handshakes_failed: AtomicU64::new(0),
            protocol_errors: AtomicU64::new(0),
            requests_read: AtomicU64::new(0),
            requests_write: AtomicU64::new(0),
            requests_flush: AtomicU64::new(0),
            requests_trim: AtomicU64::new(0),
            requests_write_zeroes: AtomicU64::new(0),
            requests_block_status: AtomicU64::new(0),
            requests_cache: AtomicU64::new(0),
            requests_disc: AtomicU64::new(0),
            requests_unknown: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            handshakes_evicted: AtomicU64::new(0),
            stalled_evicted: AtomicU64::new(0),
            tls_handshakes: AtomicU64::new(0),
            tls_failed: AtomicU64::new(0),
        }
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            connections_total: l(&self.connections_total),
            connections_active: l(&self.connections_active),
            connections_rejected: l(&self.connections_rejected),
            handshakes_failed: l(&self.handshakes_failed),
            protocol_errors: l(&self.protocol_errors),
            requests_read: l(&self.requests_read),
            requests_write: l(&self.requests_write),
            requests_flush: l(&self.requests_flush),
            requests_trim: l(&self.requests_trim),
            requests_write_zeroes: l(&self.requests_write_zeroes),
            requests_block_status: l(&self.requests_block_status),
            requests_cache: l(&self.requests_cache),
            requests_disc: l(&self.requests_disc),
            requests_unknown: l(&self.requests_unknown),
            bytes_read: l(&self.bytes_read),
            bytes_written: l(&self.bytes_written),
            errors: l(&self.errors),
            handshakes_evicted: l(&self.handshakes_evicted),
            stalled_evicted: l(&self.stalled_evicted),
            tls_handshakes: l(&self.tls_handshakes),
            tls_failed: l(&self.tls_failed),
        }
    }

    pub(crate) fn count_request(&self, c: Command) {
        let a = match c {
            Command::Read => &self.requests_read,
            Command::Write => &self.requests_write,
            Command::Disc => &self.requests_disc,
            Command::Flush => &self.requests_flush,
            Command::Trim => &self.requests_trim,
            Command::Cache => &self.requests_cache,
            Command::WriteZeroes => &self.requests_write_zeroes,
            Command::BlockStatus => &self.requests_block_status,
            Command::Unknown(_) => &self.requests_unknown,
        };
        a.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn add(a: &AtomicU64, n: u64) {
        a.fetch_add(n, Ordering::Relaxed);
    }
}
